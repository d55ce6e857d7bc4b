"""The data processor: the on-chip buffer, its datasets and ports, the kernel memories
(``docs/system.md``)."""

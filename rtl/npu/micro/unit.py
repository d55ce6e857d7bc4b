"""The ports every micro engine unit has (``docs/micro.md``, "Shared interfaces")."""

from amaranth.lib.wiring import In, Out

from npu_spec.engine import ERROR_BITS

__all__ = ["BUF_ADDR_BITS", "KMEM_ADDR_BITS", "unit_members"]

#: Element address of the buffer (one SPRAM of 16K x 16 bits).
BUF_ADDR_BITS = 14

#: 32-bit word address of the 4 KiB kernel memory.
KMEM_ADDR_BITS = 10


def unit_members(*, kmem_read=False):
    """The signature members of a micro engine unit: start and done, the register-file read
    port, the buffer port, and (``kmem_read``) a kernel-memory read port."""
    members = {
        "start": In(1),
        "done": Out(1),
        "error": Out(ERROR_BITS),
        "reg_addr": Out(16),
        "reg_data": In(32),
        "buf_addr": Out(BUF_ADDR_BITS),
        "buf_wdata": Out(16),
        "buf_we": Out(1),
        "buf_rdata": In(16),
    }
    if kmem_read:
        members |= {"kmem_addr": Out(KMEM_ADDR_BITS), "kmem_data": In(32)}
    return members

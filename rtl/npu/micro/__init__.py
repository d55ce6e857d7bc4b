"""The micro build for the iCEBreaker (``docs/micro.md``): sequential units of the same
program contract."""

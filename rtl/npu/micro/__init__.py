"""The micro build for the iCE40UP5K (``docs/micro.md``): the NPU's program contract run one
task at a time by small sequential units sharing one register file, one buffer port and one
system-memory port."""

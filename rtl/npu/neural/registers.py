"""Register map of a neural engine core (``NEURAL_ENGINE``, ``docs/registers.md``).

Core ``i`` sits at word address ``0x2000 + 0x100 * i``. The layer registers are read while the
engine runs and must not be written between ``CTRL.start`` and the end of the layer
(``STATUS.busy`` low). ``docs/neural_engine.md`` explains each field's role in the loop nest.
"""

from ..regmap import Field, Register, RegisterMap

__all__ = ["NEURAL_ENGINE", "REGISTER_MAPS", "LAYER_FIELDS", "core_base"]

BASE = 0x2000
CORE_STRIDE = 0x100


def core_base(core):
    """Word address of core ``core``'s registers."""
    return BASE + CORE_STRIDE * core


NEURAL_ENGINE = RegisterMap("NEURAL_ENGINE", base=BASE, doc=(
    "Control, status, counters and layer registers of neural engine core 0 (core `i` at "
    "`0x2000 + 0x100 * i`). A layer is a convolution (groups, stride, dilation, padding) or a "
    "fully connected layer mapped to a 1x1 convolution; its kernels come from the kernel "
    "memory through the group table at `KTABLE` (4 words per output-channel group: header "
    "address, header words, body address, body words)."
), registers=[
    Register("CTRL", offset=0x00, doc="Commands.", fields=[
        Field("start", 1, access="wo", doc="Start the layer programmed in the layer registers "
              "(ignored while busy)."),
    ]),
    Register("STATUS", offset=0x01, doc="State of the core.", fields=[
        Field("busy", 1, access="ro", doc="A layer is running."),
        Field("error", 1, access="ro", doc="The last layer stopped with an error."),
        Field("error_code", 4, offset=4, access="ro",
              doc="Why (0 none, 1 format not built, 2 zero-sized loop, 3 kernel larger than "
                  "16x16 or work-unit shape not offered, 4 halo row wider than the input "
                  "buffer, 5 group's input rows exceed the input buffer, 6 malformed or short "
                  "kernel stream, 7 timeout, 8 post-processor configuration)."),
    ]),
    Register("CYCLES", offset=0x02, doc="Cycles of the last (or running) layer.", fields=[
        Field("count", 32, access="ro", doc="Cycles from start to done."),
    ]),
    Register("MAC_ACTIVE", offset=0x03, doc="MAC-array activity of the last layer.", fields=[
        Field("count", 32, access="ro", doc="Cycles in which the MAC array took a command."),
    ]),
    Register("FORMAT", offset=0x08, doc="Number formats, work-unit shape and kernel encoding.",
             fields=[
        Field("fmt", 2, doc="MAC format: 0 int8 x int8, 1 fp16 x fp16, 2 int8 data x fp16 "
              "weights, 3 fp16 data x int8 weights."),
        Field("log2w", 4, offset=4, doc="Work-unit width `W = 2**log2w`; height `H = MACs / "
              "W` (at most the build's largest work-unit height)."),
        Field("sparse", 1, offset=8, doc="Kernel bodies carry zero bitmaps."),
        Field("palette", 4, offset=12, doc="Palette index width (1, 2, 4, 6, 8; 0: none)."),
    ]),
    Register("GROUPS", offset=0x09, doc="Convolution groups and channels per group.", fields=[
        Field("groups", 12, doc="Groups `G` (1: ordinary convolution, channels: depthwise)."),
        Field("icpg", 12, offset=16, doc="Input channels per group (`C = G * icpg`)."),
    ]),
    Register("OCPG", offset=0x0A, doc="Output channels per group.", fields=[
        Field("ocpg", 12, doc="Output channels per group (`K = G * ocpg`)."),
    ]),
    Register("IN_SIZE", offset=0x0B, doc="Input height and width.", fields=[
        Field("in_h", 12, doc="Input rows."),
        Field("in_w", 12, offset=16, doc="Input columns."),
    ]),
    Register("OUT_SIZE", offset=0x0C, doc="Output height and width.", fields=[
        Field("out_h", 12, doc="Output rows."),
        Field("out_w", 12, offset=16, doc="Output columns."),
    ]),
    Register("KERNEL", offset=0x0D, doc="Kernel window.", fields=[
        Field("kh", 5, doc="Kernel rows (1..16)."),
        Field("kw", 5, offset=8, doc="Kernel columns (1..16)."),
        Field("stride", 3, offset=16, doc="Stride (both axes)."),
        Field("dilation", 3, offset=20, doc="Dilation (both axes)."),
        Field("pad", 4, offset=24, doc="Zero padding above and left (below and right follow "
              "from the output size)."),
    ]),
    Register("KTABLE", offset=0x0E, doc="Kernel group table.", fields=[
        Field("addr", 16, doc="Kernel-memory word address of the group table."),
    ]),
    Register("POST_CTRL", offset=0x10, doc="Post-processor: output format and activation "
             "(`docs/postproc.md`).", fields=[
        Field("out_fp16", 1, doc="Output binary16 (else int8)."),
        Field("stochastic", 1, offset=1, doc="Stochastic rounding to binary16."),
        Field("act", 4, offset=4, doc="Activation: 0 none, 1 ReLU, 2 clamp, 3 leaky ReLU, "
              "4 abs, 5 sigmoid, 6 tanh, 7 GELU."),
        Field("zero_point", 8, offset=8, doc="Output zero point (int8, two's complement)."),
    ]),
    Register("POST_LO", offset=0x11, doc="Lower clamp bound.", fields=[
        Field("value", 32, doc="binary32 bits (float path) or int8 in bits 0-7 (int path)."),
    ]),
    Register("POST_HI", offset=0x12, doc="Upper clamp bound.", fields=[
        Field("value", 32, doc="binary32 bits (float path) or int8 in bits 0-7 (int path)."),
    ]),
    Register("POST_ALPHA", offset=0x13, doc="Leaky-ReLU slope.", fields=[
        Field("value", 32, doc="binary32 bits."),
    ]),
    Register("POST_SEED", offset=0x14, doc="Stochastic-rounding seed.", fields=[
        Field("value", 32, reset=1, doc="LFSR seed, loaded at every start."),
    ]),
])

#: (register, field, path in ``npu.neural.engine.layer_layout``) of every layer register.
LAYER_FIELDS = (
    ("FORMAT", "fmt", ("fmt",)), ("FORMAT", "log2w", ("log2w",)),
    ("FORMAT", "sparse", ("sparse",)), ("FORMAT", "palette", ("palette",)),
    ("GROUPS", "groups", ("groups",)), ("GROUPS", "icpg", ("icpg",)),
    ("OCPG", "ocpg", ("ocpg",)),
    ("IN_SIZE", "in_h", ("in_h",)), ("IN_SIZE", "in_w", ("in_w",)),
    ("OUT_SIZE", "out_h", ("out_h",)), ("OUT_SIZE", "out_w", ("out_w",)),
    ("KERNEL", "kh", ("kh",)), ("KERNEL", "kw", ("kw",)), ("KERNEL", "stride", ("stride",)),
    ("KERNEL", "dilation", ("dilation",)), ("KERNEL", "pad", ("pad",)),
    ("KTABLE", "addr", ("ktable",)),
    ("POST_CTRL", "out_fp16", ("post", "out_fp16")),
    ("POST_CTRL", "stochastic", ("post", "stochastic")),
    ("POST_CTRL", "act", ("post", "act")),
    ("POST_CTRL", "zero_point", ("post", "zero_point")),
    ("POST_LO", "value", ("post", "lo")), ("POST_HI", "value", ("post", "hi")),
    ("POST_ALPHA", "value", ("post", "alpha")), ("POST_SEED", "value", ("post", "seed")),
)

REGISTER_MAPS = (NEURAL_ENGINE,)

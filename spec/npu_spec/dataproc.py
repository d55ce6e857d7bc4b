"""The data processor: the on-chip buffer and the datasets the engines' ports read and write.

The buffer holds 16-bit elements (``docs/system.md``): an int8 value sign-extended, or a
binary16 value. Its size is ``config.buffer_kib`` KiB, so it has
``buffer_kib * 512`` elements (:func:`buffer_elements`). Element addresses wrap modulo that size.

Each engine port reads or writes one *dataset*: a ``(C, H, W)`` tensor at element address
``BASE + c * CSTRIDE + y * RSTRIDE + x`` (rows are contiguous; :func:`dataset_address`). The
datasets are programmed through this map by the same descriptors that program the engines:

* neural engine core ``i``: ``NE{i}_IN`` (the input the core's row requests read; rows outside
  ``H``, columns outside ``W`` read as zero) and ``NE{i}_OUT`` (where its output rows go);
* planar engine: ``PE_A``, ``PE_B``, ``PE_C`` (operand readers: they stream the ``C * H`` rows
  of ``W`` elements in raster order, ``ceil(W / L)`` beats a row, when the planar engine
  starts; a dataset with ``C``, ``H`` or ``W`` 0 streams nothing) and ``PE_OUT`` (the result
  writer: beats in the engine's output order, ``ceil(W / L)`` beats per row of ``W``).
"""

from .registers import ADDRESS_WINDOWS
from .regmap import Field, Register, RegisterMap

__all__ = [
    "BASE", "CORE_STRIDE", "DATASET_REGISTERS", "DATA_PROCESSOR", "NE_CORES", "PE_PORTS",
    "PE_PORT_BASE",
    "buffer_banks", "buffer_elements", "dataset_address", "dataset_writes", "make_dataset",
    "ne_port_base", "pe_port_base",
]

#: Word address of the map.
BASE = ADDRESS_WINDOWS["DATA_PROCESSOR"][0]
#: Distance between two neural engine cores' port blocks; core ``i``'s input dataset is at
#: ``BASE + CORE_STRIDE * i``, its output dataset 8 words further.
CORE_STRIDE = 0x10
#: Offset of the planar engine's port blocks (``PE_A`` first, 8 words apart).
PE_PORT_BASE = 0x800
#: The planar engine's ports, in address order.
PE_PORTS = ("A", "B", "C", "OUT")
#: Word address of ``NE_CORES``.
NE_CORES = BASE + 0xF00
#: Width of an element address.
ADDR_BITS = 24
#: Width of a shape field.
SHAPE_BITS = 12
#: Width of the flow-control fields ``slots`` and ``planes`` of ``SHAPE1``.
FLOW_BITS = 10


def buffer_elements(config):
    """Elements (16 bits) of the buffer of a build."""
    return config.buffer_kib * 512


def buffer_banks(config, row_values):
    """Banks E of the buffer of a build whose cores read rows of ``row_values`` elements:
    ``config.dp_banks``, or else the widest access (``row_values``, ``macs``, the planar
    lanes). A port wider than E (a core's row read or row write) takes ``width / E`` runs, so E
    must divide it; :class:`ValueError` otherwise, or when E is not a power of two."""
    lanes = config.planar_lanes ** 2
    banks = config.dp_banks or max(row_values, config.macs, lanes)
    if banks & (banks - 1):
        raise ValueError(f"the buffer's banks must be a power of two, not {banks}")
    for what, width in (("input row", row_values), ("MAC row", config.macs)):
        if width > banks and width % banks:
            raise ValueError(f"the buffer's {banks} banks must divide the cores' {what} of "
                             f"{width} elements")
    if buffer_elements(config) % banks:
        raise ValueError(f"the buffer's {buffer_elements(config)} elements are not a multiple "
                         f"of its {banks} banks")
    return banks


def _dataset(prefix, offset):
    """The five registers of one dataset block."""
    return [
        Register(f"{prefix}_BASE", offset=offset, doc="Dataset base.", fields=[
            Field("addr", ADDR_BITS, doc="Element address of `(0, 0, 0)`."),
        ]),
        Register(f"{prefix}_SHAPE0", doc="Plane size.", fields=[
            Field("width", SHAPE_BITS, doc="W, elements per row."),
            Field("height", SHAPE_BITS, offset=16, doc="H, rows per plane."),
        ]),
        Register(f"{prefix}_SHAPE1", doc="Channels and flow control.", fields=[
            Field("channels", SHAPE_BITS, doc="C, planes."),
            Field("slots", FLOW_BITS, doc="M, slots of a flow-controlled dataset (0: no flow "
                  "control; only on `NE0_OUT` and `PE_A`, `docs/system.md`)."),
            Field("planes", FLOW_BITS, doc="Planes of a flow-control unit (a multiple of the "
                  "neural engine's output-channel group)."),
        ]),
        Register(f"{prefix}_CSTRIDE", doc="Channel stride.", fields=[
            Field("stride", ADDR_BITS, doc="Elements from one plane to the next."),
        ]),
        Register(f"{prefix}_RSTRIDE", doc="Row stride.", fields=[
            Field("stride", ADDR_BITS, doc="Elements from one row to the next."),
        ]),
    ]


#: Field names of a dataset, in register order.
DATASET_FIELDS = ("addr", "width", "height", "channels", "slots", "planes", "cstride",
                  "rstride")

_CORES_SHOWN = 1
DATA_PROCESSOR = RegisterMap("DATA_PROCESSOR", base=BASE, doc=(
    "Datasets of the engines' buffer ports (`docs/system.md`): core `i`'s input dataset "
    f"`NE{{i}}_IN_*` at `0x{BASE:04X} + 0x{CORE_STRIDE:X} * i` (core 0 shown), its output "
    f"dataset 8 words further; the planar engine's operand and result datasets at "
    f"`0x{BASE + PE_PORT_BASE:04X}`. An element `(c, y, x)` of a dataset is at buffer element "
    "`BASE + c * CSTRIDE + y * RSTRIDE + x`, modulo the buffer size."
), registers=(_dataset("NE0_IN", 0x00) + _dataset("NE0_OUT", 0x08)
              + [reg for k, port in enumerate(PE_PORTS)
                 for reg in _dataset(f"PE_{port}", PE_PORT_BASE + 8 * k)]
              + [Register("NE_CORES", offset=0xF00, doc="Cores a neural engine task runs on.",
                          fields=[Field("mask", 32, reset=1, doc="Bit `i`: core `i` starts "
                                        "with the task; the task is done when all have "
                                        "finished.")])]))

#: The registers of one dataset block, in order (offsets relative to the block).
DATASET_REGISTERS = ("BASE", "SHAPE0", "SHAPE1", "CSTRIDE", "RSTRIDE")


def ne_port_base(core, port):
    """Word address of core ``core``'s dataset block ``port`` (``"IN"`` or ``"OUT"``)."""
    return BASE + CORE_STRIDE * core + {"IN": 0, "OUT": 8}[port]


def pe_port_base(port):
    """Word address of the planar engine's dataset block ``port`` (``"A"``, ..., ``"OUT"``)."""
    return BASE + PE_PORT_BASE + 8 * PE_PORTS.index(port)


def make_dataset(addr, shape, *, cstride=None, rstride=None, slots=0, planes=0):
    """A dataset dict for a ``(C, H, W)`` tensor at element ``addr``; strides default to a
    dense tensor; ``slots`` and ``planes`` the flow control (``slots`` 0: none)."""
    c, h, w = shape
    rstride = w if rstride is None else rstride
    cstride = h * rstride if cstride is None else cstride
    return {"addr": int(addr), "width": int(w), "height": int(h), "channels": int(c),
            "slots": int(slots), "planes": int(planes), "cstride": int(cstride),
            "rstride": int(rstride)}


def dataset_writes(base, ds):
    """Register writes ``[(word address, value), ...]`` that program dataset ``ds`` into the
    block at word address ``base`` (:func:`ne_port_base`, :func:`pe_port_base`)."""
    regs = DATA_PROCESSOR
    return [
        (base + 0, regs["NE0_IN_BASE"].pack(addr=ds["addr"])),
        (base + 1, regs["NE0_IN_SHAPE0"].pack(width=ds["width"], height=ds["height"])),
        (base + 2, regs["NE0_IN_SHAPE1"].pack(channels=ds["channels"],
                                              slots=ds.get("slots", 0),
                                              planes=ds.get("planes", 0))),
        (base + 3, regs["NE0_IN_CSTRIDE"].pack(stride=ds["cstride"])),
        (base + 4, regs["NE0_IN_RSTRIDE"].pack(stride=ds["rstride"])),
    ]


def dataset_address(ds, c, y, x, elements):
    """Buffer element address of ``(c, y, x)`` of dataset ``ds`` in a buffer of ``elements``."""
    return (ds["addr"] + c * ds["cstride"] + y * ds["rstride"] + x) % elements

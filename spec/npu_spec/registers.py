"""The NPU's register maps: ``NPU_INFO``, the address windows, and ``docs/registers.md``.

The compiler, the golden model and the host runtime import the maps to encode and decode
register words; the gateware builds its register files from the same objects
(:class:`npu.lib.csr.RegisterFile`). :data:`NPU_INFO` holds the identification, the build
configuration, a scratch register and the CSR-bus error flags; every block's own map is declared
in the block's module (:mod:`npu_spec.taskman`, :mod:`npu_spec.neural`, :mod:`npu_spec.planar`)
at the base of its window in :data:`ADDRESS_WINDOWS`.
"""

from pathlib import Path

from .config import NPUConfig
from .regmap import Field, Register, RegisterMap, document

__all__ = [
    "MAGIC", "VERSION_MAJOR", "VERSION_MINOR",
    "NPU_INFO", "ADDRESS_WINDOWS", "register_maps",
    "npu_info_values", "registers_markdown", "write_docs", "build_register_maps",
    "regmap_c_header", "regmap_dict",
]


#: Value of ``ID.magic``: ASCII "NPU0".
MAGIC = 0x4E50_5530

#: Version of the register interface: the major number changes when a register or field moves,
#: changes meaning or disappears; the minor number when registers or fields are added.
VERSION_MAJOR = 1
VERSION_MINOR = 1


NPU_INFO = RegisterMap("NPU_INFO", base=0x0000, doc=(
    "Identification and build configuration of the NPU, a scratch register for bus tests, and "
    "the sticky CSR-bus error flags. The host reads `ID` and `VERSION` first to check it is "
    "talking to this NPU, then `CONFIG0`..`CONFIG2` to learn what was built."
), registers=[
    Register("ID", offset=0x0, doc="Constant identification word.", fields=[
        Field("magic", 32, access="ro", reset=MAGIC,
              doc=f"Always `0x{MAGIC:08X}` (ASCII \"NPU0\")."),
    ]),
    Register("VERSION", offset=0x1, doc="Version of the register interface.", fields=[
        Field("minor", 16, access="ro", reset=VERSION_MINOR,
              doc="Incremented when registers or fields are added."),
        Field("major", 16, access="ro", reset=VERSION_MAJOR,
              doc="Incremented when a register or field moves, changes meaning or is removed."),
    ]),
    Register("CONFIG0", offset=0x2, doc="Neural engine configuration of this build.", fields=[
        Field("cores", 8, access="ro", doc="Number of neural engine cores."),
        Field("acc_slots", 8, access="ro", doc="Accumulator slots per MAC unit."),
        Field("macs", 16, access="ro", doc="MAC units per core."),
    ]),
    Register("CONFIG1", offset=0x3, doc="Number formats, planar engine and task manager of this "
             "build.", fields=[
        Field("int8", 1, access="ro", doc="INT8 x INT8 MACs are built in."),
        Field("fp16", 1, access="ro", doc="FP16 x FP16 MACs are built in."),
        Field("mixed", 1, access="ro", doc="Mixed INT8 x FP16 MACs are built in."),
        Field("planar_lanes", 8, offset=8, access="ro",
              doc="P of the planar engine's P x P array."),
        Field("task_queues", 8, access="ro", doc="Number of task queues."),
        Field("planar_pool_beats", 4, access="ro",
              doc="Width K of the planar engine's pooling filters, in beats of P x P lanes."),
    ]),
    Register("CONFIG2", offset=0x4, doc="On-chip buffer of this build.", fields=[
        Field("buffer_kib", 32, access="ro", doc="Size of the data processor's buffer in KiB."),
    ]),
    Register("CONFIG3", offset=0x5, doc="System memory and kernel memories of this build.",
             fields=[
        Field("mem_width", 16, access="ro", doc="Data width of the system-memory bus in bits."),
        Field("kernel_kib", 16, access="ro", doc="Kernel memory of each core in KiB."),
    ]),
    Register("CONFIG4", offset=0x6, doc="System memory the build was made for.", fields=[
        Field("mem_kib", 32, access="ro", doc="System memory size in KiB (of the preset)."),
    ]),
    Register("SCRATCH", offset=0x8, doc="Read/write register with no effect on the hardware, "
             "for bus and driver tests.", fields=[
        Field("value", 32, access="rw", doc="Any value; reads return the last value written."),
    ]),
    Register("IRQ_STATUS", offset=0x9, doc="Sticky CSR-bus error flags, set by the NPU's CSR "
             "decoder from the bus `error` strobe. Write 1 to a bit to clear it; a flag set in the "
             "same cycle as it is cleared stays set.", fields=[
        Field("bus_read_error", 1, access="w1c",
              doc="A host read addressed no register (the CSR bus signalled `error`); the read "
                  "returned 0."),
        Field("bus_write_error", 1, access="w1c",
              doc="A host write addressed no register (the CSR bus signalled `error`); the write "
                  "was dropped."),
    ]),
    Register("CYCLE", offset=0xA, doc="Free-running cycle counter (the time base of the "
             "trace).", fields=[
        Field("count", 32, access="ro", doc="Cycles since reset, modulo 2**32."),
    ]),
    Register("TRACE_STATUS", offset=0x10, doc="Task trace buffer: one entry for every start "
             "and every end of a task (`docs/system.md`, \"Trace buffer\").", fields=[
        Field("count", 16, access="ro", doc="Entries waiting to be read."),
        Field("overflow", 1, offset=16, access="ro",
              doc="An entry was dropped because the buffer was full (cleared by `clear`)."),
    ]),
    Register("TRACE_DATA0", doc="The oldest entry, first word.", fields=[
        Field("task_id", 16, access="ro", doc="Task ID of the descriptor."),
        Field("engine", 2, access="ro", doc="0 neural, 1 planar, 2 DMA."),
        Field("end", 1, access="ro", doc="0: the task started; 1: it ended."),
        Field("error", 4, offset=20, access="ro", doc="The engine's error code (ends only); "
              "15: the task manager's watchdog aborted the task."),
        Field("queue", 5, offset=24, access="ro", doc="Queue of the task."),
        Field("valid", 1, offset=31, access="ro", doc="An entry is present."),
    ]),
    Register("TRACE_DATA1", doc="The oldest entry, second word.", fields=[
        Field("cycle", 32, access="ro", doc="`CYCLE` at the start or end."),
    ]),
    Register("TRACE_CTRL", doc="Trace buffer commands.", fields=[
        Field("pop", 1, access="wo", doc="Drop the oldest entry (after reading it)."),
        Field("clear", 1, access="wo", doc="Drop every entry and clear `overflow`."),
    ]),
])

#: Word-address windows of the NPU's register maps. Every block's map lies in its window; the
#: task manager rejects a descriptor entry that writes outside every map.
ADDRESS_WINDOWS = {
    "NPU_INFO":       (0x0000, 0x0100),
    "TASK_MANAGER":   (0x1000, 0x1000),
    "NEURAL_ENGINE":  (0x2000, 0x1000),   # core i at 0x2000 + 0x100 * i
    "PLANAR_ENGINE":  (0x3000, 0x0100),
    "DATA_PROCESSOR": (0x4000, 0x1000),
    "DMA":            (0x5000, 0x0100),
}


def register_maps():
    """Every register map of the NPU, in address order; ``docs/registers.md`` documents these.

    The task manager's map is shown for the default number of queues, the neural engine's for
    core 0.
    """
    from .dataproc import DATA_PROCESSOR
    from .dma import DMA
    from .neural import NEURAL_ENGINE
    from .planar import PLANAR_ENGINE
    from .taskman import TASK_MANAGER
    maps = (NPU_INFO, TASK_MANAGER, NEURAL_ENGINE, PLANAR_ENGINE, DATA_PROCESSOR, DMA)
    for regmap in maps:
        start, size = ADDRESS_WINDOWS[regmap.name]
        if not (start <= regmap.base and regmap.base + regmap.size <= start + size):
            raise ValueError(f"register map {regmap.name} lies outside its address window")
    return tuple(sorted(maps, key=lambda m: m.base))


def npu_info_values(config):
    """Values of the read-only fields of :data:`NPU_INFO` for a build with ``config``.

    Parameters
    ----------
    config : NPUConfig

    Returns
    -------
    dict
        ``{register name: {field name: value}}`` for every ``ro`` register of the map; each
        value is checked against its field, so ``NPU_INFO[reg].pack(**fields)`` gives the word
        the host reads.
    """
    if not isinstance(config, NPUConfig):
        raise TypeError(f"Configuration must be an NPUConfig, not {config!r}")
    values = {
        "ID": {"magic": MAGIC},
        "VERSION": {"major": VERSION_MAJOR, "minor": VERSION_MINOR},
        "CONFIG0": {"cores": config.cores, "acc_slots": config.acc_slots, "macs": config.macs},
        "CONFIG1": {"int8": int(config.has_int8), "fp16": int(config.has_fp16),
                    "mixed": int(config.has_mixed), "planar_lanes": config.planar_lanes,
                    "task_queues": config.task_queues,
                    "planar_pool_beats": config.planar_pool_beats},
        "CONFIG2": {"buffer_kib": config.buffer_kib},
        "CONFIG3": {"mem_width": config.mem_width, "kernel_kib": config.kernel_kib},
        "CONFIG4": {"mem_kib": config.mem_kib},
    }
    for reg_name, fields in values.items():
        NPU_INFO[reg_name].pack(**fields)  # Raises ValueError if a value does not fit.
    return values


_INTRO = """\
This file is generated by `python scripts/gen_docs.py` from the declarations in
`spec/npu_spec/` (`registers.py` and each block's module); do not edit it by hand (a test
checks that it is up to date).

## How register maps work

Every register is declared once, in plain Python (`npu_spec.regmap`, no Amaranth needed):

```python
from npu_spec.regmap import Field, Register, RegisterMap

EXAMPLE = RegisterMap("EXAMPLE", base=0x100, doc="...", registers=[
    Register("CTRL", offset=0x0, doc="...", fields=[
        Field("mode", 2, access="rw", enum={"IDLE": 0, "RUN": 1}, doc="..."),
        Field("start", 1, offset=8, access="wo", doc="..."),
    ]),
    Register("STATUS", doc="...", fields=[           # offset 0x1: after the previous register
        Field("busy", 1, access="ro", doc="..."),    # bit 0: fields are placed in order
        Field("done", 1, access="w1c", doc="..."),   # bit 1
    ]),
])
```

From that declaration come:

1. **The RTL**: `npu.lib.csr.RegisterFile(EXAMPLE)` is an Amaranth component with a CSR bus port
   `bus` and one port per register, named after it in lower case, whose members are the
   fields: `regfile.ctrl.mode`, `regfile.status.busy`, ... (see below).
2. **The encoder** used by the compiler: `EXAMPLE.encode("CTRL", mode="RUN", start=1)` returns
   `(address, word)`; `EXAMPLE.encode_block({...})` merges writes to consecutive registers into
   `(address, count, words)` blocks, the entry format of task descriptors; `decode` and
   `decode_block` invert them. Values are range-checked, enum fields take members or member
   names, and read-only fields cannot be encoded: a mistake is a `ValueError` naming the value.
3. **This document**, from `RegisterMap.to_markdown()`.

Declarations are checked when they are made: overlapping fields, fields beyond bit 31,
duplicate names or offsets, reset values that do not fit and unknown enum members raise
`ValueError`.

### Addressing

Registers are 32 bits wide. Addresses are **word addresses** (register indices), not byte
addresses: register offset `n` of a map with base `b` is at address `b + n`, on the CSR bus and
in task descriptors alike. A map's register file decodes offsets; the CSR decoder in front of it
strips the base. Bits outside every field are reserved: they read as 0, writes to them are
ignored, and the encoder writes 0.

### Access types

| Access | Host read | Host write | Hardware side (`regfile.<register>.…`) |
|---|---|---|---|
| `rw` | stored value | replaces the value | `<field>`: output, the current value |
| `ro` | hardware value | ignored | `<field>`: input, driven by the hardware |
| `w1c` | sticky value | writing 1 clears | `<field>`: output; `<field>_set`: input pulse |
| `wo` | 0 | one-cycle pulse | `<field>`: output, written value for one cycle, else 0 |

Every register with a writable field also has a `written` output, high for the one cycle after
a bus write to it. For a `w1c` bit, a hardware set and a host clear in the same cycle leave the
bit **set**, so no event is lost. Reads have no side effects. A reset value of "hw" means the
field has no fixed value: it reads whatever the hardware drives.

### CSR bus timing

Single-cycle accesses, no wait states, no handshake (so no access can hang):

| Cycle | Initiator drives | Register file answers |
|---|---|---|
| n | `r_en`, `addr` | |
| n + 1 | | `r_data` = the word (0 in every cycle not after `r_en`) |
| n | `w_en`, `addr`, `w_data` | |
| n + 1 | | the hardware sees the new value; `written` = 1 |
| n | `r_en` or `w_en` to an unmapped `addr` | |
| n + 1 | | `error` = 1 for one cycle, `r_data` = 0, nothing written |

A read and a write in the same cycle are allowed; the read returns the value before the write.
"""


def registers_markdown():
    """The full text of ``docs/registers.md``."""
    return document(register_maps(), title="Registers", intro=_INTRO)


def write_docs(path):
    """Write :func:`registers_markdown` to ``path`` (e.g. ``docs/registers.md``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(registers_markdown(), encoding="utf-8")
    return path


def build_register_maps(config):
    """Every register map of a build with ``config``, in address order: the task manager with
    the build's queues, one neural engine map per core (at ``core_base(i)``, named ``NE{i}``),
    the other blocks as :func:`register_maps` gives them."""
    from .neural import NEURAL_ENGINE, core_base
    from .taskman import task_manager_map
    maps = []
    for regmap in register_maps():
        if regmap.name == "TASK_MANAGER":
            maps.append(task_manager_map(config.task_queues))
        elif regmap.name == "NEURAL_ENGINE":
            maps += [RegisterMap(f"NE{i}", NEURAL_ENGINE.registers, base=core_base(i),
                                 doc=NEURAL_ENGINE.doc) for i in range(config.cores)]
        else:
            maps.append(regmap)
    return tuple(maps)


def regmap_dict(config):
    """The register interface of a build as plain data (for ``npu generate --regmap json``):
    version, the build's ``NPU_INFO`` values, and every map with its registers and fields
    (word addresses, bit offsets, widths, access, reset, enum values)."""
    maps = []
    for regmap in build_register_maps(config):
        regs = []
        for reg in regmap.registers:
            regs.append({
                "name": reg.name, "offset": reg.offset, "address": regmap.base + reg.offset,
                "doc": reg.doc,
                "fields": [{"name": f.name, "offset": f.offset, "width": f.width,
                            "access": f.access, "reset": f.reset or 0,
                            "enum": {k: int(v) for k, v in (f.enum or {}).items()}
                            if isinstance(f.enum, dict) else
                            ({m.name: int(m) for m in f.enum} if f.enum else {}),
                            "doc": f.doc} for f in reg.fields],
            })
        maps.append({"name": regmap.name, "base": regmap.base, "size": regmap.size,
                     "doc": regmap.doc, "registers": regs})
    return {"version": [VERSION_MAJOR, VERSION_MINOR], "config": config.name,
            "info": npu_info_values(config), "maps": maps}


def regmap_c_header(config):
    """A C header of the register interface of a build: ``#define``s of every register's word
    address and every field's shift and mask (``NPU_<MAP>_<REG>``, ``..._<FIELD>_SHIFT``,
    ``..._<FIELD>_MASK``), for host software."""
    guard = "NPU_REGS_H"
    lines = [f"/* Register interface {VERSION_MAJOR}.{VERSION_MINOR} of the open NPU, "
             f"configuration '{config.name}'.", " * Generated by 'npu generate --regmap c'; "
             "addresses are 32-bit word addresses. */", f"#ifndef {guard}", f"#define {guard}",
             "", f"#define NPU_VERSION_MAJOR {VERSION_MAJOR}u",
             f"#define NPU_VERSION_MINOR {VERSION_MINOR}u", ""]
    for regmap in build_register_maps(config):
        lines.append(f"/* {regmap.name} */")
        for reg in regmap.registers:
            name = f"NPU_{regmap.name}_{reg.name}".upper()
            lines.append(f"#define {name} 0x{regmap.base + reg.offset:04X}u")
            for f in reg.fields:
                mask = ((1 << f.width) - 1) << f.offset
                lines.append(f"#define {name}_{f.name.upper()}_SHIFT {f.offset}u")
                lines.append(f"#define {name}_{f.name.upper()}_MASK 0x{mask:08X}u")
        lines.append("")
    lines += [f"#endif /* {guard} */", ""]
    return "\n".join(lines)

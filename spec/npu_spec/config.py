"""The processor configuration: one frozen object, named presets.

This module is plain Python (no Amaranth, no numpy) so that the golden model, the compiler and
the RTL can all read the same configuration.
"""

from dataclasses import dataclass, field, fields, replace

__all__ = ["FORMATS", "KERNEL_EXTRACTS", "MAC_IMPLS", "NE_CONTROLS", "NPUConfig", "PLANAR_IMPLS",
           "NPU_IMPLS", "POSTPROC_IMPLS", "PRESETS", "TASKMAN_IMPLS", "preset"]


#: MAC datapaths (``NPUConfig.mac_impl``): the generic one, and the ones built from a device's
#: DSP primitives.
MAC_IMPLS = ("generic", "ice40", "ecp5", "ecp5_shared")

#: Number formats a configuration may include. ``mixed`` is int8 x binary16 (either side) and
#: needs both ``int8`` and ``fp16``.
FORMATS = ("int8", "fp16", "mixed")

#: Implementations of the MAC array (``NPUConfig.mac_impl``): the portable reference, or a
#: datapath built around one FPGA family's DSP primitive (``docs/mac.md``).
MAC_IMPLS = ("generic", "ice40", "ecp5", "ecp5_shared")

#: Kernel extractor builds (``NPUConfig.kernel_extract``): every encoding of
#: ``docs/kernel_format.md``, or dense raw int8 bodies only (``npu_spec.kernel.encoding_accepted``
#: is the rule both the gateware and the golden model follow).
KERNEL_EXTRACTS = ("full", "dense_int8")

#: Post-processor builds (``NPUConfig.postproc_impl``): the pipelined one (every format, a
#: number of lanes per cycle), or the sequential int8-only one for FPGAs short of logic
#: (``docs/postproc.md``).
POSTPROC_IMPLS = ("pipelined", "sequential")

#: Planar engine builds (``NPUConfig.planar_impl``): the binary32 datapath (every operation and
#: format), or the integer one for int8-only FPGAs, which computes the subset of operations
#: whose golden binary32 result it can give exactly with integers and refuses the rest
#: (``npu_spec.planar.int8_supported``, error ``UNSUPPORTED``; ``docs/planar.md``).
PLANAR_IMPLS = ("float", "int8")

#: Builds of a neural engine core's layer control (``NPUConfig.ne_control``): the full one (a
#: copy of the layer registers taken at the start, the output-channel product by a
#: multiplier), or the lean one for FPGAs short of logic (``docs/neural_engine.md``, "Lean
#: builds").
NE_CONTROLS = ("full", "lean")

#: Task manager builds (``NPUConfig.taskman_impl``): the full one (asynchronous dispatch of up
#: to four tasks, the 8-entry base-address table, 32-bit addresses), or the lean one for FPGAs
#: short of logic, which runs one task at a time, has one base-table entry a queue and keeps
#: addresses in the bits the system memory needs; a program beyond it is refused
#: (``npu_spec.taskman.lean_error``; ``docs/task_manager.md``).
TASKMAN_IMPLS = ("full", "lean")

#: Builds of the whole NPU (``NPUConfig.npu_impl``): ``"blocks"`` (``npu.top.NPUTop``, the
#: engines, data processor, DMA engine and task manager every preset is built from) or
#: ``"micro"`` (``npu.micro.top.MicroNPU``, the sequential build of the same program contract
#: for the iCEBreaker, ``docs/micro.md``). Same programs, same numbers; only the board top
#: (``npu_fpga.boards``) looks at it.
NPU_IMPLS = ("blocks", "micro")


@dataclass(frozen=True)
class NPUConfig:
    """Parameters of one NPU build.

    Every field is checked on construction; a bad value raises :class:`ValueError` or
    :class:`TypeError` naming the field and the value.

    Attributes
    ----------
    name : str
        Preset name (or a user label).
    cores : int
        Number of neural engine cores.
    macs : int
        Multiply-accumulate units per core (the MAC array width N). Must be even, because the
        dual-kernel mode pairs lanes 2i and 2i+1.
    acc_slots : int
        Accumulator slots per MAC unit (output channels that can be interleaved).
    formats : tuple of str
        Arithmetic formats built into the hardware, a subset of :data:`FORMATS`. Formats left
        out are removed from the hardware, not just disabled.
    planar_lanes : int
        P of the planar engine's P x P array.
    planar_pool_beats : int
        Width of the planar engine's pooling filters in beats of ``P * P`` lanes (K): the
        horizontal and vertical filters have ``K * P * P`` lanes, so that overlapping windows
        (``kw / sx`` horizontal steps per input beat) still pool about ``P * P`` elements per
        cycle; 1 for FPGAs short of logic.
    buffer_kib : int
        Size of the data processor's on-chip buffer in KiB.
    task_queues : int
        Number of task queues in the neural task manager.
    mem_width : int
        Data width of the system-memory bus in bits (32, 64, 128 or 256; ``docs/system.md``).
    mem_kib : int
        System memory the preset is built for (the simulation's memory; a board's RAM).
    kernel_kib : int
        Kernel memory of each neural engine core (compressed kernel blobs, filled by the DMA).
    acc_memory : str
        How accumulator slots are stored: ``"logic"`` (flip-flops or LUT RAM, the synthesis
        tool's choice) or ``"block"`` (block RAM, for FPGAs short of logic such as the iCE40).
    mac_impl : str
        MAC array implementation, one of :data:`MAC_IMPLS` (same contract, same results):
        ``"generic"`` (inferred arithmetic, the reference for the Amaranth simulator),
        ``"ice40"`` (``SB_MAC16`` in its dual 8x8 mode; int8 only) or ``"ecp5"`` (registered
        ``MULT18X18D``, no clock enable; needs a float format) or ``"ecp5_shared"`` (the
        same with one float unit shared by ``fp_share`` int8 lanes). ``docs/mac.md``.
    fp_share : int
        Lanes served by one float unit of the ``"ecp5_shared"`` MAC array: FP16 and mixed
        commands run at ``macs / fp_share`` products a cycle (INT8 at ``macs``). Must divide
        ``macs``; 1 for every other ``mac_impl``.
    kernel_extract : str
        Kernel extractor build, one of :data:`KERNEL_EXTRACTS`: ``"full"`` (raw, sparse and
        palettized kernels, int8 and binary16) or ``"dense_int8"`` (dense raw int8 kernels
        only, a fraction of the logic; a kernel in any other encoding is refused with
        ``KernelError.BAD_CONFIG``, the engine's ``EXTRACT`` error). ``docs/kernel_format.md``.
    postproc_impl : str
        Post-processor build, one of :data:`POSTPROC_IMPLS`: ``"pipelined"`` (every format,
        ``lanes_per_cycle`` lanes a cycle) or ``"sequential"`` (int8 only: one lane at a time,
        the rescale multiply in four steps on one 16 x 16 multiplier, parameter banks in block
        RAM; needs ``formats == ("int8",)``). ``docs/postproc.md``.
    result_queue : int
        Results that may wait for a neural engine core's post-processor: the MAC array's
        output register, which holds a result until it is taken, and ``result_queue - 1``
        entries of a queue between them (with 1, no queue: the MAC array feeds the
        post-processor directly). 0 (the default) means a queue of one entry per accumulator
        slot (``acc_slots``), so that a work unit's results never stall the MAC array. A lean
        build takes fewer: the MAC array then waits while the post-processor works
        (``docs/neural_engine.md``).
    ne_row_values : int
        Inputs in each halo row of a core's input buffer (a power of two); 0 (the default)
        means the rule of ``npu_spec.neural.engine_geometry`` (``min(2 macs, 64)``). A layer
        whose halo row is wider ends with ``HALO``; fewer values make the input buffer and the
        shifter proportionally smaller.
    ne_buffer_rows : int
        Rows (input channels x kernel rows) each lane row of a core's input buffer holds per
        bank; 0 (the default) means the rule of ``npu_spec.neural.engine_geometry`` (256, 1024
        above 64 MACs). A group whose rows exceed it ends with ``BUFFER``
        (``npu_spec.neural.layer_error``; the compiler splits such layers).
    ne_kernel_queue : int
        Words of the queue between a core's kernel DMA and its kernel extractor; 0 (the
        default) means 8. At least 2; a shallower queue reads kernels more slowly.
    ne_out_channels : int
        Most output channels (``K = groups x ocpg``) a core's layer may have; 0 (the default)
        means what the registers can express (4095 x 4095). A core counts output channels in
        ``ne_out_channels.bit_length()`` bits (24 by default); a layer with more ends with
        ``SHAPE`` (``npu_spec.neural.layer_error``), never wraps.
    ne_out_size : int
        Most output rows and most output columns (``out_h``, ``out_w``) a core's layer may
        have; 0 (the default) means what the registers can express (4095). A core counts work
        units and output rows and columns only as wide as this needs; a layer with more ends
        with ``SHAPE`` (``npu_spec.neural.layer_error``).
    ne_control : str
        A core's layer control, one of :data:`NE_CONTROLS`: ``"full"`` (the core copies its
        layer registers when a layer starts, so the host may write the next layer's registers
        while one runs; ``groups x ocpg`` by a multiplier) or ``"lean"`` (the sub-units read
        the register file itself, and a host write to a layer register while the core is busy
        is refused with the CSR error strobe and changes nothing; ``groups x ocpg`` by shifts
        and adds over up to 12 cycles at the start, no multiplier). The task manager's writes
        wait for the core's end in both builds.
    ne_post_lanes : int
        Lanes the pipelined post-processor of each core handles per cycle (it takes
        ``macs / ne_post_lanes`` cycles per result beat and builds ``ne_post_lanes`` lane
        datapaths); 0 (the default) means a quarter of the MACs
        (``npu_spec.neural.post_lanes``). Must divide ``macs``. The sequential post-processor
        ignores it.
    planar_impl : str
        Planar engine build, one of :data:`PLANAR_IMPLS`: ``"float"`` (binary32 lanes, every
        operation and format) or ``"int8"`` (16-bit integer lanes without binary32 units: max
        and min pooling, copy, ReLU, abs, neg, add, sub, max, min, compare, gain-bias with
        ``SCALE`` 0 or 1 and an integer ``BIAS``, integer sums, max and min reductions; any
        other task is refused with ``PlanarError.UNSUPPORTED``, the rule of
        ``npu_spec.planar.int8_supported``; needs ``formats == ("int8",)``). ``docs/planar.md``.
    planar_fp_share : int
        Lanes of the binary32 planar engine served by one lane's units (an add/max/min pipe, a
        multiplier and an adder): a power of two dividing ``planar_lanes ** 2``; the lane
        pipeline then takes a beat every ``planar_fp_share`` cycles (results unchanged).
        1 (the default) for a datapath per lane; must be 1 with ``planar_impl="int8"``.
        ``docs/planar.md``, "Shared lane units".
    taskman_impl : str
        Task manager build, one of :data:`TASKMAN_IMPLS`: ``"full"`` or ``"lean"`` (one task in
        flight at a time, as with ``SKEW`` 1; a base-address table of ``task_queues`` entries;
        head, tail, base and limit registers of ``npu_spec.taskman.address_bits`` bits; the
        stall counters left out). A program whose setup does not fit the lean build is refused
        with the rule of ``npu_spec.taskman.lean_error``. ``docs/task_manager.md``.
    ne_shift_stages : int
        Pipeline registers inside each core's shifter: 0 (the default; the shifter is
        combinational between the input-buffer read and the MAC command register) or 1 (a
        register after the shifter's two widest levels, and one more stage in the sequencer's
        issue pipeline). Results are unchanged; a command leaves one cycle later. The register
        keeps Yosys from spreading the shifter's levels over wide LUTs: fewer LUTs, more
        flip-flops (``docs/neural_engine.md``, "Input buffer and shifter").
    dispatch_regs : int
        0 (the default) or 1: a register on the task starts from the task manager to each
        neural engine core (``npu.top``, ``docs/system.md``, "Dispatch registers"), so that no
        combinational path runs from the task manager's dispatch into a core, and one on every
        engine's ``done`` and ``error`` into the task manager (``docs/task_manager.md``, "The
        done register"). A core then starts its task one cycle later, and the task manager
        acts on an engine's end of task one cycle later; results are unchanged.
    dp_banks : int
        Banks of the data processor's buffer (E, the widest run it serves in one cycle): 0 (the
        default) for the widest port access (a core's input row, its MAC row, the planar
        lanes), or a power of two at least ``planar_lanes ** 2`` that divides the cores' row
        and MAC widths it is narrower than; a core's row read or write then takes one run of E
        elements a cycle (results unchanged, ``npu_spec.dataproc.buffer_banks``;
        ``docs/system.md``, "Banks and conflicts").
    npu_impl : str
        Build of the whole NPU on a board, one of :data:`NPU_IMPLS`: ``"blocks"`` (the default)
        or ``"micro"`` (``docs/micro.md``: int8 only, 32-bit system memory words, the queue-0
        program contract; needs ``formats == ("int8",)`` and ``mem_width`` 32). A program
        file's check (``npu_spec.program.check_config``) ignores it: both builds run the same
        programs.
    csr_read : str
        How the register files answer the host's reads of their ``rw`` fields (the value the
        same either way; :class:`npu.lib.csr.RegisterFile`'s ``read_path``): ``"logic"`` (the
        default; a multiplexer over the registers' flip-flops) or ``"memory"`` (a copy of
        every write in a small memory, LUT RAM on the ECP5: fewer LUTs for the data
        processor's, the DMA's, the neural engine's and the task manager's register files).
    target : str
        What the preset is sized for (documentation only).
    """

    name: str = "custom"
    cores: int = 1
    macs: int = 16
    acc_slots: int = 8
    formats: tuple = ("int8", "fp16", "mixed")
    planar_lanes: int = 4
    planar_pool_beats: int = 1
    buffer_kib: int = 64
    task_queues: int = 8
    mem_width: int = 32
    mem_kib: int = 256
    kernel_kib: int = 16
    acc_memory: str = "logic"
    mac_impl: str = "generic"
    fp_share: int = 1
    kernel_extract: str = "full"
    postproc_impl: str = "pipelined"
    result_queue: int = 0
    ne_row_values: int = 0
    ne_buffer_rows: int = 0
    ne_out_channels: int = 0
    ne_kernel_queue: int = 0
    ne_out_size: int = 0
    ne_control: str = "full"
    ne_post_lanes: int = 0
    planar_impl: str = "float"
    planar_fp_share: int = 1
    taskman_impl: str = "full"
    ne_shift_stages: int = 0
    dispatch_regs: int = 0
    dp_banks: int = 0
    npu_impl: str = "blocks"
    csr_read: str = "logic"
    target: str = field(default="", compare=False)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is int and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"NPUConfig.{f.name} must be an integer, not {value!r}")
            if f.type is str and not isinstance(value, str):
                raise TypeError(f"NPUConfig.{f.name} must be a string, not {value!r}")
        for name, lo, hi in (("cores", 1, 64), ("macs", 2, 4096), ("acc_slots", 1, 64),
                             ("planar_lanes", 1, 32), ("planar_pool_beats", 1, 4),
                             ("buffer_kib", 1, 1 << 16),
                             ("task_queues", 1, 32), ("mem_kib", 1, 1 << 22),
                             ("kernel_kib", 1, 1 << 10), ("result_queue", 0, 64),
                             ("ne_buffer_rows", 0, 4096),
                             ("ne_out_channels", 0, 4095 * 4095),
                             ("ne_kernel_queue", 0, 64), ("ne_out_size", 0, 4095),
                             ("ne_shift_stages", 0, 1), ("dispatch_regs", 0, 1)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"NPUConfig.{name} must be in [{lo}, {hi}], not {value!r}")
        if self.mem_width not in (32, 64, 128, 256):
            raise ValueError(f"NPUConfig.mem_width must be 32, 64, 128 or 256, "
                             f"not {self.mem_width!r}")
        if self.csr_read not in ("logic", "memory"):
            raise ValueError(f"NPUConfig.csr_read must be 'logic' or 'memory', "
                             f"not {self.csr_read!r}")
        if self.acc_memory not in ("logic", "block"):
            raise ValueError(f"NPUConfig.acc_memory must be 'logic' or 'block', "
                             f"not {self.acc_memory!r}")
        if self.mac_impl not in MAC_IMPLS:
            raise ValueError(f"NPUConfig.mac_impl must be one of {', '.join(MAC_IMPLS)}, "
                             f"not {self.mac_impl!r}")
        if not 1 <= self.fp_share <= self.macs or self.macs % self.fp_share:
            raise ValueError(f"NPUConfig.fp_share must divide macs ({self.macs}), "
                             f"not {self.fp_share!r}")
        if self.fp_share != 1 and self.mac_impl != "ecp5_shared":
            raise ValueError(f"NPUConfig.fp_share {self.fp_share!r} needs mac_impl "
                             f"'ecp5_shared' (the only array with shared float units), "
                             f"not {self.mac_impl!r}")
        for name, choices in (("kernel_extract", KERNEL_EXTRACTS),
                              ("postproc_impl", POSTPROC_IMPLS),
                              ("planar_impl", PLANAR_IMPLS),
                              ("ne_control", NE_CONTROLS),
                              ("taskman_impl", TASKMAN_IMPLS),
                              ("npu_impl", NPU_IMPLS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"NPUConfig.{name} must be one of {', '.join(choices)}, "
                                 f"not {getattr(self, name)!r}")
        if self.ne_row_values & (self.ne_row_values - 1) or self.ne_row_values > 1024:
            raise ValueError(f"NPUConfig.ne_row_values must be 0 or a power of two up to 1024, "
                             f"not {self.ne_row_values!r}")
        if self.ne_post_lanes < 0 or self.ne_post_lanes > self.macs or (
                self.ne_post_lanes and self.macs % self.ne_post_lanes):
            raise ValueError(f"NPUConfig.ne_post_lanes must be 0 or divide macs ({self.macs}), "
                             f"not {self.ne_post_lanes!r}")
        if self.ne_kernel_queue == 1:
            raise ValueError("NPUConfig.ne_kernel_queue must be 0 (8 words) or at least 2, "
                             "not 1")
        if self.macs % 2:
            raise ValueError(f"NPUConfig.macs must be even (dual-kernel mode pairs lanes), "
                             f"not {self.macs!r}")
        if isinstance(self.formats, (str, bytes)) or not isinstance(self.formats, (tuple, list,
                                                                                   frozenset,
                                                                                   set)):
            raise TypeError(f"NPUConfig.formats must be a tuple of format names, "
                            f"not {self.formats!r}")
        for fmt in self.formats:
            if fmt not in FORMATS:
                raise ValueError(f"NPUConfig.formats: unknown format {fmt!r}; "
                                 f"choose from {', '.join(FORMATS)}")
        if not self.formats:
            raise ValueError("NPUConfig.formats must name at least one format, not ()")
        if "mixed" in self.formats and not {"int8", "fp16"} <= set(self.formats):
            raise ValueError(f"NPUConfig.formats: 'mixed' needs both 'int8' and 'fp16', "
                             f"not {tuple(self.formats)!r}")
        if self.postproc_impl == "sequential" and set(self.formats) != {"int8"}:
            raise ValueError(f"NPUConfig.postproc_impl 'sequential' is int8 only: formats "
                             f"must be ('int8',), not {tuple(self.formats)!r}")
        if self.planar_impl == "int8" and set(self.formats) != {"int8"}:
            raise ValueError(f"NPUConfig.planar_impl 'int8' is int8 only: formats must be "
                             f"('int8',), not {tuple(self.formats)!r}")
        lanes = self.planar_lanes ** 2
        share = self.planar_fp_share
        if share < 1 or share & (share - 1) or lanes % share:
            raise ValueError(f"NPUConfig.planar_fp_share must be a power of two dividing "
                             f"planar_lanes ** 2 ({lanes}), not {share!r}")
        if share != 1 and self.planar_impl != "float":
            raise ValueError(f"NPUConfig.planar_fp_share {share!r} needs planar_impl 'float' "
                             f"(the integer build has no binary32 units), "
                             f"not {self.planar_impl!r}")
        if self.npu_impl == "micro" and (set(self.formats) != {"int8"} or self.mem_width != 32):
            raise ValueError(f"NPUConfig.npu_impl 'micro' is int8 only on 32-bit system memory "
                             f"words: formats must be ('int8',) and mem_width 32, not "
                             f"{tuple(self.formats)!r} and {self.mem_width!r}")
        banks = self.dp_banks
        if banks and (banks & (banks - 1) or not lanes <= banks <= 1024):
            raise ValueError(f"NPUConfig.dp_banks must be 0 or a power of two from "
                             f"planar_lanes ** 2 ({lanes}) to 1024, not {banks!r}")
        # Canonical order, so equal configurations compare and hash equal.
        object.__setattr__(self, "formats", tuple(f for f in FORMATS if f in self.formats))

    @property
    def has_int8(self):
        return "int8" in self.formats

    @property
    def has_fp16(self):
        return "fp16" in self.formats

    @property
    def has_mixed(self):
        return "mixed" in self.formats

    @property
    def has_float(self):
        """True if the accumulators must hold binary32 (any format with a binary16 side)."""
        return self.has_fp16 or self.has_mixed

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


PRESETS = {
    "small": NPUConfig(
        name="small", cores=1, macs=16, acc_slots=8, formats=("int8", "fp16", "mixed"),
        planar_lanes=4, planar_pool_beats=3, buffer_kib=64, task_queues=8,
        target="fast simulation; default for tests"),
    "ice40": NPUConfig(
        name="ice40", cores=1, macs=8, acc_slots=8, formats=("int8",),
        planar_lanes=2, buffer_kib=64, task_queues=4, acc_memory="block",
        mem_kib=64, kernel_kib=4, mac_impl="ice40",
        target="iCEBreaker, iCE40UP5K (5,280 LUT, 8 DSP, 128 KiB SPRAM)"),
    "ecp5": NPUConfig(
        name="ecp5", cores=2, macs=32, acc_slots=8, formats=("int8", "fp16", "mixed"),
        planar_lanes=2, buffer_kib=256, task_queues=8, mem_width=64, mem_kib=128,
        target="ULX3S, LFE5U-85F (84k LUT, 156 MULT18X18, 208 EBR)"),
    # The board presets (docs/boards.md): what ``npu build --board`` builds by default.
    "icebreaker": NPUConfig(
        name="icebreaker", cores=1, macs=8, acc_slots=8, formats=("int8",),
        planar_lanes=2, buffer_kib=32, task_queues=2, acc_memory="block",
        mem_kib=64, kernel_kib=4, mac_impl="ice40", kernel_extract="dense_int8",
        postproc_impl="sequential", planar_impl="int8", result_queue=1, ne_row_values=8,
        ne_buffer_rows=128, ne_out_channels=1024,
        ne_kernel_queue=3, ne_out_size=255, ne_control="lean", taskman_impl="lean",
        dp_banks=4, npu_impl="micro",
        target="iCEBreaker board, iCE40UP5K, the micro build (docs/micro.md; the blocks' "
               "sizes below are those of the program contract): int8 only, 2 task queues "
               "(lean task manager: one task at a time), 64 KiB system memory, "
               "dense int8 kernels, sequential post-processor, integer planar engine, no "
               "result queue, input-buffer rows of 8 values, 128 rows a bank, at "
               "most 1024 output channels a layer, a 3-word kernel queue, outputs of at most "
               "255 x 255, the lean layer control, 4 buffer banks"),
    "ulx3s": NPUConfig(
        name="ulx3s", cores=1, macs=32, acc_slots=8, formats=("int8", "fp16", "mixed"),
        planar_lanes=1, buffer_kib=64, task_queues=4, mem_width=64, mem_kib=64,
        kernel_kib=8, mac_impl="ecp5_shared", fp_share=16,
        ne_post_lanes=1, ne_row_values=32, ne_out_channels=4096,
        ne_shift_stages=1, dispatch_regs=1, dp_banks=8, csr_read="memory",
        target="ULX3S board, LFE5U-85F: int8, fp16 and mixed, 64 KiB system memory, "
               "8 buffer banks; FP16 and mixed at 1/16 of the INT8 rate (2 products a cycle "
               "against 32)"),
    "ane": NPUConfig(
        name="ane", cores=16, macs=256, acc_slots=8, formats=("int8", "fp16", "mixed"),
        planar_lanes=8, planar_pool_beats=3, buffer_kib=4096, task_queues=8,
        mem_width=256, mem_kib=1 << 16, kernel_kib=64,
        target="Verilog and simulation only: the full Neural Engine shape"),
}

# The iCEBreaker preset built from the blocks (``npu_impl="blocks"``), kept for the record:
# 38,116 logic cells against the UP5K's 5,280 (docs/synthesis.md, "iCEBreaker (iCE40UP5K)").
PRESETS["icebreaker_blocks"] = PRESETS["icebreaker"].replace(
    name="icebreaker_blocks", npu_impl="blocks",
    target="iCEBreaker board, iCE40UP5K, built from the blocks (does not fit: 38,116 LC); "
           "the icebreaker preset's contract")


def preset(name):
    """The preset called ``name``; :class:`ValueError` naming the choices otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; choose from "
                         f"{', '.join(PRESETS)}") from None

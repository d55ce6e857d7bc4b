"""The micro DMA unit: the DMA engine's transfers (``npu_spec.dma``), one element at a time."""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc
from npu_spec.config import NPUConfig
from npu_spec.dma import DMA, RANK, SIZE_BITS, DmaDir, DmaError, DmaFormat

from .unit import BUF_ADDR_BITS, KMEM_ADDR_BITS, unit_members

__all__ = ["MicroDMA"]

#: The task registers in the order the unit reads them at its start (consecutive words).
_LOADED = ("MODE", "MEM_ADDR", "BUF_ADDR", "SIZE0", "SIZE1", "SIZE2") + tuple(
    f"MEM_STRIDE{k}" for k in range(RANK))


def _consecutive(names):
    first = DMA.address(names[0])
    if [DMA.address(n) - first for n in names] != list(range(len(names))):
        raise AssertionError(f"DMA registers {names} are not consecutive")
    return first


def _field(word, register, name):
    """Field ``name`` of ``register`` in ``word`` (a 32-bit value)."""
    f = register[name]
    return word[f.offset:f.offset + f.width]


class MicroDMA(wiring.Component):
    """Copies the elements of a rank-5 index space between system memory and the buffer or
    the kernel memory, exactly as ``npu_model.system`` does (``docs/micro.md``).

    At its start the unit reads ``MODE``, ``MEM_ADDR``, ``BUF_ADDR``, the sizes and the memory
    strides from the register file and checks mode, shape and alignment. It then walks the
    index space twice, one element a step, keeping a memory and an on-chip pointer: a dry
    pass checks every element against the window and the on-chip memory (the first element
    outside the window ends it with ``WINDOW``; one outside the on-chip memory gives
    ``BOUNDS`` unless a later one is outside the window), and the second pass copies. A
    step reads the strides it needs from the register file: moving on along ``i_k`` adds
    stride ``k`` to both pointers after walking the inner indices back to 0 by subtracting
    their strides one step at a time, so every pointer value is an element's address and
    the pointers are only as wide as an in-window address plus one stride.

    Parameters
    ----------
    config : NPUConfig
        Sizes of system memory (``mem_kib``), buffer (``buffer_kib``) and kernel memory
        (``kernel_kib``), and ``cores`` (the kernel memory ``MODE.core`` may name).

    Members
    -------
    start, done, error, reg_addr, reg_data, buf_* :
        The ports of every micro unit (:func:`npu.micro.unit.unit_members`).
    mem_addr : Out(mem_addr_bits)
        32-bit word address of system memory.
    mem_re : Out(1)
        Read ``mem_addr``; ``mem_rdata`` is valid the next cycle.
    mem_rdata : In(32)
    mem_wdata : Out(32)
    mem_we : Out(4)
        Byte lanes of ``mem_wdata`` written to ``mem_addr`` in this cycle.
    kmem_waddr : Out(10), kmem_wdata : Out(32), kmem_we : Out(1)
        Kernel-memory write port.
    base : In(32)
        ``BASE`` of the task's network window (32-bit words).
    limit : In(32)
        ``LIMIT`` of that window (32-bit words).
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"Configuration must be an NPUConfig, not {config!r}")
        self._config = config
        self._mem_words = config.mem_kib * 256
        self._buffer_elements = dataproc.buffer_elements(config)
        self._kernel_words = config.kernel_kib * 256
        if self._buffer_elements > 1 << BUF_ADDR_BITS:
            raise ValueError(f"The micro build's buffer holds at most {1 << BUF_ADDR_BITS} "
                             f"elements, not {self._buffer_elements} (buffer_kib "
                             f"{config.buffer_kib})")
        if self._kernel_words > 1 << KMEM_ADDR_BITS:
            raise ValueError(f"The micro build's kernel memory holds at most "
                             f"{1 << KMEM_ADDR_BITS} words, not {self._kernel_words} "
                             f"(kernel_kib {config.kernel_kib})")
        self.mem_addr_bits = max(1, (self._mem_words - 1).bit_length())
        super().__init__(unit_members() | {
            "mem_addr": Out(self.mem_addr_bits),
            "mem_re": Out(1),
            "mem_rdata": In(32),
            "mem_wdata": Out(32),
            "mem_we": Out(4),
            "kmem_waddr": Out(KMEM_ADDR_BITS),
            "kmem_wdata": Out(32),
            "kmem_we": Out(1),
            "base": In(32),
            "limit": In(32),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        t = self._task_registers(m)
        walk = self._walker(m, t)
        self._control(m, t, walk)
        return m

    # -- the task registers -----------------------------------------------------------------

    def _task_registers(self, m):
        """Read the task's registers at the start; their fields and the checks on them."""
        first = _consecutive(_LOADED)
        t = {
            "dir": Signal(2), "fmt": Signal(2), "core": Signal(6),
            "mem_addr": Signal(32), "buf_addr": Signal(DMA["BUF_ADDR"]["addr"].width),
            "sizes": Array(Signal(SIZE_BITS, name=f"n{k}") for k in range(RANK)),
            "align_bad": Signal(), "loading": Signal(), "loaded": Signal(),
        }
        # Register `step` is addressed in one cycle; its word is on reg_data in the next, when
        # `step` has moved on by one.
        step = Signal(range(len(_LOADED) + 2))
        m.d.comb += t["loaded"].eq(step == len(_LOADED) + 1)
        with m.If(t["loading"]):
            m.d.comb += self.reg_addr.eq(first + step)
            m.d.sync += step.eq(step + 1)
        with m.Else():
            m.d.sync += step.eq(0)

        data = self.reg_data
        mode = DMA["MODE"]
        size = Signal(3)
        m.d.comb += size.eq(Mux(t["fmt"] == DmaFormat.INT8, 1,
                                Mux(t["fmt"] == DmaFormat.HALF, 2, 4)))
        def got(name):
            return m.Case(_LOADED.index(name) + 1)

        with m.Switch(step):
            with got("MODE"):
                m.d.sync += [t[f].eq(_field(data, mode, f)) for f in ("dir", "fmt", "core")]
                m.d.sync += t["align_bad"].eq(0)
            with got("MEM_ADDR"):
                m.d.sync += t["mem_addr"].eq(data)
                with m.If((data[:2] & (size - 1)[:2]) != 0):
                    m.d.sync += t["align_bad"].eq(1)
            with got("BUF_ADDR"):
                m.d.sync += t["buf_addr"].eq(_field(data, DMA["BUF_ADDR"], "addr"))
            with got("SIZE0"):
                m.d.sync += [t["sizes"][k].eq(_field(data, DMA["SIZE0"], f"n{k}")) for k in (0, 1)]
            with got("SIZE1"):
                m.d.sync += [t["sizes"][k].eq(_field(data, DMA["SIZE1"], f"n{k}")) for k in (2, 3)]
            with got("SIZE2"):
                m.d.sync += t["sizes"][4].eq(_field(data, DMA["SIZE2"], "n4"))
            for k in range(RANK):
                with got(f"MEM_STRIDE{k}"):
                    with m.If((t["sizes"][k] > 1) & ((data[:2] & (size - 1)[:2]) != 0)):
                        m.d.sync += t["align_bad"].eq(1)

        # The checks of npu_spec.dma.dma_error before the walk, in its order.
        kmem = t["dir"] == DmaDir.MEM_TO_KMEM
        word = t["fmt"] == DmaFormat.WORD
        t["size"] = size
        t["kmem"] = kmem
        t["bad_mode"] = ((t["dir"] > DmaDir.MEM_TO_KMEM) | (t["fmt"] > DmaFormat.WORD)
                         | (word != kmem) | (kmem & (t["core"] >= self._config.cores)))
        t["bad_shape"] = Cat(*(n == 0 for n in t["sizes"])).any()
        return t

    # -- the index walk ---------------------------------------------------------------------

    def _walker(self, m, t):
        """Counters, pointers and the stride steps that move them."""
        w = {
            "i": Array(Signal(SIZE_BITS, name=f"i{k}") for k in range(RANK)),
            # A memory byte offset: in the window (< 2**34) plus or minus one stride.
            "pm": Signal(signed(36)),
            # An on-chip address: inside the memory (< 2**24) plus or minus one stride.
            "pb": Signal(signed(34)),
            "level": Signal(range(RANK)),    # the index a stride step moves
            "target": Signal(range(RANK)),   # the index moving on
            "sub": Signal(),                 # the step walks back (subtracts)
        }
        last = [w["i"][k] == t["sizes"][k] - 1 for k in range(RANK)]
        w["finished"] = Cat(*last).all()
        # The innermost index that is not at its last value moves on.
        w["next"] = Signal(range(RANK))
        for k in reversed(range(RANK)):
            with m.If(~last[k]):
                m.d.comb += w["next"].eq(k)

        limit_bytes = Signal(35)
        m.d.comb += limit_bytes.eq(self.limit << 2)
        onchip = Mux(t["kmem"], self._kernel_words, self._buffer_elements)
        w["out_of_window"] = (w["pm"] < 0) | (w["pm"] + t["size"] > limit_bytes)
        w["out_of_bounds"] = (w["pb"] < 0) | (w["pb"] >= onchip)

        word = Signal(34)
        m.d.comb += word.eq(self.base + w["pm"][2:34])
        w["bus_error"] = word >= self._mem_words
        m.d.comb += self.mem_addr.eq(word)
        return w

    # -- the control ------------------------------------------------------------------------

    def _control(self, m, t, w):
        code = Signal(4)
        real = Signal()          # the copying pass (else the checking pass)
        bounds_seen = Signal()
        i, pm, pb = w["i"], w["pm"], w["pb"]
        stride_mem = _consecutive([f"MEM_STRIDE{k}" for k in range(RANK)])
        stride_buf = _consecutive([f"BUF_STRIDE{k}" for k in range(RANK)])
        stride = self.reg_data.as_signed()

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "LOAD"

            with m.State("LOAD"):
                m.d.comb += t["loading"].eq(1)
                with m.If(t["loaded"]):
                    m.next = "CHECK"

            with m.State("CHECK"):
                m.d.sync += [real.eq(0), bounds_seen.eq(0)]
                with m.If(t["bad_mode"]):
                    m.d.sync += code.eq(DmaError.BAD_MODE)
                    m.next = "DONE"
                with m.Elif(t["bad_shape"]):
                    m.d.sync += code.eq(DmaError.BAD_SHAPE)
                    m.next = "DONE"
                with m.Elif(t["align_bad"]):
                    m.d.sync += code.eq(DmaError.ALIGN)
                    m.next = "DONE"
                with m.Else():
                    m.next = "FIRST"

            with m.State("FIRST"):
                m.d.sync += [pm.eq(t["mem_addr"]), pb.eq(t["buf_addr"])]
                m.d.sync += [i[k].eq(0) for k in range(RANK)]
                m.next = "ELEMENT"

            with m.State("ELEMENT"):
                self._element(m, t, w, real, bounds_seen, code)

            with m.State("WRITE"):
                self._write(m, t, w)
                m.next = "NEXT"

            with m.State("NEXT"):
                with m.If(w["finished"]):
                    with m.If(real):
                        m.d.sync += code.eq(DmaError.NONE)
                        m.next = "DONE"
                    with m.Elif(bounds_seen):
                        m.d.sync += code.eq(DmaError.BOUNDS)
                        m.next = "DONE"
                    with m.Else():
                        m.d.sync += real.eq(1)
                        m.next = "FIRST"
                with m.Else():
                    m.d.sync += [w["level"].eq(0), w["target"].eq(w["next"])]
                    m.next = "UNWIND"

            with m.State("UNWIND"):
                # Walk the inner indices back to 0, then move the target index on.
                with m.If(w["level"] == w["target"]):
                    m.d.sync += w["sub"].eq(0)
                    m.next = "STRIDE_MEM"
                with m.Elif(i[w["level"]] == 0):
                    m.d.sync += w["level"].eq(w["level"] + 1)
                with m.Else():
                    m.d.sync += w["sub"].eq(1)
                    m.next = "STRIDE_MEM"

            with m.State("STRIDE_MEM"):
                m.d.comb += self.reg_addr.eq(stride_mem + w["level"])
                m.next = "STRIDE_BUF"

            with m.State("STRIDE_BUF"):
                m.d.comb += self.reg_addr.eq(stride_buf + w["level"])
                m.d.sync += pm.eq(Mux(w["sub"], pm - stride, pm + stride))
                m.next = "STRIDE_APPLY"

            with m.State("STRIDE_APPLY"):
                m.d.sync += pb.eq(Mux(w["sub"], pb - stride, pb + stride))
                with m.If(w["sub"]):
                    m.d.sync += i[w["level"]].eq(i[w["level"]] - 1)
                    m.next = "UNWIND"
                with m.Else():
                    m.d.sync += i[w["level"]].eq(i[w["level"]] + 1)
                    m.next = "ELEMENT"

            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), self.error.eq(code)]
                m.next = "IDLE"

    def _element(self, m, t, w, real, bounds_seen, code):
        """One element: checked in the first pass, read in the second."""
        with m.If(~real):
            with m.If(w["out_of_window"]):
                m.d.sync += code.eq(DmaError.WINDOW)
                m.next = "DONE"
            with m.Else():
                with m.If(w["out_of_bounds"]):
                    m.d.sync += bounds_seen.eq(1)
                m.next = "NEXT"
        with m.Elif(w["bus_error"]):
            m.d.sync += code.eq(DmaError.BUS)
            m.next = "DONE"
        with m.Else():
            with m.If(t["dir"] == DmaDir.BUF_TO_MEM):
                m.d.comb += self.buf_addr.eq(w["pb"])
            with m.Else():
                m.d.comb += self.mem_re.eq(1)
            m.next = "WRITE"

    def _write(self, m, t, w):
        """The element read in ``ELEMENT`` is written to its destination."""
        pm, pb = w["pm"], w["pb"]
        byte = self.mem_rdata.word_select(pm[:2], 8)
        half = self.mem_rdata.word_select(pm[1], 16)
        with m.Switch(t["dir"]):
            with m.Case(DmaDir.MEM_TO_BUF):
                m.d.comb += [self.buf_addr.eq(pb), self.buf_we.eq(1),
                             self.buf_wdata.eq(Mux(t["fmt"] == DmaFormat.INT8,
                                                   byte.as_signed(), half))]
            with m.Case(DmaDir.MEM_TO_KMEM):
                m.d.comb += [self.kmem_waddr.eq(pb), self.kmem_we.eq(1),
                             self.kmem_wdata.eq(self.mem_rdata)]
            with m.Case(DmaDir.BUF_TO_MEM):
                low = self.buf_rdata[:8]
                with m.If(t["fmt"] == DmaFormat.INT8):
                    m.d.comb += [self.mem_wdata.eq(Cat(low, low, low, low)),
                                 self.mem_we.eq(Const(1, 4) << pm[:2])]
                with m.Else():
                    m.d.comb += [self.mem_wdata.eq(Cat(self.buf_rdata, self.buf_rdata)),
                                 self.mem_we.eq(Mux(pm[1], 0b1100, 0b0011))]

"""The micro DMA unit: the DMA engine's transfers (``npu_spec.dma``), one element at a time."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc
from npu_spec.config import NPUConfig
from npu_spec.dma import DMA, RANK, SIZE_BITS, DmaDir, DmaError, DmaFormat
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.taskman import address_bits

from .unit import BUF_ADDR_BITS, KMEM_ADDR_BITS, unit_members

__all__ = ["MicroDMA"]

#: The task registers in the order the unit reads them at its start (consecutive words).
_LOADED = ("MODE", "MEM_ADDR", "BUF_ADDR", "SIZE0", "SIZE1", "SIZE2") + tuple(
    f"MEM_STRIDE{k}" for k in range(RANK))


#: The register holding size ``n_k``.
_SIZE_WORD = ("SIZE0", "SIZE0", "SIZE1", "SIZE1", "SIZE2")


def _consecutive(names):
    first = DMA.address(names[0])
    if [DMA.address(n) - first for n in names] != list(range(len(names))):
        raise AssertionError(f"DMA registers {names} are not consecutive")
    return first


def _at_least(value, bound):
    """``value >= bound`` for a non-negative ``value`` and a constant ``bound``; a bound that
    is a power of two needs no comparator."""
    if bound & (bound - 1) == 0:
        bits = bound.bit_length() - 1
        return value.as_unsigned()[bits:] != 0
    return value >= bound


def _step(pointer, b, carry):
    """``(low, far)`` of ``pointer + b + carry`` (``pointer`` unsigned; ``b`` a signed 32-bit
    value): the low bits, and whether
    the sum lies outside ``[0, 2**len(pointer))``. The sum's high part is ``b``'s high bits
    plus the carry out of the low ones: zero when those bits are all 0 and no carry comes, or
    all 1 and one does, so only the low bits need an adder."""
    bits = len(pointer)
    total = _add(Cat(pointer, Const(0, 1)), Cat(b[:bits], Const(0, 1)), carry)
    high = b[bits:]
    inside = Mux(total[bits], high.all(), ~high.any())
    return total[:bits], ~inside


def _add(a, b, carry):
    """``a + b + carry`` modulo ``2**len(a)`` (``b`` signed and not wider than ``a``,
    ``carry`` one bit) with a single adder: the carry enters below the lowest bit, as a pair
    of bits that generate it."""
    b = Cat(b, b[-1].replicate(len(a) - len(b)))
    total = Cat(Const(1, 1), a) + Cat(carry, b)
    return total[1:len(a) + 1]


#: Word offsets inside the DMA engine's window (its size, a power of two; the window is aligned).
_WINDOW_BITS = (ADDRESS_WINDOWS["DMA"][1] - 1).bit_length()
if DMA.base % (1 << _WINDOW_BITS):
    raise AssertionError("the DMA window is not aligned to its size")


#: Window offset of the word holding index ``i_0``'s down counter (``i_k``'s at ``+ k``): words
#: of the DMA window that no register uses, kept by the register file, and written by this unit
#: only (a descriptor's write there is overwritten before it is read).
_COUNTERS = 0x18
if any(_COUNTERS <= DMA.address(r.name) - DMA.base < _COUNTERS + RANK for r in DMA):
    raise AssertionError("the DMA unit's counter words overlap a DMA register")


def _register(offset):
    """The register word at ``offset`` inside the DMA window (no adder for the base)."""
    low = Cat(offset, Const(0, _WINDOW_BITS))[:_WINDOW_BITS]
    return Cat(low, Const(DMA.base >> _WINDOW_BITS, 16 - _WINDOW_BITS))


def _field(word, register, name):
    """Field ``name`` of ``register`` in ``word`` (a 32-bit value)."""
    f = register[name]
    return word[f.offset:f.offset + f.width]


class MicroDMA(wiring.Component):
    """Copies the elements of a rank-5 index space between system memory and the buffer or
    the kernel memory, exactly as ``npu_model.system`` does (``docs/micro.md``, "The DMA
    unit").

    At its start the unit reads ``MODE``, ``MEM_ADDR``, ``BUF_ADDR``, the sizes and the memory
    strides from the register file and checks mode, shape and alignment. It then walks the
    index space twice, one element a step, with a memory and an on-chip pointer: a checking
    pass (the first element outside the window ends it with ``WINDOW``; one outside the
    on-chip memory gives ``BOUNDS`` unless a later one is outside the window), then the
    copying pass. Each index ``i_k`` has a down counter in a register-file word the unit
    writes (``reg_w_*``; here only a flag for its last value and one for its first); moving on
    along ``i_k`` walks every
    inner index back to 0 by subtracting its stride one step at a time, then adds stride
    ``k``; the strides and the sizes are read from the register file when a step needs them.
    Every pointer value is so an element's address, and a pointer is only as wide as an
    in-window address plus one stride.

    Parameters
    ----------
    config : NPUConfig
        Sizes of system memory (``mem_kib``), buffer (``buffer_kib``) and kernel memory
        (``kernel_kib``), ``cores`` (the kernel memory ``MODE.core`` may name), and the width
        of the window's ``BASE`` and ``LIMIT`` (``npu_spec.taskman.address_bits``).

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
    reg_w_addr : Out(16), reg_w_data : Out(16), reg_w_en : Out(1)
        Register-file write port for the index counters (words ``0x5018``..``0x501C`` of
        the DMA window, which no register uses).
    base : In(address_bits)
        ``BASE`` of the task's network window (32-bit words).
    limit : In(address_bits)
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
        self.address_bits = address_bits(config)
        super().__init__(unit_members() | {
            "mem_addr": Out(self.mem_addr_bits),
            "mem_re": Out(1),
            "mem_rdata": In(32),
            "mem_wdata": Out(32),
            "mem_we": Out(4),
            "kmem_waddr": Out(KMEM_ADDR_BITS),
            "kmem_wdata": Out(32),
            "kmem_we": Out(1),
            "reg_w_addr": Out(16),
            "reg_w_data": Out(SIZE_BITS),
            "reg_w_en": Out(1),
            "base": In(self.address_bits),
            "limit": In(self.address_bits),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        w = {
            # The down counters c_k = n_k - i_k sit in register-file words (_COUNTERS + k);
            # here only whether c_k == 1 (i_k at its last value) and whether c_k == n_k
            # (i_k == 0: `fresh`, the counter word not written since).
            "last": Signal(RANK),
            "fresh": Signal(RANK),
            "zero": Signal(),     # a size is 0
            # A memory byte offset, exact while it is inside [0, 2**(address_bits + 2)) (every
            # in-window offset), else `pm_far`: MEM_ADDR, or an in-window offset plus or minus
            # one 32-bit stride; the checking pass ends at the first offset outside the window.
            "pm": Signal(self.address_bits + 2),
            "pm_far": Signal(),
            # An on-chip address, exact while it is inside [0, 2**BUF_ADDR_BITS), else `pb_far`;
            # once one is outside the on-chip memory, the checking pass's later on-chip
            # addresses no longer matter (the task ends with BOUNDS or WINDOW).
            "pb": Signal(BUF_ADDR_BITS),
            "pb_far": Signal(),
        }
        t = self._task_registers(m, w)
        self._checks(m, t, w)
        self._data(m, t, w)
        self._control(m, t, w)
        return m

    # -- the task registers -----------------------------------------------------------------

    def _task_registers(self, m, w):
        """Read the task's registers (at the start of each pass): the mode fields, the
        pointers' starts, the counters, and the checks on them."""
        first = _consecutive(_LOADED)
        t = {"dir": Signal(2), "fmt": Signal(2), "core": Signal(6),
             "align_bad": Signal(), "loading": Signal(), "loaded": Signal()}
        # Register `step` is addressed in one cycle; its word is on reg_data in the next, when
        # `step` has moved on by one.
        step = Signal(range(len(_LOADED) + 2))
        m.d.comb += t["loaded"].eq(step == len(_LOADED) + 1)
        with m.If(t["loading"]):
            m.d.comb += self.reg_addr.eq(_register(first - DMA.base + step))
            m.d.sync += step.eq(step + 1)
        with m.Else():
            m.d.sync += step.eq(0)

        data = self.reg_data
        mode = DMA["MODE"]
        size = Signal(3)
        m.d.comb += size.eq(Mux(t["fmt"] == DmaFormat.INT8, 1,
                                Mux(t["fmt"] == DmaFormat.HALF, 2, 4)))
        misaligned = (data[:2] & (size - 1)[:2]) != 0

        def got(name):
            return m.Case(_LOADED.index(name) + 1)

        with m.Switch(step):
            with got("MODE"):
                m.d.sync += [t[f].eq(_field(data, mode, f)) for f in ("dir", "fmt", "core")]
                m.d.sync += [t["align_bad"].eq(0), w["zero"].eq(0),
                             w["fresh"].eq((1 << RANK) - 1)]
            with got("MEM_ADDR"):
                m.d.sync += [w["pm"].eq(data), w["pm_far"].eq(data[len(w["pm"]):] != 0)]
                with m.If(misaligned):
                    m.d.sync += t["align_bad"].eq(1)
            with got("BUF_ADDR"):
                addr = _field(data, DMA["BUF_ADDR"], "addr")
                m.d.sync += [w["pb"].eq(addr), w["pb_far"].eq(addr[len(w["pb"]):] != 0)]
            for name in dict.fromkeys(_SIZE_WORD):
                with got(name):
                    ks = [k for k in range(RANK) if _SIZE_WORD[k] == name]
                    n = {k: _field(data, DMA[name], f"n{k}") for k in ks}
                    m.d.sync += [w["last"][k].eq(n[k] == 1) for k in ks]
                    with m.If(Cat(*(n[k] == 0 for k in ks)).any()):
                        m.d.sync += w["zero"].eq(1)
            # A stride matters when its size is above 1 (a size of 0 fails the shape check,
            # which comes first).
            for k in range(RANK):
                with got(f"MEM_STRIDE{k}"):
                    with m.If(~w["last"][k] & misaligned):
                        m.d.sync += t["align_bad"].eq(1)
        t["size"] = size
        return t

    def _checks(self, m, t, w):
        """The checks of ``npu_spec.dma.dma_error`` (combinational)."""
        kmem = t["dir"] == DmaDir.MEM_TO_KMEM
        word = t["fmt"] == DmaFormat.WORD
        t["kmem"] = kmem
        t["bad_mode"] = ((t["dir"] > DmaDir.MEM_TO_KMEM) | (t["fmt"] > DmaFormat.WORD)
                         | (word != kmem) | (kmem & (t["core"] >= self._config.cores)))
        t["bad_shape"] = w["zero"]
        pm, pb = w["pm"], w["pb"]
        # An aligned element lies inside the window when its first byte does (the window is
        # whole words).
        a = self.address_bits
        w["out_of_window"] = w["pm_far"] | (pm[2:2 + a] >= self.limit)
        w["out_of_bounds"] = w["pb_far"] | Mux(kmem, _at_least(pb, self._kernel_words),
                                               _at_least(pb, self._buffer_elements))
        # The element's word address, registered: `pm` is set at least a cycle before the
        # element's state (LOAD then CHECK, or STRIDE_BUF then STRIDE_APPLY), so the adder is
        # off the path from the bus check into the memory's enables.
        address = Signal(self.address_bits + 1)
        m.d.sync += address.eq(self.base + pm[2:2 + self.address_bits])
        w["bus_error"] = _at_least(address, self._mem_words)
        m.d.comb += self.mem_addr.eq(address)
        last = w["last"]
        w["finished"] = last.all()
        # The innermost index that is not at its last value moves on.
        w["next"] = Signal(range(RANK))
        for k in reversed(range(RANK)):
            with m.If(~last[k]):
                m.d.comb += w["next"].eq(k)

    # -- the control ------------------------------------------------------------------------

    def _control(self, m, t, w):
        code = Signal(4)
        real = Signal()          # the copying pass (else the checking pass)
        bounds_seen = Signal()
        level = Signal(range(RANK))       # the index a step moves
        target = Signal(range(RANK))      # the index moving on
        sub = Signal()                    # the step walks back
        pm, pb = w["pm"], w["pb"]
        stride_mem = _consecutive([f"MEM_STRIDE{k}" for k in range(RANK)])
        stride_buf = _consecutive([f"BUF_STRIDE{k}" for k in range(RANK)])
        # The counter of the index moving on (its size while `fresh`), less one.
        was_fresh = Signal()
        counter = Signal(SIZE_BITS)
        counted = Signal(SIZE_BITS)
        with m.If(was_fresh):
            with m.Switch(level):
                for k in range(RANK):
                    with m.Case(k):
                        m.d.comb += counter.eq(_field(self.reg_data, DMA[_SIZE_WORD[k]],
                                                      f"n{k}"))
        with m.Else():
            m.d.comb += counter.eq(self.reg_data[:SIZE_BITS])
        m.d.comb += counted.eq(counter - 1)
        # One adder a pointer: +stride, or -stride as ~stride + 1.
        stride = Signal(signed(32))
        m.d.comb += stride.eq(self.reg_data ^ sub.replicate(32))

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += real.eq(0)
                with m.If(self.start):
                    m.next = "LOAD"

            with m.State("LOAD"):
                m.d.comb += t["loading"].eq(1)
                with m.If(t["loaded"]):
                    m.next = "CHECK"

            with m.State("CHECK"):
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
                    m.d.sync += bounds_seen.eq(bounds_seen & real)
                    m.next = "ELEMENT"

            with m.State("ELEMENT"):
                self._element(m, t, w, real, bounds_seen, code)

            with m.State("WRITE"):
                self._write(m, t, w)
                m.next = "NEXT"

            with m.State("NEXT"):
                m.d.sync += [level.eq(0), target.eq(w["next"])]
                with m.If(~w["finished"]):
                    m.next = "UNWIND"
                with m.Elif(real):
                    m.d.sync += code.eq(DmaError.NONE)
                    m.next = "DONE"
                with m.Elif(bounds_seen):
                    m.d.sync += code.eq(DmaError.BOUNDS)
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += real.eq(1)
                    m.next = "LOAD"

            with m.State("UNWIND"):
                # Walk the inner indices back to 0 (`sub`: counting the steps left in the
                # index's counter, from its size), then move the target index on.
                with m.If(level == target):
                    m.d.sync += sub.eq(0)
                with m.Else():
                    m.d.sync += [sub.eq(1), w["fresh"].bit_select(level, 1).eq(1)]
                m.next = "COUNT"

            with m.State("STRIDE_MEM"):
                m.d.comb += self.reg_addr.eq(_register(stride_mem - DMA.base + level))
                m.next = "STRIDE_BUF"

            with m.State("STRIDE_BUF"):
                m.d.comb += self.reg_addr.eq(_register(stride_buf - DMA.base + level))
                low, far = _step(pm, stride, sub)
                m.d.sync += [pm.eq(low), w["pm_far"].eq(far)]
                m.next = "STRIDE_APPLY"

            with m.State("STRIDE_APPLY"):
                low, far = _step(pb, stride, sub)
                m.d.sync += [pb.eq(low), w["pb_far"].eq(far)]
                with m.If(sub):
                    m.next = "COUNT"
                with m.Else():
                    m.next = "ELEMENT"

            with m.State("COUNT"):
                # Read the counter of the index moving on (its size while it is fresh).
                with m.If(w["fresh"].bit_select(level, 1)):
                    with m.Switch(level):
                        for k in range(RANK):
                            with m.Case(k):
                                m.d.comb += self.reg_addr.eq(DMA.address(_SIZE_WORD[k]))
                with m.Else():
                    m.d.comb += self.reg_addr.eq(_register(_COUNTERS + level))
                m.d.sync += was_fresh.eq(w["fresh"].bit_select(level, 1))
                m.next = "COUNT_GOT"

            with m.State("COUNT_GOT"):
                fresh, last = w["fresh"].bit_select(level, 1), w["last"].bit_select(level, 1)
                # (counter == 1 and == 2 for counted == 0 and == 1: no subtraction on the
                # path from the register file's word into the next state)
                with m.If(sub & (counter == 1)):
                    # Walked back: i_level is 0 again (fresh), its last value if its size
                    # is 1 (no step was made).
                    m.d.sync += [fresh.eq(1), last.eq(was_fresh), level.eq(level + 1)]
                    m.next = "UNWIND"
                with m.Else():
                    m.d.comb += [self.reg_w_addr.eq(_register(_COUNTERS + level)),
                                 self.reg_w_data.eq(counted), self.reg_w_en.eq(1)]
                    m.d.sync += fresh.eq(0)
                    with m.If(~sub):
                        m.d.sync += last.eq(counter == 2)
                    m.next = "STRIDE_MEM"

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
            with m.If(t["dir"] != DmaDir.BUF_TO_MEM):
                m.d.comb += self.mem_re.eq(1)
            m.next = "WRITE"

    def _data(self, m, t, w):
        """Addresses and data of every access (the enables say which is made)."""
        pm, pb = w["pm"], w["pb"]
        byte = self.mem_rdata.word_select(pm[:2], 8)
        half = self.mem_rdata.word_select(pm[1], 16)
        int8 = t["fmt"] == DmaFormat.INT8
        low, high = self.buf_rdata[:8], self.buf_rdata[8:]
        odd = Mux(int8, low, high)
        m.d.comb += [self.buf_addr.eq(pb), self.kmem_waddr.eq(pb),
                     self.buf_wdata.eq(Mux(int8, byte.as_signed(), half)),
                     self.kmem_wdata.eq(self.mem_rdata),
                     self.mem_wdata.eq(Cat(low, odd, low, odd))]

    def _write(self, m, t, w):
        """The element read in ``ELEMENT`` is written to its destination."""
        pm = w["pm"]
        with m.Switch(t["dir"]):
            with m.Case(DmaDir.MEM_TO_BUF):
                m.d.comb += self.buf_we.eq(1)
            with m.Case(DmaDir.MEM_TO_KMEM):
                m.d.comb += self.kmem_we.eq(1)
            with m.Case(DmaDir.BUF_TO_MEM):
                with m.If(t["fmt"] == DmaFormat.INT8):
                    m.d.comb += self.mem_we.eq(Const(1, 4) << pm[:2])
                with m.Else():
                    m.d.comb += self.mem_we.eq(Mux(pm[1], 0b1100, 0b0011))

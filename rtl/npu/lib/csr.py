"""The CSR bus and the register file generated from a :class:`~npu_spec.regmap.RegisterMap`.

Bus protocol
------------
The CSR bus is a single-cycle, no-wait-state bus with word addresses (see :mod:`npu_spec.regmap`):

* **Write**: the initiator holds ``w_en`` high for one cycle with ``addr`` and ``w_data``. The
  register takes the new value at the end of that cycle; from the next cycle the hardware sees it
  and the register's ``written`` strobe is high for that one cycle.
* **Read**: the initiator holds ``r_en`` high for one cycle with ``addr``; ``r_data`` carries the
  word in the next cycle. In every other cycle ``r_data`` is 0, so the read data of several
  targets can be ORed together.
* **Error**: an access (read or write) to an address with no register makes ``error`` high for
  one cycle, the cycle after the access; such a read returns 0 and such a write changes nothing.
* Every access completes in one cycle: there is no handshake, so no address can hang the bus.
* A read and a write in the same cycle are allowed; the read returns the value before the write.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.regmap import DATA_WIDTH, Register, RegisterMap

__all__ = ["READ_PATHS", "CSRDecoder", "CSRSignature", "RegisterFile", "register_layout",
           "register_signature"]

#: How a :class:`RegisterFile` answers reads of its ``rw`` fields: ``"logic"`` (a multiplexer
#: over the registers' flip-flops) or ``"memory"`` (a copy of every write in a small memory).
READ_PATHS = ("logic", "memory")


class CSRSignature(wiring.Signature):
    """Signature of the CSR bus, from the initiator's (host's) side.

    Parameters
    ----------
    addr_width : int
        Width of the word address.

    Members
    -------
    addr : Out(addr_width)
        Word address of the access.
    w_en : Out(1)
        Write strobe: write ``w_data`` to ``addr`` in this cycle.
    w_data : Out(32)
        Write data.
    r_en : Out(1)
        Read strobe: read ``addr`` in this cycle.
    r_data : In(32)
        Read data, valid in the cycle after ``r_en``; 0 in every other cycle.
    error : In(1)
        One-cycle strobe in the cycle after an access to an unmapped address.
    """

    def __init__(self, addr_width):
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or addr_width < 1:
            raise TypeError(f"Address width must be a positive integer, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({
            "addr":   Out(addr_width),
            "w_en":   Out(1),
            "w_data": Out(DATA_WIDTH),
            "r_en":   Out(1),
            "r_data": In(DATA_WIDTH),
            "error":  In(1),
        })

    @property
    def addr_width(self):
        return self._addr_width

    def __eq__(self, other):
        return type(other) is type(self) and other.addr_width == self.addr_width

    def __hash__(self):
        return hash((type(self), self._addr_width))

    def __repr__(self):
        return f"CSRSignature({self._addr_width})"


def register_layout(register):
    """The 32-bit word of ``register`` as a :class:`data.FlexibleLayout`.

    Every field is a member at its bit offset, so ``View(register_layout(reg), word).field`` is
    the field's bits of ``word``. (A :class:`data.FlexibleLayout` rather than a
    :class:`data.StructLayout` because fields sit at declared offsets with reserved gaps between
    them, which a struct could only express with dummy padding members.)
    """
    if not isinstance(register, Register):
        raise TypeError(f"Register must be a Register, not {register!r}")
    return data.FlexibleLayout(DATA_WIDTH, {
        f.name: data.Field(unsigned(f.width), f.offset) for f in register.fields
    })


def register_signature(register):
    """Signature of the hardware side of ``register``, from the register file's side.

    Members are derived from the fields, each of shape ``unsigned(width)`` (a field with an enum
    compares directly with the enum's members, which are ``int``):

    * ``rw`` field ``f``: ``Out`` ``f``, the current value.
    * ``ro`` field ``f``: ``In`` ``f``, driven by the hardware (its initial value is the field's
      reset value, so an undriven constant field reads back as declared).
    * ``w1c`` field ``f``: ``Out`` ``f``, the sticky value, and ``In`` ``f_set``, a pulse that sets
      bits (set wins over a clear in the same cycle).
    * ``wo`` field ``f``: ``Out`` ``f``, the written value for one cycle after a write, 0 otherwise.
    * ``written``: ``Out(1)``, high for the one cycle after a bus write to the register (only if
      the register has a writable field).

    A hardware block that consumes the register uses ``In(register_signature(reg))`` (the
    flipped view) and is joined with :func:`wiring.connect`.
    """
    if not isinstance(register, Register):
        raise TypeError(f"Register must be a Register, not {register!r}")
    members = {}

    def add(name, member):
        if name in members:
            raise ValueError(f"Register {register.name!r}: port name {name!r} is used twice "
                             f"(field names may not be 'written' or end in '_set' when that "
                             f"clashes with a w1c field)")
        members[name] = member

    for f in register.fields:
        shape = unsigned(f.width)
        if f.access == "rw":
            add(f.name, Out(shape, init=f.reset))
        elif f.access == "ro":
            add(f.name, In(shape, init=f.reset or 0))
        elif f.access == "w1c":
            add(f.name, Out(shape, init=f.reset))
            add(f"{f.name}_set", In(shape))
        else:  # "wo"
            add(f.name, Out(shape))
    if register.write_mask:
        add("written", Out(1))
    return wiring.Signature(members)


def _rw_mask(register):
    """The bits of the ``rw`` fields of ``register``."""
    return sum(((1 << f.width) - 1) << f.offset for f in register.fields if f.access == "rw")


class RegisterFile(wiring.Component):
    """The registers of one :class:`~npu_spec.regmap.RegisterMap`, on a CSR bus.

    The bus decodes the map's word offsets (``addr`` is the offset within the map; an
    interconnect in front of it strips the map's base). Timing is described in :mod:`npu.lib.csr`.
    Per access type:

    * ``rw``: reads return the stored value, writes replace it.
    * ``ro``: reads return the hardware input, sampled in the cycle of ``r_en``; writes are
      ignored (no error: the address is mapped).
    * ``w1c``: a ``<field>_set`` pulse sets bits; writing 1 to a bit clears it; if both happen in
      the same cycle the bit stays set (**set wins**, so no event is lost).
    * ``wo``: a write drives the written value on the output for exactly one cycle; reads
      return 0.

    Reserved bits read as 0. Reads have no side effects.

    Parameters
    ----------
    regmap : RegisterMap
        The register map.
    addr_width : int or None
        Width of the bus address; at least enough for the map's highest offset. ``None`` (the
        default) uses exactly that.
    read_path : str
        ``"logic"`` (the default): reads select the registers' flip-flops through a
        multiplexer. ``"memory"``: every write to a register with ``rw`` fields is also stored
        (its ``rw`` bits only) in a memory of one word per such register, and reads of ``rw``
        fields come from that memory (asynchronous read: LUT RAM on the ECP5), so the
        multiplexer covers only the ``ro`` and ``w1c`` fields. A register not written since
        reset reads its reset value (one flag per register). The bus timing and every value
        read are the same either way; the hardware side still sees the flip-flops.

    Members
    -------
    bus : In(CSRSignature(addr_width))
        The CSR bus.
    <register> : Out(register_signature(register))
        One port per register, named after the register in lower case (``IRQ_STATUS`` becomes
        ``irq_status``). Its members are named after the fields, so the hardware reads and drives
        ``regfile.<register>.<field>`` (plus ``<field>_set`` for ``w1c`` fields and the
        ``written`` strobe); see :func:`register_signature`. In generated Verilog the ports are
        ``<register>__<field>``, e.g. ``irq_status__bus_read_error_set``.
    """

    def __init__(self, regmap, *, addr_width=None, read_path="logic"):
        if read_path not in READ_PATHS:
            raise ValueError(f"read path must be one of {', '.join(READ_PATHS)}, "
                             f"not {read_path!r}")
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"Register map must be a RegisterMap, not {regmap!r}")
        need = max(1, (regmap.size - 1).bit_length())
        if addr_width is None:
            addr_width = need
        elif not isinstance(addr_width, int) or isinstance(addr_width, bool):
            raise TypeError(f"Address width must be an integer, not {addr_width!r}")
        elif addr_width < need:
            raise ValueError(f"Address width must be at least {need} for map {regmap.name!r} "
                             f"({regmap.size} words), not {addr_width!r}")
        self._regmap = regmap
        self._addr_width = addr_width
        self._read_path = read_path

        members = {"bus": In(CSRSignature(addr_width))}
        for reg in regmap.registers:
            port = reg.name.lower()
            if port in members or port == "signature" or hasattr(self, port):
                raise ValueError(f"Register {reg.name!r} of map {regmap.name!r} would give the "
                                 f"port name {port!r}, which is reserved")
            members[port] = Out(register_signature(reg))
        super().__init__(members)

    @property
    def regmap(self):
        return self._regmap

    @property
    def addr_width(self):
        return self._addr_width

    @property
    def read_path(self):
        return self._read_path

    def port(self, name):
        """The hardware-side interface of the register called ``name`` (e.g. ``"IRQ_STATUS"``)."""
        return getattr(self, self._regmap[name].name.lower())

    def elaborate(self, platform):
        m = Module()
        bus = self.bus

        # Write data seen through each register's layout.
        w_data = {reg.name: data.View(register_layout(reg), bus.w_data)
                  for reg in self._regmap.registers}

        # Address decode (combinational): one write-hit line per register.
        w_hit = {}
        for reg in self._regmap.registers:
            hit = Signal(name=f"w_hit_{reg.name.lower()}")
            m.d.comb += hit.eq(bus.w_en & (bus.addr == reg.offset))
            w_hit[reg.name] = hit

        # Register state and hardware-side outputs.
        for reg in self._regmap.registers:
            port = self.port(reg.name)
            hit = w_hit[reg.name]
            value = w_data[reg.name]
            if reg.write_mask:
                m.d.sync += port.written.eq(hit)
            for f in reg.fields:
                out = getattr(port, f.name)
                if f.access == "rw":
                    with m.If(hit):
                        m.d.sync += out.eq(getattr(value, f.name))
                elif f.access == "w1c":
                    clear = Signal(f.width, name=f"clear_{reg.name.lower()}_{f.name}")
                    m.d.comb += clear.eq(0)
                    with m.If(hit):
                        m.d.comb += clear.eq(getattr(value, f.name))
                    m.d.sync += out.eq((out & ~clear) | getattr(port, f"{f.name}_set"))
                elif f.access == "wo":
                    m.d.sync += out.eq(0)
                    with m.If(hit):
                        m.d.sync += out.eq(getattr(value, f.name))

        # Read words (combinational): readable fields at their offsets, everything else 0
        # (with the memory read path, the rw fields come from the memory instead).
        memory = self._read_path == "memory"
        from_logic = ("ro", "w1c") if memory else ("rw", "ro", "w1c")
        if memory and any(_rw_mask(reg) for reg in self._regmap.registers):
            stored = self._stored_word(m)
        r_word = {}
        for reg in self._regmap.registers:
            port = self.port(reg.name)
            word = Signal(register_layout(reg), name=f"r_word_{reg.name.lower()}")
            for f in reg.fields:
                if f.access in from_logic:
                    m.d.comb += getattr(word, f.name).eq(getattr(port, f.name))
            r_word[reg.name] = word.as_value()
            if memory and _rw_mask(reg):
                r_word[reg.name] = r_word[reg.name] | stored

        # Read data and error strobe, registered: valid in the cycle after the access.
        m.d.sync += [bus.r_data.eq(0), bus.error.eq(0)]
        with m.Switch(bus.addr):
            for reg in self._regmap.registers:
                with m.Case(reg.offset):
                    with m.If(bus.r_en):
                        m.d.sync += bus.r_data.eq(r_word[reg.name])
            with m.Default():
                with m.If(bus.r_en | bus.w_en):
                    m.d.sync += bus.error.eq(1)

        return m

    def _stored_word(self, m):
        """The memory read path: the rw bits of the register at ``bus.addr``, from a memory
        that takes every write (combinational; valid when that register has rw fields)."""
        bus = self.bus
        regs = [reg for reg in self._regmap.registers if _rw_mask(reg)]

        # One select line per register; from them the register's index in the memory, its rw
        # bits (a write stores only those), whether it is still fresh and its reset value,
        # each an OR of the select lines (shallow, for timing).
        sel = Signal(len(regs))
        m.d.comb += [sel[i].eq(bus.addr == reg.offset) for i, reg in enumerate(regs)]

        def any_of(name, indices):
            out = Signal(name=name)
            m.d.comb += out.eq(Cat(sel[i] for i in indices).any() if indices else 0)
            return out

        n = len(regs)
        index = Cat(any_of(f"index{b}", [i for i in range(n) if i >> b & 1])
                    for b in range(max(1, (n - 1).bit_length())))
        mask = Cat(any_of(f"rw_bit{b}", [i for i, reg in enumerate(regs)
                                         if _rw_mask(reg) >> b & 1])
                   for b in range(DATA_WIDTH))
        resets = Cat(any_of(f"reset_bit{b}", [i for i, reg in enumerate(regs)
                                              if (reg.reset & _rw_mask(reg)) >> b & 1])
                     for b in range(DATA_WIDTH))
        m.submodules.stored = mem = Memory(shape=DATA_WIDTH, depth=n, init=[])
        wp = mem.write_port()
        rp = mem.read_port(domain="comb")
        m.d.comb += [wp.addr.eq(index), wp.data.eq(bus.w_data & mask),
                     wp.en.eq(bus.w_en & sel.any()), rp.addr.eq(index)]

        # A register not written since reset reads its reset value.
        fresh = Signal(n, init=(1 << n) - 1)
        with m.If(bus.w_en):
            m.d.sync += fresh.eq(fresh & ~sel)
        stored = Signal(DATA_WIDTH)
        m.d.comb += stored.eq(Mux((fresh & sel).any(), resets, rp.data))
        return stored


class CSRDecoder(wiring.Component):
    """One CSR bus onto several targets, each at a window of word addresses.

    The windows come from the register maps (``npu_spec.registers.ADDRESS_WINDOWS``, or each
    map's ``(base, size)``). An access inside a window goes to that window's target with the
    window's start subtracted; the read data of all targets are ORed (each answers 0 unless it
    was read); an access outside every window gets the error strobe in the next cycle, like an
    unmapped register.

    Parameters
    ----------
    windows : dict of str to (int, int)
        ``{name: (start, size)}``; windows must not overlap.
    addr_width : int
        Width of the initiator's word address.

    Members
    -------
    bus : In(CSRSignature(addr_width))
        The initiator.
    <name> : Out(CSRSignature(ceil_log2(size)))
        One target bus per window.
    """

    def __init__(self, windows, addr_width):
        windows = dict(windows)
        if not windows:
            raise ValueError("a CSR decoder needs at least one window")
        spans = sorted((start, start + size, name) for name, (start, size) in windows.items())
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise ValueError(f"windows {n0} and {n1} overlap")
        for name, (start, size) in windows.items():
            if not name.isidentifier() or name in ("bus", "signature"):
                raise ValueError(f"window name must be an identifier other than 'bus', "
                                 f"not {name!r}")
            if size < 1 or start < 0 or start + size > (1 << addr_width):
                raise ValueError(f"window {name} ({start:#x}, {size:#x}) does not fit a "
                                 f"{addr_width}-bit address")
        self._windows = windows
        members = {"bus": In(CSRSignature(addr_width))}
        for name, (start, size) in windows.items():
            members[name.lower()] = Out(CSRSignature(max(1, (size - 1).bit_length())))
        super().__init__(members)

    @property
    def windows(self):
        return dict(self._windows)

    def target(self, name):
        """The bus of window ``name``."""
        return getattr(self, name.lower())

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        hits = []
        r_data = 0
        error = 0
        for name, (start, size) in self._windows.items():
            target = self.target(name)
            hit = Signal(name=f"hit_{name.lower()}")
            m.d.comb += [
                hit.eq((bus.addr >= start) & (bus.addr < start + size)),
                target.addr.eq(bus.addr - start),
                target.w_data.eq(bus.w_data),
                target.w_en.eq(bus.w_en & hit),
                target.r_en.eq(bus.r_en & hit),
            ]
            hits.append(hit)
            r_data = r_data | target.r_data
            error = error | target.error
        missed = Signal()
        m.d.sync += missed.eq((bus.r_en | bus.w_en) & ~Cat(*hits).any())
        m.d.comb += [bus.r_data.eq(r_data), bus.error.eq(error | missed)]
        return m

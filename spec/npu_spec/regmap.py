"""Register maps declared once, in plain Python.

A register map is declared with :class:`Field`, :class:`Register` and :class:`RegisterMap`.
Three things are derived from that one declaration:

1. the register file in RTL (:class:`npu.lib.csr.RegisterFile`, the only part that needs Amaranth),
2. the encoder the compiler uses to turn field values into register writes
   (:meth:`RegisterMap.encode`, :meth:`RegisterMap.encode_block`) and the matching decoder,
3. the Markdown reference in ``docs/registers.md`` (:meth:`RegisterMap.to_markdown`,
   :func:`document`).

This module never imports Amaranth (nor numpy): the compiler and the golden model use it.

Conventions
-----------
* Registers are :data:`DATA_WIDTH` (32) bits wide.
* Addresses are **word addresses** (register indices), not byte addresses: register ``n`` of a
  map sits at word address ``base + n``. The CSR bus (:mod:`npu.lib.csr`) and the task descriptors
  (entries of register address, count and data words) both use word addresses.
* Register names are ``UPPER_SNAKE_CASE``; field names are ``lower_snake_case``. The RTL derives
  its port names from them (``REG_NAME`` becomes ``regfile.reg_name``).
* Bits not covered by a field are reserved: they read as 0 and writes to them are ignored. The
  encoder always writes 0 to them; the strict decoder rejects a word with reserved bits set.

Access types (:data:`ACCESS`)
-----------------------------
``"rw"``
    Read/write storage. Writes replace the value; reads return it; the hardware sees it.
``"ro"``
    Read-only status driven by the hardware. Writes are ignored (the encoder refuses them).
``"w1c"``
    Sticky status bits: a hardware pulse sets a bit, the host clears it by writing 1 to it
    (writing 0 leaves it alone). If set and clear happen in the same cycle, set wins.
``"wo"``
    Write-only command: a write produces a one-cycle pulse carrying the written value to the
    hardware; reads return 0. Its reset value is always 0.
"""

import enum as py_enum
import keyword
import re
import textwrap
from typing import NamedTuple

__all__ = [
    "ACCESS", "DATA_WIDTH",
    "Field", "Register", "RegisterMap", "WriteBlock",
    "document",
]


#: Width of every register, in bits.
DATA_WIDTH = 32

#: The access types a field may have; see the module documentation.
ACCESS = ("rw", "ro", "w1c", "wo")

#: Access types the host can write.
WRITABLE = ("rw", "w1c", "wo")

#: Access types the host can read back (``wo`` fields read as 0).
READABLE = ("rw", "ro", "w1c")

_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_REGISTER_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_MAP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _check_int(what, value):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not {value!r}")
    return value


def _check_doc(what, doc):
    if not isinstance(doc, str):
        raise TypeError(f"{what} must be a string, not {doc!r}")
    return doc


def _bits(offset, width):
    msb = offset + width - 1
    return f"[{msb}]" if width == 1 else f"[{msb}:{offset}]"


class Field:
    """One field of a register.

    Parameters
    ----------
    name : str
        Field name, ``lower_snake_case`` (it becomes a port name in RTL).
    width : int
        Width in bits, 1 to 32.
    offset : int or None
        Position of the least significant bit. ``None`` (the default) places the field right
        after the previous field of the register (bit 0 for the first field).
    access : str
        One of :data:`ACCESS`: ``"rw"``, ``"ro"``, ``"w1c"`` or ``"wo"``.
    reset : int, enum member, str or None
        Value after reset; an enum member or member name for a field with an ``enum``.
        ``None`` (the default) means 0, except for ``ro`` fields, where it means "whatever the
        hardware drives" (the docs show a dash; the RTL input idles at 0). A ``wo`` field has no
        state, so its reset must be 0.
    enum : subclass of enum.IntEnum, dict or None
        Named values of the field. A ``dict`` maps names to values and is turned into an
        :class:`enum.IntEnum` named after the field. Every member must fit in ``width``. Not
        allowed on ``w1c`` fields, whose bits are independent flags.
    doc : str
        One-line (or short) description for the generated documentation.

    Raises
    ------
    TypeError, ValueError
        For any bad argument; the message names the bad value.

    Attributes
    ----------
    name, width, offset, access, reset, enum, doc
        The (validated) parameters. :attr:`reset` is an ``int`` or ``None``; :attr:`enum` is an
        :class:`enum.IntEnum` subclass or ``None``.
    """

    def __init__(self, name, width=1, *, offset=None, access="rw", reset=None, enum=None,
                 doc=""):
        if not isinstance(name, str) or not _FIELD_NAME.match(name) or keyword.iskeyword(name):
            raise ValueError(f"Field name must be a lower_snake_case identifier, not {name!r}")
        _check_int(f"Width of field {name!r}", width)
        if not 1 <= width <= DATA_WIDTH:
            raise ValueError(f"Width of field {name!r} must be in [1, {DATA_WIDTH}], "
                             f"not {width!r}")
        if offset is not None:
            _check_int(f"Offset of field {name!r}", offset)
            if not 0 <= offset < DATA_WIDTH:
                raise ValueError(f"Offset of field {name!r} must be in [0, {DATA_WIDTH - 1}], "
                                 f"not {offset!r}")
            if offset + width > DATA_WIDTH:
                raise ValueError(f"Field {name!r} at bits {_bits(offset, width)} does not fit in "
                                 f"a {DATA_WIDTH}-bit register")
        if access not in ACCESS:
            raise ValueError(f"Access of field {name!r} must be one of "
                             f"{', '.join(map(repr, ACCESS))}, not {access!r}")
        _check_doc(f"Doc of field {name!r}", doc)

        self._name = name
        self._width = width
        self._offset = offset
        self._access = access
        self._doc = doc
        self._enum = self._make_enum(enum)

        if reset is None:
            self._reset = None if access == "ro" else 0
        else:
            self._reset = self.coerce(reset, what=f"Reset value of field {name!r}")
        if access == "wo" and self._reset != 0:
            raise ValueError(f"Reset value of write-only field {name!r} must be 0 (a 'wo' "
                             f"field holds no state), not {reset!r}")

    def _make_enum(self, enum):
        if enum is None:
            return None
        if self._access == "w1c":
            raise ValueError(f"Field {self._name!r} is 'w1c' (independent sticky bits) and "
                             f"cannot have an enum, not {enum!r}")
        if isinstance(enum, dict):
            if not enum:
                raise ValueError(f"Enum of field {self._name!r} must not be empty")
            for key, value in enum.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise ValueError(f"Enum member name of field {self._name!r} must be an "
                                     f"identifier, not {key!r}")
                _check_int(f"Enum member {key!r} of field {self._name!r}", value)
            enum = py_enum.IntEnum(self._name, enum)
        elif not (isinstance(enum, type) and issubclass(enum, py_enum.IntEnum)):
            raise TypeError(f"Enum of field {self._name!r} must be an enum.IntEnum subclass or a "
                            f"dict, not {enum!r}")
        if not list(enum):
            raise ValueError(f"Enum of field {self._name!r} must not be empty, not {enum!r}")
        for member in enum:
            if not 0 <= member.value < (1 << self._width):
                raise ValueError(f"Enum member {member.name}={member.value!r} of field "
                                 f"{self._name!r} does not fit in {self._width} bit(s)")
        return enum

    @property
    def name(self):
        return self._name

    @property
    def width(self):
        return self._width

    @property
    def offset(self):
        """Bit position of the LSB, or ``None`` while the field is not placed in a register."""
        return self._offset

    @property
    def access(self):
        return self._access

    @property
    def reset(self):
        return self._reset

    @property
    def enum(self):
        return self._enum

    @property
    def doc(self):
        return self._doc

    @property
    def max(self):
        """Largest value the field can hold."""
        return (1 << self._width) - 1

    @property
    def mask(self):
        """Mask of the field's bits within the register word (needs a placed field)."""
        return self.max << self._offset

    @property
    def bits(self):
        """Bit range as text, e.g. ``"[7:0]"`` or ``"[3]"`` (needs a placed field)."""
        return _bits(self._offset, self._width)

    def coerce(self, value, *, what=None, strict=True):
        """Check ``value`` for this field and return it as a plain ``int``.

        Accepts an ``int`` (or ``bool``) in ``[0, 2**width)``; for an enum field, a member of the
        field's enum, a member name (``str``), or an ``int`` equal to a member's value (any
        ``int`` that fits when ``strict`` is false).

        Raises
        ------
        TypeError
            If ``value`` has the wrong type (including a member of some other enum).
        ValueError
            If ``value`` does not fit, or is not a member of the field's enum.
        """
        what = what or f"Value of field {self._name!r}"
        enum = self._enum
        if isinstance(value, str):
            if enum is None:
                raise TypeError(f"{what} must be an integer, not {value!r} (the field has no "
                                f"enum)")
            try:
                return int(enum[value])
            except KeyError:
                raise ValueError(f"{what}: {value!r} is not a member of {enum.__name__} "
                                 f"(members: {', '.join(m.name for m in enum)})") from None
        if isinstance(value, py_enum.Enum):
            if enum is None or not isinstance(value, enum):
                expected = "an integer" if enum is None else f"a member of {enum.__name__}"
                raise TypeError(f"{what} must be {expected}, not {value!r}")
            return int(value)
        if not isinstance(value, int):
            raise TypeError(f"{what} must be an integer, not {value!r}")
        value = int(value)
        if not 0 <= value <= self.max:
            raise ValueError(f"{what} must be in [0, {self.max}] ({self._width} bit(s)), "
                             f"not {value!r}")
        if strict and enum is not None and value not in enum._value2member_map_:
            raise ValueError(f"{what}: {value!r} is not a value of {enum.__name__} "
                             f"(members: {', '.join(f'{m.name}={m.value}' for m in enum)})")
        return value

    def _placed(self, offset):
        field = object.__new__(Field)
        field.__dict__.update(self.__dict__)
        field._offset = offset
        return field

    def __repr__(self):
        where = "" if self._offset is None else f" at {self.bits}"
        return f"Field({self._name!r}, {self._width}{where}, access={self._access!r})"


class Register:
    """A 32-bit register made of fields.

    Parameters
    ----------
    name : str
        Register name, ``UPPER_SNAKE_CASE``.
    fields : iterable of Field
        The fields, in declaration order. Fields without an explicit offset are placed right
        after the previous field.
    offset : int or None
        Word offset of the register within its map. ``None`` (the default) places it at the
        word after the previous register of the map (word 0 for the first register).
    doc : str
        Description for the generated documentation.

    Raises
    ------
    ValueError
        If fields overlap, do not fit in 32 bits, have duplicate names, or the register has no
        field; the message names the offending field and bits.

    Attributes
    ----------
    name, offset, doc
        As given (``offset`` may be ``None`` until the register is placed in a map).
    fields : tuple of Field
        The fields with their bit offsets resolved, in declaration order.
    """

    def __init__(self, name, fields, *, offset=None, doc=""):
        if not isinstance(name, str) or not _REGISTER_NAME.match(name):
            raise ValueError(f"Register name must be an UPPER_SNAKE_CASE identifier, "
                             f"not {name!r}")
        if offset is not None:
            _check_int(f"Offset of register {name!r}", offset)
            if offset < 0:
                raise ValueError(f"Offset of register {name!r} must be non-negative, "
                                 f"not {offset!r}")
        _check_doc(f"Doc of register {name!r}", doc)
        if isinstance(fields, Field):
            raise TypeError(f"Fields of register {name!r} must be an iterable of Field, "
                            f"not a single {fields!r}")
        fields = list(fields)
        if not fields:
            raise ValueError(f"Register {name!r} must have at least one field")

        placed = []
        by_name = {}
        next_bit = 0
        for field in fields:
            if not isinstance(field, Field):
                raise TypeError(f"Fields of register {name!r} must be Field objects, "
                                f"not {field!r}")
            if field.name in by_name:
                raise ValueError(f"Register {name!r} has two fields named {field.name!r}")
            offset_ = next_bit if field.offset is None else field.offset
            if offset_ + field.width > DATA_WIDTH:
                raise ValueError(f"Field {field.name!r} of register {name!r} would occupy bits "
                                 f"{_bits(offset_, field.width)}, beyond bit {DATA_WIDTH - 1}")
            field = field._placed(offset_)
            for other in placed:
                if field.mask & other.mask:
                    raise ValueError(f"Field {field.name!r} {field.bits} of register {name!r} "
                                     f"overlaps field {other.name!r} {other.bits}")
            placed.append(field)
            by_name[field.name] = field
            next_bit = offset_ + field.width

        self._name = name
        self._offset = offset
        self._doc = doc
        self._fields = tuple(placed)
        self._by_name = by_name

    def _placed(self, offset):
        register = object.__new__(Register)
        register.__dict__.update(self.__dict__)
        register._offset = offset
        return register

    @property
    def name(self):
        return self._name

    @property
    def offset(self):
        return self._offset

    @property
    def doc(self):
        return self._doc

    @property
    def fields(self):
        return self._fields

    def __getitem__(self, name):
        """The field called ``name``; :class:`ValueError` naming it if there is none."""
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ValueError(f"Register {self._name!r} has no field {name!r}; fields: "
                             f"{', '.join(self._by_name)}") from None

    def __contains__(self, name):
        return name in self._by_name

    def __iter__(self):
        return iter(self._fields)

    @property
    def accesses(self):
        """The set of access types of the fields."""
        return frozenset(f.access for f in self._fields)

    @property
    def access(self):
        """Summary of the access types: one type, or e.g. ``"rw/ro"`` in declaration order."""
        seen = []
        for f in self._fields:
            if f.access not in seen:
                seen.append(f.access)
        return "/".join(seen)

    @property
    def reset(self):
        """The register word after reset (``ro`` fields without a reset value count as 0)."""
        return self.pack()

    @property
    def write_mask(self):
        """Bits the host can write (``rw``, ``w1c`` and ``wo`` fields)."""
        return self._mask(WRITABLE)

    @property
    def read_mask(self):
        """Bits that can read back non-zero (``rw``, ``ro`` and ``w1c`` fields)."""
        return self._mask(READABLE)

    def _mask(self, accesses):
        mask = 0
        for f in self._fields:
            if f.access in accesses:
                mask |= f.mask
        return mask

    def pack(self, *, strict=True, **values):
        """Pack field values into a word, whatever their access type.

        Fields not given take their reset value (0 for ``ro`` fields without one). This is the
        value view of the register (for models and read-back checks); to build a host write use
        :meth:`RegisterMap.encode`, which refuses read-only fields. With ``strict`` false an enum
        field takes any value that fits, so that tests can write codes the hardware must reject.
        """
        word = 0
        for name in values:
            self[name]  # Raises ValueError naming an unknown field.
        for f in self._fields:
            if f.name in values:
                value = f.coerce(values[f.name], what=f"Value of field {self._name}.{f.name}",
                                 strict=strict)
            else:
                value = f.reset or 0
            word |= value << f.offset
        return word

    def unpack(self, word, *, strict=True):
        """Split a word into a ``{field name: value}`` dict.

        Values of enum fields are members of the enum. With ``strict`` (the default) a word with
        reserved bits set, or an enum field holding a value that is not a member, raises
        :class:`ValueError`; otherwise reserved bits are ignored and unknown enum values are
        returned as plain ``int``.
        """
        _check_int(f"Word for register {self._name!r}", word)
        if not 0 <= word < (1 << DATA_WIDTH):
            raise ValueError(f"Word for register {self._name!r} must be in "
                             f"[0, 0x{(1 << DATA_WIDTH) - 1:X}], not {word!r}")
        if strict:
            reserved = word & ~self._mask(ACCESS)
            if reserved:
                raise ValueError(f"Word 0x{word:08X} for register {self._name!r} sets reserved "
                                 f"bits 0x{reserved:08X}")
        values = {}
        for f in self._fields:
            value = (word >> f.offset) & f.max
            if f.enum is not None:
                if value in f.enum._value2member_map_:
                    value = f.enum(value)
                elif strict:
                    raise ValueError(f"Word 0x{word:08X} for register {self._name!r}: field "
                                     f"{f.name!r} holds {value!r}, not a value of "
                                     f"{f.enum.__name__}")
            values[f.name] = value
        return values

    def __repr__(self):
        return f"Register({self._name!r}, offset={self._offset!r}, fields={list(self._fields)!r})"


class WriteBlock(NamedTuple):
    """A run of writes to consecutive registers: the entry format of task descriptors.

    Attributes
    ----------
    address : int
        Word address of the first register.
    count : int
        Number of consecutive registers written (``len(words)``).
    words : tuple of int
        The data words, for ``address``, ``address + 1``, ...
    """

    address: int
    count: int
    words: tuple


class RegisterMap:
    """A named set of registers at consecutive word addresses.

    Parameters
    ----------
    name : str
        Map name (an identifier, e.g. ``"NPU_INFO"``).
    registers : iterable of Register
        The registers, in declaration order. Registers without an explicit offset are placed
        at the word after the previous register.
    base : int
        Word address of the map's offset 0 in the NPU's CSR address space. Addresses given to and
        returned by the encoder and decoder are absolute (``base + offset``); the register file
        of one map decodes offsets only.
    doc : str
        Description for the generated documentation.

    Raises
    ------
    ValueError
        For duplicate register names or offsets; the message names them.

    Attributes
    ----------
    name, base, doc
        As given.
    registers : tuple of Register
        The registers with offsets resolved, in declaration order.
    """

    def __init__(self, name, registers, *, base=0, doc=""):
        if not isinstance(name, str) or not _MAP_NAME.match(name):
            raise ValueError(f"Register map name must be an identifier, not {name!r}")
        _check_int(f"Base of register map {name!r}", base)
        if base < 0:
            raise ValueError(f"Base of register map {name!r} must be non-negative, not {base!r}")
        _check_doc(f"Doc of register map {name!r}", doc)
        registers = list(registers)
        if not registers:
            raise ValueError(f"Register map {name!r} must have at least one register")

        placed = []
        by_name = {}
        by_offset = {}
        next_offset = 0
        for register in registers:
            if not isinstance(register, Register):
                raise TypeError(f"Registers of map {name!r} must be Register objects, "
                                f"not {register!r}")
            if register.name in by_name:
                raise ValueError(f"Register map {name!r} has two registers named "
                                 f"{register.name!r}")
            offset = next_offset if register.offset is None else register.offset
            if offset in by_offset:
                raise ValueError(f"Register {register.name!r} of map {name!r} is at offset "
                                 f"0x{offset:X}, already used by register "
                                 f"{by_offset[offset].name!r}")
            register = register._placed(offset)
            placed.append(register)
            by_name[register.name] = register
            by_offset[offset] = register
            next_offset = offset + 1

        self._name = name
        self._base = base
        self._doc = doc
        self._registers = tuple(placed)
        self._by_name = by_name
        self._by_offset = by_offset

    @property
    def name(self):
        return self._name

    @property
    def base(self):
        return self._base

    @property
    def doc(self):
        return self._doc

    @property
    def registers(self):
        return self._registers

    @property
    def size(self):
        """Number of words the map spans: highest offset + 1."""
        return max(self._by_offset) + 1

    def __iter__(self):
        return iter(self._registers)

    def __len__(self):
        return len(self._registers)

    def __contains__(self, name):
        return name in self._by_name

    def __getitem__(self, name):
        """The register called ``name``; :class:`ValueError` naming it if there is none."""
        if isinstance(name, Register):
            name = name.name
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ValueError(f"Register map {self._name!r} has no register {name!r}; "
                             f"registers: {', '.join(self._by_name)}") from None

    def address(self, name):
        """Absolute word address of register ``name``."""
        return self._base + self[name].offset

    def at(self, address):
        """The register at absolute word ``address``, or :class:`ValueError` naming it."""
        _check_int("Register address", address)
        register = self._by_offset.get(address - self._base)
        if register is None:
            raise ValueError(f"Address 0x{address:X} is not a register of map {self._name!r} "
                             f"(base 0x{self._base:X}, {self.size} words)")
        return register

    # Encoder and decoder.

    def encode(self, register, **values):
        """Encode one host write.

        Parameters
        ----------
        register : str
            Register name.
        **values
            Field values (``int``, enum member or enum member name). ``rw`` fields not given keep
            their reset value; ``w1c`` and ``wo`` fields not given are written as 0 (clear
            nothing, pulse 0). Reserved bits are 0.

        Returns
        -------
        tuple of (int, int)
            ``(address, word)``: the absolute word address and the data word.

        Raises
        ------
        ValueError
            Unknown register or field, a ``ro`` field, a value out of range or not a member of
            the field's enum.
        TypeError
            A value of the wrong type.
        """
        reg = self[register]
        for name in values:
            field = reg[name]
            if field.access == "ro":
                raise ValueError(f"Field {reg.name}.{name} is read-only ('ro') and cannot be "
                                 f"written")
        word = 0
        for f in reg.fields:
            if f.name in values:
                value = f.coerce(values[f.name], what=f"Value of field {reg.name}.{f.name}")
            elif f.access == "rw":
                value = f.reset
            else:
                value = 0
            word |= value << f.offset
        return self._base + reg.offset, word

    def decode(self, address, word, *, strict=True):
        """Decode a word of the register at absolute ``address`` into ``{field: value}``.

        See :meth:`Register.unpack` for ``strict``. An address outside the map raises
        :class:`ValueError`.
        """
        return self.at(address).unpack(word, strict=strict)

    def encode_block(self, writes):
        """Encode a sequence of register writes into runs of consecutive registers.

        Parameters
        ----------
        writes : dict or iterable of (str, dict)
            Register names with their field values, in the order the writes must happen
            (``{"REG": {"field": value}}`` or ``[("REG", {"field": value}), ...]``). Each is
            encoded like :meth:`encode`.

        Returns
        -------
        list of WriteBlock
            Writes to consecutive addresses, in the given order, are merged into one
            ``(address, count, words)`` block; the order of writes is preserved (command
            registers written last stay last).
        """
        if isinstance(writes, dict):
            writes = writes.items()
        blocks = []
        for item in writes:
            try:
                name, values = item
            except (TypeError, ValueError):
                raise TypeError(f"A write must be a (register name, field values) pair, "
                                f"not {item!r}") from None
            if not isinstance(values, dict):
                raise TypeError(f"Field values for register {name!r} must be a dict, "
                                f"not {values!r}")
            address, word = self.encode(name, **values)
            if blocks and blocks[-1].address + blocks[-1].count == address:
                last = blocks.pop()
                blocks.append(WriteBlock(last.address, last.count + 1, last.words + (word,)))
            else:
                blocks.append(WriteBlock(address, 1, (word,)))
        return blocks

    def decode_block(self, blocks, *, strict=True):
        """Inverse of :meth:`encode_block`: a list of ``(register name, {field: value})``.

        ``blocks`` are :class:`WriteBlock` or ``(address, count, words)`` tuples;
        :class:`ValueError` if ``count`` disagrees with the number of words.
        """
        writes = []
        for block in blocks:
            address, count, words = block
            words = tuple(words)
            if count != len(words):
                raise ValueError(f"Block at 0x{address:X} has count {count!r} but "
                                 f"{len(words)} data words")
            for index, word in enumerate(words):
                reg = self.at(address + index)
                writes.append((reg.name, reg.unpack(word, strict=strict)))
        return writes

    # Documentation.

    def to_markdown(self, *, level=2):
        """The map's reference as Markdown: a register summary, then one table per register.

        ``level`` is the heading level of the map's title (registers get ``level + 1``).
        """
        h = "#" * level
        lines = [f"{h} {self._name}", ""]
        if self._doc:
            lines += [_paragraphs(self._doc), ""]
        lines += [f"Base word address `0x{self._base:04X}`; {len(self)} registers over "
                  f"{self.size} words. Unlisted offsets are unmapped.", ""]
        lines += ["| Offset | Address | Register | Access | Reset | Description |",
                  "|---|---|---|---|---|---|"]
        for reg in self._registers:
            lines.append(f"| `0x{reg.offset:02X}` | `0x{self._base + reg.offset:04X}` | "
                         f"`{reg.name}` | {reg.access} | {_reset_word(reg)} | "
                         f"{_cell(_first_sentence(reg.doc))} |")
        lines.append("")
        for reg in self._registers:
            lines += [f"{h}# {self._name}.{reg.name} (offset `0x{reg.offset:02X}`)", ""]
            if reg.doc:
                lines += [_paragraphs(reg.doc), ""]
            lines += ["| Bits | Field | Access | Reset | Description |",
                      "|---|---|---|---|---|"]
            for row in _field_rows(reg):
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
        return "\n".join(lines)

    def __repr__(self):
        return f"RegisterMap({self._name!r}, base=0x{self._base:X}, {len(self)} registers)"


def _paragraphs(text):
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return "\n\n".join(textwrap.fill(p, width=100, break_on_hyphens=False)
                       for p in paragraphs if p)


def _cell(text):
    return " ".join(text.split()).replace("|", "\\|")


def _first_sentence(text):
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _reset_word(reg):
    if any(f.access == "ro" and f.reset is None for f in reg.fields):
        return "hw"
    return f"`0x{reg.reset:08X}`"


def _field_rows(reg):
    rows = []
    fields = sorted(reg.fields, key=lambda f: f.offset)
    bit = 0
    for f in fields + [None]:
        start = DATA_WIDTH if f is None else f.offset
        if start > bit:
            rows.append([f"`{_bits(bit, start - bit)}`", "-", "-", "`0`",
                         "Reserved: reads 0, writes ignored."])
        if f is None:
            break
        if f.reset is None:
            reset = "hw"
        elif f.enum is not None and f.reset in f.enum._value2member_map_:
            reset = f"`{f.reset}` ({f.enum(f.reset).name})"
        else:
            reset = f"`0x{f.reset:X}`" if f.reset > 9 else f"`{f.reset}`"
        doc = _cell(f.doc)
        if f.enum is not None:
            values = ", ".join(f"`{m.value}` = `{m.name}`" for m in f.enum)
            doc = f"{doc} Values: {values}." if doc else f"Values: {values}."
        rows.append([f"`{f.bits}`", f"`{f.name}`", f.access, reset, doc])
        bit = f.offset + f.width
    return rows


def document(maps, *, title="Register maps", intro=""):
    """A complete Markdown document: ``title``, ``intro`` text, then every map's reference."""
    parts = [f"# {title}", ""]
    if intro:
        parts += [intro.strip("\n"), ""]
    for regmap in maps:
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"Maps must be RegisterMap objects, not {regmap!r}")
        parts += [regmap.to_markdown(level=2)]
    return "\n".join(parts).rstrip("\n") + "\n"

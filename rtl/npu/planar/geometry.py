"""Sizes of a planar engine build, division and multiplication by constants, and the read
port of the memories whose collisions do not matter."""

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

from amaranth.hdl import Const, Signal, signed, unsigned
from amaranth.lib.memory import Memory

from npu_spec.config import NPUConfig
from npu_spec.planar import INT8_WORD, SHAPE_BITS, h_ring_depth, line_buffer_banks

from ..lib.fp32 import FP32AddPipe
from ..lib.fp32mul import FP32Mul

__all__ = ["LANE_LATENCY", "QUEUE_DEPTH", "Geometry", "const_mul", "div_params",
           "unchecked_memory", "unchecked_read_port"]

#: Entries of the pooling result queue.
QUEUE_DEPTH = 8



def unchecked_memory(**kwargs):
    """A :class:`~amaranth.lib.memory.Memory` whose reads never need a word written in the
    same cycle (the line buffer, the H ring); read it with :func:`unchecked_read_port`.

    A synchronous read port keeps the old data on a collision, which an iCE40 block RAM does
    not do: Yosys emulates it with a register of the write address, data and enable and a
    bypass multiplexer (40 flip-flops and 23 LUTs per 16-bit bank). Yosys' ``no_rw_check``
    attribute leaves the result of a collision undefined instead; it takes effect when Yosys
    merges the read register into the port, so the port is combinational and the register
    is :func:`unchecked_read_port`'s. The simulation still returns the old data, which no
    reader uses."""
    return Memory(**kwargs, attrs={"no_rw_check": 1})


def unchecked_read_port(m, memory, name):
    """A read port of ``memory`` (from :func:`unchecked_memory`) with its data registered in
    the ``sync`` domain: ``addr``, ``en`` (set them), ``data`` (the word whose address was
    given with ``en`` in the cycle before; held otherwise). The register has no reset, like a
    memory's own read register."""
    port = memory.read_port(domain="comb")
    en = Signal(name=f"{name}_en")
    data = Signal(memory.shape, name=f"{name}_data", reset_less=True)
    with m.If(en):
        m.d.sync += data.eq(port.data)
    return SimpleNamespace(addr=port.addr, en=en, data=data)


#: Cycles from the lane pipeline's input register to its output register.
LANE_LATENCY = FP32AddPipe.LATENCY + FP32Mul.LATENCY + FP32AddPipe.LATENCY + 1


@lru_cache(maxsize=None)
def _div_params(nbits, divisors):
    xs = range(1 << nbits)
    s = (max(divisors) - 1).bit_length()
    while True:
        ms = {d: -(-(1 << s) // d) for d in divisors}
        if all((x * ms[d]) >> s == x // d for d in divisors for x in xs):
            return s, ms
        s += 1


def div_params(nbits, divisors):
    """``(s, {d: M})``: ``x // d == (x * M) >> s`` for every ``x < 2**nbits`` and every
    divisor ``d`` (checked exhaustively), so that division by a constant, or by a small field
    through a table of ``M``, is a multiplication instead of a divider."""
    s, ms = _div_params(nbits, tuple(sorted(set(divisors))))
    return s, dict(ms)


def _signed_digits(constant):
    """Canonical signed digits of ``constant``: ``[(shift, +1 or -1), ...]`` whose sum of
    ``digit << shift`` is ``constant`` (no two adjacent non-zero digits)."""
    digits = []
    shift = 0
    while constant:
        if constant & 1:
            digit = 2 - (constant & 3)      # +1 if the next bit is 0, else -1
            digits.append((shift, digit))
            constant -= digit
        constant >>= 1
        shift += 1
    return digits


def const_mul(value, constant):
    """``value * constant`` (``value`` unsigned, ``constant`` a non-negative integer) as a sum
    of shifted copies, so that synthesis builds a few adders (no multiplier or DSP block)."""
    if not isinstance(constant, int) or constant < 0:
        raise ValueError(f"constant must be a non-negative integer, not {constant!r}")
    width = len(value) + max(constant, 1).bit_length()
    plus = [value << k for k, d in _signed_digits(constant) if d > 0]
    minus = [value << k for k, d in _signed_digits(constant) if d < 0]
    total = sum(plus, Const(0, 1))
    if minus:
        total = (total - sum(minus, Const(0, 1))).as_unsigned()
    return total[:width]


@dataclass(frozen=True)
class Geometry:
    """The sizes of one planar engine build.

    Parameters
    ----------
    lanes : int
        ``L = P * P``, elements per beat.
    pool_beats : int
        ``K``, width of the pooling filters in beats.
    plane_depth : int
        Elements of the line buffer.
    integer : bool
        The integer build (``NPUConfig.planar_impl == "int8"``): values are
        :data:`~npu_spec.planar.INT8_WORD`-bit two's-complement integers instead of binary32.
    """

    lanes: int
    pool_beats: int
    plane_depth: int
    integer: bool = False

    @classmethod
    def of(cls, config, plane_depth):
        """The geometry of ``config`` (an :class:`NPUConfig`) with a line buffer of
        ``plane_depth`` elements."""
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        p = config.planar_lanes
        if p & (p - 1):
            raise ValueError(f"planar_lanes must be a power of two, not {p!r}")
        if not isinstance(plane_depth, int) or plane_depth < 16:
            raise ValueError(f"plane_depth must be an integer of at least 16, "
                             f"not {plane_depth!r}")
        return cls(p * p, config.planar_pool_beats, plane_depth,
                   config.planar_impl == "int8")

    @property
    def word(self):
        """Width of a value in the lanes, filters, rings and line buffer: 32 (binary32), or
        :data:`~npu_spec.planar.INT8_WORD` in the integer build."""
        return INT8_WORD if self.integer else 32

    @property
    def buffer_shape(self):
        """Shape of an element in the line buffer and of a value in the result queue:
        ``word`` bits, or in the integer build ``signed(8)``, read back sign-extended to
        ``word``: every element loaded into the line buffer (a pooling plane on A, a broadcast
        vector on B) comes from the first converter as an INT8 (:class:`~.intpath.ToInt`), and
        the integer build pools by max and min only, so a pooling result is one of those
        inputs (the queue's lanes without a window hold junk, which is never output). Halves
        the banks' crossbars and the queue's block RAM."""
        return signed(8) if self.integer else unsigned(self.word)

    @property
    def lane_bits(self):
        """``log2 L``."""
        return self.lanes.bit_length() - 1

    @property
    def filter_lanes(self):
        """``FL = K L``, lanes of the pooling filters."""
        return self.pool_beats * self.lanes

    @property
    def banks(self):
        """``NB``, banks of the line buffer."""
        return line_buffer_banks(self.filter_lanes, self.plane_depth)[0]

    @property
    def bank_depth(self):
        """``BD``, words of each line-buffer bank."""
        return line_buffer_banks(self.filter_lanes, self.plane_depth)[1]

    @property
    def ring_depth(self):
        """``DR = NB BD``, elements of the line buffer ring."""
        return self.banks * self.bank_depth

    @property
    def h_depth(self):
        """``HD``, words of the H ring (a power of two)."""
        return h_ring_depth(self.lanes, self.plane_depth)

    @property
    def h_bits(self):
        """``log2 HD``."""
        return self.h_depth.bit_length() - 1

    @property
    def count_bits(self):
        """Width of the pooling walk's element counts (elements loaded into the line buffer,
        the first element of a row), kept modulo ``2**count_bits``: any two counts that are
        compared are less than ``DR + 4 * 2**SHAPE_BITS`` apart (the ring and the three rows
        of a group ahead of the loader), half the modulus (``docs/planar.md``, "Counters")."""
        return (self.ring_depth + 4 * (1 << SHAPE_BITS)).bit_length() + 1

    @property
    def hword_bits(self):
        """Width of the pooling walk's H word indices, kept modulo ``2**hword_bits`` (a
        multiple of ``HD``): compared indices are less than a plane of H words and a few
        windows apart, below ``2**(SHAPE_BITS + 1) * HD`` since a valid task's ``owb`` is
        below ``HD`` (``docs/planar.md``, "Counters")."""
        return SHAPE_BITS + 1 + self.h_bits + 2

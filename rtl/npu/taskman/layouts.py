"""Layouts and signatures shared by the task manager's sub-units (its engine and register-write
ports are the shared ones of :mod:`npu.lib.engine`).

Field widths come from the specification: the TASK_MANAGER register map
(:func:`npu_spec.taskman.task_manager_map`) and the descriptor format
(:data:`npu_spec.descriptors.HEADER`).
"""

from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.descriptors import HEADER
from npu_spec.engine import ERROR_BITS, Engine
from npu_spec.taskman import Cause, task_manager_map

from ..lib.engine import ADDR_WIDTH, QUEUE_WIDTH
from ..lib.enums import hw_enum

__all__ = [
    "CauseCode",
    "ExceptionEvent",
    "Fetched",
    "MemReadSignature",
    "MemResponse",
    "MemoryWindow",
    "QueueControl",
    "QueueStatus",
    "SlotInfo",
    "SlotReadSignature",
    "fetched_layout",
    "slot_info",
    "slot_word",
]

_MAP = task_manager_map(1)


def _width(register, field):
    return unsigned(_MAP[register][field].width)


#: Exception causes as an Amaranth enum (``EXC_STATUS.cause``).
CauseCode = hw_enum(Cause)

#: The host-set parameters of one task queue (``Qi_CTRL`` and ``Qi_TAIL``).
QueueControl = data.StructLayout({
    "priority":   _width("Q0_CTRL", "priority"),
    "network":    _width("Q0_CTRL", "network"),
    "base_index": _width("Q0_CTRL", "base_index"),
    "secure":     _width("Q0_CTRL", "secure"),
    "tail":       _width("Q0_TAIL", "address"),
})

#: The state of one task queue: head pointer, descriptors not yet committed, TQSP, retired (by
#: an exception) and drop (retired by the watchdog: its committed and loaded tasks are removed).
QueueStatus = data.StructLayout({
    "head":    unsigned(ADDR_WIDTH),
    "count":   _width("Q0_STATUS", "count"),
    "tqsp":    _width("Q0_STATUS", "tqsp"),
    "retired": _width("Q0_STATUS", "retired"),
    "drop":    unsigned(1),
})

#: One entry of the base-address table: a network's memory window ``[base, base + limit)``.
MemoryWindow = data.StructLayout({
    "base":  _width("BASE0", "address"),
    "limit": _width("LIMIT0", "words"),
})

def slot_info(addr_width=ADDR_WIDTH):
    """What the configuration queue keeps of a committed descriptor besides its words, with
    addresses of ``addr_width`` bits (the lean build's ``npu_spec.taskman.address_bits``)."""
    return data.StructLayout({
        "queue": unsigned(QUEUE_WIDTH),
        "addr":  unsigned(addr_width),       # descriptor address (exceptions)
        "base":  unsigned(addr_width),       # the network's memory window: base address
        "limit": unsigned(addr_width),       # ... and size in words
        "tsr":   unsigned(1),                # a TSR task: no commit until it completes
    })


def fetched_layout(addr_width=ADDR_WIDTH):
    """A complete, checked descriptor in the fetch queue, ready to commit."""
    return data.StructLayout({
        "slot":   slot_info(addr_width),
        "length": unsigned(HEADER[0]["length"].width),
    })


#: :func:`slot_info` and :func:`fetched_layout` with 32-bit addresses.
SlotInfo = slot_info()
Fetched = fetched_layout()

#: An exception: ``cause`` is ``NONE`` when nothing is raised; ``queue`` is retired and ``addr``
#: is the descriptor's address; ``engine`` is the task's engine (causes ``ENGINE`` and
#: ``TIMEOUT``) and ``code`` the engine's error code (cause ``ENGINE``), 0 otherwise.
ExceptionEvent = data.StructLayout({
    "cause":  CauseCode,
    "queue":  unsigned(QUEUE_WIDTH),
    "addr":   unsigned(ADDR_WIDTH),
    "engine": unsigned(Engine.bits),
    "code":   unsigned(ERROR_BITS),
})


def slot_word(slot_words):
    """Layout of one word written into a descriptor slot of ``slot_words`` words."""
    return data.StructLayout({
        "index": unsigned((slot_words - 1).bit_length()),
        "data":  unsigned(32),
    })


#: The answer to one read of system memory: the word, or ``err`` (the bus answered with an
#: error; ``data`` is then meaningless).
MemResponse = data.StructLayout({
    "data": unsigned(32),
    "err":  unsigned(1),
})


class MemReadSignature(wiring.Signature):
    """Word reads from system memory (the descriptor fetch), from the initiator's side.

    Members
    -------
    req : Out(stream.Signature(ADDR_WIDTH))
        Read requests: 32-bit word addresses.
    resp : In(stream.Signature(MemResponse))
        One response per request taken, in request order, after any number of cycles.

    The memory side (the ``WordReader`` adapter on the system bus, a behavioural memory in
    simulation) may stall requests and responses arbitrarily; the initiator may have several
    requests in flight.
    """

    def __init__(self):
        super().__init__({
            "req":  Out(stream.Signature(ADDR_WIDTH)),
            "resp": In(stream.Signature(MemResponse)),
        })


class SlotReadSignature(wiring.Signature):
    """Read side of the configuration queue, from the reader's (the programming stage's) side.

    Parameters
    ----------
    slot_words : int
        Words per descriptor slot.
    addr_width : int
        Bits of the addresses in ``info``.

    Members
    -------
    valid : In(1)
        A committed descriptor is waiting (the queue is not empty).
    info : In(slot_info(addr_width))
        Where the oldest committed descriptor came from.
    index : Out(range(slot_words))
        Word of the oldest committed descriptor to read.
    data : In(32)
        The word at ``index``, in the cycle after.
    pop : Out(1)
        Release the oldest committed descriptor.
    """

    def __init__(self, slot_words, addr_width=ADDR_WIDTH):
        self._slot_words = slot_words
        self._addr_width = addr_width
        super().__init__({
            "valid": In(1),
            "info":  In(slot_info(addr_width)),
            "index": Out(range(slot_words)),
            "data":  In(32),
            "pop":   Out(1),
        })

    @property
    def slot_words(self):
        return self._slot_words

    @property
    def addr_width(self):
        return self._addr_width

    def __eq__(self, other):
        return (type(other) is type(self) and other.slot_words == self.slot_words and
                other.addr_width == self.addr_width)

    def __hash__(self):
        return hash((type(self), self._slot_words, self._addr_width))

    def __repr__(self):
        return f"SlotReadSignature({self._slot_words}, {self._addr_width})"

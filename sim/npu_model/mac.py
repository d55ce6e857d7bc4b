"""Golden model of the MAC array (``npu.neural.mac.MacArray``), bit for bit.

A MAC program is a dict of numpy arrays, one row per command (see :func:`empty_program`);
it is the same structure the simulation harnesses drive into the RTL and ``--dump`` writes.
Commands run in order; each lane applies the command to its own accumulator slot.
``docs/mac.md`` states the semantics this model defines.
"""

import numpy as np

from npu_spec.formats import F32_MINUS_ONE, F32_ONE
from npu_spec.mac import FORMAT_NEEDS, MacFormat, MacOp

from . import fp

__all__ = ["OP", "FMT", "empty_program", "program_beats", "mac_products", "run_mac_program"]

#: Operation codes by name (:class:`npu_spec.mac.MacOp`).
OP = {op.name.lower(): op.value for op in MacOp}
#: Format codes by name (:class:`npu_spec.mac.MacFormat`): data x coefficient.
FMT = {fmt.name.lower(): fmt.value for fmt in MacFormat}

_F32_PLUS_ONE = np.uint32(F32_ONE)
_F32_MINUS_ONE = np.uint32(F32_MINUS_ONE)


def empty_program(count, lanes):
    """A program of ``count`` zeroed commands for ``lanes`` lanes."""
    return {
        "op":    np.zeros(count, np.uint8),
        "fmt":   np.zeros(count, np.uint8),
        "slot":  np.zeros(count, np.uint8),
        "first": np.zeros(count, np.bool_),
        "last":  np.zeros(count, np.bool_),
        "dual":  np.zeros(count, np.bool_),
        "bias":  np.zeros(count, np.uint32),
        "coef":  np.zeros((count, 2), np.uint16),
        "data":  np.zeros((count, lanes), np.uint16),
    }


def program_beats(program):
    """Number of commands in ``program``."""
    return len(program["op"])


def _operands(data, coef, dual):
    """Per-lane data and coefficient after the dual-kernel routing."""
    lanes = len(data)
    idx = np.arange(lanes)
    if dual:
        return data[idx // 2], coef[idx % 2]
    return data, np.full(lanes, coef[0], np.uint16)


def _int8(bits):
    return (bits & 0xFF).astype(np.uint8).view(np.int8)


def mac_products(fmt, a, b):
    """Exact products of one command's operands: int32 for INT8, else binary32 bits."""
    if fmt == FMT["int8"]:
        return _int8(a).astype(np.int32) * _int8(b).astype(np.int32)
    fa = fp.int8_to_f32(_int8(a)) if fmt == FMT["i8f16"] else fp.f16_to_f32(a)
    fb = fp.int8_to_f32(_int8(b)) if fmt == FMT["f16i8"] else fp.f16_to_f32(b)
    return fp.f32_mul(fa, fb)


def _combine(op, fmt, acc, p):
    """One command's update of the lanes' slot values ``acc`` with products ``p``."""
    if fmt == FMT["int8"]:
        acc = acc.view(np.int32).astype(np.int64)
        p = p.astype(np.int64)
        if op == OP["mac"]:
            out = fp.int32_wrap(acc + p)
        elif op == OP["max"]:
            out = np.maximum(acc, p)
        elif op == OP["min"]:
            out = np.minimum(acc, p)
        else:
            out = np.sign(p - acc)
        return out.astype(np.int32).view(np.uint32)
    if op == OP["mac"]:
        return fp.f32_add(acc, p)
    if op == OP["max"]:
        return fp.f32_max(acc, p)
    if op == OP["min"]:
        return fp.f32_min(acc, p)
    c = fp.f32_cmp(p, acc)
    return np.where(c > 0, _F32_PLUS_ONE, np.where(c < 0, _F32_MINUS_ONE, np.uint32(0)))


def run_mac_program(program, lanes, slots, formats=("int8", "fp16", "mixed")):
    """Run ``program`` and return ``(results, slots_state)``.

    ``results`` is a list of ``(slot, fmt, values)`` with ``values`` a uint32 array of
    ``lanes`` entries, one per command with ``last`` set, in order. A command in a format
    outside ``formats`` writes no slot and yields zeros (the RTL also sets its error flag).
    The initial slot contents are zero.
    """
    supported = {fmt for fmt, needs in FORMAT_NEEDS.items() if needs in formats}
    state = np.zeros((slots, lanes), np.uint32)
    results = []
    for i in range(program_beats(program)):
        op, fmt, slot = int(program["op"][i]), int(program["fmt"][i]), int(program["slot"][i])
        if not 0 <= slot < slots:
            raise ValueError(f"command {i}: slot {slot} out of range for {slots} slots")
        if fmt not in supported:
            if program["last"][i]:
                results.append((slot, fmt, np.zeros(lanes, np.uint32)))
            continue
        a, b = _operands(program["data"][i], program["coef"][i], bool(program["dual"][i]))
        p = mac_products(fmt, a, b)
        acc = (np.full(lanes, program["bias"][i], np.uint32) if program["first"][i]
               else state[slot])
        state[slot] = _combine(op, fmt, acc, p)
        if program["last"][i]:
            results.append((slot, fmt, state[slot].copy()))
    return results, state

"""Golden model of the circular M-slot flow control (``npu.dataproc.flow``; seed 002).

A producer writes units ``0 .. rows-1``, unit ``r`` into slot ``r mod slots``; consumer unit
``c`` reads units ``c*stride - pad .. c*stride - pad + kernel - 1`` clipped to ``[0, rows)``.
"""

__all__ = ["dispatch", "first_needed", "last_needed", "may_consume", "may_produce"]


def first_needed(p, c):
    """First producer unit consumer unit ``c`` reads."""
    return max(0, c * p["stride"] - p["pad"])


def last_needed(p, c):
    """Last producer unit consumer unit ``c`` reads."""
    return min(c * p["stride"] - p["pad"] + p["kernel"] - 1, p["rows"] - 1)


def may_consume(p, produced, consumed):
    """The sufficient rule: the next consumer unit's last unit is written."""
    return consumed < p["units"] and produced > last_needed(p, consumed)


def may_produce(p, produced, consumed):
    """The threshold rule: the next unit's slot holds no unit an unfinished consumer unit
    reads."""
    if produced >= p["rows"]:
        return False
    return consumed >= p["units"] or produced - p["slots"] < first_needed(p, consumed)


def dispatch(p):
    """One thread at a time, the consumer first when it may run: the dispatch order as
    ``[("P", unit, slot) | ("C", unit)]``; stops when neither side may run."""
    produced = consumed = 0
    order = []
    while True:
        if may_consume(p, produced, consumed):
            order.append(("C", consumed))
            consumed += 1
        elif may_produce(p, produced, consumed):
            order.append(("P", produced, produced % p["slots"]))
            produced += 1
        else:
            return order

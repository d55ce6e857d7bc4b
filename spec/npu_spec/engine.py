"""What every engine shares: how it is started, how it reports, its control registers.

Every engine (the neural engine cores, the planar engine, the DMA engine, and the data
processor) is driven the same way (``docs/architecture.md``, "One engine interface"):

* its task registers are written through the task manager's register-write port (or by the
  host on the CSR bus);
* a task starts with a start beat from the task manager (or a host write of ``CTRL.start``);
* it ends with a one-cycle ``done`` that carries an error code, 0 when the task ran; the code
  is :data:`ERROR_BITS` wide and its values are the engine's own error enum;
* the task manager may ``abort`` a running task (its watchdog); the engine drops it, clears its
  datapath and returns to idle without a ``done`` (the task manager has already retired the
  task and reports the timeout in its own ``EXC_STATUS``).

Every engine's register map begins with the same three registers (:func:`control_registers`);
its task registers start at :data:`TASK_OFFSET`.
"""

import enum

from .codes import coded
from .regmap import Field, Register

__all__ = ["ERROR_BITS", "TASK_OFFSET", "Engine", "control_registers"]

#: Width of every engine's error code (0: no error).
ERROR_BITS = 4

#: Word offset of an engine's first task register; offsets below it are the control block.
TASK_OFFSET = 0x08


@coded(2)
class Engine(enum.IntEnum):
    """The engine a task descriptor addresses (``H0.engine``; code 3 is undecodable)."""
    NEURAL = 0
    PLANAR = 1
    DMA = 2


def control_registers(errors, *, counter_doc="Cycles from start to done of the last (or "
                      "running) task."):
    """The control block of an engine's register map: ``CTRL``, ``STATUS``, ``CYCLES``.

    Parameters
    ----------
    errors : enum.IntEnum subclass
        The engine's error codes (``NONE = 0`` first), at most :data:`ERROR_BITS` wide; they
        document ``STATUS.error_code``.
    counter_doc : str
        Description of ``CYCLES``.
    """
    if errors(0).name != "NONE":
        raise ValueError(f"error code 0 of {errors.__name__} must be NONE, not {errors(0)!r}")
    return [
        Register("CTRL", offset=0x00, doc="Commands.", fields=[
            Field("start", 1, access="wo", doc="Start the programmed task (ignored while "
                  "busy)."),
        ]),
        Register("STATUS", offset=0x01, doc="State of the engine.", fields=[
            Field("busy", 1, access="ro", doc="A task is running."),
            Field("error", 1, access="ro", doc="The last task stopped with an error."),
            Field("error_code", ERROR_BITS, offset=4, access="ro", enum=errors,
                  doc="Why the last task stopped (0 when it ran)."),
        ]),
        Register("CYCLES", offset=0x02, doc="Duration of the last task.", fields=[
            Field("count", 32, access="ro", doc=counter_doc),
        ]),
    ]

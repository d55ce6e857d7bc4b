"""The neural task manager: task queues, arbiter, descriptor fetch, task switching,
asynchronous neural/planar dispatch, exceptions and counters (``docs/task_manager.md``).

:class:`TaskManager` composes the sub-units, one per module: :mod:`.queues`, :mod:`.schedule`
(with :mod:`.arbiter`), :mod:`.fetch`, :mod:`.config_queue` (with :mod:`.slots`),
:mod:`.program`, :mod:`.taskbuffer`, :mod:`.dispatch` and :mod:`.counters`.
"""

from .arbiter import Arbiter
from .config_queue import ConfigQueue
from .counters import Counters
from .dispatch import Dispatch
from .fetch import Fetch
from .manager import TaskManager
from .program import Programmer
from .queues import Queues
from .schedule import Scheduler
from .slots import SlotRing
from .taskbuffer import TaskBuffer

__all__ = ["Arbiter", "ConfigQueue", "Counters", "Dispatch", "Fetch", "Programmer", "Queues",
           "Scheduler", "SlotRing", "TaskBuffer", "TaskManager"]

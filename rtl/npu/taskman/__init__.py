"""The neural task manager (SYSTEM.md 4.4): task queues, arbiter, descriptor fetch, task
switching, asynchronous neural/planar dispatch, exceptions and counters."""

from .arbiter import Arbiter
from .manager import TaskManager
from .taskbuffer import TaskBuffer

__all__ = ["Arbiter", "TaskBuffer", "TaskManager"]

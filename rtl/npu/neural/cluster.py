"""The neural engine cores as one engine of the task manager (``docs/system.md``, "Task
manager")."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec.engine import ERROR_BITS

from ..lib.engine import EngineSignature

__all__ = ["CoreCluster"]


class CoreCluster(wiring.Component):
    """Starts a neural engine task on the cores of ``mask`` and reports one ``done``.

    The start beat is offered to every selected core and taken when all of them take it (an
    idle core takes it at once). The task is done in the cycle after the last selected core
    reports ``done``; its error code is the first nonzero code a core reported (the lowest
    core among cores reporting in the same cycle; 0 when all ran). An abort goes to every
    core. Mask bits of cores the build does not have are ignored; a mask with no core of the
    build selects core 0.

    Parameters
    ----------
    cores : int

    Members
    -------
    task : In(EngineSignature())
        From the task manager.
    core : Out(EngineSignature()).array(cores)
        To the cores.
    mask : In(32)
        ``DATA_PROCESSOR.NE_CORES``, sampled when the start is taken.
    """

    def __init__(self, cores):
        if not isinstance(cores, int) or not 1 <= cores <= 32:
            raise ValueError(f"a core cluster has 1 to 32 cores, not {cores!r}")
        self._cores = cores
        super().__init__({
            "task": In(EngineSignature()),
            "core": Out(EngineSignature()).array(cores),
            "mask": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._cores
        start = self.task.start
        selected = Signal(n)
        m.d.comb += selected.eq(Mux(self.mask[:n] == 0, 1, self.mask[:n]))

        # A start is taken when every selected core takes it; no core starts alone.
        all_ready = 1
        for i in range(n):
            all_ready = all_ready & (self.core[i].start.ready | ~selected[i])
        pending = Signal(n)
        m.d.comb += start.ready.eq(all_ready & (pending == 0))
        for i in range(n):
            port = self.core[i]
            m.d.comb += [
                port.start.valid.eq(start.valid & selected[i] & start.ready),
                port.start.payload.eq(start.payload),
                port.done_mem.eq(self.task.done_mem),
                port.abort.eq(self.task.abort),
            ]

        # Completion: the cores still running, and the first error code.
        code = Signal(ERROR_BITS)
        running = Signal()
        done_now = Signal(n)
        m.d.comb += done_now.eq(0)
        for i in range(n):
            m.d.comb += done_now[i].eq(self.core[i].done)
        with m.If(start.valid & start.ready):
            m.d.sync += [pending.eq(selected), running.eq(1), code.eq(0)]
        with m.Elif(self.task.abort):
            m.d.sync += [pending.eq(0), running.eq(0)]
        with m.Elif(running):
            m.d.sync += pending.eq(pending & ~done_now)
            with m.If(code == 0):
                for i in reversed(range(n)):
                    with m.If(self.core[i].done & (self.core[i].error != 0)):
                        m.d.sync += code.eq(self.core[i].error)
            with m.If(pending == 0):
                m.d.sync += running.eq(0)
        m.d.comb += [self.task.done.eq(running & (pending == 0)),
                     self.task.error.eq(Mux(self.task.done, code, 0))]
        return m

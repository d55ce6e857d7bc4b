"""The NPU top level.

:class:`NPUInfo` is the host register file ``NPU_INFO`` (identification, the build's
configuration, a scratch register and bus-error interrupt status). :class:`NPUTop` holds it and
one MAC array per neural engine core with the arrays' command and result streams as ports: the
engines, the task manager, the data processor and the DMA are composed here once the data
processor exists (``docs/architecture.md``).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.registers import NPU_INFO, npu_info_values

from .lib.csr import CSRSignature, RegisterFile
from .neural.layouts import mac_command_layout, mac_result_layout
from .neural.mac import MacArray

__all__ = ["NPUInfo", "NPUTop"]


class NPUInfo(wiring.Component):
    """The ``NPU_INFO`` register file with this build's constants and bus-error status.

    Members
    -------
    bus : In(CSRSignature(4))
        Host register bus.
    irq : Out(1)
        High while any ``IRQ_STATUS`` bit is set.
    """

    bus: In(CSRSignature(4))
    irq: Out(1)

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.regfile = regfile = RegisterFile(NPU_INFO)
        wiring.connect(m, wiring.flipped(self.bus), regfile.bus)

        # Read-only fields: constants of this build.
        for reg_name, fields in npu_info_values(self._config).items():
            port = regfile.port(reg_name)
            for name, value in fields.items():
                m.d.comb += getattr(port, name).eq(value)

        # The error strobe comes a cycle after the access: remember which kind it was.
        was_read = Signal()
        was_write = Signal()
        m.d.sync += [was_read.eq(self.bus.r_en), was_write.eq(self.bus.w_en)]
        m.d.comb += [
            regfile.irq_status.bus_read_error_set.eq(self.bus.error & was_read),
            regfile.irq_status.bus_write_error_set.eq(self.bus.error & was_write),
            self.irq.eq(regfile.irq_status.bus_read_error | regfile.irq_status.bus_write_error),
        ]
        return m


class NPUTop(wiring.Component):
    """Host registers plus ``config.cores`` MAC arrays.

    Members
    -------
    bus : In(CSRSignature(4))
        Host register bus (``NPU_INFO``).
    irq : Out(1)
        Interrupt.
    cmd<i> : In(stream.Signature(mac_command_layout(...)))
        Core ``i``'s MAC command stream.
    res<i> : Out(stream.Signature(mac_result_layout(...)))
        Core ``i``'s MAC result stream.
    mac_error : Out(cores)
        Per core: a command used a format this build leaves out (sticky until reset).
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        members = {"bus": In(CSRSignature(4)), "irq": Out(1), "mac_error": Out(config.cores)}
        for i in range(config.cores):
            members[f"cmd{i}"] = In(stream.Signature(
                mac_command_layout(config.macs, config.acc_slots)))
            members[f"res{i}"] = Out(stream.Signature(
                mac_result_layout(config.macs, config.acc_slots)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.info = info = NPUInfo(self._config)
        wiring.connect(m, wiring.flipped(self.bus), info.bus)
        m.d.comb += self.irq.eq(info.irq)
        for i in range(self._config.cores):
            m.submodules[f"mac_array{i}"] = array = MacArray(self._config)
            wiring.connect(m, wiring.flipped(getattr(self, f"cmd{i}")), array.cmd)
            wiring.connect(m, array.res, wiring.flipped(getattr(self, f"res{i}")))
            m.d.comb += self.mac_error[i].eq(array.error)
        return m

"""Choice of the MAC array implementation by ``NPUConfig.mac_impl`` (``docs/mac.md``).

Every implementation has the contract of :class:`npu.neural.mac.MacArray` and gives the same
results; they differ in how they use an FPGA family's DSP blocks. Build a MAC array through
:func:`mac_array` so that the configuration decides.
"""

__all__ = ["MAC_UNIT_MODULE", "mac_array", "shared_mac_unit"]

#: Verilog module name of the MAC unit shared by all units of an array (:func:`shared_mac_unit`).
MAC_UNIT_MODULE = "npu_mac_unit"


def _generic(config, primitives, unit=None):
    from .mac import MacArray
    return MacArray(config, unit=unit)


def shared_mac_unit(config, shared):
    """The MAC unit of ``config`` from the library ``shared``
    (:class:`npu.lib.shared.SharedModules`), to be converted once and instantiated for every
    unit of the array (:func:`mac_array`'s ``unit``); ``None`` without a library or when
    ``config.mac_impl`` builds its array otherwise."""
    if shared is None or config.mac_impl != "generic":
        return None
    from .mac import MacUnit
    return shared.get(MAC_UNIT_MODULE, lambda: MacUnit(config))


def _ice40(config, primitives):
    from .mac_ice40 import Ice40MacArray, check_config
    check_config(config)    # before the component exists, so a refused one is not left unused
    return Ice40MacArray(config, primitives=primitives)


def _ecp5(config, primitives):
    from .mac_ecp5 import MacArrayECP5
    # MULT18X18D has no behavioural model in the Amaranth simulator: only an explicit
    # ``primitives=False`` gives the twin.
    return MacArrayECP5(config, primitive=primitives is not False)


def _ecp5_shared(config, primitives):
    from .mac_ecp5_shared import MacArrayECP5Shared
    # ``None``: the cell when elaborated for an ECP5 platform (npu synth, a board build), the
    # twin otherwise (the Amaranth simulator, Verilog for a simulation without cell models).
    return MacArrayECP5Shared(config, primitive=primitives)


#: Factory of each implementation built into this version, by ``mac_impl``.
_FACTORIES = {
    "generic": _generic,
    "ice40": _ice40,
    "ecp5": _ecp5,
    "ecp5_shared": _ecp5_shared,
}


def mac_array(config, *, primitives=None, unit=None):
    """The MAC array of ``config`` (``config.mac_impl`` chooses the implementation).

    ``primitives`` applies to implementations built on vendor primitives: ``True`` instantiates
    them, ``False`` uses their behavioural twins (the Amaranth simulator, Verilog simulated
    without vendor models), ``None`` decides by the platform the design is elaborated for.
    ``unit`` (Verilog output only) is :func:`shared_mac_unit`'s result: the units of the array
    are then instances of that one converted unit.
    """
    factory = _FACTORIES.get(config.mac_impl)
    if factory is None:
        raise ValueError(f"mac_impl {config.mac_impl!r} is not built into this version; "
                         f"available: {', '.join(_FACTORIES)}")
    if unit is not None:
        if factory is not _generic:
            raise ValueError(f"mac_impl {config.mac_impl!r} has no shared MAC unit")
        return _generic(config, primitives, unit)
    return factory(config, primitives)

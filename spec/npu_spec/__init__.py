"""The specification of the open NPU, in plain Python (no Amaranth, no numpy).

Every fact that more than one layer of the project needs is stated here once: the build
configuration and its presets, every register map, the task-descriptor format, the operation
and format codes, the rules that make an engine task valid, and the order in which each engine
consumes operands and produces results. The gateware (``npu``), the golden model
(``npu_model``), the harnesses (``npu_sim``), the FPGA flow (``npu_fpga``) and the compiler
read it; nothing here imports any of them.

============================ =====================================================================
module                       contents
============================ =====================================================================
:mod:`npu_spec.config`       :class:`NPUConfig`, the presets
:mod:`npu_spec.codes`        :func:`coded`: operation and format codes with a bit width
:mod:`npu_spec.regmap`       the register-map mechanism (fields, registers, maps, encoder)
:mod:`npu_spec.registers`    ``NPU_INFO``, the address windows, every map, ``docs/registers.md``
:mod:`npu_spec.engine`       what every engine shares: control registers, task-entry fields
:mod:`npu_spec.mac`          MAC operations and operand formats
:mod:`npu_spec.kernel`       the compressed kernel format's constants and error codes
:mod:`npu_spec.postproc`     the neural post-processor's codes, tables and generator
:mod:`npu_spec.neural`       the neural engine's registers, geometry, rules and result order
:mod:`npu_spec.planar`       the planar engine's registers, codes, rules and result order
:mod:`npu_spec.taskman`      the task manager's registers and exception causes
:mod:`npu_spec.descriptors`  the task-descriptor format, its encoder and strict decoder
:mod:`npu_spec.micro`        the micro build's register file: kept register blocks and rows
============================ =====================================================================
"""

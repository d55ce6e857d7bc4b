"""int8 ``Add``, ``Sub`` and ``Mul`` of two activations, with broadcast, and the activations
that are not a plain clamp of a layer (``docs/compiler.md``, "int8").

Both operands are int8 codes ``q`` with their own scales and zero points (0 when calibrated;
a quantized model's own otherwise); the result gets its scale ``s_y`` and zero point ``z_y``
(calibrated, or of the ``QuantizeLinear`` that reads it). On the planar engine (three tasks,
binary32 inside):

* ``Add`` / ``Sub``: each operand rescaled into binary16 by a gain-bias task (``(q - z) *
  (+-s / s_y)``, ``+ z_y`` on the full operand), then one ``add`` task rounds the sum to int8
  (RNE, saturating). ``Sub`` is the add of the second operand's negated rescale, whichever
  operand is broadcast.
* ``Mul``: the full operand copied into binary16 (``q - z``, exact), the other rescaled by
  ``s_a s_b / s_y``, then one ``mul`` task (the product of two binary16 values is exact in
  binary32) rounds to int8; with an output zero point the last task is ``z_y + a b``
  (``fma``, ``z_y`` a binary16 constant tensor made by a fourth task).

When the shapes differ, the operand of the output's shape is the full one and the other one
the planar engine's broadcast vector (``ops.bcast_layout``: per channel, per row, per column
or one element; a scalar tensor ``(1, 1, 1, 1)`` too). In the buffer the whole tensors are
viewed in the broadcast's ``(C, H, W)`` shape; in memory mode the full operand runs in boxes
with the part of the vector each needs (``ops.broadcast_op``), the three tasks in place.

The post-processor's piecewise-linear activations (``Sigmoid``, ``Tanh``, and ``Gelu``, also
fused into a ``Conv`` or ``Gemm``) need binary32 accumulators: an int8 tensor goes through a
depthwise 1x1 layer in the mixed format (int8 data x binary16 weight 1, bias ``-z``, the
input's scale as the post-processor's binary32 scale, the activation, binary16 out), then a
planar gain-bias by ``1 / s_y`` (plus ``z_y``) rounds it to int8. A fused one follows its
layer, computed with the calibrated scale of the tensor the activation read
(``Node.preact``).

Leaky ReLU (and a scalar-slope ``PRelu``) is one mixed-format depthwise layer: binary32
scale ``s_x / s_y``, the post-processor's leaky ReLU, int8 out with ``z_y`` (the int32 path
of an int8 layer has no leaky ReLU). ``PRelu`` with one slope per channel runs on the planar
engine: ``h`` the rescaled codes in binary16, ``p = relu(h)``, ``n = h - p``, then
``p + slope * n`` (``fma``, the binary16 slopes the per-channel broadcast vector) to int8.

The clamped ones are int8 layers (calibrated models): ``Clip`` (not fused into a conv) and
``HardSigmoid`` are a depthwise 1x1 layer ``x * m + a`` with the post-processor's clamp;
``HardSwish`` is that hard sigmoid (``x / 6 + 1/2`` clamped to ``[0, 1]``, into a tensor of
scale ``1 / 127``) times ``x``, a ``Mul`` of two activations.

:class:`EltwiseInt8` is the mixin of :class:`npu_compiler.int8._Int8` (and so of
:class:`npu_compiler.qdq._QDQ`, which gives the operands' and results' zero points) that
does it.
"""

import dataclasses

import numpy as np

from npu_model.builder import Dataset
from npu_spec import planar as planar_spec
from npu_spec.mac import MacFormat

from . import ops
from .compress import encode_kernels
from .graph import Node
from .lower import MAX_DIM, _f16, _f32bits

__all__ = ["BINARY_OPS", "CLAMP_OPS", "LEAKY_OPS", "PWL_OPS", "EltwiseInt8"]

#: Operators of two int8 activations this module lowers (and ``Div``, in calibrated models).
BINARY_OPS = ("Add", "Sub", "Mul")
#: Piecewise-linear activations as operators, and their post-processor functions.
PWL_OPS = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Gelu": "gelu"}
#: Clamped activations run as int8 layers.
CLAMP_OPS = ("Clip", "HardSigmoid", "HardSwish")
#: Negative-slope activations: a mixed-format layer (a scalar slope) or planar tasks (one
#: slope per channel).
LEAKY_OPS = ("LeakyRelu", "PRelu")


class EltwiseInt8:
    """int8 elementwise operators and activations (module docstring). The host class provides
    ``g``, ``b``, ``cfg``, ``ds``, ``scale``, ``memory``, ``row``, ``src``, ``view``,
    ``new_view``, ``out_scale``, ``fail``, ``conv``, ``place``, ``_check_layer`` and the
    memory mode's ``mem_conv``, ``mem_elementwise``, ``_resident``; a quantized model's
    lowering overrides :meth:`operand_params`, :meth:`result_params` and :meth:`record`."""

    def _binary_operands(self, node):
        """``(full, other, pqm, first)``: the operand of the output's shape, the other one,
        the ``(P, M, Q)`` broadcast pattern (None for equal shapes) and whether ``full`` is
        the first input."""
        g = self.g
        a, b = node.inputs
        sa, sb = tuple(g.shapes[a]), tuple(g.shapes[b])
        so = tuple(g.shapes[node.outputs[0]])
        if sa == sb == so:
            return a, b, None, True
        if sa == so:
            full, other, first = a, b, True
        elif sb == so:
            full, other, first = b, a, False
        else:
            self.fail(f"broadcast of {sa} and {sb} with neither the output's shape")
        pqm = ops._bcast_pattern(so, g.shapes[other])
        if pqm is None:
            self.fail(f"broadcast of {tuple(g.shapes[other])} over {so} (the smaller operand "
                      f"must vary over one block of axes)")
        return full, other, pqm, first

    def operand_params(self, name):
        """``(scale, zero point)`` of int8 activation ``name`` (calibrated: zero point 0)."""
        return self.scale[name], 0

    def result_params(self, node):
        """``(scale, zero point)`` of the result of ``node`` (its calibrated scale)."""
        return self.out_scale(node.outputs[0]), 0

    def record(self, out, s, z):
        """Tensor ``out`` has scale ``s`` and zero point ``z`` (0 here)."""
        self.scale[out] = s

    def _factors(self, node, full, other, first):
        """``(op, (k_f, b_f), (k_o, b_o), z_y)``: the planar operation, the gain and bias that
        take each operand's codes ``q`` to ``(q - z) s / s_y`` (the output's zero point added
        to the full operand's for ``Add`` / ``Sub``, negated for the second operand of a
        ``Sub``) and the output's zero point (:meth:`_elt_tasks`)."""
        s_y, z_y = self.result_params(node)
        (sf, zf), (so, zo) = self.operand_params(full), self.operand_params(other)
        if node.op == "Div":
            return "mul", (1.0, 0.0), (1.0, 0.0), 0
        if node.op == "Mul":
            k = sf * so / s_y
            return "mul", (1.0, float(-zf)), (k, 0.0 - zo * k), z_y
        sf = -sf if node.op == "Sub" and not first else sf
        so = -so if node.op == "Sub" and first else so
        return "add", (sf / s_y, z_y - zf * sf / s_y), (so / s_y, 0.0 - zo * so / s_y), 0

    def _elt_tasks(self, df, do, op, f, o, z_y=0, kind=None, in_place=False, recip=None):
        """The int8 result of ``op(k_f df + b_f, k_o do + b_o) + z_y`` (``f = (k_f, b_f)``,
        ``o`` likewise; ``do`` the broadcast vector of ``kind``, or a dataset of ``df``'s
        shape): ``df`` and ``do`` into binary16 (a copy for a gain of 1 and no bias, else a
        gain-bias), then ``op`` with one rounding to int8; a product with a zero point is
        ``z_y + o f`` (``fma``, ``z_y`` a binary16 constant tensor). ``in_place``: each task
        writes over its operand (scratch datasets). ``recip``: ``(first, scale)`` of a
        division, whose divisor (``df`` if ``first``, else ``do``) is replaced by its binary16
        reciprocals ``1 / (q scale)`` (:meth:`_reciprocal`) and then used as it is."""
        fp16, int8 = planar_spec.Fmt.FP16, planar_spec.Fmt.INT8
        results = []
        for i, (ds, (k, b)) in enumerate(((df, f), (do, o))):
            out = dataclasses.replace(ds, fmt="fp16") if in_place else None
            if recip is not None and recip[0] == (i == 0):
                t = self._reciprocal(ds, recip[1], in_place)
            elif op == "mul" and k == 1.0 and b == 0.0:
                t = self.b.planar(ds, out=out, mode="eltwise", op="copy", out_fmt=fp16)
            else:
                t = self.b.planar(ds, out=out, mode="eltwise", op="gain_bias", scale=k,
                                  bias=b, out_fmt=fp16)
            results.append(t)
        tf, to = results
        fields = {"bcast": kind} if kind else {}
        out = dataclasses.replace(tf, fmt="int8") if in_place else None
        if op == "mul" and z_y:
            zero = self.b.planar(tf, mode="eltwise", op="gain_bias", scale=0.0,
                                 bias=float(z_y), out_fmt=fp16)
            y = self.b.planar(zero, to, tf, out=out, mode="eltwise", op="fma", out_fmt=int8,
                              **fields)
            self.b.release(zero)
        else:
            y = self.b.planar(tf, to, out=out, mode="eltwise", op=op, out_fmt=int8, **fields)
        if not in_place:
            self.b.release(tf)
            self.b.release(to)
        return y

    def _division(self, node, first):
        """``(divisor is the full operand, scale)`` of a ``Div`` of two activations
        (``first``: the full operand is the dividend), else None. ``a / b`` is ``q_a`` times
        ``s_a / (q_b s_b s_y)``, the reciprocal of ``q_b`` times ``scale = s_b s_y / s_a``:
        one planar reduction gives it (:meth:`_reciprocal`), then one ``mul`` rounds
        ``q_a r`` to int8."""
        if node.op != "Div":
            return None
        (s_a, z_a), (s_b, z_b) = (self.operand_params(x) for x in node.inputs)
        s_y, z_y = self.result_params(node)
        if z_a or z_b or z_y:
            self.fail("Div of activations with zero points is not supported")
        return not first, s_b * s_y / s_a

    def _reciprocal(self, ds, scale, in_place=False):
        """binary16 ``1 / (q scale)`` of every code ``q`` of dense int8 dataset ``ds``: planar
        reductions (``sum`` over planes of one element, ``SCALE`` then the post-processor's
        correctly rounded reciprocal, ``docs/planar.md``), at most ``MAX_DIM`` elements a
        task; written over ``ds`` when ``in_place`` (element ``i`` after it is read), else
        into a new dataset. A code 0 gives infinity (the product saturates; ``0 / 0`` gives
        NaN, which becomes 0)."""
        c, h, w = ds.shape
        n = c * h * w
        if ds.slots or ds.rstride != w or ds.cstride != h * w:
            self.fail(f"a {ds.shape} divisor that is not dense in the buffer")
        r = ds if in_place else self.b.buffer((n, 1, 1), "fp16")
        for i in range(0, n, MAX_DIM):
            k = min(MAX_DIM, n - i)
            self.b.planar(Dataset(ds.addr + i, (k, 1, 1), ds.fmt),
                          out=Dataset(r.addr + i, (k, 1, 1), "fp16"), mode="reduce",
                          op="sum", axis="plane", scale=scale, post="recip",
                          out_fmt=planar_spec.Fmt.FP16)
        return Dataset(r.addr, (c, h, w), "fp16")

    def binary(self, node):
        """``Add``, ``Sub``, ``Mul``, ``Div`` of two activations in the buffer (in memory mode
        the equal-shaped ones per chunk through :meth:`mem_elementwise`)."""
        full, other, pqm, first = self._binary_operands(node)
        out = node.outputs[0]
        df, do = self.src(full), self.src(other)
        op, f, o, z_y = self._factors(node, full, other, first)
        recip = self._division(node, first)
        if pqm is None:
            if df.shape != do.shape:
                self.fail("both operands must be int8 activations of one shape")
            self.ds[out] = self._elt_tasks(df, do, op, f, o, z_y, recip=recip)
        else:
            kind, shape3, _ = ops.bcast_layout(node, pqm)
            y = self._elt_tasks(self._reshaped(df, shape3), self._reshaped(do, (1, 1, pqm[1])),
                                op, f, o, z_y, kind, recip=recip)
            self.ds[out] = self._reshaped(y, df.shape)
        self.record(out, *self.result_params(node))

    def _reshaped(self, ds, shape):
        """Dense dataset ``ds`` seen in ``shape`` (the same elements in raster order)."""
        c, h, w = ds.shape
        if ds.slots or ds.rstride != w or ds.cstride != h * w:
            self.fail(f"a {ds.shape} operand that is not dense in the buffer")
        if c * h * w != shape[0] * shape[1] * shape[2]:
            self.fail(f"a {ds.shape} operand seen as {shape}")
        return Dataset(ds.addr, tuple(shape), ds.fmt)

    def mem_binary(self, node):
        """:meth:`binary` with the activations in system memory."""
        full, other, pqm, first = self._binary_operands(node)
        if pqm is None:
            self.mem_elementwise(node, self.binary, 5)
            return
        out = node.outputs[0]
        op, f, o, z_y = self._factors(node, full, other, first)
        recip = self._division(node, first)
        vf, vo = self.view(full), self.view(other)
        out3 = self.new_view(out, vf.shape)

        def engine(da, dv, kind):
            return self._elt_tasks(da, dv, op, f, o, z_y, kind, in_place=True, recip=recip)

        ops.broadcast_op(self, node, op, vf, vo, out3, pqm, engine=engine,
                         per_element=2 if z_y else 1)
        self.record(out, *self.result_params(node))

    # ---- piecewise-linear activations ------------------------------------------------------

    def pwl_split(self, node):
        """``(layer, activation)``: a ``Conv`` or ``Gemm`` with a fused piecewise-linear
        activation as the layer alone (writing the tensor the activation read) and the
        activation as a node of its own; None for any other node."""
        act = node.fused or {}
        kind = act.get("act")
        op = {v: k for k, v in PWL_OPS.items()}.get(kind, "LeakyRelu" if kind == "leaky"
                                                     else None)
        if op is None:
            return None
        if not node.preact:
            self.fail(f"the fused activation {kind} has no input tensor to calibrate")
        layer = dataclasses.replace(node, outputs=[node.preact], fused={}, preact="")
        attrs = {"alpha": float(act["alpha"])} if kind == "leaky" else {}
        return layer, Node(op, node.name, [node.preact], list(node.outputs), attrs)

    def pwl_node(self, node):
        """A piecewise-linear activation or leaky ReLU node, whole or (memory mode) in
        chunks."""
        fn = self.op_LeakyRelu if node.op == "LeakyRelu" else self.op_Sigmoid
        if self.memory:
            self.mem_elementwise(node, fn, 3)
        else:
            fn(node)

    def op_Sigmoid(self, node):
        """``Sigmoid``, ``Tanh``, ``Gelu`` of an int8 activation (module docstring)."""
        x, out = node.inputs[0], node.outputs[0]
        kind = PWL_OPS[node.op]
        if node.op == "Gelu" and node.attr("approximate", "none") != "none":
            self.fail("the tanh approximation of Gelu is not supported")
        if "mixed" not in self.cfg.formats:
            self.fail(f"{node.op} in int8 needs the int8 x binary16 (mixed) datapath, which "
                      f"preset {self.cfg.name!r} has not")
        ds = self.src(x)
        s_x, z_x = self.operand_params(x)
        s_y, z_y = self.result_params(node)
        blob = self._pwl_blob(ds.shape[0], s_x, z_x)
        places = self._resident(blob) if self.memory else self.place(blob, 1)
        h = self.b.conv(ds, places[0], act=kind, out_fp16=True)
        self._check_layer(ds, blob, h, 1, 0, 1, ds.shape[0], fmt=MacFormat.I8F16, out_fp16=1)
        y = self.b.planar(h, mode="eltwise", op="gain_bias", scale=1.0 / s_y,
                          bias=float(z_y), out_fmt=planar_spec.Fmt.INT8)
        self.b.release(h)
        self.ds[out] = y
        self.record(out, s_y, z_y)

    op_Tanh = op_Gelu = op_Sigmoid

    def _pwl_blob(self, c, s_in, z_in=0):
        """The kernels of the mixed depthwise layer of :meth:`op_Sigmoid` (and
        :meth:`op_LeakyRelu`): weight 1 (binary16), bias ``-z_in`` and scale ``s_in``
        (binary32), for ``c`` channels."""
        key = ("pwl", c, float(s_in), int(z_in))
        if key not in self._requant:
            blob, raw_bytes, choice = encode_kernels(
                _f16(np.ones((c, 1, 1, 1))), fmt=MacFormat.I8F16,
                bias=_f32bits(np.full(c, 0.0 - z_in)),
                scale=_f32bits(np.full(c, s_in)), groups=c, slots=self.cfg.acc_slots,
                raw=self.compression.raw, extract=self.cfg.kernel_extract)
            self._raw[id(blob)] = raw_bytes
            self._requant[key] = (choice, blob)
        choice, blob = self._requant[key]
        names = set(filter(None, self.row["kernel_encoding"].split(", ")))
        self.row["kernel_encoding"] = ", ".join(sorted(names | {choice.name(blob.fmt)}))
        if not self.memory:
            self.row["kernel_raw_bytes"] += self._raw[id(blob)]
        return blob

    # ---- negative-slope activations --------------------------------------------------------

    def _needs_mixed(self, node):
        if "mixed" not in self.cfg.formats:
            self.fail(f"{node.op} in int8 needs the int8 x binary16 (mixed) datapath, which "
                      f"preset {self.cfg.name!r} has not")

    def op_LeakyRelu(self, node, alpha=None):
        """Leaky ReLU of slope ``alpha`` (the node's attribute by default) of an int8
        activation: one mixed-format depthwise 1x1 layer (int8 data x binary16 weight 1, bias
        ``-z_x``), the post-processor's binary32 scale ``s_x / s_y``, its leaky ReLU with the
        slope rounded to binary32, and int8 out (round half to even, ``+ z_y``, saturated):
        one rounding. Leaky ReLU commutes with the positive scale, so the slope applies to
        the rescaled value."""
        self._needs_mixed(node)
        x, out = node.inputs[0], node.outputs[0]
        alpha = float(node.attr("alpha", 0.01) if alpha is None else alpha)
        ds = self.src(x)
        s_x, z_x = self.operand_params(x)
        s_y, z_y = self.result_params(node)
        blob = self._pwl_blob(ds.shape[0], s_x / s_y, z_x)
        places = self._resident(blob) if self.memory else self.place(blob, 1)
        y = self.b.conv(ds, places[0], act="leaky", alpha=alpha, out_fp16=False,
                        zero_point=z_y)
        self._check_layer(ds, blob, y, 1, 0, 1, ds.shape[0], fmt=MacFormat.I8F16)
        self.ds[out] = y
        self.record(out, s_y, z_y)

    def op_PRelu(self, node):
        """``PRelu`` with a constant slope: a scalar is :meth:`op_LeakyRelu`; one slope per
        channel runs on the planar engine (:meth:`_prelu_tasks`)."""
        x = node.inputs[0]
        slope = self.g.const(node.inputs[1])
        if slope is None:
            self.fail("the slope must be a constant")
        slope = np.asarray(slope, np.float64)
        if slope.size == 1:
            self.pwl_like(node, alpha=float(slope.reshape(-1)[0]))
            return
        shape = tuple(self.g.shapes[x])
        # One slope per channel: (C,), (C, 1, 1) or (1, C, 1, 1) over a (1, C, H, W) tensor.
        per_channel = (len(shape) == 4 and slope.size == shape[1]
                       and (slope.ndim == 1 or (slope.ndim <= 4 and slope.shape[-2:] == (1, 1)
                                                and slope.shape[-3] == shape[1])))
        if not per_channel:
            self.fail(f"a slope of shape {slope.shape} over {shape} (a scalar or one slope per "
                      f"channel only)")
        codes = _f16(slope.reshape(-1))
        name = f"{node.name}:slope"
        t = self.b.tensor(f"{name}:{len(self.b.tensors)}", (1, 1, shape[1]), "fp16",
                          "constant", codes.reshape(1, 1, -1))
        vec = self.b.load(t)
        if self.memory:
            self._mem_prelu(node, vec)
        else:
            out = node.outputs[0]
            self.ds[out] = self._prelu_tasks(node, self.src(x, conv=True), vec)
            self.record(out, *self.result_params(node))
        self.b.release(vec)

    def pwl_like(self, node, alpha):
        """A scalar-slope ``PRelu`` as a leaky ReLU node (whole, or in memory mode in
        chunks)."""
        leaky = Node("LeakyRelu", node.name, [node.inputs[0]], list(node.outputs),
                     {"alpha": alpha})
        self.pwl_node(leaky)

    def _prelu_tasks(self, node, dx, vec, in_place=False):
        """``PRelu`` of int8 dataset ``dx`` with ``vec`` the ``(1, 1, C)`` binary16 slopes of
        its channels; four planar tasks: ``h = (q - z_x) s_x / s_y`` to binary16,
        ``p = relu(h)``, ``n = h - p`` (exact: the negative part), then ``p + slope * n``
        (``fma``, the slope the channel's broadcast vector) rounded to int8. ``in_place``:
        ``h`` is written over ``dx`` and the result over ``p``."""
        fp16, int8 = planar_spec.Fmt.FP16, planar_spec.Fmt.INT8
        s_x, z_x = self.operand_params(node.inputs[0])
        s_y, z_y = self.result_params(node)
        if z_y:
            self.fail("PRelu with an output zero point is not supported")
        k = s_x / s_y
        h = self.b.planar(dx, out=dataclasses.replace(dx, fmt="fp16") if in_place else None,
                          mode="eltwise", op="gain_bias", scale=k, bias=0.0 - z_x * k,
                          out_fmt=fp16)
        p = self.b.planar(h, mode="eltwise", op="relu", out_fmt=fp16)
        n = self.b.planar(h, p, out=h, mode="eltwise", op="sub", out_fmt=fp16)
        y = self.b.planar(p, vec, n, out=dataclasses.replace(p, fmt="int8"), mode="eltwise",
                          op="fma", bcast="channel", out_fmt=int8)
        if not in_place:
            self.b.release(n)
        return y

    def _mem_prelu(self, node, vec):
        """:meth:`_prelu_tasks` with the activation in system memory, in boxes of channels and
        rows, each with its channels' part of the slopes ``vec`` (loaded once)."""
        x, out = node.inputs[0], node.outputs[0]
        v = self.view(x)
        out3 = self.new_view(out, v.shape)
        c, h, w = v.shape
        for c0, c1, h0, h1 in ops._boxes(v.shape, (self.buf_size - c) // 2):
            dx = self.buffer((c1 - c0, h1 - h0, w))
            self.load3(ops._view3(v, c0, c1, h0, h1), dx)
            part = Dataset(vec.addr + c0, (1, 1, c1 - c0), "fp16")
            y = self._prelu_tasks(node, dx, part, in_place=True)
            self.store3(y, ops._view3(out3, c0, c1, h0, h1))
            self.release(dx, y)
        self.record(out, *self.result_params(node))

    # ---- clamped activations ---------------------------------------------------------------

    def clamped(self, x, out, mul, add, lo, hi):
        """``clamp(x * mul + add, lo, hi)`` of activation ``x`` into ``out`` (its scale):
        a depthwise 1x1 layer with the post-processor's clamp (one rounding)."""
        c = (self.view(x) if self.memory else self.src(x, conv=True)).shape[0]
        w = np.full((c, 1, 1, 1), float(mul))
        bias = np.full(c, float(add))
        act = ("clip", float(lo), float(hi))
        if self.memory:
            self.mem_conv(x, out, w, bias, act, groups=c, model=False)
        else:
            self.conv(x, out, w, bias, act, groups=c, model=False)

    def op_Clip(self, node):
        from .frontend import activation
        act = activation(self.g, node)
        if act is None:
            self.fail("the bounds must be constants")
        self.clamped(node.inputs[0], node.outputs[0], 1.0, 0.0, act["lo"], act["hi"])

    def op_HardSigmoid(self, node):
        self.clamped(node.inputs[0], node.outputs[0], node.attr("alpha", 0.2),
                     node.attr("beta", 0.5), 0.0, 1.0)

    def op_HardSwish(self, node):
        x, out = node.inputs[0], node.outputs[0]
        gate = f"{out}:hardsigmoid"
        self.g.shapes[gate] = self.g.shapes[x]
        self.scales = {**self.scales, gate: 1.0 / 127}
        self.clamped(x, gate, 1.0 / 6, 0.5, 0.0, 1.0)
        mul = Node("Mul", node.name, [x, gate], [out])
        if self.memory:
            self.mem_binary(mul)
        else:
            self.binary(mul)

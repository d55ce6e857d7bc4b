"""Quantized ONNX models compiled with their own scales (``docs/quantization.md``, "Quantized
models").

Two forms are taken, and may be mixed in one model:

- **QDQ**: ``QuantizeLinear`` / ``DequantizeLinear`` around float operators, as
  ``onnxruntime.quantization.quantize_static(quant_format=QuantFormat.QDQ)`` writes them.
- **operator-oriented**: ``QLinearConv``, ``QLinearMatMul``, ``ConvInteger`` and
  ``MatMulInteger`` (the last two followed by ``Cast``, a ``Mul`` by a constant scale, an
  optional ``Add`` of a constant bias, an optional ``Relu`` / ``Clip``, and a
  ``QuantizeLinear``).

Every integer tensor lives in the buffer as int8 codes; a ``uint8`` tensor is stored as
``code - 128`` with its zero point lowered by 128, so ``(q - z) * s`` keeps its value. A float
tensor made by ``DequantizeLinear`` is the same codes with the dequantizer's scale and zero
point. A convolution (or a matrix product) becomes a *pending accumulator*: int8 weights
(the weight zero point subtracted, which must leave them in [-128, 127]), an int32 bias in
accumulator units and the real value of one accumulator unit per output channel. ``Relu``,
``Clip``, ``Mul`` and ``Add`` by constants fold into it; the ``QuantizeLinear`` that follows
gives the output scale and zero point, and the layer is emitted with the post-processor's
multiplier and shift for ``unit / out_scale``, its zero point and its clamp (``Add``,
``Sub``, ``Mul`` of two int8 tensors run on the planar engine through binary16, ``Sigmoid``,
``Tanh``, ``Gelu`` as a mixed-format layer: :mod:`npu_compiler.int8elt`). ``Relu`` or
``Clip`` on an int8 tensor, and a ``QuantizeLinear`` that changes a tensor's scale or zero
point, are a 1x1 depthwise layer of weight 1 (exact when nothing changes; one rounding
otherwise, as onnxruntime's).

A non-zero input zero point is folded into the bias (``- z_x * sum(q_w)`` per channel); a
padded layer reads a copy of its input with a border of ``z_x`` (two planar tasks), because
the neural engine pads with code 0.
"""

from dataclasses import dataclass, replace

import numpy as np

from npu_model.builder import BuildError
from npu_spec.program import dense_strides

from .graph import CompileError
from .int8 import SHAPE_OPS, _Int8, _shape3
from .int8elt import BINARY_OPS, PWL_OPS
from .int8mem import NeedsMemory
from .lower import MView
from .quant import QuantizedConv, requantize_params, weight_scales

__all__ = ["FOREIGN_OPS", "QUANT_OPS", "QDQ_OPS", "lower_qdq", "prepare", "quantized_node"]

#: Operators of onnxruntime's ``com.microsoft`` domain taken in quantized models
#: (``quantize_static`` writes ``QGemm`` for a ``Gemm`` in the QOperator format).
FOREIGN_OPS = ("QGemm",)

#: Operators that make a model a quantized one (compiled with its own scales).
QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger")
#: Operators of a quantized model the int8 lowering takes.
QDQ_OPS = QUANT_OPS + ("QGemm", "Conv", "Gemm", "MatMul", "Relu", "Clip", "Cast", "Mul", "Add",
                       "Sub", "MaxPool", "GlobalAveragePool", "LeakyRelu") + tuple(PWL_OPS) \
    + SHAPE_OPS

_INT_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def quantized_node(model):
    """The first node of ``model`` (a ``ModelProto``) that makes it a quantized model, as
    ``"name (op)"``, or None."""
    for n in model.graph.node:
        if (n.op_type in QUANT_OPS and n.domain in ("", "ai.onnx")) or (
                n.op_type in FOREIGN_OPS and n.domain == "com.microsoft"):
            return f"{n.name or n.output[0]!r} ({n.op_type})"
    return None


def prepare(model):
    """``model`` with the output shapes of its ``com.microsoft.QGemm`` nodes declared (the
    onnx package's shape inference does not know them): ``(M, N)`` from ``A`` and ``B``,
    typed like ``y_zero_point``."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference
    if not any(n.op_type in FOREIGN_OPS for n in model.graph.node):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for _ in range(len(m.graph.node)):
        m = shape_inference.infer_shapes(m)
        known = {vi.name: vi for vi in list(m.graph.value_info) + list(m.graph.input)}
        added = False
        for n in m.graph.node:
            if n.op_type != "QGemm" or n.output[0] in known or n.input[0] not in known:
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            a = [d.dim_value for d in known[n.input[0]].type.tensor_type.shape.dim]
            b = inits.get(n.input[3])
            zp = inits.get(n.input[8]) if len(n.input) > 8 else None
            if b is None or zp is None or len(a) != 2:
                continue
            rows = a[1] if attrs.get("transA", 0) else a[0]
            cols = b.shape[0] if attrs.get("transB", 0) else b.shape[1]
            m.graph.value_info.append(helper.make_tensor_value_info(
                n.output[0], helper.np_dtype_to_tensor_dtype(zp.dtype), [rows, cols]))
            added = True
        if not added:
            break
    return m


@dataclass
class Pending:
    """A convolution whose int32 accumulator is not yet rescaled to int8: ``x`` the input
    tensor, ``z_x`` its zero point (int8 domain), ``weights`` int ``[K, C/g, KH, KW]``,
    ``bias`` ``[K]`` in accumulator units (float64, integral unless a float bias was
    added), ``unit`` the real value of one accumulator unit per channel, ``act`` ``(lo,
    hi)`` real bounds or None, the geometry, ``node`` the operator it comes from, and
    ``own`` the ``(scale, zero point)`` it is emitted with when used without a
    ``QuantizeLinear`` (a ``Relu`` / ``Clip`` of an int8 tensor), else None."""
    x: str
    z_x: int
    weights: np.ndarray
    bias: np.ndarray
    unit: np.ndarray
    node: object
    act: tuple = None
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1
    own: tuple = None


class _QDQ(_Int8):
    OPS = QDQ_OPS

    def __init__(self, graph, config, name, cores=None, schedule="depth-first"):
        super().__init__(graph, config, {}, name, cores=cores, chain=False,
                         schedule=schedule)
        self.zp = {}        # tensor -> int8-domain zero point
        self.qconst = {}    # DequantizeLinear output of a constant -> (q, scale, zp, axis)
        self.pend = {}      # tensor -> Pending
        self.dtype = {}     # integer graph input/output -> numpy dtype name

    def fail(self, why):
        raise CompileError(f"{self.node}: {why} (quantized model)")

    # ---- tensors ---------------------------------------------------------------------------

    def _int_type(self, tensor):
        dt = np.dtype(self.g.dtypes.get(tensor, np.float32))
        if dt not in _INT_TYPES:
            self.fail(f"tensor {tensor!r} has type {dt.name}; the NPU takes int8 and uint8 "
                      f"tensors")
        return dt

    def _scalar_params(self, node, k_scale, k_zp, tensor):
        """The per-tensor ``(scale, int8-domain zero point)`` of inputs ``k_scale`` and
        ``k_zp`` of ``node`` for integer tensor ``tensor``."""
        s = self._const(node, k_scale)
        z = self._const(node, k_zp, optional=True)
        if s.size != 1 or (z is not None and z.size != 1):
            self.fail(f"per-axis scales on activation {tensor!r}: activations need one scale "
                      f"and zero point")
        s = float(s.reshape(-1)[0])
        if not (np.isfinite(s) and s > 0):
            self.fail(f"scale {s} of {tensor!r} must be positive and finite")
        dt = np.dtype(z.dtype) if z is not None else self._int_type(tensor)
        if dt not in _INT_TYPES:
            self.fail(f"zero point of {tensor!r} has type {dt.name}; int8 and uint8 only")
        z = 0 if z is None else int(z.reshape(-1)[0])
        return s, z - 128 if dt == np.uint8 else z

    def _const(self, node, k, optional=False):
        name = node.inputs[k] if len(node.inputs) > k else ""
        if not name:
            if optional:
                return None
            self.fail(f"input {k} is missing")
        c = self.g.const(name)
        if c is None:
            self.fail(f"input {name!r} must be a constant")
        return np.asarray(c)

    def src(self, name, conv=False):
        if name in self.pend:
            p = self.pend.pop(name)
            if p.own is None:
                self.fail(f"the accumulator of {p.node} is used without a QuantizeLinear "
                          f"that gives its int8 scale")
            self.emit(p, name, *p.own)
        return super().src(name, conv)

    def act3(self, name):
        """The buffer dataset or (in memory mode) the system-memory view of int8 tensor
        ``name``."""
        return self.mv[name] if self.memory else self.ds[name]

    def rename(self, x, out, s, z):
        """``out`` is the codes of ``x`` with scale ``s`` and zero point ``z`` (no task)."""
        if self.memory:
            self.mv[out] = self.mv[x]
        else:
            self.ds[out] = self.ds[x]
        self.scale[out], self.zp[out] = s, z

    def operand_params(self, name):
        return self.params(name)

    def result_params(self, node):
        """``(scale, zero point)`` of the one ``QuantizeLinear`` that reads ``node``'s float
        result (an elementwise result or an activation is quantized where onnxruntime
        quantizes it)."""
        out = node.outputs[0]
        qs = self.g.consumers(out)
        if len(qs) != 1 or qs[0].op != "QuantizeLinear" or out in self.g.outputs:
            self.fail("the result must go to one QuantizeLinear")
        return self._scalar_params(qs[0], 1, 2, qs[0].outputs[0])

    def record(self, out, s, z):
        self.scale[out], self.zp[out] = s, z

    def _of_tensors(self, node):
        """Whether ``node`` (``Add``, ``Mul``) reads two int8 tensors, not an accumulator
        and a constant."""
        return not [x for x in node.inputs if x in self.pend and self.pend[x].own is None] \
            and all(self.g.const(x) is None for x in node.inputs)

    def params(self, name):
        if self.scale.get(name) is None:
            self.fail(f"tensor {name!r} has no scale (no DequantizeLinear or QuantizeLinear "
                      f"gives one)")
        return self.scale[name], self.zp[name]

    def segment_layer(self, g, i, node):
        """Depth first in memory mode (:func:`npu_compiler.depthfirst.segments`): a
        ``QuantizeLinear`` that emits a pending ``Conv`` (through ``Relu`` / ``Clip``) is the
        layer, its bands the convolution's, reading the int8 tensor the ``Conv``'s input
        ``DequantizeLinear`` renames; that ``DequantizeLinear``, the weights' and bias's,
        the ``Conv`` and the activations are lowered with it (``aux``, no tasks). None for
        any other node (it runs layer by layer)."""
        from .depthfirst import conv_layer

        def only(t, op):
            p = g.producer(t)
            ok = p is not None and p.op in op and len(g.consumers(t)) == 1 \
                and t not in g.outputs
            return p if ok else None

        if node.op != "QuantizeLinear" or not node.outputs or not g.is_float(node.inputs[0]):
            return None
        chain, p = [], only(node.inputs[0], ("Relu", "Clip", "Conv"))
        while p is not None and p.op != "Conv":
            chain.append(p)
            p = only(p.inputs[0], ("Relu", "Clip", "Conv"))
        if p is None or len(p.inputs) < 2:
            return None
        deq = [g.producer(t) for t in p.inputs if t]
        if any(d is None or d.op != "DequantizeLinear" for d in deq) \
                or g.const(deq[0].inputs[0]) is not None \
                or any(g.const(d.inputs[0]) is None for d in deq[1:]):
            return None
        w = np.shape(g.const(deq[1].inputs[0]))
        layer = conv_layer(g, i, p, deq[0].inputs[0], w, node.outputs[0])
        index = {id(n): k for k, n in enumerate(g.nodes)}
        return layer, tuple(index[id(n)] for n in deq + [p] + chain)

    # ---- inputs and outputs ----------------------------------------------------------------

    def load_input(self, name):
        g = self.g
        s3 = _shape3(g.shapes[name])
        if s3 is None:
            raise CompileError(f"input {name!r} ({tuple(g.shapes[name])}) must be a (1, C, H, "
                               f"W) or (1, N) tensor")
        t = self.b.input(name, np.zeros(s3, np.int8))
        if g.is_float(name):
            qs = [n for n in g.consumers(name) if n.op == "QuantizeLinear"]
            if not qs or len(qs) != len(g.consumers(name)):
                raise CompileError(f"float input {name!r} must go to QuantizeLinear nodes only")
            self.node = qs[0]
            s, z = self._scalar_params(qs[0], 1, 2, qs[0].outputs[0])
        else:
            self.node = f"input {name!r}"
            self.dtype[name] = self._int_type(name).name
            s, z = None, None
        self.scale[name], self.zp[name] = s, z
        if self.memory:
            self.mv[name] = MView(t.addr, s3, dense_strides(s3, "int8"))
            return
        try:
            self.ds[name] = self.b.load(t)
        except BuildError as e:
            self.needs_memory(f"input {name!r}: {e}")

    def mem_node(self, node):
        """``node`` in memory mode: ``Add`` of two tensors per chunk (:meth:`_add_tensors`),
        ``MaxPool`` in bands, shape operators as aliases, the rest as in the buffer."""
        op = node.op
        if op in SHAPE_OPS:
            self.mem_alias(node)
            self.zp[node.outputs[0]] = self.zp[node.inputs[0]]
        elif op == "MaxPool":
            x = node.inputs[0]
            self.src(x)
            if len([o for o in node.outputs if o]) > 1:
                self.fail("the indices output is not supported")
            self.mem_pool(node, True)
            self.zp[node.outputs[0]] = self.zp[x]
        elif op in BINARY_OPS and self._of_tensors(node):
            for x in node.inputs:
                self.src(x)
            self.mem_binary(node)
        elif op in PWL_OPS or op == "LeakyRelu":
            self.src(node.inputs[0])
            self.pwl_node(node)
        else:
            getattr(self, "op_" + op)(node)

    def mem_outputs(self):
        for name in self.g.outputs:
            if name in self.pend:
                self.src(name)
            if not self.g.is_float(name):
                self.dtype[name] = self._int_type(name).name
            elif self.scale.get(name) is None:
                raise CompileError(f"output {name!r} has no scale")
        super().mem_outputs()

    def output_dataset(self, name):
        if name in self.pend:
            self.src(name)
        if not self.g.is_float(name):
            self.dtype[name] = self._int_type(name).name
        elif self.scale.get(name) is None and name in self.ds:
            raise CompileError(f"output {name!r} has no scale")
        return super().output_dataset(name)

    def _release(self, i, last):
        keep = {p.x for p in self.pend.values()}
        for n in keep:
            last[n] = max(last.get(n, -1), i + 1)
        super()._release(i, last)

    def _end_row(self):
        """Plan rows: none for a node that only renames codes (a ``QuantizeLinear`` or
        ``DequantizeLinear`` without a task, a weight's ``DequantizeLinear``) or that leaves
        a pending accumulator (its layer is the row of the ``QuantizeLinear`` that emits
        it, named after the layer's node)."""
        node = self.node
        if node.op in ("QuantizeLinear", "DequantizeLinear") \
                and len(self.b.tasks) == self.row["first_task"]:
            return
        if any(o in self.pend for o in node.outputs):
            return
        super()._end_row()

    # ---- emission --------------------------------------------------------------------------

    def emit(self, p, out, s_y, z_y):
        """Emit pending accumulator ``p`` as int8 tensor ``out`` of scale ``s_y`` and
        int8-domain zero point ``z_y``."""
        w = np.asarray(p.weights, np.int64)
        bias = np.rint(p.bias - p.z_x * w.reshape(w.shape[0], -1).sum(axis=1))
        if np.any(bias < INT32_MIN) or np.any(bias > INT32_MAX):
            self.fail(f"the bias of {p.node} does not fit int32 in accumulator units")
        try:
            mult, shift = requantize_params(p.unit / s_y)
        except ValueError as e:
            self.fail(str(e))
        act, lo, hi = "none", -128, 127
        if p.act is not None:
            lo8, hi8 = (int(np.clip(np.rint(np.float64(v) / s_y) + z_y, -128, 127))
                        if np.isfinite(v) else (-128 if v < 0 else 127) for v in p.act)
            act, lo, hi = ("relu", -128, 127) if p.act == (0.0, np.inf) else ("clamp", lo8, hi8)
        q = QuantizedConv(w.astype(np.int8), bias.astype(np.int64), mult, shift, act, lo, hi,
                          1.0, float(s_y), p.unit, p.unit / s_y, int(z_y))
        if self.memory:
            self.mem_conv_quantized(p.x, out, q, (p.stride,) * 2, (p.pad,) * 4, p.dilation,
                                    p.groups, fill=p.z_x)
            self.scale[out], self.zp[out] = float(s_y), int(z_y)
            return
        src = self.ds[p.x]
        pad = p.pad
        if p.z_x != 0 and pad:
            src, pad = self._padded(src, pad, p.z_x), 0
        blob = self.kernels(q, p.groups)
        dst = self.b.conv(src, self.place(blob), stride=p.stride, pad=pad,
                          dilation=p.dilation, **q.conv_args())
        self._check_layer(src, blob, dst, p.stride, pad, p.dilation, p.groups)
        if src is not self.ds[p.x]:
            self.b.release(src)
        self.ds[out], self.scale[out], self.zp[out] = dst, float(s_y), int(z_y)

    def _padded(self, src, pad, z):
        """A copy of ``src`` with a border of ``pad`` codes ``z`` (planar engine: fill, then
        copy the interior; both exact on int8 codes)."""
        c, h, w = src.shape
        big = self.b.buffer((c, h + 2 * pad, w + 2 * pad), "int8")
        self.b.planar(big, out=big, mode="eltwise", op="gain_bias", scale=0.0, bias=float(z))
        inner = replace(big, addr=big.addr + pad * big.rstride + pad, shape=(c, h, w))
        self.b.planar(src, out=inner, mode="eltwise", op="gain_bias", scale=1.0, bias=0.0)
        return big

    def _identity(self, x, act=None, own=True):
        """A pending 1x1 depthwise layer of weight 1 on int8 tensor ``x``."""
        s, z = self.params(x)
        c = self.act3(x).shape[0]
        return Pending(x, z, np.ones((c, 1, 1, 1), np.int64), np.zeros(c), np.full(c, s),
                       self.node, act, groups=c, own=(s, z) if own else None)

    # ---- quantize and dequantize -----------------------------------------------------------

    def op_QuantizeLinear(self, node):
        x, out = node.inputs[0], node.outputs[0]
        s, z = self._scalar_params(node, 1, 2, out)
        if node.attr("saturate", 1) != 1 or node.attr("output_dtype", 0):
            self.fail("only the default saturate and output_dtype are supported")
        if x in self.pend and len(self.g.consumers(x)) == 1 and x not in self.g.outputs:
            p = self.pend.pop(x)
            shape = self.g.shapes.get(p.x, self.act3(p.x).shape)
            self.row.update(op=p.node.op, node=p.node.name, **{"in": [list(shape)]})
            self.emit(p, out, s, z)
            return
        self.src(x)
        if self.params(x) == (s, z):
            self.rename(x, out, s, z)
            return
        self.emit(self._identity(x, own=False), out, s, z)

    def op_DequantizeLinear(self, node):
        x, out = node.inputs[0], node.outputs[0]
        if node.attr("block_size", 0):
            self.fail("blocked quantization is not supported")
        q = self.g.const(x)
        if q is not None:
            s = np.asarray(self._const(node, 1), np.float64)
            z = self._const(node, 2, optional=True)
            z = np.zeros(1, np.int64) if z is None else np.asarray(z, np.int64)
            self.qconst[out] = (np.asarray(q, np.int64), s, z, int(node.attr("axis", 1)))
            return
        self._int_type(x)
        self.src(x)
        s, z = self._scalar_params(node, 1, 2, x)
        self.rename(x, out, s, z)

    # ---- weights ---------------------------------------------------------------------------

    def _per_channel(self, v, axis, shape, out_axis, what):
        """``v`` (a scalar or a vector along ``axis`` of a tensor of ``shape``) as one value
        per output channel (axis ``out_axis``)."""
        v = np.asarray(v).reshape(-1)
        k = shape[out_axis]
        if v.size == 1:
            return np.full(k, v[0])
        if axis % len(shape) != out_axis or v.size != k:
            self.fail(f"per-axis {what} along axis {axis} of a weight of shape {shape}: the "
                      f"NPU takes them along the output-channel axis {out_axis}")
        return v

    def weights(self, name, out_axis):
        """``(int weights with the zero point subtracted, per-channel scales)`` of weight
        ``name`` (a dequantized constant, or a float constant quantized here symmetrically
        per channel)."""
        if name in self.qconst:
            q, s, z, axis = self.qconst[name]
            s = self._per_channel(s, axis, q.shape, out_axis, "scales")
            z = self._per_channel(z, axis, q.shape, out_axis, "zero points")
            shape = [1] * q.ndim
            shape[out_axis] = -1
            w = q - z.reshape(shape)
            if w.min(initial=0) < -128 or w.max(initial=0) > 127:
                self.fail(f"weight {name!r} minus its zero point leaves int8 (the weight zero "
                          f"point must keep q - z in [-128, 127])")
            return w, s.astype(np.float64)
        w = self.g.const(name)
        if w is None:
            self.fail(f"weight {name!r} must be a constant")
        w = np.moveaxis(np.asarray(w, np.float64), out_axis, 0)
        s = weight_scales(w)
        q = np.clip(np.rint(w / s.reshape((-1,) + (1,) * (w.ndim - 1))), -127, 127)
        return np.moveaxis(q.astype(np.int64), 0, out_axis), s

    def bias(self, name, unit):
        """Bias ``name`` (or None) in accumulator units of ``unit`` per channel."""
        k = unit.size
        if not name:
            return np.zeros(k)
        if name in self.qconst:
            q, s, z, axis = self.qconst[name]
            s = self._per_channel(s, axis, q.shape, 0, "bias scales")
            q = (q - self._per_channel(z, axis, q.shape, 0, "bias zero points")).reshape(-1)
            if np.allclose(s, unit, rtol=1e-6, atol=0):
                return q.astype(np.float64)
            return np.rint(q * s / unit)
        b = self.g.const(name)
        if b is None:
            self.fail(f"bias {name!r} must be a constant")
        b = np.asarray(b, np.float64).reshape(-1)
        if b.size != k:
            self.fail(f"the bias has {b.size} values, the layer {k} channels")
        return np.rint(b / unit)

    # ---- convolutions ----------------------------------------------------------------------

    def _geometry(self, node, kdims):
        strides = list(node.attr("strides", [1] * kdims))
        dil = list(node.attr("dilations", [1] * kdims))
        pads = list(node.attr("pads", [0] * 2 * kdims))
        if kdims != 2:
            self.fail(f"{kdims}-D convolution is not supported")
        if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            self.fail("auto_pad SAME is not supported")
        if len(set(strides)) != 1 or len(set(dil)) != 1 or len(set(pads)) != 1:
            self.fail(f"strides {strides}, dilations {dil}, pads {pads} must each be equal "
                      f"in every direction")
        return {"stride": strides[0], "pad": pads[0], "dilation": dil[0],
                "groups": int(node.attr("group", 1))}

    def _conv(self, node, x, z_x, w, unit, bias):
        self.src(x, conv=True)
        self.pend[node.outputs[0]] = Pending(x, z_x, w, bias, unit, node, None,
                                             **self._geometry(node, w.ndim - 2))

    def op_Conv(self, node):
        x = node.inputs[0]
        self.src(x, conv=True)
        s_x, z_x = self.params(x)
        w, s_w = self.weights(node.inputs[1], 0)
        unit = s_x * s_w
        self._conv(node, x, z_x, w, unit, self.bias(node.inputs[2] if len(node.inputs) > 2
                                                    else "", unit))
        self._fold_act(node.outputs[0], self._act(node))

    def op_QLinearConv(self, node):
        x = node.inputs[0]
        self.src(x, conv=True)
        s_x, z_x = self._scalar_params(node, 1, 2, x)
        w, s_w = self._qlinear_weights(node, 3, 0)
        unit = s_x * s_w
        b = self._const(node, 8, optional=True)
        bias = np.zeros(unit.size) if b is None else np.asarray(b, np.float64).reshape(-1)
        self._conv(node, x, z_x, w, unit, bias)
        self.op_QuantizeLinear_pending(node, 6, 7)

    def op_ConvInteger(self, node):
        x = node.inputs[0]
        self.src(x, conv=True)
        z_x = self._zero_point(node, 2, x)
        w = self._integer_weights(node, 1, 3, 0)
        self._conv(node, x, z_x, w, np.ones(w.shape[0]), np.zeros(w.shape[0]))

    def _zero_point(self, node, k, x):
        z = self._const(node, k, optional=True)
        if z is not None and z.size != 1:
            self.fail("per-axis zero points on an activation")
        dt = self._int_type(x)
        z = 0 if z is None else int(z.reshape(-1)[0])
        return z - 128 if dt == np.uint8 else z

    def _integer_weights(self, node, k_w, k_zp, out_axis):
        w = np.asarray(self._const(node, k_w), np.int64)
        z = self._const(node, k_zp, optional=True)
        z = np.zeros(1, np.int64) if z is None else np.asarray(z, np.int64)
        name = node.inputs[k_w]
        self.qconst[name] = (w, np.ones(1), z, out_axis)
        q, _ = self.weights(name, out_axis)
        return q

    def _qlinear_weights(self, node, k, out_axis):
        """Weights ``k``, scale ``k + 1``, zero point ``k + 2`` of a QLinear operator."""
        name = node.inputs[k]
        w = np.asarray(self._const(node, k), np.int64)
        s = np.asarray(self._const(node, k + 1), np.float64)
        z = np.asarray(self._const(node, k + 2), np.int64)
        self.qconst[name] = (w, s, z, out_axis)
        return self.weights(name, out_axis)

    def op_QuantizeLinear_pending(self, node, k_s, k_z):
        out = node.outputs[0]
        s, z = self._scalar_params(node, k_s, k_z, out)
        self.emit(self.pend.pop(out), out, s, z)

    # ---- matrix products -------------------------------------------------------------------

    def _matrix(self, node, x, z_x, w_kn, unit, bias):
        """A pending fully connected layer: ``x`` ``(1, N_in)``, ``w_kn`` ``[N_out, N_in]``
        int, as a convolution whose kernel covers the input dataset."""
        self.src(x)
        out = node.outputs[0]
        if tuple(self.g.shapes[out]) != (1, w_kn.shape[0]):
            self.fail(f"output shape {tuple(self.g.shapes[out])} (a batch of one is needed)")
        x, (c, h, ww) = self.flat_input(x)
        self.zp[x] = z_x
        if c * h * ww != w_kn.shape[1]:
            self.fail(f"the input has {c * h * ww} elements, the weights {w_kn.shape[1]} rows")
        self.pend[out] = Pending(x, z_x, w_kn.reshape(w_kn.shape[0], c, h, ww), bias, unit,
                                 node)

    def op_Gemm(self, node):
        x = node.inputs[0]
        self.src(x)
        s_x, z_x = self.params(x)
        if node.attr("transA", 0):
            self.fail("transA is not supported")
        trans = node.attr("transB", 0)
        w, s_w = self.weights(node.inputs[1], 0 if trans else 1)
        alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
        if not alpha > 0:
            self.fail(f"alpha {alpha} must be positive")
        unit = s_x * s_w * alpha
        c = node.inputs[2] if len(node.inputs) > 2 and beta != 0 else ""
        bias = self.bias(c, unit / beta) if c else np.zeros(unit.size)
        self._matrix(node, x, z_x, w if trans else w.T, unit, bias)
        self._fold_act(node.outputs[0], self._act(node))

    def op_QGemm(self, node):
        """``com.microsoft.QGemm``: ``alpha (A - z_a)(B - z_b) + C``, ``C`` int32 in units of
        ``alpha s_a s_b``, quantized to ``y_scale`` / ``y_zero_point``."""
        x = node.inputs[0]
        self.src(x)
        s_x, z_x = self._scalar_params(node, 1, 2, x)
        if node.attr("transA", 0):
            self.fail("transA is not supported")
        if len(node.inputs) < 8 or not node.inputs[7]:
            self.fail("a float output (no y_scale) is not supported")
        trans = node.attr("transB", 0)
        w, s_w = self._qlinear_weights(node, 3, 0 if trans else 1)
        unit = s_x * s_w * float(node.attr("alpha", 1.0))
        c = self._const(node, 6, optional=True)
        bias = np.zeros(unit.size) if c is None else np.broadcast_to(
            np.asarray(c, np.float64).reshape(-1), unit.shape).copy()
        self._matrix(node, x, z_x, w if trans else w.T, unit, bias)
        self.op_QuantizeLinear_pending(node, 7, 8)

    def op_MatMul(self, node):
        x = node.inputs[0]
        self.src(x)
        s_x, z_x = self.params(x)
        w, s_w = self.weights(node.inputs[1], 1)
        self._matrix(node, x, z_x, w.T, s_x * s_w, np.zeros(w.shape[1]))

    def op_QLinearMatMul(self, node):
        x = node.inputs[0]
        self.src(x)
        s_x, z_x = self._scalar_params(node, 1, 2, x)
        w, s_w = self._qlinear_weights(node, 3, 1)
        self._matrix(node, x, z_x, w.T, s_x * s_w, np.zeros(w.shape[1]))
        self.op_QuantizeLinear_pending(node, 6, 7)

    def op_MatMulInteger(self, node):
        x = node.inputs[0]
        self.src(x)
        z_x = self._zero_point(node, 2, x)
        w = self._integer_weights(node, 1, 3, 1)
        self._matrix(node, x, z_x, w.T, np.ones(w.shape[1]), np.zeros(w.shape[1]))

    # ---- what folds into a pending accumulator ---------------------------------------------

    def _pending_of(self, node):
        """The pending accumulator ``node`` takes (its first such input, moved to the
        front of ``node.inputs``), or None."""
        xs = [x for x in node.inputs if x in self.pend and self.pend[x].own is None]
        if not xs:
            return None
        x = xs[0]
        if len(self.g.consumers(x)) != 1 or x in self.g.outputs:
            self.fail(f"the accumulator {x!r} has several consumers")
        node.inputs = [x] + [n for n in node.inputs if n != x]
        return self.pend.pop(x)

    def _channel_const(self, node, p):
        other = [n for n in node.inputs[1:] if n]
        c = self.g.const(other[0]) if len(other) == 1 else None
        if c is None:
            self.fail("the other operand must be a constant")
        c = np.asarray(c, np.float64)
        k = p.weights.shape[0]
        if c.size == 1:
            return np.full(k, float(c.reshape(-1)[0]))
        squeezed = c.reshape(-1)
        out_shape = tuple(self.g.shapes[node.outputs[0]])
        if squeezed.size == k and out_shape == tuple(np.broadcast_shapes(
                out_shape, c.shape)) and (c.ndim < 3 or c.shape[-1] * c.shape[-2] == 1):
            return squeezed
        self.fail(f"a constant of shape {c.shape}: a scalar or one value per channel only")

    def op_Cast(self, node):
        p = self._pending_of(node)
        if p is None:
            self.fail("Cast is taken only on the int32 output of ConvInteger / MatMulInteger")
        self.pend[node.outputs[0]] = p

    def op_Mul(self, node):
        """A ``Mul`` of two int8 tensors (with broadcast, :mod:`npu_compiler.int8elt`), or
        by a constant scale on the accumulator of ``ConvInteger`` / ``MatMulInteger``."""
        if self._of_tensors(node):
            self.binary(node)
            return
        p = self._pending_of(node)
        if p is None:
            self.fail("Mul by a constant is taken only on the accumulator of ConvInteger / "
                      "MatMulInteger")
        c = self._channel_const(node, p)
        if np.any(~(c > 0)) or p.act is not None:
            self.fail("the scale must be positive and come before any activation")
        self.pend[node.outputs[0]] = replace(p, unit=p.unit * c)

    def op_Sub(self, node):
        """A ``Sub`` of two int8 tensors (with broadcast, :mod:`npu_compiler.int8elt`)."""
        if not self._of_tensors(node):
            self.fail("Sub is taken of two int8 tensors only")
        self.binary(node)

    def op_Add(self, node):
        """An ``Add`` of two int8 tensors (with broadcast, :mod:`npu_compiler.int8elt`: each
        operand becomes ``(q - z) s / s_y`` in binary16, the first also ``+ z_y``, then one
        add rounds to int8), or of a constant bias to an accumulator."""
        if self._of_tensors(node):
            self.binary(node)
            return
        p = self._pending_of(node)
        if p is None:
            self.fail("Add of a constant is taken only on an accumulator")
        if p.act is not None:
            self.fail("the bias must come before any activation")
        c = self._channel_const(node, p)
        self.pend[node.outputs[0]] = replace(p, bias=p.bias + c / p.unit)

    def _fold_act(self, name, act):
        """Fold ``act`` (``None``, ``"relu"``, ``("clip", lo, hi)``) into pending ``name``."""
        if act is None:
            return
        lo, hi = (0.0, np.inf) if act == "relu" else (act[1], act[2])
        p = self.pend[name]
        if p.act is not None:
            lo, hi = max(lo, p.act[0]), min(hi, p.act[1])
            if lo > hi:
                self.fail("two clips with disjoint ranges")
        self.pend[name] = replace(p, act=(float(lo), float(hi)))

    def _unary_act(self, node, act):
        x, out = node.inputs[0], node.outputs[0]
        p = self._pending_of(node)
        if p is None:
            self.src(x)
            p = self._identity(x)
        self.pend[out] = p
        self._fold_act(out, act)

    def op_Relu(self, node):
        self._unary_act(node, "relu")

    def op_Clip(self, node):
        from .frontend import activation
        act = activation(self.g, node)
        if act is None:
            self.fail("the bounds must be constants")
        self._unary_act(node, ("clip", act["lo"], act["hi"]))

    def op_GlobalAveragePool(self, node):
        """A depthwise layer of weight 1 over the whole plane; one accumulator unit is
        ``s_x / (H W)``."""
        x = node.inputs[0]
        c, h, w = self.src(x, conv=True).shape
        s, z = self.params(x)
        self.pend[node.outputs[0]] = Pending(x, z, np.ones((c, 1, h, w), np.int64), np.zeros(c),
                                             np.full(c, s / (h * w)), node, groups=c,
                                             own=(s, z))

    def op_MaxPool(self, node):
        x = node.inputs[0]
        self.src(x)
        super().op_MaxPool(node)
        self.zp[node.outputs[0]] = self.zp[x]

    def _alias(self, node):
        super()._alias(node)
        self.zp[node.outputs[0]] = self.zp[node.inputs[0]]

    op_Flatten = op_Reshape = op_Squeeze = op_Unsqueeze = op_Identity = _alias


def lower_qdq(graph, config, name="", spill=False, cores=None, schedule="depth-first"):
    """``(builder, plan, io)`` of a quantized model: ``io`` maps ``"inputs"`` and
    ``"outputs"`` to ``{name: {"scale", "zero_point", "dtype"}}`` (``zero_point`` in the
    int8 domain the buffer holds; ``dtype`` the ONNX tensor's type); ``cores`` and
    ``schedule`` as :func:`npu_compiler.int8.lower_int8` (depth first in memory mode:
    :meth:`_QDQ.segment_layer`)."""
    lw = _QDQ(graph, config, name, cores)
    lw.spill = spill
    try:
        lw.run()
    except NeedsMemory:
        # As lower_int8: every int8 tensor in system memory, layers in bands.
        lw = _QDQ(graph, config, name, cores, schedule)
        lw.memory = True
        lw.run()

    def spec(n):
        return {"scale": lw.scale.get(n), "zero_point": lw.zp.get(n),
                "dtype": lw.dtype.get(n, "float32")}

    io = {"inputs": {n: spec(n) for n in graph.inputs},
          "outputs": {n: spec(n) for n in graph.outputs}}
    return lw.b, lw.plan, io

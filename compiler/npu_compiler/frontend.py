"""The front end: an ONNX file in, a simplified :class:`~npu_compiler.graph.Graph` out.

Steps, in order: read (a truncated or foreign file is a :class:`CompileError`), check
(``onnx.checker``), convert the default domain to opset :data:`TARGET_OPSET` when it lies
outside :data:`OPSETS` (``onnx.version_converter``), give every input a concrete shape (the
model's dimensions, the values given for the dynamic ones, else an error), infer the shapes,
fold the constant subgraphs (``Shape``, ``Gather``, ``Cast``, ``Concat``... of known values;
evaluated with ``onnx.reference``), remove ``Identity`` and ``Dropout``, fold
``BatchNormalization`` into the convolution or ``Gemm`` before it, and fuse the activation
that follows a convolution or a ``Gemm`` into the neural engine's post-processor.
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .graph import CompileError, Graph, Node

__all__ = ["OPSETS", "TARGET_OPSET", "load_graph", "read_model"]

#: Default-domain opsets taken as they are; others are converted to :data:`TARGET_OPSET`.
OPSETS = range(13, 22)
TARGET_OPSET = 17

#: Operators that produce values that never need the NPU when their inputs are known.
_SHAPE_OPS = {"Shape", "Size"}
#: Activations the post-processor applies (``npu_spec.postproc.Act``) after a conv or Gemm.
FUSABLE = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Gelu"}


def read_model(source):
    """An ``onnx.ModelProto`` from a path, bytes or a model; :class:`CompileError` for a file
    that is missing, truncated or not ONNX, or that fails ``onnx.checker``."""
    if isinstance(source, onnx.ModelProto):
        model = source
    else:
        if isinstance(source, (bytes, bytearray)):
            data, what = bytes(source), "the model"
        else:
            what = str(source)
            try:
                with open(source, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise CompileError(f"cannot read {what}: {e.strerror}") from None
        try:
            model = onnx.load_model_from_string(data)
        except Exception as e:  # the protobuf decoder raises several types
            raise CompileError(f"{what} is not a readable ONNX model (truncated or another "
                               f"format): {_one_line(e)}") from None
        if not model.graph.node and not model.graph.output:
            raise CompileError(f"{what} is not an ONNX model (no graph)")
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise CompileError(f"invalid ONNX model: {_one_line(e)}") from None
    return model


def _one_line(e):
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return None


def _convert(model):
    version = _opset(model)
    if version is None or version in OPSETS:
        return model
    try:
        from onnx import version_converter
        return version_converter.convert_version(model, TARGET_OPSET)
    except Exception:
        # Keep the model's own opset: the lowering reads both attribute forms.
        return model


def _concrete_inputs(model, shapes, batch_one="auto"):
    """Set every graph input's dimensions (``shapes``: name -> tuple fills the dynamic
    ones); with ``batch_one`` a leading batch dimension above one (the same for every input
    of rank 2 or more) becomes 1, the runtime runs the items one by one (``"auto"``: when
    every such input has rank 3 or more or a dynamic leading dimension). Returns the
    batch."""
    inits = {t.name for t in model.graph.initializer}
    result = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        given = shapes.get(inp.name)
        tt = inp.type.tensor_type
        dims = list(tt.shape.dim)
        if given is not None:
            given = tuple(int(n) for n in given)
            if tt.HasField("shape") and len(given) != len(dims):
                raise CompileError(f"input {inp.name!r} has rank {len(dims)}, the given shape "
                                   f"{'x'.join(map(str, given))} has rank {len(given)}")
            for k, d in enumerate(dims):
                if (d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != given[k]
                        and not (k == 0 and batch_one)):
                    raise CompileError(f"input {inp.name!r} has dimension {k} of size "
                                       f"{d.dim_value}, the given shape has {given[k]}")
            shape = given
        else:
            if not tt.HasField("shape"):
                raise CompileError(f"input {inp.name!r} has no shape; give it with --shape "
                                   f"{inp.name}=...")
            shape = []
            for k, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value > 0:
                    shape.append(d.dim_value)
                else:
                    label = d.dim_param or "?"
                    raise CompileError(f"input {inp.name!r} has a dynamic dimension {label!r} "
                                       f"(axis {k}) with no value; give an input or --shape "
                                       f"{inp.name}=" + "x".join(
                                           str(x.dim_value) if x.dim_value > 0 else "N"
                                           for x in dims))
            shape = tuple(shape)
        result[inp.name] = (inp, shape)
    batches = {shape[0] for _, shape in result.values() if len(shape) >= 2}
    if batch_one == "auto":
        # Images and sequences (rank 3 or more) or a dynamic leading dimension.
        batch_one = result and all(
            len(shape) >= 3 or not inp.type.tensor_type.shape.dim[0].HasField("dim_value")
            for inp, shape in result.values() if len(shape) >= 2)
    batch = batches.pop() if len(batches) == 1 and batch_one else 1
    for inp, shape in result.values():
        if batch > 1 and len(shape) >= 2:
            shape = (1,) + tuple(shape[1:])
        tt = inp.type.tensor_type
        tt.shape.Clear()
        for n in shape:
            tt.shape.dim.add().dim_value = n
    return batch


def _attrs(proto):
    out = {}
    for a in proto.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _infer(model):
    try:
        return shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:
        raise CompileError(f"shape inference failed: {_one_line(e)}") from None


def _value_types(model):
    shapes, dtypes = {}, {}
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        shapes[vi.name] = dims
        dtypes[vi.name] = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    return shapes, dtypes


def _evaluate(node_proto, inputs):
    """Outputs of one node on constant inputs (``onnx.reference``)."""
    from onnx.reference import ReferenceEvaluator

    names = [n for n in node_proto.input if n]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(inputs[n].dtype),
                                         inputs[n].shape) for n in names]
    outs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
            for n in node_proto.output if n]
    g = helper.make_graph([node_proto], "fold", ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", _FOLD_OPSET[0])])
    results = ReferenceEvaluator(m).run(None, {n: inputs[n] for n in names})
    return dict(zip([n for n in node_proto.output if n], results))


_FOLD_OPSET = [TARGET_OPSET]


def _fold(model, keep=()):
    """Evaluate every node whose inputs are all known (and ``Shape`` of a known shape),
    except the operators in ``keep``; returns ``(remaining node protos, constants)``."""
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    shapes, _ = _value_types(model)
    remaining = []
    for node in g.node:
        if node.op_type == "Constant":
            a = _attrs(node)
            if "value" in a:
                consts[node.output[0]] = np.asarray(a["value"])
            else:
                remaining.append(node)
            continue
        if node.op_type in _SHAPE_OPS and node.input[0] in shapes and \
                all(d >= 0 for d in shapes[node.input[0]]):
            shape = shapes[node.input[0]]
            if node.op_type == "Size":
                consts[node.output[0]] = np.asarray(int(np.prod(shape)), np.int64)
                continue
            a = _attrs(node)
            start, end = a.get("start", 0), a.get("end", None)
            consts[node.output[0]] = np.asarray(shape[start:end], np.int64)
            continue
        ins = [n for n in node.input if n]
        if ins and all(n in consts for n in ins) and node.domain in ("", "ai.onnx") \
                and node.op_type not in keep:
            try:
                consts.update(_evaluate(node, consts))
                continue
            except Exception as e:
                raise CompileError(f"cannot fold constant node {node.name!r} "
                                   f"({node.op_type}): {_one_line(e)}") from None
        remaining.append(node)
    return remaining, consts


def _rebuild(model, nodes, consts):
    g = model.graph
    used = {n for node in nodes for n in node.input} | {o.name for o in g.output}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items() if k in used]
    inputs = [i for i in g.input if i.name not in consts]
    graph = helper.make_graph(nodes, g.name or "model", inputs, list(g.output), inits)
    # Shape inference cannot find the outputs of other domains' operators: keep theirs.
    foreign = {o for node in nodes if node.domain not in ("", "ai.onnx") for o in node.output}
    graph.value_info.extend(vi for vi in g.value_info if vi.name in foreign)
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def load_graph(source, shapes=None, batch_one="auto", keep=(), foreign=()):
    """The :class:`Graph` of an ONNX model (path, bytes or ``ModelProto``); ``shapes`` maps
    input names to concrete shapes for their dynamic dimensions; the operators in ``keep``
    are not folded even on constant inputs (``DequantizeLinear`` of int8 weights, which the
    int8 lowering of a quantized model takes as they are); ``foreign`` names operators of
    other domains that are let through (``com.microsoft.QGemm``)."""
    model = read_model(source)
    model = _convert(model)
    _FOLD_OPSET[0] = _opset(model) or TARGET_OPSET
    model = onnx.ModelProto.FromString(model.SerializeToString())
    batch = _concrete_inputs(model, dict(shapes or {}), batch_one)
    if batch > 1:
        # The declared shapes hold the batch: let inference find them again.
        del model.graph.value_info[:]
        for out in model.graph.output:
            out.type.tensor_type.ClearField("shape")
    for _ in range(4):
        model = _infer(model)
        before = len(model.graph.node)
        nodes, consts = _fold(model, keep)
        model = _rebuild(model, nodes, consts)
        if len(nodes) == before:
            break
    model = _infer(model)
    shapes_, dtypes = _value_types(model)
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for name, arr in consts.items():
        shapes_[name] = tuple(arr.shape)
        dtypes[name] = arr.dtype
    nodes = [Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output),
                  _attrs(n)) for k, n in enumerate(g.node)]
    for n in g.node:
        if n.domain not in ("", "ai.onnx") and n.op_type not in foreign:
            raise CompileError(f"node {n.name!r} ({n.domain}.{n.op_type}) is in domain "
                               f"{n.domain!r}; only the default ONNX domain is supported")
    graph = Graph(nodes, consts, shapes_, dtypes, [i.name for i in g.input
                                                     if i.name not in consts],
                  [o.name for o in g.output], g.name, batch, _FOLD_OPSET[0])
    for name in graph.outputs + [o for n in nodes for o in n.outputs if o]:
        if name not in graph.shapes or any(d < 0 for d in graph.shapes[name]):
            raise CompileError(f"the shape of tensor {name!r} is not known after shape "
                               f"inference")
    simplify(graph)
    return graph


# ---------------------------------------------------------------------------------------------
# graph simplification


def _rename(graph, old, new):
    for n in graph.nodes:
        n.inputs = [new if x == old else x for x in n.inputs]


def _single_use(graph, tensor):
    return tensor not in graph.outputs and len(graph.consumers(tensor)) == 1


def simplify(graph):
    """Remove Identity/Dropout, fold BatchNormalization, fuse activations (in place)."""
    keep = []
    for n in graph.nodes:
        if n.op in ("Identity", "Dropout") and n.outputs[0] not in graph.outputs:
            _rename(graph, n.outputs[0], n.inputs[0])
            continue
        if n.op == "Dropout":
            n.op, n.outputs, n.attrs = "Identity", n.outputs[:1], {}
            n.inputs = n.inputs[:1]
        keep.append(n)
    graph.nodes = keep
    _fold_batch_norm(graph)
    _fuse_activations(graph)


def _fold_batch_norm(graph):
    keep = []
    for n in graph.nodes:
        if n.op == "BatchNormalization" and len([o for o in n.outputs if o]) == 1:
            prev = graph.producer(n.inputs[0])
            params = [graph.const(x) for x in n.inputs[1:5]]
            if (prev is not None and prev.op in ("Conv", "Gemm") and not prev.fused
                    and all(p is not None for p in params) and _single_use(graph, n.inputs[0])
                    and graph.const(prev.inputs[1]) is not None):
                if _fold_into(graph, prev, n, params):
                    prev.outputs = [n.outputs[0]]
                    continue
        keep.append(n)
    graph.nodes = keep


def _fold_into(graph, prev, bn, params):
    gamma, beta, mean, var = (np.asarray(p, np.float64) for p in params)
    eps = bn.attr("epsilon", 1e-5)
    a = gamma / np.sqrt(var + eps)
    w = np.asarray(graph.const(prev.inputs[1]), np.float64)
    k = w.shape[0] if prev.op == "Conv" else (w.shape[0] if prev.attr("transB", 0)
                                               else w.shape[1])
    if a.shape != (k,):
        return False
    bias_name = prev.inputs[2] if len(prev.inputs) > 2 and prev.inputs[2] else None
    b = (np.zeros(k) if bias_name is None
         else np.asarray(graph.const(bias_name), np.float64))
    if prev.op == "Gemm":
        if b.shape not in ((k,), (1, k)):
            return False
        b = b.reshape(-1)
        alpha, beta_ = prev.attr("alpha", 1.0), prev.attr("beta", 1.0)
        w = w * alpha
        b = b * beta_
        prev.attrs["alpha"], prev.attrs["beta"] = 1.0, 1.0
        w = w * (a[:, None] if prev.attr("transB", 0) else a[None, :])
    else:
        if b.shape != (k,):
            return False
        w = w * a.reshape((k,) + (1,) * (w.ndim - 1))
    b = (b - mean) * a + beta
    wn, bn_ = f"{prev.name}/W_bn", f"{prev.name}/B_bn"
    graph.consts[wn] = w.astype(np.float32)
    graph.consts[bn_] = b.astype(np.float32)
    graph.shapes[wn], graph.shapes[bn_] = w.shape, b.shape
    graph.dtypes[wn] = graph.dtypes[bn_] = np.dtype(np.float32)
    prev.inputs = [prev.inputs[0], wn, bn_]
    return True


def _clip_bounds(graph, n):
    lo, hi = n.attr("min"), n.attr("max")
    if len(n.inputs) > 1 and n.inputs[1]:
        lo = graph.const(n.inputs[1])
    if len(n.inputs) > 2 and n.inputs[2]:
        hi = graph.const(n.inputs[2])
    for v, k in ((lo, 1), (hi, 2)):
        if v is None and len(n.inputs) > k and n.inputs[k]:
            return None
    lo = -np.inf if lo is None else float(np.asarray(lo))
    hi = np.inf if hi is None else float(np.asarray(hi))
    return lo, hi


def activation(graph, n):
    """The post-processor activation of node ``n`` as ``{act, lo, hi, alpha}`` or None."""
    if n.op == "Relu":
        return {"act": "relu"}
    if n.op == "Clip":
        bounds = _clip_bounds(graph, n)
        return None if bounds is None else {"act": "clamp", "lo": bounds[0], "hi": bounds[1]}
    if n.op == "LeakyRelu":
        return {"act": "leaky", "alpha": float(n.attr("alpha", 0.01))}
    if n.op == "Sigmoid":
        return {"act": "sigmoid"}
    if n.op == "Tanh":
        return {"act": "tanh"}
    if n.op == "Gelu" and n.attr("approximate", "none") == "none":
        return {"act": "gelu"}
    return None


def _fuse_activations(graph):
    keep = []
    for n in graph.nodes:
        if n.op in FUSABLE and graph.is_float(n.inputs[0]):
            prev = graph.producer(n.inputs[0])
            act = activation(graph, n)
            if (act is not None and prev is not None and prev.op in ("Conv", "Gemm")
                    and not prev.fused and _single_use(graph, n.inputs[0])):
                prev.fused = act
                prev.preact = n.inputs[0]
                prev.outputs = [n.outputs[0]]
                continue
        keep.append(n)
    graph.nodes = keep

"""``--format int8``: post-training calibration and the int8 lowering (``docs/compiler.md``).

Calibration runs the float model (on onnxruntime when the caller passes the runtime's
``npu_runtime.runtime.session``, else on the onnx package's reference evaluator) with every
intermediate tensor exposed as an output and takes a symmetric per-tensor scale of each
(:class:`npu_compiler.quant.Calibrator`, largest ``|x|`` over 127). Weights get
per-output-channel scales; each layer's ``in_scale * w_scale[k] / out_scale`` becomes the
post-processor's multiplier and shift (:func:`npu_compiler.quant.quantize_conv`).

The int8 lowering keeps every activation of the network in the buffer as an int8 dataset,
loads the graph inputs (quantized by the runtime with the scales in the program's metadata)
and stores the graph outputs (dequantized by the runtime). When the activations do not fit
the buffer, or an operator needs system memory, it lowers the network again with every
activation in system memory and the layers cut into bands (:mod:`npu_compiler.int8mem`).
Operators: ``Conv`` (with a fused ``Relu`` or ``Clip``, or a fused ``Sigmoid``, ``Tanh``,
``Gelu`` after it), ``Gemm`` (a convolution whose kernel covers the whole input), ``Add``,
``Sub``, ``Mul`` of two activations with broadcast (planar engine, through binary16),
``Sigmoid``, ``Tanh``, ``Gelu`` (a mixed-format layer and a planar rescale), ``LeakyRelu``
and ``PRelu`` (a mixed-format layer; per-channel slopes on the planar engine), ``Clip``,
``HardSigmoid``, ``HardSwish`` (clamped depthwise layers; all :mod:`npu_compiler.int8elt`),
``Add``, ``Sub``, ``Mul``, ``Div`` with a constant (a scalar or per-channel one as a
depthwise layer, a constant tensor as a quantized operand of the binary path),
``Relu``, ``MaxPool`` (planar engine), ``GlobalAveragePool``
(a depthwise convolution of weight ``1 / (H W)``), ``AveragePool`` and ``Concat`` (system
memory only), and the shape-only ``Flatten``, ``Reshape``, ``Squeeze``, ``Unsqueeze``,
``Identity``. Any
other operator is a :class:`CompileError` naming the node.
"""

import numpy as np

from npu_model.builder import BuildError, ProgramBuilder
from npu_spec import neural
from npu_spec import planar as planar_spec
from npu_spec.engine import Engine
from npu_spec.mac import MacFormat
from npu_spec.program import dense_strides

from . import ops
from .compress import Compression, encode_kernels, prune
from .cores import check_cores, core_blobs
from .cores import place as place_on_cores
from .graph import CompileError, Node
from .int8elt import BINARY_OPS, CLAMP_OPS, LEAKY_OPS, PWL_OPS, EltwiseInt8
from .int8mem import MemoryInt8, NeedsMemory
from .lower import PLANE_DEPTH, MView
from .ops import _conv_geometry
from .quant import Calibrator, quantize, quantize_conv

__all__ = ["INT8_OPS", "calibrate", "calibration_samples", "lower_int8", "read_array",
           "reference_evaluator"]

SHAPE_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
INT8_OPS = ("Conv", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "MaxPool", "AveragePool",
            "GlobalAveragePool", "Concat") + tuple(PWL_OPS) + CLAMP_OPS + LEAKY_OPS + SHAPE_OPS


# ---- calibration ---------------------------------------------------------------------------

def calibration_samples(source, input_names):
    """``{input name: [N, ...] array}`` from an ``.npz`` file (a key per input, or one array
    for a one-input model) or a directory of ``.npy`` / ``.npz`` / ``.pb`` files (one or more
    items each)."""
    import os
    path = str(source)
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith((".npy", ".npz", ".pb")))
        if not files:
            raise CompileError(f"calibration directory {path} holds no .npy, .npz or .pb file")
        parts = {n: [] for n in input_names}
        for f in files:
            for n in input_names:
                parts[n].append(read_array(os.path.join(path, f), n, len(input_names)))
        return {n: parts[n] for n in input_names}
    if not os.path.exists(path):
        raise CompileError(f"calibration file {path} does not exist")
    return {n: [read_array(path, n, len(input_names))] for n in input_names}


def read_array(path, name, n_inputs):
    """The array of input ``name`` in file ``path`` (``.npz``: key ``name``, or its only
    array for a one-input model; ``.npy``; ``.pb`` TensorProto, one-input models)."""
    try:
        if path.endswith(".npz"):
            with np.load(path) as z:
                if name in z.files:
                    return z[name]
                if len(z.files) == 1 and n_inputs == 1:
                    return z[z.files[0]]
                raise CompileError(f"calibration file {path} has no array {name!r} (it has "
                                   f"{', '.join(z.files) or 'none'})")
        if n_inputs != 1:
            raise CompileError(f"calibration file {path}: a model with several inputs needs "
                               f".npz files with a key per input")
        if path.endswith(".pb"):
            from onnx import TensorProto, numpy_helper
            t = TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            return numpy_helper.to_array(t)
        return np.load(path, allow_pickle=False)
    except CompileError:
        raise
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CompileError(f"cannot read calibration file {path}: {why}") from None


def _items(arrays, shape):
    """The items of shape ``shape`` in ``arrays`` (each the shape, or a batch of it)."""
    shape = tuple(shape)
    for a in arrays:
        a = np.asarray(a, np.float32)
        if a.shape == shape:
            yield a
        elif a.shape[1:] == shape:
            yield from a
        elif len(shape) >= 1 and shape[0] == 1 and a.shape[1:] == shape[1:]:
            for i in range(a.shape[0]):
                yield a[i:i + 1]
        else:
            raise CompileError(f"a calibration array has shape {'x'.join(map(str, a.shape))};"
                               f" the model takes {'x'.join(map(str, shape))} (or a batch "
                               f"of it)")


def reference_evaluator(model):
    """``feeds -> {name: array}`` of every graph output of ``model`` with the onnx package's
    reference evaluator (slow; the runtime's onnxruntime session is the usual one:
    ``npu_runtime.runtime.session``)."""
    from onnx.reference import ReferenceEvaluator
    try:
        ev = ReferenceEvaluator(model)
    except Exception as e:
        raise CompileError(f"the reference evaluator cannot run the model for calibration: "
                           f"{str(e).splitlines()[0]}") from None
    names = [o.name for o in model.graph.output]
    return lambda feeds: dict(zip(names, ev.run(None, feeds)))


def calibrate(model, graph, samples, evaluator=None):
    """Per-tensor scales ``{tensor name: scale}`` of every tensor of the original ``model``
    over the calibration ``samples`` (:func:`calibration_samples`). ``evaluator(model)``
    gives a function ``feeds -> {name: float array}`` of a model's graph outputs
    (default :func:`reference_evaluator`); every node output is made a graph output of a
    copy of ``model`` first."""
    import onnx
    from onnx import shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    m = shape_inference.infer_shapes(m)
    known = {vi.name: vi for vi in m.graph.value_info}
    outs = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for o in node.output:
            if o and o not in outs:
                m.graph.output.append(known.get(o) or onnx.helper.make_tensor_value_info(
                    o, onnx.TensorProto.FLOAT, None))
                outs.add(o)
    evaluate = (evaluator or reference_evaluator)(m)
    cal = Calibrator()
    inputs = list(graph.inputs)
    streams = {n: list(_items(samples[n], graph.shapes[n])) for n in inputs}
    count = {len(v) for v in streams.values()}
    if len(count) != 1 or 0 in count:
        raise CompileError(f"the calibration inputs hold {sorted(count)} items per input; "
                           f"every input needs the same number, at least one")
    for i in range(count.pop()):
        feeds = {n: streams[n][i] for n in inputs}
        for n, x in feeds.items():
            cal.update(n, x)
        for n, y in evaluate(feeds).items():
            if np.issubdtype(np.asarray(y).dtype, np.floating):
                cal.update(n, y)
    return {n: cal.scale(n) for n in cal.names}


# ---- lowering ------------------------------------------------------------------------------

def _shape3(shape):
    """The ``(C, H, W)`` dataset of an ONNX shape ``(1, C, H, W)`` or ``(1, N)``."""
    shape = tuple(int(n) for n in shape)
    if len(shape) == 4 and shape[0] == 1:
        return shape[1:]
    if len(shape) == 2 and shape[0] == 1:
        return (shape[1], 1, 1)
    return None


class _Int8(EltwiseInt8, MemoryInt8):
    #: Whether a network the buffer cannot hold is lowered again in memory mode
    #: (:mod:`npu_compiler.int8mem`).
    MEMORY_MODE = True

    def __init__(self, graph, config, scales, name, compression=None, cores=None,
                 chain=True, schedule="depth-first"):
        if "int8" not in config.formats:
            raise CompileError(f"preset {config.name!r} has no int8 datapath")
        self.cores = check_cores(config, cores)
        self.chain = chain      # conv -> planar pairs through a flow-controlled ring
        self.chained = None     # the node reading the last conv's ring
        self.compression = compression or Compression()
        self.g = graph
        self.cfg = config
        self.scales = scales
        self.b = ProgramBuilder(config)
        self.spill = False  # store and reload the live activations after every layer
        self.ds = {}        # tensor -> dataset
        self.scale = {}     # tensor -> scale
        self.plan = []
        self.node = None
        self._init_memory()
        self.schedule = schedule    # of memory mode (npu_compiler.int8mem)

    def fail(self, why):
        raise CompileError(f"{self.node}: {why} (--format int8)")

    def out_scale(self, name):
        joined = self.concat_scale(name)
        if joined is not None:
            return joined
        if name not in self.scales:
            self.fail(f"no calibration range for tensor {name!r}")
        return self.scales[name]

    def src(self, name, conv=False):
        """The dataset of activation ``name`` (in memory mode its tensor's view)."""
        if name not in self.ds and self.memory:
            ds = self.view(name)
        elif name not in self.ds:
            self.fail(f"input {name!r} is not an int8 activation (a constant or an unsupported "
                      f"producer)")
        else:
            ds = self.ds[name]
        if conv and _shape3(self.g.shapes[name]) != tuple(ds.shape):
            self.fail(f"tensor {name!r} of shape {tuple(self.g.shapes[name])} is not a "
                      f"(1, C, H, W) activation")
        return ds

    def _check_layer(self, src, blob, dst, stride, pad, dilation, groups, fmt=MacFormat.INT8,
                     out_fp16=0):
        _, icpg, kh, kw = blob.weight_shape
        c, h, w = src.shape
        k, oh, ow = dst.shape
        layer = neural.make_layer(fmt=fmt,
                                  log2w=neural.best_log2w(self.cfg, ow, kw, stride, dilation),
                                  groups=groups, icpg=icpg, ocpg=k // groups, in_h=h, in_w=w,
                                  out_h=oh, out_w=ow, kh=kh, kw=kw, stride=stride,
                                  dilation=dilation, pad=pad, out_fp16=out_fp16)
        err = neural.layer_error(layer, self.cfg)
        if err != neural.NeuralError.NONE:
            self.fail(f"the neural engine cannot run this layer ({err.name})")

    def conv(self, x, out, w, bias, act, stride=1, pad=0, dilation=1, groups=1, model=True):
        """A convolution; ``model``: ``w`` are the model's own weights (``--prune`` and
        ``--palette`` apply), not weights the compiler made."""
        src = self.ds[x]
        s_out = self.out_scale(out)
        lossy = self.compression if model else Compression()
        if lossy.prune:
            w = prune(w, lossy.prune)
        try:
            q = quantize_conv(w, bias, self.scale[x], s_out, act)
        except ValueError as e:
            self.fail(str(e))
        blob = self.kernels(q, groups, lossy.palette)
        slots = self._ring_slots(out, blob)
        dst = self.b.conv(src, self.place(blob, 1 if slots else None), stride=stride, pad=pad,
                          dilation=dilation, slots=slots, **q.conv_args())
        self._check_layer(src, blob, dst, stride, pad, dilation, groups)
        self.ds[out], self.scale[out] = dst, s_out

    def _ring_slots(self, out, blob):
        """Slots of a flow-controlled ring for conv output ``out`` when the next node alone
        reads it first, on the planar engine (``MaxPool``, ``Relu``, ``Add`` with it as
        first operand; :mod:`npu_compiler.chain`), it is no graph output and the layer runs
        on one core; else 0. The ring holds the whole tensor (the same buffer as without)."""
        if (not self.chain or self.spill or blob.conv_groups != 1
                or len(core_blobs(blob, self.cores)) > 1):
            return 0
        g = self.g
        i = g.nodes.index(self.node)
        nxt = g.nodes[i + 1] if i + 1 < len(g.nodes) else None
        if (nxt is None or out in g.outputs or g.consumers(out) != [nxt]
                or nxt.op not in ("MaxPool", "Relu", "Add")
                or (nxt.op == "Add" and (nxt.inputs[0] != out or out in nxt.inputs[1:]
                                         or tuple(g.shapes[nxt.inputs[1]])
                                         != tuple(g.shapes[out])))):
            return 0
        slots = -(-blob.weight_shape[0] // self.cfg.acc_slots)
        self.row["how"] = (f"chained: output streams into {nxt.name} through a ring of "
                           f"{slots} slot{'s' if slots > 1 else ''}")
        self.chained = (nxt.name, self.node.name)
        return slots

    def place(self, blob, cores=None):
        """Load ``blob`` split over the cores, or ``cores`` of them
        (:mod:`npu_compiler.cores`); the placements for
        :meth:`~npu_model.builder.ProgramBuilder.conv`. The plan row gets the bytes and the
        cores."""
        parts = core_blobs(blob, cores or self.cores)
        self.row["kernel_bytes"] += 4 * sum(part.words for part in parts)
        self.row["cores"] = max(self.row["cores"], len(parts))
        return place_on_cores(self.b, parts)

    def kernels(self, q, groups, palette=None):
        """The kernel blob of a :class:`~npu_compiler.quant.QuantizedConv` in its smallest
        lossless encoding after ``palette`` (:mod:`npu_compiler.compress`); the plan row gets
        the encoding and the raw bytes."""
        args = q.kernel_args()
        blob, raw_bytes, choice = encode_kernels(
            q.weights, fmt=MacFormat[args["fmt"].upper()], bias=args["bias"],
            scale=args["scale"], shift=args["shift"], groups=groups, slots=self.cfg.acc_slots,
            palette_bits=palette, raw=self.compression.raw, extract=self.cfg.kernel_extract)
        self.row["kernel_raw_bytes"] += raw_bytes
        self.row["kernel_encoding"] = choice.name(blob.fmt)
        return blob

    #: Operators :meth:`run` dispatches to ``op_<name>``.
    OPS = INT8_OPS

    def load_input(self, name):
        """Load graph input ``name`` (quantized by the runtime) into the buffer."""
        s3 = _shape3(self.g.shapes[name])
        if s3 is None or not self.g.is_float(name):
            raise CompileError(f"input {name!r} ({tuple(self.g.shapes[name])}) must be a float "
                               f"(1, C, H, W) or (1, N) tensor for --format int8")
        if name not in self.scales:
            raise CompileError(f"no calibration values for input {name!r}")
        if self.memory:
            self.mem_input(name, s3)
            self.scale[name] = self.scales[name]
            return
        t = self.b.input(name, np.zeros(s3, np.int8))
        try:
            self.ds[name], self.scale[name] = self.b.load(t), self.scales[name]
        except BuildError as e:
            self.needs_memory(f"input {name!r}: {e}")

    def run(self):
        g = self.g
        for name in g.inputs:
            self.load_input(name)
        last = {}
        for i, node in enumerate(g.nodes):
            for x in node.inputs:
                last[x] = i
        segs = self.mem_segments() if self.memory else {}
        for i, node in enumerate(g.nodes):
            self.node = node
            self.row = self._new_row(node)
            fn = getattr(self, "op_" + node.op, None)
            if node.op not in self.OPS or fn is None:
                raise CompileError(f"{node}: operator {node.op} is not supported with "
                                   f"--format int8 (supported: {', '.join(self.OPS)})")
            self._step = str(node)
            if self.memory and node.op not in SHAPE_OPS:
                self.row["how"] = "in system memory"
            seg = segs.get(i)
            if seg is not None and node is not seg.nodes[-1]:
                continue
            try:
                if seg is not None:
                    self.emit_segment(seg)
                    continue
                if self.memory:
                    self.mem_node(node)
                else:
                    fn(node)
            except BuildError as e:
                if self.MEMORY_MODE and not self.memory:
                    raise NeedsMemory(str(e)) from None
                self.fail(str(e))
            self._end_row()
            if self.memory:
                continue
            self._release(i, last)
            if self.spill and len(self.b.tasks) > self.row["first_task"] \
                    and i + 1 < len(g.nodes):
                self._spill()
        if self.memory:
            self.mem_outputs()
            return self
        for name in g.outputs:
            ds = self.output_dataset(name)
            self.b.store(ds, self.b.output(name + ":q", ds.shape))
        return self

    def mem_node(self, node):
        """``node`` in memory mode (:mod:`npu_compiler.int8mem`)."""
        op = node.op
        if op in SHAPE_OPS:
            self.mem_alias(node)
        elif op == "Concat":
            self.mem_concat(node)
        elif op in ("MaxPool", "AveragePool"):
            if len([o for o in node.outputs if o]) > 1:
                self.fail("the indices output is not supported")
            self.mem_pool(node, op == "MaxPool")
        elif op in BINARY_OPS + ("Div",) and self._constant_operand(node) is None:
            self.mem_binary(node)
        elif op == "Relu":
            self.mem_elementwise(node, self.op_Relu, 2)
        elif op in PWL_OPS or op == "LeakyRelu":
            self.pwl_node(node)
        else:
            getattr(self, "op_" + op)(node)

    def needs_memory(self, why):
        """A layer the buffer-resident lowering does not take: memory mode, or the error."""
        if self.MEMORY_MODE:
            raise NeedsMemory(why)
        self.fail(why)

    def _new_row(self, node):
        """The plan row of ``node`` (its tasks counted by :meth:`_end_row`)."""
        g = self.g
        return {"node": node.name, "op": node.op, "tasks": 0,
                "first_task": len(self.b.tasks), "kernel_bytes": 0,
                "kernel_raw_bytes": 0, "kernel_encoding": "", "engine": "-",
                "cores": 1, "how": (f"chained: reads {self.chained[1]}'s output "
                                    f"from the buffer while it runs"
                                    if self.chained and self.chained[0] == node.name
                                    else ""),
                "in": [list(g.shapes.get(x, ())) for x in node.inputs
                       if x and x not in g.consts],
                "out": [list(g.shapes.get(o, ())) for o in node.outputs if o]}

    def output_dataset(self, name):
        """The int8 dataset of graph output ``name``."""
        if name not in self.ds:
            raise CompileError(f"output {name!r} is not computed by the int8 program")
        return self.ds[name]

    def _end_row(self):
        self._span_row(self.row, [(self.row["first_task"], len(self.b.tasks))])

    def _span_row(self, row, spans):
        """Finish plan row ``row`` whose tasks are the ranges ``spans`` (one for a layer run
        whole; the bands of a depth-first segment interleave layers) and append it."""
        tasks = [t for a, b in spans for t in self.b.tasks[a:b]]
        row["tasks"] = len(tasks)
        if spans:
            row["first_task"], row["last_task"] = spans[0][0], spans[-1][1] - 1
        else:
            row["last_task"] = row["first_task"] - 1
        names = {Engine(t.engine).name for t in tasks}
        row["engine"] = ("NE" if "NEURAL" in names else "PE" if "PLANAR" in names else "-")
        self.plan.append(row)

    def _spill(self):
        """Make the end of this layer a safe switch point (``switch_points="layers"``):
        every live activation is stored to a scratch tensor and its buffer released, then
        loaded again (a new dataset) for the layers after it. Between the stores and the
        loads nothing is left on chip; the values come back bit for bit."""
        spilled = {}
        for n, ds in list(self.ds.items()):
            if id(ds) not in spilled:
                t = self.b.tensor(f"spill{len(self.b.tasks)}:{n}", ds.shape)
                self.b.store(ds, t)
                spilled[id(ds)] = (ds, t)
        for ds, _ in spilled.values():
            self.b.release(ds)
        loaded = {key: self.b.load(t) for key, (_, t) in spilled.items()}
        self.ds = {n: loaded[id(ds)] for n, ds in self.ds.items()}

    def _release(self, i, last):
        live = {id(self.ds[n]) for n in self.ds
                if last.get(n, -1) > i or n in self.g.outputs}
        for n in list(self.ds):
            if id(self.ds[n]) not in live and last.get(n, -1) == i:
                ds = self.ds.pop(n)
                if all(d is not ds for d in self.ds.values()):
                    self.b.release(ds)

    # ---- operators -------------------------------------------------------------------------

    def op_Conv(self, node):
        split = self.pwl_split(node)
        if split is not None:
            self.op_Conv(split[0])
            self.pwl_node(split[1])
            return
        g = self.g
        x, out = node.inputs[0], node.outputs[0]
        self.src(x, conv=True)
        w = g.const(node.inputs[1])
        bias = g.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if w is None or (len(node.inputs) > 2 and node.inputs[2] and bias is None):
            self.fail("weights and bias must be constants")
        if w.ndim != 4:
            self.fail(f"{w.ndim - 2}-D convolution is not supported")
        _, strides, dil, pads, _ = _conv_geometry(node, g.shapes[x], w.shape)
        if self.memory:
            if dil[0] != dil[1]:
                self.fail(f"dilations {dil} must be equal in both directions")
            self.mem_conv(x, out, w, bias, self._act(node), tuple(strides), tuple(pads),
                          dil[0], int(node.attr("group", 1)))
            return
        if len(set(strides)) != 1 or len(set(dil)) != 1 or len(set(pads)) != 1:
            self.needs_memory(f"strides {strides}, dilations {dil}, pads {pads} must each be "
                              f"equal in every direction")
        self.conv(x, out, w, bias, self._act(node), strides[0], pads[0], dil[0],
                  int(node.attr("group", 1)))

    def _act(self, node):
        act = node.fused or {}
        kind = act.get("act")
        if kind is None:
            return None
        if kind == "relu":
            return "relu"
        if kind == "clamp":
            return ("clip", float(act["lo"]), float(act["hi"]))
        self.fail(f"the fused activation {kind} is not supported")

    def op_Gemm(self, node):
        split = self.pwl_split(node)
        if split is not None:
            self.op_Gemm(split[0])
            self.pwl_node(split[1])
            return
        g = self.g
        x, out = node.inputs[0], node.outputs[0]
        if not self.memory:
            self.src(x)
        w = g.const(node.inputs[1])
        bias = g.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if w is None or (len(node.inputs) > 2 and node.inputs[2] and bias is None):
            self.fail("B and C must be constants")
        if node.attr("transA", 0) or node.attr("alpha", 1.0) != 1.0 \
                or (bias is not None and node.attr("beta", 1.0) != 1.0):
            self.fail("transA, alpha and beta other than 0, 1, 1 are not supported")
        w = w if node.attr("transB", 0) else w.T            # (K, N)
        if tuple(g.shapes[out]) != (1, w.shape[0]):
            self.fail(f"output shape {tuple(g.shapes[out])} (a batch of one is needed)")
        if bias is not None:
            bias = np.broadcast_to(bias, (1, w.shape[0])).reshape(-1)
        x, (c, h, ww) = self.flat_input(x)
        if c * h * ww != w.shape[1]:
            self.fail(f"the input has {c * h * ww} elements, B has {w.shape[1]} rows")
        if self.memory:
            self.mem_conv(x, out, w.reshape(w.shape[0], c, h, ww), bias, self._act(node))
            return
        self.conv(x, out, w.reshape(w.shape[0], c, h, ww), bias, self._act(node))

    def op_Relu(self, node):
        x, out = node.inputs[0], node.outputs[0]
        self.ds[out] = self.b.relu(self.src(x))
        self.scale[out] = self.scale[x]

    def _constant_operand(self, node):
        """``(activation, constant, reversed)`` of a binary node with one constant operand,
        else None."""
        a, b = node.inputs
        ca, cb = self.g.const(a), self.g.const(b)
        if (ca is None) == (cb is None):
            return None
        return (b, np.asarray(ca, np.float64), True) if cb is None else \
            (a, np.asarray(cb, np.float64), False)

    def _per_channel(self, x, c):
        """Constant ``c`` as one value per channel of activation ``x``'s ``(C, H, W)``
        dataset (a scalar, or a vector along ONNX axis 1), else None."""
        shape = tuple(self.g.shapes[x])
        channels = _shape3(shape)[0] if _shape3(shape) else None
        full = (1,) * (len(shape) - c.ndim) + c.shape if c.ndim <= len(shape) else None
        if channels is None or full is None or any(n != 1 for i, n in enumerate(full)
                                                   if i != 1):
            return None
        if full[1] not in (1, channels):
            return None
        return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float64)

    def affine(self, node):
        """``Add``, ``Sub``, ``Mul``, ``Div`` of an activation and a scalar or per-channel
        constant: a depthwise 1x1 layer ``x * m + a`` (weights ``m``, bias ``a``) with the
        output's own scale (one rounding)."""
        x, c, rev = self._constant_operand(node)
        op = node.op
        v = self._per_channel(x, c)
        if v is None or (op == "Div" and rev):
            self.constant_binary(node, x, c, rev)
            return
        ones = np.ones_like(v)
        mul, add = {"Add": (ones, v), "Mul": (v, 0 * v), "Div": (1.0 / v, 0 * v),
                    "Sub": (-ones, v) if rev else (ones, -v)}[op]
        out = node.outputs[0]
        w = mul.reshape(-1, 1, 1, 1)
        if self.memory:
            self.mem_conv(x, out, w, add, None, groups=len(v), model=False)
        else:
            self.src(x, conv=True)
            self.conv(x, out, w, add, None, groups=len(v), model=False)

    def constant_binary(self, node, x, c, rev):
        """``Add``, ``Sub``, ``Mul``, ``Div`` of activation ``x`` and a constant tensor ``c``
        of another shape than a scalar or a per-channel vector (``c / x`` with any constant):
        the constant (for ``x / c`` its reciprocal, a ``Mul``) quantized to int8 with its own
        symmetric scale ``max |c| / 127`` and stored in system memory, then the binary
        elementwise path of two activations (:meth:`binary`). The constant keeps its shape
        when it is the planar engine's broadcast vector over ``x``; otherwise (it is larger
        than ``x``, varies over two separate blocks of axes, or has more elements than a
        broadcast vector) it is broadcast to the output's shape here."""
        g, op, out = self.g, node.op, node.outputs[0]
        if op == "Div" and not rev:
            with np.errstate(divide="ignore"):
                c, op = 1.0 / c, "Mul"
        if not np.all(np.isfinite(c)):
            self.fail("a constant with a non-finite element")
        oshape, xshape = tuple(g.shapes[out]), tuple(g.shapes[x])
        if c.ndim > len(oshape):
            self.fail(f"a constant of shape {c.shape} over {oshape}")
        c = c.reshape((1,) * (len(oshape) - c.ndim) + c.shape)
        pqm = ops._bcast_pattern(oshape, c.shape)
        if c.shape != oshape and (xshape != oshape or pqm is None
                                  or pqm[1] > PLANE_DEPTH):
            c = np.broadcast_to(c, oshape)
        shape3 = _shape3(c.shape)
        if shape3 is None:
            self.fail(f"a constant of shape {c.shape} (the output {oshape} must be "
                      f"(1, C, H, W) or (1, N))")
        name = f"{node.name}:const{len(self.b.tensors)}"
        peak = float(np.abs(c).max())
        s_c = peak / 127 if peak > 0 else 1.0
        t = self.b.tensor(name, shape3, "int8", "constant",
                          quantize(c, s_c).reshape(shape3))
        g.shapes[name] = c.shape
        self.scale[name] = s_c
        pair = Node(op, node.name, [name, x] if rev else [x, name], [out])
        if self.memory:
            self.mv[name] = MView(t.addr, shape3, dense_strides(shape3, "int8"))
            self.mem_binary(pair)
            return
        self.ds[name] = self.b.load(t)
        self.binary(pair)
        self.b.release(self.ds.pop(name))

    def op_Add(self, node):
        """``Add``, ``Sub``, ``Mul`` of two int8 activations, with broadcast, on the planar
        engine through binary16 (:mod:`npu_compiler.int8elt`); with a constant operand:
        :meth:`affine`."""
        if self._constant_operand(node) is not None:
            self.affine(node)
            return
        self.binary(node)

    op_Sub = op_Mul = op_Add

    def op_Div(self, node):
        """``Div`` of two activations: :meth:`binary` (the divisor's reciprocals by the
        planar engine, then a ``mul``); by a constant: :meth:`affine`."""
        if self._constant_operand(node) is None:
            self.binary(node)
            return
        self.affine(node)

    def op_MaxPool(self, node):
        x, out = node.inputs[0], node.outputs[0]
        src = self.src(x, conv=True)
        if len([o for o in node.outputs if o]) > 1:
            self.fail("the indices output is not supported")
        k = list(node.attr("kernel_shape"))
        s = list(node.attr("strides", [1] * len(k)))
        pads = list(node.attr("pads", [0] * 2 * len(k)))
        if len(k) != 2 or any(d != 1 for d in node.attr("dilations", [1, 1])):
            self.fail("only 2-D pooling without dilation")
        if node.attr("ceil_mode", 0) or node.attr("auto_pad", "NOTSET") not in ("NOTSET",
                                                                                "VALID"):
            self.needs_memory("ceil_mode or auto_pad")
        if pads[:2] != pads[2:] or pads[0] >= k[0] or pads[1] >= k[1]:
            self.needs_memory(f"pads {pads}: symmetric and smaller than the window only")
        if max(k) > planar_spec.MAX_WINDOW:
            self.fail(f"window {k[0]}x{k[1]} (at most {planar_spec.MAX_WINDOW})")
        dst = self.b.planar(src, mode="pool", op="max", kh=k[0], kw=k[1], sy=s[0], sx=s[1],
                            py=pads[0], px=pads[1])
        if tuple(dst.shape) != _shape3(self.g.shapes[out]):
            self.fail(f"pooled shape {dst.shape} differs from {tuple(self.g.shapes[out])}")
        self.ds[out], self.scale[out] = dst, self.scale[x]

    def op_GlobalAveragePool(self, node):
        x, out = node.inputs[0], node.outputs[0]
        c, h, w = (self.view(x) if self.memory else self.src(x, conv=True)).shape
        weights = np.full((c, 1, h, w), 1.0 / (h * w))
        if self.memory:
            self.mem_conv(x, out, weights, None, None, groups=c, model=False)
            return
        self.conv(x, out, weights, None, None, groups=c, model=False)

    def op_AveragePool(self, node):
        """Average pooling: memory mode only (:meth:`mem_pool`)."""
        self.needs_memory("AveragePool runs with the activations in system memory")

    def op_Concat(self, node):
        """Concatenation: memory mode only (:meth:`mem_concat`)."""
        self.needs_memory("Concat runs with the activations in system memory")

    def _alias(self, node):
        x, out = node.inputs[0], node.outputs[0]
        self.ds[out], self.scale[out] = self.src(x), self.scale[x]
        if int(np.prod(self.g.shapes[out])) != int(np.prod(self.ds[out].shape)):
            self.fail("the element count changes")

    op_Flatten = op_Reshape = op_Squeeze = op_Unsqueeze = op_Identity = _alias


def lower_int8(graph, config, scales, name="", compression=None, spill=False, cores=None,
               chain=True, schedule="depth-first"):
    """``(builder, plan, io)``: the int8 program's builder, the per-layer plan rows and the
    scales ``{"inputs": {name: scale}, "outputs": {name: scale}}``; ``compression`` a
    :class:`npu_compiler.compress.Compression`; ``spill``: every layer's end a safe switch
    point (:meth:`_Int8._spill`); ``cores`` the cores a layer is split over (None: all,
    :mod:`npu_compiler.cores`); ``chain``: a conv streams into the pool, ReLU or add after it
    through a flow-controlled ring (not with ``spill``); ``schedule``
    (:data:`~npu_compiler.depthfirst.SCHEDULES`): in memory mode, layers that do not fit the
    buffer run depth first or layer by layer."""
    lw = _Int8(graph, config, scales, name, compression, cores, chain)
    lw.spill = spill
    try:
        lw.run()
    except NeedsMemory:
        # The activations do not fit the buffer (or an operator needs system memory): every
        # activation in system memory, layers in bands (npu_compiler.int8mem).
        lw = _Int8(graph, config, scales, name, compression, cores, chain=False,
                   schedule=schedule)
        lw.memory = True
        lw.run()
    io = {"inputs": {n: lw.scale[n] for n in graph.inputs},
          "outputs": {n: lw.scale[n] for n in graph.outputs}}
    return lw.b, lw.plan, io

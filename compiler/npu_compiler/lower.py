"""Lowering a :class:`~npu_compiler.graph.Graph` onto the engines (binary16 activations).

Every ONNX tensor lives in system memory, dense, in its ONNX shape (binary16). An operator is
one or more *steps*: DMA tasks load its operands into buffer datasets (any layout: the DMA
walks a rank-5 index space with any strides, so transposes, slices, padding and
subsampling are DMA work), an engine task computes, DMA tasks store the result. A layer that
does not fit the buffer is cut into bands of output rows (convolution, pooling) or into
channel chunks (everything else). Under the depth-first schedule (the default), chains of
layers that do not fit the buffer run as row bands in the partial-network order instead, their
intermediate tensors kept as rings of rows (:mod:`npu_compiler.depthfirst`). Shape-only
operators (``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``, ``Identity``) are aliases of
the same bytes.

Mapping (``docs/compiler.md`` has the table): ``Conv``, ``Gemm`` and ``MatMul`` with constant
weights, per-channel affine operations (``BatchNormalization``, ``Mul``/``Add`` by a
per-channel constant) and the activations other than ReLU run on the neural engine (the
activations through its post-processor, as a depthwise 1x1 convolution of weight 1 when they
are not fused); ``Relu``, pooling, reductions and elementwise operations between tensors on
the planar engine.
"""

import contextlib
import hashlib
from dataclasses import dataclass

import numpy as np

from npu_model.builder import BuildError, ProgramBuilder
from npu_spec import dataproc, neural
from npu_spec import dma as dma_spec
from npu_spec import planar as planar_spec
from npu_spec.mac import MacFormat
from npu_spec.program import TENSOR_FORMATS, Tensor, dense_strides

from .compress import Compression, encode_kernels, prune
from .cores import check_cores, core_blobs
from .depthfirst import BAND_SHARE, SCHEDULES
from .graph import CompileError

__all__ = ["Lowering", "MView", "Transfers", "lower"]

FP16 = "fp16"
MAX_DIM = (1 << planar_spec.SHAPE_BITS) - 1
PLANE_DEPTH = planar_spec.LINE_BUFFER_DEPTH


@dataclass(frozen=True)
class MView:
    """A view of a system-memory tensor: ``shape`` and ``strides`` (bytes) from byte
    ``addr``.

    A *ring* view (``ring`` R > 0) holds only R rows along axis ``axis``: index ``i`` along
    it lies in slot ``(row + i) mod R`` (``addr`` is slot 0), so a tensor whose rows are
    consumed soon after they are made needs R rows of memory, not all of them
    (:mod:`npu_compiler.depthfirst`). :meth:`pieces` cuts a ring view into plain ones."""
    addr: int
    shape: tuple
    strides: tuple
    ring: int = 0
    row: int = 0
    axis: int = 0

    @staticmethod
    def dense(tensor):
        return MView(tensor.addr, tuple(tensor.shape),
                     dense_strides(tensor.shape, tensor.format))

    def reshape(self, shape, elem=FP16):
        """The same dense elements (of format ``elem``) in ``shape``; a ring only with
        leading axes of one added or removed."""
        shape = tuple(shape)
        if not self.ring:
            return MView(self.addr, shape, dense_strides(shape, elem))
        lead = len(shape) - len(self.shape)
        old = self.shape[max(0, -lead):]
        new = shape[max(0, lead):]
        if old != new or any(n != 1 for n in (shape[:lead] if lead > 0
                                             else self.shape[:-lead])):
            raise CompileError(f"a ring tensor of shape {self.shape} cannot be seen as {shape}")
        strides = (0,) * lead + self.strides if lead >= 0 else self.strides[-lead:]
        return MView(self.addr, shape, strides, self.ring, self.row, self.axis + lead)

    def slice(self, axis, start, stop, step=1):
        shape = list(self.shape)
        strides = list(self.strides)
        shape[axis] = len(range(start, stop, step))
        if self.ring and axis == self.axis:
            if step != 1:
                raise CompileError("a ring tensor is read with row step 1 only")
            return MView(self.addr, tuple(shape), self.strides, self.ring, self.row + start,
                         self.axis)
        addr = self.addr + start * strides[axis]
        strides[axis] *= step
        return MView(addr, tuple(shape), tuple(strides), self.ring, self.row, self.axis)

    def permute(self, perm):
        return MView(self.addr, tuple(self.shape[p] for p in perm),
                     tuple(self.strides[p] for p in perm), self.ring, self.row,
                     list(perm).index(self.axis) if self.ring else 0)

    def pieces(self):
        """``(first, end, view)``: the view as plain views of indices ``first .. end - 1``
        along the ring axis, each inside the ring without wrapping (one piece for a plain
        view)."""
        if not self.ring:
            yield 0, self.shape[self.axis] if self.shape else 1, self
            return
        n = self.shape[self.axis]
        if n > self.ring:
            raise CompileError(f"{n} rows do not fit a ring of {self.ring}")
        i = 0
        while i < n:
            slot = (self.row + i) % self.ring
            k = min(n - i, self.ring - slot)
            shape = list(self.shape)
            shape[self.axis] = k
            yield i, i + k, MView(self.addr + slot * self.strides[self.axis], tuple(shape),
                                  self.strides)
            i += k

    @property
    def size(self):
        return int(np.prod(self.shape))


def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)


def _f32bits(x):
    return np.asarray(x, np.float32).view(np.uint32).astype(np.int64)


def _as3(shape):
    """The ``(C, H, W)`` view of an ONNX shape: leading dimensions merge into ``C``."""
    shape = tuple(int(n) for n in shape)
    if len(shape) == 0:
        return (1, 1, 1)
    if len(shape) == 1:
        return (1, 1, shape[0])
    if len(shape) == 2:
        return (1, shape[0], shape[1])
    return (int(np.prod(shape[:-2])), shape[-2], shape[-1])


def _merge(sizes, s1, s2):
    """Drop size-1 dimensions and merge dimensions contiguous on both sides (innermost
    first), as long as the merged size fits a DMA size field."""
    out = []
    for n, a, b in zip(sizes, s1, s2):
        if n == 1:
            continue
        if out and out[-1][1] * out[-1][0] == a and out[-1][2] * out[-1][0] == b \
                and out[-1][0] * n < 1 << dma_spec.SIZE_BITS:
            m = out.pop()
            out.append((m[0] * n, m[1], m[2]))
        else:
            out.append((n, a, b))
    return out or [(1, 0, 0)]


def _flat_shape(n, limit=MAX_DIM):
    """``(H, W)`` with ``H * W = n``, ``W`` the largest divisor of ``n`` up to 1024 (wide rows
    keep the lanes busy) and ``H`` at most ``limit``; None if there is none."""
    for w in range(min(n, 1024), 0, -1):
        if n % w == 0 and n // w <= limit:
            return n // w, w
    return None


class Transfers:
    """DMA between system-memory views (:class:`MView`) and buffer datasets, for elements of
    format :attr:`elem` (``fp16`` or ``int8``): the machinery of :class:`Lowering` that the
    int8 lowering shares (:mod:`npu_compiler.int8`). A subclass has ``b`` (the builder),
    ``buf_size``, ``_temps``, ``_step``, ``_count(engine, dma_elements)`` and
    ``fill_source(value)`` (a one-element constant view holding ``value``)."""

    elem = FP16

    # ---- DMA -----------------------------------------------------------------------------

    def _dma(self, direction, mview, buf_addr, buf_strides, label):
        """One DMA task between memory view ``mview`` and the buffer elements
        ``buf_addr + sum(i_k * buf_strides[k])`` over the same index space (one task for each
        piece of a ring view)."""
        if mview.ring:
            for first, _, piece in mview.pieces():
                self._dma(direction, piece, buf_addr + first * buf_strides[mview.axis],
                          buf_strides, label)
            return
        dims = _merge(reversed(mview.shape), reversed(mview.strides), reversed(buf_strides))
        if len(dims) > 5:
            raise CompileError(f"{self._step}: a transfer of rank {len(dims)} (at most 5)")
        sizes = [d[0] for d in dims] + [1] * (5 - len(dims))
        ms = [d[1] for d in dims] + [0] * (5 - len(dims))
        bs = [d[2] for d in dims] + [0] * (5 - len(dims))
        esize = TENSOR_FORMATS[self.elem]
        fmt = dma_spec.DmaFormat.HALF if esize == 2 else dma_spec.DmaFormat.INT8
        t = dma_spec.make_transfer(dir=direction, fmt=fmt,
                                   mem_addr=mview.addr - 4 * self.b.base, buf_addr=buf_addr,
                                   sizes=sizes, mem_strides=ms, buf_strides=bs)
        mlo, mhi = dma_spec.extent(mview.addr, sizes, ms)
        blo, bhi = dma_spec.extent(buf_addr, sizes, bs)
        mem = [("mem", mlo, mhi + esize)]
        buf = [("buf", blo, bhi + 1)]
        if direction == dma_spec.DmaDir.MEM_TO_BUF:
            self.b._dma(t, mem, buf, {}, label)
        else:
            self.b._dma(t, buf, mem, {}, label)
        self._count("dma", int(np.prod(sizes)))

    def load_any(self, mview, ds):
        """Copy ``mview`` (any shape and strides) into dense dataset ``ds`` in raster order."""
        self._dma(dma_spec.DmaDir.MEM_TO_BUF, mview, ds.addr, _dense_elements(mview.shape),
                  "load")

    def store_any(self, ds, mview):
        """Copy dense dataset ``ds`` in raster order into ``mview``."""
        self._dma(dma_spec.DmaDir.BUF_TO_MEM, mview, ds.addr, _dense_elements(mview.shape),
                  "store")

    def load3(self, mview, ds):
        """``mview`` of shape ``(C, H, W)`` into dataset ``ds`` of that shape (any strides)."""
        self._dma(dma_spec.DmaDir.MEM_TO_BUF, mview, ds.addr, (ds.cstride, ds.rstride, 1),
                  "load")

    def store3(self, ds, mview, xstep=1, ystep=1):
        """Dataset ``ds`` (every ``ystep``-th row and ``xstep``-th column) into ``mview``
        ``(C, H, W)``."""
        self._dma(dma_spec.DmaDir.BUF_TO_MEM, mview, ds.addr,
                  (ds.cstride, ds.rstride * ystep, xstep), "store")

    def fill(self, ds, value):
        """Set every element of dense dataset ``ds`` to ``value`` (a DMA from one constant
        element with zero strides)."""
        src = self.fill_source(value)
        c, h, w = ds.shape
        self._dma(dma_spec.DmaDir.MEM_TO_BUF, MView(src.addr, (c, h, w), (0, 0, 0)), ds.addr,
                  (ds.cstride, ds.rstride, 1), "fill")

    def buffer(self, shape):
        try:
            return self.b.buffer(shape, self.elem)
        except BuildError:
            raise CompileError(f"{self._step}: a dataset of {'x'.join(map(str, shape))} "
                               f"elements does not fit the {self.buf_size}-element buffer "
                               f"(after tiling)") from None

    def release(self, *datasets):
        for ds in datasets:
            self.b.release(ds)

    def _release_all(self):
        """Free the datasets the engines' steps left (:attr:`_temps`)."""
        for ds in self._temps:
            self.b.release(ds)
        self._temps = []


class Lowering(Transfers):
    """Lowers ``graph`` for ``config``; :meth:`run` returns the builder with every task."""

    def __init__(self, graph, config, *, name="", schedule="depth-first", fmt="fp16",
                 compression=None, cores=None, chain=True):
        for needed in ("fp16", fmt):
            if needed not in config.formats:
                raise CompileError(f"preset {config.name!r} has no {needed} datapath; "
                                   f"--format {fmt} needs one")
        #: binary16 data x binary16 weights (``fp16``) or x int8 weights (``mixed``).
        self.mac_fmt = MacFormat.F16I8 if fmt == "mixed" else MacFormat.FP16
        self.compression = compression or Compression()
        self._lossy = False     # True while lowering a layer of the model's own weights
        self.g = graph
        self.cfg = config
        self.name = name
        if schedule not in SCHEDULES:
            raise CompileError(f"schedule must be one of {', '.join(SCHEDULES)}, not "
                               f"{schedule!r}")
        self.schedule = schedule
        self.b = ProgramBuilder(config)
        self.views = {}
        self.plan = []
        self.buf_size = dataproc.buffer_elements(config)
        self.buffer_rows = neural.engine_geometry(config)[2]
        self.kmem_words = config.kernel_kib * 256
        self._consts = {}
        self._step = None
        self._row = None
        self._temps = []
        self._blobs = {}
        self._mark = 0
        self._defer = None          # node name -> where its band function goes (depth first)
        self._rings = {}            # tensor -> rows of its ring (depth first)
        self._placed = {}           # kernel blob key -> KernelPlacement
        self.cores = check_cores(config, cores)     # cores a layer may be split over
        self.chain = chain          # layer chains through the buffer (npu_compiler.chain)
        self._parts = {}            # id(blob) -> its parts, one per core (npu_compiler.cores)
        self.unchained = set()      # node indices no chain may start at (see lower())

    # ---- memory --------------------------------------------------------------------------

    def _new_tensor(self, name, shape, role="scratch", values=None):
        shape = tuple(int(n) for n in shape) or (1,)
        t = self.b.tensor(name, shape, FP16, role, values)
        return MView.dense(t)

    def _const_tensor(self, key, values):
        """A binary16 constant in system memory (shared by key)."""
        if key not in self._consts:
            arr = _f16(values)
            self._consts[key] = self._new_tensor(f"const:{key}", arr.shape or (1,), "constant",
                                                 arr.reshape(arr.shape or (1,)))
        return self._consts[key]

    def fill_source(self, value):
        """A one-element binary16 constant holding ``value`` (:meth:`Transfers.fill`)."""
        return self._const_tensor(f"fill{float(value)}", np.asarray([value], np.float32))

    def _output_tensor(self, name):
        shape = self.g.shapes[name]
        role = "output" if name in self.g.outputs else "scratch"
        ring = self._rings.get(name, 0)
        if ring and ring < shape[2]:
            # Rows made and read inside a depth-first segment: a ring of ``ring`` rows.
            stored = (1, shape[1], ring, shape[3])
            t = self.b.tensor(name, stored, FP16, role)
            v = MView(t.addr, tuple(shape), dense_strides(stored, FP16), ring=ring, axis=2)
        else:
            v = self._new_tensor(name, shape, role)
        self.views[name] = v
        return v

    def _alias(self, name, view):
        """``name`` is the same bytes as ``view`` (dense) in another shape."""
        shape = tuple(self.g.shapes[name])
        v = MView(view.addr, shape, dense_strides(shape, FP16))
        self.views[name] = v
        if name in self.g.outputs:
            self.b.tensors.append(Tensor(name, "output", v.addr, FP16, shape or (1,)))

    def view(self, name):
        if name in self.views:
            return self.views[name]
        c = self.g.const(name)
        if c is not None:
            v = self._const_tensor(name, c)
            self.views[name] = v.reshape(c.shape) if c.shape else v
            return self.views[name]
        raise CompileError(f"tensor {name!r} has no value")

    # ---- plan ----------------------------------------------------------------------------

    def _begin(self, node, what=None):
        self._step = str(node)
        self._row = {"node": node.name, "op": node.op, "engine": set(), "tasks": 0,
                     "first_task": len(self.b.tasks), "in": [list(self.g.shapes.get(i, ()))
                                                             for i in node.inputs if i
                                                             and i not in self.g.consts],
                     "out": [list(self.g.shapes.get(o, ())) for o in node.outputs if o],
                     "kernel_bytes": 0, "kernel_raw_bytes": 0, "kernel_encoding": "",
                     "dma_elements": 0,
                     "macs": 0, "how": what or "", "buffer_peak": 0, "_from": None,
                     "cores": 1}
        self._mark = len(self.b.tasks)

    def _count(self, engine, dma_elements=0):
        if self._row is not None:
            self._row["engine"].add(engine)
            self._row["dma_elements"] += dma_elements

    def _pause(self):
        """Charge the tasks added since :meth:`_begin` or :meth:`_resume` to the current row
        (a depth-first schedule interleaves the tasks of several layers)."""
        row, n = self._row, len(self.b.tasks)
        if n > self._mark:
            row["tasks"] += n - self._mark
            if row["_from"] is None:
                row["_from"] = self._mark
            row["last_task"] = n - 1
            row["buffer_peak"] = max(row["buffer_peak"],
                                     max(t.buffer for t in self.b.tasks[self._mark:n]))
        self._mark = n

    def _resume(self, row, step):
        self._row, self._step = row, step
        self._mark = len(self.b.tasks)

    def _end(self):
        self._pause()
        row = self._row
        if row["_from"] is not None:
            row["first_task"] = row["_from"]
        else:
            row["last_task"] = row["first_task"] - 1
        del row["_from"]
        engines = row["engine"]
        row["engine"] = ("NE" if "ne" in engines else "PE" if "pe" in engines
                         else "DMA" if "dma" in engines else "-")
        row["engines"] = sorted(engines)
        self.plan.append(row)
        self._row = None

    def band_budget(self, node):
        """Buffer elements one band of ``node`` may use: half the buffer under a depth-first
        schedule (:data:`~npu_compiler.depthfirst.BAND_SHARE`), else all of it."""
        if self._defer is not None and node.name in self._defer:
            return self.buf_size // BAND_SHARE
        return self.buf_size

    def deferred(self, node):
        """Under a depth-first schedule, the function that takes ``node``'s band function
        (``bands(first_row, end_row)``) to call later in the schedule's order; else None."""
        return None if self._defer is None else self._defer.get(node.name)

    # ---- engines -------------------------------------------------------------------------

    def planar(self, a, b=None, c=None, out=None, **fields):
        fields.setdefault("in_fmt", planar_spec.Fmt.FP16)
        fields.setdefault("out_fmt", planar_spec.Fmt.FP16)
        try:
            r = self.b.planar(a, b, c, out, **fields)
        except BuildError as e:
            raise CompileError(f"{self._step}: {e}") from None
        self._count("pe")
        return r

    def kernels(self, w, bias, scale, groups):
        """A kernel blob: ``out = (bias + sum w x) * scale`` per output channel, binary16
        weights (``fp16``) or int8 weights with the per-channel scale folded into the bias and
        scale (``mixed``, :func:`mixed_weights`); bias and scale binary32. The smallest
        lossless encoding (:mod:`npu_compiler.compress`), palettized first with ``--palette``
        while lowering the model's own weights."""
        return self._kernels(w, bias, scale, groups)[0]

    def _kernels(self, w, bias, scale, groups):
        """``(blob, raw_bytes, choice)`` of :meth:`kernels`."""
        k = w.shape[0]
        bias = np.broadcast_to(np.asarray(bias, np.float64), (k,))
        scale = np.broadcast_to(np.asarray(scale, np.float64), (k,))
        if self.mac_fmt == MacFormat.F16I8:
            codes, bias, scale = mixed_weights(w, bias, scale)
        else:
            codes = _f16(w)
        bias, scale = _f32bits(bias), _f32bits(scale)
        palette = self.compression.palette if self._lossy else None
        key = hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in (codes, bias,
                                                                             scale))
                           + repr((codes.shape, groups, palette)).encode()).hexdigest()
        if key not in self._blobs:     # bands of one layer use the same kernels
            self._blobs[key] = encode_kernels(codes, fmt=self.mac_fmt, bias=bias, scale=scale,
                                              groups=groups, slots=self.cfg.acc_slots,
                                              palette_bits=palette,
                                              raw=self.compression.raw,
                                              extract=self.cfg.kernel_extract)
        return self._blobs[key]

    def conv_task(self, src, w, bias, scale, groups, dst, stride=1, pad=0, dilation=1,
                  act=None, cores=None):
        """One neural-engine task (its kernels loaded first); ``dst`` a dataset. The output
        channels are split over :attr:`cores` cores, or ``cores`` when given (1 for a
        flow-controlled output)."""
        blob, raw_bytes, choice = self._kernels(w, bias, scale, groups)
        key = (id(blob), cores or self.cores)
        if key not in self._parts:
            self._parts[key] = core_blobs(blob, cores or self.cores)
        parts = self._parts[key]
        if max(part.words for part in parts) > self.kmem_words:
            raise _TooBig()
        if self._row is not None:
            row = self._row
            row["kernel_bytes"] += 4 * sum(part.words for part in parts)
            row["cores"] = max(row["cores"], len(parts))
            row["kernel_raw_bytes"] += raw_bytes
            names = set(filter(None, row["kernel_encoding"].split(", ")))
            row["kernel_encoding"] = ", ".join(sorted(names | {choice.name(self.mac_fmt)}))
            row["macs"] += int(np.prod(w.shape)) * dst.shape[1] * dst.shape[2]
        places = []
        for core, part in enumerate(parts):
            place = self._placed.get(id(part))
            if place is None or not self.b.resident(place):
                # Loaded once while it stays in kernel memory (the bands of a layer).
                place = self.b.dma_kernels(core, part, share_image=True)
                self._placed[id(part)] = place
                self._count("dma", part.words)
            places.append(place)
        act = dict(act or {})
        kind = act.pop("act", "none")
        try:
            r = self.b.conv(src, places if len(places) > 1 else places[0], dst, stride=stride,
                            pad=pad, dilation=dilation, act=kind, **act)
        except BuildError as e:
            raise CompileError(f"{self._step}: {e}") from None
        layer_err = self._layer_error(src, blob, dst, stride, pad, dilation, groups)
        if layer_err:
            raise CompileError(f"{self._step}: the neural engine cannot run this layer "
                               f"({layer_err})")
        self._count("ne")
        return r

    def _layer_error(self, src, blob, dst, stride, pad, dilation, groups):
        _, icpg, kh, kw = blob.weight_shape
        c, h, w = src.shape
        k, oh, ow = dst.shape
        layer = neural.make_layer(fmt=blob.fmt, log2w=neural.best_log2w(self.cfg, ow, kw, stride,
                                                                 dilation),
                                  groups=groups, icpg=icpg, ocpg=k // groups, in_h=h, in_w=w,
                                  out_h=oh, out_w=ow, kh=kh, kw=kw, stride=stride,
                                  dilation=dilation, pad=pad, out_fp16=1)
        err = neural.layer_error(layer, self.cfg)
        return None if err == neural.NeuralError.NONE else err.name

    @contextlib.contextmanager
    def model_weights(self):
        """While lowering a layer with the model's own weights: ``--palette`` applies to its
        kernel blobs (not to the kernels the compiler makes, e.g. for activations)."""
        self._lossy = True
        try:
            yield
        finally:
            self._lossy = False

    def pruned(self, w):
        """A layer's float weights after ``--prune`` (magnitude pruning over the layer)."""
        return prune(w, self.compression.prune) if self.compression.prune else w

    # ---- lowering ------------------------------------------------------------------------

    def run(self):
        for name in self.g.inputs:
            shape = self.g.shapes[name]
            if not self.g.is_float(name):
                raise CompileError(f"input {name!r} has element type "
                                   f"{np.dtype(self.g.dtypes[name]).name}; the NPU takes "
                                   f"float inputs")
            t = self.b.input(name, np.zeros(tuple(shape) or (1,), np.uint16), FP16)
            self.views[name] = MView.dense(t)
        from . import chain, depthfirst, ops
        for name, shape in self.g.shapes.items():
            if 0 in tuple(shape) and (name in self.g.inputs or name in self.g.outputs):
                raise CompileError(f"tensor {name!r} is empty (shape {tuple(shape)}); the NPU "
                                   f"needs at least one element")
        segments = depthfirst.segments(self) if self.schedule == "depth-first" else {}
        self.segments = list({id(s): s for s in segments.values()}.values())
        done = set()
        for index, node in enumerate(self.g.nodes):
            seg = segments.get(index)
            if seg is not None:
                if node is seg.nodes[-1]:
                    depthfirst.emit(self, seg)
                continue
            if index in done:
                continue
            run = (chain.candidate(self, index, segments) if self.chain
                   and index not in self.unchained else [])
            how = chain.plan(self, [self.g.nodes[i] for i in run]) if run else None
            if how is not None:
                try:
                    chain.emit(self, how)
                except (BuildError, CompileError) as e:
                    raise _ChainFailed(index, str(e)) from None
                done.update(range(index, index + sum(len(s["nodes"]) for s in how)))
                continue
            fn = ops.LOWER.get(node.op)
            if fn is None:
                raise CompileError(f"{node}: operator {node.op} is not supported on the NPU")
            for o in node.outputs:
                if o and not self.g.is_float(o):
                    raise CompileError(f"{node}: output {o!r} has element type "
                                       f"{np.dtype(self.g.dtypes[o]).name}; only float "
                                       f"tensors run on the NPU")
            self._begin(node)
            try:
                fn(self, node)
            except BuildError as e:
                raise CompileError(f"{node}: {e}") from None
            self._end()
        for name in self.g.outputs:
            if name in self.g.consts and name not in self.views:
                c = self.g.consts[name]
                t = self.b.tensor(name, c.shape or (1,), FP16, "output",
                                  _f16(c).reshape(c.shape or (1,)))
                self.views[name] = MView.dense(t)
            elif name in self.g.inputs:
                self._alias_output(name)
        return self.b

    def _alias_output(self, name):
        v = self.views[name]
        if not any(t.name == name and t.role == "output" for t in self.b.tensors):
            # An input that is also an output: a copy named "<name>:out".
            src = v
            dst = self.b.tensor(f"{name}:out", v.shape or (1,), FP16, "output")
            ds = self.buffer(_as3(v.shape))
            self.load_any(src, ds)
            self.store_any(ds, MView.dense(dst))
            self.release(ds)


class _TooBig(Exception):
    """A kernel blob larger than the kernel memory: the caller splits the layer."""


class _ChainFailed(Exception):
    """The builder refused a chain's tasks (e.g. a planar task that would have to wait
    for tasks of two other engines): :func:`lower` lowers again without that chain."""

    def __init__(self, index, why):
        super().__init__(why)
        self.index = index


def _dense_elements(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def mixed_weights(w, bias, scale):
    """``(codes, bias, scale)`` of a layer ``out = (bias + sum w x) * scale`` with int8
    weights: per output channel ``s = max |w| / 127`` (1 for a channel of integers in
    [-127, 127], e.g. all zero), codes
    ``round_half_even(w / s)``, and ``s`` folded into the post-processor as ``bias / s`` and
    ``scale * s`` (float64 here; the kernel header holds them as binary32)."""
    w = np.asarray(w, np.float64)
    if not np.all(np.isfinite(w)):
        raise CompileError("--format mixed: the weights must be finite")
    k = w.shape[0]
    flat = w.reshape(k, -1)
    peak = np.abs(flat).max(axis=1) if w.size else np.zeros(k)
    # Channels of integer weights within int8 (e.g. the weight-1 kernels of an activation)
    # keep s = 1, so they stay exact.
    whole = np.all(flat == np.rint(flat), axis=1) & (peak <= 127)
    s = np.where(whole | (peak == 0), 1.0, peak / 127.0)
    codes = np.clip(np.rint(w / s.reshape((k,) + (1,) * (w.ndim - 1))), -127, 127)
    return codes.astype(np.int8), np.asarray(bias, np.float64) / s, np.asarray(scale) * s


def lower(graph, config, name="", schedule="depth-first", fmt="fp16", compression=None,
          cores=None, chain=True):
    """The :class:`Lowering` of ``graph`` after :meth:`Lowering.run` (its builder ``b`` holds
    the tasks, ``plan`` the per-layer rows); ``schedule`` (:data:`SCHEDULES`) runs chains of
    layers that do not fit the buffer depth first or layer by layer; ``fmt`` ``fp16`` or
    ``mixed`` (int8 weights), ``compression`` a :class:`npu_compiler.compress.Compression`;
    ``cores`` how many of the configuration's neural-engine cores a layer is split over
    (None: all, :mod:`npu_compiler.cores`); ``chain``: runs of convs and planar layers
    keep their intermediates in the buffer (:mod:`npu_compiler.chain`)."""
    unchained = set()
    while True:
        lw = Lowering(graph, config, name=name, schedule=schedule, fmt=fmt,
                      compression=compression, cores=cores, chain=chain)
        lw.unchained = set(unchained)
        try:
            lw.run()
        except _ChainFailed as e:
            # The chain's dependencies do not fit the descriptors' one wait: lower again,
            # those layers one by one (each failure removes a chain start, so this ends).
            unchained.add(e.index)
            continue
        return lw


"""int8 activations in system memory, layers cut into bands (``docs/compiler.md``, "int8").

When the int8 network's live activations do not fit the buffer (or it has an operator that
needs system memory, such as ``Concat``), :func:`npu_compiler.int8.lower_int8` lowers it again
in *memory mode*: every activation is an int8 tensor in system memory, in its ``(C, H, W)``
shape, and each layer loads what it needs, runs and stores its result, with the fp16
lowering's machinery (:class:`npu_compiler.lower.Transfers` for the DMA,
:func:`npu_compiler.ops.windowed` for bands of output rows whose input rows are loaded into a
dataset padded explicitly from a one-byte constant: 0 for convolutions and averages, -128
for max pooling). The results are those of one whole-layer task bit for bit: int32
accumulation is exact and every output element sees the same inputs and weights.

Output channels are cut into chunks whose kernels fit the kernel memory; a layer with more
input channels times kernel rows than the input buffer's rows is *folded* (channels into
columns, :meth:`MemoryInt8._fold`). ``Concat`` copies its operands into parts of the output
(an operand of another scale requantized on the way); under the depth-first schedule the
segments of :mod:`npu_compiler.depthfirst` run as interleaved row bands with their
intermediate tensors in rings of rows (:meth:`MemoryInt8.emit_segment`).

:class:`MemoryInt8` is the mixin of :class:`npu_compiler.int8._Int8` that does it.
"""

import dataclasses

import numpy as np

from npu_spec import dataproc, neural
from npu_spec import dma as dma_spec
from npu_spec import planar as planar_spec
from npu_spec.program import dense_strides

from . import ops
from .compress import Compression, prune
from .cores import core_blobs
from .cores import place as place_on_cores
from .depthfirst import BAND_SHARE
from .lower import MView, Transfers
from .quant import quantize_conv

__all__ = ["MemoryInt8", "NeedsMemory"]

#: Largest kernel side of the neural engine.
MAX_KERNEL = 16


class NeedsMemory(Exception):
    """The buffer-resident int8 lowering cannot take this network: lower it in memory
    mode."""


def _dense(addr, shape):
    return MView(addr, tuple(shape), dense_strides(tuple(shape), "int8"))


class MemoryInt8(Transfers):
    """Memory mode of the int8 lowering (module docstring). The host class provides ``g``,
    ``cfg``, ``b``, ``scale``, ``ds``, ``node``, ``row``, ``compression``, ``cores``,
    ``fail``, ``out_scale``, ``kernels``, ``_check_layer`` and ``pwl_split``."""

    elem = "int8"

    def _init_memory(self):
        self.memory = False
        self.mv = {}            # tensor -> MView of its (C, H, W) int8 tensor
        self.buf_size = dataproc.buffer_elements(self.cfg)
        self.buffer_rows = neural.engine_geometry(self.cfg)[2]
        self.kmem_words = self.cfg.kernel_kib * 256
        self._temps = []
        self._step = None
        self._fills = {}
        self._placed = {}       # id(blob) -> (parts, placements)
        self._raw = {}          # id(blob) -> its raw kernel bytes
        self._stored = set()    # graph outputs whose tensor is their ``name:q`` tensor
        self._defer = None      # node name -> where its band functions go (depth first)
        self._rings = {}        # tensor -> rows of its ring (depth first)
        self._requant = {}      # (tensor, c0, c1, scale) -> (part, blob) of a requantization

    # ---- hooks of Transfers and ops.windowed -------------------------------------------------

    def load3(self, mview, ds):
        """:meth:`Transfers.load3`, also of a :class:`_Folded` view."""
        if isinstance(mview, _Folded):
            self._dma(dma_spec.DmaDir.MEM_TO_BUF, mview.v4, ds.addr,
                      (ds.cstride, ds.rstride, mview.v4.shape[3], 1), "load")
            return
        super().load3(mview, ds)

    def _count(self, engine, dma_elements=0):
        """Plan rows of the int8 lowering count tasks only."""

    def fill_source(self, value):
        v = int(value)
        if v not in self._fills:
            t = self.b.tensor(f"int8:fill{v}", (1,), "int8", "constant",
                              np.array([v], np.int8))
            self._fills[v] = MView(t.addr, (1,), (1,))
        return self._fills[v]

    def deferred(self, node):
        return None if self._defer is None else self._defer.get(node.name)

    def band_budget(self, node):
        if self._defer is not None and node.name in self._defer:
            return self.buf_size // BAND_SHARE
        return self.buf_size

    # ---- tensors -----------------------------------------------------------------------------

    def mem_input(self, name, shape3):
        t = self.b.input(name, np.zeros(shape3, np.int8))
        self.mv[name] = _dense(t.addr, shape3)

    def view(self, name):
        if name not in self.mv:
            self.fail(f"input {name!r} is not an int8 activation (a constant or an unsupported "
                      f"producer)")
        return self.mv[name]

    def new_view(self, name, shape3):
        """A new int8 tensor for ``name``: the output tensor ``name:q`` of a graph output, else
        a scratch tensor."""
        if name in self.g.outputs and name not in self._stored:
            t = self.b.tensor(f"{name}:q", shape3, "int8", "output")
            self._stored.add(name)
        elif self._rings.get(name, shape3[1]) < shape3[1]:
            # Rows made and read inside a depth-first segment: a ring of rows.
            stored = (shape3[0], self._rings[name], shape3[2])
            t = self.b.tensor(f"{name}:{len(self.b.tensors)}", stored, "int8", "scratch")
            self.mv[name] = MView(t.addr, tuple(shape3), dense_strides(stored, "int8"),
                                  ring=self._rings[name], axis=1)
            return self.mv[name]
        else:
            t = self.b.tensor(f"{name}:{len(self.b.tensors)}", shape3, "int8", "scratch")
        self.mv[name] = _dense(t.addr, shape3)
        return self.mv[name]

    def mem_outputs(self):
        """Graph outputs that are another tensor's bytes (an alias, an input): copied into
        their ``name:q`` tensors."""
        for name in self.g.outputs:
            if name not in self._stored:
                src = self.view(name)
                ops.copy(self, src, self.new_view(name, src.shape))

    def flat_input(self, x):
        """``(name, (C, H, W))`` of the input of a matrix product on activation ``x``: ``x``
        itself, or when its plane is larger than a kernel an alias ``x:flat`` of shape
        ``(C H W, 1, 1)`` (in the buffer: :meth:`needs_memory`, the engine takes no more
        input channels than its input buffer's rows; in memory the layer is folded)."""
        shape = tuple((self.mv if self.memory else self.ds)[x].shape)
        if max(shape[1:]) <= MAX_KERNEL:
            return x, shape
        if not self.memory:
            self.needs_memory(f"a {shape[1]}x{shape[2]} input plane is larger than a kernel")
        flat = f"{x}:flat"
        n = int(np.prod(shape))
        self.mv[flat] = self.view(x).reshape((n, 1, 1), "int8")
        self.scale[flat] = self.scale[x]
        return flat, (n, 1, 1)

    def mem_alias(self, node):
        x, out = node.inputs[0], node.outputs[0]
        v = self.view(x)
        if int(np.prod(self.g.shapes[out])) != v.size:
            self.fail("the element count changes")
        self.mv[out], self.scale[out] = v, self.scale[x]

    # ---- convolutions --------------------------------------------------------------------

    def mem_conv(self, x, out, w, bias, act, strides=(1, 1), pads=(0, 0, 0, 0), dil=1,
                 groups=1, model=True):
        """A convolution of activation ``x`` (float weights ``w`` ``[K, C/groups, KH, KW]``)
        into a new tensor ``out`` with its calibrated scale: quantized, then
        :meth:`mem_conv_quantized`."""
        s_out = self.out_scale(out)
        lossy = self.compression if model else Compression()
        w = np.asarray(w, np.float64)
        if lossy.prune:
            w = prune(w, lossy.prune)
        try:
            q = quantize_conv(w, bias, self.scale[x], s_out, act)
        except ValueError as e:
            self.fail(str(e))
        self.mem_conv_quantized(x, out, q, strides, pads, dil, groups, lossy.palette)
        self.scale[out] = s_out

    def mem_conv_quantized(self, x, out, q, strides=(1, 1), pads=(0, 0, 0, 0), dil=1,
                           groups=1, palette=None, fill=0):
        """The convolution :class:`~npu_compiler.quant.QuantizedConv` ``q`` of activation
        ``x`` into a new tensor ``out``, in bands of output rows; kernels split over the
        kernel memory; a layer of more input channels than the input buffer's rows folded
        (:meth:`_fold`). ``fill``: the code of the padding (an input zero point)."""
        x3 = self.view(x)
        k, icpg, kh, kw = q.weights.shape
        c, h, width = x3.shape
        if icpg * groups != c:
            self.fail(f"the input has {c} channels, the weights need {icpg * groups}")
        t, left, b, r = pads
        dk = ((kh - 1) * dil + 1, (kw - 1) * dil + 1)
        oshape = (k, (h + t + b - dk[0]) // strides[0] + 1,
                  (width + left + r - dk[1]) // strides[1] + 1)
        out3 = self.new_view(out, oshape)
        if groups == 1 and icpg * kh > self.buffer_rows:
            x3, w, pads, strides = self._fold(x3, q.weights, pads, strides, dil)
            q = dataclasses.replace(q, weights=w)
        if max(q.weights.shape[2:]) > MAX_KERNEL:
            self.fail(f"kernel {'x'.join(map(str, q.weights.shape[2:]))} is larger than the "
                      f"engine's {MAX_KERNEL}x{MAX_KERNEL}")
        for k0, k1, c0, c1 in self._parts(x3.shape, q.weights.shape, groups, pads, strides,
                                          dil):
            part = _slice_conv(q, k0, k1)
            cg = 1 if groups == 1 else (c1 - c0) // icpg
            self._banded_conv(x3.slice(0, c0, c1), out3.slice(0, k0, k1), part, cg, strides,
                              pads, dil, palette, fill)

    def _fold(self, x3, w, pads, strides, dil):
        """A layer whose input channels times kernel rows exceed the input buffer's rows,
        folded: channel ``g c' + j`` becomes column ``g x + j`` of channel ``c'`` (the loads
        of :func:`~npu_compiler.ops.windowed` place it there, :class:`_Folded`), the kernel
        ``(KH, g KW)``, the pads and the horizontal stride ``g`` times theirs. Every output
        sums the same products (int32, exact)."""
        k, c, kh, kw = w.shape
        fold = next((f for f in range(2, c + 1) if c % f == 0 and (c // f) * kh
                     <= self.buffer_rows and f * kw <= MAX_KERNEL), None)
        if fold is None or (dil != 1 and kw != 1):
            self.fail(f"{c} input channels x {kh} kernel rows exceed the input buffer's "
                      f"{self.buffer_rows} rows")
        _, h, width = x3.shape
        src = MView(x3.addr, (c // fold, h, width, fold),
                    (fold * x3.strides[0], x3.strides[1], x3.strides[2], x3.strides[0]),
                    x3.ring, x3.row, x3.axis)
        w = w.reshape(k, c // fold, fold, kh, kw).transpose(0, 1, 3, 4, 2)
        t, left, b, r = pads
        return (_Folded(src),
                w.reshape(k, c // fold, kh, kw * fold), (t, fold * left, b, fold * r),
                (strides[0], fold * strides[1]))

    def _parts(self, xshape, wshape, groups, pads, strides, dil):
        """``(k0, k1, c0, c1)``: output and input channels of each part of a layer, so that
        one output row of a part and the input rows it needs fit the buffer."""
        k, icpg, kh, kw = wshape
        c, _, width = xshape
        wp = width + pads[1] + pads[3]
        s = _engine_stride(strides)
        owe = (wp - (kw - 1) * dil - 1) // s + 1
        rows_in = (kh - 1) * dil + 1
        if groups == 1:
            fixed = c * rows_in * wp
            step = k if fixed + k * owe <= self.buf_size else (self.buf_size - fixed) // owe
            if step < 1:
                self.fail(f"one output row ({fixed} input elements) does not fit the "
                          f"{self.buf_size}-element buffer")
            return [(k0, min(k, k0 + step), 0, c) for k0 in range(0, k, step)]
        ocpg = k // groups
        per = icpg * rows_in * wp + ocpg * owe
        step = max(1, min(groups, self.buf_size // per))
        return [(g0 * ocpg, min(groups, g0 + step) * ocpg, g0 * icpg,
                 min(groups, g0 + step) * icpg) for g0 in range(0, groups, step)]

    def _banded_conv(self, x3, out3, q, groups, strides, pads, dil, palette, fill=0):
        """One part of a convolution: its kernels cut to fit the kernel memory, then
        :func:`npu_compiler.ops.windowed` (the whole part at once when it fits the buffer,
        with the engine's padding of code 0; else, or with another ``fill``, bands padded
        explicitly)."""
        k, icpg, kh, kw = q.weights.shape
        s = _engine_stride(strides)
        blobs = self._blob_chunks(q, groups, palette)
        ocpg = k // groups

        def engine(src, pad, oshape):
            dst = self.buffer((k,) + tuple(oshape))
            self._temps.append(dst)
            for a, b, part, blob in blobs:
                sub = src if groups == 1 else ops._sub(src, a // ocpg * icpg, b // ocpg * icpg)
                out = ops._sub(dst, a, b)
                places = self._resident(blob)
                self.b.conv(sub, places if len(places) > 1 else places[0], out, stride=s,
                            pad=pad, dilation=dil, **part.conv_args())
                self._check_layer(sub, blob, out, s, pad, dil, blob.conv_groups)
            return dst

        t, left, b, r = pads
        native = t if (t == left == b == r and t <= 15 and (fill == 0 or t == 0)) else None
        ops.windowed(self, self.node, x3, out3, kh=kh, kw=kw, s=s, fy=strides[0] // s,
                     fx=strides[1] // s, dil=dil, pads=pads, fill=fill, native=native,
                     engine=engine, k_out=k)

    def _blob_chunks(self, q, groups, palette):
        """``(k0, k1, part, blob)``: output channels cut so that each blob (each core's part)
        fits the kernel memory; whole groups for a grouped layer."""
        k = q.weights.shape[0]
        unit = k // groups if groups > 1 else 1
        step = k
        raw = self.row["kernel_raw_bytes"]
        while True:
            chunks = []
            for k0 in range(0, k, step):
                part = _slice_conv(q, k0, min(k, k0 + step))
                blob = self.kernels(part, max(1, (part.weights.shape[0]) // unit)
                                    if groups > 1 else 1, palette)
                # Raw bytes are counted with each load (:meth:`_resident`), like the encoded.
                self._raw[id(blob)] = self.row["kernel_raw_bytes"] - raw
                self.row["kernel_raw_bytes"] = raw
                chunks.append((k0, min(k, k0 + step), part, blob))
            if all(max(p.words for p in core_blobs(blob, self.cores)) <= self.kmem_words
                   for *_, blob in chunks):
                return chunks
            if step == unit:
                self.fail("one output channel's kernel exceeds the kernel memory")
            step = max(unit, (step // 2) // unit * unit)

    def _resident(self, blob):
        """``blob``'s placements, loaded again when a later load overwrote them."""
        parts, places = self._placed.get(id(blob), (None, None))
        if places is None or not all(self.b.resident(p) for p in places):
            parts = parts or core_blobs(blob, self.cores)
            places = place_on_cores(self.b, parts, share_image=True)
            self.row["kernel_bytes"] += 4 * sum(p.words for p in parts)
            self.row["kernel_raw_bytes"] += self._raw[id(blob)]
            self.row["cores"] = max(self.row["cores"], len(parts))
            self._placed[id(blob)] = (parts, places)
        return places

    # ---- planar engine ---------------------------------------------------------------------

    def mem_pool(self, node, is_max):
        """``MaxPool`` / ``AveragePool`` in bands (``ceil_mode`` and asymmetric pads by
        explicit padding); the output keeps the input's scale."""
        x, out = node.inputs[0], node.outputs[0]
        x3 = self.view(x)
        c, h, w = x3.shape
        (kh, kw), (sy, sx), _, pads, _ = ops._pool_attrs(node, self.g.shapes[x])
        oshape = tuple(int(n) for n in self.g.shapes[out][1:])
        oh, ow = oshape[1:] if len(oshape) == 3 else (1, oshape[1])
        t, left, b, r = pads
        b = max(b, (oh - 1) * sy + kh - h - t)
        r = max(r, (ow - 1) * sx + kw - w - left)
        include = bool(node.attr("count_include_pad", 0))
        if max(kh, kw) > planar_spec.MAX_WINDOW:
            self.fail(f"window {kh}x{kw} (at most {planar_spec.MAX_WINDOW})")
        symmetric = t == b and left == r and t < kh and left < kw
        if not is_max and not include and (t or left or b or r) and not symmetric:
            self.fail("average pooling with asymmetric padding or ceil_mode and "
                      "count_include_pad=0")
        native = (t, left) if symmetric and (is_max or not include or t == left == 0) else None
        op = "max" if is_max else "avg"
        out3 = self.new_view(out, (c, oh, ow))

        def engine(src, pad, _):
            return ops.pool_band(self, src, pad, op=op, window=(kh, kw), stride=(sy, sx),
                                 fmt=planar_spec.Fmt.INT8, planar=self.b.planar,
                                 fail=self.fail)

        wp = w + left + r
        whole = not is_max and not include and bool(t or left)
        if whole:
            # The engine's divisor counts the valid elements: its own padding, whole planes.
            per_channel = h * w + ((h + 2 * t - kh) // sy + 1) * ((w + 2 * left - kw) // sx + 1)
        else:
            per_channel = kh * wp + (wp - kw) // sx + 1
        step = max(1, min(c, self.buf_size // per_channel))
        for c0 in range(0, c, step):
            c1 = min(c, c0 + step)
            ops.windowed(self, node, x3.slice(0, c0, c1), out3.slice(0, c0, c1), kh=kh, kw=kw,
                         s=sy, fy=1, fx=1, dil=1, pads=(t, left, b, r),
                         fill=-128 if is_max else 0, native=native, engine=engine,
                         k_out=c1 - c0, sxe=sx, require_native=whole)
        self.scale[out] = self.scale[x]

    def mem_elementwise(self, node, fn, per_element):
        """``fn(node)`` (an operator of the buffer-resident lowering on same-shape operands)
        over chunks of channels or rows: each chunk's operands loaded into datasets, the
        result stored. ``per_element``: buffer elements the operator uses per element."""
        ins = list(dict.fromkeys(i for i in node.inputs if i))
        views = [self.view(i) for i in ins]
        shape3 = views[0].shape
        if any(v.shape != shape3 for v in views):
            self.fail("both operands must be int8 activations of one shape (no broadcast)")
        out = node.outputs[0]
        out3 = self.new_view(out, shape3)
        c, _, w = shape3
        budget = self.band_budget(node) // per_element

        def bands(first, end):
            for c0, c1, h0, h1 in ops._boxes((c, end - first, w), budget):
                h0, h1 = h0 + first, h1 + first
                loaded = []
                for name, v in zip(ins, views):
                    ds = self.buffer((c1 - c0, h1 - h0, w))
                    self.load3(ops._view3(v, c0, c1, h0, h1), ds)
                    self.ds[name] = ds
                    loaded.append(ds)
                fn(node)
                y = self.ds.pop(out)
                self.store3(y, ops._view3(out3, c0, c1, h0, h1))
                self.release(y, *loaded)
                self.ds.clear()

        self._run_bands(node, bands, shape3[1])

    # ---- concatenation -------------------------------------------------------------------

    def concat_scale(self, name):
        """The scale a producer gives tensor ``name`` when a ``Concat`` alone reads it (the
        ``Concat``'s, so that its operands need no requantization), else None."""
        readers = self.g.consumers(name)
        if (self.memory and len(readers) == 1 and readers[0].op == "Concat"
                and name not in self.g.outputs):
            return self.out_scale(readers[0].outputs[0])
        return None

    def mem_concat(self, node):
        """``Concat``: each operand copied by DMA into its part of the output; an operand of
        another scale is requantized first (a depthwise 1x1 layer of weight 1)."""
        out = node.outputs[0]
        s_out = self.out_scale(out)
        shape = tuple(self.g.shapes[out])
        rank = len(shape)
        axis = node.attr("axis") % rank
        if rank not in (2, 4) or axis == 0:
            self.fail(f"concatenation along axis {axis} of a rank-{rank} tensor")
        ax = axis - 1 if rank == 4 else 0
        views = [(name, self.view(name)) for name in node.inputs if name]
        out3 = self.new_view(out, _shape3_of(shape))
        self.scale[out] = s_out
        if ax == 0:
            self._run_bands(node, self._concat_bands(node, views, out3), out3.shape[1])
            return
        off = 0
        for name, v in views:
            if not np.isclose(self.scale[name], s_out, rtol=1e-9, atol=0):
                tmp = f"{name}:to:{out}"
                self.scales = {**self.scales, tmp: s_out}
                self.mem_conv(name, tmp, np.ones((v.shape[0], 1, 1, 1)), None, None,
                              groups=v.shape[0], model=False)
                v = self.mv[tmp]
            n = v.shape[ax]
            ops.copy(self, v, out3.slice(ax, off, off + n))
            off += n
        self.scale[out] = s_out


    def _concat_bands(self, node, views, out3):
        """The band function of a channel ``Concat``: rows of each operand copied into its
        channels of the output through the buffer, requantized on the way (a depthwise 1x1
        layer of weight 1 on the neural engine) when its scale is not the output's."""
        s_out = self.scale[node.outputs[0]]
        budget = self.band_budget(node) // 2

        def bands(first, end):
            off = 0
            for name, v in views:
                c, _, w = v.shape
                same = np.isclose(self.scale[name], s_out, rtol=1e-9, atol=0)
                for c0, c1, h0, h1 in ops._boxes((c, end - first, w), budget):
                    h0, h1 = h0 + first, h1 + first
                    ds = self.buffer((c1 - c0, h1 - h0, w))
                    self.load3(ops._view3(v, c0, c1, h0, h1), ds)
                    res = ds if same else self._requantize(ds, name, c0, c1, s_out)
                    self.store3(res, ops._view3(out3, off + c0, off + c1, h0, h1))
                    self.release(*{id(d): d for d in (ds, res)}.values())
                off += c
        return bands

    def _requantize(self, ds, name, c0, c1, s_out):
        """Channels ``c0 .. c1 - 1`` of tensor ``name`` in dataset ``ds``, from its scale to
        ``s_out``: a new dataset."""
        key = (name, c0, c1, s_out)
        if key not in self._requant:
            q = quantize_conv(np.ones((c1 - c0, 1, 1, 1)), None, self.scale[name], s_out)
            self._requant[key] = (q, self.kernels(q, c1 - c0))
            self._raw[id(self._requant[key][1])] = 0
        q, blob = self._requant[key]
        dst = self.buffer(ds.shape)
        places = self._resident(blob)
        self.b.conv(ds, places[0], dst, **q.conv_args())
        self._check_layer(ds, blob, dst, 1, 0, 1, c1 - c0)
        return dst

    def _run_bands(self, node, bands, height):
        """``bands(first_row, end_row)`` for every row now, or later under a depth-first
        schedule."""
        deferred = self.deferred(node)
        if deferred:
            deferred(bands)
        else:
            bands(0, height)

    # ---- depth first -------------------------------------------------------------------

    #: ``layer_of`` of :func:`npu_compiler.depthfirst.segments` (None: its default).
    segment_layer = None

    def mem_segments(self):
        """``{node index: Segment}`` of the depth-first schedule
        (:func:`npu_compiler.depthfirst.segments`), without the segments of a layer whose
        fused activation runs as a layer of its own after it (``pwl_split``: its band
        functions would not follow it; those layers run one after the other)."""
        from . import depthfirst
        if self.schedule != "depth-first":
            return {}
        segs = depthfirst.segments(self, layer_of=self.segment_layer)
        split = {id(seg) for seg in segs.values()
                 if any(self.pwl_split(node) is not None for node in seg.nodes)}
        return {i: seg for i, seg in segs.items() if id(seg) not in split}

    def emit_segment(self, seg):
        """Lower a depth-first segment: set every layer up (its band functions deferred; a
        node of ``seg.aux`` lowered as it comes, in graph order), then run the bands in the
        schedule's order, each charged to its layer's plan row."""
        self._rings = dict(seg.rings)
        self._defer = {}
        fns, rows = {}, {}
        for key in sorted(set(seg.layers) | set(seg.aux)):
            node = self.g.nodes[key]
            self.node, self._step = node, str(node)
            self.row = self._new_row(node)
            if key not in seg.layers:
                self.row["how"] = "in system memory"
                self.mem_node(node)
                self._end_row()
                continue
            self.row["how"] = f"{seg.strategy}, bands of {seg.band} rows, in system memory"
            self.row["_spans"] = []
            self._defer[node.name] = fns.setdefault(key, []).append
            mark = len(self.b.tasks)
            self.mem_node(node)
            self.row["_spans"].append((mark, len(self.b.tasks)))
            rows[key] = (self.row, node)
        self._defer = None
        for key, r0, r1, _ in seg.order:
            self.row, self.node = rows[key]
            self._step = str(self.node)
            mark = len(self.b.tasks)
            for fn in fns[key]:         # one per part of the channels
                fn(r0, r1)
            self.row["_spans"].append((mark, len(self.b.tasks)))
        for key in seg.layers:
            row = rows[key][0]
            spans = [(a, b) for a, b in row.pop("_spans") if b > a]
            row["schedule_peak"] = seg.peak
            self._span_row(row, spans)
        self._rings = {}

class _Folded:
    """A ``(C, H, W, g)`` memory view seen as ``(C, H, g W)``: element ``(c, y, x, j)`` is
    column ``g x + j`` (:meth:`MemoryInt8._fold`); sliced along channels and rows like an
    :class:`~npu_compiler.lower.MView`, loaded by :meth:`MemoryInt8.load3`."""

    def __init__(self, v4):
        self.v4 = v4

    @property
    def shape(self):
        c, h, w, g = self.v4.shape
        return (c, h, g * w)

    def slice(self, axis, start, stop):
        if axis not in (0, 1):
            raise ValueError("a folded view is sliced along channels or rows only")
        return _Folded(self.v4.slice(axis, start, stop))


def _shape3_of(shape):
    return tuple(shape[1:]) if len(shape) == 4 else (shape[1], 1, 1)


def _engine_stride(strides):
    sy, sx = strides
    return sy if sy == sx and sy <= 7 else 1


def _slice_conv(q, k0, k1):
    """Output channels ``k0 .. k1 - 1`` of a :class:`~npu_compiler.quant.QuantizedConv`."""
    per = {f.name: getattr(q, f.name)[k0:k1] for f in dataclasses.fields(q)
           if isinstance(getattr(q, f.name), np.ndarray)}
    return dataclasses.replace(q, **per)

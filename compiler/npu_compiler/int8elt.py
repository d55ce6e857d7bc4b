"""int8 ``Add``, ``Sub`` and ``Mul`` of two activations, with broadcast (``docs/compiler.md``,
"int8").

Both operands are int8 codes with their own scales ``s_a``, ``s_b``; the result gets the
output's calibrated scale ``s_y``. On the planar engine (three tasks, binary32 inside):

* ``Add`` / ``Sub``: each operand rescaled into binary16 by a gain-bias task (``q * (+-s /
  s_y)``), then one ``add`` task rounds the sum to int8 (RNE, saturating). ``Sub`` is the add
  of the second operand's negated rescale, whichever operand is broadcast.
* ``Mul``: the full operand copied into binary16 (exact), the other rescaled by ``s_a s_b /
  s_y``, then one ``mul`` task (the product of two binary16 values is exact in binary32)
  rounds to int8.

When the shapes differ, the operand of the output's shape is the full one and the other one
the planar engine's broadcast vector (``ops.bcast_layout``: per channel, per row, per column
or one element; a scalar tensor ``(1, 1, 1, 1)`` too). In the buffer the whole tensors are
viewed in the broadcast's ``(C, H, W)`` shape; in memory mode the full operand runs in boxes
with the part of the vector each needs (``ops.broadcast_op``), the three tasks in place.

:class:`EltwiseInt8` is the mixin of :class:`npu_compiler.int8._Int8` that does it.
"""

import dataclasses

from npu_model.builder import Dataset
from npu_spec import planar as planar_spec

from . import ops

__all__ = ["BINARY_OPS", "EltwiseInt8"]

#: Operators of two int8 activations this module lowers.
BINARY_OPS = ("Add", "Sub", "Mul")


class EltwiseInt8:
    """``Add``, ``Sub``, ``Mul`` of two int8 activations (module docstring). The host class
    provides ``g``, ``b``, ``ds``, ``scale``, ``memory``, ``src``, ``view``, ``new_view``,
    ``out_scale``, ``fail`` and :meth:`mem_elementwise`."""

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

    def _factors(self, node, full, other, first):
        """``(op, k_full, k_other)``: the planar operation and the factors that take each
        operand's codes to the output's scale (:meth:`_elt_tasks`)."""
        s_out = self.out_scale(node.outputs[0])
        sf, so = self.scale[full], self.scale[other]
        if node.op == "Mul":
            return "mul", 1.0, sf * so / s_out
        negate_full = node.op == "Sub" and not first
        negate_other = node.op == "Sub" and first
        return ("add", (-sf if negate_full else sf) / s_out,
                (-so if negate_other else so) / s_out)

    def _elt_tasks(self, df, do, op, kf, ko, kind=None, in_place=False):
        """The int8 result of ``op(kf * df, ko * do)`` (``do`` the broadcast vector of
        ``kind``, or a dataset of ``df``'s shape): ``df`` and ``do`` into binary16 (a copy
        when the factor is 1 for ``mul``, else a gain-bias), then ``op`` with one rounding to
        int8. ``in_place``: every task writes over its operand (the datasets are scratch)."""
        fp16, int8 = planar_spec.Fmt.FP16, planar_spec.Fmt.INT8
        results = []
        for ds, k in ((df, kf), (do, ko)):
            out = dataclasses.replace(ds, fmt="fp16") if in_place else None
            if op == "mul" and k == 1.0:
                t = self.b.planar(ds, out=out, mode="eltwise", op="copy", out_fmt=fp16)
            else:
                t = self.b.planar(ds, out=out, mode="eltwise", op="gain_bias", scale=k,
                                  bias=0.0, out_fmt=fp16)
            results.append(t)
        tf, to = results
        fields = {"bcast": kind} if kind else {}
        out = dataclasses.replace(tf, fmt="int8") if in_place else None
        y = self.b.planar(tf, to, out=out, mode="eltwise", op=op, out_fmt=int8, **fields)
        if not in_place:
            self.b.release(tf)
            self.b.release(to)
        return y

    def binary(self, node):
        """``Add``, ``Sub``, ``Mul`` of two activations in the buffer (in memory mode the
        equal-shaped ones per chunk through :meth:`mem_elementwise`)."""
        full, other, pqm, first = self._binary_operands(node)
        out = node.outputs[0]
        op, kf, ko = self._factors(node, full, other, first)
        df, do = self.src(full), self.src(other)
        if pqm is None:
            if df.shape != do.shape:
                self.fail("both operands must be int8 activations of one shape")
            self.ds[out] = self._elt_tasks(df, do, op, kf, ko)
        else:
            kind, shape3, _ = ops.bcast_layout(node, pqm)
            y = self._elt_tasks(self._reshaped(df, shape3), self._reshaped(do, (1, 1, pqm[1])),
                                op, kf, ko, kind)
            self.ds[out] = self._reshaped(y, df.shape)
        self.scale[out] = self.out_scale(out)

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
        op, kf, ko = self._factors(node, full, other, first)
        vf, vo = self.view(full), self.view(other)
        out3 = self.new_view(out, vf.shape)

        def engine(da, dv, kind):
            return self._elt_tasks(da, dv, op, kf, ko, kind, in_place=True)

        ops.broadcast_op(self, node, op, vf, vo, out3, pqm, engine=engine)
        self.scale[out] = self.out_scale(out)

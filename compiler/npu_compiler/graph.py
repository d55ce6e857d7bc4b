"""The compiler's graph: ONNX nodes in topological order, constants as numpy arrays, a shape
and an element type for every tensor."""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["CompileError", "Graph", "Node"]


class CompileError(ValueError):
    """A model the compiler cannot take: unreadable, invalid, an unsupported operator, a
    dynamic dimension without a value, a tensor that does not fit. The message is one line
    and names the node, the operator or the tensor."""


@dataclass
class Node:
    """One operator: ``op`` (ONNX type), ``name``, input and output tensor names (``""`` for
    an omitted optional input) and attributes as Python values. ``fused`` holds what the
    front end folded into it (an activation for the post-processor), ``preact`` the name of
    the tensor the folded activation read (the int8 lowering's scale of it)."""
    op: str
    name: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    fused: dict = field(default_factory=dict)
    preact: str = ""

    def attr(self, key, default=None):
        return self.attrs.get(key, default)

    def __str__(self):
        return f"node {self.name!r} ({self.op})"


@dataclass
class Graph:
    """A model after the front end: ``nodes`` in topological order, ``consts`` (name ->
    array), ``shapes`` and ``dtypes`` of every tensor, graph ``inputs`` and ``outputs``
    (names, outputs in model order); ``batch``: the model's batch, compiled as 1 and run
    item by item."""
    nodes: list
    consts: dict
    shapes: dict
    dtypes: dict
    inputs: list
    outputs: list
    name: str = ""
    batch: int = 1
    opset: int = 17

    def consumers(self, tensor):
        return [n for n in self.nodes if tensor in n.inputs]

    def producer(self, tensor):
        for n in self.nodes:
            if tensor in n.outputs:
                return n
        return None

    def const(self, tensor):
        """The constant array of ``tensor`` or None."""
        return self.consts.get(tensor)

    def is_float(self, tensor):
        return np.issubdtype(self.dtypes.get(tensor, np.float32), np.floating)

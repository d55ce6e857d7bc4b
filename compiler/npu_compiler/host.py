"""``--fallback host``: operators the NPU cannot run, and everything that depends on them, run
on the host after the NPU program (``onnx.reference``, numpy).

The split is a tail: an unsupported node and every node downstream of it go to the host; the
tensors they read from the NPU part become extra outputs of the program. The host part is an
ONNX model stored (base64) in the program's metadata, so that a program file runs alone.
"""

import base64

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["run_host", "split_host"]

_ACT_OPS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "gelu": "Gelu"}


def _node_protos(node, consts):
    """NodeProtos of a graph node (its fused activation as a node of its own)."""
    attrs = {k: (numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v)
             for k, v in node.attrs.items()}
    if not node.fused:
        return [helper.make_node(node.op, node.inputs, node.outputs, name=node.name, **attrs)]
    tmp = f"{node.outputs[0]}:pre"
    act = node.fused
    first = helper.make_node(node.op, node.inputs, [tmp], name=node.name, **attrs)
    kind = act["act"]
    if kind in _ACT_OPS:
        second = helper.make_node(_ACT_OPS[kind], [tmp], node.outputs)
    elif kind == "leaky":
        second = helper.make_node("LeakyRelu", [tmp], node.outputs, alpha=act["alpha"])
    else:
        lo, hi = f"{node.name}:lo", f"{node.name}:hi"
        consts[lo] = np.float32(act.get("lo", -np.inf))
        consts[hi] = np.float32(act.get("hi", np.inf))
        second = helper.make_node("Clip", [tmp, lo, hi], node.outputs)
    return [first, second]


def split_host(graph, supported):
    """Move the nodes whose operator is not in ``supported`` and every node downstream of
    them out of ``graph`` (in place); ``None`` if there are none, else the metadata dict:
    ``model`` (base64 ONNX), ``inputs`` (tensors the host reads from the NPU part),
    ``outputs`` (graph outputs the host makes), ``nodes`` (``op (name)`` each)."""
    host, made = [], set()
    for n in graph.nodes:
        if n.op not in supported or any(i in made for i in n.inputs if i):
            host.append(n)
            made |= {o for o in n.outputs if o}
    if not host:
        return None
    ids = {id(n) for n in host}
    graph.nodes = [n for n in graph.nodes if id(n) not in ids]
    needed = []
    for n in host:
        for i in n.inputs:
            if i and i not in made and i not in graph.consts and i not in needed:
                needed.append(i)
    host_outputs = [o for o in graph.outputs if o in made]
    graph.outputs = [o for o in graph.outputs if o not in made]
    graph.outputs += [i for i in needed if i not in graph.outputs]
    consts = {}
    protos = []
    for n in host:
        protos += _node_protos(n, consts)
    used = {i for p in protos for i in p.input}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in
             list(graph.consts.items()) + list(consts.items()) if k in used]

    def info(name):
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                             list(graph.shapes[name]))
    g = helper.make_graph(protos, "host", [info(i) for i in needed],
                          [info(o) for o in host_outputs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", graph.opset)])
    return {"model": base64.b64encode(model.SerializeToString()).decode("ascii"),
            "inputs": needed, "outputs": host_outputs,
            "nodes": [f"{n.op} ({n.name})" for n in host]}


def run_host(meta, values):
    """The host part's outputs ``{name: float32 array}`` from ``values`` (name -> array,
    the NPU part's outputs)."""
    from onnx.reference import ReferenceEvaluator

    model = onnx.ModelProto.FromString(base64.b64decode(meta["model"]))
    feeds = {name: np.asarray(values[name], np.float32) for name in meta["inputs"]}
    results = ReferenceEvaluator(model).run(None, feeds)
    return {name: np.asarray(r, np.float32) for name, r in zip(meta["outputs"], results)}

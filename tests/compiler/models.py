"""Small handmade ONNX models (``onnx.helper``) with seeded random weights."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _init(rng, name, shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                   name)


def small_cnn(seed=0, size=12, batch="N"):
    """A CNN touching most operators: conv + BN + ReLU6, depthwise conv with stride (2, 1)
    and asymmetric pads, squeeze-excitation (global pool, 1x1 convs, sigmoid, channel
    scaling), channel shuffle (reshape, transpose), concat, residual add, max and average
    pooling, Gemm head. Outputs: the logits and an intermediate tensor that is also consumed
    further on."""
    rng = np.random.default_rng(seed)
    c = 8
    inits = [
        _init(rng, "w1", (c, 3, 3, 3)), _init(rng, "b1", (c,)),
        numpy_helper.from_array(np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5, "g"),
        _init(rng, "beta", (c,)), _init(rng, "mean", (c,), 0.1),
        numpy_helper.from_array(np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5, "var"),
        numpy_helper.from_array(np.float32(0.0).reshape(()), "lo"),
        numpy_helper.from_array(np.float32(6.0).reshape(()), "hi"),
        _init(rng, "wd", (c, 1, 3, 3)), _init(rng, "bd", (c,)),
        _init(rng, "wse1", (4, c, 1, 1)), _init(rng, "wse2", (c, 4, 1, 1)),
        numpy_helper.from_array(np.array([-1, 2, 4, size // 2, size], np.int64), "shuf1"),
        numpy_helper.from_array(np.array([-1, c, size // 2, size], np.int64), "shuf2"),
        _init(rng, "w3", (c, 2 * c, 1, 1)),
        _init(rng, "wfc", (10, c * (size // 4) * (size // 2)), 0.1), _init(rng, "bfc", (10,)),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn1"]),
        n("Clip", ["bn1", "lo", "hi"], ["a1"]),
        n("Conv", ["a1", "wd", "bd"], ["d1"], group=c, strides=[2, 1], pads=[0, 1, 1, 1]),
        n("Relu", ["d1"], ["d1r"]),
        n("GlobalAveragePool", ["d1r"], ["se0"]),
        n("Conv", ["se0", "wse1"], ["se1"]),
        n("Relu", ["se1"], ["se1r"]),
        n("Conv", ["se1r", "wse2"], ["se2"]),
        n("Sigmoid", ["se2"], ["se3"]),
        n("Mul", ["d1r", "se3"], ["se"]),
        n("Reshape", ["se", "shuf1"], ["s1"]),
        n("Transpose", ["s1"], ["s2"], perm=[0, 2, 1, 3, 4]),
        n("Reshape", ["s2", "shuf2"], ["s3"]),
        n("Concat", ["s3", "se"], ["cat"], axis=1),
        n("Conv", ["cat", "w3"], ["c3"]),
        n("Add", ["c3", "s3"], ["res"]),
        n("MaxPool", ["res"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
          count_include_pad=1),
        n("Flatten", ["p2"], ["f"]),
        n("Gemm", ["f", "wfc", "bfc"], ["y"], transB=1),
    ]
    h = size
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10]),
         helper.make_tensor_value_info("se", TensorProto.FLOAT, [batch, c, h // 2, h])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def light_model(name, seed=0, size=None, drop_softmax=True):
    """One of the onnx package's ``light`` models with seeded random weights (the shipped
    ones are constants): every ``ConstantOfShape`` output becomes a random initializer (a
    conv's bias small, weights scaled by ``1/sqrt(fan_in)`` so activations stay of order
    one). ``size`` sets the input's height and width; ``drop_softmax`` ends the graph at the
    input of a final ``Softmax`` (the logits: compared with a tolerance relative to their own
    size, which a softmax over 1000 classes would flatten)."""
    import os

    import onnx
    from onnx import numpy_helper as nh
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        f"light_{name}.onnx")
    m = onnx.load(path)
    rng = np.random.default_rng(seed)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    keep = []
    for node in g.node:
        if node.op_type == "ConstantOfShape":
            shape_name = node.input[0]
            shape = tuple(int(v) for v in nh.to_array(inits[shape_name])) \
                if shape_name in inits else None
            if shape is None:
                keep.append(node)
                continue
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            if fan_in:
                w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
            else:
                w = rng.standard_normal(shape) * 0.1
                if "var" in node.output[0] or "scale" in node.output[0]:
                    w = 1.0 + np.abs(w)
            g.initializer.append(nh.from_array(w.astype(np.float32), node.output[0]))
            continue
        keep.append(node)
    if drop_softmax and keep and keep[-1].op_type == "Softmax":
        last = keep.pop()
        g.output[0].name = last.input[0]
    del g.node[:]
    g.node.extend(keep)
    names = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(inputs)
    if size is not None:
        dims = g.input[0].type.tensor_type.shape.dim
        dims[2].dim_value = dims[3].dim_value = size
    for out in g.output:
        for k, d in enumerate(out.type.tensor_type.shape.dim):
            d.dim_param = f"d{k}"     # inference finds the values
    del g.value_info[:]
    m.ir_version = max(m.ir_version, 4)   # initializers need not be graph inputs
    return m


def activation_chain(layers, shape=(1, 4, 5, 5)):
    """``layers`` elementwise activations (Relu, Sigmoid, Tanh in turn) one after the other:
    a cheap model of many tasks (three a layer on ``small``: load, compute, store)."""
    from onnx import TensorProto, helper
    nodes = []
    prev = "x"
    for k in range(layers):
        out = "y" if k == layers - 1 else f"t{k}"
        nodes.append(helper.make_node(("Relu", "Sigmoid", "Tanh")[k % 3], [prev], [out],
                                      name=f"act{k}"))
        prev = out
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

"""Train the small digits CNN and export it to ONNX: ``python models/digits/train.py``.

scikit-learn's 8x8 digits (1,797 images, 16 grey levels, scaled to [0, 1]), split once with
``train_test_split(test_size=0.2, random_state=0, stratify=y)`` into 1,437 training and 360
held-out images. The network, trained in numpy (Adam, cross-entropy, fixed seed, so the run is
deterministic on a given numpy):

    input [1, 1, 8, 8]
    Conv 3x3 pad 1, 8 channels -> Relu -> MaxPool 2x2      [1, 8, 4, 4]
    Conv 3x3 pad 1, 16 channels -> Relu -> MaxPool 2x2     [1, 16, 2, 2]
    Flatten -> Gemm 64 -> 10                               logits [1, 10]

The file ``digits_cnn.onnx`` (opset 13, float32, input ``input``, output ``logits``) is kept in
the repository. ``python models/digits/train.py --evaluate`` measures the stored file without
retraining: float accuracy on onnxruntime, and int8 accuracy with ``npu_compiler.quant`` and
the golden model's integer convolution, post-processor and max pooling (needs ``spec``, ``sim``
and ``compiler`` on ``PYTHONPATH``).
"""

import argparse
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE / "digits_cnn.onnx"
SEED = 0
EPOCHS = 60
BATCH = 32
LR = 3e-3
OPSET = 13


def load_split():
    """``(x_train, y_train, x_test, y_test)``: images ``[N, 1, 8, 8]`` float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    return tuple(train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                  stratify=digits.target)[i] for i in (0, 2, 1, 3))


# --------------------------------------------------------------------------------------------
# numpy layers (forward and backward)


def im2col(x, k=3, pad=1):
    """``[N, C, H, W]`` -> ``[N, C*k*k, H*W]`` for a stride-1 'same' convolution."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.empty((n, c, k, k, h, w), x.dtype)
    for ky in range(k):
        for kx in range(k):
            cols[:, :, ky, kx] = xp[:, :, ky:ky + h, kx:kx + w]
    return cols.reshape(n, c * k * k, h * w)


def col2im(cols, shape, k=3, pad=1):
    n, c, h, w = shape
    cols = cols.reshape(n, c, k, k, h, w)
    xp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), cols.dtype)
    for ky in range(k):
        for kx in range(k):
            xp[:, :, ky:ky + h, kx:kx + w] += cols[:, :, ky, kx]
    return xp[:, :, pad:pad + h, pad:pad + w]


def conv_forward(x, w, b):
    cols = im2col(x)
    y = np.einsum("kc,ncp->nkp", w.reshape(w.shape[0], -1), cols) + b[None, :, None]
    return y.reshape(x.shape[0], w.shape[0], x.shape[2], x.shape[3]), cols


def conv_backward(dy, x_shape, cols, w):
    n, k = dy.shape[:2]
    dy = dy.reshape(n, k, -1)
    dw = np.einsum("nkp,ncp->kc", dy, cols).reshape(w.shape)
    db = dy.sum(axis=(0, 2))
    dcols = np.einsum("kc,nkp->ncp", w.reshape(k, -1), dy)
    return col2im(dcols, x_shape), dw, db


def pool_forward(x):
    n, c, h, w = x.shape
    v = x.reshape(n, c, h // 2, 2, w // 2, 2)
    y = v.max(axis=(3, 5))
    mask = v == y[:, :, :, None, :, None]
    # One winner per window (the first), as the gradient of max goes to one element.
    flat = mask.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    first = np.zeros_like(flat)
    first[np.arange(flat.shape[-1]) == flat.argmax(-1)[..., None]] = True
    return y, first


def pool_backward(dy, first):
    n, c, h2, w2 = dy.shape
    d = (first * dy[..., None]).reshape(n, c, h2, w2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    return d.reshape(n, c, 2 * h2, 2 * w2)


def init_params(rng):
    def he(shape, fan_in):
        return (rng.normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {"conv1.weight": he((8, 1, 3, 3), 9), "conv1.bias": np.zeros(8, np.float32),
            "conv2.weight": he((16, 8, 3, 3), 72), "conv2.bias": np.zeros(16, np.float32),
            "fc.weight": he((10, 64), 64) / np.sqrt(2), "fc.bias": np.zeros(10, np.float32)}


def forward(p, x, keep=False):
    """Logits of ``x``; with ``keep`` also the tensors the backward pass needs."""
    a1, c1 = conv_forward(x, p["conv1.weight"], p["conv1.bias"])
    r1 = np.maximum(a1, 0)
    m1, f1 = pool_forward(r1)
    a2, c2 = conv_forward(m1, p["conv2.weight"], p["conv2.bias"])
    r2 = np.maximum(a2, 0)
    m2, f2 = pool_forward(r2)
    flat = m2.reshape(len(x), -1)
    logits = flat @ p["fc.weight"].T + p["fc.bias"]
    if keep:
        return logits, (x, c1, a1, f1, m1, c2, a2, f2, flat)
    return logits


def gradients(p, x, y):
    logits, (x, c1, a1, f1, m1, c2, a2, f2, flat) = forward(p, x, keep=True)
    z = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
    d = prob
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    g = {"fc.weight": d.T @ flat, "fc.bias": d.sum(0)}
    dm2 = (d @ p["fc.weight"]).reshape(m1.shape[0], 16, 2, 2)
    da2 = pool_backward(dm2, f2) * (a2 > 0)
    dm1, g["conv2.weight"], g["conv2.bias"] = conv_backward(da2, m1.shape, c2,
                                                            p["conv2.weight"])
    da1 = pool_backward(dm1, f1) * (a1 > 0)
    _, g["conv1.weight"], g["conv1.bias"] = conv_backward(da1, x.shape, c1, p["conv1.weight"])
    return loss, g


def train(x, y, seed=SEED, epochs=EPOCHS, log=print):
    rng = np.random.default_rng(seed)
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(t) for k, t in p.items()}
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(0, len(x), BATCH):
            idx = order[i:i + BATCH]
            loss, g = gradients(p, x[idx], y[idx])
            total += loss * len(idx)
            step += 1
            for k in p:  # Adam
                m[k] = 0.9 * m[k] + 0.1 * g[k]
                v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
                mh = m[k] / (1 - 0.9 ** step)
                vh = v[k] / (1 - 0.999 ** step)
                p[k] = (p[k] - LR * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
        if log and (epoch + 1) % 10 == 0:
            log(f"epoch {epoch + 1}: loss {total / len(x):.4f}")
    return p


def accuracy(p, x, y):
    return float((forward(p, x).argmax(axis=1) == y).mean())


# --------------------------------------------------------------------------------------------
# ONNX export


def export(p, path=MODEL):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1"],
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool1"),
        helper.make_node("Conv", ["pool1", "conv2.weight", "conv2.bias"], ["conv2"],
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool2"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool2"),
        helper.make_node("Flatten", ["pool2"], ["flat"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1,
                         name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in p.items()])
    model = helper.make_model(graph, producer_name="open-npu models/digits/train.py",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


# --------------------------------------------------------------------------------------------
# evaluation of the stored model


def load_params(path=MODEL):
    """The initializers of the stored model, by name."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def onnxruntime_logits(x, path=MODEL):
    """Logits of every image of ``x`` ``[N, 1, 8, 8]`` from onnxruntime, one at a time (the
    model's batch is 1)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(["logits"], {"input": img[None]})[0] for img in x])


def float_tensors(p, x):
    """The float activations the int8 scales are calibrated on: after conv1+relu,
    conv2+relu, and the logits."""
    r1 = np.maximum(conv_forward(x, p["conv1.weight"], p["conv1.bias"])[0], 0)
    r2 = np.maximum(conv_forward(pool_forward(r1)[0], p["conv2.weight"],
                                 p["conv2.bias"])[0], 0)
    flat = pool_forward(r2)[0].reshape(len(x), -1)
    return r1, r2, flat @ p["fc.weight"].T + p["fc.bias"]


def quantize_model(p, x_calib, method="maxabs", percentile=99.99):
    """The three quantized layers (:class:`npu_compiler.quant.QuantizedConv`) and the input
    scale, calibrated on ``x_calib`` (per-tensor activation scales, per-channel weights)."""
    from npu_compiler.quant import activation_scale, quantize_conv

    def scale(t):
        return activation_scale(t, method, percentile)

    r1, r2, logits = float_tensors(p, x_calib)
    s0, s1, s2, s3 = scale(x_calib), scale(r1), scale(r2), scale(logits)
    return s0, [quantize_conv(p["conv1.weight"], p["conv1.bias"], s0, s1, "relu"),
                quantize_conv(p["conv2.weight"], p["conv2.bias"], s1, s2, "relu"),
                quantize_conv(p["fc.weight"], p["fc.bias"], s2, s3)]


def int8_logits(s0, layers, x):
    """int8 logits of ``x`` through the golden model: convolutions and the post-processor
    (:func:`npu_compiler.quant.golden_conv`), max pooling on the planar engine's model
    (:func:`npu_model.planar.pool`); the fully connected layer is a 1x1 convolution."""
    from npu_compiler.quant import golden_conv, quantize
    from npu_model.planar import pool

    def maxpool(t):
        n, c, h, w = t.shape
        return pool(t.reshape(n * c, h, w), "max", 2, 2, 2, 2).reshape(n, c, h // 2, w // 2)

    h = maxpool(golden_conv(layers[0], quantize(x, s0), pad=1))
    h = maxpool(golden_conv(layers[1], h, pad=1))
    return golden_conv(layers[2], h.reshape(len(x), -1, 1, 1))[:, :, 0, 0]


def evaluate(path=MODEL, method="maxabs", percentile=99.99):
    """``{"float": onnxruntime accuracy, "int8": golden-model accuracy}`` on the held-out
    images; int8 calibrated on the training images."""
    x_train, _, x_test, y_test = load_split()
    p = load_params(path)
    s0, layers = quantize_model(p, x_train, method, percentile)
    return {"float": float((onnxruntime_logits(x_test, path).argmax(1) == y_test).mean()),
            "int8": float((int8_logits(s0, layers, x_test).argmax(1) == y_test).mean())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=MODEL)
    parser.add_argument("--evaluate", action="store_true",
                        help="measure the stored model instead of training")
    args = parser.parse_args(argv)
    if not args.evaluate:
        x_train, y_train, x_test, y_test = load_split()
        p = train(x_train, y_train)
        print(f"numpy: train accuracy {accuracy(p, x_train, y_train):.4f}, held-out accuracy "
              f"{accuracy(p, x_test, y_test):.4f} ({len(y_test)} images)")
        export(p, args.output)
        print(f"wrote {args.output}")
    for method in ("maxabs", "percentile"):
        acc = evaluate(args.output, method)
        print(f"held-out accuracy: float (onnxruntime) {acc['float']:.4f}, int8 (golden model, "
              f"{method} calibration) {acc['int8']:.4f}")


if __name__ == "__main__":
    main()

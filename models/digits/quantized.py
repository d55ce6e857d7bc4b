"""The digits CNN quantized by onnxruntime and compiled with its own scales:
``python models/digits/quantized.py`` (needs ``spec``, ``sim`` and ``compiler`` on
``PYTHONPATH``; about a minute).

For each of onnxruntime's ``quantize_static`` forms (QDQ and QOperator; int8 symmetric and
uint8 asymmetric activations; int8 per-channel weights; 200 training images for
calibration) it prints the held-out accuracy (360 images) of onnxruntime running the
quantized model and of the NPU's golden model running the compiled program, the share of
logits where the two agree exactly, the largest difference in output steps, and the number
of NPU tasks. ``--save DIR`` keeps the four quantized models in ``DIR``
(``digits_QDQ_int8.onnx``, ``digits_QOperator_uint8.onnx``, ...).
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import train  # noqa: E402

CALIBRATION = 200


def quantize(fmt, symmetric, directory):
    """The path of the digits model quantized by ``quantize_static``."""
    from onnxruntime import quantization as q

    x_train = train.load_split()[0]

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"input": x_train[i:i + 1]} for i in range(CALIBRATION)])

        def get_next(self):
            return next(self.items, None)

    out = Path(directory) / f"digits_{fmt}_{'int8' if symmetric else 'uint8'}.onnx"
    q.quantize_static(str(train.MODEL), str(out), Reader(),
                      quant_format=getattr(q.QuantFormat, fmt),
                      activation_type=q.QuantType.QInt8 if symmetric else q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8, per_channel=True,
                      extra_options={"ActivationSymmetric": symmetric})
    return out


def main():
    import argparse
    import logging

    from npu_compiler.compile import compile_model
    from npu_runtime.runtime import reference, run
    from npu_spec.config import preset

    parser = argparse.ArgumentParser(description="the digits CNN quantized by onnxruntime")
    parser.add_argument("--save", metavar="DIR", help="keep the quantized models in DIR")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    _, _, x_test, y_test = train.load_split()
    float_logits = reference(str(train.MODEL), {"input": x_test})["logits"]
    print(f"float, onnxruntime: {int((float_logits.argmax(1) == y_test).sum())} / "
          f"{len(y_test)}")
    print("form        activations  onnxruntime  NPU golden  equal logits  max steps  tasks")
    with tempfile.TemporaryDirectory() as tmp:
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            tmp = args.save
        for fmt in ("QDQ", "QOperator"):
            for symmetric in (True, False):
                path = quantize(fmt, symmetric, tmp)
                compiled = compile_model(onnx.load(str(path)), preset("small"), fmt="int8")
                got = run(compiled.program, {"input": x_test}, "golden").outputs["logits"]
                ref = reference(str(path), {"input": x_test})["logits"]
                step = compiled.program.metadata["compiler"]["outputs"][0]["scale"]
                d = np.abs(got.astype(np.float64) - ref) / step
                print(f"{fmt:<11} {'int8 sym' if symmetric else 'uint8 asym':<12} "
                      f"{int((ref.argmax(1) == y_test).sum()):>11d}  "
                      f"{int((got.argmax(1) == y_test).sum()):>10d}  "
                      f"{np.mean(d < 0.5):>12.4f}  {d.max():>9.2f}  "
                      f"{compiled.program.queues[0].tasks:>5d}")


if __name__ == "__main__":
    main()

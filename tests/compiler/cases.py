"""The onnx package's own backend test material, run through the compiler and the runtime.

``pytorch_case(name)`` reads ``onnx/backend/test/data/pytorch-converted/<name>`` (model and
``test_data_set_0``); ``node_case(module, name)`` builds a node case by importing only the
module of ``onnx.backend.test.case.node`` that defines it (importing all of them takes about
15 s). The parameters of a node (weights, bounds, axes, shapes; every input after the
first for the operators in :data:`PARAMETER_OPS`) become initializers: the NPU takes
weights as constants.
"""

import glob
import importlib
import os
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")

#: Operators whose inputs after the first are parameters.
PARAMETER_OPS = {"Conv", "Gemm", "PRelu", "Clip", "BatchNormalization", "Pad", "Reshape",
                 "Squeeze", "Unsqueeze", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                 "ReduceSumSquare", "ReduceL1", "ReduceL2", "MatMul"}

#: Tolerance against the stored outputs: max |error| at most this fraction of the output's
#: largest magnitude. Inputs and weights are rounded to binary16 (relative error 2^-11 =
#: 4.9e-4 each), products are summed in binary32 and the result is rounded to binary16
#: once more; the post-processor's piecewise-linear sigmoid/tanh/GELU add at most 9e-4
#: absolute on outputs of magnitude about 1 (docs/postproc.md). 3e-3 is about six binary16
#: ulps of the largest output: it passes every case with a margin of 3.5 or more (the worst
#: measured, test_tanh_example, is 8.1e-4) and fails for any wrong element, window or
#: channel (errors of order one).
REL_TOL = 3e-3
#: Cosine similarity of output and reference: at least this.
COS_TOL = 0.99999


def pytorch_case(name):
    d = os.path.join(DATA, "pytorch-converted", name)
    model = onnx.load(os.path.join(d, "model.onnx"))
    ds = os.path.join(d, "test_data_set_0")
    ins = [numpy_helper.to_array(onnx.load_tensor(f))
           for f in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
    outs = [numpy_helper.to_array(onnx.load_tensor(f))
            for f in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
    return model, _named_inputs(model, ins), _named_outputs(model, outs)


def _named_inputs(model, arrays):
    init = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    return dict(zip(names, arrays))


def _named_outputs(model, arrays):
    return dict(zip([o.name for o in model.graph.output], arrays))


def node_case(module, name):
    import onnx.backend.test.case.node as registry
    try:
        # Some generators divide by zero on purpose (empty-set reductions).
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    except ValueError:
        pass    # a module imported by an earlier one registers its cases twice: they are in
    case = next(c for c in registry._NodeTestCases if c.name == name)
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    ins, outs = case.data_sets[0]
    ins = list(ins)
    inputs = [i.name for i in model.graph.input]
    values = dict(zip(inputs, ins))
    frozen = set()
    for node in model.graph.node:
        if node.op_type in PARAMETER_OPS:
            frozen |= {n for n in list(node.input)[1:] if n in values}
    for n in frozen:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(values[n]), n))
    keep = [i for i in model.graph.input if i.name not in frozen]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    feeds = {k: v for k, v in values.items() if k not in frozen}
    return model, feeds, _named_outputs(model, outs)

"""The onnx package's backend test cases on the golden backend in binary16, against their
stored outputs (tolerance: :data:`cases.REL_TOL`, justified there), and a few on the RTL
system simulation, bit for bit equal to the golden backend."""

import numpy as np
import pytest

from npu_compiler.compile import compile_model
from npu_runtime.runtime import compare, run
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL, node_case, pytorch_case

CFG = preset("small")

PYTORCH = [
    "test_Conv1d", "test_Conv1d_dilated", "test_Conv1d_groups", "test_Conv1d_pad1",
    "test_Conv1d_pad1size1", "test_Conv1d_pad2", "test_Conv1d_pad2size1", "test_Conv1d_stride",
    "test_Conv2d", "test_Conv2d_depthwise", "test_Conv2d_depthwise_padded",
    "test_Conv2d_depthwise_strided", "test_Conv2d_depthwise_with_multiplier",
    "test_Conv2d_dilated", "test_Conv2d_groups", "test_Conv2d_groups_thnn",
    "test_Conv2d_no_bias", "test_Conv2d_padding", "test_Conv2d_strided",
    "test_AvgPool2d", "test_AvgPool2d_stride", "test_MaxPool1d", "test_MaxPool1d_stride",
    "test_MaxPool2d", "test_BatchNorm1d_3d_input_eval", "test_BatchNorm2d_eval",
    "test_BatchNorm2d_momentum_eval", "test_ConstantPad2d", "test_ZeroPad2d",
    "test_LeakyReLU", "test_LeakyReLU_with_negval", "test_Linear", "test_Linear_no_bias",
    "test_PReLU_1d", "test_PReLU_1d_multiparam", "test_PReLU_2d", "test_PReLU_2d_multiparam",
    "test_PReLU_3d", "test_PReLU_3d_multiparam", "test_PixelShuffle", "test_ReLU",
    "test_Sigmoid", "test_Tanh",
]

NODE = {
    "conv": ["test_basic_conv_with_padding", "test_basic_conv_without_padding",
             "test_conv_with_strides_padding", "test_conv_with_strides_no_padding",
             "test_conv_with_strides_and_asymmetric_padding", "test_conv_with_autopad_same"],
    "averagepool": ["test_averagepool_2d_precomputed_pads",
                    "test_averagepool_2d_precomputed_pads_count_include_pad",
                    "test_averagepool_2d_precomputed_strides",
                    "test_averagepool_2d_precomputed_same_upper", "test_averagepool_1d_default",
                    "test_averagepool_2d_default", "test_averagepool_2d_pads",
                    "test_averagepool_2d_pads_count_include_pad", "test_averagepool_2d_strides"],
    "maxpool": ["test_maxpool_2d_precomputed_pads", "test_maxpool_2d_precomputed_strides",
                "test_maxpool_2d_precomputed_same_upper", "test_maxpool_1d_default",
                "test_maxpool_2d_default", "test_maxpool_2d_same_upper",
                "test_maxpool_2d_same_lower", "test_maxpool_2d_pads", "test_maxpool_2d_strides",
                "test_maxpool_2d_ceil"],
    "globalaveragepool": ["test_globalaveragepool", "test_globalaveragepool_precomputed"],
    "globalmaxpool": ["test_globalmaxpool", "test_globalmaxpool_precomputed"],
    "batch_normalization": ["test_batchnorm_example", "test_batchnorm_epsilon"],
    "gemm": ["test_gemm_default_zero_bias", "test_gemm_default_no_bias",
             "test_gemm_default_scalar_bias", "test_gemm_default_single_elem_vector_bias",
             "test_gemm_default_vector_bias", "test_gemm_transposeA", "test_gemm_transposeB",
             "test_gemm_alpha", "test_gemm_beta"],
    "matmul": ["test_matmul_2d"],
    "relu": ["test_relu"], "abs": ["test_abs"], "neg": ["test_neg"],
    "leakyrelu": ["test_leakyrelu", "test_leakyrelu_default", "test_leakyrelu_example"],
    "prelu": ["test_prelu_example", "test_prelu_broadcast"],
    "sigmoid": ["test_sigmoid", "test_sigmoid_example"],
    "tanh": ["test_tanh", "test_tanh_example"],
    "clip": ["test_clip", "test_clip_example", "test_clip_inbounds", "test_clip_outbounds",
             "test_clip_splitbounds", "test_clip_default_min", "test_clip_default_max",
             "test_clip_default_inbounds"],
    "hardsigmoid": ["test_hardsigmoid", "test_hardsigmoid_default", "test_hardsigmoid_example"],
    "hardswish": ["test_hardswish"],
    "gelu": ["test_gelu_default_1", "test_gelu_default_2"],
    "add": ["test_add", "test_add_bcast"], "sub": ["test_sub", "test_sub_bcast",
                                                   "test_sub_example"],
    "mul": ["test_mul", "test_mul_bcast", "test_mul_example"],
    "max": ["test_max_two_inputs", "test_max_float32", "test_max_example", "test_max_one_input"],
    "min": ["test_min_two_inputs", "test_min_float32", "test_min_example", "test_min_one_input"],
    "sum": ["test_sum_example", "test_sum_one_input", "test_sum_two_inputs"],
    "concat": ["test_concat_1d_axis_0", "test_concat_2d_axis_1", "test_concat_3d_axis_0",
               "test_concat_3d_axis_1", "test_concat_3d_axis_2", "test_concat_3d_axis_negative_1"],
    "flatten": ["test_flatten_axis0", "test_flatten_axis2", "test_flatten_default_axis"],
    "reshape": ["test_reshape_reordered_all_dims", "test_reshape_negative_dim",
                "test_reshape_zero_dim"],
    "transpose": ["test_transpose_default"] + [f"test_transpose_all_permutations_{i}"
                                              for i in range(6)],
    "squeeze": ["test_squeeze", "test_squeeze_negative_axes"],
    "unsqueeze": ["test_unsqueeze_axis_0", "test_unsqueeze_two_axes",
                  "test_unsqueeze_negative_axes"],
    "pad": ["test_constant_pad", "test_constant_pad_axes"],
    "reducesum": ["test_reduce_sum_keepdims_random", "test_reduce_sum_do_not_keepdims_random",
                  "test_reduce_sum_default_axes_keepdims_random",
                  "test_reduce_sum_negative_axes_keepdims_random"],
    "reducemean": ["test_reduce_mean_keepdims_random", "test_reduce_mean_do_not_keepdims_random",
                   "test_reduce_mean_default_axes_keepdims_random"],
    "reducemax": ["test_reduce_max_keepdims_random", "test_reduce_max_do_not_keepdims_random",
                  "test_reduce_max_default_axes_keepdims_random"],
    # Left out: test_softmax_large_number, whose inputs 10000 to 10003 are all 10000 in
    # binary16 (its ulp there is 8).
    "softmax": ["test_softmax_example", "test_softmax_axis_0", "test_softmax_axis_1",
                "test_softmax_axis_2", "test_softmax_negative_axis",
                "test_softmax_default_axis"],
}


def check_case(model, inputs, expected, *, batch_one="auto", backend="golden"):
    compiled = compile_model(model, CFG, shapes={k: np.shape(v) for k, v in inputs.items()},
                             batch_one=batch_one)
    result = run(compiled.program, inputs, backend)
    errors = compare(result.outputs, expected)
    for name, e in errors.items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)
    return compiled, result


@pytest.mark.parametrize("name", PYTORCH)
def test_pytorch_converted(name):
    check_case(*pytorch_case(name))


@pytest.mark.parametrize("module,name", [(m, n) for m, names in NODE.items() for n in names])
def test_node(module, name):
    check_case(*node_case(module, name), batch_one=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["test_Conv2d_depthwise_strided", "test_MaxPool2d"])
def test_rtl_equals_golden(name):
    model, inputs, expected = pytorch_case(name)
    compiled, golden = check_case(model, inputs, expected)
    rtl = run(compiled.program, inputs, "rtl")
    for k in golden.outputs:
        assert np.array_equal(golden.outputs[k].view(np.uint32), rtl.outputs[k].view(np.uint32))

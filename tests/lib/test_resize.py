"""resize on every backend against ONNX's float64 reference Resize and hand-made cases."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


def onnx_resize(x: np.ndarray, size, attrs: dict, scales=None) -> np.ndarray:
    """onnx.reference's Resize (float64 NumPy) on x, given sizes or scales."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    onnx_attrs = {k: v for k, v in attrs.items() if k not in ("size", "scales")}
    node = helper.make_node("Resize", ["x", "roi", "scales", "sizes"] if scales is None
                            else ["x", "roi", "scales"], ["y"], **onnx_attrs)
    x64 = x.astype(np.float64)
    inputs = [helper.make_tensor_value_info("x", TensorProto.DOUBLE, x.shape)]
    inits = [helper.make_tensor("roi", TensorProto.DOUBLE, [0], [])]
    if scales is None:
        inits += [helper.make_tensor("scales", TensorProto.FLOAT, [0], []),
                  helper.make_tensor("sizes", TensorProto.INT64, [len(size)], list(size))]
    else:
        inits += [helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], list(scales))]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {"x": x64})[0]


CASES = [
    # (shape, size, attrs)
    ((1, 2, 3, 4), (1, 2, 5, 7), {"mode": "linear"}),
    ((1, 1, 6, 5), (1, 1, 3, 4), {"mode": "cubic", "coordinate_transformation_mode":
                                  "asymmetric", "cubic_coeff_a": -0.5, "exclude_outside": 1}),
    ((1, 1, 4, 4), (1, 1, 8, 3), {"mode": "cubic"}),
    ((2, 3, 5), (2, 3, 9), {"mode": "nearest", "nearest_mode": "round_prefer_ceil",
                            "coordinate_transformation_mode": "align_corners"}),
    ((1, 2, 5), (1, 2, 3), {"mode": "nearest", "nearest_mode": "floor",
                            "coordinate_transformation_mode": "asymmetric"}),
    ((1, 1, 7, 3), (1, 1, 4, 8), {"mode": "nearest", "nearest_mode": "ceil",
                                  "coordinate_transformation_mode": "half_pixel_symmetric"}),
    ((1, 1, 2, 3, 4), (1, 1, 3, 5, 2), {"mode": "linear",
                                        "coordinate_transformation_mode": "align_corners"}),
    ((1, 1, 3, 5), (1, 1, 1, 4), {"mode": "linear",
                                  "coordinate_transformation_mode": "pytorch_half_pixel"}),
]


@pytest.mark.parametrize("shape,size,attrs", CASES)
def test_resize_sizes(backend_name, shape, size, attrs, run_op, assert_close,
                      random_array) -> None:
    x = random_array(shape, "float32", seed=3)
    want = onnx_resize(x, size, attrs)
    (got,) = run_op(backend_name, "resize", [x], {**attrs, "size": list(size)})
    assert_close(got, want)


@pytest.mark.parametrize("mode,size", [("linear", (1, 2, 3, 2)), ("cubic", (1, 2, 2, 5))])
def test_resize_antialias(backend_name, mode, size, run_op, assert_close, random_array) -> None:
    # Downscaling axes widen the filter (more taps); the upscaled one keeps plain weights.
    x = random_array((1, 2, 7, 4), "float32", seed=6)
    attrs = {"mode": mode, "antialias": 1}
    want = onnx_resize(x, size, attrs)
    (got,) = run_op(backend_name, "resize", [x], {**attrs, "size": list(size)})
    assert_close(got, want)


@pytest.mark.parametrize("mode,ctm", [("linear", "half_pixel_symmetric"),
                                      ("linear", "align_corners"), ("cubic", "half_pixel"),
                                      ("nearest", "pytorch_half_pixel")])
def test_resize_scales_differ_from_sizes(backend_name, mode, ctm, run_op, assert_close,
                                         random_array) -> None:
    # ONNX computes coordinates from the given scale: 0.6 of 4 is 2.4, the output has 2.
    x = random_array((1, 1, 2, 4), "float32", seed=4)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    want = onnx_resize(x, None, attrs, scales=[1.0, 1.0, 0.6, 0.6])
    assert want.shape == (1, 1, 1, 2)
    (got,) = run_op(backend_name, "resize", [x],
                    {**attrs, "size": [1, 1, 1, 2], "scales": [1.0, 1.0, 0.6, 0.6]})
    assert_close(got, want)


# NOTE: onnx.reference computes cubic weights with cubic_coeff_a as a float32 scalar (~1e-6
# off), so float64 is checked on linear, where the reference is exact.
@pytest.mark.parametrize("dtype,mode", [("float16", "cubic"), ("float64", "linear")])
def test_resize_dtypes(backend_name, dtype, mode, run_op, assert_close, random_array) -> None:
    x = random_array((1, 2, 3, 4), dtype, seed=5)
    attrs = {"mode": mode, "coordinate_transformation_mode": "pytorch_half_pixel"}
    want = onnx_resize(x, (1, 2, 6, 3), attrs)
    (got,) = run_op(backend_name, "resize", [x], {**attrs, "size": [1, 2, 6, 3]})
    assert_close(got, want, dtype)


def test_resize_nearest_integers_and_copy(backend_name, run_op) -> None:
    x = np.arange(24, dtype=np.int64).reshape(1, 2, 3, 4) - 5
    (got,) = run_op(backend_name, "resize", [x], {"size": [1, 2, 6, 8],
                                                  "coordinate_transformation_mode": "asymmetric"})
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    (got,) = run_op(backend_name, "resize", [x.astype(np.float32)],
                    {"size": [1, 2, 3, 4], "mode": "linear"})
    np.testing.assert_array_equal(got, x)


def test_resize_linear_by_hand(backend_name, run_op) -> None:
    # align_corners 2 -> 3 puts the middle output halfway between the two inputs.
    x = np.array([[[0.0, 4.0]]], np.float32)
    (got,) = run_op(backend_name, "resize", [x], {
        "size": [1, 1, 3], "mode": "linear", "coordinate_transformation_mode": "align_corners"})
    np.testing.assert_allclose(got, [[[0.0, 2.0, 4.0]]])


def test_resize_errors(make_function) -> None:
    f = make_function("resize")
    spec = [TensorSpec((1, 1, 4, 4), "float32")]
    with pytest.raises(LibraryError, match="resize: attribute 'roi' = \\[0, 1\\]: expected 8 "
                                           "numbers"):
        f.infer(spec, {"size": [1, 1, 2, 2], "coordinate_transformation_mode":
                       "tf_crop_and_resize", "roi": [0, 1]})
    with pytest.raises(LibraryError, match="resize: attribute 'coordinate_transformation_mode' "
                                           "= 'tf_crop': expected one of"):
        f.infer(spec, {"size": [1, 1, 2, 2], "coordinate_transformation_mode": "tf_crop"})
    with pytest.raises(LibraryError, match="resize: attribute 'mode' = 'area'"):
        f.infer(spec, {"size": [1, 1, 2, 2], "mode": "area"})
    with pytest.raises(LibraryError, match=r"resize: attribute 'size' = \[1, 1, 2\]: "
                                           "expected 4 integers"):
        f.infer(spec, {"size": [1, 1, 2]})
    with pytest.raises(LibraryError, match=r"resize: attribute 'size' = \[1, 1, -2, 2\]"):
        f.infer(spec, {"size": [1, 1, -2, 2]})
    with pytest.raises(LibraryError, match="resize: attribute 'scales' = .*positive"):
        f.infer(spec, {"size": [1, 1, 2, 2], "scales": [1, 1, 0, 0.5]})
    with pytest.raises(LibraryError, match="resize: attribute 'antialias' = 1: expected 0 "
                                           "with mode 'nearest'"):
        f.infer(spec, {"size": [1, 1, 2, 2], "antialias": 1})
    with pytest.raises(LibraryError, match="resize: input 0 has dtype int32"):
        f.infer([TensorSpec((1, 4), "int32")], {"size": [1, 2], "mode": "linear"})
    with pytest.raises(LibraryError, match="resize: missing required attribute 'size'"):
        f.infer(spec, {})


@pytest.mark.parametrize("shape, size", [
    ((1, 3, 7, 5), (1, 3, 14, 10)), ((2, 5, 9, 9), (2, 5, 4, 13)), ((1, 4, 6, 8), (1, 4, 6, 3)),
    ((2, 70, 40, 40), (2, 70, 80, 80))])
@pytest.mark.parametrize("mode, ctm", [("linear", "half_pixel"), ("linear", "align_corners"),
                                       ("cubic", "pytorch_half_pixel"), ("nearest", "asymmetric")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_resize_equals_the_numpy_passes(monkeypatch, shape, size, mode, ctm, dtype,
                                                 run_op, random_array) -> None:
    """The compiled rows-then-columns pass (kernels/cpu/resize_jit.py) gives exactly the
    NumPy passes' float64 result, rounded once to the data's dtype, NaN and inf included, for
    every mode it takes (nearest stays NumPy; float32 data's NumPy passes sum in float32)."""
    from graph_runtime.lib.ops import resize as resize_op
    x = random_array(shape, dtype, seed=4)
    x.flat[5] = np.nan
    x.flat[11] = np.inf
    attrs = {"size": list(size), "mode": mode, "coordinate_transformation_mode": ctm}
    (got,) = run_op("cpu", "resize", [x], attrs)
    monkeypatch.setattr(resize_op, "resize_jit", lambda *args: None)
    (want,) = run_op("cpu", "resize", [x.astype(np.float64)], attrs)
    np.testing.assert_array_equal(got, want.astype(dtype))

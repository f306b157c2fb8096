"""2-D and 3-D max/avg pools against ONNX's float64 reference MaxPool/AveragePool; global pools
over any number of spatial axes; pool attribute errors."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


def onnx_pool(x: np.ndarray, op_type: str, **attrs) -> np.ndarray:
    """onnx.reference's MaxPool / AveragePool (opset 19) on x in float64."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {"x": x.astype(np.float64)})[0]


def ours_to_onnx(attrs: dict) -> dict:
    """Our pool attrs as ONNX attributes (pads: begins then ends, as ours)."""
    dims = len(attrs["pool_size"])
    pads = attrs.get("padding", [0])
    pads = pads * (2 * dims) if len(pads) == 1 else pads
    onnx_attrs = {"kernel_shape": attrs["pool_size"], "pads": pads,
                  "strides": attrs.get("strides", [1] * dims),
                  "ceil_mode": int(attrs.get("ceil_mode", False))}
    if "dilation" in attrs:
        onnx_attrs["dilations"] = attrs["dilation"]
    return onnx_attrs


CASES = [
    # asymmetric pads (top, left, bottom, right) with ceil_mode
    ((1, 2, 6, 5), {"pool_size": [3, 2], "strides": [2, 2], "padding": [1, 0, 0, 1],
                    "ceil_mode": True}),
    # ceil_mode whose last window would start past the data: ONNX drops it
    ((1, 1, 4, 3), {"pool_size": [2, 1], "strides": [3, 3], "padding": [1, 0, 1, 0],
                    "ceil_mode": True}),
    ((1, 2, 7, 6), {"pool_size": [2, 3], "dilation": [2, 2], "padding": [1, 2, 0, 1]}),
    ((1, 2, 4, 5, 3), {"pool_size": [2, 3, 2], "strides": [2, 1, 2],
                       "padding": [0, 1, 1, 1, 0, 1], "ceil_mode": True}),
    ((2, 1, 5, 4, 4), {"pool_size": [2, 2, 2], "dilation": [2, 1, 2], "padding": [1]}),
]


def _op(kind: str, shape) -> str:
    return f"{kind}_pool{len(shape) - 2}d"


@pytest.mark.parametrize("shape,attrs", CASES)
def test_max_pool(backend_name, shape, attrs, run_op, assert_close, random_array) -> None:
    x = random_array(shape, "float32", seed=1)
    want = onnx_pool(x, "MaxPool", **ours_to_onnx(attrs))
    (got,) = run_op(backend_name, _op("max", shape), [x], attrs)
    assert_close(got, want)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("shape,attrs", CASES)
def test_avg_pool(backend_name, shape, attrs, count_include_pad, run_op, assert_close,
                  random_array) -> None:
    x = random_array(shape, "float32", seed=2)
    want = onnx_pool(x, "AveragePool", count_include_pad=int(count_include_pad),
                     **ours_to_onnx(attrs))
    (got,) = run_op(backend_name, _op("avg", shape), [x],
                    dict(attrs, count_include_pad=count_include_pad))
    assert_close(got, want)


# CPU 2-D float pools run compiled (lib/kernels/cpu/pool_jit.py): strides 1 to 3, asymmetric
# padding, dilation, ceil_mode overhangs, 3x3 and 2x2 windows, batches, channels split over
# workers, and rows narrower than the window's reach.
JIT_CASES = [
    ((1, 64, 20, 20), {"pool_size": [3, 3], "strides": [2, 2], "padding": [1]}),
    ((3, 5, 16, 12), {"pool_size": [2, 2], "strides": [2, 2]}),
    ((2, 3, 9, 11), {"pool_size": [3, 2], "strides": [1, 3], "padding": [2, 0, 1, 1],
                     "ceil_mode": True}),
    ((1, 4, 10, 9), {"pool_size": [2, 3], "strides": [3, 2], "dilation": [2, 3],
                     "padding": [1, 2, 2, 0], "ceil_mode": True}),
    ((1, 2, 2, 3), {"pool_size": [3, 3], "strides": [1, 1], "padding": [1]}),
    ((2, 7, 8, 8), {"pool_size": [1, 1], "strides": [2, 2]}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,attrs", JIT_CASES)
def test_max_pool_jit(shape, attrs, dtype, run_op, assert_close, random_array) -> None:
    x = random_array(shape, dtype, seed=5)
    (got,) = run_op("cpu", "max_pool2d", [x], attrs)
    assert_close(got, onnx_pool(x, "MaxPool", **ours_to_onnx(attrs)))


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,attrs", JIT_CASES)
def test_avg_pool_jit(shape, attrs, dtype, count_include_pad, run_op, assert_close,
                      random_array) -> None:
    x = random_array(shape, dtype, seed=6)
    want = onnx_pool(x, "AveragePool", count_include_pad=int(count_include_pad),
                     **ours_to_onnx(attrs))
    (got,) = run_op("cpu", "avg_pool2d", [x], dict(attrs, count_include_pad=count_include_pad))
    assert_close(got, want)


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("shape", [(1, 7, 9, 8), (2, 5, 8, 9), (4, 3, 6, 6)])
def test_pool_jit_split_over_workers(monkeypatch, op, shape, run_op, assert_close,
                                     random_array) -> None:
    """Channel ranges handed to 3 workers (small pools run on one: forced here) cover every
    output once."""
    from graph_runtime.lib.kernels.cpu import pool_jit
    from graph_runtime.settings import NUM_THREADS

    monkeypatch.setenv(NUM_THREADS.name, "3")
    monkeypatch.setattr(pool_jit, "SERIAL_OUTPUTS", 0)
    x = random_array(shape, "float32", seed=7)
    attrs = {"pool_size": [3, 3], "strides": [2, 2], "padding": [1]}
    onnx_op = "MaxPool" if op.startswith("max") else "AveragePool"
    (got,) = run_op("cpu", op, [x], attrs)
    assert_close(got, onnx_pool(x, onnx_op, **ours_to_onnx(attrs)))


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_cpu_pools_run_compiled(op, make_function, monkeypatch) -> None:
    """float32/float64 2-D pools on the CPU are jit_cpu's loops; 3-D and float16 keep NumPy's."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")  # oneDNN's pools: test_onednn.py
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.ops.pool import _pool_cpu

    backend = get_backend("cpu")
    attrs = {"pool_size": [2, 2]}
    for shape, dtype, compiled in (((1, 2, 4, 4), "float32", True),
                                   ((1, 2, 4, 4), "float64", True),
                                   ((1, 2, 4, 4), "float16", False),
                                   ((1, 2, 4, 4, 4), "float32", False)):
        name = op.replace("2d", f"{len(shape) - 2}d")
        specs = [TensorSpec(shape, dtype)]
        attrs["pool_size"] = [2] * (len(shape) - 2)
        outputs = make_function(name).infer(specs, attrs)
        run = _pool_cpu(name)(backend, 0, specs, outputs, attrs)
        compiled_here = run.__module__ == "graph_runtime.lib.kernels.cpu.pool_jit"
        assert compiled_here == compiled, (shape, dtype)


def test_max_pool_jit_nan_wins(run_op, monkeypatch) -> None:
    """As np.maximum (the NumPy path's fold): a NaN in a window is its max, wherever it sits.

    (ONNX's reference MaxPool lets a NaN lose to a later tap, so NumPy is the reference here;
    oneDNN's max pool lets NaN lose too, so it is off for this test.)
    """
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")
    x = np.arange(2 * 6 * 6, dtype="float32").reshape(1, 2, 6, 6)
    x[0, 0, 0, 0] = np.nan
    x[0, 1, 3, 4] = np.nan
    (got,) = run_op("cpu", "max_pool2d", [x], {"pool_size": [3, 3], "strides": [2, 2],
                                               "padding": [1]})
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    want = windows[:, :, ::2, ::2].max(axis=(4, 5))
    np.testing.assert_array_equal(got, want)
    assert np.argwhere(np.isnan(got)).tolist() == [[0, 0, 0, 0], [0, 1, 1, 2], [0, 1, 2, 2]]


def test_max_pool_jit_window_of_padding_only(run_op) -> None:
    """A window with no data tap gives the dtype's lowest value, as the padded NumPy path."""
    x = np.ones((1, 1, 2, 2), "float32")
    (got,) = run_op("cpu", "max_pool2d", [x], {"pool_size": [1, 1], "padding": [1]})
    lowest = np.finfo(np.float32).min
    want = np.full((1, 1, 4, 4), lowest, "float32")
    want[0, 0, 1:3, 1:3] = 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_max_pool_8bit(backend_name, dtype, run_op) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(4)
    x = rng.integers(info.min, info.max, size=(1, 2, 5, 5), endpoint=True).astype(dtype)
    attrs = {"pool_size": [2, 2], "strides": [2, 2], "padding": [1, 1, 0, 0], "ceil_mode": True}
    (got,) = run_op(backend_name, "max_pool2d", [x], attrs)
    want = onnx_pool(x.astype(np.float64), "MaxPool", **ours_to_onnx(attrs))
    np.testing.assert_array_equal(got, want.astype(dtype))


def test_ceil_mode_drops_window_past_data(make_function) -> None:
    # 3 rows, window 1, stride 3: a second window would start at row 3, past the data.
    (spec,) = make_function("max_pool2d").infer([TensorSpec((1, 1, 3, 3), "float32")], {
        "pool_size": [1, 1], "strides": [3, 3], "ceil_mode": True})
    assert spec.shape == (1, 1, 1, 1)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 3, 2, 4)])
@pytest.mark.parametrize("op", ["global_avg_pool2d", "global_max_pool2d"])
def test_global_pools_nd(backend_name, op, shape, run_op, assert_close, random_array) -> None:
    x = random_array(shape, "float32", seed=3)
    reduce = np.mean if op == "global_avg_pool2d" else np.max
    want = reduce(x.astype(np.float64), axis=tuple(range(2, len(shape))), keepdims=True)
    (got,) = run_op(backend_name, op, [x])
    assert_close(got, want)


def test_pool_errors(make_function) -> None:
    x5 = [TensorSpec((1, 2, 4, 4, 4), "float32")]
    with pytest.raises(LibraryError, match=r"max_pool3d: attribute 'padding' = \[1, 1\]: "
                                           "expected 1, 3 or 6 non-negative"):
        make_function("max_pool3d").infer(x5, {"pool_size": [2, 2, 2], "padding": [1, 1]})
    with pytest.raises(LibraryError, match=r"avg_pool3d: attribute 'strides' = \[1, 0, 1\]: "
                                           "expected 3 positive integers"):
        make_function("avg_pool3d").infer(x5, {"pool_size": [2, 2, 2], "strides": [1, 0, 1]})
    with pytest.raises(LibraryError, match="max_pool3d: attribute 'layout' = 'NCHW': expected "
                                           "'NCDHW'"):
        make_function("max_pool3d").infer(x5, {"pool_size": [2, 2, 2], "layout": "NCHW"})
    with pytest.raises(LibraryError, match=r"max_pool2d: data has shape \(1, 2, 4, 4, 4\) "
                                           r"\(rank 5\); expected rank 4"):
        make_function("max_pool2d").infer(x5, {"pool_size": [2, 2]})
    with pytest.raises(LibraryError, match="max_pool3d: the depth window .* spans 5 but the "
                                           "padded input has only 4"):
        make_function("max_pool3d").infer(x5, {"pool_size": [5, 1, 1]})
    with pytest.raises(LibraryError, match=r"global_avg_pool2d: data \(2, 3\) float32 needs "
                                           "rank 3 or more"):
        make_function("global_avg_pool2d").infer([TensorSpec((2, 3), "float32")])

"""2-D and 3-D max/avg pools against ONNX's float64 reference MaxPool/AveragePool (windows longer
than the data against brute_pool); global pools over any number of spatial axes; pool attribute
errors."""
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


def brute_pool(x: np.ndarray, kind: str, attrs: dict) -> np.ndarray:
    """ONNX's MaxPool/AveragePool one window at a time in float64: the window count by ONNX's
    formula (ceil_mode drops a last window starting past the data and its begin padding); a
    tap reads the data or nothing; an average divides by the taps inside the data, or inside
    the data and explicit padding (count_include_pad), never by the ceil_mode overhang."""
    dims = x.ndim - 2
    kernel, strides = attrs["pool_size"], attrs.get("strides", [1] * dims)
    dilation = attrs.get("dilation", [1] * dims)
    pad = list(attrs.get("padding", [0]))
    pad = pad * (2 * dims) if len(pad) == 1 else pad
    begin, end = pad[:dims], pad[dims:]
    ceil, include = attrs.get("ceil_mode", False), attrs.get("count_include_pad", False)
    taps_of, out = [], []
    for n, k, s, d, b, e in zip(x.shape[2:], kernel, strides, dilation, begin, end):
        room = n + b + e - (k - 1) * d - 1
        length = (-(-room // s) if ceil else room // s) + 1
        if ceil and (length - 1) * s >= n + b:
            length -= 1
        out.append(length)
        taps_of.append([[w * s - b + j * d for j in range(k)] for w in range(length)])
    y = np.empty(x.shape[:2] + tuple(out))
    for index in np.ndindex(*out):
        windows = [taps_of[i][w] for i, w in enumerate(index)]
        inside = [[t for t in taps if 0 <= t < n] for taps, n in zip(windows, x.shape[2:])]
        values = x[(slice(None), slice(None)) + np.ix_(*inside)].astype(np.float64)
        values = values.reshape(x.shape[:2] + (-1,))
        if kind == "max":
            y[(...,) + index] = values.max(axis=-1)
            continue
        counted = [[t for t in taps if -b <= t < n + e] if include else kept
                   for taps, kept, n, b, e in zip(windows, inside, x.shape[2:], begin, end)]
        y[(...,) + index] = values.sum(axis=-1) / max(int(np.prod([len(c) for c in counted])), 1)
    return y


# Windows longer than the padded data (ceil_mode): Hugging Face's EfficientNet averages its 7x7
# map with a 1280-tap window; leading taps that only read begin padding; dilated taps.
LONG_CASES = [
    ((1, 6, 7, 7), {"pool_size": [1280, 1280], "strides": [1280, 1280], "padding": [0],
                    "ceil_mode": True}),
    ((1, 2, 6, 7), {"pool_size": [4, 5], "strides": [5, 4], "dilation": [3, 2],
                    "padding": [2, 1, 0, 0], "ceil_mode": True}),
    ((1, 2, 3, 5), {"pool_size": [5, 3], "strides": [1, 2], "padding": [4, 1, 0, 1],
                    "ceil_mode": True}),
    ((1, 2, 5, 4), {"pool_size": [4, 9], "strides": [3, 5], "padding": [1, 1, 0, 2],
                    "ceil_mode": True}),
    ((1, 2, 3, 4, 5), {"pool_size": [8, 2, 9], "strides": [8, 2, 9], "padding": [0, 1, 0, 0, 1, 0],
                       "ceil_mode": True}),
]


@pytest.mark.parametrize("count_include_pad", [None, False, True])
@pytest.mark.parametrize("shape,attrs", LONG_CASES)
def test_windows_longer_than_the_data(backend_name, shape, attrs, count_include_pad, run_op,
                                      assert_close, random_array) -> None:
    """Max (count_include_pad None) and avg pools as ONNX defines them (brute_pool); ONNX
    Runtime agrees (tests/frontend/test_import.py's grid)."""
    x = random_array(shape, "float32", seed=8)
    kind = "max" if count_include_pad is None else "avg"
    if count_include_pad is not None:
        attrs = dict(attrs, count_include_pad=count_include_pad)
    (got,) = run_op(backend_name, _op(kind, shape), [x], attrs)
    assert_close(got, brute_pool(x, kind, attrs))


@pytest.mark.parametrize("count_include_pad", [None, False, True])
@pytest.mark.parametrize("shape,attrs", [c for c in LONG_CASES if len(c[0]) == 4])
def test_windows_longer_than_the_data_jit(monkeypatch, shape, attrs, count_include_pad, run_op,
                                          assert_close, random_array) -> None:
    """The same on the CPU's compiled loops (oneDNN's: test_onednn.py)."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")
    x = random_array(shape, "float64", seed=9)
    kind = "max" if count_include_pad is None else "avg"
    if count_include_pad is not None:
        attrs = dict(attrs, count_include_pad=count_include_pad)
    (got,) = run_op("cpu", _op(kind, shape), [x], attrs)
    assert_close(got, brute_pool(x, kind, attrs))


def test_reading_drops_the_taps_that_read_no_data() -> None:
    """EfficientNet's 1280x1280 window over 7x7 data reads a 7x7 window: no 1280-wide
    workspace or 1280^2-tap loop on any backend."""
    from graph_runtime.lib.ops.pool import pool_params, reading

    whole = pool_params("avg_pool2d", [TensorSpec((2, 1280, 7, 7), "float32")], {
        "pool_size": [1280, 1280], "strides": [1280, 1280], "ceil_mode": True,
        "count_include_pad": True})
    assert whole.out == (1, 1)
    assert (reading(whole).kernel, reading(whole).begin) == ((7, 7), (0, 0))
    # Begin padding 4 over 3 rows with a 5-tap window: the 2 taps no window reads go.
    p = pool_params("max_pool2d", [TensorSpec((1, 1, 3, 3), "float32")], {
        "pool_size": [5, 1], "padding": [4, 0, 0, 0]})
    assert (p.out, reading(p).kernel, reading(p).begin) == ((3, 3), (3, 1), (2, 0))


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
    with pytest.raises(LibraryError, match="max_pool3d: the depth window .* spans 9: with stride "
                                           "4 and ceil_mode no window starts inside the data"):
        make_function("max_pool3d").infer(x5, {"pool_size": [9, 1, 1], "strides": [4, 1, 1],
                                               "ceil_mode": True})
    with pytest.raises(LibraryError, match=r"global_avg_pool2d: data \(2, 3\) float32 needs "
                                           "rank 3 or more"):
        make_function("global_avg_pool2d").infer([TensorSpec((2, 3), "float32")])

"""SegFormer's decoder channels-last: resize (kernels/cpu/resize_jit.py) and concatenate read
and write the NCHW views of NHWC bytes, against the NCHW path and float64 references."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.device import cpu
from graph_runtime.lib.kernels.cpu.resize_jit import ResizeCopy, ResizeJit
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.loader import function_from_json
from graph_runtime.runtime.layouts import nhwc_view


def _prepared(op: str, shapes: list[tuple[int, ...]], attrs: dict) -> object:
    chain = function_from_json(op, {"ops": [{"op": op, **attrs}]}, "test")
    specs = [TensorSpec(s, "float32") for s in shapes]
    return chain.prepare(cpu(), specs, chain.infer(specs), {})


def _in_layout(x: np.ndarray, nhwc: bool) -> np.ndarray:
    if not nhwc:
        return x.copy()
    view = nhwc_view(np.empty(x.shape, x.dtype))
    view[...] = x
    return view


def _blank(shape: tuple[int, ...], nhwc: bool) -> np.ndarray:
    out = np.full(shape, np.nan, np.float32)
    return nhwc_view(out) if nhwc else out


@pytest.mark.parametrize("shape, size", [
    ((1, 5, 7, 3), (1, 5, 14, 9)), ((2, 3, 9, 8), (2, 3, 4, 13)),
    ((1, 40, 16, 16), (1, 40, 64, 64)), ((1, 16, 5, 6), (1, 16, 5, 11))])
@pytest.mark.parametrize("mode, ctm", [("linear", "half_pixel"), ("linear", "align_corners"),
                                       ("cubic", "pytorch_half_pixel")])
@pytest.mark.parametrize("nhwc_in, nhwc_out", [(True, True), (True, False), (False, True)])
def test_resize_reads_and_writes_channels_last(shape, size, mode, ctm, nhwc_in, nhwc_out,
                                               run_op, random_array) -> None:
    """Every mix of layouts gives exactly the NCHW compiled result (the same sums in the same
    order), which test_resize.py holds to the float64 NumPy passes; NaN and inf included."""
    x = random_array(shape, "float32", seed=3)
    x.flat[4] = np.nan
    x.flat[9] = np.inf
    attrs = {"size": list(size), "mode": mode, "coordinate_transformation_mode": ctm}
    (want,) = run_op("cpu", "resize", [x], attrs)
    kernel = _prepared("resize", [shape], attrs)
    assert isinstance(kernel, ResizeJit)
    assert kernel.channels_last_positions() == (0, 1)
    kernel.use_channels_last([p for p, on in ((0, nhwc_in), (1, nhwc_out)) if on])
    out = _blank(size, nhwc_out)
    kernel(_in_layout(x, nhwc_in), out)
    np.testing.assert_array_equal(out, want)
    if mode == "linear":  # finite data against ONNX's float64 reference too
        from test_resize import onnx_resize
        finite = random_array(shape, "float32", seed=6)
        kernel(_in_layout(finite, nhwc_in), out)
        np.testing.assert_allclose(out, onnx_resize(finite, size, attrs), rtol=1e-6, atol=1e-6)


def test_an_unchanged_size_is_a_copy_in_any_layout(random_array) -> None:
    x = random_array((1, 6, 4, 5), "float32", seed=5)
    kernel = _prepared("resize", [x.shape], {"size": [1, 6, 4, 5], "mode": "linear"})
    assert isinstance(kernel, ResizeCopy) and kernel.channels_last_positions() == (0, 1)
    for nhwc_in, nhwc_out in [(True, True), (True, False), (False, True)]:
        out = _blank(x.shape, nhwc_out)
        kernel(_in_layout(x, nhwc_in), out)
        np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("shapes, axis", [
    ([(1, 3, 4, 5), (1, 2, 4, 5)], 1),
    ([(1, 64, 80, 80), (1, 32, 80, 80), (1, 16, 80, 80)], 1),  # large (bands in workers' mode)
    ([(1, 8, 70, 90), (1, 8, 50, 90)], 2),
    ([(2, 8, 60, 50), (2, 8, 60, 70)], 3)])
def test_concatenate_reads_and_writes_channels_last(shapes, axis, random_array) -> None:
    xs = [random_array(s, "float32", seed=i) for i, s in enumerate(shapes)]
    want = np.concatenate(xs, axis=axis)
    kernel = _prepared("concatenate", shapes, {"axis": axis})
    n = len(shapes)
    assert kernel.channels_last_positions() == tuple(range(n + 1))
    for layouts in ([True] * (n + 1), [False] * (n + 1), [i % 2 == 0 for i in range(n + 1)]):
        kernel.use_channels_last([i for i, on in enumerate(layouts) if on])
        out = _blank(want.shape, layouts[-1])
        kernel(*[_in_layout(x, on) for x, on in zip(xs, layouts)], out)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("mode", ["openmp", "workers"])
def test_a_join_goes_to_the_workers_by_its_size_and_the_mode(mode, monkeypatch,
                                                             random_array) -> None:
    """In OpenMP mode (oneDNN's threads spinning on the cores) a join of images takes the
    workers from OPENMP_SERIAL_OUTPUTS values, in the workers' mode from SERIAL_OUTPUTS; the
    bands give NumPy's join either way (the threshold lowered so that they are taken)."""
    from graph_runtime.lib.kernels.cpu import omp_team
    from graph_runtime.lib.kernels.threads import num_threads
    from graph_runtime.lib.ops import slicing
    if num_threads() < 2:
        pytest.skip("one CPU: no workers")
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN_THREADS", mode)
    shapes = [(1, 64, 80, 80), (1, 32, 80, 80), (1, 16, 80, 80)]  # 716,800 values
    openmp = omp_team.available()  # without oneDNN, neither mode has the team
    assert not openmp or mode == "openmp"
    assert _prepared("concatenate", shapes, {"axis": 1}).workers == (1 if openmp else 2)
    monkeypatch.setattr(slicing, "OPENMP_SERIAL_OUTPUTS", 1 << 10)
    monkeypatch.setattr(slicing, "SERIAL_OUTPUTS", 1 << 10)
    kernel = _prepared("concatenate", shapes, {"axis": 1})
    assert kernel.workers == 2
    xs = [random_array(s, "float32", seed=i) for i, s in enumerate(shapes)]
    want = np.concatenate(xs, axis=1)
    for layouts in ([True] * 4, [False] * 4, [True, False, True, False]):
        kernel.use_channels_last([i for i, on in enumerate(layouts) if on])
        out = _blank(want.shape, layouts[-1])
        kernel(*[_in_layout(x, on) for x, on in zip(xs, layouts)], out)
        np.testing.assert_array_equal(out, want)


def test_a_serial_concatenate_takes_any_shape(random_array) -> None:
    # a KV cache's past joined with one new token, one length more each step: the kernel
    # prepared at one length serves the next (runtime/executor.py shares it by band)
    kernel = _prepared("concatenate", [(1, 2, 40, 16), (1, 2, 1, 16)], {"axis": 2})
    assert kernel.any_shape()
    for past in (40, 41, 63):
        xs = [random_array((1, 2, past, 16), "float32", seed=past),
              random_array((1, 2, 1, 16), "float32", seed=1)]
        out = _blank((1, 2, past + 1, 16), False)
        kernel(*xs, out)
        np.testing.assert_array_equal(out, np.concatenate(xs, axis=2))
    # in bands on the workers (more than one core), it copies at the offsets of its shapes
    large = _prepared("concatenate", [(1, 64, 80, 80), (1, 32, 80, 80)], {"axis": 1})
    assert large.any_shape() == (large.workers <= 1)
    # the serial one serves the shapes a prepare also makes serial: a large image join is not
    # one of them where the workers would take it
    assert kernel.serves([(1, 2, 300, 16), (1, 2, 1, 16), (1, 2, 301, 16)])
    assert kernel.serves([(1, 64, 80, 80), (1, 32, 80, 80), (1, 96, 80, 80)]) == (
        large.workers <= 1)


def test_segformer_decoder_stays_channels_last(monkeypatch, random_array) -> None:
    """tokens -> image -> resize (and an unchanged-size resize) -> concatenate -> oneDNN 1x1
    conv, as SegFormer's decode head: every image entry stays NHWC and the result is the
    float64 one."""
    import graph_runtime as gr
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn import binding
    from support import make_graph, null, tvm_op
    from test_conv import ref_conv2d_attrs
    if not binding.available():
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    lib = Module("decoder")
    for name, h in (("small", 3), ("big", 6)):
        lib.register(f"image_{name}", Chain(name, [
            Step("transpose", {"axes": [0, 2, 1]}), Step("reshape", {"newshape": [1, 8, h, h]})]))
    lib.register("up", Chain("up", [Step("resize", {"size": [1, 8, 6, 6], "mode": "linear"})]))
    lib.register("same", Chain("same", [Step("resize", {"size": [1, 8, 6, 6],
                                                        "mode": "linear"})]))
    lib.register("cat", Chain("cat", [Step("concatenate", {"axis": 1})]))
    lib.register("conv", Chain("conv", [Step("conv2d", {}), Step("relu")]))
    nodes = [null("a"), null("b"), tvm_op("ia", "image_small", [0]),
             tvm_op("ib", "image_big", [1]), tvm_op("ra", "up", [2]), tvm_op("rb", "same", [3]),
             tvm_op("cat", "cat", [4, 5]), null("w"), tvm_op("conv", "conv", [6, 7])]
    shapes = [[1, 9, 8], [1, 36, 8], [1, 8, 3, 3], [1, 8, 6, 6], [1, 8, 6, 6], [1, 8, 6, 6],
              [1, 16, 6, 6], [5, 16, 1, 1], [1, 5, 6, 6]]
    m = gr.create(make_graph(nodes, [8], shapes=shapes), lib, gr.cpu())
    arrays = {name: random_array(tuple(shapes[i]), "float32", seed=i)
              for i, name in [(0, "a"), (1, "b"), (7, "w")]}
    m.set_input(**arrays)
    m.run()
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    from test_resize import onnx_resize
    small = a["a"].transpose(0, 2, 1).reshape(1, 8, 3, 3)
    up = onnx_resize(small, (1, 8, 6, 6), {"mode": "linear"})
    cat = np.concatenate([up, a["b"].transpose(0, 2, 1).reshape(1, 8, 6, 6)], axis=1)
    want = np.maximum(ref_conv2d_attrs(cat, a["w"], {}), 0)
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=2e-5,
                               atol=2e-5 * float(np.abs(want).max()))
    g = m.executor.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in m.executor.channels_last}
    assert kept == {"ia", "ib", "ra", "rb", "cat"}

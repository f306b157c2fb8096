"""Compiled CPU chains (lib/kernels/cpu/chain_jit.py) against the NumPy path of the same chain."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graph_runtime import settings
from graph_runtime.device import cpu
from graph_runtime.lib.chain import Chain, PreparedChain, Step
from graph_runtime.lib.kernels.cpu import chain_jit
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.prepared import capabilities
from graph_runtime.lib.registry import load_standard_ops

load_standard_ops()
F32_EPS = 2.0 ** -23

ERF_GELU = [Step("divide"), Step("erf"), Step("add"), Step("multiply"), Step("multiply")]
TANH_GELU = [Step("power"), Step("multiply"), Step("add"), Step("multiply"), Step("tanh"),
             Step("add"), Step("multiply"), Step("multiply")]

# (name, steps, input shapes and dtypes)
CASES = [
    ("erf_gelu", ERF_GELU, [((7, 13, 5), "float32"), ((), "float32"), ((), "float32"),
                            ((7, 13, 5), "float32"), ((), "float32")]),
    ("tanh_gelu", TANH_GELU, [((3, 33), "float32"), ((), "float32"), ((), "float32"),
                              ((3, 33), "float32"), ((), "float32"), ((), "float32"),
                              ((3, 33), "float32"), ((), "float32")]),
    ("bias_gelu", [Step("add"), Step("gelu")], [((5, 37), "float32"), ((37,), "float32")]),
    # rows of whole 64-value turns: the loop's 16-lane form where the machine takes it
    ("long_bias_gelu", [Step("add"), Step("gelu")], [((3, 256), "float32"), ((256,), "float32")]),
    ("long_tanh_silu", [Step("gelu", {"approximate": "tanh"}), Step("sigmoid"),
                        Step("multiply")], [((2, 1, 200), "float32"), ((2, 7, 200), "float32")]),
    ("gelu_tanh_attr", [Step("gelu", {"approximate": "tanh"}), Step("relu")],
     [((4, 9), "float64")]),
    ("mask", [Step("multiply"), Step("add")],
     [((2, 3, 5, 5), "float32"), ((), "float32"), ((2, 1, 1, 5), "float32")]),
    ("column", [Step("subtract"), Step("divide"), Step("multiply"), Step("add")],
     [((6, 11), "float32"), ((6, 1), "float32"), ((6, 1), "float32"), ((11,), "float32"),
      ((11,), "float32")]),
    ("middle", [Step("add"), Step("exp")], [((3, 4, 5), "float64"), ((1, 4, 1), "float64")]),
    ("exp32", [Step("subtract"), Step("exp")], [((4, 67), "float32"), ((4, 1), "float32")]),
    ("where", [Step("where"), Step("sigmoid")],
     [((2, 1, 7), "bool"), ((2, 3, 7), "float32"), ((), "float32")]),
    ("cast", [Step("cast", {"dtype": "float32"}), Step("sqrt"), Step("maximum")],
     [((4, 6), "int64"), ((4, 6), "float32")]),
    ("compare", [Step("less"), Step("logical_not")], [((9,), "float32"), ((1,), "float32")]),
    ("ints", [Step("add"), Step("multiply"), Step("minimum")],
     [((5, 5), "int32"), ((5,), "int32"), ((), "int32"), ((5, 1), "int32")]),
    ("reshape_gelu", [Step("reshape", {"newshape": [3, 10]}), Step("gelu"),
                      Step("reshape", {"newshape": [30]}), Step("multiply")],
     [((2, 3, 5), "float32"), ((), "float32")]),
    ("clip_tanh", [Step("clip", {"a_min": -1.5, "a_max": 2.0}), Step("tanh"), Step("abs")],
     [((17, 3), "float32")]),
    # QuantizeLinear's chain: NaN and infinities cast to int32's minimum, as NumPy's cast does
    ("quantize", [Step("divide"), Step("round"), Step("cast", {"dtype": "int32"}), Step("add"),
                  Step("clip", {"a_min": -128.0, "a_max": 127.0}),
                  Step("cast", {"dtype": "int8"})],
     [((9, 31), "float32"), ((), "float32"), ((), "int32")]),
    ("round_int64", [Step("multiply"), Step("round"), Step("cast", {"dtype": "int64"}),
                     Step("clip", {"a_min": -1e30, "a_max": 7.5})],
     [((40,), "float64"), ((), "float64")]),
]


def _inputs(specs: list[TensorSpec], rng: np.random.Generator) -> list[np.ndarray]:
    arrays = []
    for spec in specs:
        shape = tuple(spec.shape)
        if spec.dtype == "bool":
            arrays.append(rng.random(shape) > 0.5)
        elif np.dtype(spec.dtype).kind == "i":
            arrays.append(rng.integers(-20, 20, shape).astype(spec.dtype))
        else:
            a = (rng.standard_normal(shape) * 3).astype(spec.dtype)
            if a.size >= 4:
                flat = a.reshape(-1)
                flat[rng.integers(0, a.size, 3)] = [np.nan, np.inf, -np.inf]
            arrays.append(a)
    return arrays


def _run(steps: list[Step], specs: list[TensorSpec], arrays: list[np.ndarray],
         monkeypatch: pytest.MonkeyPatch, mode: str) -> tuple[np.ndarray, object]:
    monkeypatch.setenv(settings.CHAIN_JIT.name, mode)
    chain = Chain("t", steps)
    outs = chain.infer(specs)
    fn = chain.prepare(cpu(0), specs, outs, {})
    out = np.full(tuple(outs[0].shape), 7, outs[0].dtype)
    with np.errstate(all="ignore"):
        fn(*arrays, out)
    return out, fn


@pytest.mark.parametrize("name,steps,shapes", CASES, ids=[c[0] for c in CASES])
def test_compiled_chain_matches_numpy(name: str, steps: list[Step], shapes: list,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [TensorSpec(s, d) for s, d in shapes]
    arrays = _inputs(specs, np.random.default_rng(len(name)))
    want, _ = _run(steps, specs, arrays, monkeypatch, "off")
    got, fn = _run(steps, specs, arrays, monkeypatch, "auto")
    assert isinstance(fn, (PreparedChain, chain_jit.CompiledChain))
    compiled = fn if isinstance(fn, chain_jit.CompiledChain) else fn._steps[-1][0]
    assert isinstance(compiled, chain_jit.CompiledChain), f"{name} did not compile"
    assert got.dtype == want.dtype
    if want.dtype.kind == "f":
        _assert_close(got, want, arrays)
    else:
        np.testing.assert_array_equal(got, want)


def _assert_close(got: np.ndarray, want: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Equal NaNs and infinities; finite values within a few ulps of the inputs' scale.

    float32 erf and tanh are rational approximations within 5 ulps of the result (test below);
    1 + erf(x) cancels near -1, so GELU's error is a few ulps of |x| rather than of the result.
    """
    tol = 16 * F32_EPS if got.dtype == np.float32 else 1e-13
    finite = [np.abs(a[np.isfinite(a)]).max(initial=1.0) for a in arrays if a.dtype.kind == "f"]
    scale = max(finite, default=1.0)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True)


def test_parallel_ranges_match_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_RUNTIME_NUM_THREADS", "2")
    monkeypatch.setattr(chain_jit, "PARALLEL_WORK", 1)
    specs = [TensorSpec((3, 1000, 7), "float32"), TensorSpec((1000, 1), "float32")]
    arrays = _inputs(specs, np.random.default_rng(1))
    want, _ = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "off")
    got, fn = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "auto")
    assert fn._steps[-1][0].workers == 2  # type: ignore[union-attr]
    _assert_close(got, want, arrays)


@pytest.mark.parametrize("op", ["erf", "tanh"])
def test_float32_erf_tanh_against_float64(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.special import erf
    x = np.concatenate([np.linspace(-9, 9, 200_001), [0.0, -0.0, 1e-30, 4.0, -4.0, 8.0]])
    x = x.astype(np.float32)
    got, _ = _run([Step(op), Step("copy")], [TensorSpec(x.shape, "float32")], [x], monkeypatch,
                  "auto")
    want = (erf if op == "erf" else np.tanh)(x.astype(np.float64))
    # Eigen's rational approximations: a few ulps of the result (measured 4.4e-7 relative).
    np.testing.assert_allclose(got, want, rtol=5 * F32_EPS, atol=1e-37)


def test_reshape_with_broadcast_input_stays_out_of_the_tail(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # the bias broadcasts against (5, 6), not the reshaped (30,): the add stays out of the tail
    specs = [TensorSpec((5, 6), "float32"), TensorSpec((6,), "float32"), TensorSpec((), "float32")]
    steps = [Step("add"), Step("reshape", {"newshape": [30]}), Step("exp"), Step("multiply")]
    arrays = _inputs(specs, np.random.default_rng(5))
    want, _ = _run(steps, specs, arrays, monkeypatch, "off")
    got, fn = _run(steps, specs, arrays, monkeypatch, "auto")
    assert fn.fused_ops == ["reshape", "exp", "multiply"]  # type: ignore[attr-defined]
    _assert_close(got, want, arrays)


def test_views_after_every_op_leave_the_loop_in_its_inputs_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # wav2vec2's group norm: a per-channel scale and bias, GELU, then a reshape to 4-D. The
    # loop runs over the inputs' broadcast (1, 8, 50) and the reshape keeps the elements' order,
    # so the per-channel inputs (neither whole nor one value) are compiled too
    steps = [Step("multiply"), Step("add"), Step("gelu"),
             Step("reshape", {"newshape": [1, 8, 1, 50]})]
    specs = [TensorSpec((1, 8, 50), "float32"), TensorSpec((8, 1), "float32"),
             TensorSpec((8, 1), "float32")]
    arrays = _inputs(specs, np.random.default_rng(3))
    want, _ = _run(steps, specs, arrays, monkeypatch, "off")
    got, fn = _run(steps, specs, arrays, monkeypatch, "auto")
    assert fn.fused_ops == ["multiply", "add", "gelu", "reshape"]  # type: ignore[attr-defined]
    _assert_close(got, want, arrays)
    # through its call site at another length, as a symbolic module's step calls it
    site = capabilities(fn).call_site()
    assert site is not None
    other = [TensorSpec((1, 8, 70), "float32"), *specs[1:]]
    arrays = _inputs(other, np.random.default_rng(4))
    steps[-1] = Step("reshape", {"newshape": [1, 8, 1, 70]})
    want, _ = _run(steps, other, arrays, monkeypatch, "off")
    got = np.full(want.shape, 7, want.dtype)
    with np.errstate(all="ignore"):
        site(*arrays, got)
    _assert_close(got, want, arrays)
    # inputs whose broadcast has another size than the output's are refused, not misread
    assert not capabilities(fn).serves([(1, 8, 70), (8, 1), (8, 1), (1, 8, 1, 50)])
    assert chain_jit.before_views(["multiply", "reshape", "exp"], [(8, 5), (8, 1)],
                                  (40,)) is None  # a view before another op


def test_exotic_chain_keeps_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [TensorSpec((4, 4), "float16")]
    _, fn = _run([Step("exp"), Step("tanh")], specs, [np.ones((4, 4), np.float16)], monkeypatch,
                 "auto")
    assert not any(isinstance(f, chain_jit.CompiledChain) for f, _ in fn._steps)  # type: ignore


def test_cache_source_on_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv(settings.CACHE_DIR.name, str(tmp_path))
    monkeypatch.setattr(chain_jit, "_compiled", {})
    specs = [TensorSpec((3, 5), "float64"), TensorSpec((5,), "float64")]
    arrays = _inputs(specs, np.random.default_rng(2))
    got, _ = _run([Step("add"), Step("exp")], specs, arrays, monkeypatch, "auto")
    np.testing.assert_allclose(got, np.exp(arrays[0] + arrays[1]), rtol=1e-15)
    import pathlib
    sources = list(pathlib.Path(str(tmp_path), "chain_jit").glob("chain_*.py"))
    assert len(sources) == 1
    assert "def run(" in sources[0].read_text()


def test_unwritable_cache_falls_back_to_a_folder_of_the_process(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(settings.CACHE_DIR.name, str(blocker))
    monkeypatch.setattr(chain_jit, "_compiled", {})
    monkeypatch.setattr(chain_jit, "_fallback_dir", None)
    specs = [TensorSpec((3, 5), "float64"), TensorSpec((5,), "float64")]
    arrays = _inputs(specs, np.random.default_rng(4))
    with caplog.at_level("WARNING"):
        got, _ = _run([Step("add"), Step("tanh")], specs, arrays, monkeypatch, "auto")
    np.testing.assert_allclose(got, np.tanh(arrays[0] + arrays[1]), rtol=1e-15)
    assert "is not writable" in caplog.text
    assert chain_jit._fallback_dir is not None and str(blocker) not in chain_jit._fallback_dir


def test_kernel_note_says_which_path_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_runtime.lib.chain import kernel_note
    specs = [TensorSpec((4, 8), "float32"), TensorSpec((8,), "float32")]
    arrays = _inputs(specs, np.random.default_rng(3))
    _, compiled = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "auto")
    assert kernel_note(compiled) == "compiled tail add+gelu"
    _, numpy_path = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "off")
    assert kernel_note(numpy_path) == "numpy, one pass per op"


# (steps, shapes prepared, other shapes met by a symbolic module's next length): the site
# runs each as the NumPy path prepared for it would (a broadcast input turned whole or one
# value loads that form's loop)
OTHER_SHAPES = [
    ([Step("logical_and"), Step("logical_and"), Step("where")],
     [((), "bool"), ((1, 1, 1, 33), "bool"), ((1, 1, 1, 33), "bool"), ((), "float32"),
      ((), "float32")],
     [[(), (1, 1, 1, 34), (1, 1, 1, 34), (), ()], [(), (2, 1, 5, 70), (2, 1, 1, 70), (), ()],
      [(), (1, 1, 1, 1), (1, 1, 1, 1), (), ()]]),
    ([Step("add"), Step("gelu")], [((5, 37), "float32"), ((37,), "float32")],
     [[(9, 37), (37,)], [(9, 37), (9, 37)], [(2, 3, 8), (1,)]]),
    ([Step("reshape", {"newshape": [-1]}), Step("multiply"), Step("add")],
     [((2, 3, 5), "float32"), ((), "float32"), ((30,), "float32")],
     [[(2, 3, 7), (), (42,)], [(1, 1, 1), (1,), (1,)]]),
]


@pytest.mark.parametrize("steps,prepared,others", OTHER_SHAPES,
                         ids=["mask", "bias_gelu", "flat"])
def test_a_compiled_chain_through_its_call_site_runs_any_shape(
        steps: list[Step], prepared: list, others: list,
        monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [TensorSpec(s, d) for s, d in prepared]
    _, fn = _run(steps, specs, _inputs(specs, np.random.default_rng(0)), monkeypatch, "auto")
    kernel = capabilities(fn)
    assert kernel.any_shape()
    site = kernel.call_site()
    assert site is not None
    rng = np.random.default_rng(1)
    for shapes in others:
        other = [TensorSpec(s, spec.dtype) for s, spec in zip(shapes, specs)]
        arrays = _inputs(other, rng)
        want, _ = _run(steps, other, arrays, monkeypatch, "off")
        assert kernel.serves([tuple(s) for s in shapes] + [tuple(want.shape)])
        got = np.full(want.shape, 7, want.dtype)
        with np.errstate(all="ignore"):
            site(*arrays, got)
        _assert_close(got, want, arrays)
    # the kernel itself still runs the shapes it was prepared for
    arrays = _inputs(specs, rng)
    want, _ = _run(steps, specs, arrays, monkeypatch, "off")
    got = np.full(want.shape, 7, want.dtype)
    with np.errstate(all="ignore"):
        fn(*arrays, got)
    _assert_close(got, want, arrays)


def test_a_flat_loop_serves_no_input_neither_whole_nor_one_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # with a reshape in the tail each input is read at the element's flat index: (3,) against
    # an output of 6 elements would read the wrong ones, so the site refuses it
    steps = [Step("reshape", {"newshape": [6]}), Step("multiply")]
    specs = [TensorSpec((2, 3), "float32"), TensorSpec((6,), "float32")]
    _, fn = _run(steps, specs, _inputs(specs, np.random.default_rng(0)), monkeypatch, "auto")
    assert isinstance(fn, (PreparedChain, chain_jit.CompiledChain))
    assert fn.serves([(2, 3), (6,), (6,)])
    assert not fn.serves([(2, 3), (3,), (6,)])
    site = fn.call_site()
    assert site is not None
    with pytest.raises(LibraryError, match="neither whole nor one value"):
        site(np.ones((2, 3), np.float32), np.ones(3, np.float32), np.empty(6, np.float32))


def test_reshapes_in_a_row_are_one_reshape_taking_any_shape() -> None:
    # a decoder's mask: reshape to (1, n), (1, 1, n), (1, 1, 1, n) of the past length
    chain = Chain("t", [Step("reshape", {"newshape": [1, 8]}),
                        Step("reshape", {"newshape": [1, 1, 8]}),
                        Step("reshape", {"newshape": [1, 1, 1, 8]})])
    specs = [TensorSpec((8,), "int64")]
    fn = chain.prepare(cpu(0), specs, chain.infer(specs), {})
    kernel = capabilities(fn)
    assert kernel.any_shape() and not isinstance(fn, PreparedChain)
    out = np.empty((1, 1, 1, 11), np.int64)
    fn(np.arange(11), out)
    np.testing.assert_array_equal(out.reshape(-1), np.arange(11))


@pytest.mark.parametrize("shapes,inner", [
    ([((3, 256), "float32"), ((256,), "float32")], 256),  # a bias row: rows of 256
    ([((4, 5, 33), "float32"), ((4, 5, 33), "float32")], 660),  # whole: one row of 660
    ([((6, 49), "float32"), ((49,), "float32")], 49)])
def test_a_chains_loop_is_16_lanes_wide_for_long_rows(shapes: list, inner: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The module a shape runs is the 16-lane form where its rows (the innermost collapsed
    dim) take it (vector_width.wide_rows), and computes what NumPy does."""
    from graph_runtime.lib.kernels.cpu import vector_width
    specs = [TensorSpec(s, d) for s, d in shapes]
    arrays = _inputs(specs, np.random.default_rng(inner))
    want, _ = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "off")
    got, fn = _run([Step("add"), Step("gelu")], specs, arrays, monkeypatch, "auto")
    compiled = fn if isinstance(fn, chain_jit.CompiledChain) else fn._steps[-1][0]
    geometry = compiled.at(tuple(s for s, _ in shapes) + (want.shape,))
    assert geometry.inner == inner
    assert geometry.form[1] is vector_width.wide_rows(inner)
    _assert_close(got, want, arrays)


@pytest.mark.parametrize("steps,prepared,shapes_at", [
    # a decoder's mask chains: a flat one (a reshape of the mask to a column) and a broadcast
    ([Step("cast", {"dtype": "float32"}), Step("reshape", {"newshape": [-1, 1]})],
     [((1, 8), "int64")], lambda n: [(1, n), (n, 1)]),
    ([Step("multiply"), Step("add")],
     [((1,), "float32"), ((1, 1, 1, 8), "float32"), ((1, 1, 1, 8), "float32")],
     lambda n: [(1,), (1, 1, 1, n), (1, 1, 1, n), (1, 1, 1, n)]),
    ([Step("multiply"), Step("add")],
     [((), "float32"), ((8,), "float32"), ((1, 8), "float32")],
     lambda n: [(), (n,), (1, n), (1, n)])], ids=["flat", "broadcast", "ranks"])
def test_a_one_dim_geometry_made_directly_is_the_full_ways(
        steps: list[Step], prepared: list, shapes_at: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """_along_one_dim (a new length of a decode step's mask chains) gives what _geometry's full
    way gives, at every length, and leaves shapes it cannot tell to that way."""
    specs = [TensorSpec(s, d) for s, d in prepared]
    _, fn = _run(steps, specs, _inputs(specs, np.random.default_rng(0)), monkeypatch, "auto")
    compiled = fn if isinstance(fn, chain_jit.CompiledChain) else fn._steps[-1][0]
    assert isinstance(compiled, chain_jit.CompiledChain)
    made = 0
    for n in range(1, 400):
        shapes = tuple(shapes_at(n))
        quick = compiled._along_one_dim(shapes)
        with monkeypatch.context() as m:
            m.setattr(chain_jit.CompiledChain, "_along_one_dim", lambda self, s: None)
            full = compiled._geometry(shapes)
        if quick is None:
            continue
        made += 1
        assert full is not None
        assert quick[1:4] == full[1:4] and quick[5:] == full[5:]  # form, size, inner; work
        assert [m.shape for m in quick.metas] == [m.shape for m in full.metas]
        assert quick.fn is full.fn
    assert made > 300
    # an output with two dims over 1, or an input neither whole nor one value: the full way
    assert compiled._along_one_dim(((2, 3), (3, 2))) is None

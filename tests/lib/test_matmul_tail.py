"""A dense's tail on oneDNN's matmul: bias and adds as post-ops, the rest compiled per item
(lib/kernels/onednn/matmul_tail.py, matmul.py, chain.py's _onednn_tail)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_onednn import THREADS_ENV, U32, onednn  # noqa: F401  (the fixture)

import graph_runtime as gr
from graph_runtime.lib.chain import Chain, Step, kernel_note
from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.lib.kernels.onednn import matmul as onednn_matmul
from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import ONEDNN_THREADS

M, N, K = 13, 37, 29  # odd sizes: no vector width divides them


def _gelu(x: np.ndarray, tanh: bool) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        if tanh:
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))


# (tail steps, extra operand shapes, float64 reference of the tail over the product p)
TAILS = {
    "bias": ([Step("add")], [(N,)], lambda p, b: p + b),
    "bias_gelu": ([Step("add"), Step("gelu")], [(N,)], lambda p, b: _gelu(p + b, False)),
    "bias_gelu_tanh": ([Step("add"), Step("gelu", {"approximate": "tanh"})], [(N,)],
                       lambda p, b: _gelu(p + b, True)),
    "bias_residual": ([Step("add"), Step("add")], [(N,), (2, M, N)], lambda p, b, r: p + b + r),
    "scale_then_row": ([Step("multiply"), Step("add")], [(1,), (1, N)],
                       lambda p, s, b: p * s + b),
    "residual_first": ([Step("add"), Step("add")], [(2, M, N), (N,)],
                       lambda p, r, b: p + r + b),
    "bias_relu": ([Step("add"), Step("relu")], [(N,)], lambda p, b: np.where(p + b < 0, 0,
                                                                             p + b)),
}


@pytest.fixture(autouse=True, params=["matmul", "inner product"])
def product_form(request, monkeypatch) -> str:
    """Every test with a 2-D product made as oneDNN's matmul, and as its inner product (where
    the float32 matmul is gemm:jit: AVX2 hosts; matmul.py's _inner_product_pays), on any host."""
    monkeypatch.setattr(onednn_matmul, "_inner_product_pays",
                        lambda: request.param == "inner product")
    return request.param


def _prepare(steps, shapes, rows=M):
    specs = [TensorSpec((2, rows, K), "float32"), TensorSpec((N, K), "float32")] + \
        [TensorSpec((2, rows, N) if s == (2, M, N) else s, "float32") for s in shapes]
    chain = Chain("f", [Step("dense")] + steps)
    return chain.prepare(gr.cpu(), specs, chain.infer(specs), {})


def _matmul_of(kernel) -> OnednnMatmul:
    found = [fn for fn, _ in kernel._steps if isinstance(fn, OnednnMatmul)]
    assert len(kernel._steps) == 1 and found, kernel_note(kernel)
    return found[0]


@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("name", list(TAILS))
def test_tail_matches_float64(onednn, monkeypatch, threads, mode, name,  # noqa: F811
                              random_array) -> None:
    """Every tail is one oneDNN call (in row items on two workers, or on OpenMP threads),
    within the GEMM's bound against float64 (GELU adds its slope, at most 1.13, and a few
    ulps of its own)."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(THREADS_ENV, threads)
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setattr(onednn_matmul, "MIN_SPLIT_FLOPS", 0)
    steps, shapes, ref = TAILS[name]
    run = _prepare(steps, shapes)
    kernel = _matmul_of(run)
    assert kernel.pieces() == (1 if threads == "1" or mode == "openmp" else 2 * int(threads))
    x = random_array((2, M, K), "float32", seed=1)
    w = random_array((N, K), "float32", seed=2)
    extras = [random_array(s, "float32", seed=3 + i) for i, s in enumerate(shapes)]
    out = np.empty((2, M, N), np.float32)
    run(x, w, *extras, out)
    p = x.astype(np.float64) @ w.astype(np.float64).T
    want = ref(p, *[e.astype(np.float64) for e in extras])
    bound = 2 * (K + 1) * U32 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    bound = 1.2 * (bound + 4 * U32 * sum(np.abs(e) for e in extras)) + 8 * U32 * np.abs(want)
    assert np.all(np.abs(out - want) <= bound + 1e-6), np.max(np.abs(out - want) - bound)


def _rows_case(w, rows, shapes, ref, random_array):
    """Arrays for a batch of 2 x rows rows (x, its operands of those rows, out), the float64
    answer and the GEMM's bound around it."""
    x = random_array((2, rows, K), "float32", seed=rows)
    extras = [random_array((2, rows, N) if s == (2, M, N) else s, "float32",
                           seed=3 + i) for i, s in enumerate(shapes)]
    out = np.full((2, rows, N), np.nan, np.float32)
    p = x.astype(np.float64) @ w.astype(np.float64).T
    want = ref(p, *[e.astype(np.float64) for e in extras])
    bound = 2 * (K + 1) * U32 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    bound = 1.2 * (bound + 4 * U32 * sum(np.abs(e) for e in extras)) + \
        8 * U32 * np.abs(want)
    return (x, w, *extras, out), want, bound


@pytest.fixture(autouse=True)
def _pieces_of_512_rows(monkeypatch) -> None:
    """These tests' products cut in several pieces at a few hundred rows (a decoder's prompt
    is cut so from PIECE_ROWS on): the mechanism, at sizes quick to check."""
    monkeypatch.setattr(onednn_matmul, "PIECE_ROWS", 512)


def _check_rows(run, w, rows, shapes, ref, random_array) -> None:
    """run on a batch of 2 x rows rows (and its operands of those rows) is within the GEMM's
    bound against float64."""
    arrays, want, bound = _rows_case(w, rows, shapes, ref, random_array)
    run(*arrays)
    out = arrays[-1]
    assert np.all(np.abs(out - want) <= bound + 1e-6), (rows, np.max(np.abs(out - want)))


def test_which_products_take_any_rows(onednn, monkeypatch) -> None:  # noqa: F811
    """Over SMALL_DIM rows a symbolic module's dense runs in pieces of exact primitives, taking
    any such rows; at SMALL_DIM rows and under (a size class of one shape) a primitive for its
    rows; never transposed, never outside a symbolic module's new shape."""
    from graph_runtime.lib import tuning
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    rows = tuning.SMALL_DIM + 1
    with tuning.by_size_class():
        for many in (rows, 256, 2000):
            made = OnednnMatmul(1, many, 64, 32, False, True, 1, 1)
            assert made.any_shape() and made.in_pieces
        assert not OnednnMatmul(1, tuning.SMALL_DIM, 64, 32, False, True, 1, 1).any_shape()
        assert not OnednnMatmul(1, rows, 64, 32, True, True, 1, 1).any_shape()  # transposed
    assert not OnednnMatmul(1, rows, 64, 32, False, True, 1, 1).any_shape()


def _shared_sizes() -> set[int]:
    """The piece sizes whose primitives the denses share (the first item of each key)."""
    return {key[0] for key in onednn_matmul._shared_pieces.keys()}  # type: ignore[index]


def _sized_places(rows: int) -> list[tuple[int, int]]:
    """(size, place among the pieces of that size) of each of rows' pieces: their items' keys."""
    keys: list[tuple[int, int]] = []
    for r0, r1 in onednn_matmul.row_pieces(rows):
        keys.append((r1 - r0, sum(size == r1 - r0 for size, _ in keys)))
    return keys


def test_row_pieces_are_whole_pieces_then_the_rest() -> None:
    size = onednn_matmul.PIECE_ROWS
    assert onednn_matmul.row_pieces(180) == [(0, 180)]
    assert onednn_matmul.row_pieces(size) == [(0, size)]
    assert onednn_matmul.row_pieces(2 * size + 76) == [(0, size), (size, 2 * size),
                                                      (2 * size, 2 * size + 76)]
    assert onednn_matmul.row_pieces(7) == [(0, 7)]
    for rows in range(1, 1200):
        pieces = onednn_matmul.row_pieces(rows)
        assert pieces[0][0] == 0 and pieces[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        assert all(r1 - r0 == size for r0, r1 in pieces[:-1])


@pytest.mark.parametrize("name", list(TAILS))
def test_a_symbolic_modules_dense_runs_any_rows_in_pieces(onednn, monkeypatch,  # noqa: F811
                                                          name, random_array) -> None:
    """A symbolic module's dense and its tail run in pieces of exact primitives on one packed
    weight, every post-op fused in each piece: rows of any size class over SMALL_DIM (the
    kernel is prepared at 200), on primitives made once per piece size met, within the
    GEMM's bound."""
    from graph_runtime.lib import tuning
    from graph_runtime._lru import LruCache
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    # the pieces other tests' denses shared are not this one's to find
    monkeypatch.setattr(onednn_matmul, "_shared_pieces", LruCache(onednn_matmul.PIECES_SHARED))
    steps, shapes, ref = TAILS[name]
    with tuning.by_size_class():
        run = _prepare(steps, shapes, rows=100)
    kernel = _matmul_of(run)
    assert run.any_shape() and kernel.in_pieces
    w = random_array((N, K), "float32", seed=2)
    _check_rows(run, w, 100, shapes, ref, random_array)
    assert _shared_sizes() == {200}  # the prepared rows' piece
    made = []
    made_by = binding.Primitive.__init__
    monkeypatch.setattr(binding.Primitive, "__init__",
                        lambda self, *args: made.append(1) or made_by(self, *args))
    met = (100, 90, 9, 300, 71, 100, 128)  # 2 x: 200, 180, 18, 600, 142 and 256 rows
    for rows in met:
        _check_rows(run, w, rows, shapes, ref, random_array)
    # one primitive per piece size met: 180, 18, 512 and 88 (of 600), 142, 256
    assert len(made) == 6
    assert sorted(kernel._by_rows) == [18, 142, 180, 200, 256, 600]
    assert _shared_sizes() == {r1 - r0 for rows in met
                               for r0, r1 in onednn_matmul.row_pieces(2 * rows)}
    assert set(kernel._by_piece.keys()) == {key for rows in met if 2 * rows != 200
                                            for key in _sized_places(2 * rows)}


@pytest.mark.parametrize("name", ["bias", "bias_gelu", "bias_residual", "scale_then_row"])
def test_on_the_workers_a_symbolic_dense_runs_its_pieces_as_their_items(
        onednn, monkeypatch, name, random_array) -> None:  # noqa: F811
    """In the workers' mode (a neighbour holds a core) a symbolic module's split dense takes any
    rows too: its pieces, about two a worker in multiples of WORKER_STEP rows (SMALL_DIM for
    few), are the workers' items, each with its post-ops and its rows of the compiled tail; every row count is right
    and none prepares a kernel again."""
    from graph_runtime.lib import tuning
    from graph_runtime._lru import LruCache
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(THREADS_ENV, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    monkeypatch.setattr(onednn_matmul, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(onednn_matmul, "_shared_pieces", LruCache(onednn_matmul.PIECES_SHARED))
    steps, shapes, ref = TAILS[name]
    with tuning.by_size_class():
        run = _prepare(steps, shapes, rows=100)
    kernel = _matmul_of(run)
    assert run.any_shape() and kernel.in_pieces and kernel.workers == 2
    w = random_array((N, K), "float32", seed=2)
    for rows in (100, 9, 20, 150, 33, 100, 150):  # 2 x: 200, 18, 40, 300, 66 rows
        _check_rows(run, w, rows, shapes, ref, random_array)
    # each item of a call its own primitive (300 rows: four of 64): the workers run them side
    # by side, and a primitive's scratchpad is its own
    assert len({p.handle.value for p in kernel._current_rows}) == len(kernel._current_rows) > 1
    pieces = kernel._row_pieces(300)
    assert [r1 - r0 for r0, r1 in pieces] == [64, 64, 64, 64, 44]  # 75 a piece, in 64s
    assert [r1 - r0 for r0, r1 in kernel._row_pieces(1000)] == [256, 256, 256, 232]
    assert kernel._row_pieces(5000)[0] == (0, onednn_matmul.PIECE_ROWS)
    assert kernel._row_pieces(18) == [(0, 16), (16, 18)]


def test_denses_of_one_product_kind_share_each_piece_primitive(onednn, monkeypatch,  # noqa: F811
                                                              random_array) -> None:
    """Two denses of one product kind and tail (a decoder's layers) on different weights: a new
    row count makes each piece size's descriptor once for both; each makes its own primitive
    from it (a primitive's scratchpad is its own: one never runs on two threads at once) on
    its own memories and weight, and is right; a dense with another tail (other post-ops)
    makes its own descriptor."""
    from graph_runtime.lib import tuning
    from graph_runtime._lru import LruCache
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    monkeypatch.setattr(onednn_matmul, "_shared_pieces", LruCache(onednn_matmul.PIECES_SHARED))
    steps, shapes, ref = TAILS["bias_residual"]
    with tuning.by_size_class():
        runs = [_prepare(steps, shapes, rows=100) for _ in range(2)]
        other_steps, other_shapes, other_ref = TAILS["bias_relu"]
        other = _prepare(other_steps, other_shapes, rows=100)
    weights = [random_array((N, K), "float32", seed=seed) for seed in (2, 5)]
    made = []
    made_by = binding.PrimitiveDesc.__init__
    monkeypatch.setattr(binding.PrimitiveDesc, "__init__",
                        lambda self, *args: made.append(1) or made_by(self, *args))
    for rows in (90, 300, 90):  # 180 rows, then 512 + 88, then 180 again
        for run, w in zip(runs, weights):
            _check_rows(run, w, rows, shapes, ref, random_array)
    assert len(made) == 3  # 180, 512 and 88 rows: once each for both denses
    _check_rows(other, weights[0], 90, other_shapes, other_ref, random_array)
    assert len(made) == 4  # its post-ops differ: a descriptor of its own
    first, second = (_matmul_of(run)._by_rows[180][0] for run in runs)
    assert first[0].pd is second[0].pd
    assert first[0].handle.value != second[0].handle.value  # primitives of their own
    assert first[1][0][0] is not second[1][0][0]  # and memories


def test_denses_sharing_piece_descriptors_run_side_by_side_on_threads(
        onednn, monkeypatch, random_array) -> None:  # noqa: F811
    """Two denses of one kind (clones of a module) run on two threads at once, each through
    its pieces: they share the pieces' descriptors, never a primitive (whose scratchpad is its
    own: one primitive run by both threads at k = 1376 gave wrong rows), and every answer is right."""
    import threading
    from graph_runtime.lib import tuning
    from graph_runtime._lru import LruCache
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(THREADS_ENV, "1")
    monkeypatch.setattr(onednn_matmul, "_shared_pieces", LruCache(onednn_matmul.PIECES_SHARED))
    n, k = 512, 1376
    with tuning.by_size_class():
        kernels = [OnednnMatmul(1, 100, n, k, False, True, 1, 1, split=False) for _ in range(2)]
    assert all(kernel.in_pieces for kernel in kernels)
    w = random_array((n, k), "float32", seed=2)
    wrong: list[int] = []

    def work(kernel, cases) -> None:
        for _ in range(25):
            for x, out, want in cases:
                out.fill(np.nan)
                kernel(x, w, out)
                if not np.allclose(out, want, rtol=1e-4, atol=1e-3):
                    wrong.append(x.shape[0])

    def cases(seed: int) -> list:
        made = []
        for rows in (90, 300, 1100):
            x = random_array((rows, k), "float32", seed=seed + rows)
            made.append((x, np.empty((rows, n), np.float32),
                         (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)))
        return made

    threads = [threading.Thread(target=work, args=(kernel, cases(i)))
               for i, kernel in enumerate(kernels)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert wrong == []


def test_pieces_shared_by_row_counts_follow_each_calls_arrays(onednn, monkeypatch,  # noqa: F811
                                                               random_array) -> None:
    """Two row counts whose first piece is one item (600 and 700 rows: PIECE_ROWS first),
    called in turn on arrays each keeps: every call binds the shared piece to its own arrays
    (no piece writes the other's out)."""
    from graph_runtime.lib import tuning
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    steps, shapes, ref = TAILS["bias_residual"]
    with tuning.by_size_class():
        run = _prepare(steps, shapes, rows=100)
    w = random_array((N, K), "float32", seed=2)
    cases = [_rows_case(w, rows, shapes, ref, random_array) for rows in (300, 350)]
    for arrays, want, bound in cases * 3:
        arrays[-1].fill(np.nan)
        run(*arrays)
        assert np.all(np.abs(arrays[-1] - want) <= bound + 1e-6)
    kernel = _matmul_of(run)
    assert onednn_matmul.PIECE_ROWS == 512
    assert kernel._by_rows[600][0][0] is kernel._by_rows[700][0][0]


@pytest.mark.parametrize("name", ["bias_gelu", "bias_relu", "bias_residual"])
def test_nan_and_inf_as_numpy(onednn, monkeypatch, name) -> None:  # noqa: F811
    """NaN and inf in the product or the operands come out as the NumPy path gives them:
    gelu(+inf) = inf (oneDNN's gelu_erf post-op gave NaN), relu(NaN) = NaN (its relu gave 0)."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    steps, shapes, _ = TAILS[name]
    x = np.zeros((2, M, K), np.float32)
    x[0, 0, 0] = np.nan
    w = np.eye(N, K, dtype=np.float32)
    b = np.zeros(N, np.float32)
    b[1:6] = [np.inf, -np.inf, np.nan, -0.0, 3e38]
    extras = [b] + [np.ones(s, np.float32) for s in shapes[1:]]
    got = np.empty((2, M, N), np.float32)
    _prepare(steps, shapes)(x, w, *extras, got)
    monkeypatch.setenv(binding.ONEDNN_ENV, "off")
    want = np.empty((2, M, N), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        _prepare(steps, shapes)(x, w, *extras, want)
    np.testing.assert_array_equal(got, want)


def test_profile_names_post_ops_and_compiled_rest(onednn, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    note = kernel_note(_prepare(*TAILS["bias_gelu"][:2]))
    assert "post-ops add" in note and "compiled tail gelu" in note, note


def test_column_operand_stays_compiled(onednn, monkeypatch, random_array) -> None:  # noqa: F811
    """An operand broadcast down the columns ((m, 1)) is no oneDNN row or whole operand: the
    whole tail runs compiled after the product, still right."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    run = _prepare([Step("add"), Step("add")], [(2, M, 1), (N,)])
    kernel = _matmul_of(run)
    assert kernel.tail.steps == 0 and kernel.after is not None
    x = random_array((2, M, K), "float32", seed=1)
    w = random_array((N, K), "float32", seed=2)
    c = random_array((2, M, 1), "float32", seed=3)
    b = random_array((N,), "float32", seed=4)
    out = np.empty((2, M, N), np.float32)
    run(x, w, c, b, out)
    want = x.astype(np.float64) @ w.astype(np.float64).T + c + b
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_steps_whose_values_are_read_later_stay_compiled() -> None:
    """oneDNN never writes the product or a value between post-ops: a later step reading one
    keeps the steps from there compiled (refs as chain._tail_operands gives them)."""
    from graph_runtime.lib.kernels.onednn.matmul_tail import matmul_tail
    specs = [TensorSpec((M, N), "float32"), TensorSpec((N,), "float32"),
             TensorSpec((M, N), "float32")]
    ops = ["add", "add", "multiply"]
    taken = matmul_tail(ops, [[("input", 0), ("input", 1)], [("step", 0), ("input", 2)],
                              [("step", 1), ("input", 2)]], specs, 0, M, N)
    assert taken.steps == 3 and taken.bias == 0 and len(taken.post_ops) == 2
    reads_product = [[("input", 0), ("input", 1)], [("step", 0), ("input", 2)],
                     [("step", 1), ("input", 0)]]
    assert matmul_tail(ops, reads_product, specs, 0, M, N).steps == 0
    reads_between = [[("input", 0), ("input", 1)], [("step", 0), ("input", 2)],
                     [("step", 1), ("step", 0)]]
    taken = matmul_tail(ops, reads_between, specs, 0, M, N)
    assert taken.steps == 1 and taken.post_ops == () and taken.bias == 0


def test_one_choice_per_shape_in_a_build(onednn, monkeypatch) -> None:  # noqa: F811
    """Inside one build (settings.held) the kernels of products of the same sizes (a decoder's
    layers) ask the tuning choice once for a new shape's arrays; their answers are the
    unkept ones, and outside a symbolic module's new shape no kernel serves another shape."""
    from graph_runtime import settings
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.cpu import dense_choice
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    shapes = ((100, 32), (64, 32), (100, 64))
    spec = dense_choice.DenseSpec(1, 100, 64, 32, False, True, 1, 1, "float32", shapes,
                                  lambda: np.matmul)
    with tuning.by_size_class():
        layers = [dense_choice.dense_cpu(spec) for _ in range(4)]
    assert all(isinstance(k, OnednnMatmul) and k.any_shape() for k in layers)
    asked = []
    choose = dense_choice.choose
    monkeypatch.setattr(dense_choice, "choose", lambda s: asked.append(s.m) or choose(s))
    other = ((300, 32), (64, 32), (300, 64))
    with tuning.by_size_class():
        want = [k.serves(other) for k in layers]
        assert asked == [300] * 4  # unkept: each kernel asks
        asked.clear()
        with settings.held():
            assert [k.serves(other) for k in layers] == want
            assert [k.serves(shapes) for k in layers] == [True] * 4
        assert asked == [300, 100]
    assert not any(k.serves(other) for k in layers)


@pytest.mark.parametrize("trans_b", [True, False])
def test_a_2d_product_takes_its_weight_either_way(onednn, monkeypatch, product_form,  # noqa: F811
                                                  trans_b, random_array) -> None:
    """A 2-D product's weight given as dense's (n, k) or as matmul's (k, n): the same sums in
    either form of primitive (an inner product reads (n, k), a matmul (k, n)), packed or not."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    kernel = OnednnMatmul(1, M, N, K, False, trans_b, 1, 1)
    x = random_array((M, K), "float32", seed=1)
    w = random_array((N, K) if trans_b else (K, N), "float32", seed=2)
    out = np.empty((M, N), np.float32)
    kernel(x, w, out)
    assert kernel.inner == (product_form == "inner product")
    want = x.astype(np.float64) @ (w.T if trans_b else w).astype(np.float64)
    bound = K * U32 * (np.abs(x).astype(np.float64) @ np.abs(w.T if trans_b else w))
    assert np.all(np.abs(out - want) <= 2 * bound + 1e-30)

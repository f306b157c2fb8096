"""Dense products of few rows on oneDNN's OpenMP team (lib/kernels/cpu/team_gemv.py).

The kernel against float64 NumPy (row counts, widths that leave a partial cache line, a strided
input, NaN and infinities), its compiled tail through a chain, and where dense's candidate set
offers it and takes it as its base.
"""
from __future__ import annotations

import numpy as np
import pytest
from support import dense_spec, layout_races, make_graph, null, require_onednn, tvm_op

import graph_runtime as gr
from graph_runtime.lib import Module
from graph_runtime.lib.library import InputVersion
from graph_runtime.lib.chain import Chain, Step, kernel_note
from graph_runtime.lib.kernels.cpu import dense_choice
from graph_runtime.lib import tuning
from graph_runtime.lib.kernels.cpu import team_gemv
from graph_runtime.lib.kernels.cpu.team_gemv import LAYOUTS, MAX_ROWS, TeamGemv
from graph_runtime.settings import (NUM_THREADS, ONEDNN_THREADS, TEAM_GEMV, TEAM_GEMV_LAYOUT,
                                    TUNING_CACHE)

U32 = float(np.finfo(np.float32).eps) / 2


@pytest.fixture
def team(monkeypatch):
    """Two OpenMP threads inside oneDNN's primitives: the team the kernel runs on; a kept
    weight read packed (the layout this machine measures is its own test's)."""
    require_onednn()
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    monkeypatch.setenv(TEAM_GEMV_LAYOUT.name, "packed")


def _check(out: np.ndarray, x: np.ndarray, w: np.ndarray, extra: np.ndarray | None = None
           ) -> None:
    """out within float32's rounding of sums of k products (any order) of float64's answer."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64.T
    bound = np.abs(x64) @ np.abs(w64).T
    if extra is not None:
        want = want + extra
        bound = bound + np.abs(extra)
    tolerance = (x.shape[1] + 2) * U32 * bound + 1e-30
    np.testing.assert_array_less(np.abs(out.astype(np.float64) - want), tolerance)


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 512, 512), (1, 40, 5), (3, 130, 64), (MAX_ROWS, 1000, 300),
                                   (1, 10, 8192), (2, 1, 33), (MAX_ROWS, 17, 100)])
def test_the_product_matches_float64(team, m, n, k, cached, random_array) -> None:
    """Rows taken from the counter, or each thread its fixed share (a module whose weights
    stay in the cache: weights_cached)."""
    x = random_array((m, k), "float32", seed=1)
    w = random_array((n, k), "float32", seed=2)
    with team_gemv.weights_cached(cached):
        kernel = TeamGemv(m, n, k)
    assert kernel.cached is cached and kernel.with_tile_tail(None).cached is cached
    out = np.empty((m, n), np.float32)
    for _ in range(2):  # the second call over the same arrays: nothing left from the first
        out[...] = np.nan
        kernel(x, w, out)
        _check(out, x, w)


def test_calls_on_the_same_arrays_read_their_values_now(team, random_array) -> None:
    """The kernel keeps a block of addresses for the arrays it was called on (a module passes
    the same ones every run): new values in them are read, and new arrays are bound."""
    x = random_array((1, 96), "float32", seed=5)
    w = random_array((64, 96), "float32", seed=6)
    kernel = TeamGemv(1, 64, 96)
    out = np.empty((1, 64), np.float32)
    kernel(x, w, out)
    _check(out, x, w)
    x[...] = random_array((1, 96), "float32", seed=7)
    w[:3] = 0.0
    kernel(x, w, out)
    _check(out, x, w)
    other = np.empty((1, 64), np.float32)
    x2 = random_array((1, 96), "float32", seed=8)
    kernel(x2, w, other)
    _check(other, x2, w)
    kernel(x2[:, ::-1], w, other)  # a strided input: copied for that call, then bound again
    _check(other, np.ascontiguousarray(x2[:, ::-1]), w)
    kernel(x2, w, other)
    _check(other, x2, w)


def test_the_blocks_kept_keep_no_array_alive(team, random_array) -> None:
    """A kept block holds addresses and weak references only: the arrays of a module dropped
    go with it, and arrays made later at their ids are bound afresh."""
    import gc
    import weakref
    kernel = TeamGemv(1, 48, 32)
    w = random_array((48, 32), "float32", seed=9)
    for seed in range(3):
        x = random_array((1, 32), "float32", seed=10 + seed)
        out = np.empty((1, 48), np.float32)
        kernel(x, w, out)
        _check(out, x, w)
        gone = weakref.ref(out)
        del x, out
        gc.collect()
        assert gone() is None


def test_a_strided_input_and_a_3d_output(team, random_array) -> None:
    """x a column slice of a wider array (copied to be read by address); out (1, 1, n)."""
    wide = random_array((1, 300), "float32", seed=3)
    w = random_array((70, 150), "float32", seed=4)
    out = np.full((1, 1, 70), np.nan, np.float32)
    TeamGemv(1, 70, 150)(wide[:, ::2], w, out)
    _check(out.reshape(1, 70), np.ascontiguousarray(wide[:, ::2]), w)


def test_nan_and_infinities_come_through(team) -> None:
    """A NaN in x reaches every output; an infinity meeting a zero weight gives NaN, as
    OpenBLAS's product does."""
    x = np.ones((1, 64), np.float32)
    w = np.ones((48, 64), np.float32)
    w[5] = 0.0
    x[0, 3] = np.inf
    out = np.empty((1, 48), np.float32)
    TeamGemv(1, 48, 64)(x, w, out)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, x @ w.T)
    assert np.isnan(out[0, 5]) and np.isinf(out[0, 4])
    x[0, 3] = np.nan
    TeamGemv(1, 48, 64)(x, w, out)
    assert np.isnan(out).all()


def test_a_dense_add_chain_runs_its_tail_after_the_product(team, monkeypatch, random_array) -> None:
    """dense -> add (a decoder's residual): one TeamGemv applying the add, equal to float64
    (chosen so: a race may give so small a product to OpenBLAS's call)."""
    monkeypatch.setattr(dense_choice, "choose", lambda spec: "team")
    chain = Chain("f", [Step("dense"), Step("add")])
    specs = [gr.lib.TensorSpec((1, 256), "float32"), gr.lib.TensorSpec((96, 256), "float32"),
             gr.lib.TensorSpec((1, 96), "float32")]
    kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
    assert kernel_note(kernel) == "dense of few rows on the OpenMP team, compiled tail add"
    x, w, r = (random_array(s.shape, "float32", seed=k) for k, s in enumerate(specs))
    out = np.full((1, 96), np.nan, np.float32)
    kernel(x, w, r, out)
    _check(out, x, w, r.astype(np.float64))


def test_a_graph_of_one_row_runs_on_the_team(team, monkeypatch, random_array) -> None:
    """A batch-1 dense graph (the team chosen): its product is the team's, the answer right."""
    monkeypatch.setattr(dense_choice, "choose", lambda spec: "team")
    lib = Module("teamlib")
    lib.register("fused_dense", Chain("fused_dense", [Step("dense")]))
    nodes = [null("data"), null("weight"), tvm_op("fc", "fused_dense", [0, 1])]
    graph = make_graph(nodes, [2], shapes=[[1, 384], [200, 384], [1, 200]])
    module = gr.create(graph, lib, gr.cpu())
    x = random_array((1, 384), "float32", seed=5)
    w = random_array((200, 384), "float32", seed=6)
    module.load_params({"weight": w})
    module.run(data=x)
    assert isinstance(module.executor.steps[0].kernel, TeamGemv)
    _check(module.get_output(0).numpy(), x, w)


def test_where_dense_offers_it(team, monkeypatch) -> None:
    """Offered for float32 products of 1..MAX_ROWS rows against a weight while oneDNN runs on
    the OpenMP team, and kept as the base there; not beside the runtime's workers, with oneDNN
    off, for float64, for more rows or with its setting off; a narrow weight too."""
    assert "team" in dense_choice.offered(dense_spec(1, 512, 512))
    assert dense_choice.base(dense_spec(1, 512, 512),
                             dense_choice.offered(dense_spec(1, 512, 512))) == "team"
    assert "team" in dense_choice.offered(dense_spec(MAX_ROWS, 512, 512))
    assert "team" not in dense_choice.offered(dense_spec(MAX_ROWS + 1, 512, 512))
    assert "team" not in dense_choice.offered(dense_spec(1, 512, 512, "float64"))
    assert "team" in dense_choice.offered(dense_spec(1, 10, 8192))  # a classifier's last
    monkeypatch.setenv(TEAM_GEMV.name, "off")
    assert "team" not in dense_choice.offered(dense_spec(1, 512, 512))
    monkeypatch.setenv(TEAM_GEMV.name, "on")  # OpenBLAS's side's only one, raced with oneDNN
    assert dense_choice.offered(dense_spec(1, 512, 512)) == ["team", "onednn"]
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")
    assert "team" not in dense_choice.offered(dense_spec(1, 512, 512))
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "auto")
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    assert "team" not in dense_choice.offered(dense_spec(1, 512, 512))


@pytest.mark.parametrize("m,n,k", [(1, 512, 512), (1, 40, 5), (3, 130, 70), (MAX_ROWS, 1000, 300),
                                   (1, 10, 8192), (3, 5, 20)])
def test_a_weight_kept_between_runs_is_read_packed(team, m, n, k, random_array) -> None:
    """With its write counter bound (a param), the weight is read packed, eight rows
    interleaved and zero padded past n and k (widths that leave partial blocks here), and
    packed again when the counter moves."""
    x = random_array((m, k), "float32", seed=11)
    w = random_array((n, k), "float32", seed=12)
    kernel = TeamGemv(m, n, k)
    version = InputVersion()
    kernel.bind_versions({1: version})
    out = np.full((m, n), np.nan, np.float32)
    kernel(x, w, out)
    assert kernel.packed is not None and kernel.packed.shape == (-(-n // 8), -(-k // 16), 128)
    _check(out, x, w)
    w[: n // 2] = random_array((n // 2, k), "float32", seed=13)
    version.value += 1  # as set_input / load_params count a write
    kernel(x, w, out)
    _check(out, x, w)
    assert kernel.workspace_bytes() == kernel.packed.nbytes


def test_a_volatile_weight_is_read_as_given(team, random_array) -> None:
    """A weight that may change without a count (computed by a node) is never packed."""
    x = random_array((1, 64), "float32", seed=14)
    w = random_array((48, 64), "float32", seed=15)
    kernel = TeamGemv(1, 48, 64)
    kernel.bind_versions({1: InputVersion(volatile=True)})
    out = np.empty((1, 48), np.float32)
    kernel(x, w, out)
    w[...] = 1.0
    kernel(x, w, out)
    assert kernel.packed is None
    _check(out, x, w)


def test_a_frozen_weight_is_packed_once_for_every_kernel(team, random_array) -> None:
    """A frozen param (a symbolic module's) is packed by the first kernel reading it; the
    kernels of its other shapes read that same copy."""
    from graph_runtime.lib.kernels.derived import freeze
    w = random_array((96, 128), "float32", seed=16)
    freeze(w)
    kernels = [TeamGemv(m, 96, 128) for m in (1, 2)]
    for kernel in kernels:
        kernel.bind_versions({1: InputVersion()})
        x = random_array((kernel.shapes[0][0], 128), "float32", seed=17)
        out = np.empty(kernel.shapes[2], np.float32)
        kernel(x, w, out)
        _check(out, x, w)
    assert kernels[0].packed is kernels[1].packed


@pytest.mark.parametrize("n,k", [(512, 512), (100, 40), (2000, 70), (10, 300), (3, 20)])
def test_a_frozen_weight_a_onednn_matmul_reordered_is_read_in_its_layout(team, n, k,
                                                                          random_array) -> None:
    """A prompt's product (oneDNN's matmul) reorders a frozen weight into its blocked layout;
    the few-row products after it read that copy ("BA16a64b" where oneDNN picks it: partial
    blocks of 64 columns and of 16 values of k here) instead of packing a second one, and
    within float32's rounding of float64's answer, the copy counted once; where oneDNN picks
    another layout, the weight is packed as before."""
    from graph_runtime.lib.kernels.derived import freeze
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    w = random_array((n, k), "float32", seed=21)
    freeze(w)
    prompt = OnednnMatmul(1, 32, n, k, False, True, 1, 1, split=False)
    prompt.bind_versions({1: InputVersion()})
    x = random_array((32, k), "float32", seed=22)
    out = np.empty((32, n), np.float32)
    prompt(x, w, out)
    _check(out, x, w)
    layout = prompt.weight.memory.desc.blocking()
    onednn_blocked = layout is not None and layout.blocks == ((0, 16), (1, 64))
    first = None
    for m in (1, 3, MAX_ROWS):
        kernel = TeamGemv(m, n, k)
        kernel.bind_versions({1: InputVersion()})
        x = random_array((m, k), "float32", seed=23 + m)
        out = np.full((m, n), np.nan, np.float32)
        kernel(x, w, out)
        _check(out, x, w)
        assert kernel._blocked is onednn_blocked
        first = first or kernel
        if not onednn_blocked:  # packed as before: by the first kernel, the others read it
            assert first._own is not None and kernel.packed is first._own
            assert (kernel._own is None) is (kernel is not first)
            continue
        assert kernel._own is None  # no copy of its own made
        assert kernel.packed.base is prompt.weight.buffer.base or \
            np.shares_memory(kernel.packed, prompt.weight.buffer)
        # one copy, counted once by a memory report: both name it, at the same bytes
        assert kernel.workspace_owner() is prompt.workspace_owner() is prompt.weight.buffer
        assert kernel.workspace_bytes() == prompt.workspace_bytes() > 0


def test_a_frozen_weights_onednn_copy_is_counted_once_by_every_kernel_reading_it(
        team, monkeypatch, random_array) -> None:
    """dense -> add chains of two row counts (a symbolic module's size classes) on oneDNN's
    product, and a few-row product after them, read one copy of a frozen weight: a memory
    report (SharedBytes over each kernel's workspace_items) counts it once."""
    require_onednn()
    from graph_runtime.lib.kernels.derived import freeze
    from graph_runtime.runtime.measure import SharedBytes
    monkeypatch.setattr(dense_choice, "choose", lambda spec: "onednn")
    w = random_array((512, 256), "float32", seed=31)
    freeze(w)
    chain = Chain("f", [Step("dense"), Step("add")])
    held, kernels = SharedBytes(), []
    for m in (32, 64):
        specs = [gr.lib.TensorSpec((m, 256), "float32"), gr.lib.TensorSpec((512, 256), "float32"),
                 gr.lib.TensorSpec((m, 512), "float32")]
        kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
        kernel.bind_versions({1: InputVersion()})
        x, r = random_array((m, 256), "float32", seed=m), random_array((m, 512), "float32")
        out = np.full((m, 512), np.nan, np.float32)
        kernel(x, w, r, out)
        _check(out, x, w, r.astype(np.float64))
        kernels.append(kernel)
    decode = TeamGemv(1, 512, 256)
    decode.bind_versions({1: InputVersion()})
    decode(random_array((1, 256), "float32", seed=32), w, np.empty((1, 512), np.float32))
    kernels.append(decode)
    for index, kernel in enumerate(kernels):
        held.add(index, [(owner, {gr.cpu(): nbytes})
                         for owner, nbytes in kernel.workspace_items()])
    copies = {id(owner) for kernel in kernels[:2] for owner, _ in kernel.workspace_items()}
    assert len(copies) == 1  # both chains' products name the one copy
    copy_bytes = kernels[0].workspace_items()[0][1]
    assert copy_bytes >= 512 * 256 * 4
    assert held.total == copy_bytes + (0 if decode._blocked else decode.workspace_bytes())


def test_where_the_machine_reads_weights_as_given_a_kept_weight_is_never_packed(
        team, monkeypatch, random_array) -> None:
    """GRAPH_RUNTIME_TEAM_GEMV_LAYOUT=given (what the race picks where packing does not pay): a
    weight whose counter is bound is read as it is, values written later included; no
    packed copy is made or counted."""
    monkeypatch.setenv(TEAM_GEMV_LAYOUT.name, "given")
    x = random_array((3, 64), "float32", seed=18)
    w = random_array((130, 64), "float32", seed=19)
    kernel = TeamGemv(3, 130, 64)
    version = InputVersion()
    kernel.bind_versions({1: version})
    out = np.full((3, 130), np.nan, np.float32)
    kernel(x, w, out)
    _check(out, x, w)
    w[:40] = random_array((40, 64), "float32", seed=20)
    version.value += 1
    kernel(x, w, out)
    _check(out, x, w)
    assert kernel.packed is None and kernel.workspace_bytes() == 0
    assert kernel.note() == "dense of few rows on the OpenMP team, weight read as given"
    assert kernel.with_tile_tail(None).packs is False


def test_the_layout_is_raced_once_per_machine_and_never_inside_a_shapes_run(
        team, monkeypatch, tmp_path) -> None:
    """auto: the first ask races both layouts on a chain of decode-size products (each sample
    after a pause) and stores the answer in the tuning file; later asks take it. Inside a
    symbolic module's run() (tuning.by_size_class) nothing is raced: this process's answer,
    else the file's trusted one, else packed."""
    monkeypatch.setenv(TEAM_GEMV_LAYOUT.name, "auto")
    monkeypatch.setenv(TUNING_CACHE.name, str(tmp_path))
    tuning.forget()
    raced = layout_races(monkeypatch)
    try:
        first = team_gemv.packs()
        assert team_gemv.packs() == first and len(raced) == 1
        (entry,) = [e for e in tuning.entries() if e.choice == "cpu.team_gemv_layout"]
        assert set(entry.seconds) == set(LAYOUTS) and min(entry.seconds.values()) > 0
        assert entry.base == "packed" and first == (entry.chosen == "packed") == (
            raced[0] == "packed")
        assert TeamGemv(1, 64, 64).packs is first
        tuning.forget()  # as a new process: inside a shape's run nothing is raced
        with tuning.by_size_class():
            inside = team_gemv.packs()
        assert len(raced) == 1
        assert inside == (first if entry.trusted else True)
    finally:
        tuning.forget()


def test_a_module_whose_storage_fits_in_the_cache_reads_its_weights_as_given(
        team, monkeypatch, random_array) -> None:
    """Layout auto: a graph whose storage (its weight, data and output) takes at most half the
    last-level cache keeps it there between runs, so its products read the weight as given (no
    packed copy made or counted); one that does not fit takes the machine's layout, and a
    forced layout holds either way."""
    monkeypatch.setattr(dense_choice, "choose", lambda spec: "team")
    monkeypatch.setenv(TEAM_GEMV_LAYOUT.name, "auto")
    monkeypatch.setattr(team_gemv, "packs", lambda: True)  # the machine's answer, not raced
    lib = Module("teamlib")
    lib.register("fused_dense", Chain("fused_dense", [Step("dense")]))
    nodes = [null("data"), null("weight"), tvm_op("fc", "fused_dense", [0, 1])]
    graph = make_graph(nodes, [2], shapes=[[1, 384], [200, 384], [1, 200]])
    x = random_array((1, 384), "float32", seed=21)
    w = random_array((200, 384), "float32", seed=22)

    def kernel_of(module: gr.GraphModule) -> TeamGemv:
        module.load_params({"weight": w})
        module.run(data=x)
        _check(module.get_output(0).numpy(), x, w)
        kernel = module.executor.steps[0].kernel
        assert isinstance(kernel, TeamGemv)
        return kernel

    monkeypatch.setattr(team_gemv, "last_level_cache_bytes", lambda: 1 << 20)
    cached = kernel_of(gr.create(graph, lib, gr.cpu()))
    assert cached.packs is False and cached.packed is None and cached.workspace_bytes() == 0
    monkeypatch.setattr(team_gemv, "last_level_cache_bytes", lambda: 600_000)  # 309 KB of storage
    assert kernel_of(gr.create(graph, lib, gr.cpu())).packs is True
    monkeypatch.setattr(team_gemv, "last_level_cache_bytes", lambda: 0)  # unknown: never held
    assert kernel_of(gr.create(graph, lib, gr.cpu())).packs is True
    monkeypatch.setattr(team_gemv, "last_level_cache_bytes", lambda: 1 << 30)
    monkeypatch.setenv(TEAM_GEMV_LAYOUT.name, "packed")
    assert kernel_of(gr.create(graph, lib, gr.cpu())).packs is True


def test_the_last_level_cache_is_read_from_sysfs(tmp_path) -> None:
    """The highest level's size, with its unit; 0 where no index can be read."""
    for index, (level, size) in enumerate([("1", "48K"), ("2", "1024K"), ("3", "32768K"),
                                           ("bad", "1K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(level + "\n")
        (folder / "size").write_text(size + "\n")
    assert team_gemv.last_level_cache_bytes(str(tmp_path)) == 32 << 20
    assert team_gemv.last_level_cache_bytes(str(tmp_path / "none")) == 0
    assert team_gemv.cache_holds(1) is (team_gemv.last_level_cache_bytes() > 1)


@pytest.mark.parametrize("m,n,chw", [(1, 10, (32, 16, 16)), (3, 40, (5, 3, 4))])
def test_a_product_reads_nhwc_features_through_a_permuted_weight(team, m, n, chw,
                                                                 random_array) -> None:
    """The product after a flatten of NHWC bytes (runtime/flatten_reads.py) reads them on a
    copy of its weight with K in H, W, C order: equal to the plain product on the NCHW
    flatten, permuted (and packed) again when the weight is written, and every call when the
    weight may change without a count; other positions and shapes are not taken."""
    c, h, w = chw
    k = c * h * w
    plain = TeamGemv(m, n, k)
    variant = plain.reading_nhwc(0, (m, c, h, w))
    assert variant is not None and plain.reading_nhwc(1, (m, c, h, w)) is None
    assert plain.reading_nhwc(0, (m, c, h, w + 1)) is None
    version = InputVersion()
    variant.bind_versions({1: version})
    x = random_array((m, c, h, w), "float32", seed=31)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(m, k)
    weight = random_array((n, k), "float32", seed=32)
    for written in range(3):
        if written == 1:
            weight[:] = random_array((n, k), "float32", seed=33)
            version.count()
        if written == 2:
            version.set_volatile(True)
            weight[:] = random_array((n, k), "float32", seed=34)  # no count
        out = np.full((m, n), np.nan, np.float32)
        variant(nhwc, weight, out)
        _check(out, x.reshape(m, k), weight)
    assert "reading NHWC features" in variant.note()

"""numba's disk cache keys for the CPU kernels folder (lib/kernels/cpu/jit_cache.py)."""
from __future__ import annotations

from graph_runtime.lib.kernels.cpu import jit_cache, vector_width
from graph_runtime.lib.kernels.cpu.attention import _scale_mask_softmax
from graph_runtime.lib.kernels.cpu.rows_jit import _layer_norm_rows


def test_cached_functions_here_are_keyed_by_the_folders_sources() -> None:
    """attention inlines rows_jit's softmax (and fast_math's exp): its cache stamp holds the
    digest of every numba source of the folder, so an edit to a helper recompiles it, and the
    vector width the process compiles with (vector_width.py)."""
    for fn in (_scale_mask_softmax, _layer_norm_rows):
        locator = fn._cache._impl._locator
        assert type(locator).__name__.startswith("FolderStamped")
        own, digest, wide = locator.get_source_stamp()
        assert digest == jit_cache.sources_digest() and own
        assert wide is vector_width.stamp()


def test_digest_follows_the_sources(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.py").write_text("import numba\n")
    (tmp_path / "b.py").write_text("x = 1\n")  # no numba: not part of the key
    monkeypatch.setattr(jit_cache, "FOLDER", str(tmp_path))
    jit_cache.sources_digest.cache_clear()
    try:
        first = jit_cache.sources_digest()
        (tmp_path / "b.py").write_text("x = 2\n")
        jit_cache.sources_digest.cache_clear()
        assert jit_cache.sources_digest() == first
        (tmp_path / "a.py").write_text("import numba  # edited\n")
        jit_cache.sources_digest.cache_clear()
        assert jit_cache.sources_digest() != first
    finally:
        jit_cache.sources_digest.cache_clear()


def test_install_is_idempotent() -> None:
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    before = list(impl._locator_classes)
    jit_cache.install()
    assert impl._locator_classes == before

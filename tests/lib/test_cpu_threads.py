"""Work-stealing loops of CPU kernels (lib/kernels/cpu_threads.py)."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib.kernels import threads as cpu_threads
from graph_runtime.settings import NUM_THREADS, ONEDNN


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_item_once(workers: int) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def work(worker: int, i: int) -> None:
        assert 0 <= worker < workers
        with lock:
            seen.append(i)
    cpu_threads.parallel_images(17, workers, work)
    assert sorted(seen) == list(range(17))


def test_a_worker_error_reaches_the_caller() -> None:
    def work(worker: int, i: int) -> None:
        if i == 5:
            raise ValueError("item 5 failed")
    with pytest.raises(ValueError, match="item 5 failed"):
        cpu_threads.parallel_images(9, 2, work)


def test_blas_gets_its_threads_back() -> None:
    """The hold is process-wide in NumPy's OpenBLAS: after loops it must be what it was."""
    setter = cpu_threads._blas_setter()
    if setter is None:
        pytest.skip("NumPy's OpenBLAS has no openblas_set_num_threads_local")
    before = setter(3)
    b = np.ones((64, 64), np.float32)

    def work(worker: int, i: int) -> None:
        b @ b
    for workers in (1, 2):
        cpu_threads.parallel_images(8, workers, work)
    assert setter(before) == 3


def test_threads_env(monkeypatch) -> None:
    monkeypatch.setenv(NUM_THREADS.name, "3")
    assert cpu_threads.num_threads() == 3
    monkeypatch.setenv(NUM_THREADS.name, "zero")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_NUM_THREADS must be a positive"):
        cpu_threads.num_threads()


@pytest.mark.parametrize("example,holds", [("cnn", True), ("mlp", False)])
def test_graphs_with_worker_kernels_hold_blas_at_one_thread(example: str, holds: bool,
                                                            monkeypatch) -> None:
    """A conv graph runs with OpenBLAS at one thread (its workers own the cores) and gives
    the count back after run(); a dense-only graph on OpenBLAS leaves it its threads (oneDNN
    off: a dense on oneDNN uses the workers)."""
    monkeypatch.setenv(ONEDNN.name, "off")
    setter = cpu_threads._blas_setter()
    if setter is None:
        pytest.skip("NumPy's OpenBLAS has no openblas_set_num_threads_local")
    folder = Path(__file__).resolve().parents[2] / "examples" / "graphs" / example
    m = gr.create(folder / "graph.json", folder / "lib.json", gr.cpu())
    m.load_params(folder / "params")
    with np.load(folder / "inputs.npz") as inputs:
        m.set_input(**{k: inputs[k] for k in inputs.files})
    seen: list[int] = []
    step = m.executor.steps[-1]
    inner = step.fn

    def spy(*args: object) -> None:
        seen.append(int(setter(1)))  # what the run set, put back at once
        setter(seen[-1])
        inner(*args)
    m.executor._calls[-1] = (spy, step.args)
    assert (m.executor._blas_scope is cpu_threads.ONE_BLAS_THREAD) is holds
    before = setter(2)
    m.run()
    assert seen == [1 if holds else 2]
    assert setter(before) == 2

"""runtime/layouts.py: which entries stay NHWC between kernels that take it, on small graphs.

The kernels here are NumPy's multiply (it reads any strides), declaring which positions may be
NHWC; the oneDNN kernels themselves are tested in tests/lib/test_onednn.py.
"""
from __future__ import annotations

from typing import Any, Collection

import numpy as np
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.lib import Module
from graph_runtime.lib.kernels.onednn.layout import is_nhwc
from graph_runtime.lib.prepared import PreparedKernel

SHAPE = [2, 3, 4, 5]


class Twice(PreparedKernel):
    """out = 2 * x in either layout; remembers what it was told and what it was handed."""

    def __init__(self, positions: tuple[int, ...]) -> None:
        self.positions = positions
        self.told: set[int] = set()
        self.seen: list[tuple[bool, bool]] = []

    def __call__(self, x: Any, out: Any) -> None:
        self.seen.append((is_nhwc(x) and not x.flags.c_contiguous,
                          is_nhwc(out) and not out.flags.c_contiguous))
        np.multiply(x, 2, out=out)

    def channels_last_positions(self) -> tuple[int, ...]:
        return self.positions

    def use_channels_last(self, positions: Collection[int]) -> None:
        self.told = set(positions)


class FreeTwice(Twice):
    """Twice, layout-free at both positions (a NumPy ufunc's way): it takes NHWC where a
    neighbour needs it, and needs it nowhere."""

    def channels_last_positions(self) -> tuple[int, ...]:
        return ()

    def layout_free_positions(self) -> tuple[int, ...]:
        return (0, 1)


class Maker:
    """A lib function preparing Twice kernels that take NHWC at `positions` (free: FreeTwice)."""

    def __init__(self, positions: tuple[int, ...], free: bool = False) -> None:
        self.positions = positions
        self.free = free
        self.made: list[Twice] = []

    def prepare(self, device: Any, inputs: Any, outputs: Any, attrs: Any) -> Twice:
        self.made.append(FreeTwice(()) if self.free else Twice(self.positions))
        return self.made[-1]


def _chain(funcs: list[str], extra_head: int | None = None) -> tuple[Any, Module, dict]:
    """x -> f0 -> f1 -> ... (one node per func), the last node the output."""
    lib = Module("layouts")
    makers = {"both": Maker((0, 1)), "in_only": Maker((0,)), "plain": Maker(()),
              "free": Maker((), free=True)}
    for name, maker in makers.items():
        lib.register(name, maker)
    nodes = [null("x")] + [tvm_op(f"n{i}", f, [i]) for i, f in enumerate(funcs)]
    heads = [len(funcs)] + ([] if extra_head is None else [extra_head])
    graph = make_graph(nodes, heads, shapes=[SHAPE] * len(nodes))
    return graph, lib, makers


def _run(graph: Any, lib: Module) -> tuple[Any, np.ndarray, np.ndarray]:
    m = gr.create(graph, lib, gr.cpu())
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    m.set_input("x", x)
    m.run()
    return m, x, m.get_output(0).numpy()


def test_entries_between_takers_stay_nhwc_and_the_edges_do_not() -> None:
    graph, lib, makers = _chain(["both", "both", "both"])
    m, x, got = _run(graph, lib)
    np.testing.assert_array_equal(got, 8 * x)
    assert got.flags.c_contiguous
    # x (an input) and n2's output (the graph's) stay NCHW; n0's and n1's outputs are NHWC
    assert m.executor.channels_last == {1, 2}
    first, middle, last = makers["both"].made
    assert (first.told, middle.told, last.told) == ({1}, {0, 1}, {0})
    assert (first.seen, middle.seen, last.seen) == ([(False, True)], [(True, True)],
                                                    [(True, False)])


def test_a_reader_that_cannot_take_nhwc_keeps_the_entry_nchw() -> None:
    graph, lib, makers = _chain(["both", "plain", "both", "in_only"])
    m, x, got = _run(graph, lib)
    np.testing.assert_array_equal(got, 16 * x)
    # n0 -> plain: NCHW; n2 -> in_only: NHWC (in_only reads it so); in_only's output is the graph's
    assert m.executor.channels_last == {3}
    assert makers["in_only"].made[0].told == {0}


def test_a_writer_that_cannot_write_nhwc_keeps_the_entry_nchw() -> None:
    graph, lib, makers = _chain(["in_only", "both"])
    m, _, _ = _run(graph, lib)
    assert m.executor.channels_last == set()
    assert makers["both"].made[0].told == set()


def test_layout_free_kernels_take_nhwc_beside_a_kernel_needing_it_and_never_alone() -> None:
    # x -> both -> free -> free -> both: the entries around the free kernels are NHWC (each
    # has a neighbour needing it: n0's output and n2's, read by n3); n1's output lies between
    # two free kernels alone and stays NCHW
    graph, lib, makers = _chain(["both", "free", "free", "both"])
    m, x, got = _run(graph, lib)
    np.testing.assert_array_equal(got, 16 * x)
    assert m.executor.channels_last == {1, 3}
    first, second = makers["free"].made
    assert (first.seen, second.seen) == ([(True, False)], [(False, True)])
    graph, lib, makers = _chain(["free", "free", "free"])
    m, x, got = _run(graph, lib)
    np.testing.assert_array_equal(got, 8 * x)
    assert m.executor.channels_last == set()


def test_a_graph_output_read_by_another_node_stays_nchw() -> None:
    graph, lib, _ = _chain(["both", "both", "both"], extra_head=1)
    m, x, got = _run(graph, lib)
    assert m.executor.channels_last == {2}
    np.testing.assert_array_equal(m.get_output(1).numpy(), 2 * x)
    assert m.get_output(1).numpy().flags.c_contiguous


def test_debug_outputs_read_nhwc_entries_in_the_users_layout() -> None:
    graph, lib, _ = _chain(["both", "both", "both"])
    m, x, _ = _run(graph, lib)
    outputs = m.debug_get_outputs()
    for i in range(3):
        np.testing.assert_array_equal(outputs[f"n{i}"][0], 2 ** (i + 1) * x)


def test_storage_plan_is_unchanged() -> None:
    """NHWC takes the bytes NCHW does: same storage ids, same pool size."""
    graph, lib, _ = _chain(["both", "both", "both", "both"])
    m, _, _ = _run(graph, lib)
    plain, lib2, _ = _chain(["plain", "plain", "plain", "plain"])
    other, _, _ = _run(plain, lib2)
    assert m.executor.channels_last
    assert m.executor.plan.bytes_per_device() == other.executor.plan.bytes_per_device()
    for eid in m.executor.channels_last:
        view = m.executor.arrays[(eid, gr.cpu())]
        assert view.base is not None and np.shares_memory(view, m.executor.pool.views[eid])


def test_a_shared_kernel_told_nhwc_in_a_later_module_gets_its_own() -> None:
    # a symbolic module's specialisations share kernels (runtime/steps.py's KernelCache): one
    # that offered NHWC and was told nothing is shared; where a later specialisation's layout
    # pass tells it (its neighbours' kernels now take NHWC), that one prepares its own, and the
    # shared kernel stays as it was
    from graph_runtime.runtime.graph_module import GraphModule
    from graph_runtime.runtime.steps import KernelCache
    lib = Module("layouts")
    makers = {"both": Maker((0, 1)), "edge": Maker(())}
    for name, maker in makers.items():
        lib.register(name, maker)
    cache = KernelCache()
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    nodes = [null("x")] + [tvm_op(f"n{i}", f, [i]) for i, f in enumerate(["edge", "both", "edge"])]
    graph = gr.Graph.from_json(make_graph(nodes, [3], shapes=[SHAPE] * 4))
    for _ in range(2):
        m = GraphModule(graph, lib, [gr.cpu()], kernels=cache)
        cache.hold()
        m.set_input("x", x)
        m.run()
        np.testing.assert_array_equal(m.get_output(0).numpy(), 8 * x)
        # the edges' kernels dropped, and made anew taking NHWC (as other shapes might)
        cache.kernels = {key: fn for key, fn in cache.kernels.items() if "edge" not in key[0]}
        makers["edge"].positions = (0, 1)
    shared, own = makers["both"].made
    assert shared.told == set() and own.told == {0, 1}
    assert [k.told for k in makers["edge"].made] == [set(), {1}, {0}]
    assert cache.reused == 2 and m.executor.channels_last == {1, 2}

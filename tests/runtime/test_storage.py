"""Storage planning and the pool: sizes per storage id, one device per id, caps, views."""
from __future__ import annotations

import numpy as np
import pytest
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime._text import fmt_bytes
from graph_runtime.errors import GraphError
from graph_runtime.graph.model import entry_bytes
from graph_runtime.runtime.storage import StoragePool, check_capacity, layout_pool


def _chain(storage_ids: list[int], shapes: list[list[int]], dtypes: list[str]):
    nodes = [null("x")] + [tvm_op(f"n{k}", "relu", [k]) for k in range(len(shapes) - 1)]
    return make_graph(nodes, [len(shapes) - 1], shapes=shapes, dtypes=dtypes,
                      storage_ids=storage_ids)


def test_entry_bytes_uses_python_ints() -> None:
    assert entry_bytes((2, 3), "float64") == 48
    assert entry_bytes((), "int8") == 1
    assert entry_bytes((0, 5), "float32") == 0
    assert entry_bytes((1 << 40, 1 << 40), "float32") == 1 << 82  # no int64 overflow


def test_bytes_per_storage_id_is_the_max_over_its_entries() -> None:
    g = _chain([0, 1, 0, 1], [[4], [8], [2], [3]], ["float32", "float32", "float64", "int8"])
    plan = layout_pool(g, [gr.cpu()] * 4)
    assert plan.sid_bytes == {0: 16, 1: 32}
    assert plan.bytes_per_device() == {gr.cpu(): 48}
    assert plan.unshared_bytes_per_device() == {gr.cpu(): 16 + 32 + 16 + 3}


def test_a_storage_id_on_two_devices_names_both_entries() -> None:
    g = _chain([0, 1, 1], [[4], [4], [4]], ["float32"] * 3)
    with pytest.raises(GraphError, match=r"storage id 1 is used on cpu:0 by entry 1 \(node 1 "
                                         r"'n0' output 0\) and on opencl:0 by entry 2 \(node 2 "
                                         r"'n1' output 0\)"):
        layout_pool(g, [gr.cpu(), gr.cpu(), gr.opencl()])


def test_capacity_check_names_the_largest_storage_id_and_entry() -> None:
    g = _chain([0, 1, 2], [[4], [1 << 20], [4]], ["float32"] * 3)
    plan = layout_pool(g, [gr.cpu()] * 3)
    check_capacity(g, plan, {gr.cpu(): 1 << 23})
    with pytest.raises(GraphError, match=r"needs 4\.0 MiB on cpu:0 but the cap is 1\.0 MiB; "
                                         r"the largest is storage id 1 \(4\.0 MiB\) for entry 1 "
                                         r"\(node 1 'n0' output 0, shape \(1048576,\) float32\)"):
        check_capacity(g, plan, {gr.cpu(): 1 << 20})


def test_pool_views_of_different_dtypes_share_one_buffer() -> None:
    g = _chain([0, 0], [[4], [2]], ["float32", "float64"])
    pool = StoragePool(g, layout_pool(g, [gr.cpu()] * 2))
    assert len(pool.buffers) == 1
    f32, f64 = pool.views
    assert (f32.dtype, f32.shape, f64.dtype, f64.shape) == (np.float32, (4,), np.float64, (2,))
    f64[:] = [1.5, -2.0]
    np.testing.assert_array_equal(f32.view(np.float64), [1.5, -2.0])


@pytest.mark.opencl
def test_pool_on_two_devices(opencl_available: None) -> None:
    g = _chain([0, 1, 2], [[4], [4], [4]], ["float32"] * 3)
    devices = [gr.cpu(), gr.opencl(), gr.opencl()]
    plan = layout_pool(g, devices)
    pool = StoragePool(g, plan)
    assert plan.bytes_per_device() == {gr.cpu(): 16, gr.opencl(): 32}
    assert isinstance(pool.views[0], np.ndarray)
    assert type(pool.views[1]).__name__ == "Array"  # pyopencl.array.Array


def test_fmt_bytes() -> None:
    assert [fmt_bytes(n) for n in (0, 1023, 1024, 3 << 20, 5 << 50)] == [
        "0 B", "1023 B", "1.0 KiB", "3.0 MiB", "5.0 PiB"]


def test_a_static_pools_host_ids_are_slices_of_one_arena() -> None:
    """Without a scratch (a static module) every host storage id is its own slice of one
    allocation (backends/cpu.host_arena), none overlapping another; the views written through
    one id leave the others as they were."""
    g = _chain([0, 1, 2, 1], [[5], [1 << 20], [3], [7]], ["float32", "float32", "int8", "float32"])
    pool = StoragePool(g, layout_pool(g, [gr.cpu()] * 4))
    buffers = list(pool.buffers.values())
    assert len(buffers) == 3 and len({id(b.base) for b in buffers}) == 1
    assert buffers[0].base is not None and all(b.ctypes.data % 64 == 0 for b in buffers)
    spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in buffers)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for k, view in enumerate(pool.views[:3]):
        view[...] = k + 1
    assert [int(v.reshape(-1)[0]) for v in pool.views[:3]] == [1, 2, 3]

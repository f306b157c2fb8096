"""Chains of standard ops: input order, variadic ops, declared-output checks, buffers, fusion."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.device import Device, cpu
from graph_runtime.errors import LibraryError
from graph_runtime.lib.chain import Chain, PreparedChain, Step
from graph_runtime.lib.library import InputVersion, TensorSpec
from graph_runtime.lib.prepared import PreparedKernel, capabilities


def _specs(*arrays: np.ndarray) -> list[TensorSpec]:
    return [TensorSpec(a.shape, str(a.dtype)) for a in arrays]


def test_each_op_takes_previous_result_first(backend_name, run_op, random_array, assert_close):
    # relu(add(multiply(a, b), c)); subtract shows the order: previous result minus the input.
    a = random_array((2, 3), "float32", seed=1)
    b = random_array((3,), "float32", seed=2)
    c = random_array((2, 1), "float32", seed=3)
    d = random_array((2, 3), "float32", seed=4)
    ops = [{"op": "multiply"}, {"op": "add"}, {"op": "relu"}, {"op": "subtract"}]
    (got,) = run_op(backend_name, ops, [a, b, c, d])
    want = np.maximum(a.astype(np.float64) * b + c, 0) - d
    assert_close(got, want, "float32")


def test_variadic_concatenate_takes_the_rest(backend_name, run_op, random_array, assert_close):
    a = random_array((3, 2), "float32", seed=5)
    b = random_array((2, 2), "float32", seed=6)
    c = random_array((2, 4), "float32", seed=7)
    ops = [{"op": "transpose"}, {"op": "concatenate", "axis": 1}]
    (got,) = run_op(backend_name, ops, [a, b, c])
    assert_close(got, np.concatenate([a.T, b, c], axis=1).astype(np.float64), "float32")


def test_variadic_num_inputs_caps_what_it_takes(backend_name, run_op, random_array,
                                                assert_close):
    a = random_array((2, 2), "float32", seed=8)
    b = random_array((2, 2), "float32", seed=9)
    c = random_array((4, 2), "float32", seed=10)
    ops = [{"op": "concatenate", "num_inputs": 2}, {"op": "multiply"}, {"op": "exp"}]
    (got,) = run_op(backend_name, ops, [a, b, c])
    assert_close(got, np.exp(np.concatenate([a, b]).astype(np.float64) * c), "float32")


def test_gpu_fuses_elementwise_tail_and_reuses_buffers(backend_name, random_array,
                                                      assert_close, monkeypatch):
    backend = get_backend(backend_name)
    dev = Device(backend.device_type, 0)
    x = random_array((3, 4), "float32", seed=11)
    bias = random_array((4,), "float32", seed=12)
    scale = random_array((3, 1), "float32", seed=13)
    # transpose -> (4, 3); the tail add(bias as (4, 1)) * scale-row ... relu stays elementwise.
    chain = Chain("f", [Step("transpose"), Step("transpose"), Step("add"), Step("multiply"),
                        Step("relu")])
    ins = [x, bias, scale]
    run = chain.prepare(dev, _specs(*ins), [TensorSpec((3, 4), "float32")], {})
    assert isinstance(run, PreparedChain)
    if backend_name == "cpu":
        # the second transpose writes the output; add, multiply and relu update it in place
        # (one compiled pass, kernels/cpu/chain_jit.py)
        assert run.fused_ops == ["add", "multiply", "relu"]
        assert len(run.intermediates) == 1
    else:
        assert run.fused_ops == ["add", "multiply", "relu"]
        assert len(run.intermediates) == 2  # only the two transposes materialize
    buffers = list(run.intermediates)
    arrays = []
    for host in ins:
        arr = backend.empty(0, host.shape, host.dtype)
        backend.from_host(host, arr)
        arrays.append(arr)
    out = backend.empty(0, (3, 4), "float32")
    allocations: list[str] = []

    def counting(method: str):
        real = getattr(backend, method)

        def call(*args):
            allocations.append(method)
            return real(*args)
        return call

    for method in ("alloc", "empty"):
        monkeypatch.setattr(backend, method, counting(method))
    for _ in range(3):
        run(*arrays, out)
    monkeypatch.undo()
    assert allocations == []  # steady state: no device allocation per call
    assert all(a is b for a, b in zip(run.intermediates, buffers))
    backend.sync(0)
    want = np.maximum((x.astype(np.float64) + bias) * scale, 0)
    assert_close(backend.to_host(out), want, "float32")


def _cpu_chain(steps: list[Step], ins: list[np.ndarray], out: TensorSpec) -> PreparedChain:
    run = Chain("f", steps).prepare(cpu(0), _specs(*ins), [out], {})
    assert isinstance(run, PreparedChain)
    return run


def test_cpu_dense_tail_runs_in_the_output(random_array, assert_close):
    x = random_array((2, 5), "float32", seed=20)
    w = random_array((3, 5), "float32", seed=21)
    b = random_array((3,), "float32", seed=22)
    run = _cpu_chain([Step("dense"), Step("bias_add"), Step("relu")], [x, w, b],
                     TensorSpec((2, 3), "float32"))
    assert run.intermediates == ()  # dense writes the output, bias_add and relu work in place
    out = np.full((2, 3), np.nan, np.float32)
    run(x, w, b, out)
    assert_close(out, np.maximum(x.astype(np.float64) @ w.T + b, 0), "float32")


@pytest.mark.parametrize("jit", ["off", "auto"])
def test_cpu_in_place_stops_at_ops_that_reread_their_input(random_array, assert_close, jit,
                                                            monkeypatch):
    monkeypatch.setenv("GRAPH_RUNTIME_CHAIN_JIT", jit)
    x = random_array((2, 5), "float32", seed=23)
    w = random_array((3, 5), "float32", seed=24)
    # gelu reads x again after writing out, so it gets a buffer of its own; add after it does not.
    # Compiled, gelu and add are one pass that reads each element before writing it.
    run = _cpu_chain([Step("dense"), Step("gelu"), Step("add")], [x, w, np.ones(3, np.float32)],
                     TensorSpec((2, 3), "float32"))
    assert len(run.intermediates) == (1 if jit == "off" else 0)
    out = np.empty((2, 3), np.float32)
    run(x, w, np.ones(3, np.float32), out)
    y = x.astype(np.float64) @ w.T
    from scipy.special import erf
    assert_close(out, 0.5 * y * (1 + erf(y / np.sqrt(2))) + 1, "float32")


def test_cpu_in_place_needs_the_output_shape(random_array, assert_close):
    # sum gives (2,), the add broadcasts it against (3, 2): the sum cannot live in the output
    x = random_array((2, 4), "float32", seed=25)
    y = random_array((3, 2), "float32", seed=26)
    run = _cpu_chain([Step("sum", {"axis": 1}), Step("add"), Step("exp")], [x, y],
                     TensorSpec((3, 2), "float32"))
    assert len(run.intermediates) == 1  # the sum's; add writes the output, exp updates it
    out = np.empty((3, 2), np.float32)
    run(x, y, out)
    assert_close(out, np.exp(x.astype(np.float64).sum(1) + y), "float32")


def test_cpu_layout_ops_into_intermediates_are_views_not_passes() -> None:
    """A window partition (reshape, transpose, reshape) is one copy of the permutation it
    amounts to (PermutedCopy), with no intermediate; a torch.roll's halves (strided_slice,
    concatenate) are read in place by the concatenate. A strided (transposed) argument is
    reshaped with the copy NumPy must make; intermediates viewing others hold no bytes of their
    own."""
    from graph_runtime.lib.kernels.cpu.permuted_copy import PermutedCopy
    x = np.arange(2 * 4 * 6, dtype=np.float32).reshape(2, 4, 6)
    steps = [Step("reshape", {"newshape": [2, 2, 2, 6]}), Step("transpose", {"axes": [0, 2, 1, 3]}),
             Step("reshape", {"newshape": [2, 24]}), Step("reshape", {"newshape": [4, 12]})]
    run = Chain("f", steps).prepare(cpu(0), _specs(x), [TensorSpec((4, 12), "float32")], {})
    assert isinstance(run, PermutedCopy) and run.workspace_bytes() == 0
    want = x.reshape(2, 2, 2, 6).transpose(0, 2, 1, 3).reshape(4, 12)
    for given in (x, np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)):
        out = np.empty((4, 12), np.float32)
        run(given, out)
        np.testing.assert_array_equal(out, want)
    roll = [Step("strided_slice", {"begin": [0, 3], "end": [2, 6]}),
            Step("concatenate", {"axis": 1}, num_inputs=2), Step("reshape", {"newshape": [12]})]
    tail = np.arange(6, dtype=np.float32).reshape(2, 3)
    run = _cpu_chain(roll, [x[0, :2], tail], TensorSpec((12,), "float32"))
    out = np.empty(12, np.float32)
    run(x[0, :2], tail, out)
    np.testing.assert_array_equal(out, np.concatenate([x[0, :2, 3:], tail], 1).reshape(12))
    assert run.workspace_bytes() == 2 * 6 * 4  # the concatenate's; the slice is a view


def test_fused_tail_after_reduction_with_cast(backend_name, run_op, random_array, assert_close):
    x = random_array((4, 5), "float32", seed=14)
    y = random_array((4,), "float32", seed=15)
    ops = [{"op": "sum", "axis": 1}, {"op": "maximum"}, {"op": "cast", "dtype": "float16"},
           {"op": "negative"}]
    (got,) = run_op(backend_name, ops, [x, y])
    want = -np.maximum(x.astype(np.float64).sum(1), y).astype(np.float16).astype(np.float64)
    assert_close(got, want, "float16")


def test_flatten_data_passes_declared_shapes_back(backend_name, random_array, assert_close):
    backend = get_backend(backend_name)
    dev = Device(backend.device_type, 0)
    a = random_array((2, 3), "float32", seed=16)
    b = random_array((3,), "float32", seed=17)
    run = Chain("add", [Step("add")]).prepare(dev, _specs(a, b), [TensorSpec((2, 3), "float32")],
                                              {"flatten_data": "1"})
    flat = []
    for host in (a.reshape(-1), b):
        arr = backend.empty(0, host.shape, host.dtype)
        backend.from_host(host, arr)
        flat.append(arr)
    out = backend.empty(0, (6,), "float32")
    run(*flat, out)
    backend.sync(0)
    assert_close(backend.to_host(out), (a.astype(np.float64) + b).reshape(-1), "float32")


def test_declared_output_mismatch_names_op_and_output() -> None:
    chain = Chain("fused_mul_relu", [Step("multiply"), Step("relu")])
    ins = [TensorSpec((1, 10), "float32"), TensorSpec((1, 10), "float32")]
    with pytest.raises(LibraryError, match=r"fused_mul_relu: op 2 'relu' produces \(1, 10\) "
                                           r"float32 but the graph declares \(1, 12\) float32 "
                                           r"for output 0"):
        chain.prepare(Device(1, 0), ins, [TensorSpec((1, 12), "float32")], {})
    with pytest.raises(LibraryError, match="produces 1 output.* but the graph declares 2"):
        chain.prepare(Device(1, 0), ins, [TensorSpec((1, 10), "float32")] * 2, {})


def test_input_count_and_op_errors_name_the_op() -> None:
    chain = Chain("f", [Step("multiply"), Step("add")])
    two = [TensorSpec((2,), "float32")] * 2
    with pytest.raises(LibraryError, match=r"f: op 2 'add': needs 2 input\(s\) but the graph "
                                           "node gives 2"):
        chain.infer(two)
    with pytest.raises(LibraryError, match="f: its ops take 3 input.* gives 4"):
        chain.infer(two * 2)
    bad = Chain("g", [Step("relu"), Step("transpose", {"axes": [0, 2]})])
    with pytest.raises(LibraryError, match=r"g: op 2 'transpose': axes \(0, 2\) has 2 entries "
                                           "but the input has rank 1"):
        bad.infer([TensorSpec((3,), "float32")])
    with pytest.raises(LibraryError, match="only the last op of a chain may have more than one"):
        Chain("h", [Step("split", {"indices_or_sections": 2}), Step("relu")]).infer(
            [TensorSpec((4,), "float32")])
    # A chain takes attrs from the lib file only; node attrs (TVM may add layouts) are ignored.
    assert chain.infer(two + two[:1], {"data_layout": "NCHW"}) == [two[0]]


def test_node_attrs_configure_a_single_op(run_op, random_array) -> None:
    x = random_array((2, 3, 4), "float32", seed=18)
    (got,) = run_op("cpu", "transpose", [x], {"axes": "[1, 0, 2]", "func_name": "transpose",
                                              "num_inputs": "1", "flatten_data": "0"})
    np.testing.assert_array_equal(got, x.transpose(1, 0, 2))


class _Capable(PreparedKernel):
    """A kernel with every capability, reporting them in its own argument positions."""

    def __init__(self, requests: dict[int, Any], nbytes: int, cached: tuple[int, ...],
                 workers: bool) -> None:
        self.requests, self.nbytes, self.cached, self.workers = requests, nbytes, cached, workers
        self.bound: dict[int, InputVersion] | None = None

    def storage_requests(self) -> dict[int, Any]:
        return self.requests

    def workspace_bytes(self) -> int:
        return self.nbytes

    def cached_inputs(self) -> tuple[int, ...]:
        return self.cached

    def bind_versions(self, versions: Any) -> None:
        self.bound = dict(versions)

    def uses_workers(self) -> bool:
        return self.workers

    def __call__(self, *arrays: Any) -> None:
        pass


def _plain(*arrays: Any) -> None:
    pass


def test_chain_combines_its_kernels_capabilities_by_function_input() -> None:
    # Slots: function inputs x 0 and w 1, the output 2, then the intermediate 3.
    inter = np.empty(5, "float32")
    weight, scratch = np.empty(4), np.empty(4)
    first = _Capable({1: weight}, 100, (1,), False)
    # Argument 0 is the intermediate: its request and cache are the kernel's own affair.
    second = _Capable({0: scratch}, 20, (0, 1), True)
    chain = PreparedChain([(first, (0, 1, 3)), (_plain, (3, 2)), (second, (3, 0, 2))],
                          [inter], [], 2)
    assert chain.storage_requests() == {1: weight}
    assert chain.workspace_bytes() == inter.nbytes + 120
    assert chain.cached_inputs() == (0, 1)
    assert chain.uses_workers() is True
    v0, v1 = InputVersion(), InputVersion()
    chain.bind_versions({0: v0, 1: v1})
    assert first.bound == {1: v1}
    assert second.bound is not None and second.bound[1] is v0
    assert second.bound[0].volatile  # an intermediate has no write counter


def test_chain_of_plain_kernels_has_the_defaults() -> None:
    chain = PreparedChain([(_plain, (0, 2)), (_plain, (2, 1))], [], [], 1)
    assert (chain.storage_requests(), chain.workspace_bytes(), chain.cached_inputs(),
            chain.uses_workers()) == ({}, 0, (), False)


def test_flatten_data_keeps_the_kernels_capabilities() -> None:
    # A conv under flatten_data: its workspace, its cached (transformed) weight and its use of
    # the workers still reach the executor through the reshaping wrapper.
    specs = [TensorSpec((1, 8, 10, 10), "float32"), TensorSpec((8, 8, 3, 3), "float32")]
    out = [TensorSpec((1, 8, 10, 10), "float32")]
    attrs = {"padding": "[1, 1]"}
    plain = Chain("conv2d", [Step("conv2d", attrs)]).prepare(cpu(), specs, out, {})
    flat = Chain("conv2d", [Step("conv2d", attrs)]).prepare(cpu(), specs, out,
                                                            {"flatten_data": "1"})
    want, got = capabilities(plain), capabilities(flat)
    assert want.cached_inputs() and want.workspace_bytes() > 0
    assert got.cached_inputs() == want.cached_inputs()
    assert got.workspace_bytes() == want.workspace_bytes()
    assert got.uses_workers() == want.uses_workers()
    assert got.storage_requests() == {}


def test_chain_asks_kernels_what_they_can_do_not_their_class() -> None:
    """lib/chain.py fuses tails and writes profile notes from the capabilities kernels declare
    (PreparedKernel.note, with_tile_tail, post_op_shape), never by testing a kernel's class: its
    isinstance tests name only its own classes (and the compiled tail it makes)."""
    import ast
    from pathlib import Path

    import graph_runtime.lib.chain as chain
    tree = ast.parse(Path(chain.__file__).read_text(encoding="utf-8"))
    tested = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            kinds = node.args[1]
            for kind in (kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]):
                tested.add(ast.unparse(kind))
    assert tested <= {"PreparedChain", "chain_jit.CompiledChain", "str"}, tested
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert not imported & {"DenseTiles", "OnednnMatmul"}


def test_a_plain_kernel_declares_no_fusion() -> None:
    plain = capabilities(lambda *arrays: None)
    assert plain.note() == "" and plain.with_tile_tail(object()) is None
    assert plain.post_op_shape() is None and plain.with_post_ops(object(), 0) is None

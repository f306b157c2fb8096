"""ONNX's backend node tests run through graph_runtime: load the cases once, run one, judge it.

A case's outcome is PASS (every output matches ONNX's expected array: same dtype, same shape,
values within the case's rtol/atol, as onnx.backend.test.runner compares) or REFUSED (a
GraphRuntimeError from `from_onnx` or `create`: the clean refusal the frontend promises).
Anything else is a failure: `run_case` raises CaseFailure for a wrong result, and lets every
other exception (another type from the import, any error from run()) propagate unchanged.

graph_runtime plans static shapes at import, as TVM's relay.build did, so an operand that decides
an output's shape must be known then. ONNX's node tests feed such operands as graph inputs (the
`shape` of Reshape, the `starts` of Slice, the `k` of TopK...): inputs that earlier opsets had
as attributes. The harness freezes a graph input used only in those slots (STATIC_OPERANDS),
directly or through nodes that compute them, into an initializer holding the test's own value
(as a PyTorch export has them) and feeds every other input at run time; freeze=False imports
the case as it is (the script's --no-freeze counts both ways). Shared by tests/frontend/test_onnx_node_tests.py and scripts/onnx_conformance.py.
"""
from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PASS = "pass"
REFUSED = "refused"
PASSING_LIST = Path(__file__).with_name("onnx_node_passing.txt")
UPDATE_ENV = "GRAPH_RUNTIME_UPDATE_ONNX_PASSING"
PASSING_HEADER = f"""\
# ONNX backend node tests (onnx.backend.test.case.node.collect_testcases()) that graph_runtime
# passes on CPU; tests/frontend/test_onnx_node_tests.py fails when a listed case stops passing.
# Regenerate after the frontend learns new ops (runs every case on CPU, ~15 s here):
#   {UPDATE_ENV}=1 python -m pytest -q tests/frontend/test_onnx_node_tests.py -k cpu
# or: python scripts/onnx_conformance.py --write-list
"""


class CaseFailure(AssertionError):
    """graph_runtime imported and ran the case but produced a wrong output."""


@dataclass(frozen=True)
class Outcome:
    """How one case ended: PASS or REFUSED, with the refusal message."""

    status: str
    detail: str = ""


@functools.cache
def node_cases() -> dict[str, Any]:
    """Every ONNX backend node test case by name (collected once per process: ~5 s)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        cases = collect_testcases()
    return {case.name: case for case in sorted(cases, key=lambda c: c.name)}


def op_type(name: str) -> str:
    """The ONNX op a case tests (an `_expanded` case counts for the op whose body it expands)."""
    cases = node_cases()
    base = name.split("_expanded")[0]
    case = cases.get(base, cases[name])
    return str(case.model.graph.node[0].op_type)


def read_passing_list(path: Path = PASSING_LIST) -> list[str]:
    """The checked-in passing case names (empty when the file does not exist yet)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def write_passing_list(names: Sequence[str], path: Path = PASSING_LIST) -> None:
    """Write the sorted passing list with its header (how to regenerate it)."""
    body = "".join(f"{name}\n" for name in sorted(set(names)))
    path.write_text(PASSING_HEADER + body, encoding="utf-8")


def spread(names: Sequence[str], every: int) -> list[str]:
    """Every `every`-th name of the sorted list: a deterministic sample across all op types."""
    return sorted(names)[::every]


def _as_array(value: Any, what: str) -> np.ndarray:
    """A data-set value as an ndarray (ONNX keeps some as TensorProto or NumPy scalars)."""
    import onnx
    from onnx import numpy_helper
    if isinstance(value, onnx.TensorProto):
        return np.asarray(numpy_helper.to_array(value))
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    raise CaseFailure(f"{what} is a {type(value).__name__}, not a tensor, yet the model was "
                      "imported (sequence/optional types should be refused at import)")


_REDUCE_AXES = {op: (1,) for op in (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")}
# op type -> input slots that earlier opsets had as attributes (they decide shapes or are
# compile-time constants of the kernel); a graph input feeding one is frozen to its value.
STATIC_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1, 2), "TopK": (1,), "CumSum": (1,),
    "Clip": (1, 2), "Dropout": (1, 2), "Trilu": (1,), "CenterCropPad": (1,), "BlackmanWindow": (0,),
    "HammingWindow": (0,), "HannWindow": (0,), "CumProd": (1,), **_REDUCE_AXES,
    # Operands that decide the output's shape (never attributes, but the same kind of operand):
    "AffineGrid": (1,), "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (1, 3), "MelWeightMatrix": (0, 1),
}
_SHAPE_ONLY = frozenset({"Shape", "Size", "EyeLike", "RandomUniformLike", "RandomNormalLike"})


def frozen_inputs(model: Any) -> set[str]:
    """Graph inputs whose every use ends in a STATIC_OPERANDS slot, directly or through nodes
    computing such operands (an expanded window function deriving Range's limit from `size`)."""
    uses: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, slot))
    outputs = {info.name for info in model.graph.output}
    memo: dict[str, bool] = {}

    def static_only(name: str) -> bool:
        if name not in memo:
            memo[name] = False  # a graph has no cycles; this only guards the recursion
            memo[name] = name not in outputs and bool(uses.get(name)) and all(
                _static_use(node, slot, static_only) for node, slot in uses[name])
        return memo[name]

    return {info.name for info in model.graph.input if static_only(info.name)}


def _static_use(node: Any, slot: int, static_only: Any) -> bool:
    """A use in a static slot, or by a node whose outputs are all used only statically."""
    if slot in STATIC_OPERANDS.get(node.op_type, ()):
        return True
    if node.op_type in _SHAPE_ONLY:  # reads the shape, not the value: nothing to freeze
        return False
    outs = [out for out in node.output if out]
    return bool(outs) and all(static_only(out) for out in outs)


def prepared_model(case: Any, freeze: bool = True) -> tuple[Any, dict[str, Any]]:
    """(model to import, {input name: value fed at run time}) for a case."""
    from onnx import ModelProto, numpy_helper
    values = {info.name: value for info, value in zip(case.model.graph.input,
                                                      case.data_sets[0][0])}
    frozen = frozen_inputs(case.model) if freeze else set()
    if not frozen:
        return case.model, values
    model = ModelProto()
    model.CopyFrom(case.model)
    kept = [info for info in model.graph.input if info.name not in frozen]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name in sorted(frozen):
        array = _as_array(values.pop(name), f"input {name!r}")
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return model, values


def run_case(case: Any, device: str = "cpu", freeze: bool = True) -> Outcome:
    """Import, create on `device`, run and compare one case (see the module docstring)."""
    import graph_runtime as gr
    from graph_runtime.errors import GraphRuntimeError
    from graph_runtime.frontend import from_onnx
    model, inputs = prepared_model(case, freeze)
    shapes = {name: tuple(np.shape(value)) for name, value in inputs.items()
              if isinstance(value, (np.ndarray, np.generic))}
    try:
        graph_json, lib, params = from_onnx(model, shape=shapes)
        module = gr.create(graph_json, lib, gr.device(device))
    except GraphRuntimeError as e:
        return Outcome(REFUSED, f"{type(e).__name__}: {e}")
    if params:
        module.load_params(gr.save_param_dict(params))
    expected = case.data_sets[0][1]
    graph_inputs = module.get_input_info()[0]
    for name, value in inputs.items():
        if name in graph_inputs:
            module.set_input(name, _as_array(value, f"input {name!r}"))
    module.run()
    _compare(case, module, [_as_array(v, f"expected output {i}") for i, v in enumerate(expected)])
    return Outcome(PASS)


def _compare(case: Any, module: Any, expected: list[np.ndarray]) -> None:
    """Every output against ONNX's array: count, shape, dtype exactly; values within tolerance."""
    got_count = module.get_num_outputs()
    if got_count != len(expected):
        raise CaseFailure(f"{case.name}: expected {len(expected)} outputs, got {got_count}")
    for i, want in enumerate(expected):
        got = module.get_output(i).numpy()
        where = f"{case.name} output {i} ({case.model.graph.output[i].name!r})"
        if got.shape != want.shape:
            raise CaseFailure(f"{where}: expected shape {want.shape}, got {got.shape}")
        if got.dtype != want.dtype:
            raise CaseFailure(f"{where}: expected dtype {want.dtype}, got {got.dtype}")
        if want.dtype == object:
            np.testing.assert_array_equal(got, want, err_msg=where)
            continue
        rtol = case.rtol
        if want.dtype.name == "bfloat16":  # as onnx's runner: two bfloat16 ulps
            rtol = max(rtol, 2 ** -6)
            got = got.astype(np.float32)
            want = want.astype(np.float32)
        elif want.dtype == np.float16:
            # The same rule for float16: two ulps (2**-9 relative). ONNX's expected values round to
            # float16 after every op; a fused chain keeps float32 intermediates, so it lands one or
            # two float16 steps away (closer to the float64 result in the cases seen).
            rtol = max(rtol, 2 ** -9)
        try:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=case.atol, err_msg=where)
        except AssertionError as e:
            raise CaseFailure(str(e)) from None


def update_requested() -> bool:
    """Whether this run should rewrite the passing list (GRAPH_RUNTIME_UPDATE_ONNX_PASSING=1)."""
    return os.environ.get(UPDATE_ENV) == "1"

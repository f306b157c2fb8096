"""Constant folding: evaluate an ONNX node whose inputs are all known at import, with NumPy."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .fold_size import check_fold_size, check_folded
from .ir import Unsupported
from .onnx_node import OnnxNode

# Never folded: their outputs are random, so evaluating them once would freeze one draw.
NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                          "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan",
                          "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceEmpty",
                          "SplitToSequence", "ConcatFromSequence", "Optional",
                          "OptionalGetElement", "OptionalHasElement"})


def fold_gather(node: OnnxNode, data: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    axis = int(node.attr("axis", 0)) % max(data.ndim, 1)  # checked by fold_size's size_gather
    if idx.dtype.kind not in "iu":
        raise Unsupported(f"indices of dtype {idx.dtype}; expected int32 or int64")
    n = data.shape[axis]
    wide = idx.astype(np.int64)
    if wide.size and (int(wide.min()) < -n or int(wide.max()) >= n):
        bad = int(wide.min()) if int(wide.min()) < -n else int(wide.max())
        raise Unsupported(f"index {bad} is out of range for axis {axis} of size {n}")
    return [np.take(data, np.where(wide < 0, wide + n, wide), axis=axis)]


def fold_gather_elements(node: OnnxNode, data: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """GatherElements (the onnx package's reference failed on BERT's token-type ids: "cannot
    reshape array of size 1 into shape (1,32)", leaving a runtime node for a constant)."""
    if data.ndim == 0 or idx.ndim != data.ndim:
        raise Unsupported(f"indices of rank {idx.ndim} for data of rank {data.ndim}; expected "
                          "the same rank, at least 1")
    axis = int(node.attr("axis", 0))
    if not -data.ndim <= axis < data.ndim:
        raise Unsupported(f"axis {axis} for data of rank {data.ndim}")
    axis %= data.ndim
    if idx.dtype.kind not in "iu":
        raise Unsupported(f"indices of dtype {idx.dtype}; expected int32 or int64")
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis):
        raise Unsupported(f"indices of shape {list(idx.shape)} exceed data of shape "
                          f"{list(data.shape)} off axis {axis}")
    n = data.shape[axis]
    wide = idx.astype(np.int64)
    if wide.size and (int(wide.min()) < -n or int(wide.max()) >= n):
        bad = int(wide.min()) if int(wide.min()) < -n else int(wide.max())
        raise Unsupported(f"index {bad} is out of range for axis {axis} of size {n}")
    corner = tuple(slice(None) if k == axis else slice(0, m) for k, m in enumerate(idx.shape))
    return [np.take_along_axis(data[corner], np.where(wide < 0, wide + n, wide), axis=axis)]


def _unsqueeze(node: OnnxNode, x: np.ndarray, axes: np.ndarray | None = None) -> list[np.ndarray]:
    picked = node.opt_ints("axes") if axes is None else \
        [int(a) for a in np.asarray(axes).reshape(-1)]
    rank = x.ndim + len(picked or [])
    chosen = sorted(a + rank if a < 0 else a for a in picked or [])
    if any(not 0 <= a < rank for a in chosen) or len(set(chosen)) != len(chosen):
        raise Unsupported(f"axes {picked} for an output of rank {rank}; expected distinct axes "
                          f"in [{-rank}, {rank})")
    shape = list(x.shape)
    for a in chosen:
        shape.insert(a, 1)
    return [x.reshape(shape)]


def fold_tile(node: OnnxNode, x: np.ndarray, repeats: np.ndarray) -> list[np.ndarray]:
    """Tile as one broadcast (x's axis d as (repeats, d)): it allocates the output only, where
    np.tile grows one axis at a time (repeats [1e8, 0] made 1.6 GB for an empty output)."""
    reps = [int(r) for r in repeats.reshape(-1)]  # checked by fold_size's size_tile
    split = x.reshape([n for d in x.shape for n in (1, d)])
    wide = np.broadcast_to(split, [n for d, r in zip(x.shape, reps) for n in (r, d)])
    return [wide.copy().reshape([d * r for d, r in zip(x.shape, reps)])]


def fold_expand(node: OnnxNode, x: np.ndarray, shape: np.ndarray) -> list[np.ndarray]:
    """Expand as one broadcast: the reference multiplies by ones of the target shape, which
    is larger than the output where x has a 0 dim."""
    from .fold_size import broadcast
    target = tuple(int(d) for d in shape.reshape(-1))
    out = broadcast([x.shape, target], "input 0 and input 1 (shape)")
    return [np.broadcast_to(x, out).copy()]


def fold_concat(node: OnnxNode, *xs: np.ndarray) -> list[np.ndarray]:
    rank = xs[0].ndim
    axis = int(node.attr("axis"))
    if not -rank <= axis < rank or any(x.ndim != rank for x in xs):
        raise Unsupported(f"axis {axis} for inputs of shapes {[list(x.shape) for x in xs]}")
    return [np.concatenate(xs, axis=axis)]


def fold_shape(node: OnnxNode, x: np.ndarray) -> list[np.ndarray]:
    dims = np.array(x.shape, dtype=np.int64)
    start = int(node.attr("start", 0))
    end = node.attr("end")
    return [dims[start:None if end is None else int(end)]]


def fold_cast(node: OnnxNode, x: np.ndarray) -> list[np.ndarray]:
    from .onnx_model import np_dtype
    return [x.astype(np_dtype(int(node.attr("to"))))]


def _constant(node: OnnxNode) -> list[np.ndarray] | None:
    """Constant's value from its dense attributes; None for sparse/string ones (reference)."""
    for name, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                        ("value_int", np.int64), ("value_ints", np.int64)):
        if name in node.attrs:
            return [np.asarray(node.attrs[name], dtype=dtype)]
    value = node.attrs.get("value", node.attrs.get("sparse_value"))
    return [value] if isinstance(value, np.ndarray) else None


def fold_identity(node: OnnxNode, x: np.ndarray) -> list[np.ndarray]:
    return [x]


def fold(node: OnnxNode, inputs: Sequence[np.ndarray | None], opset_imports: Any,
         expected: Sequence[tuple[int, ...] | None] = ()) -> list[Any]:
    """The node's outputs computed from constant inputs (None for an omitted optional input).

    expected: the output shapes ONNX shape inference found, where it found them; with the
    sizes fold_size predicts, they bound what folding may allocate.
    """
    if node.op_type in NOT_FOLDABLE or node.domain not in ("", "ai.onnx"):
        raise Unsupported(f"{node.op_type} cannot be folded")
    if node.op_type == "Constant":
        known = _constant(node)
        if known is not None:
            return known
    from .symdim import has_sym
    if any(x is not None and has_sym(np.asarray(x)) for x in inputs):
        from .fold_sym import fold_symbolic
        return fold_symbolic(node, inputs, opset_imports)
    check_fold_size(node, inputs, expected)
    try:
        # NOTE: folding computes what the node would at run time, where floating-point edges
        # are the model's own (T5's relative-position buckets take log(0) = -inf and cast it, in
        # the branch a Where then drops): NumPy's warnings about them would only alarm the user
        with np.errstate(all="ignore"):
            results = _evaluate(node, inputs, opset_imports)
    except MemoryError:
        raise Unsupported("folding it needs more memory than there is") from None
    check_folded(node, results, inputs)
    return results


def _evaluate(node: OnnxNode, inputs: Sequence[np.ndarray | None],
              opset_imports: Any) -> list[Any]:
    # Fast paths (OpFacts.fold, registered with each op's converter) for what PyTorch's exports
    # fold most (Shape -> Gather -> Unsqueeze -> Concat); anything else goes through the onnx
    # package's reference evaluator.
    from .convert import op_facts
    fast = op_facts(node.op_type).fold
    if node.op_type == "Tile" and node.opset < 6:
        fast = None  # Tile-1 takes (input, tiles, axis)
    if fast is not None and all(x is not None for x in inputs):
        return fast(node, *inputs)
    if node.op_type == "Unsqueeze" and inputs[0] is not None:
        return _unsqueeze(node, inputs[0], inputs[1] if len(inputs) > 1 else None)
    return _reference(node, inputs, opset_imports)


def _reference(node: OnnxNode, inputs: Sequence[np.ndarray | None], opset_imports: Any) -> list[Any]:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    names = [n for n in node.inputs]
    feeds = {name: x for name, x in zip(names, inputs) if name and x is not None}
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype),
                                                  None) for name, x in feeds.items()]
    graph_outputs = [helper.make_value_info(name, helper.TypeProto()) for name in node.outputs
                     if name]
    graph = helper.make_graph([node.proto], "fold", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=list(opset_imports))
    try:
        results = ReferenceEvaluator(model).run(None, feeds)
    except MemoryError:
        raise
    except Exception as e:
        raise Unsupported(f"folding it with the ONNX reference failed: {type(e).__name__}: "
                          f"{e}") from e
    out: list[Any] = []
    it = iter(results)
    for name in node.outputs:
        out.append(np.asarray(next(it)) if name else None)
    return out

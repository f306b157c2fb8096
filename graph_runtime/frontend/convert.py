"""The converter table: ONNX op type -> function lowering one node onto standard ops."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrontendError
from .ir import Builder, NeedsValue, Unsupported, Value
from .onnx_node import OnnxNode

Converter = Callable[["Context", OnnxNode, list], Sequence["Value | None"]]
CONVERTERS: dict[str, Converter] = {}


@dataclass(frozen=True)
class OpFacts:
    """What the import knows of an op besides its converter, registered beside it.

    shape_inputs: input slots whose value a converter reads at import to decide shapes or
    attrs (symbolic import keeps a folded constant changing with the dims there, as a
    `{"dim": ...}` attr). value_inputs: further slots that decide shapes or attributes
    (deferred import freezes the graph inputs reaching either kind). fold(node, *inputs): a
    fast path folding the op, instead of the ONNX reference. predict(node, inputs): the output
    shape folding makes, in Python integers, before it allocates (fold_size.py); workspace(node,
    inputs, shape): what the reference allocates on the way, where that is more than its output.
    """

    shape_inputs: tuple[int, ...] = ()
    value_inputs: tuple[int, ...] = ()
    fold: Callable[..., list[np.ndarray]] | None = None
    predict: Callable[[OnnxNode, list], tuple[int, ...]] | None = None
    workspace: Callable[[OnnxNode, list, tuple[int, ...]], list[tuple[Any, str, str]]] | None \
        = None


FACTS: dict[str, OpFacts] = {}
NO_FACTS = OpFacts()


def add_facts(op_type: str, **facts: Any) -> None:
    """Register op_type's OpFacts; a second, different record for one op type is refused."""
    made = OpFacts(**facts)
    earlier = FACTS.get(op_type)
    if earlier is not None and earlier != made:
        raise FrontendError(f"{op_type} has its facts registered twice: {earlier} and {made}; "
                            "register them once, beside its converter")
    FACTS[op_type] = made


def op_facts(op_type: str) -> OpFacts:
    """op_type's registered facts (none registered: every field empty)."""
    return FACTS.get(op_type, NO_FACTS)


class Context:
    """What a converter sees besides its node: the builder, use counts, opsets, pass notes."""

    def __init__(self, b: Builder, uses: Counter, opsets: dict[str, int]) -> None:
        self.b = b
        self.uses = uses
        self.opsets = opsets
        self.bn_folded = 0
        self.removed: Counter = Counter()
        # ONNX shape inference's static (shape, dtype) per value name, for outputs whose size
        # depends on the data (NonMaxSuppression): the import plans the shape the model states.
        self.expected: dict[str, tuple] = {}
        # ONNX value names computed by ops although their inputs are known at import: their
        # values follow symbolic dims (frontend/convert_dims.py, symbolic import only).
        self.unfold: frozenset[str] = frozenset()
        # Every value lowered so far by ONNX name, and the model: control flow's sub-graphs
        # read outer values by name and become models of their own (frontend/subgraph.py).
        self.scope: dict[str, Any] = {}
        self.model: Any = None
        # The probe size of each data-dependent output (NonZero's...), by ONNX value name
        # (frontend/convert_data_dependent.py).
        self.data_sizes: dict[str, int] = {}

    def used(self, name: str) -> bool:
        return bool(name) and self.uses[name] > 0

    def only_first_output(self, node: OnnxNode) -> None:
        """Refuse when an output after the first is read (Mean/InvStdDev, Indices, mask...)."""
        for name in node.outputs[1:]:
            if self.used(name):
                raise Unsupported(f"output {name!r} (output {node.outputs.index(name)}) is used; "
                                  "only the first output is supported")


def converts(*op_types: str, **facts: Any) -> Callable[[Converter], Converter]:
    """Register fn as the converter of op_types, with the OpFacts fields given (the same for
    each; add_facts beside it where they differ); a second converter for one op type is
    refused (which one won used to depend on import order)."""
    def add(fn: Converter) -> Converter:
        for op_type in op_types:
            earlier = CONVERTERS.get(op_type)
            if earlier is not None and earlier is not fn:
                raise FrontendError(f"{op_type} has two converters: {_where(earlier)} and "
                                    f"{_where(fn)}; register one (it may call the other)")
            CONVERTERS[op_type] = fn
            if facts:
                add_facts(op_type, **facts)
        return fn
    return add


def _where(fn: Converter) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def const_input(node: OnnxNode, args: list, i: int, what: str) -> np.ndarray | None:
    """Input i as an array known at import (None when omitted); refuse when it is computed."""
    if i >= len(args) or args[i] is None:
        return None
    value: Value = args[i]
    if value.const is None and value.known is not None:
        return value.known
    if value.const is None:
        raise NeedsValue(f"input {i} ({what}) must be a constant known at import; it is "
                          "computed at run time (a dynamic shape or value)")
    return value.const


def required_ints(node: OnnxNode, args: list, i: int, what: str) -> list[Any]:
    """Input i as ints (or symbolic dims) known at import; refuse when omitted or computed."""
    array = const_input(node, args, i, what)
    if array is None:
        raise Unsupported(f"input {i} ({what}) is missing")
    from .symdim import Sym
    # A shape-valued input may hold symbolic dims (frontend/symdim.py): kept as they are.
    values = [v if isinstance(v, Sym) else int(v) for v in np.asarray(array).reshape(-1)]
    if any(isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63 for v in values):
        # NOTE: a uint64 tensor where ONNX asks for int64; NumPy would overflow on it.
        raise Unsupported(f"input {i} ({what}) holds {values[:8]}; expected values within int64")
    return values


def ints_of(array: np.ndarray | None) -> list[int] | None:
    """array's items as ints (a symbolic dim among them: Undecidable, a number was needed)."""
    return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def norm_axis(axis: int, rank: int, node: OnnxNode, name: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"{name} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _load() -> None:
    # Each module registers its converters when imported.
    from . import (  # noqa: F401
        convert_composite,
        convert_control,
        convert_conv,
        convert_data_dependent,
        convert_detection,
        convert_einsum,
        convert_grid,
        convert_index,
        convert_math,
        convert_nn,
        convert_norm,
        convert_qdq,
        convert_qlinear,
        convert_quant,
        convert_recurrent,
        convert_resize,
        convert_sequence_ops,
        convert_shape,
        convert_signal,
    )
    from . import convert_integer_gemm, convert_scatter  # noqa: F401
    # Ops folded only through ONNX's reference (no converter): their facts here, in one place.
    from .fold_size import float64_copies, size_max_unpool, size_window
    for op_type, copies in (("HannWindow", 2), ("HammingWindow", 2), ("BlackmanWindow", 3)):
        add_facts(op_type, value_inputs=(0,), predict=size_window,
                  workspace=float64_copies(copies))
    add_facts("CenterCropPad", value_inputs=(1,))
    add_facts("MaxUnpool", predict=size_max_unpool)


_load()

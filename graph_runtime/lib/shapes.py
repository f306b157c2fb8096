"""Input checks every op family shares: dtype groups, input counts, ranks, broadcasting, strides."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .attrs import op_error
from .library import TensorSpec

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int32", "int64")
NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES


def check_num_inputs(op: str, inputs: Sequence[TensorSpec], n: int) -> None:
    if len(inputs) != n:
        raise op_error(op, f"takes {n} input(s), got {len(inputs)}")


def one_input(op: str, inputs: Sequence[TensorSpec]) -> TensorSpec:
    """The only input of a one-input op."""
    check_num_inputs(op, inputs, 1)
    return inputs[0]


def check_dtype(op: str, spec: TensorSpec, allowed: Sequence[str], what: str = "input 0") -> str:
    """spec.dtype when it is one of allowed; otherwise a LibraryError listing them."""
    if spec.dtype not in allowed:
        raise op_error(op, f"{what} has dtype {spec.dtype}; supported: {', '.join(allowed)}")
    return spec.dtype


def check_vector(op: str, inputs: Sequence[TensorSpec], index: int, name: str,
                 dtypes: Sequence[str], size: int) -> None:
    """A LibraryError unless input `index` (a table or per-column operand the import made) is a
    vector of `size` values of one of dtypes."""
    spec = inputs[index]
    if tuple(spec.shape) != (size,) or spec.dtype not in dtypes:
        raise op_error(op, f"input {index} ({name}) is {spec.dtype} {tuple(spec.shape)}; "
                           f"expected {' or '.join(dtypes)} ({size},)")


def check_same_dtype(op: str, inputs: Sequence[TensorSpec]) -> str:
    """The common dtype of all inputs (Relay does not promote)."""
    first = inputs[0].dtype
    for i, spec in enumerate(inputs[1:], start=1):
        if spec.dtype != first:
            raise op_error(op, f"input {i} has dtype {spec.dtype} but input 0 has {first}; "
                               "insert a cast")
    return first


def check_rank(op: str, spec: TensorSpec, ranks: Sequence[int], what: str = "input 0") -> int:
    if len(spec.shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise op_error(op, f"{what} has shape {tuple(spec.shape)} (rank {len(spec.shape)}); "
                           f"expected rank {want}")
    return len(spec.shape)


def broadcast_shape(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy's broadcast of shapes, or a LibraryError naming them."""
    if not all(isinstance(d, (int, np.integer)) for s in shapes for d in s):
        return _broadcast_symbolic(op, shapes)
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError as e:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise op_error(op, f"cannot broadcast input shapes {listed}") from e


def _broadcast_symbolic(op: str, shapes: Sequence[Sequence[object]]) -> tuple:
    """Broadcasting of dims that are not all ints (the importer's symbolic dims, which decide
    == themselves or raise): literal 1s first, so broadcast(seq, 1) is seq."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        rest = [d for d in dims if not (isinstance(d, (int, np.integer)) and d == 1)]
        for d in rest[1:]:
            if not d == rest[0]:
                listed = " and ".join(str(tuple(s)) for s in shapes)
                raise op_error(op, f"cannot broadcast input shapes {listed}")
        out.append(rest[0] if rest else 1)
    return tuple(out)


def size_of(shape: Sequence[int]) -> int:
    """The element count, exact (Python ints; np.prod cost 5 us a call, 1 ms a decode step)."""
    return math.prod(int(d) for d in shape)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of shape."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides that read a contiguous array of shape as out_shape (0 where broadcast)."""
    pad = len(out_shape) - len(shape)
    own = contiguous_strides(shape)
    return tuple(0 if i < pad or shape[i - pad] == 1 else own[i - pad]
                 for i in range(len(out_shape)))

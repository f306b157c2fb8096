"""shape_of (ONNX Shape as data): an entry's dims, written as int64 into the output."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import int_attr
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import one_input


def shape_of_dims(spec: TensorSpec, attrs: Mapping[str, Any]) -> np.ndarray:
    """The dims ONNX's Shape gives for spec (start/end as Python slices, clamped)."""
    start = int_attr("shape_of", attrs, "start", 0)
    end = int_attr("shape_of", attrs, "end", None)
    return np.array(spec.shape, dtype=np.int64)[start:end]


def _shape_of(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("shape_of", inputs)
    return [TensorSpec((len(shape_of_dims(spec, attrs)),), "int64")]


def _any_shape_of(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    # NOTE: a module is specialised for one set of shapes, so the dims are known when the kernel
    # is prepared; each run writes those few bytes (the input itself is never read).
    dims = shape_of_dims(inputs[0], attrs)
    return lambda x, out: backend.from_host(dims, out)


define_op("shape_of", _shape_of, 1, ("start", "end"))
for _backend in ("cpu", "cuda", "opencl"):
    kernel("shape_of", _backend)(_any_shape_of)

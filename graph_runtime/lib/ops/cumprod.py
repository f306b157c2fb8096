"""cumprod (ONNX CumProd): running products along an axis, optionally exclusive and/or reversed."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import bool_attr, single_axis
from ..kernels.host import wide_dtype
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import NUMERIC_DTYPES, check_dtype, check_rank, one_input


def _params(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, bool, bool]:
    return (single_axis("cumprod", attrs, "axis", len(spec.shape)),
            bool_attr("cumprod", attrs, "exclusive", False),
            bool_attr("cumprod", attrs, "reverse", False))


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("cumprod", inputs)
    check_dtype("cumprod", spec, NUMERIC_DTYPES)
    check_rank("cumprod", spec, range(1, 33))
    _params(spec, attrs)
    return [TensorSpec(tuple(spec.shape), spec.dtype)]


def _cpu_cumprod(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis, exclusive, reverse = _params(inputs[0], attrs)
    acc = wide_dtype(inputs[0].dtype)
    head = (slice(None),) * axis + (slice(0, 1),)
    shifted = (slice(None),) * axis + (slice(1, None),)
    dropped = (slice(None),) * axis + (slice(0, -1),)

    def run(x: Any, out: Any) -> None:
        y = np.flip(x, axis) if reverse else x
        total = np.cumprod(y, axis=axis, dtype=acc)
        if exclusive:
            # Each position gets the product before it: the inclusive products moved one on.
            moved = np.empty_like(total)
            moved[head] = 1
            moved[shifted] = total[dropped]
            total = moved
        np.copyto(out, np.flip(total, axis) if reverse else total, casting="unsafe")
    return run


define_op("cumprod", _infer, 1, ("axis", "exclusive", "reverse"))
kernel("cumprod", "cpu")(_cpu_cumprod)

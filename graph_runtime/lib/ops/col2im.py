"""col2im (ONNX Col2Im): sliding blocks (N, C * prod(block), L) summed back into an image."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import int_tuple, op_error
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import NUMERIC_DTYPES, check_dtype, size_of

ATTRS = ("image_shape", "block_shape", "dilations", "pads", "strides")


def _params(spec: TensorSpec, attrs: Mapping[str, Any]
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
                       tuple[int, ...], tuple[int, ...]]:
    """(image, block, dilations, pads_begin, strides, blocks per axis), checked against spec."""
    op = "col2im"
    image = tuple(int_tuple(op, attrs, "image_shape"))
    k = len(image)
    block = tuple(int_tuple(op, attrs, "block_shape", k))
    dilations = tuple(int_tuple(op, attrs, "dilations", k, (1,) * k))
    pads = tuple(int_tuple(op, attrs, "pads", 2 * k, (0,) * (2 * k)))
    strides = tuple(int_tuple(op, attrs, "strides", k, (1,) * k))
    if min(image + block + dilations + strides, default=1) < 1 or min(pads, default=0) < 0:
        raise op_error(op, f"image_shape {image}, block_shape {block}, dilations {dilations}, "
                           f"pads {pads}, strides {strides}: expected sizes >= 1, pads >= 0")
    blocks = tuple((image[i] + pads[i] + pads[i + k] - dilations[i] * (block[i] - 1) - 1)
                   // strides[i] + 1 for i in range(k))
    if len(spec.shape) != 3 or spec.shape[1] % size_of(block) or min(blocks) < 1 \
            or spec.shape[2] != size_of(blocks):
        raise op_error(op, f"input {spec} for image {image}, block {block}: expected (N, C * "
                           f"{size_of(block)}, {size_of(blocks)}) (blocks per axis {blocks})")
    return image, block, dilations, pads[:k], strides, blocks


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if len(inputs) != 1:
        raise op_error("col2im", f"takes 1 input, got {len(inputs)}")
    spec = inputs[0]
    check_dtype("col2im", spec, NUMERIC_DTYPES)
    image, block, _, _, _, _ = _params(spec, attrs)
    return [TensorSpec((spec.shape[0], spec.shape[1] // size_of(block)) + image, spec.dtype)]


def _cpu_col2im(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    image, block, dilations, pads, strides, blocks = _params(inputs[0], attrs)
    n, channels = outputs[0].shape[:2]
    # Per kernel offset: the image rows/columns its blocks land on, and which blocks land inside.
    # For one offset the blocks map to distinct pixels, so a fancy-indexed += adds each once.
    plan = []
    for offset in itertools.product(*(range(b) for b in block)):
        targets, kept = [], []
        for i, o in enumerate(offset):
            where = np.arange(blocks[i]) * strides[i] - pads[i] + o * dilations[i]
            ok = (where >= 0) & (where < image[i])
            targets.append(where[ok])
            kept.append(np.flatnonzero(ok))
        plan.append((np.ix_(*targets), np.ix_(*kept)))

    def run(x: Any, out: Any) -> None:
        cols = x.reshape((n, channels, len(plan)) + blocks)
        out[...] = 0
        for k, (target, kept) in enumerate(plan):
            out[(slice(None), slice(None)) + target] += cols[:, :, k][(slice(None),) * 2 + kept]
    return run


define_op("col2im", _infer, 1, ATTRS)
kernel("col2im", "cpu")(_cpu_col2im)

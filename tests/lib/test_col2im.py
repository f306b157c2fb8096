"""col2im (cpu) against a loop over blocks and kernel offsets, as ONNX's reference sums them."""
from __future__ import annotations

import itertools

import numpy as np
import pytest


def col2im_reference(x, image, block, dilations, pads, strides):
    k = len(image)
    blocks = [(image[i] + pads[i] + pads[i + k] - dilations[i] * (block[i] - 1) - 1)
              // strides[i] + 1 for i in range(k)]
    n, cb, _ = x.shape
    c = cb // int(np.prod(block))
    cols = x.reshape((n, c) + tuple(block) + tuple(blocks)).astype(np.float64)
    out = np.zeros((n, c) + tuple(image))
    for off in itertools.product(*(range(b) for b in block)):
        for pos in itertools.product(*(range(b) for b in blocks)):
            at = [p * s - pd + o * d for p, s, pd, o, d in zip(pos, strides, pads, off,
                                                                  dilations)]
            if all(0 <= a < size for a, size in zip(at, image)):
                out[(slice(None), slice(None)) + tuple(at)] += cols[
                    (slice(None), slice(None)) + off + pos]
    return out


@pytest.mark.parametrize("image,block,dilations,pads,strides", [
    ((5, 5), (2, 2), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((6, 7), (3, 2), (2, 1), (1, 0, 2, 1), (2, 1)),
    ((4, 3, 5), (2, 1, 3), (1, 1, 1), (0, 1, 0, 1, 0, 1), (1, 2, 2)),
])
def test_col2im(image, block, dilations, pads, strides, run_op, random_array,
                assert_close) -> None:
    k = len(image)
    blocks = [(image[i] + pads[i] + pads[i + k] - dilations[i] * (block[i] - 1) - 1)
              // strides[i] + 1 for i in range(k)]
    x = random_array((2, 3 * int(np.prod(block)), int(np.prod(blocks))), "float32", seed=k)
    (got,) = run_op("cpu", "col2im", [x], {"image_shape": list(image), "block_shape": list(block),
                                           "dilations": list(dilations), "pads": list(pads),
                                           "strides": list(strides)})
    assert_close(got, col2im_reference(x, image, block, dilations, pads, strides), "float32")

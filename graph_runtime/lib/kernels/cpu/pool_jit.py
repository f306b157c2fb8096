"""CPU 2-D max/avg pools through loops_jit's compiled loops, channel ranges split over workers."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import jit_setup, loops_jit
from ..threads import channel_split, chunk_bounds, parallel_items

# Below this many outputs one worker is faster: handing items to a second worker costs more
# than it saves (measured on 2 cores; docs/measurements.md).
SERIAL_OUTPUTS = 1 << 17


def pool2d_jit(dtype: str, shape: tuple[int, ...], out_shape: tuple[int, ...],
               kernel: tuple[int, ...], strides: tuple[int, ...], dilation: tuple[int, ...],
               begin: tuple[int, ...], inv: Any = None) -> Callable[[Any, Any], None]:
    """run(data, out) for an NCHW float32/float64 pool: avg pooling given inv, its (OH, OW)
    1 / divisor in dtype, else max pooling.

    Max pooling skips taps outside the data (padding never wins; a window with none gives the
    dtype's lowest value, as the padded NumPy path does).
    """
    n, c = shape[0], shape[1]
    is_max = inv is None
    chunks, workers = channel_split(n, c, int(np.prod(out_shape)), SERIAL_OUTPUTS)
    (kh, kw), (sh, sw), (dh, dw), (pt, pl) = kernel, strides, dilation, begin
    lowest = np.dtype(dtype).type(np.finfo(dtype).min)
    jit_setup.start()
    loops_jit.warm_pool(dtype, is_max)  # compile now, not in the first run

    def run(data: Any, out: Any) -> None:
        def item(worker: int, i: int) -> None:
            image, chunk = divmod(i, chunks)
            c0, c1 = chunk_bounds(c, chunks, chunk)
            if is_max:
                loops_jit.max_pool2d(data, out, image, c0, c1, kh, kw, sh, sw, dh, dw, pt, pl,
                                   lowest)
            else:
                loops_jit.avg_pool2d(data, out, inv, image, c0, c1, kh, kw, sh, sw, dh, dw, pt, pl)
        parallel_items(n * chunks, workers, item)
    return run

"""batch_flatten / flatten on CPU: a copy of (N, ...) into (N, rest), from NHWC bytes one reorder.

Taking its 4-D float32 input NHWC (runtime/layouts.py) lets the kernel before it (a oneDNN pool
or conv) write NHWC without a reorder of its own; then this copy is the reorder back to NCHW
order. Where its only reader can read the input directly, run() skips it altogether
(runtime/flatten_reads.py).
"""
from __future__ import annotations

from typing import Any, Collection

import numpy as np

from ...prepared import PreparedKernel
from ..address import address_of
from ..threads import parallel_items

# Up to this many elements NumPy's strided copy does the NHWC -> NCHW reorder faster than a
# oneDNN reorder called from here (its bind and run): the cnn example's (1, 32, 16, 16) 3.7
# against 10.6-27 us, (1, 2048, 1, 1) 0.4 against 3.9; even at (1, 512, 7, 7) (12.4 against 13.3
# us), past it oneDNN's ((1, 256, 14, 14): 48.6 against 53.3)
NUMPY_REORDER_ELEMENTS = 1 << 14


class Flatten(PreparedKernel):
    """run(data, out): out = data flattened after the batch axis."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape = shape
        self._nhwc_ok = len(shape) == 4 and dtype == "float32" and min(shape) > 0
        self._reorder: Any = None
        self._openmp = 1
        self._workers = 1

    def flattens(self) -> bool:
        return True

    def channels_last_positions(self) -> tuple[int, ...]:
        """The 4-D float32 input, where oneDNN (which keeps tensors NHWC) is here."""
        from ..onednn import binding as dn
        return (0,) if self._nhwc_ok and dn.available() else ()

    def use_channels_last(self, positions: Collection[int]) -> None:
        if 0 not in positions:
            return
        from ..onednn.layout import NCHW, NHWC, BandedReorder, bands
        from ..onednn.policy import policy
        n, c, h, w = self.shape
        if n * c * h * w <= NUMPY_REORDER_ELEMENTS:
            return  # NumPy's copy of the strided NCHW view (__call__)
        threads = policy()
        self._openmp, self._workers = threads.openmp, threads.workers
        # in the workers mode, bands for the workers (as a conv's own output reorder had)
        self._reorder = BandedReorder((n, c, h, w), NHWC, NCHW, bands(n, h, self._workers))

    def uses_workers(self) -> bool:
        """Its NHWC reorder is oneDNN's (OpenBLAS held at one thread beside it, as for the
        oneDNN kernels around it), in bands over the workers in their mode."""
        return self._reorder is not None

    def __call__(self, data: Any, out: Any) -> None:
        reorder = self._reorder
        if reorder is None:  # (data may be the strided NCHW view of NHWC bytes: one copy)
            np.copyto(out.reshape(data.shape), data)
            return
        from ..onednn import binding as dn
        dn.use_threads(self._openmp)
        reorder.bind(address_of(data), address_of(out))
        items = reorder.items
        if len(items) == 1:
            items[0].run()
            return
        parallel_items(len(items), self._workers, lambda worker, i: dn.run_on_worker(items[i]))

    def __repr__(self) -> str:
        return "Flatten(" + ("NHWC reorder" if self._reorder is not None else "copy") + ")"

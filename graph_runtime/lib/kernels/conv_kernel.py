"""ConvKernel: what every CPU conv2d strategy shares, the compiled ones and oneDNN's alike.

Below both CPU kernel families (kernels/cpu, kernels/onednn), so neither imports the other for it.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Sequence

import numpy as np

from ..conv_params import ConvParams
from .conv_epilogue import Epilogue
from .derived import DerivesFromInputs


class ConvKernel(DerivesFromInputs):
    """What the strategies share: epilogue, derived-weight freshness, workspace accounting.

    A strategy that derives data from its weight (and bias) lists those inputs in `derived`
    (derived.py redoes it when they change).
    """

    strategy = ""

    def __init__(self, p: ConvParams, epilogue: Epilogue) -> None:
        super().__init__()
        self.p = p
        self.epilogue = epilogue
        self._buffers: list[np.ndarray] = []

    def _alloc(self, shape: Sequence[int], fill: float | None = None) -> np.ndarray:
        """A workspace array made once at prepare time, counted by workspace_bytes()."""
        a = np.zeros(tuple(shape), self.p.dtype) if fill is None else np.full(
            tuple(shape), fill, self.p.dtype)
        self._buffers.append(a)
        return a

    def workspace_bytes(self) -> int:
        """im2col columns, padded images, transformed weights: everything kept between runs."""
        return sum(int(a.nbytes) for a in self._buffers)

    def uses_workers(self) -> bool:
        return True

    @abstractmethod
    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        """run(data, weight, *epilogue operands, out): out = epilogue(conv(data, weight))."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.strategy})"

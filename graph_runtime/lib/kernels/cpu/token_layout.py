"""Tokens <-> images in one copy: the transpose + reshape pairs vision transformers export, and
the NCHW <-> NHWC permutes ConvNeXt wraps its LayerNorm and MLP in.

SegFormer, ConvNeXt and the like turn (N, H*W, C) tokens into an (N, C, H, W) image for a conv
and back: transpose(0, 2, 1) then reshape, or reshape then transpose(0, 2, 1). Run as ops, each
pair is two passes, the transpose a strided copy. Here it is one copy through views; and when
runtime/layouts.py keeps the image side channels-last (its conv neighbour is oneDNN's), the
tokens are that image's NHWC bytes already, so the copy runs in memory order, as a memcpy. A
permute (0, 2, 3, 1) or (0, 3, 1, 2) of an image is the same copy with the tokens 4-D.

Where the image side is NHWC, a chain led by such a copy reads the tokens as a view of those
bytes instead (read_as_view), and a permute with one binary op around it (ConvNeXt's residual
adds) is one NumPy pass in memory order (PermutedBinary).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

import numpy as np

from ...prepared import PreparedKernel


def token_layout(ops: Sequence[str], axes: Any, shapes: Sequence[tuple[int, ...]]) -> str | None:
    """"to_image" or "to_tokens" when two chain ops are such a pair, else None.

    shapes: the first op's input, its output, the second op's output.
    """
    source, middle, result = (tuple(s) for s in shapes)
    if len(source) != len(result) - 1 and len(source) != len(result) + 1:
        return None
    swap = axes is not None and [int(a) % 3 for a in axes] == [0, 2, 1]
    if list(ops) == ["transpose", "reshape"] and swap and len(source) == 3 and len(result) == 4:
        n, length, c = source
        if middle == (n, c, length) and result[:2] == (n, c) and result[2] * result[3] == length:
            return "to_image"
    if list(ops) == ["reshape", "transpose"] and swap and len(source) == 4 and len(result) == 3:
        n, c, h, w = source
        if middle == (n, c, h * w) and result == (n, h * w, c):
            return "to_tokens"
    return None


class TokenLayoutCopy(PreparedKernel):
    """run(source, out) for one such pair, its image side (N, C, H, W)."""

    def __init__(self, direction: str, image: tuple[int, int, int, int]) -> None:
        self.direction = direction
        self.image = image

    def _nchw_view_of_tokens(self, tokens: Any) -> Any:
        n, c, h, w = self.image
        return np.reshape(tokens, (n, h, w, c)).transpose(0, 3, 1, 2)

    def __call__(self, source: Any, out: Any) -> None:
        if self.direction == "to_image":
            np.copyto(out, self._nchw_view_of_tokens(source))
        else:
            np.copyto(self._nchw_view_of_tokens(out), source)

    def channels_last_positions(self) -> tuple[int, ...]:
        """The image side may be an NHWC array (the copy then runs in memory order)."""
        return (1,) if self.direction == "to_image" else (0,)

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: the views above read any strides."""

    def read_as_view(self) -> Callable[[Any], Any] | None:
        """to_tokens: the tokens as a view of an NHWC image's bytes (contiguous), which a
        chain uses instead of the copy when told its image is NHWC; None for to_image."""
        if self.direction != "to_tokens":
            return None
        n, c, h, w = self.image
        return lambda image: image.transpose(0, 2, 3, 1).reshape(n, h * w, c)

    def __repr__(self) -> str:
        return f"TokenLayoutCopy({self.direction}, image {self.image})"


PERMUTES = {(0, 2, 3, 1): 0, (0, 3, 1, 2): 1}  # axes -> the image's argument position


def permute_layout(axes: Any, rank: int) -> tuple[int, int, int, int] | None:
    """The axes when a transpose moves channels last or back on a 4-D image, else None."""
    if axes is None or rank != 4:
        return None
    norm = tuple(int(a) % 4 for a in axes)
    return norm if norm in PERMUTES else None  # type: ignore[return-value]


class PermuteCopy(PreparedKernel):
    """run(source, out) for a transpose moving an image's channels last, or back."""

    def __init__(self, axes: tuple[int, int, int, int]) -> None:
        self.axes = axes

    def __call__(self, source: Any, out: Any) -> None:
        np.copyto(out, source.transpose(self.axes))

    def channels_last_positions(self) -> tuple[int, ...]:
        """The image side may be an NHWC array: the copy then runs in memory order."""
        return (PERMUTES[self.axes],)

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: NumPy's transpose reads any strides."""

    def read_as_view(self) -> Callable[[Any], Any] | None:
        """(0, 2, 3, 1): the permuted image as a view of its NHWC bytes (contiguous), which a
        chain uses instead of the copy when told its image is NHWC; None for the way back."""
        if PERMUTES[self.axes] != 0:
            return None
        axes = self.axes
        return lambda image: image.transpose(axes)

    def __repr__(self) -> str:
        return f"PermuteCopy({self.axes})"


class PermutedBinary(PreparedKernel):
    """run(a, b, out) = op(a, b, out) with the operand at `permuted` read through a channel
    permute (axes), for one NumPy binary op, in one pass with no intermediate:
    - a chain's permute and then the op taking its result first (ConvNeXt's permute back to
      the image and its residual add): the source permuted;
    - a chain's permute to the image, the op with an image, and the permute back (a stage's
      last residual add, before the next stage's LayerNorm): the op on the tokens, the image
      permuted to them.
    `images`: the positions holding images, which may be NHWC (runtime/layouts.py); with the
    permuted operand's bytes in the others' order, NumPy walks the three arrays in memory
    order."""

    def __init__(self, name: str, op: Callable[..., None], permuted: int,
                 axes: tuple[int, int, int, int], images: tuple[int, ...]) -> None:
        self.name = name
        self.op = op
        self.permuted = permuted
        self.axes = axes
        self.images = images

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        if self.permuted == 0:
            self.op(a.transpose(self.axes), b, out)
        else:
            self.op(a, b.transpose(self.axes), out)

    def channels_last_positions(self) -> tuple[int, ...]:
        return self.images

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: NumPy reads and writes any strides."""

    def note(self) -> str:
        return f"one pass: {self.name} with operand {self.permuted} permuted {self.axes}"

    def __repr__(self) -> str:
        return f"PermutedBinary({self.name}, operand {self.permuted} permuted {self.axes})"

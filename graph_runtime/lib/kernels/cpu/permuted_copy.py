"""A chain of reshapes and transposes as one copy: the permutation of axes it amounts to.

MobileViT unfolds an image into patches as reshape, transpose, reshape, transpose, reshape
(and folds them back the same way). Run op by op, each transpose is a strided copy into an
intermediate and the last reshape copies again into the output. But any such chain moves whole
runs of elements: cut the input's axes into "atoms" finely enough that every reshape only
merges or splits atoms, and the chain is one transpose of the input viewed as its atoms, copied
once into the output viewed as its atoms (here: (1, 64, 32, 32) viewed as (1, 64, 2, 16, 2,
16) and permuted to (1, 16, 16, 2, 2, 64) is the (4, 256, 64) tokens).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...prepared import PreparedKernel

# (op, its output shape, its axes for a transpose)
LayoutOp = tuple[str, tuple[int, ...], tuple[int, ...] | None]


def atom_permutation(shape: Sequence[int], ops: Sequence[LayoutOp]
                     ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """(input atoms, permutation, output atoms) with out.reshape(output atoms) equal to
    x.reshape(input atoms).transpose(permutation) after ops on x of shape; None where a
    reshape cuts an atom at a size that does not divide it (no such view exists)."""
    sizes = [int(d) for d in shape]  # by atom: at first, one per input axis
    order = list(range(len(sizes)))  # the atoms in the input's memory order
    dims = [[atom] for atom in order]  # the current tensor's dims, each a run of atoms
    for op, out_shape, axes in ops:
        if op == "transpose":
            assert axes is not None
            dims = [dims[a] for a in axes]
            continue
        flat = [a for dim in dims for a in dim if sizes[a] != 1]
        dims = []
        for want in out_shape:
            dim: list[int] = []
            left = int(want)
            while left > 1:
                if not flat:
                    return None
                atom = flat[0]
                if sizes[atom] <= left:
                    if left % sizes[atom]:
                        return None
                    left //= sizes[atom]
                    dim.append(flat.pop(0))
                    continue
                if sizes[atom] % left:
                    return None
                # cut the atom: its outer part (size left) ends this dim, the rest stays
                outer, inner = len(sizes), len(sizes) + 1
                sizes += [left, sizes[atom] // left]
                at = order.index(atom)
                order[at:at + 1] = [outer, inner]
                flat[0] = inner
                dim.append(outer)
                left = 1
            dims.append(dim)
        if flat:
            return None
    out_order = [a for dim in dims for a in dim if sizes[a] != 1]
    kept = [a for a in order if sizes[a] != 1]
    if sorted(out_order) != sorted(kept):
        return None
    return _merged(kept, out_order, sizes)


def _merged(order: list[int], out_order: list[int], sizes: list[int]
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Atoms next to each other in both orders made one (fewer, longer axes to copy)."""
    runs: list[list[int]] = []  # runs of atoms, in the output's order
    for atom in out_order:
        if runs and order.index(atom) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(atom)
        else:
            runs.append([atom])
    by_input = sorted(range(len(runs)), key=lambda r: order.index(runs[r][0]))
    size = [int(np.prod([sizes[a] for a in run])) for run in runs]
    return (tuple(size[r] for r in by_input),
            tuple(by_input.index(r) for r in range(len(runs))), tuple(size))


class PermutedCopy(PreparedKernel):
    """run(x, out): a reshape/transpose chain as one copy (atom_permutation)."""

    def __init__(self, atoms_in: tuple[int, ...], perm: tuple[int, ...],
                 atoms_out: tuple[int, ...]) -> None:
        self.atoms_in, self.perm, self.atoms_out = atoms_in, perm, atoms_out

    def __call__(self, x: Any, out: Any) -> None:
        np.copyto(out.reshape(self.atoms_out), x.reshape(self.atoms_in).transpose(self.perm))

"""Which batch_flatten steps run() skips, their one reader reading the flattened entry's source.

A flatten copies an (N, C, H, W) entry into an (N, C*H*W) one. Its only reader can read the
source's storage instead: the same bytes when the source is NCHW; when layouts.py keeps it
NHWC, its bytes flattened in NHWC order, read by a variant of the reader that takes them so
(PreparedKernel.reading_nhwc: a dense with its weight rows permuted). Only run() takes this
shortcut: run_steps (profile, debug_get_outputs) runs every node as written, so each node's
outputs and times there are its own, the flatten's output included. Neither entry is a graph
input or output or aliased, and nothing writes the source's storage id after the flatten and
before the reader (graph/liveness.py), so the source still holds its value when the reader
runs; the storage plan is unchanged. A reader output planned into the source's storage (its
last reader was the flatten) is written to a buffer of its own first, then copied there
(StagedOutputs): a dense's (N, units) output, small beside its (N, C*H*W) input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..device import Device
from ..graph.model import Graph
from ..lib.kernels import replay
from ..lib.prepared import PreparedKernel, Wrapping, capabilities
from .steps import PreparedCall


@dataclass(frozen=True)
class FlattenRead:
    """run() skips step `flatten`; step `reader` runs `kernel` with `source` at `position`,
    staging its outputs at positions `staged` (they share the source's storage)."""

    flatten: int
    reader: int
    position: int
    source: int
    kernel: PreparedKernel
    staged: tuple[int, ...]


def plan_flatten_reads(graph: Graph, steps: Sequence[PreparedCall],
                       entry_device: Sequence[Device], excluded: set[int], nhwc: set[int],
                       storage_ids: Sequence[int], skipped: Collection[int] = ()
                       ) -> list[FlattenRead]:
    """The flatten steps run() may skip; excluded: graph inputs, outputs and aliased entries;
    storage_ids: the executor's per entry (the graph's, with runtime/in_place.py's moves);
    skipped: the steps run() skips already (reshapes written in place)."""
    readers: dict[int, list[tuple[int, int]]] = {}
    for index, step in enumerate(steps):
        for pos, (eid, _, _) in enumerate(step.arg_keys[:step.num_inputs]):
            readers.setdefault(eid, []).append((index, pos))
    found = []
    # the graph's lives over the executor's storage ids, to see who writes the source's id
    live = graph.liveness.with_storage_ids(storage_ids)
    for index, step in enumerate(steps):
        if step.is_copy or not step.kernel.flattens() or len(step.arg_keys) != 2:
            continue
        (source, dev, flat_in), (target, _, flat_out) = step.arg_keys
        if (flat_in or flat_out or dev != entry_device[source] or dev.kind != "cpu"
                or {source, target} & excluded or live.aliased(source) or live.aliased(target)):
            continue
        use = readers.get(target, [])
        if len(use) != 1:
            continue
        reader_index, position = use[0]
        reader = steps[reader_index]
        # (a reader skipped itself, a reshape written in place or a flatten found here, would
        # hand on storage that nothing wrote)
        if (reader.is_copy or reader.device != dev or reader_index in skipped
                or reader.kernel.flattens() or reader.arg_keys[position][2]
                or live.written_between(source, step.nid, reader.nid - 1)):
            continue
        sid = storage_ids[source]
        staged = tuple(pos for pos in range(reader.num_inputs, len(reader.arg_keys))
                       if storage_ids[reader.arg_keys[pos][0]] == sid)
        kernel: PreparedKernel | None = reader.kernel
        shape = tuple(graph.shape(source))
        # NHWC bytes in another order than NCHW's need a reader that takes them so; with one
        # channel or one pixel (a global pool's output) the orders agree
        if source in nhwc and shape[1] > 1 and shape[2] * shape[3] > 1:
            kernel = reader.kernel.reading_nhwc(position, shape)
        if kernel is None:
            continue
        found.append(FlattenRead(index, reader_index, position, source, kernel, staged))
    return found


def flat_source(array: Any, nhwc: bool) -> Any:
    """The source entry's bytes as (N, rest) rows, a view: in NHWC order when it is kept NHWC
    (array is then the strided NCHW view of them, layouts.nhwc_view); None when its bytes are
    not contiguous (a reshape would copy them once, here, and the reader read a stale copy)."""
    if nhwc:
        array = array.transpose(0, 2, 3, 1)
    if not array.flags.c_contiguous:
        return None
    return array.reshape(array.shape[0], -1)


class StagedOutputs(Wrapping):
    """run(*arrays): kernel's run with the outputs at some positions written to buffers of their
    own, then copied into the arrays given there."""

    def __init__(self, kernel: Any, shapes: Mapping[int, tuple[tuple[int, ...], str]]) -> None:
        self.kernel = kernel
        self.inner = capabilities(kernel)
        self.buffers = {pos: np.empty(shape, dtype) for pos, (shape, dtype) in shapes.items()}

    def __call__(self, *arrays: Any) -> None:
        args = list(arrays)
        for pos, buffer in self.buffers.items():
            args[pos] = buffer
        recording = None if replay.active is None else replay.active.here()
        if recording is not None:
            self._recorded(recording, arrays, args)
            return
        self.kernel(*args)
        for pos, buffer in self.buffers.items():
            np.copyto(arrays[pos], buffer)

    def _recorded(self, recording: Any, arrays: tuple[Any, ...], args: list[Any]) -> None:
        """The call while a replay records (lib/kernels/replay.py): vouched for where the
        kernel vouched for its own and each copy out was recorded."""
        whole = replay.vouched(self.kernel, *args)
        for pos, buffer in self.buffers.items():
            if not recording.copy(arrays[pos], buffer):
                whole = False
            np.copyto(arrays[pos], buffer)
        if whole:
            replay.whole_call(self)

    def workspace_bytes(self) -> int:
        return self.inner.workspace_bytes() + sum(int(b.nbytes) for b in self.buffers.values())

    def workspace_items(self) -> list[tuple[Any, int]]:
        own = sum(int(b.nbytes) for b in self.buffers.values())
        return ([(self, own)] if own else []) + self.inner.workspace_items()

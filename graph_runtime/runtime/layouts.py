"""Which CPU entries hold channels-last (NHWC) bytes between kernels that write and read them so.

oneDNN's convolutions run on NHWC data; handed NCHW arrays, each reorders its data in and its
output back (half of a MobileNetV2 depthwise conv's time). Here an entry stays NHWC when the
kernel writing it and every kernel reading it can take NHWC (PreparedKernel.
channels_last_positions, or layout_free_positions: a ufunc, which never makes an entry NHWC by
itself), and nothing else sees it: not a graph input or output (set_input,
get_output and zero copy stay in the user's layout), not read by a copy, not flattened, not
aliased by a `__nop` or a dropped copy. Such an entry keeps its storage id and its bytes (NHWC
and NCHW take the same), so the storage plan and its liveness check hold unchanged; every
step is handed the strided NCHW view of its NHWC bytes (`array.reshape(n, h, w, c)
.transpose(0, 3, 1, 2)`), which reads correctly anywhere (debug_get_outputs included), and the
kernels are told once (use_channels_last) so they skip their reorders.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..device import Device
from ..graph.model import Graph
from .steps import PreparedCall

NHWC_DTYPES = ("float32", "uint8", "int8")  # oneDNN's float32 and int8 kernels (int8_conv.py)


@dataclass
class LayoutPlan:
    """NHWC entries, and per step index the argument positions that hold them."""

    entries: set[int] = field(default_factory=set)
    positions: dict[int, set[int]] = field(default_factory=dict)


def plan_channels_last(graph: Graph, steps: Sequence[PreparedCall],
                       entry_device: Sequence[Device], excluded: set[int]) -> LayoutPlan:
    """The entries to keep NHWC; excluded: graph inputs, outputs and aliased entries."""
    needing = [set(step.kernel.channels_last_positions()) if not step.is_copy else set()
               for step in steps]
    # a layout-free position (a ufunc's) takes NHWC too, but no entry is kept NHWC for them
    offered = [can | set(step.kernel.layout_free_positions()) if not step.is_copy else set()
               for step, can in zip(steps, needing)]
    # the entries some kernel needing NHWC offers to take: only their writers and readers matter
    shapes = graph.attrs["shape"][1]
    candidates = {eid for step, can in zip(steps, needing) for pos in can
                  for eid in (step.arg_keys[pos][0],)
                  if len(shapes[eid]) == 4 and eid not in excluded}
    if not candidates:
        return LayoutPlan()  # a transformer's steps (a decoder plans this every step)
    writers: dict[int, list[tuple[int, int, bool]]] = {}  # eid -> (step, position, can)
    readers: dict[int, list[tuple[int, int, bool]]] = {}
    for index, (step, can) in enumerate(zip(steps, offered)):
        for pos, (eid, dev, flatten) in enumerate(step.arg_keys):
            if eid not in candidates:
                continue
            ok = pos in can and not flatten and dev == entry_device[eid]
            (readers if pos < step.num_inputs else writers).setdefault(eid, []).append((index, pos, ok))
    plan = LayoutPlan()
    for eid, written in writers.items():
        read = readers.get(eid, [])
        if (graph.liveness.aliased(eid) or not read  # candidates: 4-D, not excluded
                or entry_device[eid].kind != "cpu" or graph.dtype(eid) not in NHWC_DTYPES):
            continue
        uses = written + read
        if len(written) != 1 or not all(ok for _, _, ok in uses):
            continue
        plan.entries.add(eid)
        for index, pos, _ in uses:
            plan.positions.setdefault(index, set()).add(pos)
    return plan


def nhwc_view(array: Any) -> Any:
    """The NCHW-indexed view of a C-contiguous 4-D array's bytes read as NHWC."""
    n, c, h, w = array.shape
    return array.reshape(n, h, w, c).transpose(0, 3, 1, 2)

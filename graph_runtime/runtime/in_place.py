"""Which kernel outputs take the storage of an input they may overwrite (written in place).

oneDNN's conv adds a residual into its output (its sum post-op): handed two arrays, it first
copies the residual into the output, 16 copies and about 4% of ResNet-50's time. Given the
residual's own array as its output it adds in place. A kernel declares it per pair of argument
positions (PreparedKernel.in_place_positions); in_place_offers keeps the pairs (R, O) where R's
value dies there: this node reads R last and only once, and R and O are plain values of this
device (no graph input, param or output, nothing aliasing them, not read through a copy or
flattened), with R's shape, dtype and layout. plan_in_place then gives O the storage id of R.

The graph's storage plan gives R's storage id to other entries once R is dead, often at the
very next node (a ResNet's blocks alternate two ids), while O still lives. Then, from this node
on, the entries of R's id and of O's id trade ids: O's own id is free from the moment O moved
out of it, and R's id from the moment R died, so the traded entries keep their lives apart
(runtime/storage_check.py checks the result). An entry moves only into an id whose buffer
already holds its bytes, so nothing is allocated and the pool's byte counts stay the graph's.
A reshape-like kernel (reshape, squeeze, expand_dims: PreparedKernel.reshapes) offers its
output over its input in a static module: taken, its output's view holds the input's bytes
already and run() skips it (GPT-2's Conv1D layers reshape around every product, 34 us of a
500 us run in copies); a symbolic module's specialisations offer none (derive and retarget
refuse a node a setup pass decided on, and a decoder's mask reshapes move with every length).
This is part of the executor's storage plan, made before the pool is allocated: every view is
made once, over its final id. The graph itself is unchanged (a graph written back is TVM's).
Debug outputs stay right: they are copied right after their node runs, before a later write.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from ..device import Device
from ..graph.model import Graph, entry_bytes
from .steps import PreparedCall


@dataclass
class InPlacePlan:
    """Entries given another storage id, and the (input eid, output eid) pairs written in place."""

    moves: dict[int, int] = field(default_factory=dict)
    pairs: list[tuple[int, int]] = field(default_factory=list)


class Offer(NamedTuple):
    """At node nid, output entry O (o_eid) may be written over input entry R (r_eid), which
    dies there."""

    nid: int
    r_eid: int
    o_eid: int


def in_place_offers(graph: Graph, steps: Sequence[PreparedCall], entry_device: Sequence[Device],
                    excluded: set[int], channels_last: set[int], reshapes: bool = True
                    ) -> list[Offer]:
    """The pairs the steps' kernels declare (in_place_positions) that may go in place.

    Args:
        excluded: graph inputs, outputs and entries aliased by the executor (dropped copies).
        channels_last: the entries kept NHWC (runtime/layouts.py): R and O must agree.
        reshapes: whether reshape-like kernels' pairs are offered (a static module's, on
            the host: no GPU run has checked a GPU pool's views of one id alias).
    """
    offers = []
    for step in steps:
        if step.is_copy or (step.kernel.reshapes() and (not reshapes
                                                          or step.device.kind != "cpu")):
            continue
        for out_pos, in_pos in sorted(step.kernel.in_place_positions().items()):
            pair = _pair(graph, step, out_pos, in_pos, entry_device, excluded, channels_last)
            if pair is not None:
                offers.append(Offer(step.nid, *pair))
    return offers


def plan_in_place(graph: Graph, offers: Sequence[Offer], storage_ids: Sequence[int],
                  sid_bytes: dict[int, int], excluded: set[int]) -> InPlacePlan:
    """The offers taken, in node order, and the storage id moves that make them safe.

    Args:
        storage_ids: per entry, the graph's ids (not changed; the plan's moves apply on top).
        sid_bytes: bytes allocated per storage id.
        excluded: as for in_place_offers.
    """
    sids = list(storage_ids)
    plan = InPlacePlan()
    for offer in offers:
        pair = (offer.r_eid, offer.o_eid)
        moves = _moves(graph, offer.nid, pair, sids, sid_bytes, excluded)
        if moves is None:
            continue
        for eid, sid in moves.items():
            sids[eid] = sid
            plan.moves[eid] = sid
        plan.pairs.append(pair)
    return plan


def _pair(graph: Graph, step: PreparedCall, out_pos: int, in_pos: int,
          entry_device: Sequence[Device], excluded: set[int], channels_last: set[int]
          ) -> tuple[int, int] | None:
    """(R, O) when output O may take input R's storage at this step, else None."""
    live = graph.liveness
    n_in = step.num_inputs
    r_eid, r_dev, r_flat = step.arg_keys[in_pos]
    o_eid, o_dev, o_flat = step.arg_keys[out_pos]
    if in_pos >= n_in or out_pos < n_in or r_flat or o_flat:
        return None
    if r_dev != entry_device[r_eid] or o_dev != entry_device[o_eid] or r_dev != o_dev:
        return None  # read through a copy, or on another device
    reads = [key[0] for key in step.arg_keys[:n_in]]
    if reads.count(r_eid) != 1 or o_eid in reads or live.last_read[r_eid] != step.nid:
        return None  # read again: by this node at another position, or later
    for eid in (r_eid, o_eid):
        if eid in excluded or live.held(eid) or live.aliased(eid):
            return None
    # a reshape's output holds its input's bytes in another shape (run() then skips it)
    same = entry_bytes(graph.shape(r_eid), graph.dtype(r_eid)) == entry_bytes(
        graph.shape(o_eid), graph.dtype(o_eid)) if step.kernel.reshapes() else \
        tuple(graph.shape(r_eid)) == tuple(graph.shape(o_eid))
    if (not same or graph.dtype(r_eid) != graph.dtype(o_eid)
            or (r_eid in channels_last) != (o_eid in channels_last)):
        return None
    return r_eid, o_eid


def _moves(graph: Graph, nid: int, pair: tuple[int, int], sids: list[int],
           sid_bytes: dict[int, int], excluded: set[int]) -> dict[int, int] | None:
    """{eid: new storage id}: O into R's id, and where another entry takes R's id while O
    lives, the two ids' entries written after this node traded; None when one of those is a
    graph output or an alias, or would not fit."""
    live = graph.liveness
    r_eid, o_eid = pair
    r_sid, o_sid = sids[r_eid], sids[o_eid]
    later = [e for e in live.roots if live.start[e] > nid and sids[e] in (r_sid, o_sid)]
    moves = {o_eid: r_sid}
    if not any(sids[e] == r_sid and live.start[e] <= live.end[o_eid] for e in later):
        return moves
    for eid in later:
        new = o_sid if sids[eid] == r_sid else r_sid
        if (eid in excluded or live.aliased(eid)
                or entry_bytes(graph.shape(eid), graph.dtype(eid)) > sid_bytes[new]):
            return None
        moves[eid] = new
    return moves

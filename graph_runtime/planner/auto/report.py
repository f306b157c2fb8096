"""AutoPlan: what automatic placement chose and why (per-node times, copies, alternatives)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..._text import fmt_bytes, table
from ...device import Device
from ...errors import PlanError
from ...graph.model import COPY_OP, Graph, entry_bytes
from ..constraints import Placement
from ..result import PlanResult
from .calibrate import Calibration
from .cost_cache import CopyModel
from .confirm import DefaultCheck
from .cost_problem import CostProblem


@dataclass(frozen=True)
class NodeCost:
    """One node of the report: where it runs and its measured seconds on each device."""

    nid: int
    name: str
    func_name: str
    device: Device
    seconds: dict[Device, float | None]  # None: not allowed there (no kernel, or a pin)
    # (device of the kernel before it, its device) -> what it loses after that switch
    after: dict[tuple[Device, Device], float] = field(default_factory=dict)


@dataclass(frozen=True)
class PredictedCopy:
    """A copy the plan needs: the entry (producer name:index), its devices, bytes, seconds."""

    entry: str
    src: Device
    dst: Device
    nbytes: int
    seconds: float


@dataclass
class AutoPlan:
    """The planned graph and why: per-node costs, copies, predicted total and alternatives."""

    plan: PlanResult
    graph: Graph  # the graph that was placed (its __copy nodes dropped)
    devices: list[Device]
    nodes: list[NodeCost]
    copies: list[PredictedCopy]
    predicted: float
    alternatives: dict[Device, float | None]  # everything on one device; None: not possible
    method: str
    kernels_measured: int
    copies_measured: int
    stage_seconds: dict[str, float] = field(default_factory=dict)
    placement: Placement = field(default_factory=Placement)  # every node pinned: the plan
    problem: CostProblem | None = None  # what the solver saw (bench/ reuses it)
    copy_models: dict[tuple[Device, Device], CopyModel] = field(default_factory=dict)
    calibrations: list[Calibration] = field(default_factory=list)  # factors applied per device
    # the solver's plan against the default one, run end to end (None: one device, or symbolic)
    check: DefaultCheck | None = None

    def predict_graph(self, planned: Graph) -> float:
        """This plan's cost model applied to another plan of the same graph.

        planned's nodes other than copies must be this graph's nodes in the same order (as
        plan_graph keeps them): nodes are matched by position, since imported graphs repeat
        names (one fused function name for many convs of different shapes).
        """
        kernels, copies, switches, _ = self.price(planned)
        return kernels + copies + switches

    def price(self, planned: Graph) -> tuple[float, float, float, int]:
        """(kernel seconds, copy seconds, switch seconds, switches) of a plan of this graph."""
        per_node = {n.nid: n for n in self.nodes}
        codes = planned.column("device_index")
        ids = planned.column("device_id")

        def device_of(eid: int) -> Device:
            if codes is None:
                return self.devices[0]
            return Device(codes[eid], ids[eid] if ids is not None else 0)

        originals = iter(self.graph.nodes)
        kernels = copies = switches = 0.0
        count = 0
        previous: Device | None = None
        for node in planned.nodes:
            if node.func_name == COPY_OP:
                src = planned.entry_id(node.inputs[0][0], node.inputs[0][1])
                dev = device_of(planned.node_row_ptr[node.nid])
                model = self.copy_models.get((device_of(src), dev))
                if model is not None:
                    copies += model.seconds(entry_bytes(planned.shape(src), planned.dtype(src)))
                continue
            original = next(originals, None)
            if original is None or original.name != node.name:
                raise PlanError(f"node {node.nid} {node.name!r} of the planned graph is not node "
                                + (f"{original.nid} {original.name!r}" if original else "past the "
                                   "end") + " of the graph this plan placed; predict_graph needs "
                                "a plan of the same graph")
            cost = per_node.get(original.nid)
            if cost is None:
                continue  # an input, a param or a __nop: free
            dev = device_of(planned.node_row_ptr[node.nid])
            seconds = cost.seconds.get(dev)
            if seconds is None:
                raise PlanError(f"{node.name!r}: no measured time on {dev.spec}")
            kernels += seconds
            if previous is not None and previous != dev:
                switches += cost.after.get((previous, dev), 0.0)
                count += 1
            previous = dev
        if next(originals, None) is not None:
            raise PlanError("the planned graph has fewer nodes than the graph this plan placed; "
                            "predict_graph needs a plan of the same graph")
        return kernels, copies, switches, count

    def text(self) -> str:
        """The report as tables for people."""
        specs = [d.spec for d in self.devices]
        rows = []
        for n in self.nodes:
            cells = [_ms(n.seconds[d]) for d in self.devices]
            rows.append([str(n.nid), n.name, n.device.spec, *cells])
        lines = ["nodes (ms per run on each device)",
                 table(["nid", "node", "device", *specs], rows)]
        if self.copies:
            lines.append("copies")
            lines.append(table(["entry", "from", "to", "bytes", "ms"],
                               [[c.entry, c.src.spec, c.dst.spec, fmt_bytes(c.nbytes),
                                 f"{c.seconds * 1e3:.3f}"] for c in self.copies]))
        label = "auto (" + self.method + ")"
        alt_rows = [[label, f"{self.predicted * 1e3:.3f}", "1.00x"]]
        if self.check is not None and self.check.kept == "default":
            solved = self.check.predicted["auto"]
            alt_rows = [["default (kept)", f"{self.predicted * 1e3:.3f}", "1.00x"],
                        [label + ", not kept", f"{solved * 1e3:.3f}",
                         f"{solved / self.predicted:.2f}x" if self.predicted else "-"]]
        for dev, value in self.alternatives.items():
            if value is None:
                alt_rows.append([f"all on {dev.spec}", "not possible", "-"])
            else:
                alt_rows.append([f"all on {dev.spec}", f"{value * 1e3:.3f}",
                                 f"{value / self.predicted:.2f}x" if self.predicted else "-"])
        _, _, switch_s, switches = self.price(self.plan.graph)
        if switches:
            lines.append(f"device switches: {switches} ({switch_s * 1e3:.3f} ms: kernels right "
                         "after another device's)")
        lines.append("predicted run time")
        lines.append(table(["plan", "ms", "vs auto"], alt_rows))
        if self.check is not None:
            lines.append(self.check.text())
        for c in self.calibrations:
            if c.failed:
                lines.append(f"{c.device.spec} not calibrated: its whole-graph run failed on "
                             f"sampled inputs: {c.failed}")
            else:
                lines.append(f"{c.device.spec} kernel times x{c.factor:.2f}: its whole-graph run "
                             f"against their sum{' (cached)' if c.cached else ''}")
        stages = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.stage_seconds.items())
        lines.append(f"measured {self.kernels_measured} kernels and {self.copies_measured} "
                     f"device pairs ({stages})")
        lines.append(self.plan.summary().splitlines()[0])
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as plain data for --json."""
        _, _, switch_s, switches = self.price(self.plan.graph)
        return {
            "devices": [d.spec for d in self.devices], "method": self.method,
            "predicted_seconds": self.predicted,
            "alternatives": {d.spec: v for d, v in self.alternatives.items()},
            "nodes": [{"nid": n.nid, "name": n.name, "func_name": n.func_name,
                       "device": n.device.spec,
                       "seconds": {d.spec: s for d, s in n.seconds.items()}} for n in self.nodes],
            "copies": [{"entry": c.entry, "src": c.src.spec, "dst": c.dst.spec,
                        "bytes": c.nbytes, "seconds": c.seconds} for c in self.copies],
            "switches": switches, "switch_seconds": switch_s,
            "kernels_measured": self.kernels_measured, "copies_measured": self.copies_measured,
            "stage_seconds": self.stage_seconds,
            "calibration": {c.device.spec: c.factor for c in self.calibrations},
            "check": None if self.check is None else self.check.to_json(),
        }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"

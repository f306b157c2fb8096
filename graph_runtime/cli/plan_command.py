"""`graphrun plan`: devices for a graph from constraints, or measured (--auto); symbolic samples."""
from __future__ import annotations

from typing import Any

import click

from .common import echo_json, graph_argument, json_option, lib_option, params_option, \
    parse_shape
from .inspect_commands import files_and_graph


@click.command()
@graph_argument
@click.option("--default", "default_device", metavar="DEVICE",
              help="Where unconstrained nodes go (default cpu:0).")
@click.option("--place", multiple=True, metavar="NODE=DEVICE",
              help="Put nodes whose name matches a glob on a device: 'conv*=opencl'.")
@click.option("--input", "input_places", multiple=True, metavar="NAME=DEVICE",
              help="Put a graph input on a device: data=cuda:0.")
@click.option("--output", "output_places", multiple=True, metavar="INDEX=DEVICE",
              help="Put graph output INDEX on a device: 0=cpu.")
@click.option("--placement", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="Constraints as JSON (the flags override it).")
@lib_option
@click.option("--strict", is_flag=True,
              help="Fail where the lib lacks a node's function on its planned device instead of "
                   "falling back to the default device.")
@click.option("--auto", "auto", is_flag=True,
              help="Measure each function on each -d device and the copies between them, and "
                   "place every node where the predicted run time is least; the constraints "
                   "above are hard constraints.")
@click.option("-d", "--device", "devices", multiple=True, metavar="SPEC",
              help="With --auto: a device nodes may go to; repeat it (default: cpu and opencl "
                   "or cuda where present). The first is the default device.")
@click.option("--profile-cache", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="With --auto: read and extend this cache of measured costs, so the next plan "
                   "measures nothing.")
@click.option("--budget", type=float, default=60.0, show_default=True, metavar="SECONDS",
              help="With --auto: seconds of measuring; past it each kernel is timed once.")
@click.option("--verify", is_flag=True,
              help="With --auto: run the plan and each one-device plan; print predicted vs "
                   "measured run time.")
@click.option("--calibrate/--no-calibrate", default=None,
              help="With --auto (on by default): run the graph once on each device that can hold "
                   "it all and scale that device's kernel times by the run, since kernels timed "
                   "alone run hotter than in a graph and cannot overlap an asynchronous device's "
                   "launches (cached). --no-calibrate keeps the times as measured alone.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="For a graph with symbolic dims: an input's shape at a sample (repeat per "
                   "input; repeat an input for several samples). --auto measures at each "
                   "sample and places for their summed run time (it needs them); the report "
                   "gives the bytes at each.")
@params_option
@click.option("-o", "--output-graph", type=click.Path(dir_okay=False), metavar="PLANNED.json",
              help="Write the planned graph.")
@json_option
def plan(graph: str, default_device: str | None, place: tuple[str, ...],
         input_places: tuple[str, ...], output_places: tuple[str, ...], placement: str | None,
         lib: str | None, strict: bool, auto: bool, devices: tuple[str, ...],
         profile_cache: str | None, budget: float, verify: bool, calibrate: bool | None,
         shapes: tuple[str, ...], params: str | None, output_graph: str | None,
         as_json: bool) -> None:
    """Plan devices for GRAPH: solve the constraints over the whole graph, insert the fewest
    __copy nodes, re-plan storage ids per device, and print what it did.

    With --auto the planner measures instead of being told: each fused function on each device
    (once per shape, cached with --profile-cache), the copy cost between devices, then picks the
    device of every node that minimises the predicted run time (exact: a minimum cut for two
    devices, an integer program for more) and prints per-node times, the copies, and the
    prediction against running everything on one device.

    A graph with symbolic dims is planned once for every shape: --auto measures it at the
    --shape samples (specialised as a run would) and places it where their summed predicted
    run time is least; without --auto, --shape samples report the bytes at each.

    Examples:

    \b
      graphrun plan examples/graphs/cnn --default cpu --place 'tvmgen_*conv2d*=opencl' \\
          -o planned.json
      graphrun plan examples/graphs/mlp --input data=opencl --output 0=cpu --json
      graphrun run planned.json --lib examples/graphs/cnn/lib.json -d cpu -d opencl
      graphrun plan examples/graphs/mixed --auto -d cpu -d opencl --profile-cache costs.json
      graphrun plan examples/graphs/mixed --auto -d cpu -d opencl --verify -o mixed.json
      graphrun plan bert --auto -d cpu -d opencl --shape input_ids=1,32 --shape input_ids=4,128
    """
    from .._text import fmt_bytes
    from ..lib import load_module
    from ..planner import Placement, plan_graph
    from .output import plan_summary
    if not auto:
        for flag, value in (("-d", devices), ("--profile-cache", profile_cache),
                            ("--verify", verify),
                            ("--calibrate/--no-calibrate", calibrate is not None)):
            if value:
                raise click.UsageError(f"{flag} needs --auto")
    files, g = files_and_graph(graph, lib, params)
    base = Placement.from_file(placement) if placement else None
    constraints = Placement.from_options(default_device, place, input_places, output_places,
                                         base=base)
    module = load_module(files.lib) if files.lib else None
    samples = _samples(shapes)
    if samples and not g.is_symbolic:
        raise click.UsageError("--shape gives sample shapes of a graph with symbolic dims; "
                               f"{files.graph} has none")
    if auto:
        _plan_auto(g, files, module, constraints, devices, profile_cache, budget, verify,
                   calibrate is not False, output_graph, as_json, samples)
        return
    result = plan_graph(g, constraints, module, strict)
    _write_graph(result.graph, output_graph)
    at = _sample_bytes(result, module, samples) if samples else []
    if as_json:
        doc = plan_summary(result, files, output_graph)
        if g.is_symbolic:
            doc["samples"] = [{"shapes": label, "copy_bytes": copied,
                               "pool_bytes": {d.spec: n for d, n in pools.items()}}
                              for label, pools, copied in at]
        echo_json(doc)
    else:
        click.echo(result.summary())
        if g.is_symbolic:
            click.echo("symbolic dims: their entries count 0 B above; create() plans storage "
                       "for each shape it runs at" + ("" if at else " (--shape NAME=D0,... "
                                                      "gives the bytes at a sample)"))
        for label, pools, copied in at:
            per_device = sorted((d.spec, n) for d, n in pools.items())
            click.echo(f"  at {label}: pool "
                       + ", ".join(f"{spec} {fmt_bytes(n)}" for spec, n in per_device)
                       + f"; copies {fmt_bytes(copied)} per run")
        click.echo(f"wrote {output_graph}" if output_graph else "(give -o PLANNED.json to "
                   "write the planned graph)")


def _write_graph(planned: Any, output_graph: str | None) -> None:
    if output_graph is None:
        return
    from ..errors import GraphRuntimeError
    try:
        with open(output_graph, "w", encoding="utf-8") as f:
            f.write(planned.to_json(indent=1) + "\n")
    except OSError as e:
        raise GraphRuntimeError(f"-o {output_graph}: cannot write: {e.strerror or e}") from e


def _plan_auto(g: Any, files: Any, module: Any, constraints: Any, devices: tuple[str, ...],
               profile_cache: str | None, budget: float, verify: bool, calibrate: bool,
               output_graph: str | None, as_json: bool, samples: list[dict[str, list[int]]]
               ) -> None:
    """`plan --auto`: measure with a progress bar, solve, print the report (and --verify)."""
    from ..lib import standard_module
    from ..params import load_params_file
    from ..planner.auto.place import auto_place
    from ..planner.auto.verify import verify_plans, verify_text
    from dataclasses import replace
    from .common import progress
    from .job import parse_devices
    bar: list[Any] = []

    def step(total: int, label: str) -> None:
        if not bar:
            bar.append(progress(total, "measuring", unit="kernel"))
        bar[0].set_postfix_str(label, refresh=False)
        bar[0].update(1)

    lib = module if module is not None else standard_module()
    params = load_params_file(files.params) if files.params is not None else None
    result: Any
    try:
        if g.is_symbolic:
            from ..planner.auto.symbolic import auto_place_symbolic
            result = auto_place_symbolic(g, lib, parse_devices(devices), samples, constraints,
                                         budget, profile_cache, step, params=params,
                                         calibrate_devices=calibrate)
        else:
            result = auto_place(g, lib, parse_devices(devices), constraints, budget,
                                profile_cache, step, params=params, calibrate_devices=calibrate)
    finally:
        if bar:
            bar[0].close()
    _write_graph(result.plan.graph, output_graph)
    rows = []
    if verify:
        inputs = load_params_file(files.inputs) if files.inputs is not None else None
        plans = [("", result)] if not g.is_symbolic else result.samples
        for label, one in plans:
            mine = {n: v for n, v in (inputs or {}).items()
                    if n in one.graph.input_entries
                    and tuple(v.shape) == tuple(one.graph.shape(one.graph.input_entries[n]))}
            for row in verify_plans(one, lib, params, mine):
                rows.append(replace(row, plan=f"{row.plan} at {label}") if label else row)
    if as_json:
        doc = result.to_json()
        doc.update({"graph": str(files.graph), "written": output_graph})
        if verify:
            doc["verify"] = [{"plan": r.plan, "predicted_seconds": r.predicted,
                              "measured_seconds": r.measured, "max_abs_diff": r.max_abs_diff}
                             for r in rows]
        echo_json(doc)
        return
    click.echo(result.text())
    if verify:
        click.echo("verify (run() medians)")
        click.echo(verify_text(rows))
    click.echo(f"wrote {output_graph}" if output_graph else "(give -o PLANNED.json to "
               "write the planned graph)")


def _samples(shapes: tuple[str, ...]) -> list[dict[str, list[int]]]:
    """--shape items as samples: an input given k times spreads over k samples; one given once
    is in every sample; inputs given more than once must be given the same number of times."""
    given: dict[str, list[list[int]]] = {}
    for item in shapes:
        name, shape = parse_shape(item, "--shape")
        given.setdefault(name, []).append(shape)
    counts = {len(v) for v in given.values() if len(v) > 1}
    if len(counts) > 1:
        raise click.BadParameter("inputs given more than once must be given the same number of "
                                 "times (one shape per sample); got "
                                 + ", ".join(f"{n} x{len(v)}" for n, v in given.items()),
                                 param_hint="--shape")
    count = counts.pop() if counts else (1 if given else 0)
    return [{n: v[k] if len(v) > 1 else v[0] for n, v in given.items()} for k in range(count)]


def _sample_bytes(result: Any, lib: Any, samples: list[dict[str, list[int]]]) -> list[Any]:
    """(label, pool bytes per device, copy bytes per run) of the planned graph at each sample."""
    from ..lib import standard_module
    from ..planner.samples import specialise_samples
    devices = sorted(set(result.node_devices), key=str)
    rows = []
    for one in specialise_samples(result.graph, lib or standard_module(), devices, samples):
        rows.append((one.label, one.bytes_per_device(devices), one.copy_bytes()))
    return rows

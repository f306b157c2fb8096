"""graphrun commands that look at a graph without running it: validate, info, devices, viz, plan."""
from __future__ import annotations

from typing import Any

import click

from .common import (device_option, echo_json, graph_argument, json_option, lib_option,
                     params_option, stack)


def _files_and_graph(graph: str, lib: str | None = None, params: str | None = None) -> Any:
    from ..graph.model import Graph
    from .job import resolve_files
    files = resolve_files(graph, lib, params)
    return files, Graph.from_json(files.graph)


@click.command()
@graph_argument
@stack(lib_option, params_option, device_option, json_option)
@click.pass_context
def validate(ctx: click.Context, graph: str, lib: str | None, params: str | None,
             devices: tuple[str, ...], as_json: bool) -> None:
    """Check GRAPH and report every problem, not just the first; exit 1 if there is any.

    Checks the graph (JSON schema, then semantics: order, node_row_ptr, columns, storage ids),
    that the lib has every function on the device each node runs on (with its output shapes,
    where the lib can tell without running), and that params match the graph's names, shapes
    and dtypes. Devices need not exist here. A *.py lib runs its code; a *.json lib does not.

    Examples:

    \b
      graphrun validate examples/graphs/hetero_cnn
      graphrun validate examples/graphs/hetero_cnn -d cpu -d opencl --json
      graphrun validate examples/graphs/mlp/graph.json --params examples/graphs/mlp/params
    """
    from .job import parse_devices, resolve_files
    from .validate import check_files
    files = resolve_files(graph, lib, params)
    ctxs = parse_devices(devices, check=False)
    result = check_files(files, ctxs)
    if as_json:
        echo_json({"graph": str(files.graph), "devices": [d.spec for d in ctxs],
                   "lib": str(files.lib) if files.lib else None,
                   "params": str(files.params) if files.params else None,
                   "ok": not result.problems, "checked": result.checked,
                   "problems": result.problems})
    else:
        click.echo(result.text(str(files.graph)))
    if result.problems:
        ctx.exit(1)


@click.command()
@graph_argument
@stack(device_option, params_option)
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False), metavar="FILE.npz",
              help="Input values by name (tells data inputs from params).")
@json_option
def info(graph: str, devices: tuple[str, ...], params: str | None, inputs_file: str | None,
         as_json: bool) -> None:
    """Where does each node run? Inputs, params and outputs; nodes per function; a placement
    table (node -> device); copies per device pair; pool bytes per device with and without
    storage sharing. Needs no lib and allocates nothing; devices need not exist here.

    Examples:

    \b
      graphrun info examples/graphs/hetero_cnn
      graphrun info examples/graphs/hetero_cnn -d cpu          # everything falls back to cpu:0
      graphrun info examples/graphs/hetero_cnn/graph_cuda.json -d cpu -d cuda --json
    """
    from .info import graph_info, info_text
    from .job import parse_devices, resolve_files
    files = resolve_files(graph, None, params, inputs_file)
    doc = graph_info(files, parse_devices(devices, check=False))
    if as_json:
        echo_json(doc)
    else:
        click.echo(info_text(doc))


@click.command()
@json_option
def devices(as_json: bool) -> None:
    """The devices this machine has (type, id, name, memory) and what is missing, and why.

    Examples:

    \b
      graphrun devices
      graphrun devices --json
    """
    from .._text import fmt_bytes, table
    from ..backends import list_devices
    from ..lib.kernels.onednn.binding import describe
    found, missing = list_devices()
    cpu_kernels = describe()
    if as_json:
        echo_json({"devices": [{"device": f"{d.kind}:{d.device_id}", "kind": d.kind,
                                "device_id": d.device_id, "name": d.name,
                                "memory_bytes": d.memory_bytes} for d in found],
                   "missing": missing, "cpu_kernels": cpu_kernels})
        return
    click.echo("devices")
    click.echo(table(["device", "name", "memory"],
                     [[f"{d.kind}:{d.device_id}", d.name, fmt_bytes(d.memory_bytes)]
                      for d in found]))
    if missing:
        click.echo("missing")
        for kind, reason in missing.items():
            click.echo(f"  {kind}: {reason.removeprefix(kind + ': ')}")
    click.echo(f"cpu kernels: {cpu_kernels}")


@click.command()
@graph_argument
@stack(device_option, params_option)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              metavar="OUT.{dot,svg,png}", help="The drawing; SVG and PNG need Graphviz's `dot`.")
def viz(graph: str, devices: tuple[str, ...], params: str | None, output: str) -> None:
    """Draw GRAPH placed on the devices: nodes coloured by device, __copy nodes as yellow
    arrows, data inputs as ellipses, params as dashed notes, outputs double-bordered, edges
    labelled with shapes, copies the executor would insert as red dashed edges.

    Examples:

    \b
      graphrun viz examples/graphs/hetero_cnn -o hetero_cnn.svg
      graphrun viz examples/graphs/duplex -d cpu -d opencl -o duplex.png
      graphrun viz examples/graphs/mlp -o mlp.dot
    """
    from .info import split_args
    from .job import param_names, parse_devices
    from .viz import to_dot, write_drawing
    files, g = _files_and_graph(graph, params=params)
    ctxs = parse_devices(devices, check=False)
    names = param_names(files)
    param_args = split_args(g, names, None)[1]
    write_drawing(to_dot(g, ctxs, param_args), output)
    click.echo(f"wrote {output}: {g.num_nodes} nodes on {', '.join(d.spec for d in ctxs)}")


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
@params_option
@click.option("-o", "--output-graph", type=click.Path(dir_okay=False), metavar="PLANNED.json",
              help="Write the planned graph.")
@json_option
def plan(graph: str, default_device: str | None, place: tuple[str, ...],
         input_places: tuple[str, ...], output_places: tuple[str, ...], placement: str | None,
         lib: str | None, strict: bool, auto: bool, devices: tuple[str, ...],
         profile_cache: str | None, budget: float, verify: bool, calibrate: bool | None,
         params: str | None, output_graph: str | None, as_json: bool) -> None:
    """Plan devices for GRAPH: solve the constraints over the whole graph, insert the fewest
    __copy nodes, re-plan storage ids per device, and print what it did.

    With --auto the planner measures instead of being told: each fused function on each device
    (once per shape, cached with --profile-cache), the copy cost between devices, then picks the
    device of every node that minimises the predicted run time (exact: a minimum cut for two
    devices, an integer program for more) and prints per-node times, the copies, and the
    prediction against running everything on one device.

    Examples:

    \b
      graphrun plan examples/graphs/cnn --default cpu --place 'tvmgen_*conv2d*=opencl' \\
          -o planned.json
      graphrun plan examples/graphs/mlp --input data=opencl --output 0=cpu --json
      graphrun run planned.json --lib examples/graphs/cnn/lib.json -d cpu -d opencl
      graphrun plan examples/graphs/mixed --auto -d cpu -d opencl --profile-cache costs.json
      graphrun plan examples/graphs/mixed --auto -d cpu -d opencl --verify -o mixed.json
    """
    from ..lib import load_module
    from ..planner import Placement, plan_graph
    from .output import plan_summary
    if not auto:
        for flag, value in (("-d", devices), ("--profile-cache", profile_cache),
                            ("--verify", verify),
                            ("--calibrate/--no-calibrate", calibrate is not None)):
            if value:
                raise click.UsageError(f"{flag} needs --auto")
    files, g = _files_and_graph(graph, lib, params)
    base = Placement.from_file(placement) if placement else None
    constraints = Placement.from_options(default_device, place, input_places, output_places,
                                         base=base)
    module = load_module(files.lib) if files.lib else None
    if auto:
        _plan_auto(g, files, module, constraints, devices, profile_cache, budget, verify,
                   calibrate is not False, output_graph, as_json)
        return
    result = plan_graph(g, constraints, module, strict)
    _write_graph(result.graph, output_graph)
    if as_json:
        echo_json(plan_summary(result, files, output_graph))
    else:
        click.echo(result.summary())
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
               output_graph: str | None, as_json: bool) -> None:
    """`plan --auto`: measure with a progress bar, solve, print the report (and --verify)."""
    from ..lib import standard_module
    from ..params import load_params_file
    from ..planner.auto.place import auto_place
    from ..planner.auto.verify import verify_plans, verify_text
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
    try:
        result = auto_place(g, lib, parse_devices(devices), constraints, budget, profile_cache,
                            step, params=params, calibrate_devices=calibrate)
    finally:
        if bar:
            bar[0].close()
    _write_graph(result.plan.graph, output_graph)
    rows = []
    if verify:
        inputs = load_params_file(files.inputs) if files.inputs is not None else None
        rows = verify_plans(result, lib, params, inputs)
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

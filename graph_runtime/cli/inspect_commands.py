"""graphrun commands that look at a graph without running it: validate, info, devices, viz."""
from __future__ import annotations

from typing import Any

import click

from .common import (device_option, echo_json, graph_argument, json_option, lib_option,
                     params_option, stack)


def files_and_graph(graph: str, lib: str | None = None, params: str | None = None) -> Any:
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
    """The devices this machine has (type, id, name, memory) and what is missing, and why; the
    CPU kernels' library and threads, and how long a cache line takes between two CPUs of their
    team and back (on a cloud VM a far-apart spell, hundreds of ns, slows small models' runs).

    Examples:

    \b
      graphrun devices
      graphrun devices --json
    """
    from .._text import fmt_bytes, table
    from ..backends import list_devices
    from ..lib.kernels.cpu.team_round_trip import round_trip_text
    from ..lib.kernels.onednn.binding import describe
    found, missing = list_devices()
    cpu_kernels = describe()
    round_trip = round_trip_text()
    if as_json:
        echo_json({"devices": [{"device": f"{d.kind}:{d.device_id}", "kind": d.kind,
                                "device_id": d.device_id, "name": d.name,
                                "memory_bytes": d.memory_bytes} for d in found],
                   "missing": missing, "cpu_kernels": cpu_kernels,
                   "cpu_round_trip": round_trip})
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
    click.echo(round_trip)


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
    files, g = files_and_graph(graph, params=params)
    ctxs = parse_devices(devices, check=False)
    names = param_names(files)
    param_args = split_args(g, names, None)[1]
    write_drawing(to_dot(g, ctxs, param_args), output)
    click.echo(f"wrote {output}: {g.num_nodes} nodes on {', '.join(d.spec for d in ctxs)}")

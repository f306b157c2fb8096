"""`graphrun import`: an ONNX model into a folder graphrun runs (graph.json, lib.json, params)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from .common import CliError, parse_shape


def _parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    return dict(parse_shape(item, "--shape") for item in items)


def write_folder(out: Path, files: dict[str, Any], force: bool) -> None:
    """Write every file into a temporary folder beside out, then rename it into place."""
    from ..params import save_params_file
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"-o {out}: already exists; use --force to replace it")
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        for name, content in files.items():
            path = tmp / name
            if name in ("graph.json", "lib.json"):
                path.write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")
            else:
                save_params_file(path, content)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=parent))
            os.rename(out, old / out.name)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _list_passes(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ..frontend.passes import describe
    click.echo(describe())
    ctx.exit()


@click.command(name="import")
@click.argument("model", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              metavar="DIR", help="Folder to write graph.json, lib.json and params into.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="Concrete shape for an input with symbolic dims (repeat per input).")
@click.option("--reference", is_flag=True,
              help="Also write inputs.npz (seeded) and expected.npz from ONNX Runtime, so "
                   "`graphrun run DIR` checks itself (needs onnxruntime).")
@click.option("--freeze", is_flag=True,
              help="Refuse inputs with symbolic dims unless --shape gives them (the behaviour "
                   "before symbolic dims); by default they stay symbolic in graph.json.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of inputs.npz.")
@click.option("--force", is_flag=True, help="Replace DIR if it exists.")
@click.option("--disable-pass", "disable", multiple=True, metavar="NAME",
              help="Skip one rewrite pass (repeat for more); --list-passes names them.")
@click.option("--list-passes", is_flag=True, is_eager=True, expose_value=False,
              callback=_list_passes, help="Print the rewrite passes in the order they run, "
                                          "and exit.")
def import_cmd(model: str, out_dir: str, shapes: tuple[str, ...], reference: bool, freeze: bool,
               seed: int, force: bool, disable: tuple[str, ...]) -> None:
    """Import an ONNX model into DIR: graph.json, lib.json (fused standard ops) and params.

    Inputs with named or unknown dims and no --shape keep them: graph.json carries symbolic
    dims and the runtime specialises it per input shape (--freeze asks for shapes instead).
    Constants are folded, BatchNormalization is folded into convolutions, and operators are
    fused as TVM's FuseOps does, with TVM's function names. Anything unsupported is refused
    with one message listing every unsupported op and its nodes; nothing is written then.

    Examples:

    \b
      graphrun import model.onnx -o examples/graphs/model --reference
      graphrun import bert.onnx -o bert --shape input_ids=1,128 --shape attention_mask=1,128
      graphrun import bert.onnx -o bert --disable-pass attention
      graphrun plan examples/graphs/model --place '*conv2d*=opencl' -o planned.json
      graphrun run examples/graphs/model -d cpu -d opencl
    """
    from ..frontend.importer import import_onnx
    from ..frontend.onnx_model import load_model
    from ..graph.model import Graph
    from .job import output_keys
    given = _parse_shapes(shapes)
    proto, _ = load_model(model)
    result = import_onnx(proto, given, name=Path(model).name, base_dir=Path(model).parent,
                         freeze=freeze, disable=disable)
    if reference and Graph.from_json(result.graph_json).is_symbolic:
        raise click.UsageError("--reference draws inputs of one shape: give the symbolic "
                               "inputs' shapes with --shape NAME=D0,D1,... (or --freeze)")
    files: dict[str, Any] = {"graph.json": json.loads(result.graph_json),
                             "lib.json": result.lib_doc, "params": result.params}
    if reference:
        from ..frontend.reference import onnxruntime_outputs, reference_inputs
        inputs = reference_inputs(result, proto, seed)
        expected = onnxruntime_outputs(proto, inputs, result.output_names)
        files["inputs.npz"] = inputs
        keys = output_keys(Graph.from_json(result.graph_json))
        files["expected.npz"] = dict(zip(keys, expected))
    write_folder(Path(out_dir), files, force)
    click.echo(result.summary())
    click.echo(f"wrote {out_dir}: " + ", ".join(files))

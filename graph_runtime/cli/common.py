"""What every graphrun command shares: the one-line error, options, progress bars, output."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, Sequence

import click


class CliError(click.ClickException):
    """A bad input or usage: one line `graphrun: error: ...`, exit 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"graphrun: error: {self.format_message()}", err=True)


def parse_shape(item: str, flag: str) -> tuple[str, list[int]]:
    """NAME=D0,D1,... as (name, dims); BadParameter naming the flag otherwise."""
    name, sep, dims = item.rpartition("=")
    try:
        shape = [int(d) for d in dims.split(",") if d.strip()] if sep and name else None
    except ValueError:
        shape = None
    if shape is None:
        raise click.BadParameter(f"{item}: expected NAME=D0,D1,..., e.g. "
                                 f"{flag} input=1,3,224,224", param_hint=flag)
    return name, shape


def progress(total: int, desc: str, unit: str = "run") -> Any:
    """A tqdm bar on a terminal; silent when stderr is not a TTY (CI, pipes, tests)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr,
                disable=not sys.stderr.isatty())


def echo_json(value: Any) -> None:
    """Print value as strict JSON (NaN and infinities become null)."""
    click.echo(json.dumps(_finite(value), indent=2))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def note(text: str) -> None:
    """A remark for people, on stderr so that --json output stays parseable."""
    click.echo(f"graphrun: note: {text}", err=True)


# ---- shared options -----------------------------------------------------------------------------

graph_argument = click.argument("graph", metavar="GRAPH")
device_option = click.option(
    "-d", "--device", "devices", multiple=True, metavar="SPEC",
    help="A device: cpu, opencl:0, cuda:1, or auto (cpu:0, then opencl:0 and cuda:0 where "
         "present; the default). Repeat it; the first is the primary device (TVM's ctxs[0]), "
         "where nodes go whose device_index names no given device.")
lib_option = click.option(
    "--lib", type=click.Path(dir_okay=False), metavar="LIB",
    help="Kernel library: *.json runs no code (chains of standard ops); *.py RUNS ITS CODE "
         "(it must define `lib`). Default: the folder's lib.json/lib.py, else the standard ops.")
params_option = click.option("--params", type=click.Path(dir_okay=False), metavar="FILE",
                             help="Params: TVM's binary param dict or .npz.")
inputs_options = [
    click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False), metavar="FILE.npz",
                 help="Input values by name."),
    click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy",
                 help="One input's value; repeatable. Inputs given nowhere are drawn at random."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed for inputs drawn at random."),
    click.option("--strict", is_flag=True,
                 help="Refuse a graph that needs copies the executor would insert, or whose "
                      "device_index names a device not given."),
]
expected_option = click.option("--expected", type=click.Path(dir_okay=False),
                               metavar="EXPECTED.npz",
                               help="Expected outputs (keys output_0, ..., or output names: a "
                                    "model's own, e.g. logits, or the head node's).")
def _tolerance(ctx: click.Context, param: click.Parameter, value: float) -> float:
    from .job import tolerance_problem
    problem = tolerance_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _tolerance_option(name: str, help_text: str) -> Any:
    from .job import TOLERANCES
    return click.option(f"--{name}", type=float, default=TOLERANCES[name], show_default=True,
                        callback=_tolerance, help=help_text)


tolerance_options = [_tolerance_option("rtol", "Relative tolerance (>= 0)."),
                     _tolerance_option("atol", "Absolute tolerance (>= 0).")]
job_options = [lib_option, params_option, device_option] + inputs_options
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
junit_option = click.option("--junit", type=click.Path(dir_okay=False), metavar="REPORT.xml",
                            help="Write a JUnit XML report.")


def stack(*decorators: Any) -> Callable[[Any], Any]:
    """Apply option decorators (or lists of them) in the order written."""
    flat: list[Any] = []
    for d in decorators:
        flat.extend(d if isinstance(d, list) else [d])

    def apply(f: Any) -> Any:
        for d in reversed(flat):
            f = d(f)
        return f
    return apply


def job_from_options(graph: str, lib: str | None = None, params: str | None = None,
                     inputs_file: str | None = None, input_pairs: Sequence[str] = (),
                     seed: int = 0, strict: bool = False, devices: Sequence[str] = (),
                     expected: str | None = None) -> Any:
    """The Job for a command's options (via job.job_from_files), noting inputs drawn at random."""
    from . import job
    files = job.resolve_files(graph, lib, params, inputs_file, expected)
    if files.lib_beside:
        note(f"using the lib beside the graph, {files.lib} (give --lib to choose another)")
    built = job.job_from_files(files, job.parse_devices(devices), input_pairs, seed, strict)
    if built.float32_products:
        note("comparing with expected values: CUDA's float32 products in full float32, not "
             "TF32 (set GRAPH_RUNTIME_CUDA_TF32=on to compare what a module runs by default)")
    if built.inputs.random:
        note(f"no value given for {', '.join(map(repr, built.inputs.random))}; drew random "
             f"values (seed {seed}); give weights with --params, data with --inputs or "
             "--input NAME=FILE.npy")
    return built

"""The click app behind `graphrun`: parse, call one library function, print."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from .errors import GraphRuntimeError

log = logging.getLogger("graph_runtime")


class CliError(click.ClickException):
    """A bad input or usage: one line `graphrun: error: ...`, exit 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"graphrun: error: {self.format_message()}", err=True)


class App(click.Group):
    """The group; the one place a GraphRuntimeError becomes a one-line error (exit 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GraphRuntimeError as e:
            if ctx.params.get("debug"):
                raise
            raise CliError(str(e)) from e


class _EchoHandler(logging.Handler):
    """Library warnings (e.g. a device_index falling back to ctxs[0]) as `graphrun: warning:`."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"graphrun: {record.levelname.lower()}: {record.getMessage()}", err=True)


def _setup_logging(verbose: bool) -> None:
    for handler in [h for h in log.handlers if isinstance(h, _EchoHandler)]:
        log.removeHandler(handler)
    log.addHandler(_EchoHandler())
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


def progress(total: int, desc: str) -> Any:
    """A tqdm bar on a terminal; silent when stderr is not a TTY (CI, pipes, tests)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="run", leave=False, file=sys.stderr,
                disable=not sys.stderr.isatty())


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


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
                               help="Expected outputs (keys output_0, ... or output names).")
tolerance_options = [
    click.option("--rtol", type=float, default=1e-4, show_default=True, help="Relative tolerance."),
    click.option("--atol", type=float, default=1e-5, show_default=True, help="Absolute tolerance."),
]
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


# ---- the group ----------------------------------------------------------------------------------

@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.option("-v", "--verbose", is_flag=True, help="Also show info messages (copies inserted).")
@click.version_option(package_name="graph_runtime", prog_name="graphrun")
def app(debug: bool, verbose: bool) -> None:
    """Run, inspect, profile and regression-test TVM graph JSON on CPU, OpenCL and CUDA.

    GRAPH is a graph JSON file or an example folder (examples/graphs/NAME/) whose graph.json,
    lib.json or lib.py, params, inputs.npz and expected.npz serve as defaults for the flags
    not given. Exit status: 0 ok, 1 a check or comparison failed, 2 bad usage or input file.

    Examples:

    \b
      graphrun run examples/graphs/hetero_cnn
      graphrun info examples/graphs/hetero_cnn -d cpu -d opencl
      graphrun regress examples/regress.toml --junit report.xml
    """
    _setup_logging(verbose)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry (`graphrun`), also used by the checkout's cli.py."""
    app.main(args=list(argv) if argv is not None else None, prog_name="graphrun")



# ---- run, compare, profile ----------------------------------------------------------------------

def _build(graph: str, lib: str | None, params: str | None, inputs_file: str | None,
           input_pairs: Sequence[str], seed: int, strict: bool, devices: Sequence[str],
           expected: str | None = None) -> Any:
    from .job import build_job, parse_devices, resolve_files
    files = resolve_files(graph, lib, params, inputs_file, expected)
    job = build_job(files, parse_devices(devices), input_pairs, seed, strict)
    if job.inputs.random:
        note(f"no value given for {', '.join(map(repr, job.inputs.random))}; drew random values "
             f"(seed {seed}); give them with --inputs or --input NAME=FILE.npy")
    return job


@app.command()
@graph_argument
@stack(lib_option, params_option, device_option, inputs_options, expected_option,
       tolerance_options)
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="OUT.npz",
              help="Save the outputs (keys output_0, output_1, ...).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Time this many runs after a warm-up run (device-synchronised).")
@json_option
@click.pass_context
def run(ctx: click.Context, graph: str, lib: str | None, params: str | None,
        inputs_file: str | None, input_pairs: tuple[str, ...], seed: int, strict: bool,
        devices: tuple[str, ...], expected: str | None, rtol: float, atol: float,
        output: str | None, repeat: int, as_json: bool) -> None:
    """Run GRAPH and print each output's name, shape, dtype and a summary.

    With expected outputs (--expected, or expected.npz in the example folder) it also says
    whether they match; exit 1 when they do not.

    Examples:

    \b
      graphrun run examples/graphs/hetero_cnn
      graphrun run examples/graphs/hetero_cnn -d cpu --repeat 50
      graphrun run examples/graphs/mlp/graph.json --lib examples/graphs/mlp/lib.json \\
          --params examples/graphs/mlp/params --input data=data.npy -o out.npz --json
    """
    from .job import benchmark, compare, expected_outputs, output_names
    from .params import save_params_file
    from .report import run_summary, run_text
    job = _build(graph, lib, params, inputs_file, input_pairs, seed, strict, devices, expected)
    outputs = job.run()
    timing: dict[str, Any] = {"runs": 1, "first_run_s": job.seconds}
    if repeat > 1:
        with progress(repeat, "timing") as bar:
            result = benchmark(job, repeat, progress=lambda done: bar.update(1))
        timing.update(runs=repeat, mean_s=result.mean, median_s=result.median, min_s=result.min,
                      max_s=result.max, std_s=result.std)
    names = output_names(job.graph)
    comparisons = None
    if job.files.expected is not None:
        comparisons = compare(outputs, expected_outputs(job.files.expected, names), names,
                              rtol, atol)
    if output is not None:
        save_params_file(output, {f"output_{i}": value for i, value in enumerate(outputs)})
    doc = run_summary(job, outputs, timing, comparisons, rtol, atol)
    if output is not None:
        doc["saved"] = output
    echo_json(doc) if as_json else click.echo(run_text(doc))
    if comparisons is not None and not all(c.ok for c in comparisons):
        ctx.exit(1)


@app.command(name="compare")
@graph_argument
@stack(lib_option, params_option, device_option, inputs_options, expected_option,
       tolerance_options, junit_option, json_option)
@click.pass_context
def compare_cmd(ctx: click.Context, graph: str, lib: str | None, params: str | None,
                inputs_file: str | None, input_pairs: tuple[str, ...], seed: int, strict: bool,
                devices: tuple[str, ...], expected: str | None, rtol: float, atol: float,
                junit: str | None, as_json: bool) -> None:
    """Run GRAPH and compare every output with the expected values; exit 1 on a mismatch.

    Prints the max absolute and max relative error per output. An output matches when
    |got - expected| <= atol + rtol * |expected| for every element.

    Examples:

    \b
      graphrun compare examples/graphs/cnn
      graphrun compare examples/graphs/simplex -d cpu -d opencl --rtol 1e-6 --junit report.xml
      graphrun compare examples/graphs/mlp/graph.json --lib examples/graphs/mlp/lib.json \\
          --params examples/graphs/mlp/params --inputs examples/graphs/mlp/inputs.npz \\
          --expected examples/graphs/mlp/expected.npz
    """
    from .job import compare, expected_outputs, output_names
    from .regress import JUnitCase, write_junit
    from .report import comparison_text
    job = _build(graph, lib, params, inputs_file, input_pairs, seed, strict, devices, expected)
    if job.files.expected is None:
        raise CliError(f"compare {graph}: give --expected EXPECTED.npz (the graph is not an "
                       "example folder with an expected.npz)")
    outputs = job.run()
    names = output_names(job.graph)
    comparisons = compare(outputs, expected_outputs(job.files.expected, names), names, rtol, atol)
    if junit is not None:
        suite = Path(job.files.graph).parent.name if job.files.folder else job.files.graph.stem
        cases = [JUnitCase(f"output {c.index} {c.name}", f"graphrun.compare.{suite}", job.seconds,
                           "passed" if c.ok else "failed",
                           c.problem or f"max abs err {c.max_abs:.3g}, max rel err "
                                        f"{c.max_rel:.3g} (rtol {rtol}, atol {atol})")
                 for c in comparisons]
        write_junit(junit, f"graphrun compare {suite}", cases)
    ok = all(c.ok for c in comparisons)
    if as_json:
        echo_json({"graph": str(job.files.graph), "expected": str(job.files.expected),
                   "devices": [d.spec for d in job.devices], "rtol": rtol, "atol": atol,
                   "ok": ok, "outputs": [c.__dict__ for c in comparisons]})
    else:
        click.echo(comparison_text(comparisons, str(job.files.expected), rtol, atol))
    if not ok:
        ctx.exit(1)


@app.command()
@graph_argument
@stack(lib_option, params_option, device_option, inputs_options)
@click.option("--repeat", type=click.IntRange(min=1), default=10, show_default=True,
              help="Profiled runs after a warm-up; each node's time is its median.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="Rows of the table (the slowest nodes).")
@click.option("--trace", type=click.Path(dir_okay=False), metavar="TRACE.json",
              help="Write a Chrome trace (open in ui.perfetto.dev or chrome://tracing).")
@click.option("--plot", type=click.Path(dir_okay=False), metavar="PLOT.png",
              help="Draw time per node, coloured by device (needs matplotlib).")
@json_option
def profile(graph: str, lib: str | None, params: str | None, inputs_file: str | None,
            input_pairs: tuple[str, ...], seed: int, strict: bool, devices: tuple[str, ...],
            repeat: int, top: int, trace: str | None, plot: str | None, as_json: bool) -> None:
    """Time every node of GRAPH (each step synchronises its device): a table sorted by time
    with % of total, totals per device and for copies.

    Examples:

    \b
      graphrun profile examples/graphs/hetero_cnn --trace trace.json --plot profile.png
      graphrun profile examples/graphs/mlp -d opencl --repeat 50 --json
    """
    from .report import profile_summary, profile_text
    from .trace import plot_profile, write_chrome_trace
    job = _build(graph, lib, params, inputs_file, input_pairs, seed, strict, devices)
    with progress(repeat, "profiling") as bar:
        times = job.module.profile(repeat, progress=lambda done: bar.update(1))
    if trace is not None:
        write_chrome_trace(times, trace)
    if plot is not None:
        plot_profile(times, plot, title=f"{job.files.graph}: median of {repeat} runs")
    doc = profile_summary(times)
    doc.update(graph=str(job.files.graph), devices=[d.spec for d in job.devices], repeat=repeat,
               trace=trace, plot=plot)
    echo_json(doc) if as_json else click.echo(profile_text(doc, top))

"""The click app behind `graphrun`: the group, and the commands that run a graph."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

import click

from ..errors import GraphRuntimeError
from .common import (CliError, echo_json, expected_option, graph_argument, job_from_options,
                     job_options, json_option, junit_option, progress, stack, tolerance_options)
from .import_command import import_cmd
from .inspect_commands import devices, info, validate, viz
from .plan_command import plan
from .tuning_command import tuning_cmd

log = logging.getLogger("graph_runtime")


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


def _setup_logging(ctx: click.Context, verbose: bool) -> None:
    """Show library log records on stderr for this command; undo it when the command ends."""
    handler = _EchoHandler()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)

    def restore() -> None:
        log.removeHandler(handler)
        log.setLevel(level)
    ctx.call_on_close(restore)


@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.option("-v", "--verbose", is_flag=True, help="Also show info messages (copies inserted).")
@click.version_option(package_name="graph_runtime", prog_name="graphrun")
@click.pass_context
def app(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """Run, inspect, profile and regression-test TVM graph JSON on CPU, OpenCL and CUDA.

    GRAPH is a graph JSON file or an example folder (examples/graphs/NAME/) whose graph.json,
    lib.json or lib.py, params, inputs.npz and expected.npz serve as defaults for the flags
    not given. A *.json lib runs no code; a *.py lib runs its code. Exit status: 0 ok, 1 a
    check or comparison failed, 2 bad usage or a bad input file.

    Examples:

    \b
      graphrun run examples/graphs/hetero_cnn
      graphrun info examples/graphs/hetero_cnn -d cpu -d opencl
      graphrun regress examples/regress.toml --junit report.xml
    """
    _setup_logging(ctx, verbose)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry (`graphrun`), also used by the checkout's cli.py.

    The process ends as soon as the command has: tearing the interpreter down (every module,
    numba's and oneDNN's objects) took 0.13-0.2 s after a warm BERT-base run of 1.3 s, and none
    of it is needed once the atexit handlers have run and stdout and stderr are flushed (the
    commands close what they write). An exception other than click's exit keeps the usual end.
    """
    try:
        app.main(args=list(argv) if argv is not None else None, prog_name="graphrun")
        code: Any = 0
    except SystemExit as e:
        code = e.code
    _exit_now(code)


def _exit_now(code: Any) -> None:
    """End the process with sys.exit's meaning of code, skipping the interpreter's teardown."""
    import atexit
    import sys
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (graphrun ... | head): nothing to do
            pass
    os._exit(code)


@app.command()
@graph_argument
@stack(job_options, expected_option, tolerance_options)
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="OUT.npz",
              help="Save the outputs as .npz or, for a .params file, TVM's param dict: keys "
                   "output_0, output_1, ..., or the output names a graph declares (an "
                   "imported model's: logits, ...).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Time this many runs after a warm-up run (device-synchronised).")
@json_option
@click.pass_context
def run(ctx: click.Context, graph: str, rtol: float, atol: float, output: str | None,
        repeat: int, as_json: bool, **opts: Any) -> None:
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
    from ..params import save_params_file
    from .job import benchmark, compare, expected_outputs, output_keys, output_names
    from .output import run_summary, run_text
    if output is not None and os.path.splitext(output)[1].lower() not in (".npz", ".params"):
        raise click.BadParameter(f"{output}: write outputs as OUT.npz (numpy) or OUT.params "
                                 "(TVM's param dict)", param_hint="-o/--output")
    job = job_from_options(graph, **opts)
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
        comparisons = compare(outputs, expected_outputs(job.files.expected, names,
                                                        job.graph.node_output_names), names,
                              rtol, atol)
    if output is not None:
        save_params_file(output, dict(zip(output_keys(job.graph), outputs)))
    doc = run_summary(job, outputs, timing, comparisons, rtol, atol)
    doc["saved"] = output
    if as_json:
        echo_json(doc)
    else:
        click.echo(run_text(doc))
    if comparisons is not None and not all(c.ok for c in comparisons):
        ctx.exit(1)


@app.command(name="compare")
@graph_argument
@stack(job_options, expected_option, tolerance_options, junit_option, json_option)
@click.pass_context
def compare_cmd(ctx: click.Context, graph: str, rtol: float, atol: float, junit: str | None,
                as_json: bool, **opts: Any) -> None:
    """Run GRAPH and compare every output with the expected values; exit 1 on a mismatch.

    Prints the max absolute and max relative error per output. An output matches when
    |got - expected| <= atol + rtol * |expected| for every element. On CUDA, float32 products
    then run in full float32, not TF32 (the default there, ~1e-3 off), unless
    GRAPH_RUNTIME_CUDA_TF32 is set.

    Examples:

    \b
      graphrun compare examples/graphs/cnn
      graphrun compare examples/graphs/simplex -d cpu -d opencl --rtol 1e-6 --junit report.xml
      graphrun compare examples/graphs/mlp/graph.json --lib examples/graphs/mlp/lib.json \\
          --params examples/graphs/mlp/params --inputs examples/graphs/mlp/inputs.npz \\
          --expected examples/graphs/mlp/expected.npz
    """
    from .job import compare, expected_outputs, output_names, resolve_files
    from .output import comparison_text
    from .regress import comparison_cases, write_junit
    if resolve_files(graph, expected=opts["expected"]).expected is None:
        raise CliError(f"compare {graph}: give --expected EXPECTED.npz (the graph is not an "
                       "example folder with an expected.npz)")
    job = job_from_options(graph, **opts)
    outputs = job.run()
    names = output_names(job.graph)
    comparisons = compare(outputs, expected_outputs(job.files.expected, names,
                                                    job.graph.node_output_names),
                          names, rtol, atol)
    suite = (job.files.folder or job.files.graph).stem
    if junit is not None:
        write_junit(junit, f"graphrun compare {suite}",
                    comparison_cases(comparisons, f"graphrun.compare.{suite}", job.seconds,
                                     rtol, atol))
    ok = all(c.ok for c in comparisons)
    if as_json:
        echo_json({"graph": str(job.files.graph), "expected": str(job.files.expected),
                   "devices": [d.spec for d in job.devices], "rtol": rtol, "atol": atol,
                   "ok": ok, "outputs": [vars(c) for c in comparisons]})
    else:
        click.echo(comparison_text(comparisons, str(job.files.expected), rtol, atol))
    if not ok:
        ctx.exit(1)


@app.command()
@graph_argument
@stack(job_options)
@click.option("--repeat", type=click.IntRange(min=1), default=10, show_default=True,
              help="Profiled runs after a warm-up; each node's time is its median.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="Rows of the table (the slowest nodes).")
@click.option("--trace", type=click.Path(dir_okay=False), metavar="TRACE.json",
              help="Write a Chrome trace (open in ui.perfetto.dev or chrome://tracing).")
@click.option("--plot", type=click.Path(dir_okay=False), metavar="PLOT.png",
              help="Draw time per node, coloured by device (needs matplotlib): .png, .svg "
                   "or .pdf.")
@json_option
def profile(graph: str, repeat: int, top: int, trace: str | None, plot: str | None,
            as_json: bool, **opts: Any) -> None:
    """Time every node of GRAPH, each step synchronising its device: a table sorted by time
    with % of total, then totals per device and for copies.

    Examples:

    \b
      graphrun profile examples/graphs/hetero_cnn --trace trace.json --plot profile.png
      graphrun profile examples/graphs/mlp -d opencl --repeat 50 --json
    """
    from .output import profile_summary, profile_text
    from .trace import plot_format, plot_profile, write_chrome_trace
    if plot is not None:
        plot_format(plot)  # refuse a suffix we cannot write before profiling
    job = job_from_options(graph, **opts)
    with progress(repeat, "profiling") as bar:
        times = job.module.profile(repeat, progress=lambda done: bar.update(1))
    if trace is not None:
        write_chrome_trace(times, trace)
    if plot is not None:
        plot_profile(times, plot, title=f"{job.files.graph}: median of {repeat} runs")
    doc = profile_summary(times)
    doc.update(graph=str(job.files.graph), devices=[d.spec for d in job.devices], repeat=repeat,
               trace=trace, plot=plot)
    # a symbolic graph's shape: new or kept, what specialising it cost
    cost = job.module.memory_report().shape
    doc["shape"] = None if cost is None else {**dataclasses.asdict(cost), "text": str(cost)}
    from ..lib.chain import kernel_note
    notes = {s.nid: kernel_note(s.kernel) for s in job.module.executor.steps}
    for step in doc["steps"]:
        step["kernel"] = notes.get(step["nid"], "")
    if as_json:
        echo_json(doc)
    else:
        click.echo(profile_text(doc, top))


@app.command()
@click.argument("suite", metavar="SUITE.toml", type=click.Path(exists=True, dir_okay=False))
@click.option("-k", "pattern", metavar="PATTERN",
              help="Run only cases whose id (name[cpu+opencl]) matches: a glob, else a substring.")
@stack(junit_option, json_option)
@click.pass_context
def regress(ctx: click.Context, suite: str, pattern: str | None, junit: str | None,
            as_json: bool) -> None:
    """Run a regression suite: every case on every device set it lists, compared with its
    expected outputs; exit 1 if any fails, or if every case was skipped. A device set with a
    device missing here is skipped; a misspelt device name is an error.

    \b
    A suite (paths relative to it):
      [defaults]
      devices = [["cpu"], ["cpu", "opencl"], ["cuda"]]
      rtol = 1e-4
      atol = 1e-5
      [[case]]
      name = "mlp"
      graph = "graphs/mlp"      # a graph JSON, or a folder whose files are the defaults
      # lib, params, inputs, expected, devices, rtol, atol, strict, seed
    A *.py lib named by a suite runs its code.

    Examples:

    \b
      graphrun regress examples/regress.toml
      graphrun regress examples/regress.toml -k 'cnn*' --junit report.xml
    """
    from .output import regress_summary, regress_text
    from .regress import junit_cases, load_suite, run_suite, selected, write_junit
    cases = load_suite(suite)
    if not ctx.find_root().params.get("verbose"):
        # Device sets without a graph's device fall back to ctxs[0] on purpose; don't warn.
        log.setLevel(logging.ERROR)
    with progress(len(selected(cases, pattern)), "cases", unit="case") as bar:
        results = run_suite(cases, pattern, progress=lambda result: bar.update(1))
    if not results:
        raise CliError(f"-k {pattern}: matches no case of {suite}; case ids look like "
                       f"{cases[0].name}[{'+'.join(cases[0].devices[0])}]")
    if junit is not None:
        write_junit(junit, f"graphrun regress {suite}", junit_cases(results, "graphrun.regress"))
    doc = regress_summary(results)
    doc["suite"] = suite
    if as_json:
        echo_json(doc)
    else:
        click.echo(regress_text(doc))
    if all(r.status == "skipped" for r in results):
        click.echo(f"graphrun: error: nothing ran: every case of {suite} was skipped (devices "
                   "missing here); a suite that checks nothing fails", err=True)
        ctx.exit(1)
    if doc["failed"] or doc["errors"]:
        ctx.exit(1)


for command in (validate, info, devices, viz, plan, import_cmd, tuning_cmd):
    app.add_command(command)

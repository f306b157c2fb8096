"""`graphrun tuning`: what the tuning service chose per key and measured, and --clear."""
from __future__ import annotations

from typing import Any

import click

from .common import echo_json, json_option


@click.command(name="tuning")
@click.option("--clear", is_flag=True,
              help="Empty the tuning cache: the next create() of each kernel measures again.")
@json_option
def tuning_cmd(clear: bool, as_json: bool) -> None:
    """The kernels the tuning service chose per key (op shapes, device, threads), each
    candidate's measured time, and where the cache file is.

    Kernels with several strategies (CPU and OpenCL conv2d, dense variants) are timed once per
    key and remembered there, so later processes pick the same ones without measuring. The
    measured column says how sure the choice was: clear, within noise (the default kept), or
    busy (other processes kept the CPUs busy: the next process measures it again).
    GRAPH_RUNTIME_TUNING_CACHE moves the cache folder, or turns the file off (off).

    Examples:

    \b
      graphrun tuning
      graphrun run examples/graphs/cnn && graphrun tuning --json
      graphrun tuning --clear
    """
    from .._text import count_of
    from ..lib import tuning
    if clear:
        path = tuning.cache_path()
        cleared = tuning.clear()
        if as_json:
            echo_json({"path": None if path is None else str(path), "cleared": cleared})
        elif path is None:
            click.echo("the tuning cache is off (GRAPH_RUNTIME_TUNING_CACHE=off): nothing to clear")
        else:
            click.echo(f"cleared {count_of(cleared, 'choice')} from {path}")
        return
    doc = tuning.listing()
    if as_json:
        echo_json(doc)
    else:
        click.echo(_text(doc))


def _text(doc: dict[str, Any]) -> str:
    from .._text import count_of, table
    if doc["path"] is None:
        return f"tuning cache: off ({doc['setting']}=off); choices live in each process only"
    lines = [f"tuning cache: {doc['path']} ({count_of(len(doc['entries']), 'choice')})"]
    rows = []
    for e in doc["entries"]:
        times = ", ".join(f"{name} {seconds * 1e3:.3f}{'*' if name == e['chosen'] else ''}"
                          for name, seconds in sorted(e["seconds"].items(),
                                                      key=lambda item: item[1]))
        rows.append([e["choice"], e["device"], e["threads"], e["key"], e["chosen"],
                     e["confidence"], times])
    if rows:
        lines.append(table(["choice", "device", "threads", "key", "chosen", "measured",
                            "times (ms, * chosen)"], rows))
    else:
        lines.append("  nothing measured yet (a create() of a kernel with several strategies "
                     "measures and remembers its choice)")
    return "\n".join(lines)

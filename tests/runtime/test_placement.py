"""Placement: entry devices from device_index, the ctxs[0] fallback and its warning."""
from __future__ import annotations

import logging

import pytest
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.errors import GraphError
from graph_runtime.runtime import placement


def test_the_fallback_warning_is_short_and_given_once(caplog: pytest.LogCaptureFixture) -> None:
    placement._warned.clear()
    nodes = [null("x")] + [tvm_op(f"n{k}", "relu", [k]) for k in range(12)]
    g = make_graph(nodes, [12], device_index=[2] * 13)
    with caplog.at_level(logging.WARNING, logger="graph_runtime"):
        for _ in range(3):
            placement.resolve_entry_devices(g, [gr.cpu()], strict=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["<graph>: device_index asks for cuda, not in ctxs (cpu:0); 13 entries "
                        "run on cpu:0"]
    with pytest.raises(GraphError, match=r"asks for cuda for 13 entries \(node 0 'x', .* and 5 "
                                         r"more\) but ctxs are cpu:0"):
        placement.resolve_entry_devices(g, [gr.cpu()], strict=True)

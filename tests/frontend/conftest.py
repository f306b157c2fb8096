"""Frontend test hooks: tally the ONNX node-test outcomes, print them, rewrite the list on request."""
from __future__ import annotations

import pytest

_NODE_TESTS = "test_onnx_node_tests.py::test_onnx_node_"
_OUTCOMES: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each node-test case's outcome (pass / refused / failed / regressed) per device."""
    if report.when != "call" or _NODE_TESTS not in report.nodeid:
        return
    func, _, rest = report.nodeid.rpartition("::")[2].partition("[")
    device = func.rsplit("_", 1)[1]
    status = dict(report.user_properties).get("onnx_outcome")
    if report.failed:
        status = "regressed" if status is not None else "failed"
    _OUTCOMES.setdefault(device, {})[rest[:-1]] = str(status)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With GRAPH_RUNTIME_UPDATE_ONNX_PASSING=1 and every CPU case run, rewrite the list."""
    from onnx_node_cases import node_cases, update_requested, write_passing_list
    cpu = _OUTCOMES.get("cpu", {})
    if not update_requested() or not cpu:
        return
    if len(cpu) != len(node_cases()):
        session.config._onnx_list_note = (  # type: ignore[attr-defined]
            f"not rewriting the passing list: only {len(cpu)} of {len(node_cases())} CPU cases ran")
        return
    write_passing_list([name for name, status in cpu.items() if status == "pass"])
    session.config._onnx_list_note = "rewrote tests/frontend/onnx_node_passing.txt"  # type: ignore


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    """One summary line per device: the counts the README quotes."""
    for device, cases in sorted(_OUTCOMES.items()):
        counts: dict[str, int] = {}
        for status in cases.values():
            counts[status] = counts.get(status, 0) + 1
        parts = ", ".join(f"{counts[s]} {s}" for s in ("pass", "refused", "failed", "regressed")
                          if s in counts)
        terminalreporter.write_line(f"ONNX backend node tests on {device}: {len(cases)} cases "
                                    f"run: {parts}")
    note = getattr(config, "_onnx_list_note", None)
    if note:
        terminalreporter.write_line(note)

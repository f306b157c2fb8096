"""graphrun through click's CliRunner: every command, every exit code, and the one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from support import backend_missing, make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.cli.app import app
from graph_runtime.params import save_params_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"
SIMPLEX = EXAMPLES / "simplex"
DUPLEX = EXAMPLES / "duplex"
COMMANDS = ["run", "compare", "profile", "regress", "validate", "info", "devices", "viz", "plan",
            "tuning"]


def invoke(*args: object) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result: object, *fragments: str) -> str:
    """The result is exit 2 with one `graphrun: error:` line naming every fragment."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphrun: error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- help -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_ends_with_examples_using_examples_files(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    examples = result.output.split("Examples:")[1].split("Options:")[0]
    lines = [line.strip() for line in examples.splitlines()
             if line.strip().startswith("graphrun")]
    assert lines and (lines[0] + " ").startswith(f"graphrun {command} "), examples
    if command != "devices":
        assert "examples/" in examples


def test_help_says_which_libs_run_code() -> None:
    text = " ".join(invoke("run", "--help").output.split())
    assert "*.json runs no code" in text and "*.py RUNS ITS CODE" in text


def test_group_help_and_version() -> None:
    assert "graphrun run examples/graphs/hetero_cnn" in invoke("--help").output
    assert invoke("--version").output.startswith("graphrun, version")


# ---- run --------------------------------------------------------------------------------------

def test_run_example_folder_prints_outputs_and_matches_expected(opencl_available: None) -> None:
    result = invoke("run", SIMPLEX)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "cpu:0" in out and "opencl:0" in out
    assert "1 on cpu:0, 1 on opencl:0; 1 copy opencl:0 -> cpu:0 (16 B)" in out
    assert "elemwise_sub" in out and "(4,)" in out and "float32" in out
    assert "expected   OK: every output matches" in out and "max abs err" in out


def test_run_json_with_repeat_and_saved_outputs(addw: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out.npz"
    result = invoke("run", addw, "-d", "cpu", "--repeat", 3, "-o", out_file, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["devices"][0]["device"] == "cpu:0"
    assert doc["params"].endswith("params") and doc["random_inputs"] == []
    assert doc["outputs"][0]["name"] == "minus" and doc["outputs"][0]["shape"] == [4]
    assert doc["timing"]["runs"] == 3 and doc["timing"]["median_s"] > 0
    assert doc["expected"]["ok"] is True
    with np.load(out_file) as saved, np.load(addw / "expected.npz") as want:
        np.testing.assert_allclose(saved["output_0"], want["output_0"], rtol=1e-6)


def test_run_draws_missing_inputs_at_random_with_a_note(addw: Path) -> None:
    graph = addw / "graph.json"
    result = invoke("run", graph, "-d", "cpu", "--seed", 7, "--json")
    assert result.exit_code == 0, result.output
    assert "drew random values (seed 7)" in result.stderr and "'x'" in result.stderr
    first = json.loads(result.stdout)["outputs"][0]["summary"]
    again = json.loads(invoke("run", graph, "-d", "cpu", "--seed", 7, "--json").stdout)
    assert again["outputs"][0]["summary"] == first


def test_run_input_flag_overrides_and_softmax_gets_top5(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("prob", "exp", [0])], heads=[1], shapes=(1, 10))
    (tmp_path / "g.json").write_text(graph.to_json())
    # exp of log-probabilities is a probability vector: the summary lists the top classes.
    probs = np.array([[0.05, 0.3, 0.05, 0.1, 0.02, 0.08, 0.2, 0.1, 0.05, 0.05]], "float32")
    np.save(tmp_path / "x.npy", np.log(probs))
    result = invoke("run", tmp_path / "g.json", "-d", "cpu", "--input", f"x={tmp_path / 'x.npy'}")
    assert result.exit_code == 0, result.output
    assert "top-5: 1 (0.300), 6 (0.200), 3 (0.100), 7 (0.100), 5 (0.080)" in result.stdout


def test_run_mismatch_with_expected_exits_1(addw: Path) -> None:
    np.savez(addw / "expected.npz", output_0=np.full(4, 100.0, "float32"))
    result = invoke("run", addw, "-d", "cpu")
    assert result.exit_code == 1
    assert "MISMATCH" in result.stdout and "output 0 'minus'" in result.stdout


def test_library_warnings_and_verbose_info_go_to_stderr(opencl_available: None,
                                                        tmp_path: Path) -> None:
    import logging
    log = logging.getLogger("graph_runtime")
    before = (log.level, list(log.handlers))
    from graph_runtime.runtime import placement
    placement._warned.clear()  # the fallback warning is given once per process
    result = invoke("run", SIMPLEX, "-d", "cpu", "--json")
    assert result.exit_code == 0
    assert "graphrun: warning: " in result.stderr
    assert "device_index asks for opencl" in result.stderr
    json.loads(result.stdout)  # warnings never mix into the JSON
    graph = make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1], device_index=[1, 4])
    (tmp_path / "g.json").write_text(graph.to_json())
    result = invoke("-v", "run", tmp_path / "g.json", "-d", "cpu", "-d", "opencl")
    assert result.exit_code == 0, result.output
    assert "graphrun: info: " in result.stderr and "inserted a copy of eid 0" in result.stderr
    assert "1 inserted copy cpu:0 -> opencl:0" in result.stdout
    assert (log.level, list(log.handlers)) == before  # the CLI leaves logging as it was


# ---- one-line errors (exit 2) -------------------------------------------------------------------

def test_malformed_graph_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [}')
    one_line_error(invoke("run", bad), "bad.json", "not valid JSON", "line 1")


def test_graph_failing_checks_is_one_line(tmp_path: Path) -> None:
    doc = json.loads(make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1]).to_json())
    doc["node_row_ptr"] = [0, 1, 3]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    one_line_error(invoke("run", tmp_path / "g.json", "-d", "cpu"), "node_row_ptr")


def test_missing_input_file_is_one_line() -> None:
    one_line_error(invoke("run", SIMPLEX, "-d", "cpu", "--input", "A=no_such.npy"),
                   "--input A=no_such.npy", "no such file")


def test_missing_graph_and_lib_are_one_line(tmp_path: Path) -> None:
    one_line_error(invoke("run", tmp_path / "nothing"), "no such graph file or example folder")
    one_line_error(invoke("run", SIMPLEX, "--lib", tmp_path / "lib.json"), "lib.json",
                   "does not exist")


def test_unknown_device_is_one_line_naming_the_flag() -> None:
    line = one_line_error(invoke("run", SIMPLEX, "-d", "tpu"), "-d tpu: unknown device type 'tpu'")
    assert "expected one of: cpu, cuda, opencl" in line
    one_line_error(invoke("run", SIMPLEX, "-d", "cpu:7"), "-d cpu:7", "does not exist")
    one_line_error(invoke("run", SIMPLEX, "-d", "cpu", "-d", "cpu:0"), "given twice")


def test_absent_cuda_is_one_line_saying_what_to_install() -> None:
    reason = backend_missing("cuda")
    if reason is None:
        pytest.skip("this machine has CUDA")
    one_line_error(invoke("run", SIMPLEX, "-d", "cuda"), "-d cuda:")


def test_params_mismatch_is_one_line(addw: Path) -> None:
    save_params_file(addw / "params", {"w": np.zeros(5, "float32")})
    one_line_error(invoke("run", addw, "-d", "cpu"), "params", "'w'", "(5,)", "(4,)")


def test_input_shape_and_name_mistakes_are_one_line(addw: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros(3, "float64"))
    one_line_error(invoke("run", addw, "-d", "cpu", "--input", f"x={tmp_path / 'x.npy'}"),
                   "--input x=", "expects (4,) float32, got (3,) float64")
    one_line_error(invoke("run", addw, "-d", "cpu", "--input", f"q={tmp_path / 'x.npy'}"),
                   "graph has no input 'q'; inputs are: x, w, z")
    one_line_error(invoke("run", addw, "-d", "cpu", "--input", "x"), "expected NAME=FILE.npy")


def test_debug_shows_the_traceback() -> None:
    result = invoke("--debug", "run", SIMPLEX, "-d", "tpu")
    assert result.exit_code != 0
    assert isinstance(result.exception, gr.DeviceError)


def test_click_usage_errors_exit_2() -> None:
    assert invoke("run").exit_code == 2
    assert invoke("run", SIMPLEX, "--repeat", 0).exit_code == 2
    assert invoke("nonsense").exit_code == 2


# ---- compare ----------------------------------------------------------------------------------

def test_compare_ok_and_junit(addw: Path, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET
    report = tmp_path / "report.xml"
    result = invoke("compare", addw, "-d", "cpu", "--junit", report)
    assert result.exit_code == 0, result.output
    assert "OK: 1 output matches" in result.stdout
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == ["output 0 minus"]


def test_compare_mismatch_exits_1_with_errors_per_output(addw: Path, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET
    with np.load(addw / "expected.npz") as f:
        want = f["output_0"]
    np.savez(addw / "expected.npz", output_0=want + np.float32(0.5))
    result = invoke("compare", addw, "-d", "cpu", "--junit", tmp_path / "r.xml", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["outputs"][0]["max_abs"] == pytest.approx(0.5)
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"


def test_compare_shape_mismatch_and_missing_expected(addw: Path) -> None:
    np.savez(addw / "expected.npz", output_0=np.zeros(5, "float32"))
    result = invoke("compare", addw, "-d", "cpu")
    assert result.exit_code == 1 and "expected (5,) float32, got (4,) float32" in result.stdout
    np.savez(addw / "expected.npz", other=np.zeros(4, "float32"))
    one_line_error(invoke("compare", addw, "-d", "cpu"), "no array for output 0 'minus'",
                   "it has: other")
    one_line_error(invoke("compare", addw / "graph.json", "-d", "cpu"), "give --expected")


# ---- validate ---------------------------------------------------------------------------------

def test_validate_ok(addw: Path) -> None:
    result = invoke("validate", addw)
    assert result.exit_code == 0, result.output
    assert "OK: no problems found" in result.stdout and "params" in result.stdout


def test_validate_reports_every_graph_problem(tmp_path: Path) -> None:
    doc = json.loads(make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1]).to_json())
    doc["heads"] = [[7, 0, 0]]
    doc["attrs"]["storage_id"][1] = [0]
    doc["nodes"][1]["inputs"] = [[1, 0, 0]]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    result = invoke("validate", tmp_path / "g.json", "--json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 3, problems
    assert any("node 1 'y' input 0 refers to node 1 itself" in p for p in problems)
    assert any("$.heads[0]" in p and "node 7" in p for p in problems)
    assert any("$.attrs.storage_id" in p for p in problems)
    text = invoke("validate", tmp_path / "g.json").stdout
    assert "3 problems found" in text and "  3. " in text


def test_validate_reports_a_schema_problem_and_unreadable_json(tmp_path: Path) -> None:
    doc = json.loads(make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1]).to_json())
    doc["attrs"]["dltype"][1][0] = "float99"
    (tmp_path / "g.json").write_text(json.dumps(doc))
    result = invoke("validate", tmp_path / "g.json")
    assert result.exit_code == 1 and "$.attrs.dltype[1][0]" in result.stdout
    (tmp_path / "bad.json").write_text("{")
    result = invoke("validate", tmp_path / "bad.json")
    assert result.exit_code == 1 and "not valid JSON" in result.stdout


def test_validate_reports_lib_and_params_problems_together(addw: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib.json"
    lib.write_text(json.dumps({"format": "graph_runtime.lib", "version": 1,
                               "functions": {"add": {"op": "add"},
                                             "subtract": {"op": "add", "devices": ["cpu"]}}}))
    save_params_file(addw / "params", {"w": np.zeros(5, "float32"), "v": np.zeros(1, "int8")})
    result = invoke("validate", addw, "--lib", lib, "-d", "opencl")
    assert result.exit_code == 1
    out = result.stdout
    assert "no function 'subtract' for opencl (node 4 'minus'); it exists for: cpu" in out
    assert "param 'w' is (5,) float32 but the graph's input 'w' (eid 1) is (4,) float32" in out
    assert "param 'v' is not an input of the graph" in out
    assert "3 problems found" in out


def test_validate_checks_output_shapes_the_lib_would_make(tmp_path: Path) -> None:
    graph = make_graph([null("x"), null("y"), tvm_op("s", "add", [0, 1])], heads=[2],
                       shapes=[[4], [1], [3]])
    (tmp_path / "g.json").write_text(graph.to_json())
    result = invoke("validate", tmp_path / "g.json", "-d", "cpu")
    assert result.exit_code == 1
    assert "node 2 's' on cpu:0" in result.stdout and "(4,)" in result.stdout


# ---- info -------------------------------------------------------------------------------------

def test_info_placement_matches_the_module(opencl_available: None) -> None:
    result = invoke("info", DUPLEX, "-d", "cpu", "-d", "opencl", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    module = gr.create(DUPLEX / "graph.json", DUPLEX / "lib.json", [gr.cpu(), gr.opencl()])
    assert [(p["nid"], p["device"]) for p in doc["placement"]] == [
        (nid, dev.spec) for nid, _, _, dev in module.placement()]
    assert doc["copies"] == [
        {"src": "cpu:0", "dst": "opencl:0", "inserted": False, "count": 1, "bytes": 16},
        {"src": "opencl:0", "dst": "cpu:0", "inserted": False, "count": 1, "bytes": 16}]
    report = module.memory_report()
    assert {p["device"]: p["bytes"] for p in doc["pool"]} == {
        d.spec: n for d, n in report.pool.items()}
    assert {p["device"]: p["unshared_bytes"] for p in doc["pool"]} == {
        d.spec: n for d, n in report.unshared.items()}


def test_info_needs_no_lib_nor_devices_and_counts_inserted_copies(tmp_path: Path) -> None:
    # y lives on cuda (code 2) and reads x on the cpu without a __copy: one would be inserted.
    graph = make_graph([null("x"), tvm_op("y", "relu", [0]), null("p0"),
                        tvm_op("z", "add", [1, 2])], heads=[3],
                       device_index=[1, 2, 2, 2])
    (tmp_path / "g.json").write_text(graph.to_json())
    result = invoke("info", tmp_path / "g.json", "-d", "cpu", "-d", "cuda:0")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "inputs (1, 16 B)" in out and "params (1, 16 B)" in out
    assert "cpu:0  cuda:0  inserted      1  16 B" in out
    assert "kernels per device: cuda:0: 2" in out
    doc = json.loads(invoke("info", tmp_path / "g.json", "-d", "cpu", "-d", "cuda",
                            "--json").stdout)
    assert doc["copies"] == [{"src": "cpu:0", "dst": "cuda:0", "inserted": True, "count": 1,
                              "bytes": 16}]
    # three 16-byte entries on cuda:0 plus the inserted copy's buffer
    assert doc["pool"][1] == {"device": "cuda:0", "bytes": 64, "unshared_bytes": 64}
    doc = json.loads(invoke("info", tmp_path / "g.json", "-d", "cpu", "--json").stdout)
    assert {p["device"] for p in doc["placement"]} == {"cpu:0"}
    assert doc["functions"] == {"relu": 1, "add": 1}


def test_info_refuses_a_node_with_outputs_on_two_devices_as_create_does(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("s", "split", [0], num_outputs=2,
                                          indices_or_sections=2)],
                       heads=[(1, 0), (1, 1)], device_index=[1, 1, 2])
    (tmp_path / "g.json").write_text(graph.to_json())
    one_line_error(invoke("info", tmp_path / "g.json", "-d", "cpu", "-d", "cuda"),
                   "node 1 's' has outputs on several devices", "eid 2 on cuda:0",
                   "a node runs on one device")


def test_info_splits_inputs_and_params_by_file(addw: Path) -> None:
    doc = json.loads(invoke("info", addw, "--json").stdout)
    assert [r["name"] for r in doc["inputs"]] == ["x", "z"]
    assert [r["name"] for r in doc["params"]] == ["w"]
    assert doc["outputs"] == [{"index": 0, "name": "minus", "node": "minus", "shape": [4],
                               "dtype": "float32"}]


# ---- devices ----------------------------------------------------------------------------------

def test_devices_lists_cpu_and_explains_what_is_missing() -> None:
    result = invoke("devices")
    assert result.exit_code == 0
    assert "cpu:0" in result.stdout
    assert "cpu kernels: " in result.stdout  # oneDNN's version, or why it is not used
    assert "CPU round trip" in result.stdout  # in ns, or why not measured
    doc = json.loads(invoke("devices", "--json").stdout)
    assert "oneDNN" in doc["cpu_kernels"] and doc["cpu_round_trip"].startswith("CPU round trip")
    assert doc["devices"][0]["device"] == "cpu:0" and doc["devices"][0]["memory_bytes"] > 0
    for kind in ("opencl", "cuda"):
        reason = backend_missing(kind)
        if reason is not None:
            assert kind in doc["missing"] and doc["missing"][kind]


# ---- profile ----------------------------------------------------------------------------------

def test_profile_trace_plot_and_table(opencl_available: None, tmp_path: Path) -> None:
    trace, plot = tmp_path / "trace.json", tmp_path / "profile.png"
    result = invoke("profile", DUPLEX, "-d", "cpu", "-d", "opencl", "--repeat", 3,
                    "--trace", trace, "--plot", plot)
    assert result.exit_code == 0, result.output
    assert "median of 3 runs" in result.stdout and "copies" in result.stdout
    assert "node 8 'elemwise_add1'" in result.stdout
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 5  # 3 kernels and 2 __copy nodes
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == ["cpu:0", "opencl:0"]
    assert {e["tid"] for e in spans} == set(names)
    by_device = {names[e["tid"]] for e in spans if "elemwise_add" in e["name"]}
    assert by_device == {"opencl:0"}
    starts = [e["ts"] for e in spans]
    assert starts == sorted(starts)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_json(addw: Path) -> None:
    result = invoke("profile", addw, "-d", "cpu", "--repeat", 2, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [s["label"] for s in doc["steps"]] != []
    assert sum(s["percent"] for s in doc["steps"]) == pytest.approx(100.0)
    assert set(doc["per_device_s"]) == {"cpu:0"}
    assert doc["shape"] is None  # a static graph



def test_profile_of_a_symbolic_graph_says_what_its_shape_cost(tmp_path: Path) -> None:
    g = make_graph([null("x"), tvm_op("relu0", "relu", [0])], [1], shapes=[["batch", 4]] * 2)
    (tmp_path / "graph.json").write_text(g.to_json())
    x = tmp_path / "x.npy"
    np.save(x, np.ones((3, 4), np.float32))
    result = invoke("profile", tmp_path, "-d", "cpu", "--input", f"x={x}", "--json")
    assert result.exit_code == 0, result.output
    shape = json.loads(result.stdout)["shape"]
    assert shape["shape"] == "batch=3" and shape["kept_shapes"] == 1
    assert shape["infer_s"] >= 0 and shape["prepare_s"] > 0
    text = invoke("profile", tmp_path, "-d", "cpu", "--input", f"x={x}")
    assert text.exit_code == 0, text.output
    assert "shape batch=3: " in text.output and "specialised in" in text.output


# ---- plan -------------------------------------------------------------------------------------

def test_plan_writes_a_graph_that_runs(opencl_available: None, addw: Path, tmp_path: Path) -> None:
    planned = tmp_path / "planned.json"
    result = invoke("plan", addw, "--default", "cpu", "--place", "plus=opencl", "-o", planned)
    assert result.exit_code == 0, result.output
    assert "1 copy (16 B per run)" in result.stdout and f"wrote {planned}" in result.stdout
    run = invoke("compare", planned, "-d", "cpu", "-d", "opencl", "--params", addw / "params",
                 "--inputs", addw / "inputs.npz", "--expected", addw / "expected.npz")
    assert run.exit_code == 0, run.output
    doc = json.loads(invoke("info", planned, "-d", "cpu", "-d", "opencl", "--json").stdout)
    assert {p["name"]: p["device"] for p in doc["placement"]}["plus"] == "opencl:0"


def test_plan_json_and_bad_constraint(addw: Path) -> None:
    result = invoke("plan", addw, "--input", "x=opencl", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["copies"] and doc["copies"][0]["src"] == "opencl:0"
    one_line_error(invoke("plan", addw, "--place", "nope*=opencl"), "nope*", "matches no node")
    one_line_error(invoke("plan", addw, "--place", "plus"), "--place", "NAME=DEVICE")


# ---- the installed script and python cli.py ------------------------------------------------------

def _graphrun() -> Path:
    exe = Path(sys.executable).parent / ("graphrun.exe" if os.name == "nt" else "graphrun")
    if not exe.exists():
        pytest.skip(f"graphrun is not installed next to {sys.executable}; pip install -e .")
    return exe


def test_installed_graphrun_runs_an_example() -> None:
    done = subprocess.run([str(_graphrun()), "run", str(SIMPLEX), "-d", "cpu"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "expected   OK" in done.stdout


def test_installed_graphrun_error_is_one_line_with_exit_2() -> None:
    done = subprocess.run([str(_graphrun()), "run", str(SIMPLEX), "-d", "tpu"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("graphrun: error: -d tpu")


def test_python_cli_py_from_the_checkout() -> None:
    done = subprocess.run([sys.executable, "cli.py", "info", "examples/graphs/simplex", "-d",
                           "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "placement" in done.stdout
    usage = subprocess.run([sys.executable, "cli.py", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, check=False)
    assert usage.returncode == 0 and usage.stdout.startswith("Usage: graphrun")


def test_main_ends_the_process_with_outputs_written_and_atexit_run(tmp_path: Path) -> None:
    # main() skips the interpreter's teardown (os._exit): what a command writes, stdout,
    # stderr, the exit status and the atexit handlers must all survive that.
    out = tmp_path / "out.npz"
    marker = tmp_path / "atexit.txt"
    program = ("import atexit, sys; from pathlib import Path; "
               f"atexit.register(Path({str(marker)!r}).write_text, 'ran'); "
               "from graph_runtime.cli.app import main; main(sys.argv[1:])")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", program, "run", str(SIMPLEX), "-d", "cpu",
                           "-o", str(out), "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["saved"] == str(out)
    assert marker.read_text() == "ran"
    expected = np.load(SIMPLEX / "expected.npz")
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["output_0"], expected[expected.files[0]], rtol=1e-5)
    failed = subprocess.run([sys.executable, "-c", program, "run", str(tmp_path / "none")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert failed.returncode == 2
    assert failed.stderr.startswith("graphrun: error:") and "none" in failed.stderr


def test_progress_bars_stay_quiet_without_a_tty(addw: Path) -> None:
    result = invoke("run", addw, "-d", "cpu", "--repeat", 5)
    assert result.exit_code == 0
    assert "it/s" not in result.output and "run/s" not in result.output



def test_progress_bar_shows_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from graph_runtime.cli.common import progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress(4, "timing") as bar:
        assert bar.disable is False
        for _ in range(4):
            bar.update(1)
    assert "timing" in terminal.getvalue()


# ---- issue 13: input paths and papercuts ---------------------------------------------------------

@pytest.mark.parametrize("flag, value", [("--rtol", "-1"), ("--rtol", "nan"), ("--atol", "-5")])
def test_bad_tolerances_are_usage_errors(flag: str, value: str) -> None:
    result = invoke("compare", SIMPLEX, "-d", "cpu", flag, value)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.stderr and "expected a finite number >= 0" in (
        result.stderr)


def test_a_graph_that_is_a_fifo_or_device_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "graph.fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        one_line_error(invoke("run", path), "not a regular file (a FIFO or a device)")


def test_a_huge_graph_is_refused_before_inputs_are_drawn(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1], shapes=(1 << 20, 1 << 20))
    (tmp_path / "graph.json").write_text(graph.to_json())
    one_line_error(invoke("run", tmp_path / "graph.json", "-d", "cpu"), "the cap is")


def test_without_params_the_note_names_params(addw: Path) -> None:
    result = invoke("run", addw / "graph.json", "-d", "cpu")
    assert "give weights with --params" in result.stderr


def test_profile_plot_writes_svg_and_refuses_other_suffixes(addw: Path, tmp_path: Path) -> None:
    svg = tmp_path / "p.svg"
    result = invoke("profile", addw / "graph.json", "-d", "cpu", "--repeat", "1", "--plot", svg)
    assert result.exit_code == 0, result.output
    assert b"<svg" in svg.read_bytes()[:500]
    assert "func_name is blank where it is the node's name" in result.stdout
    one_line_error(invoke("profile", addw / "graph.json", "-d", "cpu", "--plot",
                          tmp_path / "p.jpg"), "cannot write '.jpg' images")


def test_run_refuses_an_output_suffix_it_cannot_write(addw: Path, tmp_path: Path) -> None:
    result = invoke("run", addw / "graph.json", "-d", "cpu", "-o", tmp_path / "out.txt")
    assert result.exit_code == 2 and "OUT.npz (numpy) or OUT.params" in result.stderr
    assert not (tmp_path / "out.txt").exists()


def test_chart_labels_keep_the_distinct_end_of_long_names() -> None:
    from graph_runtime.cli.trace import _short
    from graph_runtime.runtime.executor import NodeTime
    names = ["tvmgen_default_fused_nn_dense_add_nn_relu", "tvmgen_default_fused_nn_dense_add_1"]
    labels = [_short(NodeTime(3 + i, f"node {3 + i} '{n}'", n, gr.cpu(), False, 1.0))
              for i, n in enumerate(names)]
    assert labels == ["node 3 '...ault_fused_nn_dense_add_nn_relu'",
                      "node 4 'tvmgen_default_fused_nn_dense_add_1'"]
    assert all(len(label) <= 44 for label in labels)

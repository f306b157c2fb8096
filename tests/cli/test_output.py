"""graph_runtime.cli.output called directly: run, compare, profile and plan summaries and text."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import make_graph, null, tvm_op

from graph_runtime.cli.job import (Comparison, GraphFiles, compare, expected_outputs,
                                   job_from_files, output_names, resolve_files)
from graph_runtime.cli.output import (comparison_text, looks_like_probabilities, plan_summary,
                                      profile_summary, profile_text, run_summary, run_text,
                                      summarize, summary_text)
from graph_runtime.device import cpu, opencl
from graph_runtime.lib import Module
from graph_runtime.planner import Placement, plan_graph
from graph_runtime.runtime.executor import NodeTime

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"
MLP = EXAMPLES / "mlp"
RTOL, ATOL = 1e-4, 1e-5


def run_doc(folder: Path, devices: list, timing: dict | None = None) -> tuple[dict, list]:
    """run_summary of one real run of an example folder, compared with its expected.npz."""
    job = job_from_files(resolve_files(folder), devices)
    outputs = job.run()
    names = output_names(job.graph)
    comparisons = compare(outputs, expected_outputs(job.files.expected, names), names, RTOL, ATOL)
    timing = timing or {"runs": 1, "first_run_s": job.seconds}
    return run_summary(job, outputs, timing, comparisons, RTOL, ATOL), outputs


def node_times() -> list[NodeTime]:
    c, o = cpu(0), opencl(0)
    return [NodeTime(3, "node 3 'conv'", "fused_conv", o, False, 0.006),
            NodeTime(4, "node 4 '__copy_x'", "__copy", c, True, 0.001),
            NodeTime(5, "node 5 'dense'", "fused_dense", c, False, 0.002),
            NodeTime(6, "node 6 'softmax'", "softmax", c, False, 0.001)]


# ---- summarize -----------------------------------------------------------------------------------

def test_looks_like_probabilities() -> None:
    assert looks_like_probabilities(np.array([[0.7, 0.2, 0.1]], dtype="float32"))
    assert not looks_like_probabilities(np.array([[0.7, 0.2, 0.2]], dtype="float32"))
    assert not looks_like_probabilities(np.array([1.5, -0.5], dtype="float32"))
    assert not looks_like_probabilities(np.array([[1.0], [1.0]], dtype="float32"))
    assert not looks_like_probabilities(np.array([1, 0], dtype="int32"))
    assert not looks_like_probabilities(np.zeros((0, 3), dtype="float32"))
    assert not looks_like_probabilities(np.float32(1.0) * np.ones(()))


def test_summarize_gives_min_max_mean_and_top_classes_of_the_first_row() -> None:
    probs = np.array([[0.1, 0.6, 0.05, 0.25], [0.9, 0.05, 0.03, 0.02]], dtype="float32")
    summary = summarize(probs, top=2)
    assert summary["min"] == pytest.approx(0.02) and summary["max"] == pytest.approx(0.9)
    assert summary["mean"] == pytest.approx(0.25)
    assert [i for i, _ in summary["top"]] == [1, 3]
    assert summary["top"][0][1] == pytest.approx(0.6)
    assert summary_text(summary) == "top-2: 1 (0.600), 3 (0.250)"


def test_summarize_plain_values_and_empty() -> None:
    summary = summarize(np.array([-2, 4, 1], dtype="int64"))
    assert summary == {"min": -2.0, "max": 4.0, "mean": 1.0}
    assert summary_text(summary) == "min -2, max 4, mean 1"
    assert summarize(np.zeros(0, dtype="float32")) == {}
    assert summary_text({}) == "empty"


# ---- run_summary, run_text -----------------------------------------------------------------------

def test_run_summary_of_mlp_on_cpu() -> None:
    doc, outputs = run_doc(MLP, [cpu(0)])
    assert doc["graph"] == str(MLP / "graph.json")
    assert doc["lib"] == str(MLP / "lib.json") and doc["params"] == str(MLP / "params")
    assert [d["device"] for d in doc["devices"]] == ["cpu:0"]
    assert doc["kernels_per_device"] == {"cpu:0": 4}
    assert doc["copies"] == [] and doc["random_inputs"] == []
    (out,) = doc["outputs"]
    assert (out["index"], out["name"], out["shape"], out["dtype"]) == (
        0, "tvmgen_default_fused_nn_softmax", [1, 10], "float32")
    assert out["summary"]["top"][0][0] == int(np.argmax(outputs[0]))
    exp = doc["expected"]
    assert exp["ok"] and exp["file"] == str(MLP / "expected.npz")
    assert (exp["rtol"], exp["atol"]) == (RTOL, ATOL)
    assert exp["outputs"][0]["max_abs"] < ATOL


def test_run_text_of_mlp_says_expected_ok_with_the_error_and_tolerances() -> None:
    doc, _ = run_doc(MLP, [cpu(0)], {"runs": 1, "first_run_s": 0.0125})
    text = run_text(doc)
    worst = doc["expected"]["outputs"][0]["max_abs"]
    assert f"graph      {MLP / 'graph.json'} (lib {MLP / 'lib.json'}, params {MLP / 'params'})" \
        in text
    assert "placement  kernels: 4 on cpu:0; no copies" in text
    assert "time       12.500 ms (first run, with one-time setup)" in text
    assert "median" not in text
    assert (f"expected   OK: every output matches {MLP / 'expected.npz'} (max abs err "
            f"{worst:.3g}; rtol 0.0001, atol 1e-05)") in text


def test_run_summary_without_expected_and_with_random_inputs(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("neg", "negative", [0])], heads=[1])
    (tmp_path / "g.json").write_text(graph.to_json())
    job = job_from_files(GraphFiles(tmp_path / "g.json"), [cpu(0)])
    outputs = job.run()
    doc = run_summary(job, outputs, {"runs": 1, "first_run_s": 0.001}, None, RTOL, ATOL)
    assert doc["expected"] is None and doc["lib"] is None and doc["params"] is None
    assert doc["random_inputs"] == ["x"]
    assert doc["outputs"][0]["summary"]["min"] == pytest.approx(float(outputs[0].min()))
    text = run_text(doc)
    assert "expected" not in text
    assert text.splitlines()[0] == f"graph      {tmp_path / 'g.json'}"


def test_run_text_renders_timing_mismatch_copies_and_saved_file() -> None:
    doc = {"graph": "g.json", "lib": None, "params": "p.params",
           "devices": [{"device": "cpu:0", "name": "Some CPU"},
                       {"device": "opencl:0", "name": "pthread-cpu"}],
           "kernels_per_device": {"cpu:0": 2, "opencl:0": 5},
           "copies": [{"src": "opencl:0", "dst": "cpu:0", "inserted": False, "count": 1,
                       "bytes": 32768},
                      {"src": "cpu:0", "dst": "opencl:0", "inserted": True, "count": 3,
                       "bytes": 1536}],
           "random_inputs": [],
           "outputs": [{"index": 0, "name": "y", "shape": [2, 5], "dtype": "float32",
                        "summary": {"min": -1.5, "max": 2.25, "mean": 0.125}},
                       {"index": 1, "name": "z", "shape": [3], "dtype": "int32",
                        "summary": {}}],
           "timing": {"runs": 40, "first_run_s": 0.02, "median_s": 0.003, "mean_s": 0.0035,
                      "min_s": 0.0025, "max_s": 0.0075},
           "expected": {"file": "e.npz", "rtol": 0.001, "atol": 1e-06, "ok": False,
                        "outputs": [{"index": 0, "name": "y", "ok": False, "max_abs": 0.25,
                                     "max_rel": 0.0625, "problem": ""},
                                    {"index": 1, "name": "z", "ok": False,
                                     "max_abs": float("nan"), "max_rel": float("nan"),
                                     "problem": "expected (4,) int32, got (3,) int32"}]},
           "saved": "out.npz"}
    lines = run_text(doc).splitlines()
    assert lines[0] == "graph      g.json (params p.params)"
    assert lines[1] == "devices    cpu:0      Some CPU"
    assert lines[2] == "           opencl:0   pthread-cpu"
    assert lines[3] == ("placement  kernels: 2 on cpu:0, 5 on opencl:0; "
                        "1 copy opencl:0 -> cpu:0 (32.0 KiB); "
                        "3 inserted copies cpu:0 -> opencl:0 (1.5 KiB)")
    y_row = next(line for line in lines if line.strip().startswith("0 "))
    assert "(2, 5)" in y_row and "min -1.5, max 2.25, mean 0.125" in y_row
    z_row = next(line for line in lines if line.strip().startswith("1 "))
    assert "(3,)" in z_row and z_row.rstrip().endswith("empty")
    assert ("           median 3.000 ms over 40 runs (mean 3.500 ms, min 2.500 ms, "
            "max 7.500 ms)") in lines
    assert ("expected   MISMATCH with e.npz: output 0 'y': max abs err 0.25, max rel err "
            "0.0625; output 1 'z': expected (4,) int32, got (3,) int32 "
            "(rtol 0.001, atol 1e-06)") in lines
    assert lines[-1] == "saved      out.npz"


@pytest.mark.opencl
def test_run_summary_of_hetero_cnn_on_cpu_and_opencl_counts_the_copy(
        opencl_available: None) -> None:
    doc, _ = run_doc(EXAMPLES / "hetero_cnn", [cpu(0), opencl(0)])
    assert doc["kernels_per_device"] == {"cpu:0": 3, "opencl:0": 4}
    assert doc["copies"] == [{"src": "opencl:0", "dst": "cpu:0", "inserted": False, "count": 1,
                              "bytes": 4 * 32 * 16 * 16}]
    assert doc["expected"]["ok"]
    assert "3 on cpu:0, 4 on opencl:0; 1 copy opencl:0 -> cpu:0 (32.0 KiB)" in run_text(doc)


# ---- comparison_text -----------------------------------------------------------------------------

def test_comparison_text_ok_for_one_output() -> None:
    text = comparison_text([Comparison(0, "prob", True, 1.5e-7, 2.5e-6)], "e.npz", 1e-4, 1e-5)
    lines = text.splitlines()
    assert lines[1].split() == ["0", "prob", "1.5e-07", "2.5e-06", "ok"]
    assert lines[-1] == "OK: 1 output matches e.npz (rtol 0.0001, atol 1e-05)"


def test_comparison_text_mismatch_counts_and_names_the_problem() -> None:
    comparisons = [Comparison(0, "a", True, 0.0, 0.0),
                   Comparison(1, "b", False, 0.5, 0.125),
                   Comparison(2, "c", False, float("nan"), float("nan"),
                              "expected (2,) float32, got (3,) float32")]
    lines = comparison_text(comparisons, "exp.npz", 0.001, 0.0).splitlines()
    assert lines[2].split() == ["1", "b", "0.5", "0.125", "MISMATCH"]
    assert lines[3].split()[:4] == ["2", "c", "nan", "n/a"]
    assert "MISMATCH expected (2,) float32, got (3,) float32" in lines[3]
    assert lines[-1] == "MISMATCH: 2 of 3 outputs differ from exp.npz (rtol 0.001, atol 0)"


def test_comparison_text_several_outputs_match() -> None:
    text = comparison_text([Comparison(0, "a", True, 0.0, 0.0),
                            Comparison(1, "b", True, 0.0, 0.0)], "e.npz", 1e-4, 1e-5)
    assert text.splitlines()[-1] == "OK: 2 outputs match e.npz (rtol 0.0001, atol 1e-05)"


# ---- profile_summary, profile_text ---------------------------------------------------------------

def test_profile_summary_sorts_steps_and_totals_per_device_and_copies() -> None:
    doc = profile_summary(node_times())
    assert doc["total_s"] == pytest.approx(0.010)
    assert [s["nid"] for s in doc["steps"]] == [3, 5, 4, 6]
    assert [s["percent"] for s in doc["steps"]] == pytest.approx([60.0, 20.0, 10.0, 10.0])
    assert doc["steps"][0] == {"nid": 3, "label": "node 3 'conv'", "func_name": "fused_conv",
                               "device": "opencl:0", "is_copy": False, "seconds": 0.006,
                               "percent": pytest.approx(60.0)}
    assert doc["per_device_s"] == {"cpu:0": pytest.approx(0.003),
                                   "opencl:0": pytest.approx(0.006)}
    assert doc["copies_s"] == pytest.approx(0.001)


def test_profile_summary_of_nothing() -> None:
    assert profile_summary([]) == {"total_s": 0, "steps": [], "per_device_s": {},
                                   "copies_s": 0}


def test_profile_text_shows_the_top_steps_and_the_totals() -> None:
    doc = profile_summary(node_times())
    doc.update(graph="g.json", devices=["cpu:0", "opencl:0"], repeat=7, trace="t.json",
               plot=None)
    text = profile_text(doc, top=2)
    lines = text.splitlines()
    assert lines[0] == ("profile of g.json on cpu:0, opencl:0: median of 7 runs, each step "
                        "synchronised")
    assert "node 3 'conv'" in lines[2] and "6.000 ms" in lines[2] and "60.0" in lines[2]
    assert "fused_conv" in lines[2]
    assert "node 5 'dense'" in lines[3] and "20.0" in lines[3]
    assert "node 4" not in text  # below the top 2
    assert "  ... 2 more steps (--top 4 shows all)" in lines
    totals = {line.split()[0]: line.split()[1:] for line in lines[lines.index("totals") + 2:]
              if line.strip() and not line.startswith("wrote")}
    assert totals["cpu:0"] == ["3.000", "ms", "30.0"]
    assert totals["opencl:0"] == ["6.000", "ms", "60.0"]
    assert totals["copies"] == ["1.000", "ms", "10.0"]
    assert totals["all"] == ["10.000", "ms", "100.0"]
    assert lines[-1] == "wrote Chrome trace t.json"
    assert "plot" not in lines[-1]


def test_profile_text_hides_func_name_already_in_the_label() -> None:
    times = [NodeTime(1, "node 1 'relu' ('relu')", "relu", cpu(0), False, 0.001)]
    doc = profile_summary(times)
    doc.update(graph="g", devices=["cpu:0"], repeat=1)
    row = profile_text(doc, top=5).splitlines()[2]
    assert row.split()[:4] == ["node", "1", "'relu'", "('relu')"]
    assert row.split()[4] == "cpu:0"


def test_profile_of_a_real_run_renders() -> None:
    job = job_from_files(resolve_files(MLP), [cpu(0)])
    times = job.module.profile(2)
    doc = profile_summary(times)
    assert len(doc["steps"]) == 4 and doc["copies_s"] == 0.0
    assert doc["total_s"] == pytest.approx(sum(t.seconds for t in times))
    assert sum(s["percent"] for s in doc["steps"]) == pytest.approx(100.0)
    doc.update(graph=str(MLP), devices=["cpu:0"], repeat=2)
    assert "more steps" not in profile_text(doc, top=4)


# ---- plan_summary --------------------------------------------------------------------------------

def test_plan_summary_reports_devices_copies_and_pools() -> None:
    graph = make_graph([null("x"), null("y"), tvm_op("plus", "add", [0, 1]),
                        tvm_op("neg", "negative", [2])], heads=[3])
    result = plan_graph(graph, Placement.from_options(place=["plus=opencl:0"]))
    doc = plan_summary(result, GraphFiles(Path("g.json")), None)
    assert doc["graph"] == "g.json" and doc["written"] is None
    assert doc["seconds"] == result.seconds
    assert doc["node_devices"] == ["opencl:0", "opencl:0", "opencl:0", "cpu:0", "cpu:0"]
    assert doc["fallbacks"] == []
    assert doc["copies"] == [{"nid": 3, "name": "copy_plus_to_cpu0", "src_entry": "2:0",
                              "src": "opencl:0", "dst": "cpu:0", "bytes": 16}]
    pools = {p["device"]: p for p in doc["pools"]}
    assert pools["opencl:0"] == {"device": "opencl:0", "before": 0, "no_sharing": 48,
                                 "after": 48, "lower_bound": 48}
    assert pools["cpu:0"]["before"] == 64 and pools["cpu:0"]["after"] == 32


def test_plan_summary_reports_a_fallback_and_the_written_file() -> None:
    graph = make_graph([null("x"), null("y"), tvm_op("plus", "add", [0, 1]),
                        tvm_op("neg", "negative", [2])], heads=[3])
    lib = Module("cpu_only")
    lib.register("add", lambda a, b, out: np.add(a, b, out=out), device="cpu")
    lib.register("negative", lambda a, out: np.negative(a, out=out), device="cpu")
    result = plan_graph(graph, Placement.from_options(place=["plus=opencl:0"]), lib)
    doc = plan_summary(result, GraphFiles(Path("g.json")), "planned.json")
    assert doc["written"] == "planned.json"
    (fallback,) = doc["fallbacks"]
    assert fallback["name"] == "plus" and fallback["func_name"] == "add"
    assert (fallback["planned"], fallback["device"]) == ("opencl:0", "cpu:0")
    assert doc["node_devices"][fallback["nid"]] == "cpu:0"

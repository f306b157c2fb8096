"""graph_runtime.cli.job called directly: files, devices, inputs, build, expected, compare."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support import backend_missing, make_graph, null, tvm_op

from graph_runtime.backends import available_backends
from graph_runtime.cli.job import (Comparison, GraphFiles, benchmark, compare, describe_devices,
                                   expected_outputs, job_from_files, load_inputs, output_names,
                                   param_names, parse_devices, random_array, read_array,
                                   resolve_files)
from graph_runtime.device import cpu, opencl
from graph_runtime.errors import DeviceError, GraphError, GraphRuntimeError, ParamsError
from graph_runtime.graph.model import Graph

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"
MLP = EXAMPLES / "mlp"


def mixed_graph() -> Graph:
    """Inputs of three dtypes and shapes, for the random draw."""
    return make_graph([null("f"), null("i"), null("b"), tvm_op("id", "copy", [0])], heads=[3],
                      shapes=[[2, 3], [5], [4], [2, 3]],
                      dtypes=["float32", "int64", "bool", "float32"])


# ---- resolve_files -------------------------------------------------------------------------------

def test_resolve_files_picks_every_file_of_an_example_folder() -> None:
    files = resolve_files(MLP)
    assert files == GraphFiles(MLP / "graph.json", MLP / "lib.json", MLP / "params",
                               MLP / "inputs.npz", MLP / "expected.npz", folder=MLP)


def test_resolve_files_flags_override_the_folder(tmp_path: Path) -> None:
    files = resolve_files(str(MLP), lib=tmp_path / "other.py", params=tmp_path / "p",
                          inputs=tmp_path / "in.npz", expected=tmp_path / "exp.npz")
    assert files.graph == MLP / "graph.json"
    assert (files.lib, files.params, files.inputs, files.expected) == (
        tmp_path / "other.py", tmp_path / "p", tmp_path / "in.npz", tmp_path / "exp.npz")
    assert files.folder == MLP


def test_resolve_files_one_flag_overrides_and_the_others_come_from_the_folder(
        tmp_path: Path) -> None:
    files = resolve_files(MLP, expected=tmp_path / "mine.npz")
    assert files.expected == tmp_path / "mine.npz"
    assert files.lib == MLP / "lib.json" and files.inputs == MLP / "inputs.npz"


def test_resolve_files_folder_without_optional_files_gives_none(addw: Path) -> None:
    (addw / "params").unlink()
    (addw / "expected.npz").unlink()
    files = resolve_files(addw)
    assert files.lib is None and files.params is None and files.expected is None
    assert files.inputs == addw / "inputs.npz"


def test_resolve_files_prefers_lib_json_and_falls_back_to_lib_py(addw: Path) -> None:
    (addw / "lib.py").write_text("")
    assert resolve_files(addw).lib == addw / "lib.py"
    (addw / "lib.json").write_text("{}")
    assert resolve_files(addw).lib == addw / "lib.json"


def test_resolve_files_graph_file_takes_only_the_lib_beside_it() -> None:
    # The lib goes with the graph (issue 13: validate GRAPH.json reported 4 missing functions);
    # params, inputs and expected stay explicit for a graph file.
    files = resolve_files(MLP / "graph.json")
    assert files == GraphFiles(MLP / "graph.json", MLP / "lib.json", lib_beside=True)
    assert files.folder is None
    assert resolve_files(MLP / "graph.json", lib=MLP / "other.json").lib_beside is False


def test_resolve_files_missing_path_is_a_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="nope.json: no such graph file or example folder"):
        resolve_files(tmp_path / "nope.json")


def test_resolve_files_folder_without_graph_json_lists_what_it_has(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "lib.json").write_text("{}")
    with pytest.raises(GraphError, match="needs a graph.json; found lib.json, model.json"):
        resolve_files(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GraphError, match="found nothing"):
        resolve_files(empty)


# ---- parse_devices -------------------------------------------------------------------------------

def test_parse_devices_auto_is_cpu_first_then_what_this_machine_has() -> None:
    auto = parse_devices(["auto"])
    assert auto[0] == cpu(0)
    assert [d.spec.partition(":")[0] for d in auto] == available_backends()
    assert parse_devices([]) == auto
    assert parse_devices([" AUTO "]) == auto


def test_parse_devices_keeps_the_order_given() -> None:
    assert parse_devices(["cpu:0"]) == [cpu(0)]


@pytest.mark.opencl
def test_parse_devices_opencl_then_cpu_keeps_order() -> None:
    assert parse_devices(["opencl", "cpu"]) == [opencl(0), cpu(0)]


def test_parse_devices_unknown_type_names_the_flag_and_the_choices() -> None:
    with pytest.raises(DeviceError) as e:
        parse_devices(["tpu"])
    message = str(e.value)
    assert message.startswith("-d tpu: unknown device type 'tpu'")
    assert "cpu" in message and "opencl" in message and "cuda" in message


def test_parse_devices_missing_id_says_what_exists_and_uses_the_flag_given() -> None:
    with pytest.raises(DeviceError, match=r"^--device cpu:3: cpu:3 does not exist: "
                                          r"this machine has 1 cpu device"):
        parse_devices(["cpu:3"], flag="--device")


def test_parse_devices_without_check_accepts_devices_this_machine_lacks() -> None:
    devices = parse_devices(["cpu:3", "cuda:1"], check=False)
    assert [d.spec for d in devices] == ["cpu:3", "cuda:1"]


def test_parse_devices_missing_cuda_says_what_to_install() -> None:
    if backend_missing("cuda") is None:
        pytest.skip("CUDA is available here; its absence cannot be tested")
    with pytest.raises(DeviceError) as e:
        parse_devices(["cuda"])
    assert str(e.value).startswith("-d cuda: ")
    assert not str(e.value).startswith("-d cuda: cuda: ")  # the backend's prefix is not doubled


def test_parse_devices_refuses_a_device_given_twice() -> None:
    with pytest.raises(DeviceError, match="-d cpu:0: cpu:0 is given twice; list each device once"):
        parse_devices(["cpu", "cpu:0"])
    with pytest.raises(DeviceError, match="-d auto: cpu:0 is given twice"):
        parse_devices(["cpu", "auto"])


# ---- read_array, param_names ---------------------------------------------------------------------

def test_read_array_reads_npy_and_names_where_on_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(3, dtype="int32"))
    np.testing.assert_array_equal(read_array(tmp_path / "a.npy", "--input a"), [0, 1, 2])
    with pytest.raises(ParamsError, match="--input b: no such file '.*missing.npy'"):
        read_array(tmp_path / "missing.npy", "--input b")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(ParamsError, match="--input c: cannot read '.*text.npy' as a .npy array"):
        read_array(tmp_path / "text.npy", "--input c")


def test_read_array_refuses_pickles(tmp_path: Path) -> None:
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ParamsError, match="obj.npy' as a .npy array"):
        read_array(tmp_path / "obj.npy", "--input o")


def test_param_names_lists_the_params_file_and_nothing_without_one() -> None:
    assert param_names(resolve_files(MLP)) == ["p0", "p1", "p2", "p3", "p4", "p5"]
    assert param_names(resolve_files(MLP / "graph.json")) == []


# ---- load_inputs ---------------------------------------------------------------------------------

def test_load_inputs_draws_seeded_values_of_each_input_shape_and_dtype() -> None:
    graph = mixed_graph()
    files = GraphFiles(Path("graph.json"))
    first = load_inputs(graph, files, seed=7)
    assert first.random == ["f", "i", "b"]
    shapes = {n: (v.shape, v.dtype) for n, v in first.values.items()}
    assert shapes == {"f": ((2, 3), np.dtype("float32")), "i": ((5,), np.dtype("int64")),
                      "b": ((4,), np.dtype("bool"))}
    assert first.values["i"].min() >= 0 and first.values["i"].max() < 10
    again = load_inputs(graph, files, seed=7)
    other = load_inputs(graph, files, seed=8)
    np.testing.assert_array_equal(first.values["f"], again.values["f"])
    assert not np.array_equal(first.values["f"], other.values["f"])


def test_load_inputs_takes_the_npz_and_draws_only_what_is_missing(addw: Path) -> None:
    graph = Graph.from_json(addw / "graph.json")
    stored = np.load(addw / "inputs.npz")
    result = load_inputs(graph, resolve_files(addw), skip=["w"])
    assert result.random == []
    assert sorted(result.values) == ["x", "z"]
    np.testing.assert_array_equal(result.values["x"], stored["x"])
    drawn = load_inputs(graph, GraphFiles(addw / "graph.json"), skip=["w"])
    assert drawn.random == ["x", "z"]


def test_load_inputs_pairs_override_and_add_to_the_npz(addw: Path, tmp_path: Path) -> None:
    graph = Graph.from_json(addw / "graph.json")
    np.save(tmp_path / "x.npy", np.full(4, 3.0, dtype="float32"))
    result = load_inputs(graph, resolve_files(addw), [f"x={tmp_path / 'x.npy'}"], skip=["w"])
    np.testing.assert_array_equal(result.values["x"], np.full(4, 3.0, dtype="float32"))


def test_load_inputs_refuses_an_npz_member_that_names_no_input(addw: Path) -> None:
    graph = Graph.from_json(addw / "graph.json")
    np.savez(addw / "inputs.npz", x=np.zeros(4, "float32"), typo=np.zeros(4, "float32"))
    with pytest.raises(GraphError, match=r"--inputs .*inputs.npz: graph has no input 'typo'; "
                                         r"inputs are: x, w, z"):
        load_inputs(graph, resolve_files(addw))


def test_load_inputs_refuses_a_value_of_the_wrong_shape_or_dtype(addw: Path,
                                                                tmp_path: Path) -> None:
    graph = Graph.from_json(addw / "graph.json")
    np.save(tmp_path / "x.npy", np.zeros((2, 2), dtype="float32"))
    with pytest.raises(ParamsError, match=r"input 'x' \(eid 0\) expects \(4,\) float32, "
                                          r"got \(2, 2\) float32"):
        load_inputs(graph, GraphFiles(addw / "graph.json"), [f"x={tmp_path / 'x.npy'}"])
    np.save(tmp_path / "z.npy", np.zeros(4, dtype="float64"))
    with pytest.raises(ParamsError, match=r"input 'z' \(eid 3\) expects \(4,\) float32, "
                                          r"got \(4,\) float64"):
        load_inputs(graph, GraphFiles(addw / "graph.json"), [f"z={tmp_path / 'z.npy'}"])


@pytest.mark.parametrize("pair", ["x", "=a.npy", "x=", "x:a.npy"])
def test_load_inputs_malformed_pair_shows_the_expected_form(addw: Path, pair: str) -> None:
    graph = Graph.from_json(addw / "graph.json")
    with pytest.raises(ParamsError, match=f"--input {pair}: expected NAME=FILE.npy"):
        load_inputs(graph, GraphFiles(addw / "graph.json"), [pair])


def test_load_inputs_missing_inputs_file_is_a_params_error(addw: Path) -> None:
    graph = Graph.from_json(addw / "graph.json")
    files = GraphFiles(addw / "graph.json", inputs=addw / "gone.npz")
    with pytest.raises(ParamsError, match="--inputs .*gone.npz: no such file"):
        load_inputs(graph, files)


def test_random_array_refuses_a_dtype_it_cannot_draw() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(GraphError, match="cannot draw random values of dtype complex64; "
                                         "give the input with --input"):
        random_array(rng, (2,), "complex64")


# ---- output_names --------------------------------------------------------------------------------

def test_output_names_are_head_node_names_with_an_index_for_multi_output_nodes() -> None:
    graph = make_graph([null("x"), tvm_op("halves", "split", [0], num_outputs=2,
                                          indices_or_sections=2),
                        tvm_op("neg", "negative", [(1, 1)])],
                       heads=[2, (1, 0), (1, 1)], shapes=[[4], [2], [2], [2]])
    assert output_names(graph) == ["neg", "halves:0", "halves:1"]


def test_output_names_of_mlp() -> None:
    assert output_names(Graph.from_json(MLP / "graph.json")) == [
        "tvmgen_default_fused_nn_softmax"]


# ---- job_from_files, Job.run ---------------------------------------------------------------------

def test_job_from_files_runs_mlp_on_cpu_and_matches_expected() -> None:
    files = resolve_files(MLP)
    job = job_from_files(files, [cpu(0)])
    assert job.inputs.random == [] and list(job.inputs.values) == ["data"]
    outputs = job.run()
    assert job.seconds > 0
    names = output_names(job.graph)
    (result,) = compare(outputs, expected_outputs(files.expected, names), names, 1e-4, 1e-5)
    assert result.ok, result


def test_job_from_files_draws_only_inputs_that_are_not_params(addw: Path) -> None:
    files = resolve_files(addw / "graph.json", params=addw / "params")
    job = job_from_files(files, [cpu(0)], seed=3)
    assert job.inputs.random == ["x", "z"]
    (out,) = job.run()
    w = np.asarray(job.module.get_input("w").numpy())
    x, z = job.inputs.values["x"], job.inputs.values["z"]
    np.testing.assert_allclose(out, (x + w) - z, rtol=1e-6)


def test_job_from_files_pairs_override_the_inputs_file(addw: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "z.npy", np.ones(4, dtype="float32"))
    files = resolve_files(addw)
    job = job_from_files(files, [cpu(0)], pairs=[f"z={tmp_path / 'z.npy'}"])
    (out,) = job.run()
    stored = np.load(addw / "inputs.npz")
    w = job.module.get_input("w").numpy()
    np.testing.assert_allclose(out, stored["x"] + w - 1.0, rtol=1e-6)


@pytest.mark.opencl
def test_job_from_files_hetero_cnn_on_cpu_and_opencl_matches_expected(
        opencl_available: None) -> None:
    files = resolve_files(EXAMPLES / "hetero_cnn")
    job = job_from_files(files, [cpu(0), opencl(0)])
    outputs = job.run()
    names = output_names(job.graph)
    (result,) = compare(outputs, expected_outputs(files.expected, names), names, 1e-4, 1e-5)
    assert result.ok, result


# ---- expected_outputs ----------------------------------------------------------------------------

def test_expected_outputs_by_index_key_then_by_name(tmp_path: Path) -> None:
    path = tmp_path / "exp.npz"
    np.savez(path, output_0=np.zeros(2, "float32"), second=np.ones(3, "float32"))
    first, second = expected_outputs(path, ["first", "second"])
    np.testing.assert_array_equal(first, np.zeros(2))
    np.testing.assert_array_equal(second, np.ones(3))


def test_expected_outputs_missing_key_lists_what_the_file_has(tmp_path: Path) -> None:
    path = tmp_path / "exp.npz"
    np.savez(path, output_0=np.zeros(2, "float32"), other=np.ones(3, "float32"))
    with pytest.raises(ParamsError, match=r"no array for output 1 'second' \(key 'output_1' or "
                                          r"'second'\); it has: output_0, other"):
        expected_outputs(path, ["first", "second"])
    with pytest.raises(ParamsError, match="--expected .*gone.npz: no such file"):
        expected_outputs(tmp_path / "gone.npz", ["first"])


# ---- compare -------------------------------------------------------------------------------------

def test_compare_reports_max_abs_and_rel_error() -> None:
    want = np.array([1.0, 2.0, 4.0], dtype="float32")
    got = np.array([1.0, 2.5, 3.0], dtype="float32")
    (c,) = compare([got], [want], ["y"], rtol=0.0, atol=0.1)
    assert (c.index, c.name, c.ok, c.problem) == (0, "y", False, "")
    assert c.max_abs == pytest.approx(1.0)
    assert c.max_rel == pytest.approx(0.25)  # 0.5/2 beats 1/4


def test_compare_ok_within_atol_plus_rtol_times_expected() -> None:
    want = np.array([10.0, 0.0], dtype="float64")
    got = np.array([10.5, 0.05], dtype="float64")
    (loose,) = compare([got], [want], ["y"], rtol=0.05, atol=0.06)
    assert loose.ok
    (tight,) = compare([got], [want], ["y"], rtol=0.04, atol=0.06)  # 0.5 > 0.06 + 0.4
    assert not tight.ok
    assert tight.max_abs == pytest.approx(0.5)


def test_compare_relative_error_skips_zeros_in_expected() -> None:
    want = np.array([0.0, 2.0], dtype="float32")
    got = np.array([1.0, 2.0], dtype="float32")
    (c,) = compare([got], [want], ["y"], rtol=1e-5, atol=1e-5)
    assert c.max_abs == pytest.approx(1.0) and c.max_rel == 0.0 and not c.ok
    (zeros,) = compare([np.zeros(2, "float32")], [np.zeros(2, "float32")], ["z"], 0.0, 0.0)
    # Every expected value 0: no relative error exists (NaN, shown as n/a), not "0".
    assert zeros.ok and zeros.max_abs == 0.0 and np.isnan(zeros.max_rel)


def test_compare_shape_or_dtype_difference_is_a_problem_not_a_number() -> None:
    results = compare([np.zeros(3, "float32"), np.zeros(2, "float64"), np.zeros(2, "int32")],
                      [np.zeros(2, "float32"), np.zeros(2, "float32"), np.zeros(2, "int32")],
                      ["a", "b", "c"], 1e-5, 1e-5)
    assert [r.ok for r in results] == [False, False, True]
    assert results[0].problem == "expected (2,) float32, got (3,) float32"
    assert results[1].problem == "expected (2,) float32, got (2,) float64"
    assert np.isnan(results[0].max_abs) and np.isnan(results[0].max_rel)


def test_compare_nan_matches_nan_and_empty_outputs_match() -> None:
    nan = np.array([np.nan, 1.0], dtype="float32")
    (c,) = compare([nan.copy()], [nan], ["n"], 1e-5, 1e-5)
    assert c.ok
    (e,) = compare([np.zeros((0, 3), "float32")], [np.zeros((0, 3), "float32")], ["e"], 0, 0)
    assert e == Comparison(0, "e", True, 0.0, 0.0)


# ---- benchmark, describe_devices -----------------------------------------------------------------

def test_benchmark_times_repeat_runs_and_refuses_zero(addw: Path) -> None:
    job = job_from_files(resolve_files(addw), [cpu(0)])
    done: list[int] = []
    result = benchmark(job, 3, progress=done.append)
    assert len(done) == 3
    assert result.min > 0 and result.min <= result.median <= result.max
    with pytest.raises(GraphRuntimeError, match="--repeat 0: expected a count >= 1"):
        benchmark(job, 0)


def test_describe_devices_names_present_devices_and_says_why_others_are_not() -> None:
    names = describe_devices([cpu(0), cpu(5)])
    assert names[cpu(0)] and not names[cpu(0)].startswith("not available")
    assert names[cpu(5)].startswith("not available: ")
    assert "cpu:5" in names[cpu(5)]


def test_a_comparison_on_cuda_multiplies_in_float32_unless_tf32_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TF32, CUDA's default, is ~1e-3 off: a run compared with expected values at float32's
    tolerances turns it off, unless the user set GRAPH_RUNTIME_CUDA_TF32; CPU-only jobs and
    runs with nothing to compare are left alone. The override holds only while it runs."""
    from graph_runtime import settings
    from graph_runtime.cli.job import float32_for_comparison
    from graph_runtime.device import cuda
    comparing = GraphFiles(Path("g.json"), expected=Path("expected.npz"))
    running = GraphFiles(Path("g.json"))
    monkeypatch.delenv(settings.CUDA_TF32.name, raising=False)
    assert float32_for_comparison(comparing, [cpu(0), cuda(0)])
    assert not float32_for_comparison(comparing, [cpu(0)])
    assert not float32_for_comparison(running, [cuda(0)])
    with settings.overridden(settings.CUDA_TF32, "off"):
        assert settings.word(settings.CUDA_TF32) == "off"
    assert settings.CUDA_TF32.name not in os.environ
    monkeypatch.setenv(settings.CUDA_TF32.name, "on")
    assert not float32_for_comparison(comparing, [cuda(0)])
    with settings.overridden(settings.CUDA_TF32, None):
        assert settings.word(settings.CUDA_TF32) == "on"

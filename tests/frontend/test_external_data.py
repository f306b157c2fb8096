"""External data stays inside the model's folder: every kind of tensor, every way out refused."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

from graph_runtime.errors import FrontendError
from graph_runtime.frontend import from_onnx

F32 = TensorProto.FLOAT
VALUES = np.arange(4, dtype=np.float32)


def _external(tensor: Any, location: str, **entries: int) -> Any:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **{k: str(v) for k, v in entries.items()}}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _model(location: str, kind: str = "initializer", **entries: int) -> Any:
    """y = x + w, with w's data in `location`, held as kind (initializer, constant, sparse,
    subgraph, function)."""
    x = helper.make_tensor_value_info("x", F32, [4])
    y = helper.make_tensor_value_info("y", F32, [4])
    w = _external(numpy_helper.from_array(VALUES, "w"), location, **entries)
    inits, functions = [], []
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    if kind == "initializer":
        inits = [w]
    elif kind == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=w))
    elif kind == "sparse":
        indices = numpy_helper.from_array(np.arange(4, dtype=np.int64), "wi")
        sparse = helper.make_sparse_tensor(w, indices, [4])
        nodes.insert(0, helper.make_node("Constant", [], ["w"], sparse_value=sparse))
    elif kind == "subgraph":
        branch = helper.make_graph([helper.make_node("Identity", ["wb"], ["wo"])], "then", [],
                                   [helper.make_tensor_value_info("wo", F32, [4])],
                                   [_external(numpy_helper.from_array(VALUES, "wb"), location,
                                              **entries)])
        cond = numpy_helper.from_array(np.array([True]), "c")
        inits = [cond]
        nodes.insert(0, helper.make_node("If", ["c"], ["w"], then_branch=branch,
                                         else_branch=branch))
    elif kind == "function":
        body = helper.make_node("Constant", [], ["out"], value=w)
        functions = [helper.make_function("local", "MakeW", [], ["out"], [body],
                                          [helper.make_opsetid("", 17)])]
        nodes.insert(0, helper.make_node("MakeW", [], ["w"], domain="local"))
    graph = helper.make_graph(nodes, "ext", [x], [y], inits)
    m = helper.make_model(graph, functions=functions,
                          opset_imports=[helper.make_opsetid("", 17),
                                         helper.make_opsetid("local", 1)])
    m.ir_version = 8
    return m


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """tmp/model/ with data.bin, a FIFO and a link out; tmp/secret.bin outside it."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "data.bin").write_bytes(VALUES.tobytes())
    (tmp_path / "secret.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    (model_dir / "link_out").symlink_to(tmp_path / "secret.bin")
    (model_dir / "sub").mkdir()
    (model_dir / "sub" / "inner.bin").write_bytes(VALUES.tobytes())
    (model_dir / "link_in").symlink_to(model_dir / "sub" / "inner.bin")
    os.mkfifo(model_dir / "fifo")
    # A hard link is a regular file inside the folder by every path check; its other name is
    # outside.
    os.link(tmp_path / "secret.bin", model_dir / "hard_out")
    return model_dir


def _save(m: Any, folder: Path) -> Path:
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def _params_hold_values(result: Any) -> None:
    graph_json, lib, params = result
    assert any(np.array_equal(v, VALUES) for v in params.values()), params


KINDS = ["initializer", "constant", "sparse", "subgraph", "function"]
# The importer does not inline local functions (the op is refused after its data was read).
LOADING = KINDS[:-1]


@pytest.mark.parametrize("kind", LOADING)
@pytest.mark.parametrize("location", ["data.bin", "sub/inner.bin", "link_in"])
def test_data_inside_the_folder_loads(folder: Path, kind: str, location: str) -> None:
    _params_hold_values(from_onnx(_save(_model(location, kind), folder)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("location, words", [
    ("../secret.bin", "contains '..'"),
    ("sub/../../secret.bin", "contains '..'"),
    ("SECRET", "is absolute"),
    ("/dev/zero", "is absolute"),
    ("link_out", "outside the model's folder"),
    ("hard_out", "has 2 hard links"),
    ("fifo", "not a regular file (a FIFO)"),
    ("sub", "not a regular file (a directory)"),
    ("missing.bin", "No such file"),
    ("", "expected a file name"),
])
def test_ways_out_of_the_folder_are_refused(folder: Path, kind: str, location: str,
                                            words: str) -> None:
    if location == "SECRET":
        location = str(folder.parent / "secret.bin")
    with pytest.raises(FrontendError, match="external data") as info:
        from_onnx(_save(_model(location, kind), folder))
    assert words in str(info.value)


@pytest.mark.parametrize("entries, words", [
    ({"length": 64}, "external_data length 64; its dims [4] need 16 bytes"),
    ({"offset": 8}, "holds 16 bytes; expected 16 from offset 8"),
])
def test_reads_no_more_than_declared(folder: Path, entries: dict, words: str) -> None:
    with pytest.raises(FrontendError) as info:
        from_onnx(_save(_model("data.bin", **entries), folder))
    assert words in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_model_proto_with_external_data_needs_a_folder(folder: Path, kind: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The working directory holds a data.bin too: it must never be read.
    monkeypatch.chdir(folder)
    m = _model("data.bin", kind)
    with pytest.raises(FrontendError, match="ModelProto alone does not say which folder"):
        from_onnx(m)
    if kind in LOADING:
        _params_hold_values(from_onnx(m, base_dir=folder))
    from graph_runtime.frontend.external_data import has_external_data
    assert has_external_data(m)  # the caller's proto is left as it was


def test_hard_link_inside_the_folder_is_refused_even_to_another_name_inside(
        folder: Path) -> None:
    # Two names inside the folder are refused as well: the link count cannot tell where the
    # other name is, and the message says how to make the file single.
    os.link(folder / "data.bin", folder / "twin.bin")
    with pytest.raises(FrontendError, match="twin.bin' has 2 hard links") as info:
        from_onnx(_save(_model("twin.bin"), folder))
    assert "copy the file into the folder (cp, not ln)" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("hostile", ["link_out", "hard_out"])
def test_cli_import_confines_too(folder: Path, tmp_path: Path, hostile: str) -> None:
    from click.testing import CliRunner

    from graph_runtime.cli import app
    path = _save(_model(hostile, "sparse"), folder)
    result = CliRunner().invoke(app, ["import", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "outside the model's folder" in result.output
    assert len(result.output.strip().splitlines()) == 1

"""load_module and create_graph_module: every worker runs its own GraphModule through DRefs."""
from __future__ import annotations

import os

import numpy as np
import pytest
from disco_support import KINDS, make_session

from graph_runtime import cpu
from graph_runtime.disco import DGraphModule, DModule, Session

SIMPLEX = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "graphs", "simplex")


@pytest.fixture(scope="module", params=list(KINDS))
def sess2(request: pytest.FixtureRequest) -> Session:
    session = make_session(request.param, 2, timeout=60.0)
    session.init_ccl("cpu")
    yield session
    session.shutdown()


def test_graph_module_runs_on_every_worker(sess2: Session) -> None:
    inputs = np.load(os.path.join(SIMPLEX, "inputs.npz"))
    expected = np.load(os.path.join(SIMPLEX, "expected.npz"))
    want = expected[expected.files[0]]
    with open(os.path.join(SIMPLEX, "graph.json")) as f:
        graph = f.read()
    lib = sess2.load_module(os.path.join(SIMPLEX, "lib.json"))
    assert isinstance(lib, DModule)
    gm = sess2.create_graph_module(graph, lib, device=cpu(0))
    assert isinstance(gm, DGraphModule)
    for name in inputs.files:
        gm.set_input(name, sess2.broadcast(inputs[name]))
    gm.run()
    out = gm.get_output(0)
    host = np.empty(want.shape, want.dtype)
    sess2.copy_from_worker_0(host, out)
    np.testing.assert_allclose(host, want, rtol=1e-6)
    np.testing.assert_allclose(out.debug_get_from_remote(1), want, rtol=1e-6)


def test_graph_module_outputs_by_name(sess2: Session) -> None:
    """A declared output name (metadata.output_names) and the head node's name reach every
    worker's GraphModule."""
    import json
    inputs = np.load(os.path.join(SIMPLEX, "inputs.npz"))
    want = np.load(os.path.join(SIMPLEX, "expected.npz"))["output_0"]
    with open(os.path.join(SIMPLEX, "graph.json")) as f:
        doc = json.load(f)
    doc["metadata"] = {"output_names": ["result"]}
    gm = sess2.create_graph_module(json.dumps(doc), os.path.join(SIMPLEX, "lib.json"))
    for name in inputs.files:
        gm.set_input(name, sess2.broadcast(inputs[name]))
    gm.run()
    head_node = doc["nodes"][doc["heads"][0][0]]["name"]
    for key in ("result", head_node):
        np.testing.assert_allclose(gm.get_output(key).debug_get_from_remote(1), want, rtol=1e-6)


def test_dmodule_function_call(sess2: Session) -> None:
    lib = sess2.load_module(os.path.join(SIMPLEX, "lib.json"))
    add = lib["elemwise_add"]
    a = sess2.broadcast(np.arange(6, dtype="float32"))
    b = sess2.broadcast(np.ones(6, dtype="float32"))
    out = sess2.empty((6,), "float32")
    add(a, b, out)
    np.testing.assert_array_equal(out.debug_get_from_remote(1), np.arange(6) + 1)


def test_graph_module_from_lib_path(sess2: Session) -> None:
    gm = sess2.create_graph_module(os.path.join(SIMPLEX, "graph.json"),
                                   os.path.join(SIMPLEX, "lib.json"))
    inputs = np.load(os.path.join(SIMPLEX, "inputs.npz"))
    for name in inputs.files:
        gm.set_input(name, sess2.broadcast(inputs[name]))
    gm.run()
    sess2.sync_all()

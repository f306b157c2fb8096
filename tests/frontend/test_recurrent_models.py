"""PyTorch's nn.LSTM (2 layers, bidirectional) and nn.GRU exports against ONNX Runtime.

The models (tests/data/onnx/{lstm,gru}_{ts,dynamo}.onnx, rebuilt by make_recurrent_models.py)
are imported with from_onnx, run on each backend (CPU; OpenCL through PoCL) and compared output by output with ONNX Runtime on the
same random inputs: max|diff| / max|ref| <= 1e-5 (float32 GEMMs summed in another order).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the ONNX frontend tests need onnx (pip install .[test])")
ort = pytest.importorskip("onnxruntime",
                          reason="ONNX Runtime is the reference here (pip install .[test])")

import graph_runtime as gr
from graph_runtime.frontend import from_onnx

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"
RELATIVE = 1e-5


@pytest.mark.parametrize("name", ["lstm_ts", "lstm_dynamo", "gru_ts", "gru_dynamo"])
def test_recurrent_export_matches_onnxruntime(name: str, backend_name: str) -> None:
    import onnx
    path = DATA / f"{name}.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    inputs = {i.name: rng.standard_normal(i.shape).astype(np.float32)
              for i in session.get_inputs()}
    want = session.run(None, inputs)
    graph_json, lib, params = from_onnx(onnx.load(str(path)))
    module = gr.create(graph_json, lib, gr.device(backend_name))
    module.load_params(gr.save_param_dict(params))
    module.run(**inputs)
    for i, ref in enumerate(want):
        got = module.get_output(i).numpy()
        assert got.shape == ref.shape and got.dtype == ref.dtype
        error = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"{name} on {backend_name} output {i}: relative error {error:.2e}")
        assert error <= RELATIVE, f"{name} on {backend_name} output {i}: relative error " \
                                  f"{error:.2e}"

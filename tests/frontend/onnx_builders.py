"""Small ONNX models for the frontend tests, and running them here and in ONNX Runtime."""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

import graph_runtime as gr
from graph_runtime.frontend import from_onnx

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
RNG = np.random.default_rng(7)


def tensor(name: str, elem: int, shape: Sequence[Any]) -> Any:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def init(name: str, array: Any) -> Any:
    return numpy_helper.from_array(np.asarray(array), name)


def model(nodes: list, inputs: list, outputs: list, inits: Sequence[Any] = (),
          opset: int = 17, name: str = "test") -> Any:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def weights(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def run_ours(m: Any, feeds: Mapping[str, np.ndarray], backend: str,
             shape: Mapping[str, Sequence[int]] | None = None,
             disable: Sequence[str] = ()) -> list[np.ndarray]:
    graph_json, lib, params = from_onnx(m, shape, disable=disable)
    module = gr.create(graph_json, lib, gr.device(backend))
    module.load_params(gr.save_param_dict(params))
    for name, value in feeds.items():
        module.set_input(name, value)
    module.run()
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


def run_ort(m: Any, feeds: Mapping[str, np.ndarray], node_by_node: bool = False
            ) -> list[np.ndarray]:
    """ONNX Runtime's outputs; node_by_node: with its graph optimisations off, each node run as
    written (its QDQ pairs around a MatMul not fused into an integer product, whose AVX2 kernel
    without VNNI widens int8 activations to uint8 and may saturate the pairs' int16 sums)."""
    options = ort.SessionOptions()
    if node_by_node:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, dict(feeds))]


# ONNX ops that run as integer kernels in ONNX Runtime whatever its graph optimisations
INTEGER_KERNEL_OPS = {"MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
                      "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention"}


@functools.cache
def ort_int8_saturates() -> bool:
    """Whether ONNX Runtime's uint8 x int8 products saturate on this CPU: without VNNI its MLAS
    kernels sum pairs in int16 (vpmaddubsw), so 2 x 255 x 127 comes back as 32767."""
    b = numpy_helper.from_array(np.full((2, 1), 127, np.int8), "b")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                              [b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (y,) = run_ort(m, {"a": np.full((1, 2), 255, np.uint8)})
    return int(y[0, 0]) != 2 * 255 * 127


def run_ort_int8(m: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs of an int8 model, as a reference: where its int8 products
    saturate on this CPU (ort_int8_saturates), a model in QDQ form runs node by node (each
    MatMul and Conv in float32 between its QDQ pairs: exact), and one holding integer ops skips
    the comparison, naming why."""
    if not ort_int8_saturates():
        return run_ort(m, feeds)
    held = sorted({n.op_type for n in m.graph.node} & INTEGER_KERNEL_OPS)
    if held:
        pytest.skip(f"ONNX Runtime's int8 products saturate on this CPU (no VNNI: int16 pair "
                    f"sums), and the model holds {', '.join(held)}: no exact reference")
    return run_ort(m, feeds, node_by_node=True)


def assert_matches(m: Any, feeds: Mapping[str, np.ndarray], backend: str,
                   shape: Mapping[str, Sequence[int]] | None = None) -> None:
    """Every output as ONNX Runtime gives it: same dtype and shape, max|diff|/max|ref| <= 2e-4."""
    got = run_ours(m, feeds, backend, shape)
    want = run_ort(m, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, ONNX Runtime {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, ONNX Runtime {w.shape}"
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
            continue
        scale = max(float(np.abs(w).max()), 1e-30) if w.size else 1.0
        err = float(np.abs(g.astype(np.float64) - w).max()) / scale if w.size else 0.0
        assert err <= 2e-4, f"output {i}: max|diff|/max|ref| = {err:.3g}"

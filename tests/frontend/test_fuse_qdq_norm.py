"""fuse_qdq_norm.py on ONNX Runtime's quantize_static of the committed BERT export: every
residual add + LayerNorm becomes one qadd_layer_norm and the quantized word embeddings' take a
take of the quantized table, and the outputs are bit for bit the ones the nodes they replace
give (the same tables, row kernel and quantization steps)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx_builders import run_ours
from quantize_models import feeds_for, quantized

from graph_runtime.frontend.importer import import_onnx

onnx = pytest.importorskip("onnx")
DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"


def test_qadd_layer_norm_gives_the_chains_bytes(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    source = DATA / "bert_ts.onnx"
    m = onnx.load(str(quantized(source, "static_qdq", tmp_path)))
    patterns = import_onnx(m).patterns
    assert patterns["qadd_layer_norm"] >= 4 and patterns["quantized_take"] >= 1, patterns
    feeds = feeds_for(source, 99)
    fused = run_ours(m, feeds, "cpu")
    without = ["int8-norm"]
    assert "qadd_layer_norm" not in import_onnx(m, disable=without).patterns  # nor the take
    for got, want in zip(fused, run_ours(m, feeds, "cpu", disable=without)):
        np.testing.assert_array_equal(got, want)

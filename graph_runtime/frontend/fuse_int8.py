"""The int8 models' prim rewrites after the transformer patterns, in the order they need.

Run where the ONNX-level fusions made integer ops (fuse_qdq.py, fuse_integer.py: the model is
CPU-only already) and GRAPH_RUNTIME_IMPORT_INT8 is on. quantize_dynamic's DynamicQuantizeLinear
joins the one product reading it (fuse_dynamic.py). quantize_static's attention is matched
first (fuse_qdq_attention.py: it needs the Q, K, V projections as they are), then its
projections packed (fuse_qdq_qkv.py); residual add + LayerNorm and quantized embeddings
(fuse_qdq_norm.py) before the elementwise tables (fuse_lookup.py), which would otherwise take
the LayerNorm's DQ; last every other projection in the columns form, a table after one folded
into it. Each step counts what it did into the import's patterns.
"""
from __future__ import annotations

from collections import Counter

from .fuse_dynamic import fuse_dynamic_quantize
from .fuse_lookup import fuse_lookups
from .fuse_qdq_attention import fuse_qdq_attention
from .fuse_qdq_norm import fuse_qdq_norms
from .fuse_qdq_qkv import columns_form, pack_qdq_qkv
from .ir import Prim, Value


def fuse_int8(prims: list[Prim], outputs: list[Value], counts: Counter) -> list[Prim]:
    """prims with the int8 rewrites applied; counts updated with how many of each."""
    prims, merged = fuse_dynamic_quantize(prims, outputs)
    prims, attentions = fuse_qdq_attention(prims, outputs)
    packed = 0
    if attentions:
        prims, packed = pack_qdq_qkv(prims, outputs)
    prims, norms, takes = fuse_qdq_norms(prims, outputs)
    prims, tables = fuse_lookups(prims, outputs)
    prims, rewritten, folded = columns_form(prims, outputs)
    found = {"dense_dynamic_scaled": merged, "qdq_attention": attentions,
             "qdq_qkv_packed": packed, "qadd_layer_norm": norms, "quantized_take": takes,
             "qlookup": tables, "qdense_add_columns": rewritten, "qlookup_folded": folded}
    counts.update({k: v for k, v in found.items() if v})
    return prims

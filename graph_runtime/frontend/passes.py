"""The importer's rewrite passes, listed once in the order they run; each can be disabled by name.

Two levels, as ONNX Runtime's graph transformers and TVM's Relay passes sit before and after
lowering: "onnx" passes rewrite the ModelProto before it is lowered (function expansion, the
QDQ and integer patterns), "prims" passes rewrite the lowered standard ops before FuseOps groups
them into functions (emit.py). Every pass returns what it did as a Counter, which the import's
summary reports. `graphrun import --list-passes` prints this list; `--disable-pass NAME` (or
`import_onnx(..., disable=[NAME])`) skips one.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import settings
from ..errors import FrontendError
from .convert import CONVERTERS
from .expand import expand_functions
from .fusion.fuse_dynamic import fuse_dynamic_quantize
from .fusion.fuse_gated import fuse_gated
from .fusion.fuse_index_expr import fuse_index_expr
from .fusion.fuse_integer import fuse_integer
from .fusion.fuse_lookup import fuse_lookups
from .fusion.fuse_qdq import fuse_qdq, int8_import
from .fusion.fuse_qdq_attention import fuse_qdq_attention
from .fusion.fuse_qdq_norm import fuse_qdq_norms
from .fusion.fuse_qdq_qkv import columns_form, pack_qdq_qkv
from .fusion.fuse_qkv import live, pack_qkv
from .fusion.fuse_kv_append import fuse_kv_append
from .fusion.fuse_rotary import fuse_rotary
from .fusion.fuse_siblings import pack_siblings
from .fusion.fuse_transformer import fuse_transformer
from .ir import Prim, Value


@dataclass
class OnnxState:
    """What the ONNX-level passes read and replace: the model and its inferred value types.

    reinfer: checks references and infers types again after a pass changed the model.
    """

    model: Any
    types: dict[str, Any]
    reinfer: Callable[[Any], dict[str, Any]]


@dataclass
class PrimState:
    """What the prim-level passes read and replace: the lowered prims and the graph's outputs.

    int8: the ONNX-level passes made integer ops (the model is CPU-only already) and
    GRAPH_RUNTIME_IMPORT_INT8 is on, so the int8 rewrites apply.
    """

    prims: list[Prim]
    outputs: list[Value]
    int8: bool
    # per dim name, a graph input and axis holding it (ir.Builder.dims_at)
    dims_at: dict[str, tuple[Value, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Pass:
    """One rewrite: its name (to disable it by), level, what it does, and when it applies."""

    name: str
    level: str  # "onnx" or "prims"
    summary: str
    run: Callable[[Any], Counter]
    applies: Callable[[Any], bool] = lambda state: True


# -- ONNX level ----------------------------------------------------------------------------------

def _expand(state: OnnxState) -> Counter:
    state.model, expanded = expand_functions(state.model, CONVERTERS, state.types)
    if expanded:
        state.types = state.reinfer(state.model)
    return Counter(expanded=expanded)


def _qdq(state: OnnxState) -> Counter:
    state.model, counts = fuse_qdq(state.model)
    return counts


def _integer(state: OnnxState) -> Counter:
    state.model, counts = fuse_integer(state.model, state.types)
    return counts


def _int8_import(state: OnnxState) -> bool:
    return int8_import()


# -- prim level ----------------------------------------------------------------------------------

def _prims(rewrite: Callable[[list[Prim], list[Value]], tuple[list[Prim], Counter]]
           ) -> Callable[[PrimState], Counter]:
    """A pass from a rewrite of (prims, outputs): the prims it left unread are dropped, so the
    next pass sees each value's real readers."""
    def run(state: PrimState) -> Counter:
        prims, counts = rewrite(state.prims, state.outputs)
        if +counts:
            state.prims = live(prims, state.outputs)
        return counts
    return run


def _transformer(matcher: str) -> Callable[[PrimState], Counter]:
    def rewrite(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
        return fuse_transformer(prims, outputs, (matcher,))
    return _prims(rewrite)


def _index_expr(state: PrimState) -> Counter:
    prims, counts = fuse_index_expr(state.prims, state.outputs, state.dims_at)
    if +counts:
        state.prims = live(prims, state.outputs)
    return counts


def _int8(state: PrimState) -> bool:
    return state.int8


def _has(op: str) -> Callable[[PrimState], bool]:
    return lambda state: any(p.op == op for p in state.prims)


PASSES: tuple[Pass, ...] = (
    Pass("expand-functions", "onnx", "inline ops with no converter from their ONNX function "
         "bodies (Attention, RotaryEmbedding, CenterCropPad, ...)", _expand),
    Pass("qdq", "onnx", "DequantizeLinear -> Conv/MatMul/Gemm/Add (+Relu) -> QuantizeLinear "
         "as one integer op; DQ -> view/MaxPool -> Q on the integers", _qdq, _int8_import),
    Pass("integer", "onnx", "MatMulInteger/ConvInteger -> Cast -> Mul -> Add as one scaled "
         "integer op (quantize_dynamic)", _integer, _int8_import),
    Pass("gelu", "prims", "exact and tanh GELU from erf/tanh chains", _transformer("gelu")),
    Pass("silu", "prims", "x * sigmoid(x) as silu, one input, so it joins a conv's or dense's "
         "tail", _transformer("silu")),
    Pass("layer-norm", "prims", "a decomposed LayerNorm (mean, variance, rsqrt, scale) as "
         "layer_norm", _transformer("layer-norm")),
    Pass("rms-norm", "prims", "a decomposed RMSNorm (mean of squares, rsqrt, scale) as "
         "rms_norm", _transformer("rms-norm")),
    Pass("rotary", "prims", "x * cos + rotate_half(x) * sin over a projection's heads (LLaMA, "
         "Mistral, Qwen2, Phi-3) as one rotary op reading and writing token layout, viewed "
         "back for the attention", _prims(fuse_rotary), _has("negative")),
    Pass("attention", "prims", "scaled dot-product attention (matmul, scale, mask, softmax, "
         "matmul) as one attention op; K/V heads repeated by repeat_kv (grouped-/multi-query) "
         "read un-repeated (kv_heads), a KV cache's (batch, kv heads, tokens, dim) in place; "
         "other heads in (batch, heads, tokens, dim) copied into its layout",
         _transformer("attention")),
    Pass("qkv-pack", "prims", "an attention's Q, K, V projections of one input as one dense",
         _prims(pack_qkv), _has("attention")),
    Pass("gated-mlp", "prims", "act(x W_gate) * (x W_up) (SiLU, GELU, ReLU or sigmoid) as one "
         "product twice as wide and the glu op; a packed product's halves (Phi-3) as glu",
         _prims(fuse_gated), _has("multiply")),
    Pass("sibling-pack", "prims", "products of one input with constant weights (a decoder's q, "
         "k, v beside rotary or a KV cache) as one dense, split back", _prims(pack_siblings),
         _has("dense")),
    Pass("kv-append", "prims", "a decoder layer's split q, k, v, rotaries, head transposes and "
         "KV-cache joins (past_key_values) as one kv_append op", _prims(fuse_kv_append),
         _has("rotary")),
    Pass("index-expr", "prims", "index arithmetic (Ranges, unit reshapes, comparisons, a "
         "Gather of a flattened input, logical ops, Where: a decoder's causal and padding "
         "mask) as one index_expr op evaluated on index grids", _index_expr,
         _has("cumsum")),
    Pass("int8-dynamic-quantize", "prims", "DynamicQuantizeLinear joined to the one product "
         "reading it", _prims(fuse_dynamic_quantize), _int8),
    Pass("int8-attention", "prims", "quantize_static's QDQ attention as qdq_attention (before "
         "its projections are packed)", _prims(fuse_qdq_attention),
         _int8),
    Pass("int8-qkv-pack", "prims", "a qdq_attention's projections packed into one product",
         _prims(pack_qdq_qkv),
         lambda state: state.int8 and _has("qdq_attention")(state)),
    Pass("int8-norm", "prims", "residual add + LayerNorm and quantized embeddings on the "
         "bytes (before the lookups, which would take the LayerNorm's DQ)",
         _prims(fuse_qdq_norms), _int8),
    Pass("int8-lookup", "prims", "elementwise chains between int8 values as 256-entry tables",
         _prims(fuse_lookups), _int8),
    Pass("int8-columns", "prims", "every other int8 projection in the columns form, a table "
         "after one folded into it", _prims(columns_form), _int8),
)
NAMES = tuple(p.name for p in PASSES)


def check_disabled(disable: Iterable[str]) -> frozenset[str]:
    """The pass names to skip; an unknown name is refused, listing the passes."""
    names = frozenset(disable)
    unknown = sorted(names - set(NAMES))
    if unknown:
        raise FrontendError(f"no import pass named {', '.join(map(repr, unknown))}; the passes "
                            f"are: {', '.join(NAMES)} (graphrun import --list-passes)")
    return names


def run_onnx_passes(state: OnnxState, disabled: Collection[str] = ()) -> Counter:
    """Every enabled ONNX-level pass on state, in order; what each did, summed."""
    return _run("onnx", state, disabled)


def run_prim_passes(state: PrimState, disabled: Collection[str] = ()) -> Counter:
    """Every enabled prim-level pass on state, in order (none with IMPORT_FUSE=off)."""
    if settings.word(settings.IMPORT_FUSE) == "off":
        return Counter()
    return _run("prims", state, disabled)


def fuse_lowered(lowered: Any, disabled: Collection[str] = ()) -> Counter:
    """Run the prim-level passes on lowered.builder.prims (in place); what they did."""
    state = PrimState(lowered.builder.prims, lowered.outputs,
                      bool(lowered.qdq_fused) and int8_import(), lowered.builder.dims_at)
    counts = run_prim_passes(state, disabled)
    lowered.builder.prims[:] = state.prims
    return counts


def _run(level: str, state: Any, disabled: Collection[str]) -> Counter:
    counts: Counter = Counter()
    for p in PASSES:
        if p.level == level and p.name not in disabled and p.applies(state):
            counts.update(+p.run(state))
    return counts


def describe() -> str:
    """The passes in order, one a line, for `graphrun import --list-passes`."""
    width = max(len(n) for n in NAMES)
    return "\n".join(f"{i:2}. {p.name:<{width}}  [{p.level}]  {p.summary}"
                     for i, p in enumerate(PASSES, 1))

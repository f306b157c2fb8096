"""The attention op: softmax(q k^T * scale + mask) v over heads, as transformers export it.

Inputs q (batch, q_len, wq), k and v (batch, k_len, wk/wv) and an optional additive mask that
broadcasts to (batch, heads, q_len, k_len); heads sit side by side in columns
[offset, offset + num_heads * head_dim) of each (one packed QKV array may serve all three).
Attrs: num_heads, head_dim, scale (1.0), q_offset, k_offset, v_offset (0), nan_to_zero (false:
where(isnan(p), 0, p) on the probabilities), kv_heads (num_heads): grouped- and multi-query
attention, k and v holding kv_heads heads in columns [offset, offset + kv_heads * head_dim),
query head h reading kv head h // (num_heads // kv_heads), as LLaMA's repeat_kv lays them out.
k and v may instead be (batch, kv_heads, k_len, head_dim) arrays (a KV cache's layout, offset 0),
each head read where it lies. Output (batch, q_len, num_heads * head_dim).
frontend/fusion/fuse_transformer.py forms it from the exporters' reshape/transpose/matmul/softmax
patterns.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..._lru import LruCache
from ...backends.base import Backend
from ..attrs import bool_attr, float_attr, int_attr, op_error
from ..kernels.cpu.attention import (FEW_BLOCK, AttentionKernel, FewQueryAttention, ViewsOf,
                                     few_queries_team)
from ..kernels.cpu.block_site import BlockSite, DimsMemo
from ..kernels.cuda_gemm import matmul_function
from ..kernels.cuda_rows import AttentionSoftmax
from ..kernels.heads import head_view
from ..kernels.host import array_module
from ..prepared import PreparedKernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_dtype, check_same_dtype
from .. import tuning

# Below this much work (multiply-adds x 2 of both products) a symbolic module's new shape takes
# OpenBLAS's products: a LLaMA decode step's 8 heads of 64 by up to 976 past tokens.
ONE_SHOT_FLOPS = 2_000_000
SHAPES_KEPT = 16  # kernels an AttentionByShape keeps, for the shapes met last
FEW_QUERIES = 1  # query rows up to which a shape takes FewQueryAttention: a decode step's token
# (4 rows by 8 tokens took 24 us there against 11 for OpenBLAS's products, each alone)
ATTRS = ("num_heads", "head_dim", "scale", "q_offset", "k_offset", "v_offset", "nan_to_zero",
         "kv_heads")


def _params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> dict[str, Any]:
    op = "attention"
    if len(inputs) not in (3, 4):
        raise op_error(op, f"takes q, k, v and an optional mask, got {len(inputs)} inputs")
    check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], ("float32", "float64"))
    heads = int_attr(op, attrs, "num_heads")
    dim = int_attr(op, attrs, "head_dim")
    kv_heads = int_attr(op, attrs, "kv_heads", heads)
    offsets = tuple(int_attr(op, attrs, f"{n}_offset", 0) for n in "qkv")
    q, k, v = inputs[:3]
    if len(q.shape) != 3:
        raise op_error(op, f"q {q} must be (batch, tokens, width)")
    for spec, name in ((k, "k"), (v, "v")):
        if len(spec.shape) not in (3, 4):
            raise op_error(op, f"{name} {spec} must be (batch, tokens, width) or (batch, "
                               f"kv_heads, tokens, head_dim)")
    batch, q_len = int(q.shape[0]), int(q.shape[1])
    k_len = int(k.shape[-2])
    if heads < 1 or dim < 1:
        raise op_error(op, f"num_heads {heads} and head_dim {dim} must be positive")
    if kv_heads < 1 or heads % kv_heads:
        raise op_error(op, f"kv_heads {kv_heads} must be a positive divisor of num_heads "
                           f"{heads}")
    for spec, name, off, n in ((q, "q", offsets[0], heads), (k, "k", offsets[1], kv_heads),
                               (v, "v", offsets[2], kv_heads)):
        shape = tuple(int(d) for d in spec.shape)
        if len(shape) == 4:
            if shape[:2] != (batch, n) or shape[3] != dim or off:
                raise op_error(op, f"{name} {spec} is not ({batch}, {n}, tokens, {dim}) with "
                                   f"{name}_offset 0 (it has {off})")
        elif shape[0] != batch or off < 0 or off + n * dim > shape[2]:
            raise op_error(op, f"{name} {spec} has no columns [{off}, {off + n * dim}) for "
                               f"batch {batch}")
    if int(v.shape[-2]) != k_len:
        raise op_error(op, f"v {v} needs {k_len} tokens as k {k} has")
    mask = tuple(int(d) for d in inputs[3].shape) if len(inputs) == 4 else None
    full = (batch, heads, q_len, k_len)
    if mask is not None:
        if len(mask) != 4 or any(m not in (1, f) for m, f in zip(mask, full)):
            raise op_error(op, f"mask {inputs[3]} does not broadcast to {full}")
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": q_len, "k_len": k_len,
            "head_dim": dim, "offsets": offsets, "scale": float_attr(op, attrs, "scale", 1.0),
            "nan_to_zero": bool_attr(op, attrs, "nan_to_zero", False), "mask_shape": mask,
            "dtype": q.dtype, "shapes": tuple(tuple(int(d) for d in spec.shape) for spec in
                                              (q, k, v))}


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = _params(inputs, attrs)
    return [TensorSpec((p["batch"], p["q_len"], p["heads"] * p["head_dim"]), p["dtype"])]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """OpenBLAS's or oneDNN's products (kernels/cpu/attention.py), as the tuning service
    measured them per shape; oneDNN is kept unless OpenBLAS is clearly faster (Whisper-tiny's
    attention: 98 against 83 us a layer on one thread, 25 us less with OpenMP)."""
    from ..kernels.onednn.attention_products import products_apply
    from ..kernels.onednn.choice import onednn_or
    p = _params(inputs, attrs)
    if _work(p) < ONE_SHOT_FLOPS and tuning.in_size_class_scope():
        # NOTE: a symbolic module's new shape (a decode step: every past length is new) may
        # run once: oneDNN's two primitives cost 1-2 ms to make, OpenBLAS's products nothing,
        # and at this size they differ by microseconds a run.
        return AttentionByShape(attrs, p, inputs)
    key = (f"{p['dtype']} {p['batch']}x{p['heads']} heads of {p['q_len']}x{p['head_dim']} by "
           f"{p['k_len']} tokens{' masked' if p['mask_shape'] is not None else ''}")
    shapes = [tuple(int(d) for d in spec.shape) for spec in list(inputs) + list(outputs)]
    return onednn_or("attention", key, products_apply(p["dtype"]),
                     lambda: AttentionKernel(**p, products="onednn"),
                     lambda: AttentionKernel(**p), shapes, base="on")


def _work(p: Mapping[str, Any]) -> int:
    """The attention's two products' flops."""
    return 4 * p["batch"] * p["heads"] * p["q_len"] * p["k_len"] * p["head_dim"]


class AttentionByShape(PreparedKernel):
    """The attention of a symbolic module's small new shapes, taking any shape
    (PreparedKernel.any_shape): kept by size class, it serves a decoder's every past length
    of the class, where each step prepared its own (0.2 ms of a 7 ms LLaMA decode step). A
    shape met is checked as prepare() checks it (_params); one of at most FEW_QUERIES query
    rows (a decode step) runs on the one FewQueryAttention, which takes any shape; any other
    gets an OpenBLAS AttentionKernel of its own, the last SHAPES_KEPT kept. Arrays of the shape
    met last go straight to its kernel (a call site's: call_site; its own calls have one too)."""

    def __init__(self, attrs: Mapping[str, Any], first: Mapping[str, Any],
                 inputs: Sequence[TensorSpec]) -> None:
        self.attrs = dict(attrs)
        self._dtype = str(first["dtype"])
        self._heads, self._head_dim = int(first["heads"]), int(first["head_dim"])
        self._few = FewQueryAttention(first["heads"], first["kv_heads"], first["head_dim"],
                                      first["offsets"], first["scale"], first["nan_to_zero"],
                                      first["mask_shape"] is not None, self._dtype)
        key = tuple(tuple(int(d) for d in spec.shape) for spec in inputs)
        self._kernels: LruCache[Any] = LruCache(SHAPES_KEPT)
        self._kernels.get_or_build(key, lambda: self._made(first))
        # the few-query shape met last, checked by _params (or as one like it: _other_tokens)
        self._few_key = key if first["q_len"] <= FEW_QUERIES else None
        self._own = ByShapeSite(self)  # where it is called itself

    def any_shape(self) -> bool:
        return True

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Shapes prepare() would give this kind of kernel too: work under ONE_SHOT_FLOPS
        (a larger shape is the tuning service's choice)."""
        q, k = shapes[0], shapes[1]  # (batch, tokens, width); k's tokens at -2 in either layout
        return _work({"batch": q[0], "heads": self._heads, "q_len": q[1], "k_len": k[-2],
                      "head_dim": self._head_dim}) < ONE_SHOT_FLOPS

    def workspace_bytes(self) -> int:
        return sum(int(kernel.scores.nbytes) for kernel in self._kernels.values()
                   if isinstance(kernel, AttentionKernel))

    def _made(self, p: Mapping[str, Any]) -> Any:
        return self._few if p["q_len"] <= FEW_QUERIES else AttentionKernel(**p)

    def _kernel(self, key: tuple[tuple[int, ...], ...]) -> Any:
        if self._few_key is not None and _other_tokens(key, self._few_key):
            self._few_key = key
            return self._few  # a decode step's next past length: checked as the one before
        kernel = self._kernels.get_or_build(key, lambda: self._made(_params(
            [TensorSpec(shape, self._dtype) for shape in key], self.attrs)))
        if kernel is self._few:
            self._few_key = key
        return kernel

    def __call__(self, *arrays: Any) -> None:
        self._own(*arrays)

    def call_site(self) -> ByShapeSite:
        """As AttentionKernel.call_site: one node's calls keep the views of its arrays."""
        return ByShapeSite(self)


def _other_tokens(key: tuple[tuple[int, ...], ...], checked: tuple[tuple[int, ...], ...]
                  ) -> bool:
    """Whether the shapes in key (q, k, v[, mask]) are checked's but for the tokens of k and v
    (their dim -2, equal) and the mask's last dim (theirs, or 1): every other check _params
    makes reads dims that did not move, so key passes them as checked did."""
    if len(key) != len(checked) or key[0] != checked[0]:
        return False
    k, v = key[1], key[2]
    tokens = k[-2] if len(k) >= 2 else -1
    for now, was in zip(key[1:3], checked[1:3]):
        if len(now) != len(was) or len(now) < 2 or now[-2] != tokens \
                or now[:-2] != was[:-2] or now[-1] != was[-1]:
            return False
    if len(key) == 4:
        mask, was = key[3], checked[3]
        if len(mask) != len(was) or not mask or mask[:-1] != was[:-1] \
                or mask[-1] not in (1, tokens) or (was[-1] == 1) != (mask[-1] == 1):
            return False
    return tokens > 0 and v[-2] == tokens


class ByShapeSite(BlockSite):
    """An AttentionByShape as one node calls it: the kernel of its last shape, with the views
    of that node's arrays where it is an AttentionKernel (FewQueryAttention keeps none). A
    decode step's FewQueryAttention is recorded as its team function on the site's block,
    which follows the node's arrays to each new past length (cpu/block_site.py)."""

    def __init__(self, by_shape: AttentionByShape) -> None:
        super().__init__(FEW_BLOCK)
        self.by_shape = by_shape
        self.key: tuple[tuple[int, ...], ...] | None = None
        self.kernel: Any = None
        self.seen: ViewsOf | None = None
        self._memo = DimsMemo()  # (its few-query block's arrays, read last)

    def _pick(self, arrays: Sequence[Any]) -> Any:
        """The kernel for the arrays' shapes (checked as prepare() checks them)."""
        key = tuple(a.shape for a in arrays[:-1])
        if key != self.key:
            self.kernel = self.by_shape._kernel(key)
            self.key = key
            self.seen = ViewsOf() if isinstance(self.kernel, AttentionKernel) else None
        return self.kernel

    def function(self) -> Any:
        return few_queries_team()

    def values(self, args: Sequence[Any]) -> list[int] | None:
        kernel = self._pick(args)
        return kernel.block_values(args, self._memo) \
            if isinstance(kernel, FewQueryAttention) else None

    def plain(self, *arrays: Any) -> None:
        self._pick(arrays)
        if self.seen is None:
            self.kernel(*arrays)
        else:
            self.kernel.run_with(self.seen, arrays)


def _opencl(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.opencl.attention import AttentionCl
    return AttentionCl(backend, device_id, **_params(inputs, attrs))  # type: ignore[arg-type]


class HostAttention(PreparedKernel):
    """The op against NumPy's API, for CuPy (cuda): head views into matmul, softmax as NumPy's
    (a NaN row stays NaN unless nan_to_zero), the output heads written into out's columns.
    The scores live in one buffer made here and reused by every run: its workspace.

    Operands in token layout holding several sequences are first copied head-major (one copy
    kernel each): their heads are then matrices one stride apart, each product one
    strided-batched cuBLAS call, and a query group's heads (grouped-query attention) the rows
    of one matrix. Left as they lie, the product took one call per sequence: BERT-base at
    batch 32 made 768 small cuBLAS calls, 13 of its 21 ms on an H200."""

    def __init__(self, xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> None:
        self.xp, self.p = xp, _params(inputs, attrs)
        self.matmul = matmul_function(xp)
        self.backend, self.device_id = backend, device_id
        p = self.p
        batch, heads, kv, dim = p["batch"], p["heads"], p["kv_heads"], p["head_dim"]
        q_len, k_len, dtype = p["q_len"], p["k_len"], p["dtype"]
        group = heads // kv
        with backend.scope(device_id):
            self.scores = xp.empty((batch, heads, q_len, k_len), dtype)
            self.context = xp.empty((batch, kv, group, q_len, dim), dtype)
            self.staged = {
                i: xp.empty((batch, kv, n, tokens, dim), dtype)
                for i, (n, tokens) in enumerate(((group, q_len), (1, k_len), (1, k_len)))
                if batch > 1 and tokens > 1 and len(p["shapes"][i]) == 3}
        sizes = (batch, heads, q_len, k_len, dtype)
        self.softmax = (AttentionSoftmax(*sizes, p["scale"], p["nan_to_zero"])
                        if xp is not np and AttentionSoftmax.fits(*sizes) else None)

    def workspace_bytes(self) -> int:
        return int(self.scores.nbytes + self.context.nbytes
                   + sum(b.nbytes for b in self.staged.values()))

    def __call__(self, q: Any, k: Any, v: Any, *rest: Any) -> None:
        xp, p, s, out = self.xp, self.p, self.scores, rest[-1]
        heads, kv, dim, (oq, ok, ov) = p["heads"], p["kv_heads"], p["head_dim"], p["offsets"]
        batch, q_len, k_len = p["batch"], p["q_len"], p["k_len"]
        group = heads // kv
        with self.backend.scope(self.device_id):
            # (batch, kv heads, group, ...): each kv head broadcast over the query heads it serves
            views = [head_view(q, oq, heads, dim, kv), head_view(k, ok, kv, dim, kv),
                     head_view(v, ov, kv, dim, kv)]
            for i, buf in self.staged.items():
                buf[...] = views[i]
                views[i] = buf
            rows = (group, q_len)
            if 0 in self.staged:  # a group's queries are consecutive rows: one matrix
                rows = (1, group * q_len)
                views[0] = views[0].reshape(batch, kv, *rows, dim)
            s5 = s.reshape(batch, kv, *rows, k_len)
            self.matmul(views[0], views[1].transpose(0, 1, 2, 4, 3), out=s5)
            mask = rest[0] if p["mask_shape"] is not None else None
            if self.softmax is None or not self.softmax(s, mask):
                s *= p["scale"]
                if mask is not None:
                    s += mask
                s -= s.max(axis=-1, keepdims=True)
                xp.exp(s, out=s)
                s /= s.sum(axis=-1, keepdims=True)
                if p["nan_to_zero"]:
                    xp.copyto(s, 0, where=xp.isnan(s))
            self.matmul(s5, views[2], out=self.context.reshape(batch, kv, *rows, dim))
            out.reshape(batch, q_len, kv, group, dim)[...] = \
                self.context.transpose(0, 3, 1, 2, 4)


def _cuda(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
          outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    return HostAttention(array_module(backend), backend, device_id, inputs, outputs, attrs)


define_op("attention", _infer, None, ATTRS)
kernel("attention", "cpu")(_cpu)
kernel("attention", "opencl")(_opencl)
kernel("attention", "cuda")(_cuda)

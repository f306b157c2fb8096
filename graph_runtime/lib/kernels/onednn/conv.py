"""conv2d on oneDNN: one convolution primitive per node, the chain's epilogue as its post-ops.

The primitive is made at create() for NCHW data and output (keeping oneDNN's layout between
oneDNN nodes comes later) with weights in the layout oneDNN picks, reordered once and again when
the weight is written. A leading per-channel add is the primitive's bias, a residual add its sum
post-op, other adds binary-add post-ops reading the operand in place; relu, clip, leaky relu,
sigmoid, hard-swish and gelu are eltwise post-ops. A run is the conv primitive between the two
layout reorders (three foreign calls, four with a residual), all prepared at create().
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...conv_params import ConvParams
from ..cpu.conv import ConvKernel
from ..cpu.conv_epilogue import Epilogue, EpilogueOp
from ..cpu.threads import num_threads
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .weights import PackedWeight, aligned_buffer

DTYPES = ("float32",)


def _full_adds(epilogue: Epilogue) -> list[EpilogueOp]:
    return [op for op in epilogue.ops if op.kind == "add" and op.shape == epilogue.out_shape]


def conv_applies(p: ConvParams, epilogue: Epilogue) -> bool:
    """Whether OnednnConv computes this conv and epilogue (and the library is here).

    A full-size add (a residual) becomes the sum post-op, of which oneDNN takes one; other adds
    must broadcast per channel or per tensor (binary post-ops).
    """
    if p.dtype not in DTYPES or min(p.n, p.c, p.o, p.oh, p.ow) == 0 or not dn.available():
        return False
    tail = epilogue.without(epilogue.channel_bias())
    if len(_full_adds(tail)) > 1:
        return False
    for op in tail.ops:
        if op.kind == "add" and op.shape != epilogue.out_shape and not (
                op.shape[0] == op.shape[2] == op.shape[3] == 1 and op.shape[1] in (1, p.o)):
            return False
        if op.kind == "clip" and not op.lo <= op.hi:
            return False  # np.clip then gives hi everywhere; oneDNN's clip gives lo
    return True


class OnednnConv(ConvKernel):
    """One oneDNN convolution primitive over NCHW float32 arrays, NHWC inside.

    Handed NCHW arrays, oneDNN 3.2 runs an im2col + GEMM kernel (gemm:jit: 2-17x slower than
    its direct kernels here, and a binary post-op on NCHW falls to its reference code); so the
    primitive runs its direct NHWC kernels (brgconv, brdgmm_dw) between two reorders, the data
    NCHW -> NHWC and the output back. A residual add is oneDNN's sum post-op: the residual is
    reordered into the primitive's NHWC output first, and the sum adds it in.
    """

    strategy = "onednn"
    derived = (1,)

    def __init__(self, p: ConvParams, epilogue: Epilogue) -> None:
        super().__init__(p, epilogue)
        self.threads = num_threads()
        dn.use_threads(self.threads)
        self.bias = epilogue.channel_bias()
        tail = epilogue.without(self.bias)
        full = _full_adds(tail)[:1]  # oneDNN takes one sum; a second add stays binary
        self.residual = full[0].operand if full else None
        self.adds = [op.operand for op in tail.ops if op.kind == "add" and op not in full]
        in_shape = (p.n, p.c, p.h, p.w)
        out_shape = (p.n, p.o, p.oh, p.ow)
        src = MemoryDesc.plain(in_shape, abi.TAG_ACDB)
        dst = MemoryDesc.plain(out_shape, abi.TAG_ACDB)
        w_shape: tuple[int, ...] = (p.o, p.cg, p.kh, p.kw)
        if p.groups > 1:
            w_shape = (p.groups, p.og, p.cg, p.kh, p.kw)  # goihw: the same bytes as OIHW
        w_any = MemoryDesc.plain(w_shape, abi.TAG_ANY)
        bias = MemoryDesc.plain((p.o,)) if self.bias is not None else None
        operands = [MemoryDesc.plain(op.shape) for op in tail.ops
                    if op.kind == "add" and op not in full]
        attr, post_ops = dn.post_ops_attr(lambda lib, ops: _append_post_ops(lib, ops, tail, full,
                                                                            operands))
        try:
            pd = PrimitiveDesc(
                "dnnl_convolution_forward_primitive_desc_create", dn.library().engine,
                abi.FORWARD_INFERENCE, abi.CONVOLUTION_DIRECT, src.handle, w_any.handle,
                None if bias is None else bias.handle, dst.handle, dn.dims_array(p.strides),
                dn.dims_array([d - 1 for d in p.dilation]), dn.dims_array(p.pad[:2]),
                dn.dims_array(p.pad[2:]), attr)
        finally:
            dn.free_attr(attr, post_ops)
        self.impl = pd.impl()
        self.weight = PackedWeight(MemoryDesc.plain(w_shape), pd.md(abi.QUERY_WEIGHTS_MD, w_shape))
        self.src = Memory(src)
        self.dst = Memory(dst)
        self.bias_mem = Memory(bias) if bias is not None else None
        self.operand_mems = [Memory(md) for md in operands]
        args = [(abi.ARG_SRC, self.src), (abi.ARG_WEIGHTS, self.weight.memory), (abi.ARG_DST, self.dst)]
        if self.bias_mem is not None:
            args.append((abi.ARG_BIAS, self.bias_mem))
        binary = [i for i, op in enumerate(tail.ops) if op.kind == "add" and op not in full]
        for index, mem in zip(binary, self.operand_mems):
            args.append((abi.ARG_POST_OP_BASE * (index + 1) | abi.ARG_SRC_1, mem))
        self.primitive = Primitive(pd, args)
        # (memory, extra input) pairs bound each run: the bias, then the binary-add operands
        self.operands = list(zip(self.operand_mems, self.adds))
        if self.bias_mem is not None and self.bias is not None:
            self.operands.insert(0, (self.bias_mem, self.bias))
        self._user_in = Memory(MemoryDesc.plain(in_shape))
        self._user_out = Memory(MemoryDesc.plain(out_shape))
        self._user_residual = Memory(MemoryDesc.plain(out_shape))
        self._buffers = []
        self.src.bind(self._workspace(src.size()))
        self.dst.bind(self._workspace(dst.size()))
        self.to_nhwc = Primitive(dn.reorder(self._user_in.desc, src),
                                 [(abi.ARG_FROM, self._user_in), (abi.ARG_TO, self.src)])
        self.to_nchw = Primitive(dn.reorder(dst, self._user_out.desc),
                                 [(abi.ARG_FROM, self.dst), (abi.ARG_TO, self._user_out)])
        self.residual_in = Primitive(dn.reorder(self._user_residual.desc, dst),
                                     [(abi.ARG_FROM, self._user_residual), (abi.ARG_TO, self.dst)])

    def _workspace(self, nbytes: int) -> np.ndarray:
        buf = aligned_buffer(nbytes)
        self._buffers.append(buf)
        return buf

    def workspace_bytes(self) -> int:
        return self.weight.nbytes + sum(int(b.nbytes) for b in self._buffers)

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        dn.use_threads(self.threads)
        out = rest[-1]
        if self.weight.direct:
            self.weight.memory.bind(weight)
        elif self._stale():
            self.weight.refresh(weight)
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        for mem, operand in self.operands:
            mem.bind(rest[operand])
        self._user_in.bind(data)
        self.to_nhwc.run()
        if self.residual is not None:
            self._user_residual.bind(rest[self.residual])
            self.residual_in.run()
        self.primitive.run()
        self._user_out.bind(out)
        self.to_nchw.run()

    def __repr__(self) -> str:
        return f"OnednnConv({self.strategy}: {self.impl})"


def _append_post_ops(lib: dn.Dnnl, ops: Any, epilogue: Epilogue, full: list[EpilogueOp],
                     operands: list[MemoryDesc]) -> None:
    """The epilogue (bias already taken off) as post-ops, in order."""
    k = 0
    for op in epilogue.ops:
        if op.kind == "add" and op in full:
            lib.call("dnnl_post_ops_append_sum", ops, 1.0, 0, 0)
        elif op.kind == "add":
            lib.call("dnnl_post_ops_append_binary", ops, abi.BINARY_ADD, operands[k].handle)
            k += 1
        elif op.kind in ELTWISE:
            alg, alpha, beta = ELTWISE[op.kind](op)
            lib.call("dnnl_post_ops_append_eltwise", ops, alg, alpha, beta)
        else:
            raise AssertionError(f"no oneDNN post-op for {op.kind!r}")


# epilogue op kind -> (oneDNN eltwise algorithm, alpha, beta) of the same function
ELTWISE: dict[str, Callable[[EpilogueOp], tuple[int, float, float]]] = {
    "relu": lambda op: (abi.ELTWISE_RELU, 0.0, 0.0),
    "clip": lambda op: (abi.ELTWISE_CLIP, op.lo, op.hi),
    "leaky_relu": lambda op: (abi.ELTWISE_RELU, op.lo, 0.0),  # oneDNN's relu: alpha * x below 0
    "sigmoid": lambda op: (abi.ELTWISE_LOGISTIC, 0.0, 0.0),
    "hard_swish": lambda op: (abi.ELTWISE_HARDSWISH, 1 / 6, 0.5),  # x * clip(x / 6 + 1/2, 0, 1)
    "gelu": lambda op: (abi.ELTWISE_GELU_ERF, 0.0, 0.0),
    "gelu_tanh": lambda op: (abi.ELTWISE_GELU_TANH, 0.0, 0.0),
}

"""conv2d on oneDNN: one convolution primitive per node, the chain's epilogue as its post-ops.

The primitive is made at create() for NHWC data and output with weights in the layout oneDNN
picks, reordered once and again when the weight is written. Data, residual and output arrive as
NCHW arrays and are reordered to and from NHWC buffers, unless the executor keeps them NHWC
between oneDNN nodes (prepared.PreparedKernel.use_channels_last): then the conv reads and writes
them in place, and where the executor hands it an NHWC residual as its own output array
(runtime/in_place.py) the sum post-op adds into it with no copy first. A leading per-channel
add is the primitive's bias, a residual add its sum post-op, other adds binary-add post-ops
reading the operand in place; relu, clip, leaky relu, sigmoid, hard-swish, gelu and a silu
before other ops are eltwise post-ops; a last silu is the caller's compiled pass over each
item's rows (cpu/silu_pass.py), where one is given. A run is the conv primitive between the two
layout reorders (three foreign calls, four with a residual copied in; one between NHWC
neighbours), all prepared at create().
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...conv_params import ConvParams
from ..conv_kernel import ConvKernel
from ..conv_epilogue import Epilogue, EpilogueOp
from ....errors import LibraryError
from ..threads import parallel_images
from .. import replay
from . import abi
from . import binding as dn
from .policy import policy
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .layout import rows_read, NCHW, NHWC, BandedReorder, band_offset, bands, is_nhwc
from .nchw_data_conv import NchwDataConv
from .weights import PackedWeight, aligned_buffer

DTYPES = ("float32",)
# Below this a conv stays one work item: tens of microseconds on one core, about what handing
# bands to the workers costs (ResNet's 32x32 test model: 0.72 ms forced onto oneDNN in bands,
# NumPy 0.24 ms).
MIN_SPLIT_FLOPS = 64_000_000
# silu_pass(count, on_team): a pass applying silu in place over count float32 values at an
# address it is bound to (bind_address, run); the CPU family's cpu/silu_pass.SiluBand
SiluPass = Callable[[int, bool], Any]


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
    """A conv2d on oneDNN over NCHW float32 arrays, NHWC inside.

    Handed NCHW arrays, oneDNN 3.2 runs an im2col + GEMM kernel (gemm:jit: 2-17x slower than
    its direct kernels here, and a binary post-op on NCHW falls to its reference code); so its
    direct NHWC kernels (brgconv, brdgmm_dw) run between two reorders, the data NCHW -> NHWC and
    the output back. A residual add is oneDNN's sum post-op: the residual is reordered into the
    NHWC output first, and the sum adds it in. The work is cut into items, whole images or bands
    of output rows for the runtime's workers (policy.py), each a single-threaded primitive with the padding
    of its edge, all sharing one packed weight.
    """

    strategy = "onednn"
    derived = (1,)
    op_name = "conv2d"
    create = "dnnl_convolution_forward_primitive_desc_create"
    algorithm = abi.CONVOLUTION_DIRECT

    def __init__(self, p: ConvParams, epilogue: Epilogue,
                 silu_pass: SiluPass | None = None) -> None:
        super().__init__(p, epilogue)
        self._silu_pass = silu_pass
        threads = policy()
        self.openmp = threads.openmp
        dn.use_threads(self.openmp)
        self.bias = epilogue.channel_bias()
        tail = epilogue.without(self.bias)
        # given a silu pass, a last silu runs as that pass over each item's rows, not as
        # oneDNN's slow swish post-op (cpu/silu_pass.py); the post-ops before it keep their
        # positions
        silu_last = bool(tail.ops) and tail.ops[-1].kind == "silu"
        self.silu_after = silu_pass is not None and silu_last
        if self.silu_after:
            tail = Epilogue(tail.ops[:-1], tail.out_shape)
        elif silu_last:
            self.strategy = "onednn_swish"  # the last silu as the swish post-op (conv_choice)
        full = _full_adds(tail)[:1]  # oneDNN takes one sum; a second add stays binary
        self.residual = full[0].operand if full else None
        self.adds = [op.operand for op in tail.ops if op.kind == "add" and op not in full]
        w_shape: tuple[int, ...] = (p.o, p.cg, p.kh, p.kw)
        if p.groups > 1:
            w_shape = (p.groups, p.og, p.cg, p.kh, p.kw)
        self._w_shape = w_shape
        self._bias_md = MemoryDesc.plain((p.o,)) if self.bias is not None else None
        self._operand_mds = [MemoryDesc.plain(op.shape) for op in tail.ops
                             if op.kind == "add" and op not in full]
        self._tail, self._full = tail, full
        self._pds: dict[tuple[int, ...], PrimitiveDesc] = {}
        self._chosen_w: MemoryDesc | None = None
        self.workers = threads.workers
        self._buffers = []
        try:
            pieces = self._pieces()
            first = self._pd(pieces[0][0], pieces[0][1], pieces[0][2] - pieces[0][1])
            self._chosen_w = first.md(abi.QUERY_WEIGHTS_MD, w_shape)
            for n, r0, r1 in pieces:
                self._pd(n, r0, r1 - r0)
        except LibraryError:
            self._pds, self._chosen_w = {}, None
            pieces = [(-1, 0, p.oh)]  # one primitive over the whole batch, on this thread
            first = self._pd(-1, 0, p.oh)
            self._chosen_w = first.md(abi.QUERY_WEIGHTS_MD, w_shape)
        self.impl = first.impl()
        self.pieces = pieces
        self.weight = PackedWeight(self._user_weight(), self._chosen_w)
        self.bias_mem = Memory(self._bias_md) if self._bias_md is not None else None
        self.operand_mems = [Memory(md) for md in self._operand_mds]
        # (primitive, src memory, its byte offset, dst memory, its byte offset) per work item;
        # the offsets are into NHWC arrays, the conv's own buffers or NHWC neighbours alike
        self.items = [self._item(n, r0, r1) for n, r0, r1 in pieces]
        self.silu_bands = self.silu_after_items(pieces)
        # (memory, extra input) pairs bound each run: the bias, then the binary-add operands
        self.operands = list(zip(self.operand_mems, self.adds))
        if self.bias_mem is not None and self.bias is not None:
            self.operands.insert(0, (self.bias_mem, self.bias))
        adds = [op.operand for op in epilogue.ops if op.kind == "add"]
        self.out_position = 2 + (max(adds) + 1 if adds else 0)
        self.nhwc: frozenset[int] = frozenset()
        self._nchw_data: NchwDataConv | None | bool = False  # False: not tried yet
        self._first_out: Any = None
        self._wire()

    def _user_weight(self) -> MemoryDesc:
        """The op's weight as oneDNN sees it: OIHW, or goihw (the same bytes) with groups."""
        return MemoryDesc.plain(self._w_shape)

    def channels_last_positions(self) -> tuple[int, ...]:
        """The data, the residual and the output may be NHWC arrays."""
        residual = () if self.residual is None else (2 + self.residual,)
        return (0,) + residual + (self.out_position,)

    def use_channels_last(self, positions: Any) -> None:
        self.nhwc = frozenset(positions)
        self._wire()

    def in_place_positions(self) -> dict[int, int]:
        """An NHWC residual may be the NHWC output's own array: the sum post-op then adds it in
        place, and its copy into the output is skipped (_bind sees the same address)."""
        if self.residual is None:
            return {}
        residual = 2 + self.residual
        if residual in self.nhwc and self.out_position in self.nhwc:
            return {self.out_position: residual}
        return {}

    def _layout(self, position: int) -> str:
        return NHWC if position in self.nhwc else NCHW

    def _wire(self) -> None:
        """Buffers and reorders for the layouts of data, residual and output.

        The data reorder runs first, in bands of input rows (a conv band reads its neighbours'
        rows too); then each item reorders its residual rows in, convolves and reorders its
        output rows back, in one hand-off. Whole images need no halo: one loop does all.
        """
        p, pieces = self.p, self.pieces
        in_shape = (p.n, p.c, p.h, p.w)
        out_shape = (p.n, p.o, p.oh, p.ow)
        self._buffers = []
        data_nhwc = self._layout(0) == NHWC
        out_nhwc = self._layout(self.out_position) == NHWC
        # NCHW data into NHWC output: oneDNN's first-conv kernel reads the data itself
        self.nchw_data: NchwDataConv | None = None
        if not data_nhwc and out_nhwc:
            if self._nchw_data is False:
                self._nchw_data = NchwDataConv.make(self)
            made = self._nchw_data
            self.nchw_data = made if isinstance(made, NchwDataConv) else None
        if self.nchw_data is not None:
            data_nhwc = True  # no data reorder, no buffer for it: the primitive reads NCHW
        self.src_buf = None if data_nhwc else self._workspace(4 * p.n * p.c * p.h * p.w)
        self.dst_buf = None if out_nhwc else self._workspace(4 * p.n * p.o * p.oh * p.ow)
        whole = all(r0 == 0 and r1 == p.oh for _, r0, r1 in pieces)
        self.data_in: BandedReorder | None = None
        if not data_nhwc:
            in_pieces = [(n, 0, p.h) for n, _, _ in pieces] if whole else bands(
                p.n, p.h, self.workers)
            self.data_in = BandedReorder(in_shape, NCHW, NHWC, in_pieces)
        self.residual_in: BandedReorder | None = None
        if self.residual is not None:
            self.residual_in = BandedReorder(out_shape, self._layout(2 + self.residual), NHWC,
                                             pieces)
        self.out: BandedReorder | None = None if out_nhwc else BandedReorder(
            out_shape, NHWC, NCHW, pieces)
        self.together = whole and self.data_in is not None
        self.in_place = False  # the residual is the output's own array (_bind)
        self.steps = [self._steps(i) for i in range(len(pieces))]
        self._arrays: tuple[Any, ...] = ()

    def _pieces(self) -> list[tuple[int, int, int]]:
        """(image, first output row, end row) work items (layout.bands); one for a small conv,
        whose hand-off to the workers would cost more than they save."""
        p = self.p
        flops = 2 * p.n * p.o * p.oh * p.ow * p.cg * p.kh * p.kw
        return bands(p.n, p.oh, self.workers if flops >= MIN_SPLIT_FLOPS else 1)

    def _rows_in(self, r0: int, rows: int) -> tuple[int, int, int, int]:
        """(first input row, input rows, top pad, bottom pad) that output rows r0.. read."""
        read = rows_read(self.p, r0, rows)
        if read[1] == 0:
            raise LibraryError(f"conv2d rows {r0}..{r0 + rows} read padding only")
        return read

    def _pd(self, n: int, r0: int, rows: int) -> PrimitiveDesc:
        """The primitive descriptor for output rows r0.. of one image (n >= 0) or of all."""
        p = self.p
        _, h_in, top, bottom = self._rows_in(r0, rows)
        batch = p.n if n < 0 else 1
        key = (batch, h_in, top, bottom, rows)
        if key in self._pds:
            return self._pds[key]
        src = MemoryDesc.plain((batch, p.c, h_in, p.w), abi.TAG_ACDB)
        dst = MemoryDesc.plain((batch, p.o, rows, p.ow), abi.TAG_ACDB)
        weights = self._chosen_w or MemoryDesc.plain(self._w_shape, abi.TAG_ANY)
        tail, full, operands = self._tail, self._full, self._operand_mds
        attr, post_ops = dn.post_ops_attr(lambda lib, ops: _append_post_ops(lib, ops, tail, full,
                                                                            operands))
        try:
            pd = PrimitiveDesc(
                self.create, dn.library().engine,
                abi.FORWARD_INFERENCE, self.algorithm, src.handle, weights.handle,
                None if self._bias_md is None else self._bias_md.handle, dst.handle,
                dn.dims_array(p.strides), dn.dims_array([d - 1 for d in p.dilation]),
                dn.dims_array((top, p.pad[1])), dn.dims_array((bottom, p.pad[3])), attr)
        finally:
            dn.free_attr(attr, post_ops)
        self._pds[key] = pd
        return pd

    def _item(self, n: int, r0: int, r1: int) -> tuple[Primitive, Memory, int, Memory, int]:
        """One work item: its primitive, and its memories with their offsets into the NHWC
        source and destination (bound each run)."""
        p = self.p
        a_in, h_in, _, _ = self._rows_in(r0, r1 - r0)
        batch = p.n if n < 0 else 1
        image = max(n, 0)
        pd = self._pd(n, r0, r1 - r0)
        src = Memory(MemoryDesc.plain((batch, p.c, h_in, p.w), abi.TAG_ACDB))
        dst = Memory(MemoryDesc.plain((batch, p.o, r1 - r0, p.ow), abi.TAG_ACDB))
        src_offset = 4 * band_offset((p.n, p.c, p.h, p.w), NHWC, image, a_in)
        dst_offset = 4 * band_offset((p.n, p.o, p.oh, p.ow), NHWC, image, r0)
        args = [(abi.ARG_SRC, src), (abi.ARG_WEIGHTS, self.weight.memory), (abi.ARG_DST, dst)]
        if self.bias_mem is not None:
            args.append((abi.ARG_BIAS, self.bias_mem))
        binary = [i for i, op in enumerate(self._tail.ops)
                  if op.kind == "add" and op not in self._full]
        for index, mem in zip(binary, self.operand_mems):
            args.append((abi.ARG_POST_OP_BASE * (index + 1) | abi.ARG_SRC_1, mem))
        return Primitive(pd, args), src, src_offset, dst, dst_offset

    def silu_after_items(self, pieces: list[tuple[int, int, int]]) -> list[Any]:
        """The silu pass of each work item (none without a last silu): over its output rows,
        on the OpenMP team where its primitive runs there (one item, OpenMP threads)."""
        make = self._silu_pass
        if not self.silu_after or make is None:
            return []
        p = self.p
        team = len(pieces) == 1 and self.openmp > 1
        return [make((p.n if n < 0 else 1) * p.o * (r1 - r0) * p.ow, team)
                for n, r0, r1 in pieces]

    def _workspace(self, nbytes: int) -> np.ndarray:
        buf = aligned_buffer(nbytes)
        self._buffers.append(buf)
        return buf

    def workspace_bytes(self) -> int:
        return self.weight.nbytes + self._own_bytes()

    def workspace_items(self) -> list[tuple[Any, int]]:
        """The weight's copy as PackedWeight.owner counts it (a frozen weight's, shared by the
        convs of every size class), the rest (reorder buffers, the NCHW-data conv) its own."""
        own = self._own_bytes()
        items = [(self.weight.owner(self), self.weight.nbytes)] if self.weight.nbytes else []
        return items + ([(self, own)] if own else [])

    def _own_bytes(self) -> int:
        """Its reorder buffers and the NCHW-data conv's: the workspace but the weight's copy."""
        first = 0 if self.nchw_data is None else self.nchw_data.nbytes
        return first + sum(int(b.nbytes) for b in self._buffers)

    def append_post_ops(self, lib: dn.Dnnl, ops: Any) -> None:
        """The epilogue (bias taken off) as this conv's post-ops (for a variant's primitive)."""
        _append_post_ops(lib, ops, self._tail, self._full, self._operand_mds)

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        dn.use_threads(self.openmp)
        out = rest[-1]
        if self.nchw_data is not None:
            self._first_conv(data, weight, rest)
            return
        if self.weight.direct:
            self.weight.memory.bind(weight)
        elif self._stale():
            self.weight.refresh(weight)
        copied = self.data_in is not None and not data.flags.c_contiguous
        if copied:
            data = np.ascontiguousarray(data)
        for mem, operand in self.operands:
            mem.bind(rest[operand])
        residual = None if self.residual is None else rest[self.residual]
        arrays = (data, residual, out)
        if len(self._arrays) != 3 or any(a is not b for a, b in zip(arrays, self._arrays)):
            self._bind(data, residual, out)
        works = [self.steps]
        if not self.together and self.data_in is not None:
            works.insert(0, [(item,) for item in self.data_in.items])
        for work in works:
            self._run(work)
        if replay.active is not None and not copied and self._primitives_alone(works,
                                                                                self.weight):
            replay.whole_call(self)

    def _primitives_alone(self, works: list[list[tuple[Any, ...]]], weight: Any) -> bool:
        """Whether the call was oneDNN primitives alone, run on this thread (no work items on
        the workers, no silu pass), on a weight (a PackedWeight) not derived anew each run: a
        replay's word (kernels/replay.py)."""
        return (weight.direct or not self._volatile()) and all(
            len(work) == 1 and all(isinstance(step, dn.Primitive) for step in work[0])
            for work in works)

    def _first_conv(self, data: Any, weight: Any, rest: tuple[Any, ...]) -> None:
        """The run as one primitive reading NCHW data (nchw_data_conv.py)."""
        first = self.nchw_data
        assert first is not None
        out = rest[-1]
        if out is not self._first_out:
            if not is_nhwc(out):
                raise LibraryError(f"oneDNN {self.op_name} argument {self.out_position}: "
                                   f"expected an NHWC array, got strides {out.strides} for "
                                   f"shape {out.shape}")
            self._first_out = out
        copied = not data.flags.c_contiguous
        if copied:
            data = np.ascontiguousarray(data)
        for mem, operand in self.operands:
            mem.bind(rest[operand])
        first.bind(data, weight, not first.weight.direct and self._stale(), out)
        self._run(first.work)
        if replay.active is not None and not copied and self._primitives_alone(
                [first.work], first.weight):
            replay.whole_call(self)

    def _bind(self, data: Any, residual: Any, out: Any) -> None:
        """Point the reorders and the items at this run's arrays."""
        checks = [(0, data), (self.out_position, out)]
        if self.residual is not None:
            checks.append((2 + self.residual, residual))
        for position, array in checks:
            nhwc = self._layout(position) == NHWC
            if not (is_nhwc(array) if nhwc else array.flags.c_contiguous):
                raise LibraryError(f"oneDNN {self.op_name} argument {position}: expected a "
                                   f"{self._layout(position).upper()} array, got strides "
                                   f"{array.strides} for shape {array.shape}")
        assert self.src_buf is not None or self.data_in is None
        src = data.ctypes.data if self.src_buf is None else self.src_buf.ctypes.data
        dst = out.ctypes.data if self.dst_buf is None else self.dst_buf.ctypes.data
        if self.data_in is not None:
            self.data_in.bind(data.ctypes.data, src)
        in_place = self.residual_in is not None and residual.ctypes.data == dst
        if in_place != self.in_place:
            self.in_place = in_place
            self.steps = [self._steps(i) for i in range(len(self.pieces))]
        if self.residual_in is not None:
            self.residual_in.bind(residual.ctypes.data, dst)
        if self.out is not None:
            self.out.bind(dst, out.ctypes.data)
        for _, src_mem, src_offset, dst_mem, dst_offset in self.items:
            src_mem.bind_address(src + src_offset)
            dst_mem.bind_address(dst + dst_offset)
        for band, item in zip(self.silu_bands, self.items):
            band.bind_address(dst + item[4])
        self._arrays = (data, residual, out)

    def _steps(self, i: int) -> tuple[Any, ...]:
        """What work item i runs in order: its data rows in (whole images only), its residual
        rows in, the conv of its rows, its output rows back to NCHW (each where needed; no
        residual rows where the residual is the output's own buffer)."""
        steps: list[Any] = []
        if self.together and self.data_in is not None:
            steps.append(self.data_in.items[i])
        if self.residual_in is not None and not self.in_place:
            steps.append(self.residual_in.items[i])
        steps.append(self.items[i][0])
        if self.silu_bands:
            steps.append(self.silu_bands[i])
        if self.out is not None:
            steps.append(self.out.items[i])
        return tuple(steps)

    def convolve(self) -> None:
        """The conv alone (with its silu pass), NHWC buffer to NHWC buffer, over the workers
        (for measuring)."""
        self._run([(item[0],) + tuple(self.silu_bands[i:i + 1])
                   for i, item in enumerate(self.items)])

    def _run(self, work: list[tuple[Any, ...]]) -> None:
        if len(work) == 1:
            for step in work[0]:
                step.run()
            return
        parallel_images(len(work), self.workers, lambda worker, i: _run_steps(work[i]))

    def __repr__(self) -> str:
        silu = ", then a silu pass" if self.silu_after else ""
        return f"OnednnConv({self.strategy}: {self.impl}{silu})"


def _run_steps(steps: tuple[Any, ...]) -> None:
    """One work item on a runtime worker, oneDNN single-threaded there."""
    dn.use_threads(1)
    for step in steps:
        step.run()


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
    "silu": lambda op: (abi.ELTWISE_SWISH, 1.0, 0.0),  # x * sigmoid(alpha * x)
    "hard_swish": lambda op: (abi.ELTWISE_HARDSWISH, 1 / 6, 0.5),  # x * clip(x / 6 + 1/2, 0, 1)
    "gelu": lambda op: (abi.ELTWISE_GELU_ERF, 0.0, 0.0),
    "gelu_tanh": lambda op: (abi.ELTWISE_GELU_TANH, 0.0, 0.0),
}

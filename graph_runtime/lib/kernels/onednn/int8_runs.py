"""The three ways an int8 oneDNN kernel (int8_conv.Int8Conv, int8_matmul.Int8Matmul) is run:
requantized (QLinearConv/QLinearMatMul and the fused QDQ forms), integer (ConvInteger/
MatMulInteger) and scaled to float32 (quantize_dynamic's form). Each binds its run-time
operands to the primitive's memories, then the kernel executes."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from ..threads import parallel_images
from ..derived import DerivesFromInputs
from . import abi
from . import binding as dn


class Int8Runs(DerivesFromInputs):
    """Binds the operands of each run form; subclasses own the memories and _execute."""

    scale_mem: Any
    bias_mem: Any
    src_scale_mem: Any
    zero_arrays: dict[int, Any]
    zero_mems: dict[int, Any]
    requantize: bool
    to_float: bool
    relu: bool
    weight: Any
    openmp: int
    workers: int
    items: list[Any]  # (primitive, ...) per work item

    @abstractmethod
    def _execute(self, x: Any, w: Any, out: Any) -> None:
        """Run the primitive(s) on x and w into out (the weight repacked if it changed)."""

    def _quant_attr(self, weight_scale_mask: int) -> tuple[Any, Any]:
        """The primitive attr (and its post-ops, for dn.free_attr): relu, the weight scales
        (per output channel: weight_scale_mask) where there is a bias or a scale, the source
        scale when scaled to float32, and a zero point per argument that has one."""
        relu = self.relu

        def post_ops(lib: dn.Dnnl, ops: Any) -> None:
            if relu:
                lib.call("dnnl_post_ops_append_eltwise", ops, abi.ELTWISE_RELU, 0.0, 0.0)

        attr, ops = dn.post_ops_attr(post_ops)
        try:
            lib = dn.library()
            if self.requantize or self.to_float:
                lib.call("dnnl_primitive_attr_set_scales_mask", attr, abi.ARG_WEIGHTS,
                         weight_scale_mask)
            if self.to_float:
                lib.call("dnnl_primitive_attr_set_scales_mask", attr, abi.ARG_SRC, 0)
            for arg in self.zero_arrays:
                lib.call("dnnl_primitive_attr_set_zero_points_mask", attr, arg, 0)
        except BaseException:
            dn.free_attr(attr, ops)
            raise
        return attr, ops

    def _item_args(self, src: Any, dst: Any) -> list[tuple[int, Any]]:
        """A work item's execute arguments: its memories, the weight, and the bias, scales
        and zero points the attr asks for."""
        args = [(abi.ARG_SRC, src), (abi.ARG_WEIGHTS, self.weight.memory), (abi.ARG_DST, dst)]
        if self.requantize or self.to_float:
            args += [(abi.ARG_BIAS, self.bias_mem),
                     (abi.ARG_ATTR_SCALES | abi.ARG_WEIGHTS, self.scale_mem)]
        if self.to_float:
            args.append((abi.ARG_ATTR_SCALES | abi.ARG_SRC, self.src_scale_mem))
        for arg, mem in self.zero_mems.items():
            args.append((abi.ARG_ATTR_ZERO_POINTS | arg, mem))
        return args

    def _fresh_weight(self, w: Any) -> None:
        """This thread's OpenMP count, and the packed weight bound to w or repacked from it
        when it changed."""
        dn.use_threads(self.openmp)
        if self.weight.direct:
            self.weight.memory.bind(w)
        elif self._stale():
            self.weight.refresh(np.ascontiguousarray(w))

    def _run_items(self) -> None:
        items = self.items
        if len(items) == 1:
            items[0][0].run()
        else:
            parallel_images(len(items), self.workers,
                            lambda worker, i: dn.run_on_worker(items[i][0]))

    def uses_workers(self) -> bool:
        return True

    def __call__(self, x: Any, w: Any, m: Any, b: Any, out: Any) -> None:
        """Requantized: out = saturate(round(acc * m + b)), m and b float32 per channel."""
        self.scale_mem.bind(m)
        self.bias_mem.bind(b)
        self._execute(x, w, out)

    def integer(self, x: Any, x_zero: Any, w: Any, out: Any) -> None:
        """ConvInteger's / MatMulInteger's run: out (int32) = the product of (x - x_zero) and
        w, x_zero a one-element array."""
        self.zero_arrays[abi.ARG_SRC][0] = x_zero.reshape(-1)[0]
        self._execute(x, w, out)

    def scaled(self, x: Any, x_zero: Any, w: Any, x_scale: Any, w_scale: Any, bias: Any,
               out: Any) -> None:
        """out (float32) = the product of (x - x_zero) and w, * x_scale * w_scale + bias per
        channel; x_zero and x_scale one-element arrays (DynamicQuantizeLinear's)."""
        self.zero_arrays[abi.ARG_SRC][0] = x_zero.reshape(-1)[0]
        self.src_scale_mem.bind(x_scale)
        self.scale_mem.bind(w_scale)
        self.bias_mem.bind(bias)
        self._execute(x, w, out)

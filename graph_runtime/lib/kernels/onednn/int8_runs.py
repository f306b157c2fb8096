"""The three ways an int8 oneDNN kernel (int8_conv.Int8Conv, int8_matmul.Int8Matmul) is run:
requantized (QLinearConv/QLinearMatMul and the fused QDQ forms), integer (ConvInteger/
MatMulInteger) and scaled to float32 (quantize_dynamic's form). Each binds its run-time
operands to the primitive's memories, then the kernel executes."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any

from ..derived import DerivesFromInputs
from . import abi


class Int8Runs(DerivesFromInputs):
    """Binds the operands of each run form; subclasses own the memories and _execute."""

    scale_mem: Any
    bias_mem: Any
    src_scale_mem: Any
    zero_arrays: dict[int, Any]

    @abstractmethod
    def _execute(self, x: Any, w: Any, out: Any) -> None:
        """Run the primitive(s) on x and w into out (the weight repacked if it changed)."""

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

"""Convolution shape rules: window attributes (pooling shares them), ConvParams, output sizes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .attrs import attr_error, check_out_dtype, int_attr, int_tuple, op_error, str_attr
from .library import TensorSpec
from .shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, check_rank, check_same_dtype

CONV_ATTRS = ("strides", "padding", "dilation", "groups", "channels", "kernel_size",
              "data_layout", "kernel_layout", "out_layout", "out_dtype")


def padding_attr(op: str, attrs: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Relay's padding: 1 value (all sides), 2 (top/bottom, left/right) or 4 (t, l, b, r)."""
    pad = int_tuple(op, attrs, "padding", None, (0, 0))
    if len(pad) == 1:
        pad = pad * 4
    elif len(pad) == 2:
        pad = (pad[0], pad[1], pad[0], pad[1])
    if len(pad) != 4 or min(pad) < 0:
        raise attr_error(op, "padding", list(pad), "1, 2 or 4 non-negative integers "
                                                   "(top, left, bottom, right)")
    return (pad[0], pad[1], pad[2], pad[3])


def positive_pair(op: str, attrs: Mapping[str, Any], name: str,
                  default: tuple[int, int]) -> tuple[int, int]:
    value = int_tuple(op, attrs, name, 2, default)
    if min(value) < 1:
        raise attr_error(op, name, list(value), "2 positive integers")
    return (value[0], value[1])


def check_layout(op: str, attrs: Mapping[str, Any], name: str, supported: str) -> None:
    """Only one layout per argument is implemented; say which."""
    value = str_attr(op, attrs, name, supported)
    if value not in (supported, ""):
        raise attr_error(op, name, value, f"{supported!r} (the only {name} supported)")


@dataclass(frozen=True)
class ConvParams:
    """Every size of one NCHW convolution (for transpose: data is the small side)."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    groups: int
    oh: int
    ow: int
    strides: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]
    dtype: str

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    def key(self) -> str:
        """Every size on one readable line (a tuning key): data, weight, then the attributes
        (one number where all sides agree)."""
        def sides(values: tuple[int, ...]) -> str:
            return str(values[0]) if len(set(values)) == 1 else ",".join(map(str, values))
        return (f"{self.dtype} data {self.n}x{self.c}x{self.h}x{self.w} weight "
                f"{self.o}x{self.cg}x{self.kh}x{self.kw} strides {sides(self.strides)} pad "
                f"{sides(self.pad)} dilation {sides(self.dilation)} groups {self.groups}")


def _common_checks(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                   kernel_layout: str) -> tuple[str, int, tuple, tuple, tuple]:
    check_num_inputs(op, inputs, 2)
    dtype = check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    check_rank(op, inputs[0], (4,), "data")
    check_rank(op, inputs[1], (4,), "weight")
    check_layout(op, attrs, "data_layout", "NCHW")
    check_layout(op, attrs, "kernel_layout", kernel_layout)
    check_layout(op, attrs, "out_layout", "NCHW")
    check_out_dtype(op, attrs, dtype)
    groups = int_attr(op, attrs, "groups", 1)
    if groups < 1:
        raise attr_error(op, "groups", groups, "a positive integer")
    return (dtype, groups, positive_pair(op, attrs, "strides", (1, 1)), padding_attr(op, attrs),
            positive_pair(op, attrs, "dilation", (1, 1)))


def _check_optional(op: str, attrs: Mapping[str, Any], channels: int, kernel: tuple) -> None:
    want = int_attr(op, attrs, "channels", None)
    if want is not None and want != channels:
        raise attr_error(op, "channels", want, f"{channels} (the weight's output channels)")
    size = int_tuple(op, attrs, "kernel_size", 2, None)
    if size is not None and tuple(size) != tuple(kernel):
        raise attr_error(op, "kernel_size", list(size), f"{list(kernel)} (the weight's HW)")


def out_size(op: str, what: str, size: int, pad: int, k: int, stride: int, dilation: int,
             ceil: bool = False) -> int:
    """Sliding-window output length; LibraryError when the window does not fit."""
    span = dilation * (k - 1) + 1
    # NOTE: a size that is not an int is the importer's symbolic dim: whether the window fits
    # is checked when the module is specialised for its value (this rule runs again then).
    if isinstance(size, (int, np.integer)) and size + pad < span:
        raise op_error(op, f"the {what} window ({k} taps, dilation {dilation}) spans {span} but "
                           f"the padded input has only {size + pad}")
    extra = stride - 1 if ceil else 0
    return (size + pad - span + extra) // stride + 1


def conv2d_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ConvParams:
    op = "conv2d"
    dtype, groups, strides, pad, dilation = _common_checks(op, inputs, attrs, "OIHW")
    n, c, h, w = inputs[0].shape
    o, cg, kh, kw = inputs[1].shape
    if c % groups:
        raise op_error(op, f"data has {c} channels, not divisible by groups {groups}")
    if cg != c // groups:
        raise op_error(op, f"weight has {cg} input channels per group but data has {c} "
                           f"channels / groups {groups} = {c // groups}")
    if o % groups:
        raise op_error(op, f"weight has {o} output channels, not divisible by groups {groups}")
    _check_optional(op, attrs, o, (kh, kw))
    oh = out_size(op, "height", h, pad[0] + pad[2], kh, strides[0], dilation[0])
    ow = out_size(op, "width", w, pad[1] + pad[3], kw, strides[1], dilation[1])
    return ConvParams(n, c, h, w, o, kh, kw, groups, oh, ow, strides, pad, dilation, dtype)


def conv2d_transpose_params(inputs: Sequence[TensorSpec],
                            attrs: Mapping[str, Any]) -> ConvParams:
    """Sizes with oh/ow the (large) output; weight is IOHW = (C, O / groups, KH, KW)."""
    op = "conv2d_transpose"
    dtype, groups, strides, pad, dilation = _common_checks(op, inputs, attrs, "IOHW")
    n, c, h, w = inputs[0].shape
    ci, og, kh, kw = inputs[1].shape
    if ci != c:
        raise op_error(op, f"weight (IOHW) has {ci} input channels but data has {c}")
    if c % groups:
        raise op_error(op, f"data has {c} channels, not divisible by groups {groups}")
    outpad = int_tuple(op, attrs, "output_padding", 2, (0, 0))
    for i, what in enumerate(("height", "width")):
        if not 0 <= outpad[i] < max(strides[i], dilation[i]):
            raise attr_error(op, "output_padding", list(outpad),
                             f"values in [0, max(stride, dilation)) = [0, "
                             f"{max(strides[i], dilation[i])}) for the {what}")
    _check_optional(op, attrs, og * groups, (kh, kw))
    size = []
    for i, (what, k, extent) in enumerate((("height", kh, h), ("width", kw, w))):
        length = ((extent - 1) * strides[i] - pad[i] - pad[i + 2] + dilation[i] * (k - 1) + 1
                  + outpad[i])
        if extent < 1 or length < 1:
            raise op_error(op, f"output {what} would be {length} (data {what} {extent}, "
                               f"stride {strides[i]}, padding {pad[i]}+{pad[i + 2]}, kernel {k}, "
                               f"dilation {dilation[i]}, output_padding {outpad[i]})")
        size.append(length)
    return ConvParams(n, c, h, w, og * groups, kh, kw, groups, size[0], size[1], strides, pad,
                      dilation, dtype)

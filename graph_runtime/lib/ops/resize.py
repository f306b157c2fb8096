"""The resize standard op (ONNX Resize: nearest, linear, cubic over any axes) on every backend.

Resizing is separable: each resized axis is one pass out[.., j, ..] = sum_k c[j, k] *
in[.., idx[j, k], ..] whose (idx, c) table is computed once on the host in float64 with ONNX's
coordinate rules (the onnx.reference facts: output_width = scale * input_width as a float in the
align_corners and pytorch_half_pixel rules, ties taking the lower neighbour, edge clamping;
antialias widens a downscaling filter by 1 / scale). Axes whose size and scale do not change
are copied.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, bool_attr, float_attr, int_tuple, op_error, parse_value, str_attr
from ..kernels.gpu_common import compute_type, copy_type, device_array
from ..kernels.cpu.resize_jit import resize_jit
from ..kernels.host import host_factory, wide_dtype
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

OP = "resize"
MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
NEAREST_DTYPES = FLOAT_DTYPES + ("int8", "uint8", "int32", "int64")
RESIZE_ATTRS = ("size", "scales", "mode", "coordinate_transformation_mode", "nearest_mode",
                "cubic_coeff_a", "exclude_outside", "antialias", "roi")
MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class AxisPass:
    """One resized axis: the input index and weight of each of the `taps` per output index."""

    axis: int
    out_len: int
    index: np.ndarray  # (out_len, taps) int64, clamped into the input
    weight: np.ndarray | None  # (out_len, taps) float64; None for nearest (taps == 1)

    @property
    def taps(self) -> int:
        return int(self.index.shape[1])


@dataclass(frozen=True)
class ResizeParams:
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    passes: tuple[AxisPass, ...]


def _scales_attr(shape: Sequence[int], out: Sequence[int],
                 attrs: Mapping[str, Any]) -> tuple[float, ...]:
    """Per-axis scales: the attr (what ONNX computes coordinates from) or out / in."""
    raw = parse_value(attrs.get("scales"))
    if raw is None:
        return tuple(o / i if i else 1.0 for i, o in zip(shape, out))
    if (not isinstance(raw, (list, tuple)) or len(raw) != len(shape)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)):
        raise attr_error(OP, "scales", raw, f"{len(shape)} numbers (one per axis)")
    if not all(math.isfinite(v) and v > 0 for v in raw):
        raise attr_error(OP, "scales", raw, "positive finite numbers")
    return tuple(float(v) for v in raw)


def source_coords(ctm: str, in_len: int, out_len: int, scale: float,
                  roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """x_original of every output index along one axis (ONNX Resize's coordinate modes)."""
    y = np.arange(out_len, dtype=np.float64)
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if out_len == 1:
            return np.full(out_len, 0.5 * (start + end) * (in_len - 1))
        return start * (in_len - 1) + y * (end - start) * (in_len - 1) / (out_len - 1)
    width = scale * in_len  # a float, as ONNX defines it (not out_len)
    if ctm == "align_corners":
        if width == 1:
            return np.zeros(out_len)
        return y * (in_len - 1) / (width - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "pytorch_half_pixel":
        if width == 1:
            return np.full(out_len, -0.5)
        return (y + 0.5) / scale - 0.5
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5
    # tf_half_pixel_for_nn
    return (y + 0.5) / scale


def _nearest_index(x: np.ndarray, nearest_mode: str) -> np.ndarray:
    low = np.floor(x)
    frac = x - low
    if nearest_mode == "round_prefer_floor":
        return np.where(frac <= 0.5, low, low + 1)
    if nearest_mode == "round_prefer_ceil":
        return np.where(frac < 0.5, low, low + 1)
    if nearest_mode == "floor":
        return low
    return np.ceil(x)


def _keys_cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances t (zero from |t| = 2 on)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _tap_weights(mode: str, r: np.ndarray, a: float, antialias: bool,
                 scale: float) -> tuple[int, np.ndarray]:
    """(first, weight): weight[j, k] belongs to input pixel base[j] + first + k.

    Without antialias: 2 (linear) or 4 (cubic) taps. With it, a downscale stretches the
    filter by 1 / scale (more taps) and the weights are normalized to sum 1, as ONNX does.
    """
    if not antialias:
        if mode == "linear":
            return 0, np.stack([1 - r, r], axis=1)
        return -1, np.stack([_keys_cubic(r + 1, a), _keys_cubic(r, a), _keys_cubic(1 - r, a),
                             _keys_cubic(2 - r, a)], axis=1)
    stretch = min(scale, 1.0)
    support = 1 if mode == "linear" else 2
    first = int(np.floor(-support / stretch)) + 1
    offsets = np.arange(first, 1 - first + 1)
    dist = (offsets[None, :] - r[:, None]) * stretch
    if mode == "linear":
        weight = np.clip(1 - np.abs(dist), 0, 1)
    else:
        weight = _keys_cubic(dist, a)
    return first, weight / weight.sum(axis=1, keepdims=True)


def axis_table(mode: str, ctm: str, nearest_mode: str, a: float, exclude_outside: bool,
               in_len: int, out_len: int, scale: float,
               antialias: bool = False, roi: tuple[float, float] = (0.0, 1.0)
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """(index, weight) of one axis: index (out_len, taps) clamped into [0, in_len).

    tf_crop_and_resize: a position outside [0, in_len - 1] takes the clamped taps here; the
    frontend replaces those outputs with extrapolation_value (outside_mask).
    """
    x = source_coords(ctm, in_len, out_len, scale, roi)
    if mode == "nearest":
        idx = _nearest_index(x, nearest_mode).astype(np.int64)[:, None]
        return np.clip(idx, 0, in_len - 1), None
    # The left neighbour b is the pixel strictly left of x (x itself when x is between
    # pixels), so the fraction r lies in (0, 1]: ONNX's tie rule.
    base = np.ceil(x).astype(np.int64) - 1
    r = x - base
    first, weight = _tap_weights(mode, r, a, antialias, scale)
    idx = base[:, None] + np.arange(first, first + weight.shape[1])[None, :]
    if exclude_outside:
        weight = np.where((idx < 0) | (idx >= in_len), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), weight


def resize_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ResizeParams:
    check_num_inputs(OP, inputs, 1)
    spec = inputs[0]
    shape = tuple(int(d) for d in spec.shape)
    rank = len(shape)
    if rank == 0:
        raise op_error(OP, f"input 0 {spec} is a scalar; there is nothing to resize")
    mode = str_attr(OP, attrs, "mode", "nearest", MODES)
    check_dtype(OP, spec, NEAREST_DTYPES if mode == "nearest" else FLOAT_DTYPES)
    ctm = str_attr(OP, attrs, "coordinate_transformation_mode", "half_pixel")
    if ctm not in COORD_MODES:
        raise attr_error(OP, "coordinate_transformation_mode", ctm,
                         "one of " + ", ".join(COORD_MODES))
    nearest_mode = str_attr(OP, attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    a = float_attr(OP, attrs, "cubic_coeff_a", -0.75)
    exclude = bool_attr(OP, attrs, "exclude_outside", False)
    if exclude and mode == "nearest":
        raise attr_error(OP, "exclude_outside", attrs["exclude_outside"],
                         "0 with mode 'nearest' (it only reweights linear and cubic taps)")
    antialias = bool_attr(OP, attrs, "antialias", False)
    if antialias and mode == "nearest":
        raise attr_error(OP, "antialias", attrs["antialias"], "0 with mode 'nearest' (ONNX "
                                                              "antialiases linear and cubic only)")
    out = int_tuple(OP, attrs, "size", rank)
    if any(not 0 <= d <= MAX_DIM for d in out):
        raise attr_error(OP, "size", list(out), f"{rank} integers in [0, {MAX_DIM}]")
    scales = _scales_attr(shape, out, attrs)
    rois = roi_pairs(attrs, rank)
    passes = []
    for axis, (in_len, out_len, scale) in enumerate(zip(shape, out, scales)):
        if in_len == 0 and out_len > 0:
            raise op_error(OP, f"axis {axis} of input 0 {spec} is empty but attribute 'size' "
                               f"asks for {out_len}")
        if out_len == in_len and math.isclose(scale, 1.0) and (
                ctm != "tf_crop_and_resize" or rois[axis] == (0.0, 1.0)):
            continue
        if out_len == 0 or in_len == 0:
            continue
        idx, weight = axis_table(mode, ctm, nearest_mode, a, exclude, in_len, out_len, scale,
                                 antialias, rois[axis])
        passes.append(AxisPass(axis, out_len, idx, weight))
    return ResizeParams(shape, tuple(out), spec.dtype, tuple(passes))


def roi_pairs(attrs: Mapping[str, Any], rank: int) -> list[tuple[float, float]]:
    """Per axis (start, end) of the region tf_crop_and_resize samples, normalised to [0, 1]."""
    raw = parse_value(attrs.get("roi"))
    if raw is None:
        return [(0.0, 1.0)] * rank
    if (not isinstance(raw, (list, tuple)) or len(raw) != 2 * rank
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)):
        raise attr_error(OP, "roi", raw, f"{2 * rank} numbers (all starts, then all ends)")
    return [(float(raw[i]), float(raw[i + rank])) for i in range(rank)]


def outside_mask(shape: Sequence[int], out: Sequence[int],
                 rois: Sequence[tuple[float, float]]) -> np.ndarray:
    """tf_crop_and_resize: True where an output's source lies outside the input on any axis."""
    mask = np.zeros(tuple(out), bool)
    for axis, (in_len, out_len, roi) in enumerate(zip(shape, out, rois)):
        x = source_coords("tf_crop_and_resize", in_len, out_len, 1.0, roi)
        bad = (x < 0) | (x > in_len - 1)
        view = [1] * len(out)
        view[axis] = out_len
        mask |= bad.reshape(view)
    return mask


def _resize_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = resize_params(inputs, attrs)
    return [TensorSpec(p.out_shape, p.dtype)]


def _pass_shapes(p: ResizeParams) -> list[tuple[int, ...]]:
    """The shape after each pass."""
    shapes = []
    cur = list(p.shape)
    for step in p.passes:
        cur[step.axis] = step.out_len
        shapes.append(tuple(cur))
    return shapes


# -- cpu / cuda ---------------------------------------------------------------------------------

def _host_resize(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = resize_params(inputs, attrs)
    empty = size_of(p.out_shape) == 0
    if xp is np and not empty and (not p.passes or p.dtype in ("float32", "float64")):
        compiled = resize_jit(p.shape, p.out_shape, p.passes)
        if compiled is not None:
            return compiled
    work = p.dtype if not p.passes or p.passes[0].weight is None else wide_dtype(p.dtype)
    staged = xp.empty(p.shape, work) if work != p.dtype else None
    shapes = _pass_shapes(p)
    # Workspace made once: each pass's result (and a tap buffer for weighted passes).
    results = [xp.empty(s, work) for s in shapes]
    taps = [xp.empty(s, work) if step.weight is not None else None
            for s, step in zip(shapes, p.passes)]
    tables = []
    for step in p.passes:
        bshape = [1] * len(p.shape)
        bshape[step.axis] = step.out_len
        cols = [xp.asarray(np.ascontiguousarray(step.index[:, k])) for k in range(step.taps)]
        weights = ([] if step.weight is None else
                   [xp.asarray(step.weight[:, k].reshape(bshape).astype(work))
                    for k in range(step.taps)])
        tables.append((cols, weights))

    # NOTE: the tables are clamped already; NumPy's mode="clip" skips its buffered range
    # check, and CuPy's take has no mode argument.
    clip: dict[str, Any] = {"mode": "clip"} if xp is np else {}

    def run(x: Any, out: Any) -> None:
        if empty:
            return
        if not p.passes:
            xp.copyto(out, x)
            return
        src = x
        if staged is not None:
            xp.copyto(staged, x, casting="unsafe")
            src = staged
        for step, dst, tap, (cols, weights) in zip(p.passes, results, taps, tables):
            if not weights:
                xp.take(src, cols[0], axis=step.axis, out=dst, **clip)
            else:
                for k, (col, w) in enumerate(zip(cols, weights)):
                    target = dst if k == 0 else tap
                    xp.take(src, col, axis=step.axis, out=target, **clip)
                    xp.multiply(target, w, out=target)
                    if k:
                        xp.add(dst, tap, out=dst)
            src = dst
        xp.copyto(out, src, casting="unsafe")
    return run


# -- opencl -------------------------------------------------------------------------------------

def _cl_pass_source(src: str, dst: str, weighted: bool) -> str:
    """One pass from a src array to a dst array (numpy counterpart: the take/multiply/add loop)."""
    entry = f"gr_resize_{src}_{dst}"
    head = f"""__kernel void {entry}({cl_param("dst", dst if weighted else copy_type(dst),
                                               const=False)},
        {cl_param("src", src if weighted else copy_type(src))}, {cl_param("idx", "int64")}"""
    if not weighted:
        return head + f""", long in_len, long out_len, long inner, long total) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("dst", copy_type(dst), const=False)}
    {cl_pointer("src", copy_type(src))}
    {cl_pointer("idx", "int64")}
    long r = i % inner;
    long t = i / inner;
    long j = t % out_len;
    dst[i] = src[((t / out_len) * in_len + idx[j]) * inner + r];
}}
"""
    acc = compute_type(dst, "opencl")
    coef = "float64" if acc == "double" else "float32"
    return head + f""", {cl_param("coef", coef)}, long in_len, long out_len, long inner,
        long total, int taps) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("dst", dst, const=False)}
    {cl_pointer("src", src)}
    {cl_pointer("idx", "int64")}
    {cl_pointer("coef", coef)}
    long r = i % inner;
    long t = i / inner;
    long j = t % out_len;
    long row = (t / out_len) * in_len;
    {acc} s = 0;
    for (int k = 0; k < taps; ++k) {{
        long at = j * taps + k;
        s += coef[at] * {cl_load("src", src, "(row + idx[at]) * inner + r")};
    }}
    {cl_store("dst", dst, "i", "s")}
}}
"""


def _cl_resize(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = resize_params(inputs, attrs)
    check_cl_dtypes(OP, backend, device_id, [p.dtype])
    if not p.passes or size_of(p.out_shape) == 0:
        empty = size_of(p.out_shape) == 0
        return lambda x, out: None if empty else backend.copy(x, out)
    weighted = p.passes[0].weight is not None
    work = wide_dtype(p.dtype) if weighted else p.dtype
    coef = "float64" if p.dtype == "float64" else "float32"
    shapes = _pass_shapes(p)
    last = len(p.passes) - 1
    # (src dtype, dst dtype) of each pass: the ends in the data's dtype, the middle in work.
    pairs = [(p.dtype if i == 0 else work, p.dtype if i == last else work)
             for i in range(len(p.passes))]
    source = cl_header([p.dtype]) + "".join(
        _cl_pass_source(s, d, weighted) for s, d in dict.fromkeys(pairs))
    steps = []
    prev = p.shape
    for i, (step, shape, (src, dst)) in enumerate(zip(p.passes, shapes, pairs)):
        knl = ClKernel(backend, device_id, source, f"gr_resize_{src}_{dst}", OP)
        buf = None if i == last else backend.empty(device_id, shape, np.dtype(work))
        idx = device_array(backend, device_id, step.index.astype(np.int64))
        sizes: list[Any] = [prev[step.axis], step.out_len, size_of(shape[step.axis + 1:]),
                            size_of(shape)]
        extra: list[Any] = [idx]
        if weighted:
            assert step.weight is not None
            extra.append(device_array(backend, device_id, step.weight.astype(coef)))
            sizes.append(np.int32(step.taps))
        steps.append((knl, buf, extra, sizes, size_of(shape)))
        prev = shape

    def run(x: Any, out: Any) -> None:
        src = x
        for knl, buf, extra, sizes, total in steps:
            dst = out if buf is None else buf
            knl.launch(total, None, dst, src, *extra, *sizes)
            src = dst
    return run


define_op(OP, _resize_infer, 1, RESIZE_ATTRS)
kernel(OP, "cpu")(host_factory(_host_resize))
kernel(OP, "cuda")(host_factory(_host_resize))
kernel(OP, "opencl")(_cl_resize)

__all__ = ["AxisPass", "ResizeParams", "axis_table", "outside_mask", "resize_params", "roi_pairs",
           "source_coords"]

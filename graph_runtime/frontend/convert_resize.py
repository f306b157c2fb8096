"""Converters for Resize and Upsample onto the op library's resize op (output size as attr)."""
from __future__ import annotations

import math

import numpy as np

from .convert import Context, add_facts, const_input, converts, ints_of, norm_axis
from .fold_size import resize_tables, size_resize
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode


def _floats(array: np.ndarray | None) -> list[float] | None:
    if array is None or np.asarray(array).size == 0:
        return None
    values = [float(v) for v in np.asarray(array).reshape(-1)]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise Unsupported(f"scales {values[:8]}; expected finite numbers > 0")
    return values


def _counted(values: list, axes: list[int], what: str) -> list:
    if len(values) != len(axes):
        raise Unsupported(f"{len(values)} {what} for {len(axes)} axes {axes}; expected "
                          f"{len(axes)}")
    return values


def _check_tables(x: Value, out: list[int], mode: str, antialias: bool) -> None:
    """Refuse an output size whose per-axis index and weight tables (built at import: the
    resize op's infer) pass the import's budget: (out, taps) int64 and float64 arrays, and
    their temporaries, for each resized axis."""
    taps = 1 if mode == "nearest" else 2 if mode in ("linear", "bilinear") else 4
    for axis, (d_in, d_out) in enumerate(zip(x.shape, out)):
        if d_out == d_in or d_in == 0:
            continue
        widen = -(-d_in // d_out) if antialias and 0 < d_out < d_in else 1
        check_const_bytes((d_out, taps * widen, 4), "float64",
                          f"the interpolation tables of axis {axis} (size {d_in} -> {d_out})")


@converts("Resize", "Upsample")
def resize(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    rank = x.rank
    if node.op_type == "Upsample" or node.opset < 11:
        # Upsample and Resize-10: scales only, coordinates x_out / scale, nearest rounds down.
        given = node.attr("scales") if node.opset < 9 else _floats(
            const_input(node, args, 1, "scales"))
        if not given:
            raise Unsupported("no scales given")
        mode = node.attr("mode", "nearest")
        if mode not in ("nearest", "linear", "bilinear"):
            raise Unsupported(f"mode {mode!r}")
        scales = _counted(_floats(np.asarray(given, dtype=np.float64)) or [],
                          list(range(rank)), "scales")
        sizes = [math.floor(d * s) for d, s in zip(x.shape, scales)]
        _check_tables(x, sizes, mode, False)
        return [ctx.b.op("resize", x, size=sizes, scales=scales,
                         mode="nearest" if mode == "nearest" else "linear",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    axes = node.opt_ints("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank, node, "axes") for a in axes]
    scales_in = _floats(const_input(node, args, 2, "scales"))
    sizes_in = ints_of(const_input(node, args, 3, "sizes")) if len(args) > 3 else None
    full_scales: list[float] | None = None
    if sizes_in:
        _counted(sizes_in, axes, "sizes")
        if any(v < 0 for v in sizes_in):
            raise Unsupported(f"sizes {sizes_in[:8]}; expected sizes >= 0")
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            out = list(x.shape)
            for a, s in zip(axes, sizes_in):
                out[a] = s
        elif policy in ("not_larger", "not_smaller"):
            if any(x.shape[a] == 0 for a in axes):
                raise Unsupported(f"policy {policy!r} for an input of shape {list(x.shape)}")
            ratios = [s / x.shape[a] for a, s in zip(axes, sizes_in)]
            scale: float = min(ratios) if policy == "not_larger" else max(ratios)
            out = list(x.shape)
            full_scales = [1.0] * rank
            for a in axes:
                out[a] = math.floor(x.shape[a] * scale + 0.5)
                full_scales[a] = scale
        else:
            raise Unsupported(f"keep_aspect_ratio_policy {policy!r}")
    elif scales_in:
        full_scales = [1.0] * rank
        for a, factor in zip(axes, _counted(scales_in, axes, "scales")):
            full_scales[a] = factor
        out = [math.floor(d * f) for d, f in zip(x.shape, full_scales)]
    else:
        raise Unsupported("neither scales nor sizes is given")
    attrs: dict[str, object] = {
        "size": out, "mode": mode, "coordinate_transformation_mode": ctm,
        "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
        "cubic_coeff_a": float(node.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": bool(int(node.attr("exclude_outside", 0))),
        "antialias": bool(int(node.attr("antialias", 0)))}
    if full_scales is not None:
        attrs["scales"] = full_scales
    _check_tables(x, out, mode, bool(attrs["antialias"]))
    if ctm == "tf_crop_and_resize":
        return [_crop_and_resize(ctx, node, args, x, axes, attrs)]
    return [ctx.b.op("resize", x, **attrs)]


add_facts("Resize", shape_inputs=(1, 2, 3), predict=size_resize, workspace=resize_tables)
add_facts("Upsample", shape_inputs=(1,), predict=size_resize, workspace=resize_tables)


def _crop_and_resize(ctx: Context, node: OnnxNode, args: list, x: Value, axes: list[int],
                     attrs: dict[str, object]) -> Value:
    """tf_crop_and_resize: resize over the roi, extrapolation_value where it leaves the input."""
    from ..lib.ops.resize import outside_mask, roi_pairs
    given = const_input(node, args, 1, "roi")
    if given is None or np.asarray(given).size != 2 * len(axes):
        raise Unsupported(f"roi {None if given is None else np.asarray(given).shape}: expected "
                          f"{2 * len(axes)} values (starts, then ends, for axes {axes})")
    values = [float(v) for v in np.asarray(given, np.float64).reshape(-1)]
    roi = [0.0] * x.rank + [1.0] * x.rank
    for i, a in enumerate(axes):
        roi[a], roi[a + x.rank] = values[i], values[i + len(axes)]
    if not all(math.isfinite(v) for v in roi):
        raise Unsupported(f"roi {values}: expected finite numbers")
    attrs["roi"] = roi
    resized = ctx.b.op("resize", x, **attrs)
    check_const_bytes(resized.shape, bool, "the mask of outputs outside the roi")
    mask = outside_mask(x.shape, resized.shape, roi_pairs({"roi": roi}, x.rank))
    if not mask.any():
        return resized
    fill = ctx.b.scalar(float(node.attr("extrapolation_value", 0.0)), x)
    return ctx.b.op("where", ctx.b.const(mask, "crop_outside"), fill, resized)

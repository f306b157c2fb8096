"""Converters for Resize and Upsample onto the op library's resize op (output size as attr)."""
from __future__ import annotations

import math

import numpy as np

from .convert import Context, const_input, converts, ints_of, norm_axis
from .ir import Unsupported, Value
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
        return [ctx.b.op("resize", x, size=sizes, scales=scales,
                         mode="nearest" if mode == "nearest" else "linear",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_crop_and_resize":
        raise Unsupported("coordinate_transformation_mode 'tf_crop_and_resize'")
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
    return [ctx.b.op("resize", x, **attrs)]

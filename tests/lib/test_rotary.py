"""The rotary op's kernels (CPU, OpenCL, and the NumPy-API one CUDA runs through CuPy) against
LLaMA's rotate_half written in NumPy: odd sizes, column offsets, broadcast cos/sin, partial
rotary; bit for bit against the exporters' own float32 ops on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op

# (batch, tokens, heads, head_dim, rotary_dim, offset, extra columns, cos/sin batch, tokens)
CASES = [
    (2, 7, 3, 8, 8, 0, 0, 1, 7),
    (1, 1, 4, 16, 16, 5, 3, 1, 1),
    (3, 5, 2, 6, 6, 2, 6, 3, 5),
    (2, 9, 5, 12, 4, 0, 12, 2, 9),   # partial rotary: the last 8 of each head pass through
    (1, 13, 1, 2, 2, 1, 0, 1, 13),
]


def _case(batch: int, tokens: int, heads: int, dim: int, rot: int, offset: int, extra: int,
          cb: int, ct: int, dtype: str) -> tuple[list[np.ndarray], dict, np.ndarray]:
    rng = np.random.default_rng(batch * 7 + tokens)
    x = rng.standard_normal((batch, tokens, offset + heads * dim + extra)).astype(dtype)
    angles = rng.uniform(0, 6, (cb, ct, rot // 2))
    cos = np.cos(np.concatenate([angles, angles], -1)).astype(dtype)
    sin = np.sin(np.concatenate([angles, angles], -1)).astype(dtype)
    # as LLaMA's code: heads in (batch, heads, tokens, dim), rotate_half by slices and concat
    xh = x[:, :, offset:offset + heads * dim].reshape(batch, tokens, heads, dim)
    xh = xh.transpose(0, 2, 1, 3)
    xr, xp = xh[..., :rot], xh[..., rot:]
    rotated = np.concatenate([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
    c, s = cos[:, None], sin[:, None]
    want = np.concatenate([xr * c + rotated * s, xp], -1)
    want = want.transpose(0, 2, 1, 3).reshape(batch, tokens, heads * dim)
    attrs = {"num_heads": heads, "head_dim": dim, "rotary_dim": rot, "offset": offset}
    return [x, cos, sin], attrs, want


def _run(kernel_of: str, arrays: list[np.ndarray], attrs: dict, want: np.ndarray) -> np.ndarray:
    backend = get_backend(kernel_of)
    dtype = arrays[0].dtype
    specs = [TensorSpec(a.shape, dtype.name) for a in arrays]
    op = get_op("rotary")
    assert op.infer(specs, attrs) == [TensorSpec(want.shape, dtype.name)]
    run = op.kernels[kernel_of](backend, 0, specs, [TensorSpec(want.shape, dtype.name)], attrs)
    args = []
    for a in arrays:
        arr = backend.empty(0, a.shape, dtype)
        backend.from_host(np.ascontiguousarray(a), arr)
        args.append(arr)
    out = backend.empty(0, want.shape, dtype)
    run(*args, out)
    backend.sync(0)
    return backend.to_host(out)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_rotate_half(case: tuple, dtype: str, backend_name: str) -> None:
    arrays, attrs, want = _case(*case, dtype=dtype)
    got = _run(backend_name, arrays, attrs, want)
    # the same roundings as the exporters' Mul, Neg and Add (no fused multiply-add)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES)
def test_calls_on_the_same_arrays_read_their_values_now(case: tuple) -> None:
    """Called again on the same arrays (as a module calls it every run), the CPU kernel
    rotates their new values, and then new arrays."""
    backend = get_backend("cpu")
    arrays, attrs, want = _case(*case, dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    out_spec = [TensorSpec(want.shape, "float32")]
    run = get_op("rotary").kernels["cpu"](backend, 0, specs, out_spec, attrs)
    x, cos, sin = (np.ascontiguousarray(a) for a in arrays)
    out = np.empty(want.shape, np.float32)
    run(x, cos, sin, out)
    np.testing.assert_array_equal(out, want)
    x *= 2.0  # exact in float32: each product and sum doubles
    run(x, cos, sin, out)
    np.testing.assert_array_equal(out, 2.0 * want)
    fresh = np.empty(want.shape, np.float32)
    run(x / 2.0, cos, sin, fresh)
    np.testing.assert_array_equal(fresh, want)


@pytest.mark.parametrize("case", CASES)
def test_numpy_api_kernel_matches_rotate_half(case: tuple) -> None:
    """What CUDA runs through CuPy, run here with NumPy."""
    from graph_runtime.lib.ops.rotary import _host
    arrays, attrs, want = _case(*case, dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    out = np.empty(want.shape, np.float32)
    _host(get_backend("cpu"), 0, specs, [TensorSpec(want.shape, "float32")], attrs)(*arrays, out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("attrs,shapes,message", [
    ({"num_heads": 2, "head_dim": 8, "rotary_dim": 5}, [(1, 3, 16), (1, 3, 5), (1, 3, 5)],
     "rotary_dim 5 must be even, from 2 to head_dim 8"),
    ({"num_heads": 2, "head_dim": 8, "rotary_dim": 10}, [(1, 3, 16), (1, 3, 10), (1, 3, 10)],
     "rotary_dim 10 must be even, from 2 to head_dim 8"),
    ({"num_heads": 2, "head_dim": 8, "offset": 4}, [(1, 3, 16), (1, 3, 8), (1, 3, 8)],
     r"x \(1, 3, 16\) float32 has no columns \[4, 20\)"),
    ({"num_heads": 2, "head_dim": 8}, [(1, 3, 16), (2, 3, 8), (1, 3, 8)],
     r"cos .* does not broadcast to \(1, 3, 8\)"),
    ({"num_heads": 2, "head_dim": 8}, [(1, 3, 16), (1, 3, 8), (3, 8)],
     r"sin .* does not broadcast to \(1, 3, 8\)"),
])
def test_refusals_name_the_attr_or_input(attrs: dict, shapes: list, message: str) -> None:
    specs = [TensorSpec(s, "float32") for s in shapes]
    with pytest.raises(LibraryError, match=f"^rotary: {message}"):
        get_op("rotary").infer(specs, attrs)

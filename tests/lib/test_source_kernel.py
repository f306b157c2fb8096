"""Raw-kernel lib functions: size expressions, OpenCL launches (also on views), argument errors."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.backends import get_backend
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import Module, TensorSpec
from graph_runtime.lib.loader import module_from_json
from graph_runtime.lib.source_kernel import size_expression

TWICE_CL = """
__kernel void twice(__global const float* x, __global float* y, int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""
TWICE_CUDA = """
extern "C" __global__ void twice(const float* x, float* y, long long n) {
    long long i = blockDim.x * (long long)blockIdx.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def _lib(functions: dict[str, Any]) -> Module:
    return module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": functions})


def test_size_expression() -> None:
    assert size_expression(64, "here")(1000) == 64
    assert size_expression("(n + 255) / 256 * 256", "here")(1000) == 1024
    assert size_expression("n % 7 - 1", "here")(10) == 2
    with pytest.raises(LibraryError, match=r"here: size expression 'n \*\* 2' may use only"):
        size_expression("n ** 2", "here")
    with pytest.raises(LibraryError, match=r"here: cannot parse size expression 'n \+'"):
        size_expression("n +", "here")


def test_kernel_source_runs_on_opencl(opencl_available: None) -> None:
    lib = _lib({"twice": {"kernel": {
        "opencl": {"source": TWICE_CL, "entry": "twice", "global_size": "(n + 63) / 64 * 64",
                   "local_size": 64, "count": "int32"},
        "cuda": {"source": TWICE_CUDA, "entry": "twice", "count": "int64"}}}})
    assert lib.devices_for("twice") == ["cuda", "opencl"]
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    backend = get_backend("opencl")
    spec = [TensorSpec((100,), "float32")]
    x_dev = backend.empty(0, (100,), np.float32)
    backend.from_host(x, x_dev)
    y_dev = backend.empty(0, (100,), np.float32)
    lib.prepare("twice", gr.opencl(), spec, spec)(x_dev, y_dev)
    np.testing.assert_array_equal(backend.to_host(y_dev), 2 * x)


def test_kernel_source_runs_on_an_offset_view(opencl_available: None) -> None:
    lib = _lib({"twice": {"kernel": {"opencl": {
        "source": TWICE_CL, "entry": "twice", "count": "int32"}}}})
    backend = get_backend("opencl")
    align = backend.cl_device(0).mem_base_addr_align // 8
    buffer = backend.alloc(0, align + 64)
    x = backend.view(buffer, align, (16,), np.float32)
    backend.from_host(np.arange(16, dtype=np.float32), x)
    y = backend.empty(0, (16,), np.float32)
    spec = [TensorSpec((16,), "float32")]
    lib.prepare("twice", gr.opencl(), spec, spec)(x, y)
    np.testing.assert_array_equal(backend.to_host(y), 2 * np.arange(16, dtype=np.float32))


def test_kernel_source_argument_count_is_checked(opencl_available: None) -> None:
    lib = _lib({"twice": {"kernel": {"opencl": {
        "source": TWICE_CL, "entry": "twice"}}}})
    spec = [TensorSpec((4,), "float32")]
    with pytest.raises(LibraryError, match="kernel 'twice' takes 3 arguments, but the node "
                                           r"passes 2 \(2 arrays\)"):
        lib.prepare("twice", gr.opencl(), spec, spec)


def test_kernel_source_build_error_is_a_library_error(opencl_available: None) -> None:
    lib = _lib({"broken": {"kernel": {"opencl": {
        "source": "__kernel void k(__global float* x) { x[0] = undefined_name; }",
        "entry": "k"}}}})
    spec = [TensorSpec((4,), "float32")]
    with pytest.raises(LibraryError, match="building OpenCL broken failed"):
        lib.prepare("broken", gr.opencl(), spec, spec)


def test_a_long_size_expression_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(LibraryError, match=r"size expression of 6001 characters; at most 200"):
        size_expression("n" + "+1" * 3000, "lib.json at $.functions.f.kernel.opencl.global_size")


@pytest.mark.opencl
def test_a_launch_far_beyond_the_buffers_is_refused(opencl_available: None) -> None:
    lib = _lib({"twice": {"kernel": {
        "opencl": {"source": TWICE_CL, "entry": "twice", "global_size": 2 ** 31,
                   "count": "int32"}}}})
    spec = [TensorSpec((8,), "float32")]
    with pytest.raises(LibraryError, match=r"global 2147483648, local None for n = 8: the global "
                                           r"size may exceed the largest buffer \(8 elements\)"):
        lib.prepare("twice", gr.opencl(), spec, spec)
    # Rounding up to a work-group is fine.
    ok = _lib({"twice": {"kernel": {
        "opencl": {"source": TWICE_CL, "entry": "twice", "global_size": "(n + 63) / 64 * 64",
                   "local_size": 64, "count": "int32"}}}})
    ok.prepare("twice", gr.opencl(), spec, spec)


# ---- issue 30: refusals at load or create, not TypeError / ZeroDivisionError / launch errors ----

def test_a_float_size_is_refused_even_without_the_schema() -> None:
    with pytest.raises(LibraryError, match=r"here: expected an integer such as 64 or an "
                                           r"expression in n .*, got float 64\.0"):
        size_expression(64.0, "here")  # type: ignore[arg-type]
    with pytest.raises(LibraryError, match="got bool True"):
        size_expression(True, "here")


@pytest.mark.parametrize("expression, divisor", [("n % 0", "0"), ("n // 0", "0"),
                                                 ("(n + 3) / (4 - 2 * 2)", "4 - 2 * 2")])
def test_a_constant_zero_divisor_is_refused_at_load(expression: str, divisor: str) -> None:
    with pytest.raises(LibraryError, match=rf"lib.json at \$.functions.k.kernel.opencl."
                                           rf"global_size: size expression '.*' divides by "
                                           rf"'{re.escape(divisor)}', which is always 0"):
        _lib({"k": {"kernel": {"opencl": {"source": TWICE_CL, "entry": "twice",
                                          "global_size": expression}}}})


def test_a_divisor_zero_for_this_n_is_refused_at_create_naming_the_node() -> None:
    lib = _lib({"k": {"kernel": {"opencl": {"source": TWICE_CL, "entry": "twice",
                                            "global_size": "n % (n - 12)", "count": "int32"}}}})
    spec = [TensorSpec((3, 4), "float32")]
    with pytest.raises(LibraryError, match=r"^node 5 'k0': lib.json at \$.functions.k.kernel."
                                           r"opencl.global_size: size expression 'n % \(n - 12\)' "
                                           r"divides by 'n - 12', which is 0 for n = 12$"):
        lib.prepare("k", gr.opencl(), spec, spec, node="node 5 'k0'")


def test_a_count_beyond_int32_is_refused_at_create() -> None:
    lib = _lib({"k": {"kernel": {"opencl": {"source": TWICE_CL, "entry": "twice",
                                            "count": "int32"}}}})
    spec = [TensorSpec((2 ** 31,), "float32")]
    with pytest.raises(LibraryError, match=r"k: the count n = 2147483648 does not fit count "
                                           r"'int32' \(at most 2147483647\); use 'int64'"):
        lib.prepare("k", gr.opencl(), spec, spec, node="node 1 'k0'")


@pytest.mark.opencl
@pytest.mark.parametrize("spec, message", [
    # INVALID_ARG_SIZE at run before: an 8-byte count into an int
    ({"count": "int64"}, r"argument 2 is 'int n', but count 'int64' passes n there \(8 bytes\); "
                         r"declare it long or ulong, or change count"),
    # INVALID_WORK_GROUP_SIZE at run before: OpenCL 1.2 launches whole work-groups
    ({"count": "int32", "local_size": 64},
     r"local_size 64 does not divide the global size 100; .* e\.g\. \"\(n \+ 63\) / 64 \* 64\""),
])
def test_opencl_launch_limits_are_checked_at_create(opencl_available: None, spec: dict[str, Any],
                                                    message: str) -> None:
    lib = _lib({"twice": {"kernel": {"opencl": {"source": TWICE_CL, "entry": "twice", **spec}}}})
    tensor = [TensorSpec((100,), "float32")]
    with pytest.raises(LibraryError, match=r"^node 2 'double': twice: kernel 'twice' on opencl:0 "
                                           rf"\(.+\): {message}"):
        lib.prepare("twice", gr.opencl(), tensor, tensor, node="node 2 'double'")


@pytest.mark.opencl
def test_opencl_declared_arguments_are_checked_at_create(opencl_available: None) -> None:
    required = """__kernel __attribute__((reqd_work_group_size(32, 1, 1)))
    void k(__global const float* x, __global float* y) { y[get_global_id(0)] = x[0]; }"""
    local = "__kernel void k(__global const float* x, __local float* y) { }"
    tensor = [TensorSpec((64,), "float32")]
    for source, size, message in [
            (required, 64, r"the kernel declares reqd_work_group_size\(32, 1, 1\); local_size is 64, "
                           r"expected 32"),
            (required, None, r"local_size is None, expected 32"),
            (local, None, r"argument 1 is 'float\* y', but the node passes array 1 there")]:
        lib = _lib({"f": {"kernel": {"opencl": {"source": source, "entry": "k",
                                                "local_size": size}}}})
        with pytest.raises(LibraryError, match=rf"^node 4 'f0': f: kernel 'k' on opencl:0 .*{message}"):
            lib.prepare("f", gr.opencl(), tensor, tensor, node="node 4 'f0'")
    lib = _lib({"f": {"kernel": {"opencl": {"source": required, "entry": "k",
                                            "local_size": 32}}}})
    lib.prepare("f", gr.opencl(), tensor, tensor)

"""oneDNN 3.2's C ABI as ctypes sees it: enum values, structs and function signatures.

The values were read from oneDNN 3.2's C headers (dnnl_common_types.h, dnnl_types.h, dnnl.h);
binding.py refuses any other version, since 3.x minor releases may renumber enums.
"""
from __future__ import annotations

import ctypes
from typing import Any

# -- oneDNN 3.2 enum values (dnnl_common_types.h, dnnl_types.h) ---------------------------------
STATUS_NAMES = {0: "dnnl_success", 1: "dnnl_out_of_memory", 2: "dnnl_invalid_arguments",
                3: "dnnl_unimplemented", 4: "dnnl_last_impl_reached", 5: "dnnl_runtime_error",
                6: "dnnl_not_required", 7: "dnnl_invalid_graph", 8: "dnnl_invalid_graph_op",
                9: "dnnl_invalid_shape", 10: "dnnl_invalid_data_type"}
# dnnl_cpu_isa_t bits (dnnl_get_effective_cpu_isa): avx2_vnni 0xf and avx512_core_vnni 0x67
# each add one (every later ISA holds one of them); avx2 is 0x7, avx512_core 0x27
ISA_AVX2_VNNI_BIT = 0x8
ISA_AVX512_VNNI_BIT = 0x40
ISA_AVX512_CORE_BIT = 0x20  # dnnl_cpu_isa_avx512_core = 0x27: AVX2's bits and this one
F32 = 3
S32 = 4
S8 = 5
U8 = 6
# NumPy dtype name -> oneDNN data type
DATA_TYPES = {"float32": F32, "int32": S32, "int8": S8, "uint8": U8}
TAG_ANY = 1
TAG_PLAIN = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6}  # ndims -> a, ab, abc, abcd, abcde
TAG_BA = 14
TAG_ACB = 15
TAG_ACDB = 22  # NHWC
ENGINE_CPU = 1
STREAM_DEFAULT = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT = 0x1
DECONVOLUTION_DIRECT = 0xA
ELTWISE_RELU = 0x20
ELTWISE_TANH = 0x21
ELTWISE_LOGISTIC = 0x29
ELTWISE_GELU_TANH = 0x2B
ELTWISE_SWISH = 0x2C
ELTWISE_CLIP = 0x2E
ELTWISE_GELU_ERF = 0x31
ELTWISE_HARDSWISH = 0x34
POOLING_MAX = 0x1FF
POOLING_AVG_INCLUDE_PADDING = 0x2FF
POOLING_AVG_EXCLUDE_PADDING = 0x3FF
BINARY_ADD = 0x1FFF0
BINARY_MUL = 0x1FFF1
SOFTMAX_ACCURATE = 0x30000
QUERY_IMPL_INFO_STR = 8
QUERY_SRC_MD = 129
QUERY_WEIGHTS_MD = 131
QUERY_DST_MD = 133
QUERY_SCRATCHPAD_MD = 136
# dnnl_memory_desc_query's (dnnl_query_t): a descriptor's layout (blocked formats)
QUERY_STRIDES = 14
QUERY_NDIMS = 256
QUERY_PADDED_DIMS = 260
QUERY_FORMAT_KIND = 262
QUERY_INNER_NBLKS = 263
QUERY_INNER_BLKS = 264
QUERY_INNER_IDXS = 265
FORMAT_BLOCKED = 2  # dnnl_blocked (dnnl_format_kind_t)
ARG_SRC = 1
ARG_SRC_1 = 2
ARG_DST = 17
ARG_WEIGHTS = 33
ARG_BIAS = 41
ARG_SCRATCHPAD = 80
SCRATCHPAD_MODE_USER = 1  # dnnl_scratchpad_mode_user
ARG_FROM = 1
ARG_TO = 17
ARG_ATTR_SCALES = 4096  # | the argument scaled (ARG_SRC, ARG_WEIGHTS, ARG_DST)
ARG_ATTR_ZERO_POINTS = 8192
ARG_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) = BASE * (i + 1)

Dims = ctypes.c_int64 * 12  # dnnl_dims_t (DNNL_MAX_NDIMS = 12)


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: one (argument kind, memory) pair of dnnl_primitive_execute."""

    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


_VP = ctypes.c_void_p
_P = ctypes.POINTER
# name -> argument types; every function returns dnnl_status_t unless listed in RESTYPES.
SIGNATURES: dict[str, list[Any]] = {
    "dnnl_version": [],
    "dnnl_get_effective_cpu_isa": [],
    "dnnl_engine_create": [_P(_VP), ctypes.c_int, ctypes.c_size_t],
    "dnnl_stream_create": [_P(_VP), _VP, ctypes.c_uint],
    "dnnl_memory_desc_create_with_tag": [_P(_VP), ctypes.c_int, Dims, ctypes.c_int, ctypes.c_int],
    "dnnl_memory_desc_create_with_strides": [_P(_VP), ctypes.c_int, Dims, ctypes.c_int, Dims],
    "dnnl_memory_desc_destroy": [_VP],
    "dnnl_memory_desc_clone": [_P(_VP), _VP],
    "dnnl_memory_desc_equal": [_VP, _VP],
    "dnnl_memory_desc_get_size": [_VP],
    "dnnl_memory_desc_query": [_VP, ctypes.c_int, _VP],
    "dnnl_memory_create": [_P(_VP), _VP, _VP, _VP],
    "dnnl_memory_set_data_handle": [_VP, _VP],
    "dnnl_memory_destroy": [_VP],
    "dnnl_primitive_attr_create": [_P(_VP)],
    "dnnl_primitive_attr_destroy": [_VP],
    "dnnl_primitive_attr_set_post_ops": [_VP, _VP],
    "dnnl_primitive_attr_set_scratchpad_mode": [_VP, ctypes.c_int],
    "dnnl_primitive_attr_set_scales_mask": [_VP, ctypes.c_int, ctypes.c_int],
    "dnnl_primitive_attr_set_zero_points_mask": [_VP, ctypes.c_int, ctypes.c_int],
    "dnnl_post_ops_create": [_P(_VP)],
    "dnnl_post_ops_destroy": [_VP],
    "dnnl_post_ops_append_eltwise": [_VP, ctypes.c_int, ctypes.c_float, ctypes.c_float],
    "dnnl_post_ops_append_sum": [_VP, ctypes.c_float, ctypes.c_int32, ctypes.c_int],
    "dnnl_post_ops_append_binary": [_VP, ctypes.c_int, _VP],
    "dnnl_convolution_forward_primitive_desc_create": [
        _P(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, _VP, _VP, Dims, Dims, Dims, Dims,
        _VP],
    "dnnl_deconvolution_forward_primitive_desc_create": [
        _P(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, _VP, _VP, Dims, Dims, Dims, Dims,
        _VP],
    "dnnl_pooling_forward_primitive_desc_create": [
        _P(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, Dims, Dims, Dims, Dims, Dims, _VP],
    "dnnl_matmul_primitive_desc_create": [_P(_VP), _VP, _VP, _VP, _VP, _VP, _VP],
    "dnnl_inner_product_forward_primitive_desc_create": [
        _P(_VP), _VP, ctypes.c_int, _VP, _VP, _VP, _VP, _VP],
    "dnnl_softmax_forward_primitive_desc_create": [
        _P(_VP), _VP, ctypes.c_int, ctypes.c_int, _VP, _VP, ctypes.c_int, _VP],
    "dnnl_reorder_primitive_desc_create": [_P(_VP), _VP, _VP, _VP, _VP, _VP],
    "dnnl_primitive_desc_query": [_VP, ctypes.c_int, ctypes.c_int, _VP],
    "dnnl_primitive_desc_query_md": [_VP, ctypes.c_int, ctypes.c_int],
    "dnnl_primitive_desc_destroy": [_VP],
    "dnnl_primitive_create": [_P(_VP), _VP],
    "dnnl_primitive_execute": [_VP, _VP, ctypes.c_int, _VP],
    "dnnl_primitive_destroy": [_VP],
}
RESTYPES: dict[str, Any] = {
    "dnnl_version": _P(Version),
    "dnnl_get_effective_cpu_isa": ctypes.c_int,
    "dnnl_memory_desc_equal": ctypes.c_int,
    "dnnl_memory_desc_get_size": ctypes.c_size_t,
    "dnnl_primitive_desc_query_md": _VP,
}

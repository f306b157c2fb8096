"""Kernels the op families call: OpenCL GEMM/conv sources, GPU helpers, the padded GEMV."""

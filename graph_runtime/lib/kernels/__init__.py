"""Kernel implementations the op families call: OpenCL GEMM/conv sources, GPU helpers, padded GEMV."""

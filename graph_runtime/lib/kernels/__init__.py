"""Kernels the op families call, by backend: cpu/ (NumPy, OpenBLAS and numba), opencl/ (OpenCL C).

Helpers more than one backend uses sit here: derived.py (data derived once from an input),
host.py (kernels written once against NumPy's API for NumPy or CuPy), gpu_common.py (C type
names and device tables for CUDA and OpenCL), gpu_elementwise.py (elementwise kernels generated
for both) and winograd_math.py (the Winograd transforms both conv backends use).

File names say what a module computes; the folder says the backend (cpu/conv.py, opencl/conv.py),
a *_choice module picks among kernels, and a *_jit module holds numba-compiled loops.
"""

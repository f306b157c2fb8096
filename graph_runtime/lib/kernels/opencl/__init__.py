"""OpenCL kernels: C source plumbing, GEMMs per device type, conv methods and their choice, rows."""

"""CPU kernels: conv strategies and their choice, dense variants, numba loops, worker threads."""

"""CPU kernels: conv strategies and their choice, dense variants, numba loops, worker threads."""

# oneDNN's OpenMP team pinned as its binding sizes it (GRAPH_RUNTIME_ONEDNN_PIN)
from . import team_pinning  # noqa: E402,F401

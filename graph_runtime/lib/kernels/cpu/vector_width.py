"""512-bit vectors for the compiled loops whose arithmetic they speed up (softmax, GELU, silu).

LLVM vectorizes for 256-bit registers on Intel's AVX-512 server CPUs: its tuning for Skylake-SP
and Cascade Lake, which lowered their clocks while running 512-bit arithmetic. numba takes that
default for every function, so a softmax pass ran 8 lanes wide where ONNX Runtime's MLAS runs
16: on a 2-vCPU Sapphire Rapids Xeon, 4,096 rows of 256 took 557 us one thread against 445
with 512-bit vectors (MLAS: ~300; docs/measurements.md). wide_vectors(), called in a compiled
function, asks LLVM for 512-bit vectors there (the function's prefer-vector-width attribute)
where wide() holds, and is nothing otherwise; an inlined helper's loops take their caller's, a
called function's its own (each such loop comes in two forms, the wide one for long rows).

GRAPH_RUNTIME_VECTOR_WIDTH: auto (default: 512 on CPUs that keep their clock with 512-bit
arithmetic, i.e. with AVX-512 FP16 (Sapphire Rapids on) or AMD's Zen 4 on; 256 elsewhere),
256, 512. Read once, at the first long row: the compiled code's disk cache is keyed by it
(jit_cache.py).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from llvmlite import binding
from numba import types
from numba.extending import intrinsic

from .... import settings
from ....errors import LibraryError

# LLVM's names of the CPUs whose AVX-512 arithmetic runs without lowering the clock
_STEADY_CPUS = ("znver4", "znver5")
_ATTRIBUTE = '"prefer-vector-width"="512"'


def decide(word: str, features: Mapping[str, bool], cpu_name: str) -> bool:
    """Whether compiled loops marked wide_vectors() take 512-bit vectors: the setting's word,
    then for auto the CPU's features (LLVM's names, as get_host_cpu_features gives them)."""
    if word != "auto":
        return word == "512"
    if not features.get("avx512f", False):
        return False
    return features.get("avx512fp16", False) or cpu_name in _STEADY_CPUS


@functools.cache
def wide() -> bool:
    """Whether this process's wide_vectors() ask for 512-bit vectors (decide on this CPU),
    read once: LibraryError naming the setting where its value is not one it takes."""
    word = settings.word(settings.VECTOR_WIDTH)
    binding.initialize_native_target()
    try:
        features = dict(binding.get_host_cpu_features())
    except RuntimeError:  # llvmlite could not read them: LLVM's default
        return word == "512"
    return decide(word, features, binding.get_host_cpu_name())


def stamp() -> bool | None:
    """wide() for the jit cache's key (jit_cache.py), None where the setting is not valid (the
    kernel that asks wide_rows then names it)."""
    try:
        return wide()
    except LibraryError:
        return None


# A 512-bit loop's main part takes 64 values a turn (16 lanes, four interleaved), the rest
# going one by one: rows of a few dozen, or with a long rest, ran slower than 8 lanes wide. One
# thread, ns a value of the attention's softmax pass, 256-bit / 512-bit: rows of 32 1.06 /
# 1.93, 49 1.14 / 1.57, 100 0.75 / 0.96, 150 0.73 / 0.83; 64 0.77 / 0.67, 128 0.64 / 0.56,
# 197 0.63 / 0.58, 256 0.58 / 0.43, 400 0.54 / 0.45, 577 0.58 / 0.45 (docs/measurements.md).
TURN = 64


def wide_rows(width: int) -> bool:
    """Whether rows of width take a loop's wide_vectors() form: whole turns, the rest at most
    an eighth of the row, where wide() holds."""
    return width >= TURN and width % TURN <= width // 8 and wide()


@intrinsic
def _wide_vectors(typingctx: Any) -> Any:
    """Mark the compiled function calling it for 512-bit vectors (where wide() holds)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if wide():
            # NOTE: llvmlite's FunctionAttributes admits known flags only; a key="value"
            # attribute is written into the set as LLVM's IR spells it
            set.add(builder.function.attributes, _ATTRIBUTE)
        return context.get_dummy_value()
    return types.none(), codegen


# wide_vectors() in compiled code (the intrinsic's typing context is numba's)
wide_vectors: Callable[[], None] = _wide_vectors  # type: ignore[assignment]

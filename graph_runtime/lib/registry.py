"""The standard-op registry: each op's shape/attr checker and its kernel factory per backend."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import LibraryError
from .library import TensorSpec

# infer(inputs, attrs) -> output specs. Validates input shapes/dtypes and attrs; raises
# LibraryError naming the op and the offending value. Runs at create() time, never at run time.
InferFn = Callable[[Sequence[TensorSpec], Mapping[str, Any]], list[TensorSpec]]
# factory(backend, device_id, inputs, outputs, attrs) -> run(*input_arrays, *output_arrays).
# The factory allocates any workspace once; run() writes into the given outputs in place.
KernelFactory = Callable[[Any, int, Sequence[TensorSpec], Sequence[TensorSpec], Mapping[str, Any]],
                         Callable[..., None]]
# host(input arrays, attrs) -> output arrays, for an op whose output sizes the data decides.
HostFn = Callable[[Sequence[Any], Mapping[str, Any]], list[Any]]
# The attr under which a specialising graph hands an op the values of its value inputs.
VALUES_KEY = "__values"


@dataclass(frozen=True)
class GpuEpilogue:
    """How an op applies some of a chain's trailing ops itself on CUDA (conv2d: cuDNN's bias,
    residual and relu): takes(device_id, inputs, attrs, epilogue, operands) -> how many of the
    leading ones; make(device_id, inputs, outputs, attrs, epilogue, operands) -> run(*inputs,
    *operands, out)."""

    takes: Callable[..., int]
    make: Callable[..., Callable[..., None]]


@dataclass
class OpDef:
    """One standard op: how many inputs it takes, its checker, and its kernels by backend name."""

    name: str
    infer: InferFn
    num_inputs: int | None  # None: variadic (concatenate takes all remaining inputs)
    attrs: tuple[str, ...] = ()  # attribute names the op accepts (others are an error)
    kernels: dict[str, KernelFactory] = field(default_factory=dict)
    # True when every CPU kernel of the op may be given its first input as its output (it reads
    # each element before writing it): a chain then runs it in place in the node's output.
    in_place: bool = False
    # CPU only: factory(inputs, outputs, attrs, epilogue, operands) -> run(*inputs, *operands,
    # out) for an op that applies a chain's trailing add/relu/clip itself (conv2d: chain.py).
    cpu_epilogue: Callable[..., Callable[..., None]] | None = None
    # CUDA: the same for the trailing ops the op's kernel there takes (chain.py)
    cuda_epilogue: GpuEpilogue | None = None
    # Data-dependent sizes: the op computed on the host from its inputs (NumPy), so a graph can
    # be cut at it and each part created for the sizes it gave (runtime/segments.py).
    host: HostFn | None = None
    # Value-dependent shapes: which inputs' values (given in attrs[VALUES_KEY]) decide the
    # outputs' shapes, so a graph specialises per value set (runtime/specialize.py).
    value_inputs: Callable[[Mapping[str, Any]], tuple[int, ...]] | None = None


OPS: dict[str, OpDef] = {}


def define_op(name: str, infer: InferFn, num_inputs: int | None,
              attrs: Sequence[str] = (), in_place: bool = False, host: HostFn | None = None,
              value_inputs: Callable[[Mapping[str, Any]], tuple[int, ...]] | None = None
              ) -> OpDef:
    """Declare an op once (in the module of its family), with the facts the runtime asks of it."""
    if name in OPS:
        raise LibraryError(f"standard op {name!r} is defined twice")
    op = OpDef(name, infer, num_inputs, tuple(attrs), in_place=in_place, host=host,
               value_inputs=value_inputs)
    OPS[name] = op
    return op


def kernel(op_name: str, backend: str) -> Callable[[KernelFactory], KernelFactory]:
    """Decorator registering a backend's kernel factory for an op defined with define_op."""
    def add(factory: KernelFactory) -> KernelFactory:
        if op_name not in OPS:
            raise LibraryError(f"kernel for undefined op {op_name!r}")
        OPS[op_name].kernels[backend] = factory
        return factory
    return add


def get_op(name: str) -> OpDef:
    """The op named name; LibraryError lists the standard ops when it is unknown."""
    load_standard_ops()
    op = OPS.get(name)
    if op is None:
        raise LibraryError(f"unknown standard op {name!r}; known ops: " + ", ".join(sorted(OPS)))
    return op


_loaded = False
_load_lock = threading.RLock()


def load_standard_ops() -> None:
    """Import every op family once so OPS is complete (families register on import).

    Thread-safe: Disco's threaded workers may ask for the table at the same moment, and none may
    see it half filled.
    """
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        import importlib
        import pkgutil

        from . import ops as ops_pkg
        for info in pkgutil.iter_modules(ops_pkg.__path__):
            importlib.import_module(f"{ops_pkg.__name__}.{info.name}")
        _loaded = True

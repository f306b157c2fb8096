"""PreparedKernel: the base of prepared kernels, with defaults for what the executor may ask."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from .library import InputVersion


class PreparedKernel(ABC):
    """A kernel prepared for one node: run(*inputs, *outputs), plus optional capabilities.

    A subclass implements __call__ and overrides only the capabilities it has; the defaults say
    "none". Plain functions (most kernels are closures) have none: `capabilities(fn)` answers
    for them, so the executor and a chain ask every kernel the same way.
    """

    @abstractmethod
    def __call__(self, *arrays: Any) -> None:
        """Compute the node: read the inputs, write the outputs (destination passing)."""

    def storage_requests(self) -> Mapping[int, Any]:
        """{input position: array that input's entry should live in} (a padded weight).

        The executor honours a request only for an entry with its own storage id on the
        kernel's device, read directly (not flattened, not through a copy); otherwise the kernel
        must still work on the pool's array (it checks `is` identity and takes its plain path).
        """
        return {}

    def workspace_bytes(self) -> int:
        """Bytes this kernel allocated at prepare time and keeps for every run."""
        return 0

    def workspace_owner(self) -> Any:
        """What the workspace is counted by, once however many kernels name it (a symbolic
        module's kept shapes: measure.SharedBytes): the kernel itself, or for data several
        kernels share (a frozen weight's packed copy) what stands for that data."""
        return self

    def workspace_items(self) -> list[tuple[Any, int]]:
        """The workspace as (what counts it, bytes) parts: one, workspace_owner's, unless a
        part is data other kernels name too (a frozen weight's oneDNN copy inside a conv's
        workspace or a chain's), which a memory report counts once."""
        nbytes = self.workspace_bytes()
        return [(self.workspace_owner(), nbytes)] if nbytes else []

    def cached_inputs(self) -> Sequence[int]:
        """Input positions whose derived data (transformed weights) the kernel keeps between runs.

        The executor then binds one InputVersion per such position; a kernel never bound must
        derive every run, so it is correct without the executor too.
        """
        return ()

    def bind_versions(self, versions: Mapping[int, InputVersion]) -> None:
        """The write counters of the cached inputs, by position."""

    def uses_workers(self) -> bool:
        """True when the work goes to the runtime's CPU workers (kernels/threads.py).

        A graph holding one runs with OpenBLAS at one thread throughout (executor.py): a threaded
        BLAS call elsewhere in the run leaves OpenBLAS threads spinning on the workers' cores.
        """
        return False

    def any_shape(self) -> bool:
        """True for a kernel that reads its arrays' shapes at each call, so it computes its node
        at any shapes of its arrays' ranks (a symbolic module's next shape whose arrays' rows
        and last dims round to the same size classes takes it, unprepared: runtime/executor.py's
        _class_key). Its other answers here then hold for all those shapes."""
        return False

    def shape_free(self) -> bool:
        """For an any_shape kernel: True where nothing it holds or chose depends on its arrays'
        sizes (no tuning choice, nothing sized kept, no compiled form per shape): a symbolic
        module keeps it by its arrays' ranks alone, so a new size class prepares it again only
        where this is False (_class_key's "rank")."""
        return False

    def call_site(self) -> Callable[..., None] | None:
        """For a kernel that several nodes share (a symbolic module's KernelCache: a decoder's
        layers), what one node calls instead of the kernel itself: the kernel with state of that
        node's own (the views of its arrays), which its step, and so its module, holds. None:
        the kernel keeps nothing per call site."""
        return None

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """For an any_shape kernel: whether preparing its node at arrays of these shapes
        (inputs, then outputs) would make this kernel again, i.e. the tuning choices that made
        it pick it there too (a size class of another row count may have chosen otherwise)."""
        return True

    def channels_last_positions(self) -> Sequence[int]:
        """Argument positions (inputs, then outputs) of 4-D arrays this kernel can also read or
        write with NHWC bytes: the strided NCHW view of an NHWC buffer (runtime/layouts.py).

        The executor keeps an entry NHWC when its writer and every reader list it here.
        """
        return ()

    def layout_free_positions(self) -> Sequence[int]:
        """Argument positions this kernel reads or writes as right and as fast in either layout,
        gaining nothing from NHWC (a NumPy ufunc: runtime/layouts.py hands it the NCHW view of
        NHWC bytes). An entry kept NHWC for a kernel listing it in channels_last_positions may
        be read or written here; none is kept NHWC for such positions alone, so these kernels
        are shared and retargeted as kernels offering nothing."""
        return ()

    def use_channels_last(self, positions: Collection[int]) -> None:
        """The arrays at these positions (some of channels_last_positions) hold NHWC bytes from
        now on; called once at create(), before any run."""

    def in_place_positions(self) -> Mapping[int, int]:
        """{output position: input position} where this kernel is also right when handed the
        input's own array as that output (it reads each input element before it overwrites it:
        oneDNN's conv adding a residual, its sum post-op).

        The executor's storage plan then gives the output the input's storage id where the
        input dies at this node (runtime/in_place.py). Asked once at create(), after
        use_channels_last and before any array is bound.
        """
        return {}

    def flattens(self) -> bool:
        """True for a kernel that only copies its (N, ...) input into its (N, rest) output
        (batch_flatten): run() may skip it, its reader reading the input's storage instead
        (runtime/flatten_reads.py)."""
        return False

    def reshapes(self) -> bool:
        """True for a kernel that only copies its input's elements, in C order, into its
        output's shape (reshape, squeeze, expand_dims): a static module may give the output
        the input's storage where the input dies there, and run() then skips it
        (runtime/in_place.py)."""
        return False

    def reading_nhwc(self, position: int, shape: tuple[int, ...]) -> PreparedKernel | None:
        """This kernel, but with its 2-D input at position (the batch_flatten of an (N, C, H,
        W) tensor of this shape) handed as that tensor's NHWC bytes flattened, (N, H*W*C);
        None where it cannot (runtime/flatten_reads.py)."""
        return None

    def sub_modules(self) -> Sequence[Any]:
        """Modules this kernel holds for sub-graphs (control-flow bodies); memory_report counts
        what they hold (their held_bytes())."""
        return ()

    def note(self) -> str:
        """How it runs, for `graphrun profile` (its tiles, work items, post-ops); "" for nothing
        beyond what lib/chain.py's kernel_note finds."""
        return ""

    def with_tile_tail(self, tail: Any) -> PreparedKernel | None:
        """This product applying tail (a chain_jit.CompiledChain over its output, reading its
        inputs after the product's) on each output tile while the tile is in cache; None where
        it cannot (lib/chain.py fuses a dense's tail so)."""
        return None

    def post_op_shape(self) -> tuple[int, int] | None:
        """(m, n) of a 2-D product that can apply an elementwise tail as bias and post-ops
        (with_post_ops; kernels/onednn/matmul_tail.py), else None."""
        return None

    def with_post_ops(self, tail: Any, extras: int, after: Any = None,
                      after_args: tuple[int, ...] = ()) -> PreparedKernel | None:
        """This product applying tail's bias and post-ops reading `extras` more inputs, then the
        compiled chain after over the arrays at after_args; None where post_op_shape() is."""
        return None


class HoldsModules(PreparedKernel):
    """run, as a kernel holding modules of its own (a sub-graph's: control flow, onnx_region),
    so memory_report counts what they hold."""

    def __init__(self, run: Callable[..., None], modules: Sequence[Any]) -> None:
        self.run = run
        self.modules = list(modules)

    def __call__(self, *arrays: Any) -> None:
        self.run(*arrays)

    def sub_modules(self) -> Sequence[Any]:
        return self.modules


class Wrapping(PreparedKernel):
    """A kernel that calls another one (self.inner: its capabilities) with its arguments
    adjusted: the inner kernel's workspace, cached inputs, write counters, worker use and
    sub-modules carry through; its storage requests and layouts do not (the wrapper changes
    what the inner kernel is handed)."""

    inner: PreparedKernel

    def workspace_bytes(self) -> int:
        return self.inner.workspace_bytes()

    def workspace_owner(self) -> Any:
        return self.inner.workspace_owner()

    def workspace_items(self) -> list[tuple[Any, int]]:
        return self.inner.workspace_items()

    def cached_inputs(self) -> Sequence[int]:
        return self.inner.cached_inputs()

    def bind_versions(self, versions: Mapping[int, InputVersion]) -> None:
        self.inner.bind_versions(versions)

    def uses_workers(self) -> bool:
        return self.inner.uses_workers()

    def sub_modules(self) -> Sequence[Any]:
        return self.inner.sub_modules()


class AnyShape(PreparedKernel):
    """run, a kernel that reads its arrays' shapes at each call and keeps nothing sized
    (a NumPy ufunc writing into out): a symbolic module keeps it by its arrays' ranks
    (PreparedKernel.shape_free), so no new length or size class prepares it again."""

    def __init__(self, run: Callable[..., Any]) -> None:
        self.run = run  # (what it returns is its subclass's: RowKernel's word for a replay)

    def __call__(self, *arrays: Any) -> None:
        self.run(*arrays)

    def any_shape(self) -> bool:
        return True

    def shape_free(self) -> bool:
        return True


class ReshapeCopy(AnyShape):
    """AnyShape for a reshape-like op: run copies its input's elements into its output's
    shape, where a static module may give the output the input's bytes (reshapes)."""

    def reshapes(self) -> bool:
        return True

    def in_place_positions(self) -> Mapping[int, int]:
        return {1: 0}


class _Plain(PreparedKernel):
    """What a plain function can be asked: every capability at its default."""

    def __call__(self, *arrays: Any) -> None:
        raise AssertionError("_Plain only answers for a plain function's capabilities")


_PLAIN = _Plain()


class _Ufunc(_Plain):
    """What a NumPy ufunc that is a kernel itself (inputs, then out, positionally: the CPU's
    binary and unary elementwise ops, elementwise.py) can be asked: like AnyShape, it reads
    its arrays' shapes at each call and keeps nothing, so a symbolic module keeps it (and a
    chain of such kernels) by its arrays' ranks. As a plain function it made its chains, a
    LLaMA's rotary cos * scale and sin * scale among them, be prepared again per size class.

    Every argument is layout-free: a ufunc broadcasts by the shapes of the views it is handed,
    so the strided NCHW view of an NHWC buffer (runtime/layouts.py) reads right, and its
    iterator follows the bytes' order. A RegNet's squeeze-excite scale (x * sigmoid(...))
    between two convs then no longer sends their NHWC data through two reorders."""

    def __init__(self, arity: int) -> None:
        self._positions = tuple(range(arity))

    def any_shape(self) -> bool:
        return True

    def shape_free(self) -> bool:
        return True

    def layout_free_positions(self) -> Sequence[int]:
        return self._positions


_UFUNCS: dict[int, _Ufunc] = {}  # by arity (inputs and outputs): one stand-in each


def capabilities(fn: Callable[..., Any]) -> PreparedKernel:
    """fn itself when it is a PreparedKernel, else a stand-in with every default (a NumPy
    ufunc's: it takes any shape)."""
    if isinstance(fn, PreparedKernel):
        return fn
    if isinstance(fn, np.ufunc):
        arity = fn.nin + fn.nout
        return _UFUNCS.get(arity) or _UFUNCS.setdefault(arity, _Ufunc(arity))
    return _PLAIN

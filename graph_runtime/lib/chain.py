"""Chain: a lib function made of standard ops applied in sequence (TVM's fused-op convention)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from operator import itemgetter, methodcaller
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from .._text import fmt_bytes
from ..backends import REGISTRY, get_backend
from ..backends.base import Backend
from ..device import Device
from ..errors import LibraryError
from .attrs import (DTYPE_KEY, NODE_KEYS, NUM_OUTPUTS_KEY, OUT_DTYPE_KEY, WORKSPACE_LIMIT_KEY,
                    check_attrs, float_attr, str_attr)
from .kernels import replay
from .kernels.cpu import chain_jit
from .kernels.conv_epilogue import EPILOGUE_DTYPES, EPILOGUE_OPS
from .kernels.cpu.token_layout import (PermuteCopy, PermutedBinary, TokenLayoutCopy,
                                       permute_layout, token_layout)
from .kernels.cpu.permuted_copy import PermutedCopy, atom_permutation
from .kernels.onednn.matmul_tail import matmul_tail
from .kernels.gpu_elementwise import ELEMENTWISE_EXPRS, gpu_elementwise
from .library import InputVersion, TensorSpec
from .ops.elementwise import BINARY
from .ops.slicing import slice_index
from .ops.transform import transpose_axes
from .prepared import PreparedKernel, Wrapping, capabilities
from .registry import OpDef, get_op


@dataclass(frozen=True)
class Step:
    """One op of a chain with its attrs; num_inputs caps how many inputs a variadic op takes."""

    op: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    num_inputs: int | None = None


@dataclass
class _Planned:
    op: OpDef
    attrs: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    slots: list[int]  # argument slots: graph inputs, then graph outputs, then intermediates
    out_slots: list[int]
    # CPU: trailing ops this op applies itself (op.cpu_epilogue), and the specs of their operands,
    # whose slots follow the op's own inputs in `slots`.
    epilogue: list[tuple[str, Any]] | None = None
    operands: list[TensorSpec] = field(default_factory=list)


class PreparedChain(PreparedKernel):
    """The callable a multi-op chain prepares; run(*inputs, *outputs) calls each kernel in turn.

    Its capabilities are its kernels' together, by the function's input positions: their requests
    and cached inputs among the function's own inputs, their workspace plus the intermediates,
    the workers if any kernel uses them.
    """

    def __init__(self, calls: list[tuple[Callable[..., None], tuple[int, ...]]],
                 intermediates: list[Any], fused_ops: list[str], n_inputs: int,
                 views: Sequence[tuple[int, int, Callable[[Any], Any]]] = (),
                 lead_view: tuple[int, int, Callable[[Any], Any], int] | None = None) -> None:
        # Allocated once at prepare time, reused by every run: the slots after the arrays.
        self.intermediates = tuple(intermediates)
        # (slot, slot it views, how), in order: a view of a function argument, made per run
        # (_view_steps; those of intermediates are views among them already)
        self._views = tuple(views)
        # the first call, a layout copy, as a view of its source where that is told NHWC
        # (token_layout's read_as_view): (source slot, its slot, view, intermediate index)
        self._lead_view = lead_view
        self.fused_ops = fused_ops  # ops of the elementwise tail generated as one GPU kernel
        self._calls = calls
        self._n_inputs = n_inputs
        # (kernel, picks its arguments out of the slots): itemgetter does it in C
        self._steps = [(fn, itemgetter(*index) if len(index) > 1 else _one(index[0]))
                       for fn, index in calls]
        self._requests: dict[int, Any] = {}
        self._cached: set[int] = set()
        # Kernels keeping data derived from the function's own inputs, with their argument slots.
        self._binds: list[tuple[PreparedKernel, tuple[int, ...]]] = []
        self._workspace = self._own_bytes = sum(
            int(a.nbytes) for a in intermediates
            if getattr(a, "base", None) is None)  # views hold no bytes
        self._workers = False
        for fn, index in calls:
            kernel = capabilities(fn)
            for pos, array in kernel.storage_requests().items():
                if index[pos] < n_inputs:
                    self._requests.setdefault(index[pos], array)
            cached = {index[pos] for pos in kernel.cached_inputs() if index[pos] < n_inputs}
            if cached:
                self._cached |= cached
                self._binds.append((kernel, index))
            self._workspace += kernel.workspace_bytes()
            self._workers = self._workers or kernel.uses_workers()
        # channels_last_positions and layout_free_positions, once asked
        self._nhwc: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        # serves: the slots the calls read (their highest) and the calls whose kernels answer
        # serves themselves (the others take any shape), once asked
        self._asked: tuple[int, list[tuple[Any, tuple[int, ...]]]] | None = None
        # function position -> (kernel, its own position) for every kernel touching it
        self._touching: dict[int, list[tuple[PreparedKernel, int]]] = {}
        for fn, index in calls:
            for pos, slot in enumerate(index):
                self._touching.setdefault(slot, []).append((capabilities(fn), pos))

    def storage_requests(self) -> Mapping[int, Any]:
        return self._requests

    def workspace_bytes(self) -> int:
        return self._workspace

    def workspace_items(self) -> list[tuple[Any, int]]:
        """Its intermediates, then each kernel's parts as that kernel counts them (a product's
        copy of a frozen weight is the weight's, whichever chain holds the product)."""
        items = [(self, self._own_bytes)] if self._own_bytes else []
        for fn, _ in self._calls:
            items += capabilities(fn).workspace_items()
        return items

    def sub_modules(self) -> list[Any]:
        return [m for fn, _ in self._steps for m in capabilities(fn).sub_modules()]

    def cached_inputs(self) -> tuple[int, ...]:
        return tuple(sorted(self._cached))

    def bind_versions(self, versions: Mapping[int, InputVersion]) -> None:
        """Hand each kernel the counters of the function inputs it reads; others stay volatile."""
        for kernel, index in self._binds:
            kernel.bind_versions({pos: versions.get(index[pos], InputVersion(volatile=True))
                                  for pos in kernel.cached_inputs()})

    def uses_workers(self) -> bool:
        return self._workers

    def any_shape(self) -> bool:
        """A chain without intermediates (sized at prepare) whose kernels all take any shape:
        a dense and its tail as one oneDNN product with run-time rows."""
        return not self.intermediates and all(capabilities(fn).any_shape()
                                              for fn, _ in self._calls)

    def call_site(self) -> PreparedChain | None:
        """This chain calling its kernels' call sites (a compiled tail reading its arrays'
        shapes per call), where any has one; a chain with intermediates (sized at prepare)
        runs its own shapes only."""
        if self.intermediates:
            return None
        sites = [capabilities(fn).call_site() for fn, _ in self._calls]
        if not any(sites):
            return None
        site = copy.copy(self)
        site._steps = [(own or fn, pick) for own, (fn, pick) in zip(sites, self._steps)]
        return site

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Each kernel at its arguments' shapes (a view made per run: no shape known here,
        so no); a kernel keeping PreparedKernel.serves (any shape) is not asked: a decode
        step's retarget asks ~16 chains at every new length."""
        if self._asked is None:
            top = max((max(index) for _, index in self._calls if index), default=-1)
            self._asked = (top, [(fn, index) for fn, index in self._calls
                                 if type(capabilities(fn)).serves is not PreparedKernel.serves])
        top, asked = self._asked
        return top < len(shapes) and all(
            capabilities(fn).serves([shapes[slot] for slot in index]) for fn, index in asked)

    def channels_last_positions(self) -> tuple[int, ...]:
        """The function's arguments (not its intermediates) that every kernel touching them
        can take channels-last, some of them needing it (the others layout-free: a ufunc
        after a conv); worked out once: a symbolic module's layout pass asks every shape it
        meets, and the kernels' answers never change."""
        return self._layouts()[0]

    def layout_free_positions(self) -> tuple[int, ...]:
        """The function's arguments that only layout-free kernels touch (a chain of ufuncs)."""
        return self._layouts()[1]

    def _layouts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self._nhwc is None:
            # slots: the function's inputs and outputs, then its intermediates (all touched)
            args = (max(self._touching) + 1 if self._touching else 0) - len(self.intermediates)
            needs: list[int] = []
            free: list[int] = []
            for slot, users in sorted(self._touching.items()):
                if slot >= args:
                    continue
                free_at = [pos in kernel.layout_free_positions() for kernel, pos in users]
                if all(free_at):
                    free.append(slot)
                elif all(f or pos in kernel.channels_last_positions()
                         for f, (kernel, pos) in zip(free_at, users)):
                    needs.append(slot)
            self._nhwc = (tuple(needs), tuple(free))
        return self._nhwc

    def use_channels_last(self, positions: Collection[int]) -> None:
        told: dict[int, tuple[PreparedKernel, list[int]]] = {}  # each kernel told once
        for slot in positions:
            for kernel, pos in self._touching[slot]:
                told.setdefault(id(kernel), (kernel, []))[1].append(pos)
        for kernel, own in told.values():
            kernel.use_channels_last(own)
        if self._lead_view is not None and self._lead_view[0] in positions:
            # the leading copy's source holds NHWC bytes: its result is a view of them (a
            # permute to channels last of NHWC bytes is those bytes), its copy and buffer go
            source, slot, view, index = self._lead_view
            self._lead_view = None
            self._calls, self._steps = self._calls[1:], self._steps[1:]
            self._asked = None
            self._views = ((slot, source, view),) + self._views
            dropped = self.intermediates[index]
            self._workspace -= int(dropped.nbytes)
            self.intermediates = (self.intermediates[:index]
                                  + (np.empty((0,), dropped.dtype),)
                                  + self.intermediates[index + 1:])

    def reading_nhwc(self, position: int, shape: tuple[int, ...]) -> PreparedKernel | None:
        """This chain (a dense and its fused tail: one oneDNN product, or OpenBLAS's call and
        the tail's loop) as the one kernel reading the function's input at position answers,
        reading it at exactly one of its own; a chain with intermediates or views: None."""
        if self.intermediates or self._views or self._lead_view is not None:
            return None
        readers = [k for k, (_, index) in enumerate(self._calls) if position in index]
        if len(readers) != 1:
            return None
        fn, index = self._calls[readers[0]]
        own = [k for k, slot in enumerate(index) if slot == position]
        if len(own) != 1:
            return None
        inner = capabilities(fn).reading_nhwc(own[0], shape)
        if inner is None:
            return None
        calls = list(self._calls)
        calls[readers[0]] = (inner, index)
        return PreparedChain(calls, [], self.fused_ops, self._n_inputs)

    def __call__(self, *arrays: Any) -> None:
        slots = arrays + self.intermediates
        if self._views:
            viewed = list(slots)
            for slot, source, view in self._views:
                viewed[slot] = view(viewed[source])
            slots = tuple(viewed)
        recording = None if replay.active is None else replay.active.here()
        if recording is None:
            for fn, pick in self._steps:
                fn(*pick(slots))
            return
        # recorded (kernels/replay.py): the chain vouches for its calls where each of its
        # kernels vouched for its own (its views are of its arrays; intermediates kept)
        whole = True
        for fn, pick in self._steps:
            whole = replay.vouched(fn, *pick(slots)) and whole
        replay.note_arrays(list(self.intermediates))
        if whole:
            replay.whole_call(self)


def kernel_note(kernel: Any) -> str:
    """How a prepared function runs, for `graphrun profile`: which ops ran compiled (CPU chain
    tails, kernels/cpu/chain_jit.py) or as one NumPy pass per op."""
    if isinstance(kernel, chain_jit.CompiledChain):
        return "compiled " + "+".join(kernel.ops)
    if capabilities(kernel).note():
        return capabilities(kernel).note()
    if not isinstance(kernel, PreparedChain):
        return _library_note(kernel)
    tiled = [note for note in (capabilities(fn).note() for fn, _ in kernel._steps) if note]
    if tiled:
        return tiled[0]
    chosen = [note for note in (_library_note(fn) for fn, _ in kernel._steps) if note]
    if chosen:
        return chosen[0]
    compiled = [fn for fn, _ in kernel._steps if isinstance(fn, chain_jit.CompiledChain)]
    if compiled:
        return "compiled tail " + "+".join(compiled[-1].ops)
    return "" if kernel.fused_ops else "numpy, one pass per op"


def _library_note(kernel: Any) -> str:
    """oneDNN's implementation (its JIT kernel's name) or the conv strategy a kernel runs."""
    impl = getattr(kernel, "impl", None)
    if isinstance(impl, str) and impl:
        return f"oneDNN {impl}"
    strategy = getattr(kernel, "strategy", None)
    return f"conv {strategy}" if isinstance(strategy, str) else ""


def _check_workspace(name: str, temps: Sequence[TensorSpec], limit: Any,
                     device: Device) -> None:
    """Refuse intermediates beyond the bytes left under the device's cap, before allocating."""
    if limit is None or not temps:
        return
    sizes = []
    for spec in temps:
        count = 1
        for dim in spec.shape:
            count *= int(dim)  # Python ints: a [60000, 60000] temp must not wrap around
        sizes.append(count * np.dtype(spec.dtype).itemsize)
    total = sum(sizes)
    if total > int(limit):
        biggest = temps[sizes.index(max(sizes))]
        raise LibraryError(f"{name}: the chain's intermediates need {fmt_bytes(total)} on "
                           f"{device} (e.g. {biggest}) but only {fmt_bytes(max(int(limit), 0))} "
                           "is left under the memory cap; pass memory_cap= to raise the cap, or "
                           "split the function")


def _one(i: int) -> Callable[[tuple], tuple]:
    return lambda slots: (slots[i],)


class Chain:
    """A function of the lib: ops in order, each later op taking the previous result first."""

    def __init__(self, name: str, steps: Sequence[Step]) -> None:
        if not steps:
            raise LibraryError(f"{name}: a function needs at least one op")
        self.name = name
        self.steps = list(steps)

    def __repr__(self) -> str:
        return f"Chain({self.name!r}, {[s.op for s in self.steps]})"

    def backends(self) -> list[str]:
        """Device kinds with a kernel for every op of the chain."""
        ops = [get_op(s.op) for s in self.steps]
        return [kind for kind in REGISTRY if all(kind in op.kernels for op in ops)]

    def infer(self, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any] | None = None,
              out_dtypes: Sequence[str] | None = None) -> list[TensorSpec]:
        """The outputs this chain produces for inputs (checks shapes, dtypes and attrs).

        out_dtypes: the dtypes a graph declares for the outputs (an op such as argmax takes its
        output dtype from them); the shapes are inferred.
        """
        return self._plan(list(inputs), dict(attrs or {}), None, out_dtypes)[-1].outputs

    def prepare(self, device: Device, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                attrs: Mapping[str, Any]) -> Callable[..., None]:
        """Validate against the node's declared outputs, allocate intermediates, build kernels."""
        plan = self._plan(list(inputs), dict(attrs), list(outputs))
        backend = get_backend(device)
        device_id = device.device_id
        for k, p in enumerate(plan):
            if backend.name not in p.op.kernels:
                have = ", ".join(kind for kind in REGISTRY if kind in p.op.kernels)
                raise LibraryError(f"{self._where(k)}: no {backend.name} kernel; it exists for: "
                                   f"{have}")
        if len(plan) > 1 and len(inputs) == 1 and all(p.op.name in RESHAPES for p in plan):
            # reshapes in a row are one (a decoder's mask: three, of the past length), which a
            # symbolic module keeps for every length (any_shape)
            plan = [replace(plan[-1], op=get_op("reshape"), attrs={}, inputs=list(inputs),
                            slots=[0])]
        if backend.name == "cpu":
            permuted = _permuted_copy(plan, len(inputs), len(outputs))
            if permuted is not None:
                return permuted
            pair = _permute_then_binary(plan, len(inputs), len(outputs))
            if pair is not None:
                return pair
        slot_count = len(inputs) + len(outputs)
        by_gpu = plan[0].op.cuda_epilogue if backend.name == "cuda" else None
        if by_gpu is not None:
            plan = _fuse_epilogue(plan, slot_count, lambda head, ops, operands: by_gpu.takes(
                device_id, head.inputs, head.attrs, ops, operands))
        first_fused = _fusable_tail(plan) if backend.name in ("opencl", "cuda") else len(plan)
        if backend.name == "cpu":
            if plan[0].op.cpu_epilogue is not None:
                plan = _fuse_epilogue(plan, slot_count)
            first_fused = _jit_tail(plan, slot_count)
            if first_fused == len(plan):
                _write_tail_in_place(plan, slot_count)
        lead, taken = _layout_lead(plan, first_fused) if backend.name == "cpu" else (None, 0)
        views = _view_steps(plan[taken:first_fused], slot_count) if backend.name == "cpu" \
            else {}
        # a pair's first op writes nothing now, nor does a reshape made a view: their
        # intermediate slots keep their numbers, empty
        temps = [(p.outputs[0], k < taken - 1 or p.out_slots[0] in views)
                 for k, p in enumerate(plan[:first_fused]) if p.out_slots[0] >= slot_count]
        _check_workspace(self.name, [spec for spec, unused in temps if not unused],
                         attrs.get(WORKSPACE_LIMIT_KEY), device)
        intermediates = [backend.empty(device_id, (0,) if unused else tuple(spec.shape),
                                       np.dtype(spec.dtype)) for spec, unused in temps]
        dynamic: list[tuple[int, int, Callable[[Any], Any]]] = []  # of arguments, per run
        for slot, (source, view) in views.items():
            if source >= slot_count and not any(s == source for s, _, _ in dynamic):
                intermediates[slot - slot_count] = view(intermediates[source - slot_count])
            else:
                dynamic.append((slot, source, view))
        calls: list[tuple[Callable[..., None], tuple[int, ...]]] = []
        fused = plan[first_fused:]
        # NOTE: CuPy puts the workspace kernels allocate here on the current GPU; make that
        # this node's GPU (cuda:1 ...), not whichever one the caller has current.
        with backend.scope(device_id):
            if lead is not None:  # its leading layout op(s) as one copy
                calls.append((lead, _lead_slots(plan, taken)))
            for p in plan[taken:first_fused]:
                if p.out_slots[0] in views:
                    continue
                if p.epilogue is not None and by_gpu is not None:
                    fn = by_gpu.make(device_id, p.inputs, p.outputs, p.attrs, p.epilogue,
                                     p.operands)
                elif p.epilogue is not None and p.op.cpu_epilogue is not None:
                    fn = p.op.cpu_epilogue(p.inputs, p.outputs, p.attrs, p.epilogue, p.operands)
                else:
                    fn = p.op.kernels[backend.name](backend, device_id, p.inputs, p.outputs,
                                                    p.attrs)
                calls.append((fn, tuple(p.slots + p.out_slots)))
            product = _onednn_tail(calls, plan, fused) if fused and backend.name == "cpu" \
                else None
            if product is not None:
                calls = [product]  # the tail as the oneDNN matmul's bias and post-ops
            elif fused and backend.name == "cpu":
                tail = _jit_call(fused)
                tiled = capabilities(calls[0][0]).with_tile_tail(tail[0]) if (
                    len(calls) == 1 and plan[0].out_slots == fused[-1].out_slots) else None
                if tiled is not None:
                    # The product's tail runs on each output tile while it is in cache.
                    calls = [(tiled, tuple(plan[0].slots) + tail[1])]
                else:
                    calls.append(tail)
            elif fused:
                calls.append(_fused_call(self.name, backend, device_id, fused))
        flatten = str(attrs.get("flatten_data", "0")).strip().lower() in ("1", "true")
        ops = len(plan) - max(taken - 1, 0)
        if ops == 1 and not flatten and calls[0][1] == tuple(range(slot_count)):
            return calls[0][0]  # one kernel: the prepared call, with no extra layer
        run: Callable[..., None] = PreparedChain(
            calls, intermediates, [p.op.name for p in fused], len(inputs), dynamic,
            _lead_view(lead, calls, plan, taken, views, slot_count))
        if flatten:
            run = _Unflattened(run, list(inputs) + list(outputs))
        return run

    # -- planning ---------------------------------------------------------------------------

    def _where(self, k: int) -> str:
        """How messages name op k: the function, plus the op's 1-based position in a chain."""
        op = self.steps[k].op
        if len(self.steps) > 1:
            return f"{self.name}: op {k + 1} {op!r}"
        return op if self.name == op else f"{self.name}: {op!r}"

    def _plan(self, inputs: list[TensorSpec], node_attrs: dict[str, Any],
              declared: list[TensorSpec] | None,
              out_dtypes: Sequence[str] | None = None) -> list[_Planned]:
        # A one-op function takes its attrs from the node too (graph attrs win); a chain takes
        # them from the lib file only, since a node attr could not say which op it is for.
        extra = {k: v for k, v in node_attrs.items() if k not in NODE_KEYS}
        plan: list[_Planned] = []
        n_in = len(inputs)
        n_out = len(declared) if declared is not None else 0
        next_input = 0
        next_inter = n_in + n_out
        prev: tuple[TensorSpec, int] | None = None
        for k, step in enumerate(self.steps):
            op = get_op(step.op)
            attrs = dict(step.attrs)
            if len(self.steps) == 1:
                attrs.update(extra)
            last = k == len(self.steps) - 1
            if last and declared:
                out_dtypes = [spec.dtype for spec in declared]
            if last and out_dtypes:
                attrs[OUT_DTYPE_KEY] = out_dtypes[0]
                attrs[NUM_OUTPUTS_KEY] = len(out_dtypes)
            where = self._where(k)
            want = step.num_inputs or op.num_inputs
            have = [] if prev is None else [prev]
            if want is None:
                want = len(have) + n_in - next_input
            take = want - len(have)
            if take < 0 or next_input + take > n_in:
                raise LibraryError(f"{where}: needs {want} input(s) but the graph node "
                                   f"gives {n_in} for the whole function")
            args = have + [(inputs[i], i) for i in range(next_input, next_input + take)]
            next_input += take
            try:
                check_attrs(op.name, attrs, op.attrs)
                outs = op.infer([spec for spec, _ in args], attrs)
            except LibraryError as e:
                if where == op.name:
                    raise
                message = str(e).removeprefix(f"{op.name}: ")
                raise LibraryError(f"{where}: {message}") from e
            if last:
                out_slots = [n_in + i for i in range(len(outs))]
            else:
                if len(outs) != 1:
                    raise LibraryError(f"{where}: produces {len(outs)} outputs; only the last op "
                                       "of a chain may have more than one")
                out_slots = [next_inter]
                next_inter += 1
            plan.append(_Planned(op, attrs, [s for s, _ in args], outs,
                                 [slot for _, slot in args], out_slots))
            prev = (outs[0], out_slots[0])
        if next_input != n_in:
            raise LibraryError(f"{self.name}: its ops take {next_input} input(s) but the graph "
                               f"node gives {n_in}")
        if declared is not None:
            self._check_declared(plan[-1], declared)
        return plan

    def _check_declared(self, p: _Planned, declared: list[TensorSpec]) -> None:
        who = self._where(len(self.steps) - 1)
        if len(p.outputs) != len(declared):
            raise LibraryError(f"{who} produces {len(p.outputs)} output(s) but the graph declares "
                               f"{len(declared)}")
        for i, (got, want) in enumerate(zip(p.outputs, declared)):
            if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
                raise LibraryError(f"{who} produces {got} but the graph declares {want} for "
                                   f"output {i}")


# ops whose output is their input's bytes in another shape (the CPU kernel of each copies)
RESHAPES = frozenset({"reshape", "batch_flatten", "flatten", "expand_dims", "squeeze"})
# ops whose kernels read a strided view as NumPy does (a sliced input: a torch.roll's halves)
STRIDED_READERS = frozenset({"concatenate", "transpose"}) | RESHAPES


def _view_steps(plan: list[_Planned], slot_count: int
                ) -> dict[int, tuple[int, Callable[[Any], Any]]]:
    """{intermediate slot: (slot it views, how)} for the ops of plan (CPU, before the compiled
    tail) whose output, an intermediate, can be a view of their input instead of a copy: the
    reshape-like ops (a reshape of a non-contiguous argument copies, as it must), and a
    strided_slice whose reader takes strided arrays. A window partition's reshape, transpose,
    reshape takes one pass, not three; an op writing a function output still copies into it."""
    views: dict[int, tuple[int, Callable[[Any], Any]]] = {}
    for k, p in enumerate(plan):
        if p.epilogue is not None or len(p.slots) != 1 or p.out_slots[0] < slot_count:
            continue
        if p.op.name in RESHAPES:
            shape = tuple(int(d) for d in p.outputs[0].shape)
            views[p.out_slots[0]] = (p.slots[0], methodcaller("reshape", shape))
        elif (p.op.name == "strided_slice" and k + 1 < len(plan)
              and plan[k + 1].op.name in STRIDED_READERS and plan[k + 1].epilogue is None):
            index = slice_index(tuple(int(d) for d in p.inputs[0].shape), p.attrs)
            views[p.out_slots[0]] = (p.slots[0], itemgetter(index))
    return views


def _permuted_copy(plan: list[_Planned], n_in: int, n_out: int) -> PermutedCopy | None:
    """Three or more reshapes and transposes from one input to one output as one copy
    (kernels/cpu/permuted_copy.py; MobileViT's patch unfold and fold: 3 copies each before);
    None otherwise. Two such ops stay with _layout_lead, whose copies keep NHWC neighbours'
    bytes."""
    if len(plan) < 3 or n_in != 1 or n_out != 1 or not any(
            p.op.name == "transpose" for p in plan) or not all(
            p.epilogue is None and (p.op.name in RESHAPES or p.op.name == "transpose")
            for p in plan):
        return None
    ops = [(p.op.name, tuple(int(d) for d in p.outputs[0].shape),
            transpose_axes(p.inputs[0], p.attrs) if p.op.name == "transpose" else None)
           for p in plan]
    found = atom_permutation(tuple(int(d) for d in plan[0].inputs[0].shape), ops)
    return None if found is None else PermutedCopy(*found)


def _permute_and_binary(first: _Planned, second: _Planned
                        ) -> tuple[tuple[int, int, int, int], bool] | None:
    """(the channel permute's axes, whether the op's other operand is an image of the result's
    shape) when first is such a permute and second one NumPy binary op taking its result first,
    neither with an epilogue, the result keeping its shape; else None."""
    if (first.op.name != "transpose" or second.op.name not in BINARY
            or first.epilogue is not None or second.epilogue is not None
            or len(second.slots) != 2 or second.slots[0] != first.out_slots[0]
            or tuple(second.outputs[0].shape) != tuple(first.outputs[0].shape)):
        return None
    axes = permute_layout(first.attrs.get("axes"), len(first.inputs[0].shape))
    if axes is None:
        return None
    return axes, tuple(second.inputs[1].shape) == tuple(second.outputs[0].shape)


def _binary(name: str) -> Callable[..., None]:
    """NumPy's run(a, b, out) of a binary op."""
    return BINARY[name][0](np)


def _permute_then_binary(plan: list[_Planned], n_in: int, n_out: int
                         ) -> PermutedBinary | None:
    """A channel permute and one binary op taking its result first (ConvNeXt's permute back to
    the image and its residual add) as one pass (kernels/cpu/token_layout.py), the image side
    NHWC-capable (the source, or the output and an image operand); None otherwise."""
    if len(plan) != 2 or n_in != 2 or n_out != 1 or plan[0].slots != [0] \
            or plan[1].slots[1:] != [1]:
        return None
    found = _permute_and_binary(*plan)
    if found is None:
        return None
    axes, image = found
    images = (0,) if axes == (0, 2, 3, 1) else (1, 2) if image else (2,)
    return PermutedBinary(plan[1].op.name, _binary(plan[1].op.name), 0, axes, images)


def _lead_view(lead: PreparedKernel | None,
               calls: list[tuple[Callable[..., None], tuple[int, ...]]],
               plan: list[_Planned], taken: int,
               views: Mapping[int, tuple[int, Callable[[Any], Any]]], slot_count: int
               ) -> tuple[int, int, Callable[[Any], Any], int] | None:
    """PreparedChain's lead_view: the leading layout copy (calls' first) when its result can be
    a view of an NHWC source (read_as_view) and nothing else depends on its buffer: no later op
    writes its slot, no view is made of it at prepare."""
    if lead is None or not calls or calls[0][0] is not lead:
        return None
    reader = getattr(lead, "read_as_view", None)
    view = None if reader is None else reader()
    slot = plan[taken - 1].out_slots[0]
    if (view is None or slot < slot_count or any(slot in p.out_slots for p in plan[taken:])
            or any(source == slot for source, _ in views.values())):
        return None
    return plan[0].slots[0], slot, view, slot - slot_count


def _tokens_binary(plan: list[_Planned]) -> PermutedBinary | None:
    """A permute to the image, one binary op with an image of its shape, the permute back (the
    first three ops of plan), as one pass in token order, the image NHWC-capable; None
    otherwise."""
    first, second, third = plan[:3]
    found = _permute_and_binary(first, second)
    if (found is None or found != ((0, 3, 1, 2), True) or third.op.name != "transpose"
            or third.epilogue is not None or third.slots != second.out_slots
            or permute_layout(third.attrs.get("axes"), len(third.inputs[0].shape))
            != (0, 2, 3, 1)):
        return None
    return PermutedBinary(second.op.name, _binary(second.op.name), 1, (0, 2, 3, 1), (1,))


def _lead_slots(plan: list[_Planned], taken: int) -> tuple[int, ...]:
    """The slots a chain's lead (_layout_lead, running plan's first taken ops) reads and writes:
    the first op's input, a binary op's other operand (_tokens_binary), the last op's output."""
    other = [plan[1].slots[1]] if taken == 3 else []
    return tuple(plan[0].slots + other + plan[taken - 1].out_slots)


def _layout_lead(plan: list[_Planned], first_fused: int) -> tuple[PreparedKernel | None, int]:
    """The kernel running a chain's leading layout op(s) as one copy (kernels/cpu/
    token_layout.py), and how many ops it runs: a tokens <-> image pair, or a permute of an
    image's channels; (None, 0) when the chain starts otherwise or they are in the tail."""
    if first_fused < 1 or plan[0].epilogue is not None or len(plan[0].inputs) != 1:
        return None, 0
    if first_fused >= 3:
        tokens = _tokens_binary(plan)
        if tokens is not None:
            return tokens, 3
    if first_fused >= 2:
        ops = [plan[0].op.name, plan[1].op.name]
        axes = (plan[0] if ops[0] == "transpose" else plan[1]).attrs.get("axes")
        shapes = [plan[0].inputs[0].shape, plan[0].outputs[0].shape, plan[1].outputs[0].shape]
        direction = token_layout(ops, axes, shapes)
        if direction is not None:
            image = shapes[2] if direction == "to_image" else shapes[0]
            n, c, h, w = (int(d) for d in image)
            return TokenLayoutCopy(direction, (n, c, h, w)), 2
    if plan[0].op.name == "transpose":
        axes = permute_layout(plan[0].attrs.get("axes"), len(plan[0].inputs[0].shape))
        if axes is not None:
            return PermuteCopy(axes), 1
    return None, 0


def _fusable_tail(plan: list[_Planned]) -> int:
    """Index of the first op of the elementwise tail worth fusing (len(plan) when none)."""
    start = len(plan)
    while start > 0 and plan[start - 1].op.name in ELEMENTWISE_EXPRS \
            and len(plan[start - 1].outputs) == 1:
        start -= 1
    return start if len(plan) - start >= 2 else len(plan)


def _fuse_epilogue(plan: list[_Planned], slot_count: int,
                   takes: Callable[[_Planned, list[tuple[str, Any]], list[TensorSpec]], int]
                   | None = None) -> list[_Planned]:
    """Merge the add/relu/clip ops right after a conv2d into it: on the CPU its kernel applies
    them to each output block while it is in cache (kernels/conv_epilogue.py), on CUDA cuDNN's
    call applies a bias, a residual and relu (kernels/cuda_cudnn.py).

    The merged step reads the ops' other operands as extra inputs and writes the last op's
    output. takes(head, ops, operands): how many of the leading ops the head's kernel applies
    (CUDA); all of them where None.
    """
    head = plan[0]
    if len(head.outputs) != 1:
        return plan
    spec = head.outputs[0]
    if spec.dtype not in EPILOGUE_DTYPES:
        return plan
    ops: list[tuple[str, Any]] = []
    operands: list[TensorSpec] = []
    slots: list[int] = []
    k = 1
    while k < len(plan):
        p = plan[k]
        name = p.op.name
        if (name not in EPILOGUE_OPS or len(p.outputs) != 1 or not _same_spec(p.outputs[0], spec)
                or not _same_spec(p.inputs[0], spec)):
            break
        if name == "add":
            if len(p.inputs) != 2:
                break
            ops.append(("add", len(operands)))
            operands.append(p.inputs[1])
            slots.append(p.slots[1])
        elif name == "clip":
            ops.append(("clip", (float_attr("clip", p.attrs, "a_min"),
                                 float_attr("clip", p.attrs, "a_max"))))
        elif name == "leaky_relu":
            ops.append((name, float_attr(name, p.attrs, "alpha", 0.01)))
        elif name == "gelu":
            ops.append((name, str_attr(name, p.attrs, "approximate", "none")))
        else:
            ops.append((name, None))
        k += 1
    if takes is not None and ops:
        count = takes(head, ops, operands)
        ops = ops[:count]
        adds = sum(1 for kind, _ in ops if kind == "add")
        operands, slots, k = operands[:adds], slots[:adds], 1 + count
    if k == 1:
        return plan
    last = plan[k - 1]
    merged = _Planned(head.op, head.attrs, head.inputs, last.outputs, head.slots + slots,
                      last.out_slots, ops, operands)
    fused = [merged] + plan[k:]
    # The merged-away intermediates are gone: keep the remaining ones numbered contiguously.
    kept = [p.out_slots[0] for p in fused[:-1] if p.out_slots[0] >= slot_count]
    renumber = {old: slot_count + i for i, old in enumerate(kept)}
    for p in fused:
        p.slots = [renumber.get(i, i) for i in p.slots]
        p.out_slots = [renumber.get(i, i) for i in p.out_slots]
    return fused


def _write_tail_in_place(plan: list[_Planned], slot_count: int) -> None:
    """Let a trailing run of in-place ops (dense, add, relu: the add and relu) work in the output.

    The op before the run writes the node's output directly and each op of the run updates it in
    place, so no intermediate is allocated or streamed through the cache. Remaining
    intermediate slots are renumbered to stay contiguous after the graph's arrays.
    """
    last = plan[-1]
    if len(plan) < 2 or len(last.outputs) != 1:
        return
    out_slot, out_spec = last.out_slots[0], last.outputs[0]
    routed: dict[int, int] = {}
    k = len(plan) - 1
    while k >= 1 and plan[k].op.in_place and _same_spec(plan[k].inputs[0], out_spec):
        routed[plan[k - 1].out_slots[0]] = out_slot
        k -= 1
    if not routed:
        return
    kept = sorted({p.out_slots[0] for p in plan[:-1]} - set(routed))
    routed.update({old: slot_count + i for i, old in enumerate(kept)})
    for p in plan:
        p.slots = [routed.get(i, i) for i in p.slots]
        p.out_slots = [routed.get(i, i) for i in p.out_slots]


def _same_spec(a: TensorSpec, b: TensorSpec) -> bool:
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def _jit_tail(plan: list[_Planned], slot_count: int) -> int:
    """Index of the first op of the CPU tail compiled as one pass (len(plan) when none).

    The tail is the longest run of ops chain_jit compiles at the end of the chain, at least two
    ops (or one gelu, itself several NumPy passes), reshapes included where its inputs allow.
    The op before it then writes the node's output, which the tail updates in place, when the
    shapes agree.
    """
    if not chain_jit.enabled():
        return len(plan)
    start = len(plan)
    while start > 0 and len(plan[start - 1].outputs) == 1 and plan[start - 1].epilogue is None \
            and chain_jit.step_expr(plan[start - 1].op.name, plan[start - 1].attrs,
                                    plan[start - 1].inputs, plan[start - 1].outputs[0].dtype):
        start -= 1
    while start < len(plan) and not chain_jit.tail_ok(
            [p.op.name for p in plan[start:]], _tail_operands(plan[start:])[1], plan[-1].outputs[0]):
        start += 1
    ops = [p.op.name for p in plan[start:] if p.op.name not in chain_jit.VIEWS]
    # One op is worth a compiled pass when it is gelu (several NumPy passes), or a dense's
    # bias: the dense then applies it per output tile, in cache (dense_tiles.py).
    alone = ops == ["gelu"] or (start == 1 and plan[0].op.name == "dense")
    if len(plan) - start < 2 and not alone or not ops:
        return len(plan)
    # a loop run before trailing views (chain_jit.before_views, where the loop is not flat)
    # must not read the output as an input: the output has the views' shape, not the loop's
    views = len(ops) < len(plan) - start
    if start > 0 and _same_spec(plan[start - 1].outputs[0], plan[-1].outputs[0]) and (
            not views or chain_jit.reads_flat(
                [tuple(spec.shape) for spec in _tail_operands(plan[start:])[1]],
                tuple(plan[-1].outputs[0].shape))):
        routed = plan[start - 1].out_slots[0]
        out_slot = plan[-1].out_slots[0]
        for p in plan[start:]:
            p.slots = [out_slot if i == routed else i for i in p.slots]
        plan[start - 1].out_slots = [out_slot]
    return start


def _tail_operands(fused: list[_Planned]
                   ) -> tuple[list[int], list[TensorSpec], list[list[tuple[str, int]]]]:
    """The tail's free slots, their specs, and per step where each operand comes from."""
    kernel_slots: list[int] = []
    kernel_specs: list[TensorSpec] = []
    produced: dict[int, int] = {}  # slot -> index of the tail step computing it
    operands: list[list[tuple[str, int]]] = []
    for k, p in enumerate(fused):
        refs = []
        for spec, slot in zip(p.inputs, p.slots):
            if slot in produced:
                refs.append(("step", produced[slot]))
                continue
            if slot not in kernel_slots:
                kernel_slots.append(slot)
                kernel_specs.append(spec)
            refs.append(("input", kernel_slots.index(slot)))
        operands.append(refs)
        produced[p.out_slots[0]] = k
    return kernel_slots, kernel_specs, operands


def _onednn_tail(calls: list[tuple[Callable[..., None], tuple[int, ...]]], plan: list[_Planned],
                 fused: list[_Planned]) -> tuple[Callable[..., None], tuple[int, ...]] | None:
    """The product's oneDNN matmul applying the tail: its leading steps as bias and post-ops
    (kernels/onednn/matmul_tail.py), the rest compiled and run on each work item's rows; or
    None when the product takes no post-ops (PreparedKernel.post_op_shape: a 2-D oneDNN
    matmul does) or does not write the node's output."""
    if len(calls) != 1 or plan[0].out_slots != fused[-1].out_slots:
        return None
    kernel = capabilities(calls[0][0])
    shape = kernel.post_op_shape()
    if shape is None:
        return None
    slots, specs, refs = _tail_operands(fused)
    out_slot = plan[0].out_slots[0]
    tail = matmul_tail([p.op.name for p in fused], refs, specs, slots.index(out_slot), *shape)
    extra = [slots[i] for i in tail.operands]
    rest = fused[tail.steps:]
    if not rest:
        made = kernel.with_post_ops(tail, len(extra))
        return None if made is None else (made, tuple(plan[0].slots + extra + [out_slot]))
    if tail.steps:  # the rest reads what oneDNN wrote into the output
        done = fused[tail.steps - 1].out_slots[0]
        rest = [replace(p, slots=[out_slot if s == done else s for s in p.slots]) for p in rest]
    after, after_slots = _jit_call(rest)
    extra += [s for s in after_slots[:-1] if s not in extra and s != out_slot]
    merged = plan[0].slots + extra + [out_slot]
    made = kernel.with_post_ops(tail, len(extra), after,
                                tuple(merged.index(s) for s in after_slots))
    return None if made is None else (made, tuple(merged))


def _jit_call(fused: list[_Planned]) -> tuple[Callable[..., None], tuple[int, ...]]:
    """The CPU tail as one compiled pass (kernels/cpu/chain_jit.py)."""
    kernel_slots, kernel_specs, operands = _tail_operands(fused)
    n = len(kernel_specs)
    steps = []
    for p, refs in zip(fused, operands):
        template = chain_jit.step_expr(p.op.name, p.attrs, p.inputs, p.outputs[0].dtype)
        assert template is not None  # _jit_tail checked every step
        steps.append((template, [i if what == "input" else n + i for what, i in refs],
                      p.outputs[0].dtype))
    out_slot = fused[-1].out_slots[0]
    fn = chain_jit.CompiledChain(kernel_specs, fused[-1].outputs[0], steps,
                                 [p.op.name for p in fused],
                                 [i for i, slot in enumerate(kernel_slots) if slot == out_slot])
    return fn, tuple(kernel_slots + fused[-1].out_slots)


def _fused_call(name: str, backend: Backend, device_id: int,
                fused: list[_Planned]) -> tuple[Callable[..., None], tuple[int, ...]]:
    """One generated GPU kernel for an elementwise tail; its inputs are the tail's free slots."""
    kernel_slots, kernel_specs, operands = _tail_operands(fused)
    n = len(kernel_specs)
    # gpu_elementwise numbers values as the kernel's inputs first, then each step's result.
    steps = [(ELEMENTWISE_EXPRS[p.op.name]({**p.attrs, DTYPE_KEY: p.inputs[0].dtype}),
              [i if what == "input" else n + i for what, i in refs], p.outputs[0].dtype)
             for p, refs in zip(fused, operands)]
    fn = gpu_elementwise(backend, device_id, kernel_specs, fused[-1].outputs[0], steps,
                         f"gr_fused_{_c_name(name)}")
    return fn, tuple(kernel_slots + fused[-1].out_slots)


def _c_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:40]


class _Unflattened(Wrapping):
    """With flatten_data the executor passes 1-D views; the kernels get the declared shapes back.

    The wrapped kernel's workspace, cached inputs and worker use carry through (a conv under
    flatten_data still keeps its transformed weight and holds OpenBLAS at one thread); its
    storage requests do not, since the executor never places a flattened entry.
    """

    def __init__(self, run: Callable[..., None], specs: list[TensorSpec]) -> None:
        self.run = run
        self.inner = capabilities(run)
        self.shapes = [tuple(s.shape) for s in specs]

    def __call__(self, *arrays: Any) -> None:
        self.run(*[a if a.shape == shape else a.reshape(shape)
                   for a, shape in zip(arrays, self.shapes)])

"""Specialisation: a graph with symbolic dims made static for one set of input shapes and values.

Every entry's shape comes from the op library's own shape rules (a lib function's `infer`),
node by node from the inputs; where the graph's column names an expression (`"seq*4"`) the rule
must agree with it. A function without a rule (a Python kernel) takes the column's expression.
Storage is planned by liveness for the first shape (graph/storage_plan.py) and kept for every
later one: which entries may share an id depends on their lives, never on their sizes, so each
id is only sized again (a decoder's step plans nothing).
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..device import Device
from ..errors import GraphError, GraphRuntimeError
from ..graph.model import COPY_OP, NOP_OP, Graph, Node, entry_bytes
from ..graph.symbolic import (UNKNOWN, DimError, evaluate, evaluate_shape, format_shape,
                              names_in, shapes_evaluator)
from ..lib.chain import Chain
from ..lib.library import Module, TensorSpec
from ..lib.registry import VALUES_KEY, get_op
from ..lib.symbolic_chain import DIMS_KEY, SymbolicChain
from ..graph.storage_plan import plan_storage

# A function that reads the values of some inputs to decide its output shapes (a deferred ONNX
# node) has `value_inputs` (input positions) and infer_values(inputs, attrs, values, out_dtypes).
ValueInfer = Callable[[Sequence[TensorSpec], Mapping[str, Any], Mapping[int, np.ndarray],
                       Sequence[str]], list[TensorSpec]]


@dataclass(frozen=True)
class InputSig:
    """One graph input as the symbolic graph declares it."""

    name: str
    eid: int
    shape: tuple[Any, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}: {format_shape(self.shape)} {self.dtype}"


class Specializer:
    """Shape inference and storage planning for a symbolic graph (built once per graph and lib)."""

    def __init__(self, graph: Graph, lib: Module, entry_device: Sequence[Device]) -> None:
        self.graph = graph
        self.lib = lib
        self.entry_device = list(entry_device)
        self.inputs = [InputSig(name, eid, tuple(graph.shape(eid)), graph.dtype(eid))
                       for name, eid in graph.input_entries.items()]
        self._dtypes = [graph.dtype(eid) for eid in range(graph.num_entries)]
        self._declared = [tuple(graph.shape(eid)) for eid in range(graph.num_entries)]
        # per entry, per dim: the names its expression reads (parsed once, not per shape)
        self._names: list[list[list[str]]] = [
            [names_in(d) if isinstance(d, str) and d != UNKNOWN else [] for d in s]
            for s in self._declared]
        # per input eid: its axes whose dim is a plain name (which its size binds), and those
        # whose dim is an expression (checked against the names bound)
        self._named_axes: dict[int, list[tuple[int, str]]] = {}
        self._formula_axes: dict[int, list[tuple[int, Any]]] = {}
        for sig in self.inputs:
            named = [names == [d] for d, names in zip(sig.shape, self._names[sig.eid])]
            self._named_axes[sig.eid] = [(axis, d) for axis, d in enumerate(sig.shape)
                                         if named[axis]]
            self._formula_axes[sig.eid] = [(axis, d) for axis, d in enumerate(sig.shape)
                                           if not named[axis] and d != UNKNOWN]
        # per input name: its shape where every dim is a number (a param), which bind checks
        # by one comparison (the full check below names the dim where it differs)
        self._fixed = {sig.name: tuple(sig.shape) for sig in self.inputs
                       if all(isinstance(d, int) for d in sig.shape)}
        self._position = {sig.name: index for index, sig in enumerate(self.inputs)}
        # the inputs whose shapes may change (the others' are fixed: bind refuses another), in
        # the graph's order: a fast inference after another looks at these alone (a decode
        # step's 11 of 60)
        self._unfixed = [sig for sig in self.inputs if sig.name not in self._fixed]
        # (node, input eids, output eids, infer or None, value positions) per kernel node
        self._steps: list[tuple[Any, list[int], list[int], Any, tuple[int, ...]]] = []
        self._reads: list[frozenset[str] | None] = []  # per step (below)
        self._index: tuple[dict[int, list[int]], dict[str, list[int]], list[int]] | None = None
        # _infer_moved's last move (the dims that moved, the inputs given new shapes) and the
        # nodes it asked, in graph order (and as a set), and their shapes at once (_batch)
        self._replay: tuple[tuple[frozenset[str], tuple[int, ...]], list[int],
                            frozenset[int], Any] | None = None
        # the last fast inference: its binding, entry shapes and shape-deciding values (a
        # decode step infers again only the nodes its moved dims reach)
        self._last: tuple[dict[str, int], list[tuple[int, ...]], dict[int, Any]] | None = None
        # Nodes whose function's attrs hold symbolic dims (lib/symbolic_chain.py).
        self._symbolic_nodes: set[int] = set()
        # Nodes whose declared output shapes their function's prepare() checks (see below), with
        # the names those shapes read.
        self._checked_later: dict[int, frozenset[str]] = {}
        # Nodes calling an onnx_region (lib/ops/onnx_region.py) and the values they got last.
        self._region_nodes: set[int] = set()
        self.last_values: dict[int, dict[int, np.ndarray]] = {}
        value_eids: set[int] = set()
        for node in graph.nodes:
            if node.is_arg:
                continue
            in_eids = [graph.entry_id(ref[0], ref[1]) for ref in node.inputs]
            out_eids = list(graph.node_entries(node.nid))
            infer = None
            positions: tuple[int, ...] = ()
            if node.func_name not in (COPY_OP, NOP_OP):
                dev = self.entry_device[out_eids[0]] if out_eids else entry_device[0]
                fn = lib.get_function(node.func_name or "", dev, node.label)
                positions = tuple(getattr(fn, "value_inputs", ()))
                if getattr(fn, "symbolic", False):
                    self._symbolic_nodes.add(node.nid)
                infer = getattr(fn, "infer_values", None) if positions else None
                region = _region_positions(fn)
                if region:
                    # One onnx_region op: its values travel in the node's attrs.
                    positions = region
                    self._region_nodes.add(node.nid)
                if infer is None:
                    infer = getattr(fn, "infer", None)
                value_eids.update(in_eids[p] for p in positions)
                # A chain checks its rule against the declared shapes when prepared: where every
                # output dim is an expression of bound names, infer_shapes(fast=True) takes it.
                if isinstance(fn, (Chain, SymbolicChain)) and not positions and all(
                        d != UNKNOWN for e in out_eids for d in self._declared[e]):
                    self._checked_later[node.nid] = frozenset(
                        name for e in out_eids for names in self._names[e] for name in names)
            self._steps.append((node, in_eids, out_eids, infer, positions))
            # the dim names its outputs' shapes may read besides its inputs' shapes (its
            # declared outputs', and for a function with symbolic attrs those they read); None:
            # its shapes read input values too (inferred again every time)
            reads = {name for e in out_eids for names in self._names[e] for name in names}
            attr_names = getattr(fn, "names", None) if node.nid in self._symbolic_nodes else ()
            self._reads.append(None if positions or attr_names is None
                               else frozenset(reads.union(attr_names)))
        # Graph inputs whose values decide shapes: their values are part of the cache key.
        by_eid = {sig.eid: sig.name for sig in self.inputs}
        self.value_inputs = [by_eid[e] for e in sorted(value_eids) if e in by_eid]
        self._value_eids = value_eids
        self.last_env: dict[str, int] = {}
        # The first static graph's storage ids (checked with its liveness by the executor's
        # placement) and that graph, whose liveness every later one shares.
        self.planned: Graph | None = None

    @property
    def signature(self) -> str:
        """The inputs with their symbolic dims, e.g. `input_ids: (batch, seq) int64`."""
        return "; ".join(str(sig) for sig in self.inputs)

    def bind(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The value of every name the inputs' shapes bind; GraphError naming input and dim."""
        env: dict[str, int] = {}
        where: dict[str, tuple[InputSig, int]] = {}  # (input, axis) that bound each name
        fixed, position = self._fixed, self._position
        # the inputs given a shape that is not their fixed one, in the graph's order (a decode
        # step gives 11 of 60 inputs, the params fixed)
        given = sorted((position[name], shape) for name, shape in shapes.items()
                       if name in position and shape is not None and fixed.get(name) != shape)
        for index, shape in given:
            sig = self.inputs[index]
            if len(shape) != len(sig.shape):
                raise GraphError(f"input {sig.name!r} (eid {sig.eid}): expected rank "
                                 f"{len(sig.shape)} {format_shape(sig.shape)}, got "
                                 f"{tuple(shape)}")
            for axis, want in self._named_axes[sig.eid]:
                got = shape[axis]
                had = env.get(want)
                if had is None:
                    env[want] = int(got)
                    where[want] = (sig, axis)
                elif had != got:
                    first, first_axis = where[want]
                    raise GraphError(
                        f"input {sig.name!r} dim {axis} ({want!r}) is {got} but input "
                        f"{first.name!r} dim {first_axis} set {want} = {had}; inputs that "
                        f"share a dimension name must agree ({self.signature})")
        for index, shape in given:
            sig = self.inputs[index]
            for axis, want in self._formula_axes[sig.eid]:
                got = shape[axis]
                if type(want) is int:  # a number (a decode step's past: 2 heads of 64)
                    value = want
                else:
                    try:
                        value = evaluate(want, env)
                    except DimError as e:
                        raise GraphError(f"input {sig.name!r} dim {axis}: {e}") from e
                if value != got:
                    raise GraphError(f"input {sig.name!r} (eid {sig.eid}) dim {axis}: expected "
                                     f"{want}" + (f" = {value}" if isinstance(want, str) else "")
                                     + f", got {got} (shape {tuple(shape)}; the graph declares "
                                     f"{format_shape(sig.shape)})")
        return env

    def infer_shapes(self, shapes: Mapping[str, tuple[int, ...]],
                     values: Mapping[int, np.ndarray] | None = None,
                     fast: bool = False) -> list[tuple[int, ...]]:
        """Every entry's shape for these input shapes (and shape-deciding values, by eid).

        fast: a chain node whose output dims are all expressions of bound names takes them
        without asking its rule (its prepare() checks them against the rule); a conflict then
        surfaces there, and infer_shapes without fast names it. With fast, a node whose inputs
        keep the shapes of the last fast call and that reads no dim whose value moved keeps its
        outputs' shapes (the same tuples: derive compares them) without asking its rule. An
        input left out of shapes takes its declared shape (a param's, fixed: with fast, the
        last call's tuple)."""
        env = self.bind(shapes)
        values = values or {}
        last = self._last if fast and self._same_values(values) else None
        # after another fast call every entry starts as it was (_infer_moved asks what moved)
        out: list[tuple[int, ...] | None] = [None] * self.graph.num_entries if last is None \
            else list(last[1])
        fixed = self._fixed
        # (a fixed input keeps last time's tuple: bind refused any other shape for it)
        for sig in self.inputs if last is None else self._unfixed:
            shape = shapes.get(sig.name)
            if last is not None and (shape == last[1][sig.eid] if shape is not None
                                     else sig.name in fixed):
                continue  # as last time (out holds its tuple): a param, a decode step's ids
            if shape is not None:
                out[sig.eid] = tuple(map(int, shape))
            else:
                out[sig.eid] = self._evaluate(sig.eid, env, None)
            if last is not None and out[sig.eid] == last[1][sig.eid]:
                out[sig.eid] = last[1][sig.eid]
        if last is not None:
            self._infer_moved(out, last, env, values)
        else:
            for index in range(len(self._steps)):
                self._infer_step(index, out, env, values, fast)
        self.last_env = env
        if fast:  # copies: neither the caller's list nor a value written in place moves them
            self._last = (env, list(out),  # type: ignore[arg-type]
                          {e: np.array(v, copy=True) for e, v in values.items()})
        return out  # type: ignore[return-value]

    def _infer_moved(self, out: list[Any],
                     last: tuple[dict[str, int], list[tuple[int, ...]], dict[int, Any]],
                     env: Mapping[str, int], values: Mapping[int, np.ndarray]) -> None:
        """Fast inference after another (last: its binding and shapes): out holds the last
        shapes with the inputs' new ones; every node whose inputs' shapes came out the same
        and that reads no dim whose value moved keeps its outputs' tuples, and only the others
        are asked, in graph order (a decode step: the ~23 of ~87 its past length reaches),
        each changed output sending on to its readers. The nodes asked are kept with what
        moved (the dims, the inputs): the same move again (a decoder's next length) asks them
        in turn without the worklist, unless an output changes whose readers were not asked."""
        was, before = last[0], last[1]
        moved = frozenset(n for n in env.keys() | was.keys() if env.get(n) != was.get(n))
        pattern = (moved, tuple(sig.eid for sig in self._unfixed
                                if out[sig.eid] is not before[sig.eid]))
        replay = self._replay
        if replay is not None and replay[0] == pattern:
            start = list(out)
            kept = self._at_once(out, before, env, replay)
            if kept is None:
                kept = self._ask_in_turn(out, before, env, values, replay[1], replay[2])
            if kept:
                return
            out[:] = start  # an output changed that the last move left: the worklist
        readers, by_name, always = self._worklist_index()
        pending = list(always)
        for name in moved:
            pending.extend(by_name.get(name, ()))
        for eid in pattern[1]:
            pending.extend(readers.get(eid, ()))
        heapq.heapify(pending)
        done = -1
        asked = []
        while pending:
            index = heapq.heappop(pending)
            if index <= done:
                continue  # asked already (steps run in graph order: readers come later)
            done = index
            asked.append(index)
            for eid in self._ask(index, out, before, env, values):
                for reader in readers.get(eid, ()):
                    heapq.heappush(pending, reader)
        self._replay = (pattern, asked, frozenset(asked), self._batch(asked))

    def _batch(self, asked: list[int]) -> tuple[frozenset[str], list[int], Any] | None:
        """For a replay of asked: where each is a chain whose outputs take their declared
        shapes (infer_shapes' fast path: none reads another's shape), the names they read, their
        outputs and one evaluator of all those shapes; else None."""
        reads: set[str] = set()
        eids: list[int] = []
        for index in asked:
            node, _, out_eids, _, _ = self._steps[index]
            read = self._checked_later.get(node.nid)
            if read is None:
                return None
            reads |= read
            eids.extend(out_eids)
        return frozenset(reads), eids, shapes_evaluator([self._declared[e] for e in eids])

    def _at_once(self, out: list[Any], before: list[tuple[int, ...]], env: Mapping[str, int],
                 replay: tuple) -> bool | None:
        """_ask_in_turn for a replay whose nodes all take declared shapes (_batch), in one
        evaluation: the same answer; None where it does not apply (a dim not an int for env:
        asked in turn, which names it)."""
        batch = replay[3]
        if batch is None or not batch[0].issubset(env):
            return None
        shapes = batch[2](env)
        if shapes is None:
            return None
        readers, covered = self._worklist_index()[0], replay[2]
        for eid, shape in zip(batch[1], shapes):
            was = before[eid]
            if shape == was:
                out[eid] = was
                continue
            out[eid] = shape
            if not covered.issuperset(readers.get(eid, ())):
                return False
        return True

    def _ask(self, index: int, out: list[Any], before: list[tuple[int, ...]],
             env: Mapping[str, int], values: Mapping[int, np.ndarray]) -> list[int]:
        """Step index inferred again into out (fast): its outputs that changed from before;
        one that did not keeps before's tuple (derive compares by identity too)."""
        self._infer_step(index, out, env, values, True)
        changed = []
        for eid in self._steps[index][2]:
            if out[eid] == before[eid]:
                out[eid] = before[eid]
            else:
                changed.append(eid)
        return changed

    def _ask_in_turn(self, out: list[Any], before: list[tuple[int, ...]],
                     env: Mapping[str, int], values: Mapping[int, np.ndarray],
                     asked: list[int], covered: frozenset[int]) -> bool:
        """_infer_moved's nodes of the last same move asked again in graph order; False where
        an output changed whose readers were not all among them."""
        readers = self._worklist_index()[0]
        for index in asked:
            for eid in self._ask(index, out, before, env, values):
                if not covered.issuperset(readers.get(eid, ())):
                    return False
        return True

    def _worklist_index(self) -> tuple[dict[int, list[int]], dict[str, list[int]], list[int]]:
        """For _infer_moved, made once: each entry's reading steps, each dim name's steps
        reading it (their outputs' declared dims or attrs), and the steps always asked (their
        shapes read input values)."""
        if self._index is None:
            readers: dict[int, list[int]] = {}
            by_name: dict[str, list[int]] = {}
            always: list[int] = []
            for index, (_, in_eids, _, _, _) in enumerate(self._steps):
                for eid in in_eids:
                    readers.setdefault(eid, []).append(index)
                reads = self._reads[index]
                if reads is None:
                    always.append(index)
                    continue
                for name in reads:
                    by_name.setdefault(name, []).append(index)
            self._index = (readers, by_name, always)
        return self._index

    def _infer_step(self, index: int, out: list[Any], env: Mapping[str, int],
                    values: Mapping[int, np.ndarray], fast: bool) -> None:
        """Step index's output shapes into out, from its inputs' shapes there."""
        node, in_eids, out_eids, infer, positions = self._steps[index]
        # (a chain: asked first, as most nodes a decode step's new length asks are)
        read = self._checked_later.get(node.nid) if fast else None
        if read is not None and read.issubset(env):
            try:
                for eid in out_eids:
                    out[eid] = evaluate_shape(self._declared[eid], env)
                return
            except DimError:
                pass  # a divisor 0 for these dims: the rule's check below names them
        in_shapes = [out[e] for e in in_eids]
        if node.func_name in (COPY_OP, NOP_OP):
            for k, eid in enumerate(out_eids):
                out[eid] = in_shapes[k] if k < len(in_shapes) else \
                    self._evaluate(eid, env, node)
            return
        if infer is None:
            for eid in out_eids:
                out[eid] = self._evaluate(eid, env, node)
            return
        specs = [TensorSpec(s, self._dtypes[e]) for s, e in  # type: ignore[arg-type]
                 zip(in_shapes, in_eids)]
        dtypes = [self._dtypes[e] for e in out_eids]
        attrs = dict(node.attrs)
        if node.nid in self._symbolic_nodes:
            attrs[DIMS_KEY] = env
        try:
            if node.nid in self._region_nodes:
                given = self._given(node, in_eids, positions, values)
                self.last_values[node.nid] = given
                attrs[VALUES_KEY] = given
                got = infer(specs, attrs, dtypes)
            elif positions:
                got = infer(specs, attrs,
                            {p: values[in_eids[p]] for p in positions
                             if in_eids[p] in values}, dtypes)
            else:
                got = infer(specs, attrs, dtypes)
        except GraphRuntimeError as e:
            raise GraphError(self._conflict(node, env, f"{e}")) from e
        if len(got) != len(out_eids):
            raise GraphError(self._conflict(node, env, f"its rule gives {len(got)} outputs "
                                            f"but the graph declares {len(out_eids)}"))
        for eid, spec in zip(out_eids, got):
            shape = tuple(int(d) for d in spec.shape)
            self._check_declared(node, eid, shape, env)
            out[eid] = shape

    def _same_values(self, values: Mapping[int, np.ndarray]) -> bool:
        """Whether values are the last fast call's (shapes inferred then may be kept)."""
        if self._last is None:
            return False
        was = self._last[2]
        return was.keys() == values.keys() and all(
            np.array_equal(was[e], v) and np.asarray(was[e]).dtype == np.asarray(v).dtype
            for e, v in values.items())

    def _given(self, node: Any, in_eids: Sequence[int], positions: Sequence[int],
               values: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        missing = [p for p in positions if in_eids[p] not in values]
        if missing:
            raise GraphError(f"{self.graph.source}: {node.label} ({node.func_name}): inputs "
                             f"{missing} decide its shapes and must be graph inputs (their "
                             "values are read on the host while specialising)")
        return {p: values[in_eids[p]] for p in positions}

    def _evaluate(self, eid: int, env: Mapping[str, int], node: Any) -> tuple[int, ...]:
        try:
            return tuple(evaluate(d, env) for d in self._declared[eid])
        except DimError as e:
            who = node.label if node is not None else f"input eid {eid}"
            raise GraphError(f"{self.graph.source}: {who} output eid {eid} has shape "
                             f"{format_shape(self._declared[eid])} and no shape rule of its "
                             f"function decides it: {e}") from e

    def _check_declared(self, node: Any, eid: int, shape: tuple[int, ...],
                        env: Mapping[str, int]) -> None:
        declared = self._declared[eid]
        if len(declared) != len(shape):
            raise GraphError(self._conflict(node, env, f"output eid {eid} has rank {len(shape)} "
                                            f"but the graph declares {format_shape(declared)}"))
        for axis, (want, got) in enumerate(zip(declared, shape)):
            if want == UNKNOWN:
                continue
            if any(name not in env for name in self._names[eid][axis]):
                continue  # a name only data decides (bound nowhere): the rule's value stands
            try:
                value = evaluate(want, env)
            except DimError as e:  # a divisor that is 0 for these shapes
                raise GraphError(self._conflict(node, env, f"output eid {eid} dim {axis}: "
                                                f"{e}")) from e
            if value != got:
                raise GraphError(self._conflict(
                    node, env, f"output eid {eid} dim {axis} is {got} but the graph declares "
                    f"{want}" + (f" = {value}" if isinstance(want, str) else "")))

    def _conflict(self, node: Any, env: Mapping[str, int], what: str) -> str:
        bound = ", ".join(f"{k}={v}" for k, v in env.items()) or "no symbolic dims"
        return (f"{self.graph.source}: {node.label} ({node.func_name}) cannot take these input "
                f"shapes ({bound}): {what}")

    def static_graph(self, shapes: list[tuple[int, ...]], env: Mapping[str, int]) -> Graph:
        """The graph with these entry shapes and storage planned for them; nodes calling a
        function with symbolic attrs get the binding env in their attrs."""
        attrs = dict(self.graph.attrs)
        # the shapes as inferred (tuples: untracked by the collector, which a decoder's new
        # shape every step keeps busy; every reader takes any sequence)
        attrs["shape"] = ("list_shape", list(shapes))
        first = self.planned
        if first is None:
            sizes = [entry_bytes(s, d) for s, d in zip(shapes, self._dtypes)]
            attrs["storage_id"] = ("list_int", plan_storage(self.graph, sizes,
                                                            self.entry_device).storage_ids)
        else:  # the same list: runtime/placement.py checks a storage plan once
            attrs["storage_id"] = first.attrs["storage_id"]
        # NOTE: the symbolic graph was validated; only the shape and storage columns change, so
        # the new graph skips the schema (a BERT-size graph's check costs milliseconds).
        nodes = self.graph.nodes
        if self._symbolic_nodes or self._region_nodes:
            # only those nodes are made again (a decode step: ~20 of ~140), each by its fields
            # (dataclasses.replace asks the class for them every call)
            changed = list(nodes)
            bound = dict(env)
            for nid in self._symbolic_nodes:
                changed[nid] = _with_attrs(changed[nid], DIMS_KEY, bound)
            for nid in self._region_nodes:
                changed[nid] = _with_attrs(changed[nid], VALUES_KEY, self.last_values[nid])
            nodes = tuple(changed)
        static = _with_fields(self.graph, attrs=attrs, nodes=nodes)
        if first is None:
            self.planned = static
        else:  # the same nodes, outputs and storage ids: the same lives (a cached property)
            vars(static)["liveness"] = first.liveness
        return static


def _region_positions(fn: Any) -> tuple[int, ...]:
    """The value inputs of a function that is one op whose shapes its input values decide
    (onnx_region: the op registry says which); () for any other."""
    steps = getattr(fn, "steps", None)
    if not steps or len(steps) != 1 or getattr(steps[0], "op", None) is None:
        return ()
    value_inputs = get_op(steps[0].op).value_inputs
    return () if value_inputs is None else value_inputs(steps[0].attrs)


def _with_fields(graph: Graph, **changed: Any) -> Graph:
    """dataclasses.replace(graph, **changed) without its __init__ (a frozen dataclass sets each
    field through object.__setattr__; a decode step makes one graph a token): the fields
    copied, none of the cached properties (they may depend on the fields changed)."""
    made = object.__new__(Graph)
    fields = vars(made)
    for name in _GRAPH_FIELDS:
        fields[name] = changed[name] if name in changed else getattr(graph, name)
    return made


_GRAPH_FIELDS = tuple(f.name for f in dataclasses.fields(Graph))


def _with_attrs(node: Node, key: str, value: Any) -> Node:
    """node with attrs[key] = value (a specialisation's binding or values): its fields copied
    as they are (a frozen dataclass's __init__ sets each through object.__setattr__: ~9 nodes
    at every decode length)."""
    made = object.__new__(Node)
    fields = vars(made)
    fields.update(vars(node))
    fields["attrs"] = {**node.attrs, key: value}
    return made

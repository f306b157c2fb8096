"""ONNX shape inference, run safely: the graph checked first, sizes bounded, in a forked child."""
from __future__ import annotations

import faulthandler
import os
import resource
import select
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FrontendError
from .ir import Unsupported
from .onnx_model import MAX_INPUT_ELEMENTS, checked_dims
from .onnx_node import check_node
from .tensor_data import elem_dtype, element_count

# ONNX's data propagation holds 70-140 bytes per element of each 1-D or integer tensor it follows
# (Add, Gather...), so it runs only while every such input and initializer is at most this large.
DATA_PROP_ELEMENTS = 1 << 16
# Shape inference runs in a forked child (_infer_in_child) with these limits: a model whose
# inference needs more is refused, not left to take the importing process down.
INFERENCE_SECONDS = 60.0
INFERENCE_MEMORY = 4 << 30


def check_references(model: Any, name: str) -> None:
    """Every node matches its op's schema (check_node), and every node input names a graph
    input, an initializer or an earlier node's output.

    NOTE: onnx's C++ shape inference dereferences an undefined input (EyeLike, RegexFullMatch)
    and kills the interpreter, so this runs first.
    """
    opsets = {("" if e.domain == "ai.onnx" else e.domain): int(e.version)
              for e in model.opset_import}
    if not model.graph.output:
        raise FrontendError(f"{name}: the graph has no outputs; expected at least one (a model "
                            "computes nothing without them)")
    _check_graph(model.graph, set(), f"{name}: graph", opsets)
    for f in model.functions:
        inner = {**opsets, **{("" if e.domain == "ai.onnx" else e.domain): int(e.version)
                              for e in f.opset_import}}
        _check_nodes(f.node, set(f.input), f"{name}: function {f.name!r}", inner)


def _check_graph(graph: Any, outer: set[str], where: str, opsets: Mapping[str, int]) -> None:
    inputs: set[str] = set()
    for k, inp in enumerate(graph.input):
        if inp.name in inputs:
            raise FrontendError(f"{where} input {k} {inp.name!r} is declared twice; expected "
                                "each input once")
        inputs.add(inp.name)
    defined = outer | inputs  # a subgraph's input may shadow a value outside (not its nodes)
    defined.update(t.name for t in graph.initializer)
    defined.update(s.values.name for s in graph.sparse_initializer)
    _check_nodes(graph.node, defined, where, opsets)
    for k, out in enumerate(graph.output):
        if out.name not in defined:
            raise FrontendError(f"{where} output {k} {out.name!r} is not defined: no input, "
                                "initializer or node output has that name")


def _check_nodes(nodes: Any, defined: set[str], where: str, opsets: Mapping[str, int]) -> None:
    for nid, node in enumerate(nodes):
        label = f"{where} node {nid} {node.name!r} ({node.op_type})"
        try:
            check_node(node, opsets)
        except Unsupported as e:
            raise FrontendError(f"{label}: {e}") from None
        for k, name in enumerate(node.input):
            if name and name not in defined:
                raise FrontendError(f"{label} input {k} {name!r} is not defined: no input, "
                                    "initializer or earlier node output has that name")
        for a in node.attribute:
            subgraphs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
            for sub in subgraphs:
                _check_graph(sub, defined, f"{label} attribute {a.name!r}", opsets)
        for k, name in enumerate(node.output):
            if name in defined:
                # NOTE: ONNX assigns each name once; a second writer would replace the value.
                raise FrontendError(f"{label} output {k} {name!r} is already defined (an "
                                    "input, initializer or earlier node output)")
            if name:
                defined.add(name)


def check_shapes(model: Any, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The given shapes, checked, and every declared graph input dim within bounds."""
    checked = {name: checked_dims(name, dims) for name, dims in shapes.items()}
    for inp in model.graph.input:
        tt = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape") or inp.name in checked:
            continue
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and not 0 <= d.dim_value <= MAX_INPUT_ELEMENTS:
                raise FrontendError(f"input {inp.name!r} dim {i}: the model declares "
                                    f"{d.dim_value}; expected a size from 0 to "
                                    f"{MAX_INPUT_ELEMENTS}")
    return checked


def data_prop_safe(proto: Any) -> bool:
    """Whether ONNX's data propagation stays small: no large 1-D (or integer) input."""
    from onnx import TensorProto
    ints = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
            TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8}
    for inp in proto.graph.input:
        tt = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        if tt.elem_type not in ints and len(tt.shape.dim) > 1:
            continue  # data propagation follows shape-like tensors: 1-D, or integers
        count = 1
        for d in tt.shape.dim:
            count *= d.dim_value if d.HasField("dim_value") else DATA_PROP_ELEMENTS
        if count > DATA_PROP_ELEMENTS:
            return False
    return all(_constant_elements(node) <= DATA_PROP_ELEMENTS for node in proto.graph.node
               if node.op_type == "Constant")


def _constant_elements(node: Any) -> int:
    """How many elements a Constant node's value holds (a sparse one densified, as onnx does)."""
    count = 0
    for a in node.attribute:
        dims = list(a.t.dims) if a.HasField("t") else list(a.sparse_tensor.dims) \
            if a.HasField("sparse_tensor") else [len(a.ints) + len(a.floats) + len(a.strings)]
        size = 1
        for d in dims:
            size *= abs(d)
        count += size
    return count


def clean_dims(values: Any) -> None:
    """Forget declared dims outside 0..MAX_INPUT_ELEMENTS in value_info/outputs (hints only)."""
    for vi in values:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        if any(d.HasField("dim_value") and not 0 <= d.dim_value <= MAX_INPUT_ELEMENTS
               for d in tt.shape.dim):
            tt.ClearField("shape")


def inferred_types(model: Any, shapes: Mapping[str, Sequence[int]],
                   name: str = "model") -> dict[str, Any]:
    """TypeProto per value from ONNX shape inference, with the given input shapes pinned."""
    import onnx
    proto = onnx.ModelProto()
    proto.ir_version = model.ir_version
    proto.opset_import.extend(model.opset_import)
    proto.functions.extend(model.functions)
    graph = proto.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)  # types only: the initializers' data stays behind
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    clean_dims(graph.output)
    clean_dims(graph.value_info)
    for inp in model.graph.input:
        added = graph.input.add()
        added.CopyFrom(inp)
        if inp.name in shapes and added.type.HasField("tensor_type"):
            dims = added.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[inp.name]:
                dims.add().dim_value = int(d)
    declared = {i.name for i in graph.input}
    stored = [(t.name, t) for t in model.graph.initializer]
    stored += [(s.values.name, s) for s in model.graph.sparse_initializer]
    for name, t in stored:
        if name not in declared:
            graph.input.append(_stored_type(name, t))
    inferred = _infer_in_child(proto, data_prop_safe(proto), name)
    g = inferred.graph
    return {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)}


def static_specs(types: Mapping[str, Any]) -> dict[str, tuple]:
    """(shape, elem type) of the values whose inferred shape is fully static."""
    out: dict[str, tuple] = {}
    for name, tp in types.items():
        tt = tp.tensor_type if tp.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            out[name] = (tuple(int(d.dim_value) for d in tt.shape.dim), tt.elem_type)
    return out


def _stored_type(name: str, tensor: Any) -> Any:
    """The ValueInfo of an initializer (dense or sparse); an invalid type or dims left out."""
    from onnx import TensorProto, helper
    elem, dims = tensor.data_type if hasattr(tensor, "data_type") else \
        tensor.values.data_type, list(tensor.dims)
    try:
        elem_dtype(elem, name)
    except Unsupported:
        elem = TensorProto.FLOAT
    try:
        element_count(dims, name)
        shape: list[int] | None = dims if max(dims, default=0) <= MAX_INPUT_ELEMENTS else None
    except Unsupported:
        shape = None
    return helper.make_tensor_value_info(name, elem, shape)


def _infer_in_child(proto: Any, data_prop: bool, name: str) -> Any:
    """onnx's shape inference on proto in a forked child, so that a crash in its C++ (past ones:
    a node reading an undefined name, an axis past int32) or a runaway is a refusal naming the
    model, not the end of this process. A failure it raises leaves the types as declared."""
    import onnx
    from onnx import shape_inference  # imported here: a child must take no import lock
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: infer, send the bytes (or nothing on an exception), exit at once
        os.close(read_fd)
        code = 0
        faulthandler.disable()  # a crash here is reported by the parent, in one line
        try:
            _limit_memory(INFERENCE_MEMORY)
            out = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=data_prop)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(out.SerializeToString())
        except BaseException:  # noqa: BLE001  (the parent keeps the declared types)
            code = 1
        os._exit(code)
    os.close(write_fd)
    data = _read_with_deadline(read_fd, pid, name)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signal_name = _signal_name(os.WTERMSIG(status))
        raise FrontendError(f"{name}: onnx's shape inference crashed on this model "
                            f"({signal_name}); the model is malformed in a way onnx does not check")
    if os.WEXITSTATUS(status) != 0 or not data:
        return proto
    inferred = onnx.ModelProto()
    inferred.ParseFromString(data)
    return inferred


def _limit_memory(extra: int) -> None:
    """Cap this (child) process's address space at what it maps now plus extra bytes, within
    any cap already set: a fork inherits the parent's mappings, which may be large."""
    mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + extra
    for limit in (soft, hard):
        if limit != resource.RLIM_INFINITY:
            cap = min(cap, limit)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _read_with_deadline(fd: int, pid: int, name: str) -> bytes:
    """Everything the child writes, or a FrontendError (the child killed) past the deadline."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + INFERENCE_SECONDS
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pipe], [], [], max(left, 0.0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise FrontendError(f"{name}: onnx's shape inference ran past "
                                    f"{INFERENCE_SECONDS:.0f} s on this model; refused")
            chunk = pipe.read(1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

"""Reading an ONNX model: the file and its external data, opsets, node attributes, value types."""
from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrontendError
from .ir import MAX_RANK, RUNTIME_DTYPES, TooLarge, Unsupported

INSTALL_HINT = "pip install graph_runtime[onnx]"


def require_onnx() -> Any:
    """The onnx package, or a FrontendError saying how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise FrontendError(f"importing ONNX models needs the onnx package: {INSTALL_HINT} "
                            f"({e})") from e
    return onnx


def load_model(model: Any, base_dir: str | os.PathLike[str] | None = None) -> tuple[Any, str]:
    """(ModelProto with its external data loaded, a name for messages) from a proto or a path.

    External data is read only from regular files inside the model's folder (base_dir for a
    ModelProto; without one, a ModelProto with external data is refused). A given ModelProto is
    copied before its external data is filled in, never changed.
    """
    onnx = require_onnx()
    from .external_data import has_external_data, load_external_data
    if isinstance(model, onnx.ModelProto):
        proto, name = model, "<model>"
        folder = None if base_dir is None else Path(base_dir)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FrontendError(f"ONNX model {str(path)!r} does not exist")
        proto = _parse(path)
        name = path.name
        folder = path.parent if base_dir is None else Path(base_dir)
    else:
        raise FrontendError(f"from_onnx: expected an onnx.ModelProto or a path, got "
                            f"{type(model).__name__}")
    try:
        check_text(proto, name)
        if name == "<model>":
            name = proto.graph.name or name
        if has_external_data(proto):
            if proto is model:
                proto = onnx.ModelProto()
                proto.CopyFrom(model)
            load_external_data(proto, folder)
        check_stored_sizes(proto, name)
        check_dtype_attributes(proto, name)
    except RecursionError:
        raise FrontendError(f"{name}: subgraphs nested too deeply") from None
    check_opsets(proto, name)
    check_unique_names(proto, name)
    return proto, name


def check_unique_names(model: Any, name: str) -> None:
    """Refuse a graph input or initializer name declared twice (which one would a read take?)."""
    graph = model.graph
    for kind, names in (("input", [i.name for i in graph.input]),
                        ("initializer", [t.name for t in graph.initializer] +
                         [s.values.name for s in graph.sparse_initializer])):
        seen: set[str] = set()
        for k, value in enumerate(names):
            if value in seen:
                raise FrontendError(f"{name}: graph {kind} {k} {value!r} is declared twice; "
                                    f"expected one {kind} per name")
            seen.add(value)


def check_stored_sizes(model: Any, name: str) -> None:
    """Refuse a tensor (initializer, attribute, in any subgraph or function) whose dims x element
    type need more or less data than it holds: before ONNX shape inference, which would take
    a 473-byte model's [1e12] initializer at its word."""
    from .external_data import model_tensors
    from .tensor_data import check_stored, elem_dtype
    for where, tensor in model_tensors(model):
        try:
            dtype = elem_dtype(tensor.data_type, where)
        except Unsupported:
            continue  # an element type the runtime lacks: refused where it is read
        try:
            check_stored(tensor, dtype, where)
        except TooLarge:
            continue  # too many dims: refused where it is read
        except Unsupported as e:
            raise FrontendError(f"{name}: {e}") from None


# Attributes naming an element type, by op: onnx's shape inference takes them at their word (a
# Cast to 2147483647 drove its child to the 4 GiB cap for 5 s per inference).
_DTYPE_ATTRIBUTES = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype",
                     "RandomUniform": "dtype", "RandomNormalLike": "dtype",
                     "RandomUniformLike": "dtype", "Multinomial": "dtype", "Bernoulli": "dtype",
                     "QuantizeLinear": "output_dtype", "DequantizeLinear": "output_dtype"}


def check_dtype_attributes(model: Any, name: str) -> None:
    """Refuse, before shape inference, an element-type attribute that names no ONNX type, and
    an op of ONNX's own domain that no opset defines (nor a local function): onnx's inference
    ran to its 4 GiB cap for 5 s on a Loop body holding one."""
    from onnx import TensorProto, defs
    known = set(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}
    functions = {(f.domain, f.name) for f in model.functions}
    unknown: dict[str, list[str]] = {}
    for where, node in _model_nodes(model):
        if node.domain in ("", "ai.onnx") and not defs.has(node.op_type) \
                and (node.domain, node.op_type) not in functions:
            unknown.setdefault(node.op_type[:80], []).append(where)
        key = _DTYPE_ATTRIBUTES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        for a in node.attribute:
            if a.name == key and a.type == a.INT and a.i not in known and \
                    not (a.i == 0 and key == "output_dtype"):  # 0: "as the scale's" there
                raise FrontendError(f"{name}: {where} ({node.op_type}) attribute {key!r} is "
                                    f"{a.i}; expected an ONNX element type (1 float, 7 int64, "
                                    "... TensorProto.DataType)")
    if unknown:
        listed = "; ".join(f"op type {op!r} is not supported ({', '.join(places[:3])}"
                           f"{f' and {len(places) - 3} more' if len(places) > 3 else ''})"
                           for op, places in unknown.items())
        raise FrontendError(f"{name}: {len(unknown)} op type(s) no ONNX opset defines: {listed}")


def _model_nodes(model: Any) -> Iterator[tuple[str, Any]]:
    """(where, NodeProto) for every node: the graph's, its subgraphs', local functions'."""
    def walk(nodes: Any, where: str) -> Iterator[tuple[str, Any]]:
        for i, node in enumerate(nodes):
            label = f"{where} node {i} {node.name or node.op_type!r}"
            yield label, node
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from walk(g.node, f"{label} attribute {a.name!r}")
    yield from walk(model.graph.node, "graph")
    for f in model.functions:
        yield from walk(f.node, f"function {f.name!r}")


def _parse(path: Path) -> Any:
    import onnx
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FrontendError(f"{path}: cannot read the ONNX model: {e.strerror or e}") from None
    try:
        return onnx.ModelProto.FromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and its relatives
        raise FrontendError(f"{path}: not an ONNX model (protobuf: {type(e).__name__}: "
                            f"{str(e)[:200]})") from None


def check_text(message: Any, where: str) -> None:
    """Refuse a string field holding invalid UTF-8 (protobuf hands it over as bytes)."""
    from google.protobuf.descriptor import FieldDescriptor
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            values = value if _is_repeated(field) else [value]
            for i, v in enumerate(values):
                if not isinstance(v, str):
                    at = f"{where}.{field.name}" + (f"[{i}]" if _is_repeated(field) else "")
                    raise FrontendError(f"{at}: expected UTF-8 text, got bytes {bytes(v)[:60]!r} "
                                        "(not valid UTF-8)")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if _is_repeated(field):
                for i, item in enumerate(value):
                    check_text(item, f"{where}.{field.name}[{i}]")
            else:
                check_text(value, f"{where}.{field.name}")


def _is_repeated(field: Any) -> bool:
    # NOTE: protobuf 6+ has is_repeated; older versions only label.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def check_opsets(model: Any, name: str) -> None:
    """Refuse opset versions outside what the installed onnx package knows, and a domain
    imported at two versions (also as '' and 'ai.onnx', one domain spelled two ways)."""
    from onnx import defs
    newest = defs.onnx_opset_version()
    lists = [(name, model.opset_import)]
    lists += [(f"{name}: function {f.name!r}", f.opset_import) for f in model.functions]
    for where, entries in lists:
        seen: dict[str, Any] = {}
        for entry in entries:
            top = newest if entry.domain in ("", "ai.onnx") else 2 ** 31 - 1
            if not 1 <= entry.version <= top:
                raise FrontendError(f"{where}: opset_import domain {entry.domain!r} version "
                                    f"{entry.version}; expected 1 to {top}")
            domain = "" if entry.domain == "ai.onnx" else entry.domain
            first = seen.setdefault(domain, entry)
            if first.version != entry.version:
                raise FrontendError(f"{where}: opset_import gives domain {first.domain!r} "
                                    f"version {first.version} and {entry.domain!r} version "
                                    f"{entry.version}; expected one version per domain ('' "
                                    "and 'ai.onnx' are the same domain)")


def default_opset(model: Any) -> int:
    """The version of the default ('' / ai.onnx) operator set the model imports."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def np_dtype(elem_type: int) -> str:
    """The NumPy dtype name of an ONNX TensorProto element type, if the runtime can hold it."""
    from onnx import TensorProto, helper
    name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() \
        else str(elem_type)
    try:
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except Exception:  # noqa: BLE001
        raise Unsupported(f"dtype {name} is not supported") from None
    if dtype not in RUNTIME_DTYPES:
        raise Unsupported(f"dtype {name} is not supported; supported: "
                          + ", ".join(RUNTIME_DTYPES))
    return dtype


# Graph inputs may declare at most this many elements (an int64 input that large would already
# need 8 TiB); checked before ONNX shape inference sees the declared sizes.
MAX_INPUT_ELEMENTS = 1 << 40


def tensor_shape(type_proto: Any, name: str, given: Mapping[str, Sequence[int]]) -> tuple:
    """The concrete shape of a graph input: its static dims, or the shape given for it."""
    if not type_proto.HasField("tensor_type"):
        raise Unsupported(f"input {name!r} is not a tensor")
    tt = type_proto.tensor_type
    if name in given:
        shape = checked_dims(name, given[name])
        if tt.HasField("shape"):
            dims = tt.shape.dim
            if len(dims) != len(shape):
                raise FrontendError(f"shape for input {name!r}: the model gives rank {len(dims)} "
                                    f"({_dims_text(dims)}), got {list(shape)}")
            for i, (d, want) in enumerate(zip(dims, shape)):
                if d.HasField("dim_value") and d.dim_value != want:
                    raise FrontendError(f"shape for input {name!r}: dim {i} is fixed at "
                                        f"{d.dim_value} in the model, got {want}")
        return shape
    if not tt.HasField("shape"):
        raise Unsupported(f"input {name!r} has no shape; give one, e.g. shape={{{name!r}: "
                          f"(1, 3, 224, 224)}} or --shape {name}=1,3,224,224")
    dims = tt.shape.dim
    if all(d.HasField("dim_value") for d in dims):
        return checked_dims(name, [d.dim_value for d in dims], "declared shape")
    example = ",".join(str(d.dim_value) if d.HasField("dim_value") else "N" for d in dims)
    raise Unsupported(f"input {name!r} has symbolic dims ({_dims_text(dims)}); give concrete "
                      f"ones: shape={{{name!r}: (...)}} or --shape {name}={example}")


def checked_dims(name: str, dims: Any, source: str = "shape given") -> tuple[int, ...]:
    """dims as a tuple of sizes >= 0 whose product is at most MAX_INPUT_ELEMENTS."""
    try:
        shape = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise FrontendError(f"{source} for input {name!r}: expected integer sizes, got "
                            f"{list(dims)[:8]!r}") from None
    if len(shape) > MAX_RANK:
        raise FrontendError(f"{source} for input {name!r}: {len(shape)} dims; expected at most "
                            f"{MAX_RANK} (the graph format's limit)")
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise FrontendError(f"{source} for input {name!r}: {list(shape)}; expected sizes >= 0 "
                            f"with at most {MAX_INPUT_ELEMENTS} elements in all")
    return shape


def _dims_text(dims: Any) -> str:
    return ", ".join(str(d.dim_value) if d.HasField("dim_value") else
                     (d.dim_param or "?") for d in dims)

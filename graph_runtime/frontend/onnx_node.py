"""One ONNX node decoded: checked against its op's schema, attributes as Python and NumPy values."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ir import Unsupported


@dataclass
class OnnxNode:
    """One ONNX node with its attributes decoded and the opset version of its domain."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    domain: str
    opset: int
    proto: Any

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def ints(self, name: str, default: Sequence[int] | None = None) -> list[int]:
        """An ints attribute; without a default, a missing one is refused."""
        value = self.attrs.get(name)
        if value is None:
            if default is None:
                raise Unsupported(f"missing attribute {name!r}")
            return list(default)
        return [int(v) for v in value]

    def opt_ints(self, name: str) -> list[int] | None:
        value = self.attrs.get(name)
        return None if value is None else [int(v) for v in value]

    @property
    def label(self) -> str:
        return self.name or f"<{self.op_type} -> {', '.join(self.outputs)}>"


def decode_node(proto: Any, opsets: Mapping[str, int]) -> OnnxNode:
    """An OnnxNode from a NodeProto: its inputs, outputs and attributes checked against the op's
    schema, tensors decoded to arrays (checked), text decoded from UTF-8."""
    check_node(proto, opsets)
    attrs: dict[str, Any] = {}
    for a in proto.attribute:
        attrs[a.name] = _attribute(a)
    domain = proto.domain if proto.domain != "ai.onnx" else ""
    return OnnxNode(proto.op_type, proto.name, list(proto.input), list(proto.output), attrs,
                    domain, int(opsets.get(domain, 1)), proto)


# Attributes that must equal the node's output count (ONNX's C++ inference indexes by them).
_OUTPUT_COUNT_ATTRS = {"Split": "num_outputs"}


def check_node(proto: Any, opsets: Mapping[str, int]) -> Any:
    """The op's schema (None for an op onnx does not know) after checking the node against it:
    input/output counts, omitted required inputs, attribute names, types and required ones."""
    from onnx import defs
    domain = proto.domain if proto.domain != "ai.onnx" else ""
    version = int(opsets.get(domain, 1))
    try:
        schema: Any = defs.get_schema(proto.op_type, version, domain)
    except Exception:  # noqa: BLE001 - SchemaError: an op this onnx does not know
        if defs.has(proto.op_type, domain):
            # NOTE: an op newer than the model's opset has no schema there to check it against.
            since = _first_version(proto.op_type, domain, version)
            raise Unsupported(f"op {proto.op_type} is not in opset {version} of domain "
                              f"{domain or 'ai.onnx'!r}; it exists from opset {since}") from None
        return None
    _check_arity(proto, schema)
    given = set()
    for a in proto.attribute:
        spec = schema.attributes.get(a.name)
        if spec is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise Unsupported(f"unknown attribute {a.name!r}; {schema.name}-"
                              f"{schema.since_version} has: {known}")
        if int(spec.type) != int(a.type):
            raise Unsupported(f"attribute {a.name!r}: expected {spec.type.name}, got "
                              f"{_type_name(a.type)}")
        given.add(a.name)
    for name, spec in schema.attributes.items():
        if spec.required and name not in given:
            raise Unsupported(f"missing required attribute {name!r}")
    for a in proto.attribute:
        # NOTE: before ONNX shape inference, whose Einsum equation parser hangs on bad UTF-8.
        for i, text in enumerate([a.s] if a.type == a.STRING else list(a.strings)):
            _text(text, f"attribute {a.name!r}" + (f" item {i}" if a.type == a.STRINGS else ""))
        values = [a.i] if a.type == a.INT else list(a.ints)
        if a.name in ("axis", "axes") and any(not -2 ** 31 <= v < 2 ** 31 for v in values):
            # NOTE: onnx's C++ inference (LayerNormalization) crashes on an axis past int32.
            raise Unsupported(f"attribute {a.name!r} is {values[:8]}; expected axes of a tensor")
    count_attr = _OUTPUT_COUNT_ATTRS.get(proto.op_type)
    for a in proto.attribute:
        if a.name == count_attr and a.i != len(proto.output):
            raise Unsupported(f"attribute {a.name!r} is {a.i}; expected {len(proto.output)}, "
                              "the node's output count")
    return schema


def _first_version(op_type: str, domain: str, after: int) -> int:
    """The first opset version past after where onnx defines op_type."""
    from onnx import defs
    latest = int(defs.get_schema(op_type, domain).since_version)
    for version in range(after + 1, latest):
        try:
            return int(defs.get_schema(op_type, version, domain).since_version)
        except Exception:  # noqa: BLE001 - SchemaError: not defined yet at version
            continue
    return latest


def _check_arity(proto: Any, schema: Any) -> None:
    """Input and output counts within the schema's, and no required input omitted ('')."""
    from onnx.defs import OpSchema
    for kind, names, low, high in (("inputs", proto.input, schema.min_input, schema.max_input),
                                   ("outputs", proto.output, schema.min_output,
                                    schema.max_output)):
        if not low <= len(names) <= high:
            wanted = f"{low}" if low == high else f"{low} to {high}"
            raise Unsupported(f"{len(names)} {kind}; expected {wanted}")
    params = list(schema.inputs)
    for i, name in enumerate(proto.input):
        if name or not params:
            continue
        param = params[min(i, len(params) - 1)]
        if param.option != OpSchema.FormalParameterOption.Optional:
            raise Unsupported(f"input {i} ({param.name}) is omitted (''); it is required")


def _attribute(a: Any) -> Any:
    """One attribute's value (its type already checked against the schema by check_node)."""
    from onnx import AttributeProto, helper

    from .tensor_data import sparse_to_dense, to_array
    if a.ref_attr_name:
        raise Unsupported(f"attribute {a.name!r} refers to a function attribute")
    type_name = _type_name(a.type)
    where = f"attribute {a.name!r}"
    if a.type == AttributeProto.TENSOR:
        return to_array(a.t, where)
    if a.type == AttributeProto.TENSORS:
        return [to_array(t, where) for t in a.tensors]
    if a.type == AttributeProto.SPARSE_TENSOR:
        return sparse_to_dense(a.sparse_tensor, where)
    if a.type == AttributeProto.SPARSE_TENSORS:
        return [sparse_to_dense(t, where) for t in a.sparse_tensors]
    if a.type == AttributeProto.STRING:
        return _text(a.s, where)
    if a.type == AttributeProto.STRINGS:
        return [_text(v, f"{where} item {i}") for i, v in enumerate(a.strings)]
    if a.type == AttributeProto.UNDEFINED or type_name == str(a.type):
        raise Unsupported(f"{where}: attribute type {type_name} is not a known type")
    return helper.get_attribute_value(a)


def _type_name(number: int) -> str:
    from onnx import AttributeProto
    kinds = AttributeProto.AttributeType
    return str(kinds.Name(number)) if number in kinds.values() else str(number)


def _text(value: bytes, where: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unsupported(f"{where}: expected UTF-8 text, got bytes {value[:60]!r} ({e.reason} "
                          f"at byte {e.start})") from None

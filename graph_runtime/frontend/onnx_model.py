"""Reading an ONNX model: the file and its external data, opsets, node attributes, value types."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrontendError
from .ir import RUNTIME_DTYPES, Unsupported

INSTALL_HINT = "pip install graph_runtime[onnx]"


def require_onnx() -> Any:
    """The onnx package, or a FrontendError saying how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise FrontendError(f"importing ONNX models needs the onnx package: {INSTALL_HINT} "
                            f"({e})") from e
    return onnx


def load_model(model: Any) -> tuple[Any, str]:
    """(ModelProto with its external data loaded, a name for messages) from a proto or a path."""
    onnx = require_onnx()
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "<model>"
    if not isinstance(model, (str, os.PathLike)):
        raise FrontendError(f"from_onnx: expected an onnx.ModelProto or a path, got "
                            f"{type(model).__name__}")
    path = Path(model)
    if not path.is_file():
        raise FrontendError(f"ONNX model {str(path)!r} does not exist")
    try:
        # NOTE: onnx.load reads external data files relative to the model's folder.
        proto = onnx.load(str(path), load_external_data=True)
    except Exception as e:
        raise FrontendError(f"{path}: cannot read the ONNX model: {type(e).__name__}: {e}") from e
    return proto, path.name


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


def onnx_elem_type(dtype: str) -> int:
    from onnx import helper
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


@dataclass
class Node:
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


def decode_node(proto: Any, opsets: Mapping[str, int]) -> Node:
    """A Node from a NodeProto: tensors become arrays, bytes become str."""
    from onnx import helper, numpy_helper
    attrs: dict[str, Any] = {}
    for a in proto.attribute:
        if a.ref_attr_name:
            raise Unsupported(f"attribute {a.name!r} refers to a function attribute")
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        elif a.type == a.TENSOR:
            value = numpy_helper.to_array(value)
        attrs[a.name] = value
    domain = proto.domain if proto.domain != "ai.onnx" else ""
    return Node(proto.op_type, proto.name, list(proto.input), list(proto.output), attrs, domain,
                int(opsets.get(domain, 1)), proto)


def tensor_shape(type_proto: Any, name: str, given: Mapping[str, Sequence[int]]) -> tuple:
    """The concrete shape of a graph input: its static dims, or the shape given for it."""
    if not type_proto.HasField("tensor_type"):
        raise Unsupported(f"input {name!r} is not a tensor")
    tt = type_proto.tensor_type
    if name in given:
        shape = tuple(int(d) for d in given[name])
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
        return tuple(int(d.dim_value) for d in dims)
    example = ",".join(str(d.dim_value) if d.HasField("dim_value") else "N" for d in dims)
    raise Unsupported(f"input {name!r} has symbolic dims ({_dims_text(dims)}); give concrete "
                      f"ones: shape={{{name!r}: (...)}} or --shape {name}={example}")


def _dims_text(dims: Any) -> str:
    return ", ".join(str(d.dim_value) if d.HasField("dim_value") else
                     (d.dim_param or "?") for d in dims)

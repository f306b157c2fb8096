"""Op attribute parsing: typed getters for graph-JSON attrs and the errors that name them."""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import LibraryError

# Keys a graph node carries for the executor, never for the op; op attr checks skip them.
NODE_KEYS = frozenset({"func_name", "num_inputs", "num_outputs", "flatten_data", "hash",
                       "device_index", "device_id", "device_type"})
# The chain sets this for its last op so an op like cast can learn the dtype the graph declares.
OUT_DTYPE_KEY = "__out_dtype"
# ... and the number of outputs the graph node declares (batch_norm: 1 or 3).
NUM_OUTPUTS_KEY = "__num_outputs"
# Elementwise expression functions find the dtype of the op's input 0 under this key.
DTYPE_KEY = "__dtype"
# The executor passes the bytes left under the device's memory cap: a kernel refuses workspace
# beyond it before allocating (chain intermediates; runtime/executor.py checks after prepare).
WORKSPACE_LIMIT_KEY = "__workspace_limit"
_REQUIRED: Any = object()


# -- errors -------------------------------------------------------------------------------------

def op_error(op: str, message: str) -> LibraryError:
    """A LibraryError whose message starts with the op name."""
    return LibraryError(f"{op}: {message}")


def attr_error(op: str, name: str, value: Any, expected: str) -> LibraryError:
    """LibraryError like `transpose: attribute 'axes' = (0, 5): expected axes below rank 3`."""
    return LibraryError(f"{op}: attribute {name!r} = {short_repr(value)}: expected {expected}")


def short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) cut to limit characters: an attribute may be huge, a message must not be."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 5] + " ...]"


# -- attributes ---------------------------------------------------------------------------------

def parse_value(value: Any) -> Any:
    """A JSON value, or the string form graph JSON uses ("2", "[1, 1]", "(1, 1)", "None")."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in ("None", "none", "null", ""):
        return None
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    try:
        return json.loads(text.replace("(", "[").replace(")", "]").replace(",]", "]"))
    except ValueError:
        return value


def _get(op: str, attrs: Mapping[str, Any], name: str, default: Any) -> Any:
    if name in attrs:
        return parse_value(attrs[name])
    if default is _REQUIRED:
        raise op_error(op, f"missing required attribute {name!r}")
    return default


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _typed(op: str, attrs: Mapping[str, Any], name: str, default: Any,
           ok: Callable[[Any], bool], expected: str, convert: Callable[[Any], Any]) -> Any:
    """attrs[name] parsed, checked with ok and converted; default as is when name is absent."""
    value = _get(op, attrs, name, default)
    if name not in attrs:
        return value
    if not ok(value):
        raise attr_error(op, name, value, expected)
    return convert(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def int_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """An integer attribute (default returned as is when absent)."""
    return _typed(op, attrs, name, default, _is_int, "an integer", int)


def float_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """A number attribute, as float."""
    return _typed(op, attrs, name, default, _is_number, "a number", float)


def bool_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> bool:
    """A boolean attribute; accepts true/false and 0/1 (graph JSON writes "1")."""
    value = _get(op, attrs, name, default)
    if isinstance(value, bool):
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    raise attr_error(op, name, value, "true/false or 0/1")


def str_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED,
             choices: Sequence[str] | None = None) -> Any:
    """A string attribute, optionally one of choices."""
    value = attrs.get(name, default)
    if value is _REQUIRED:
        raise op_error(op, f"missing required attribute {name!r}")
    if name not in attrs:
        return value
    if not isinstance(value, str):
        raise attr_error(op, name, value, "a string")
    if choices is not None and value not in choices:
        raise attr_error(op, name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def int_tuple(op: str, attrs: Mapping[str, Any], name: str, n: int | None = None,
              default: Any = _REQUIRED) -> Any:
    """A tuple of ints; an int or a 1-list broadcasts to n entries; None/absent gives default."""
    value = _get(op, attrs, name, default)
    if name not in attrs:
        return value
    if value is None:
        if default is _REQUIRED:
            raise attr_error(op, name, value, "an integer or a list of integers")
        return default
    if _is_int(value):
        value = [value] * (n if n is not None else 1)
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        raise attr_error(op, name, value, "an integer or a list of integers")
    if n is not None and len(value) == 1:
        value = list(value) * n
    if n is not None and len(value) != n:
        raise attr_error(op, name, value, f"{n} integers")
    return tuple(int(v) for v in value)


def normalize_axis(op: str, axis: int, ndim: int, name: str = "axis") -> int:
    """axis in [-ndim, ndim) mapped to [0, ndim)."""
    if not -ndim <= axis < ndim:
        raise attr_error(op, name, axis,
                         f"an axis in [{-ndim}, {ndim}) for an input of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def single_axis(op: str, attrs: Mapping[str, Any], name: str, ndim: int,
                default: Any = _REQUIRED) -> int:
    """One normalized axis (softmax, concatenate, take)."""
    return normalize_axis(op, int_attr(op, attrs, name, default), ndim, name)


def axis_attr(op: str, attrs: Mapping[str, Any], name: str, ndim: int,
              default: Any = None) -> tuple[int, ...] | None:
    """Sorted normalized axes from an int or a list; None (absent or null) stays None."""
    raw = int_tuple(op, attrs, name, None, default)
    if raw is None:
        return None
    axes = tuple(normalize_axis(op, a, ndim, name) for a in raw)
    if len(set(axes)) != len(axes):
        raise attr_error(op, name, list(raw), "distinct axes")
    return tuple(sorted(axes))


def dtype_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """A dtype name NumPy knows, in NumPy's spelling ("float" becomes "float64")."""
    value = str_attr(op, attrs, name, default)
    if name not in attrs:
        return value
    try:
        return str(np.dtype(value))
    except TypeError as e:
        raise attr_error(op, name, value, "a dtype name such as 'float32' or 'int64'") from e


# Bounds checked when a lib or graph is loaded, before any shape is computed from them: an
# integer beyond int64 overflows NumPy; a window of 2^40 asks for terabytes of workspace.
_INT64 = (1 << 63) - 1
_MAX_WINDOW = 1 << 16
_WINDOW_ATTRS = frozenset({"strides", "dilation", "pool_size", "padding", "kernel_size",
                           "output_padding"})
_MAX_RANK = 32
_RANK_ATTRS = frozenset({"num_newaxis"})
_MAX_LIST = 1024
# Attributes whose non-finite values mean something: clip's bounds may be +-inf (no bound).
_INFINITE_OK = frozenset({("clip", "a_min"), ("clip", "a_max")})


def check_attrs(op: str, attrs: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse attribute names the op does not take (node keys and '__' keys pass), and values out
    of what any op can do: non-finite numbers, integers beyond int64, windows beyond 2^16."""
    for name in attrs:
        if name in NODE_KEYS or name.startswith("__"):
            continue
        if name not in allowed:
            choices = ", ".join(allowed) if allowed else "no attributes"
            raise op_error(op, f"unknown attribute {name!r}; it accepts: {choices}")
        value = parse_value(attrs[name])
        _check_value(op, name, value, value, 0)


def _check_value(op: str, name: str, value: Any, whole: Any, depth: int) -> None:
    if isinstance(value, (list, tuple)):
        if depth > 2 or len(value) > _MAX_LIST:
            raise attr_error(op, name, whole, f"a flat list of at most {_MAX_LIST} values")
        for item in value:
            _check_value(op, name, item, whole, depth + 1)
        return
    if isinstance(value, bool):
        return
    if isinstance(value, (int, np.integer)):
        limit = _INT64
        what = "an integer within int64"
        if name in _WINDOW_ATTRS:
            limit, what = _MAX_WINDOW, f"at most {_MAX_WINDOW}"
        elif name in _RANK_ATTRS:
            limit, what = _MAX_RANK, f"at most {_MAX_RANK} (the highest rank supported)"
        if not -limit - 1 <= value <= limit:
            raise attr_error(op, name, whole, what)
        return
    if isinstance(value, (float, np.floating)) and not np.isfinite(value):
        if np.isinf(value) and (op, name) in _INFINITE_OK:
            return
        raise attr_error(op, name, whole, "a finite number")


def check_out_dtype(op: str, attrs: Mapping[str, Any], dtype: str) -> None:
    """Relay's out_dtype: empty or equal to the input dtype (no mixed precision here)."""
    out_dtype = attrs.get("out_dtype")
    if out_dtype in (None, "", "None") or out_dtype == dtype:
        return
    raise attr_error(op, "out_dtype", out_dtype, f"'' or the input dtype {dtype}")

"""Semantic checks of a schema-valid graph: order, node_row_ptr, arg_nodes, heads, columns."""
from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .._text import count_of
from ..dtypes import EXTENDED_DTYPES
from .schema import json_path
from .symbolic import check_dim

if TYPE_CHECKING:
    from .model import Graph, Node

# Mirrors of schemas/graph.schema.json for matches_schema(); tests check both agree.
_TOP_KEYS = ("nodes", "arg_nodes", "heads", "node_row_ptr", "attrs", "metadata")
_NODE_KEYS = ("op", "name", "inputs", "attrs", "attr", "control_deps")
# numpy-supported TVM dtype names ($defs.dltype in the schema).
# CORE_DTYPES are NumPy's own (the golden params files made by TVM cover them all);
# EXTENDED_DTYPES come from ml_dtypes (graph_runtime/dtypes.py).
CORE_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint16", "uint32", "uint64", "bool")
SUPPORTED_DTYPES = CORE_DTYPES + EXTENDED_DTYPES
_MAX_NODE = 2**31 - 1
_MAX_COUNT = 999_999_999
_MAX_DIM = 2**63 - 1
_MAX_RANK = 32
_MAX_BYTES = 2**63 - 1
# Extension: a dim may be a name, an expression of names, or "?" ($defs.dim in the schema).
_SYMBOLIC_DIM = re.compile(r"^(\?|[A-Za-z0-9_+\-*/%() ]{1,200})$")
# smallest value of each known list_int column
_INT_COLUMNS = {"storage_id": 0, "device_index": 1, "device_id": 0}


def matches_schema(doc: Any) -> bool:
    """True when doc certainly satisfies graph.schema.json: a fast path, as jsonschema is slow
    on every value; when False, jsonschema runs to explain what is wrong."""
    if type(doc) is not dict or not all(key in _TOP_KEYS for key in doc):
        return False
    if not all(key in doc for key in _TOP_KEYS[:5]):
        return False
    nodes, heads, row_ptr = doc["nodes"], doc["heads"], doc["node_row_ptr"]
    return (type(nodes) is list and len(nodes) > 0 and all(map(_is_node, nodes))
            and _is_list_of(doc["arg_nodes"], _is_node_id)
            and type(heads) is list and len(heads) > 0 and all(map(_is_entry_ref, heads))
            and type(row_ptr) is list and len(row_ptr) > 0
            and all(_is_int(p, 0, None) for p in row_ptr)
            and _is_graph_attrs(doc["attrs"]) and _is_metadata(doc.get("metadata")))


def _is_metadata(value: Any) -> bool:
    """Free-form, but an object's output_names is a list of names (docs/output_names.md)."""
    if type(value) is not dict or "output_names" not in value:
        return True
    names = value["output_names"]
    return (type(names) is list and len(names) > 0
            and all(type(name) is str and 0 < len(name) <= 4096 for name in names))


def _is_int(value: Any, low: int, high: int | None) -> bool:
    return type(value) is int and value >= low and (high is None or value <= high)


def _is_node_id(value: Any) -> bool:
    return _is_int(value, 0, _MAX_NODE)


def _is_list_of(value: Any, check: Callable[[Any], bool]) -> bool:
    return type(value) is list and all(map(check, value))


def _is_entry_ref(value: Any) -> bool:
    return (type(value) is list and 2 <= len(value) <= 3 and _is_node_id(value[0])
            and _is_int(value[1], 0, _MAX_COUNT) and (len(value) == 2 or _is_node_id(value[2])))


def _is_node(node: Any) -> bool:
    if type(node) is not dict or not all(key in _NODE_KEYS for key in node):
        return False
    return (node.get("op") in ("null", "tvm_op") and type(node.get("name")) is str
            and _is_list_of(node.get("inputs"), _is_entry_ref)
            and ("attrs" not in node or _is_node_attrs(node["attrs"]))
            and ("attr" not in node or _is_node_attrs(node["attr"]))
            and ("control_deps" not in node or _is_list_of(node["control_deps"], _is_node_id)))


def _is_count(value: Any, low: int) -> bool:
    if type(value) is str:
        return (0 < len(value) <= 9 and value.isascii() and value.isdigit()
                and (low == 0 or value[0] != "0"))
    return _is_int(value, low, _MAX_COUNT)


def _is_node_attrs(attrs: Any) -> bool:
    if type(attrs) is not dict:
        return False
    func_name = attrs.get("func_name", "")
    flatten = attrs.get("flatten_data", 0)
    return (("func_name" not in attrs or (type(func_name) is str and func_name != ""))
            and ("num_inputs" not in attrs or _is_count(attrs["num_inputs"], 0))
            and ("num_outputs" not in attrs or _is_count(attrs["num_outputs"], 1))
            and type(flatten) in (str, int) and flatten in ("0", "1", 0, 1))


def _is_shape(shape: Any) -> bool:
    return (type(shape) is list and len(shape) <= _MAX_RANK
            and all(_is_int(dim, 0, _MAX_DIM) or _is_symbolic_dim(dim) for dim in shape))


def _is_symbolic_dim(dim: Any) -> bool:
    """A string dim (extension: graph/symbolic.py) the schema's pattern allows."""
    return type(dim) is str and _SYMBOLIC_DIM.match(dim) is not None


def _is_graph_attrs(attrs: Any) -> bool:
    if type(attrs) is not dict:
        return False
    if not all(key in attrs for key in ("dltype", "shape", "storage_id")):
        return False
    for name, column in attrs.items():
        if type(column) is not list or len(column) != 2 or type(column[1]) is not list:
            return False
        tag, values = column
        if name == "dltype":
            ok = tag == "list_str" and all(type(v) is str and v in SUPPORTED_DTYPES for v in values)
        elif name == "shape":
            ok = tag == "list_shape" and all(map(_is_shape, values))
        elif name in _INT_COLUMNS:
            low = _INT_COLUMNS[name]
            ok = tag == "list_int" and all(_is_int(v, low, None) for v in values)
        elif tag == "list_int":
            ok = all(type(v) is int for v in values)
        elif tag == "list_str":
            ok = all(type(v) is str for v in values)
        else:
            ok = tag == "list_shape" and all(map(_is_shape, values))
        if not ok:
            return False
    return True


def schema_labels(doc: Any) -> Callable[[Sequence[str | int]], str]:
    """where(path) for schema messages: the node or entry a path points into."""
    row_ptr: list[int] | None = None
    row_ptr_read = False

    def node_label(nid: int) -> str:
        nodes = doc.get("nodes")
        node = nodes[nid] if isinstance(nodes, list) and nid < len(nodes) else None
        name = node.get("name") if isinstance(node, dict) else None
        return f"node {nid} {name!r}" if isinstance(name, str) else f"node {nid}"

    def entry_label(eid: int) -> str:
        nonlocal row_ptr, row_ptr_read
        if not row_ptr_read:
            row_ptr_read = True
            ptr = doc.get("node_row_ptr")
            if (isinstance(ptr, list) and ptr and ptr[0] == 0
                    and all(type(p) is int for p in ptr)
                    and all(a <= b for a, b in zip(ptr, ptr[1:]))):
                row_ptr = ptr
        if row_ptr is None or eid >= row_ptr[-1]:
            return f"eid {eid}"
        nid = bisect_right(row_ptr, eid) - 1
        return f"{node_label(nid)} entry {nid}:{eid - row_ptr[nid]} (eid {eid})"

    def where(path: Sequence[str | int]) -> str:
        if not isinstance(doc, dict) or len(path) < 2 or not isinstance(path[1], (int, str)):
            return ""
        if path[0] == "nodes" and isinstance(path[1], int):
            return node_label(path[1])
        if path[0] == "attrs" and len(path) >= 4 and path[2] == 1 and isinstance(path[3], int):
            return entry_label(path[3])
        return ""

    return where


def semantic_problems(g: Graph) -> list[str]:
    """Cross-reference problems of a schema-valid graph, each as ": ..." or " at $.path: ..."."""
    out: list[str] = []
    for node in g.nodes:
        out += _node_problems(node)
    outputs = [node.num_outputs for node in g.nodes]
    for node in g.nodes:
        for position, entry in enumerate(node.inputs):
            problem = _reference_problem(g, outputs, entry, node.nid)
            if problem:
                out.append(f": {node.label} input {position} {problem}")
    for position, head in enumerate(g.heads):
        problem = _reference_problem(g, outputs, head, len(g.nodes))
        if problem:
            out.append(f" at {json_path(['heads', position])}: head {position} {problem}")
    row_ptr = [0, *accumulate(outputs)]
    out += _row_ptr_problems(g, row_ptr)
    out += _arg_node_problems(g)
    out += _output_name_problems(g)
    for name, (tag, values) in g.attrs.items():
        if len(values) != row_ptr[-1]:
            out.append(f" at {json_path(['attrs', name])}: expected {row_ptr[-1]} values "
                       f"(one per entry: the nodes have {row_ptr[-1]} outputs in all), "
                       f"got {len(values)}")
    if not out:
        out += _size_problems(g)
    return out


def _output_name_problems(g: Graph) -> list[str]:
    """metadata.output_names (extension): one distinct name per head."""
    names = g.declared_output_names
    if names is None:
        return []
    where = json_path(["metadata", "output_names"])
    if len(names) != len(g.heads):
        return [f" at {where}: expected {count_of(len(g.heads), 'name')} (one per head), "
                f"got {len(names)}"]
    seen: set[str] = set()
    for position, name in enumerate(names):
        if name in seen:
            return [f" at {json_path(['metadata', 'output_names', position])}: output name "
                    f"{name!r} is given twice; each output needs its own name"]
        seen.add(name)
    return []


def _size_problems(g: Graph) -> list[str]:
    """Entries no array library can hold: the dims (zeros counted as 1, as NumPy checks them)
    times the item size must fit in int64, so [0, 2**62] float32 is refused though 0 bytes."""
    out = []
    shapes = g.attrs["shape"][1]
    dtypes = g.attrs["dltype"][1]
    for eid, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        count = 1
        for dim in shape:
            if isinstance(dim, str):
                problem = check_dim(dim)
                if problem is not None:
                    out.append(f" at {json_path(['attrs', 'shape', 1, eid])}: "
                               f"{g.entry_label(eid)}: {problem}")
                continue  # a symbolic dim's size is checked when the module specialises
            count *= max(int(dim), 1)
        if count * np.dtype(dtype).itemsize > _MAX_BYTES:
            out.append(f" at {json_path(['attrs', 'shape', 1, eid])}: {g.entry_label(eid)} "
                       f"has shape {shape} {dtype}: more than 2^63 bytes "
                       "(counting zero dims as 1), more than any array can hold")
            if len(out) >= 10:
                break
    return out


def _node_problems(node: Node) -> list[str]:
    out = []
    if "attr" in node.extra:
        out.append(f": {node.label} has both 'attr' and 'attrs'; keep only 'attrs'")
    if node.num_inputs != len(node.inputs):
        out.append(f": {node.label} has attrs.num_inputs {node.num_inputs} but "
                   f"{count_of(len(node.inputs), 'input')}")
    if node.is_arg:
        if node.inputs:
            out.append(f": {node.label} is a 'null' (input) node but has "
                       f"{count_of(len(node.inputs), 'input')}; expected none")
        if node.num_outputs != 1:
            out.append(f": {node.label} is a 'null' (input) node with attrs.num_outputs "
                       f"{node.num_outputs}; input nodes have exactly 1 output")
        return out
    if node.func_name is None:
        out.append(f": {node.label} is a tvm_op node without attrs.func_name; "
                   f"every tvm_op node names its kernel")
    # TVM's reader refuses a tvm_op lacking any of these ("invalid format"); so do we, by name.
    missing = [key for key in ("num_inputs", "num_outputs", "flatten_data")
               if key not in node.attrs]
    if missing:
        out.append(f": {node.label} is a tvm_op node without attrs."
                   + ", attrs.".join(missing) + "; TVM requires func_name, num_inputs, "
                   "num_outputs and flatten_data on every tvm_op node")
    return out


def _reference_problem(g: Graph, outputs: list[int], entry: tuple[int, ...],
                       before: int) -> str:
    """What is wrong with an [nid, index, version] reference read by node `before`, or ""."""
    nid, index = entry[0], entry[1]
    if nid >= len(g.nodes):
        return (f"refers to node {nid}, which does not exist (the graph has "
                f"{count_of(len(g.nodes), 'node')})")
    if nid == before:
        return f"refers to node {nid} itself; nodes must be in topological order"
    if nid > before:
        return f"refers to node {nid}, which comes later; nodes must be in topological order"
    if index >= outputs[nid]:
        return (f"refers to output {index} of {g.nodes[nid].label}, which has "
                f"{count_of(outputs[nid], 'output')}")
    return ""


def _row_ptr_problems(g: Graph, row_ptr: list[int]) -> list[str]:
    """node_row_ptr must be the prefix sums of the nodes' outputs; report the first difference."""
    given = g.node_row_ptr
    where = f" at {json_path(['node_row_ptr'])}"
    if len(given) != len(row_ptr):
        return [f"{where}: expected {len(row_ptr)} items (num_nodes + 1), got {len(given)}"]
    for nid, (got, expected) in enumerate(zip(given, row_ptr)):
        if got != expected:
            if nid == 0:
                return [f"{where}[0]: expected 0, got {got}"]
            node = g.nodes[nid - 1]
            return [f"{where}[{nid}]: expected {expected} ({node.label} starts at entry "
                    f"{row_ptr[nid - 1]} and has {count_of(node.num_outputs, 'output')}), "
                    f"got {got}"]
    return []


def _arg_node_problems(g: Graph) -> list[str]:
    """arg_nodes must list exactly the 'null' nodes, in node order; their names must be unique."""
    out = []
    where = json_path(["arg_nodes"])
    first_at: dict[int, int] = {}
    for position, nid in enumerate(g.arg_nodes):
        at = f" at {where}[{position}]"
        if nid >= len(g.nodes):
            out.append(f"{at}: node {nid} does not exist (the graph has "
                       f"{count_of(len(g.nodes), 'node')})")
        elif not g.nodes[nid].is_arg:
            out.append(f"{at}: {g.nodes[nid].label} is a {g.nodes[nid].op!r} node; "
                       f"arg_nodes lists only 'null' nodes")
        elif nid in first_at:
            out.append(f"{at}: {g.nodes[nid].label} is listed twice "
                       f"(first at {where}[{first_at[nid]}])")
        else:
            first_at[nid] = position
    names: dict[str, int] = {}
    for node in g.nodes:
        if not node.is_arg:
            continue
        if node.nid not in first_at:
            out.append(f" at {where}: {node.label} is a 'null' (input) node missing from "
                       f"arg_nodes")
        if node.name in names:
            out.append(f": {node.label} has the same name as node {names[node.name]}; input "
                       f"names must be unique (inputs are addressed by name)")
        else:
            names[node.name] = node.nid
    if not out and list(g.arg_nodes) != sorted(g.arg_nodes):
        out.append(f" at {where}: expected the 'null' nodes in node order "
                   f"{sorted(g.arg_nodes)[:8]}, got {list(g.arg_nodes)[:8]}")
    return out

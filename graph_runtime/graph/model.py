"""Graph model: nodes, entries and attrs columns, read from and written to TVM graph JSON."""
from __future__ import annotations

import codecs
import json
import operator
import os
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import numpy as np

from .._text import count_of
from ..errors import GraphError
from .checks import SUPPORTED_DTYPES, matches_schema, schema_labels, semantic_problems
from .schema import MAX_PROBLEMS, schema_problems

if TYPE_CHECKING:
    from .liveness import Liveness

__all__ = ["COLUMN_TAGS", "COPY_OP", "NOP_OP", "SUPPORTED_DTYPES", "Graph", "GraphSource", "Node",
           "check_graph", "load_graph", "read_graph_doc", "usable_output_names"]

SCHEMA = "graph.schema.json"
# func_names of the two nodes that run no kernel: a copy between devices, and an alias of inputs.
COPY_OP = "__copy"
NOP_OP = "__nop"
# The type tag of each column this runtime knows; unknown columns are kept as they are.
COLUMN_TAGS = {"dltype": "list_str", "shape": "list_shape", "storage_id": "list_int",
               "device_index": "list_int", "device_id": "list_int"}

MAX_OUTPUT_NAME = 4096  # characters of one metadata.output_names entry (graph.schema.json)

GraphSource = Union[str, bytes, bytearray, Mapping[str, Any], "os.PathLike[str]", "Graph"]


@dataclass(frozen=True)
class Node:
    """One node as in the file; attrs stay raw (TVM writes "1"), the properties parse them."""

    nid: int
    op: str
    name: str
    inputs: tuple[tuple[int, ...], ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The key attrs were read from ("attrs", or TVM's older "attr"); None when the node had none.
    attrs_key: str | None = "attrs"

    @property
    def label(self) -> str:
        return f"node {self.nid} {self.name!r}"

    @property
    def is_arg(self) -> bool:
        return self.op == "null"

    @property
    def func_name(self) -> str | None:
        value = self.attrs.get("func_name")
        return value if isinstance(value, str) else None

    @property
    def num_inputs(self) -> int:
        return self._count("num_inputs", len(self.inputs))

    @property
    def num_outputs(self) -> int:
        return self._count("num_outputs", 1)

    @property
    def flatten_data(self) -> bool:
        return self._count("flatten_data", 0) != 0

    def _count(self, key: str, default: int) -> int:
        value = self.attrs.get(key, default)
        count = _parse_count(value)
        if count is None:
            raise GraphError(f"{self.label}: attrs.{key}: expected a count (\"2\" or 2), "
                             f"got {value!r}")
        return count

    def to_dict(self) -> dict[str, Any]:
        """The node as TVM writes it (key order op, name, inputs, attrs)."""
        return _json_copy(self._doc())

    def _doc(self) -> dict[str, Any]:
        """The node's JSON structure, sharing the stored values (callers copy or serialise)."""
        doc: dict[str, Any] = {"op": self.op, "name": self.name, "inputs": self.inputs}
        if self.attrs_key is not None:
            doc[self.attrs_key] = dict(self.attrs)
        doc.update(self.extra)
        return doc


def usable_output_names(names: Sequence[str]) -> list[str] | None:
    """names as metadata.output_names can hold them (distinct, non-empty, at most 4096
    characters), else None: such outputs keep TVM's names (their head nodes')."""
    fits = all(isinstance(n, str) and 0 < len(n) <= MAX_OUTPUT_NAME for n in names)
    return list(names) if names and fits and len(set(names)) == len(names) else None


def _parse_count(value: Any) -> int | None:
    """A non-negative int from TVM's string form or an int; None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    return None


@dataclass(frozen=True)
class Graph:
    """A validated TVM graph; build it with from_json, build or with_columns, never by hand."""

    nodes: tuple[Node, ...]
    arg_nodes: tuple[int, ...]
    heads: tuple[tuple[int, ...], ...]
    node_row_ptr: tuple[int, ...]
    attrs: dict[str, tuple[str, list]]
    source: str = "<graph>"
    # Optional top-level keys ("metadata"), kept verbatim for the round trip.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, source: GraphSource, *, source_name: str | None = None) -> Graph:
        """Read and validate a graph: JSON text, bytes, a dict, or a path to a file.

        A str is JSON text when it starts (after whitespace) with "{" or "[", has a newline or is
        longer than any path; otherwise a path (of a regular file).
        Raises the first GraphError; its message counts the others, and `.problems` lists all.
        """
        if isinstance(source, Graph):
            return source
        doc, name = read_graph_doc(source, source_name)
        problems, graph = _check(doc, name)
        if graph is None or problems:
            message = str(problems[0])
            if len(problems) > 1:
                message += f" (and {len(problems) - 1} more problems)"
            error = GraphError(message)
            error.problems = problems  # type: ignore[attr-defined]
            raise error
        return graph

    @classmethod
    def build(cls, nodes: Sequence[Mapping[str, Any]], heads: Sequence[Any], *,
              shapes: Sequence[Sequence[int]], dtypes: Sequence[str] | str,
              storage_ids: Sequence[int] | None = None, device_index: Sequence[int] | None = None,
              device_id: Sequence[int] | None = None,
              extra_columns: Mapping[str, Any] | None = None,
              output_names: Sequence[str] | None = None) -> Graph:
        """A validated graph from node dicts (as in JSON) and one shape/dtype per entry.

        Computes arg_nodes and node_row_ptr. A head may be a node id (its output 0).
        storage_ids default to 0..n-1 (no sharing); a str dtypes applies to every entry.
        extra_columns values are lists (tag inferred) or (tag, values) pairs. output_names,
        one per head, become metadata.output_names (extension, docs/output_names.md).
        """
        node_docs = []
        for node in nodes:
            node_doc = dict(node) if isinstance(node, Mapping) else node
            if isinstance(node_doc, dict):
                node_doc.setdefault("inputs", [])
            node_docs.append(node_doc)
        outputs = [_declared_outputs(node) for node in node_docs]
        count = len(shapes)
        columns: dict[str, Any] = {
            "dltype": [dtypes] * count if isinstance(dtypes, str) else dtypes,
            "shape": shapes,
            "storage_id": list(range(count)) if storage_ids is None else storage_ids,
        }
        if device_index is not None:
            columns["device_index"] = device_index
        if device_id is not None:
            columns["device_id"] = device_id
        columns.update(extra_columns or {})
        doc = {
            "nodes": node_docs,
            "arg_nodes": [nid for nid, node in enumerate(node_docs)
                          if isinstance(node, dict) and node.get("op") == "null"],
            "heads": [head if isinstance(head, (list, tuple)) else [head, 0, 0] for head in heads],
            "attrs": {name: _column(name, values) for name, values in columns.items()},
            "node_row_ptr": [0, *accumulate(outputs)],
        }
        if output_names is not None:
            doc["metadata"] = {"output_names": list(output_names)}
        return cls.from_json(doc)

    @classmethod
    def _from_valid_doc(cls, doc: dict[str, Any], source: str) -> Graph:
        """Wrap a schema-valid doc (takes ownership; no semantic checks)."""
        nodes = tuple(_node_from_doc(nid, node) for nid, node in enumerate(doc["nodes"]))
        return cls(
            nodes=nodes,
            arg_nodes=tuple(doc["arg_nodes"]),
            heads=tuple(tuple(head) for head in doc["heads"]),
            node_row_ptr=tuple(doc["node_row_ptr"]),
            attrs={name: (column[0], column[1]) for name, column in doc["attrs"].items()},
            source=source,
            extra=MappingProxyType({k: v for k, v in doc.items() if k == "metadata"}),
        )

    def to_dict(self) -> dict[str, Any]:
        """The graph as TVM graph JSON data; equal to the document it was read from."""
        return _json_copy(self._doc())

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self._doc(), indent=indent)

    def _doc(self) -> dict[str, Any]:
        """The JSON structure, sharing the stored values (tuples serialise as lists)."""
        doc: dict[str, Any] = {
            "nodes": [node._doc() for node in self.nodes],
            "arg_nodes": self.arg_nodes,
            "heads": self.heads,
            "attrs": {name: [tag, values] for name, (tag, values) in self.attrs.items()},
            "node_row_ptr": self.node_row_ptr,
        }
        doc.update(self.extra)
        return doc

    def with_columns(self, **columns: Any) -> Graph:
        """A new validated graph with columns replaced or added (None removes a column).

        Values are lists; an unknown column may also be a (tag, values) pair.
        """
        doc = self.to_dict()
        for name, values in columns.items():
            if values is None:
                doc["attrs"].pop(name, None)
            else:
                doc["attrs"][name] = _column(name, values)
        return Graph.from_json(doc, source_name=self.source)

    @cached_property
    def is_symbolic(self) -> bool:
        """Whether some entry's shape has a symbolic dim (extension: graph/symbolic.py)."""
        return any(isinstance(d, str) for shape in self.attrs["shape"][1] for d in shape)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_entries(self) -> int:
        return self.node_row_ptr[-1]

    def entry_id(self, nid: int, index: int) -> int:
        """The entry id of output `index` of node `nid`."""
        self._check_nid(nid)
        node = self.nodes[nid]
        if not 0 <= index < node.num_outputs:
            raise GraphError(f"{self.source}: {node.label} has no output {index} "
                             f"(it has {count_of(node.num_outputs, 'output')})")
        return self.node_row_ptr[nid] + index

    def entry_node(self, eid: int) -> tuple[int, int]:
        """(nid, index) of the node output that entry eid is."""
        self._check_eid(eid)
        nid = bisect_right(self.node_row_ptr, eid) - 1
        return nid, eid - self.node_row_ptr[nid]

    def entry_label(self, eid: int) -> str:
        """E.g. "node 2 'dense0' entry 2:0 (eid 4)", for messages."""
        nid, index = self.entry_node(eid)
        return f"{self.nodes[nid].label} entry {nid}:{index} (eid {eid})"

    def node_entries(self, nid: int) -> range:
        """The entry ids of the node's outputs."""
        self._check_nid(nid)
        return range(self.node_row_ptr[nid], self.node_row_ptr[nid + 1])

    def shape(self, eid: int) -> tuple[int, ...]:
        return tuple(self._value("shape", eid))

    def dtype(self, eid: int) -> str:
        dtype: str = self._value("dltype", eid)
        return dtype

    def storage_id(self, eid: int) -> int:
        storage_id: int = self._value("storage_id", eid)
        return storage_id

    def device_index(self, eid: int) -> int | None:
        """The entry's DLPack device type code; None when the column is absent."""
        return self._value("device_index", eid) if "device_index" in self.attrs else None

    def device_id(self, eid: int) -> int | None:
        return self._value("device_id", eid) if "device_id" in self.attrs else None

    def column(self, name: str) -> list | None:
        """A copy of the column's values; None when the graph has no such column."""
        if name not in self.attrs:
            return None
        tag, values = self.attrs[name]
        return _copy_values(tag, values)

    @cached_property
    def liveness(self) -> Liveness:
        """Each entry's life and alias group under this graph's storage ids, computed once."""
        # NOTE: imported here because graph/liveness.py imports this module.
        from .liveness import liveness
        return liveness(self.nodes, self.heads, self.attrs["storage_id"][1])

    @property
    def input_names(self) -> list[str]:
        """Names of the arg nodes in arg_nodes order (input index = position)."""
        return [self.nodes[nid].name for nid in self.arg_nodes]

    @property
    def input_entries(self) -> dict[str, int]:
        """Entry id of each graph input, by name, in arg_nodes order."""
        return {self.nodes[nid].name: self.node_row_ptr[nid] for nid in self.arg_nodes}

    @property
    def declared_output_names(self) -> list[str] | None:
        """metadata.output_names (extension, docs/output_names.md), or None without it."""
        meta = self.extra.get("metadata")
        names = meta.get("output_names") if isinstance(meta, Mapping) else None
        return list(names) if isinstance(names, list) else None

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        """A name per head: the declared ones, else the head node's name (TVM's
        GetOutputIndex names outputs so), with ':index' for a node of more outputs."""
        declared = self.declared_output_names
        return tuple(declared) if declared is not None else self.node_output_names

    @cached_property
    def node_output_names(self) -> tuple[str, ...]:
        """Each head's node name (TVM's GetOutputIndex names outputs so), with ':index' for a
        node of more outputs."""
        names = []
        for nid, index, *_ in self.heads:
            node = self.nodes[nid]
            names.append(node.name if node.num_outputs == 1 else f"{node.name}:{index}")
        return tuple(names)

    def output_index(self, key: int | str) -> int:
        """The head index of an output given by index or by name: a declared name, or (as
        TVM's GetOutputIndex) its node's name; GraphError lists the outputs when none fits."""
        if isinstance(key, str):
            if key in self.output_names:
                return self.output_names.index(key)
            if key in self.node_output_names:
                return self.node_output_names.index(key)
            shown = ", ".join(self.output_names[:20])
            more = f" ... ({len(self.output_names)} in all)" if len(self.output_names) > 20 else ""
            raise GraphError(f"graph has no output {key!r}; outputs are: {shown}{more}")
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise GraphError(f"get_output needs an output index (an int) or name (a str), "
                             f"got {type(key).__name__} {key!r}")
        if not 0 <= key < len(self.heads):
            raise GraphError(f"output index {key} is out of range: the graph has "
                             f"{count_of(len(self.heads), 'output')}")
        return int(key)

    @property
    def output_entries(self) -> list[int]:
        return [self.node_row_ptr[head[0]] + head[1] for head in self.heads]

    def _check_nid(self, nid: int) -> None:
        if not 0 <= nid < len(self.nodes):
            raise GraphError(f"{self.source}: node {nid} does not exist "
                             f"(the graph has {count_of(len(self.nodes), 'node')})")

    def _check_eid(self, eid: int) -> None:
        if not 0 <= eid < self.num_entries:
            raise GraphError(f"{self.source}: entry {eid} does not exist "
                             f"(the graph has {count_of(self.num_entries, 'entry', 'entries')})")

    def _value(self, name: str, eid: int) -> Any:
        self._check_eid(eid)
        return self.attrs[name][1][eid]


def entry_bytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes one entry needs: prod(shape) x itemsize, in Python ints so no shape can overflow."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * np.dtype(dtype).itemsize


def load_graph(source: GraphSource) -> Graph:
    """Read and validate a graph (JSON text, bytes, dict or path); see Graph.from_json."""
    return Graph.from_json(source)


def read_graph_doc(source: GraphSource, source_name: str | None = None) -> tuple[Any, str]:
    """The parsed JSON document of a graph source and its name for messages (not validated).

    A dict is copied through JSON, so tuples become lists and non-JSON values are rejected.
    """
    if isinstance(source, Mapping):
        name = source_name or "<graph>"
        try:
            text = json.dumps(source, allow_nan=False, default=_json_default)
        except (TypeError, ValueError, RecursionError) as e:
            raise GraphError(f"{name}: not JSON data: {e}") from e
        return _parse_json(text, name), name
    if isinstance(source, (bytes, bytearray)):
        name = source_name or "<graph>"
        return _parse_json(bytes(source), name), name
    if isinstance(source, str) and (source.lstrip()[:1] in ("{", "[")
                                    or len(source) > _MAX_PATH or "\n" in source):
        # NOTE: JSON text, or at least not a path: a 200,000-character "path" made a message
        # as long.
        name = source_name or "<graph>"
        return _parse_json(source, name), name
    if isinstance(source, (str, os.PathLike)):
        name = source_name or os.fspath(source)
        return _parse_json(_read_regular_file(Path(source), name), name), name
    raise GraphError(f"expected a graph as JSON text, bytes, a dict or a path, "
                     f"got {type(source).__name__}")


_MAX_PATH = 4096


def _read_regular_file(path: Path, name: str) -> bytes:
    """The bytes of a regular file; a FIFO would hang and /dev/zero never end, so refuse them."""
    try:
        if path.is_dir():
            raise GraphError(f"{name}: is a directory; give the graph.json inside it")
        if path.exists() and not path.is_file():
            raise GraphError(f"{name}: not a regular file (a FIFO or a device); give a graph "
                             "JSON file")
        return path.read_bytes()
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise GraphError(f"{name}: cannot read the graph file: {reason}") from e


def _parse_json(text: str | bytes, name: str) -> Any:
    if isinstance(text, bytes) and text.startswith(codecs.BOM_UTF8):
        text = text[len(codecs.BOM_UTF8):]  # editors on Windows write one; json rejects it
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise GraphError(f"{name}: not valid JSON: {e.msg} at line {e.lineno} "
                         f"column {e.colno}") from e
    except RecursionError as e:
        raise GraphError(f"{name}: not valid JSON: nested too deeply") from e
    except ValueError as e:  # duplicate keys, NaN, bad encoding, ints of thousands of digits
        raise GraphError(f"{name}: not valid JSON: {json_value_error(e)}") from e


_LONG_INT = re.compile(r"Exceeds the limit \((\d+) digits\).*value has (\d+) digits")


def json_value_error(e: ValueError) -> str:
    """The reason of a ValueError from json.loads, for users: Python's limit on an integer's
    digits suggests sys.set_int_max_str_digits(), a call no user of graphrun can make."""
    match = _LONG_INT.search(str(e))
    if match:
        return f"an integer of {match[2]} digits (at most {match[1]})"
    return str(e)[:200]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_default(value: Any) -> Any:
    """Let numpy integers and arrays (common in hand-built graphs) through as JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"a value of type {type(value).__name__} is not JSON data") from None


def _declared_outputs(node: Any) -> int:
    attrs = node.get("attrs") if isinstance(node, dict) else None
    value = attrs.get("num_outputs", 1) if isinstance(attrs, dict) else 1
    count = _parse_count(value)
    return 1 if count is None else count


def _column(name: str, values: Any) -> Any:
    """[tag, values] from values (tag known or inferred) or from a (tag, values) pair."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        return values  # the schema check names it
    if (len(values) == 2 and isinstance(values[0], str) and values[0].startswith("list_")
            and isinstance(values[1], (list, tuple))):
        return [values[0], values[1]]
    tag = COLUMN_TAGS.get(name)
    if tag is None:
        if all(isinstance(v, str) for v in values):
            tag = "list_str"
        elif all(isinstance(v, (list, tuple)) for v in values):
            tag = "list_shape"
        else:
            tag = "list_int"
    return [tag, list(values)]


def _json_copy(doc: dict[str, Any]) -> dict[str, Any]:
    """A deep copy with tuples as lists; json's C code copies faster than copy.deepcopy and
    handles any depth json.loads accepted."""
    copied: dict[str, Any] = json.loads(json.dumps(doc))
    return copied


def _copy_values(tag: str, values: list) -> list:
    if tag == "list_shape":
        return [list(shape) for shape in values]
    return list(values)


def _node_from_doc(nid: int, doc: dict[str, Any]) -> Node:
    attrs_key = "attrs" if "attrs" in doc else ("attr" if "attr" in doc else None)
    attrs = doc[attrs_key] if attrs_key is not None else {}
    skip = {"op", "name", "inputs", attrs_key}
    return Node(
        nid=nid,
        op=doc["op"],
        name=doc["name"],
        inputs=tuple(tuple(entry) for entry in doc["inputs"]),
        attrs=MappingProxyType(attrs),
        extra=MappingProxyType({k: v for k, v in doc.items() if k not in skip}),
        attrs_key=attrs_key,
    )


def check_graph(doc: Any, source: str = "<graph>") -> list[GraphError]:
    """Every problem of a parsed graph JSON document: the schema first, then the semantics."""
    return _check(doc, source)[0]


def _check(doc: Any, source: str) -> tuple[list[GraphError], Graph | None]:
    """(problems, the graph when the schema holds); the Graph wraps doc, so it is built once."""
    if not matches_schema(doc):
        problems = schema_problems(doc, SCHEMA, source, where=schema_labels(doc))
        if problems:
            return [p if isinstance(p, GraphError) else GraphError(str(p)) for p in problems], None
    graph = Graph._from_valid_doc(doc, source)
    texts = semantic_problems(graph)
    if len(texts) > MAX_PROBLEMS:
        texts = texts[:MAX_PROBLEMS] + [f": more than {MAX_PROBLEMS} problems; stopped checking"]
    return [GraphError(f"{source}{text}") for text in texts], graph

"""Loads the JSON Schemas shipped as graph_runtime.schemas; turns their errors into typed errors."""
from __future__ import annotations

import difflib
import functools
import json
import re
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

from ..errors import GraphError, GraphRuntimeError

# A malformed file can have one problem per value; past this many we stop collecting
# (each jsonschema error holds paths and context, so an unbounded list could be large).
MAX_PROBLEMS = 100

# where(path) -> a label for the messages, e.g. "node 3 'dense0'", or "" when none applies.
Where = Callable[[Sequence["str | int"]], str]


# A checkout keeps the schemas in the top-level schemas/ folder; an installed wheel ships them as
# the package data graph_runtime.schemas (setup.cfg maps that folder there).
_CHECKOUT_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@functools.lru_cache(maxsize=None)
def schema_text(name: str) -> str:
    """The text of schema file `name`, from a checkout's schemas/ or the installed package data
    (read once per process: the lib check's cache key and the validator both need it)."""
    local = _CHECKOUT_SCHEMAS / name
    try:
        if local.is_file():
            return local.read_text(encoding="utf-8")
        return files("graph_runtime.schemas").joinpath(name).read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError) as e:
        raise GraphRuntimeError(f"schema {name!r} is not installed: it is neither in "
                                f"{_CHECKOUT_SCHEMAS} nor package data graph_runtime.schemas "
                                f"({e})") from e


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """The parsed schema file `name` (e.g. "graph.schema.json"); treat it as read-only."""
    schema: dict[str, Any] = json.loads(schema_text(name))
    return schema


def _is_int(checker: Any, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pattern(validator: Any, pattern: str, value: Any, schema: Any) -> Iterable[ValidationError]:
    """ECMA-262's "$" (which JSON Schema specifies) ends the string; Python's also matches
    before a final newline, which would let "12\n" through as a count."""
    from jsonschema.exceptions import ValidationError
    if not isinstance(value, str):
        return
    match = re.search(pattern, value)
    if match is None or (pattern.endswith("$") and match.end() != len(value)):
        yield ValidationError(f"{value!r} does not match {pattern!r}")


@functools.lru_cache(maxsize=None)
def _strict_validator() -> Any:
    # NOTE: jsonschema loads on first validation, not at import (its import is slow; Disco worker
    # processes import the package without ever validating a graph).
    from jsonschema import Draft202012Validator, validators
    # JSON Schema counts 2.0 as an integer; the runtime indexes lists with these values, so only
    # true integers pass (a float in a node id must be reported, not crash an index later).
    return validators.extend(
        Draft202012Validator,
        validators={"pattern": _pattern},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int))


@functools.lru_cache(maxsize=None)
def validator(name: str) -> Any:
    """The validator of schema file `name` whose integers are Python ints (2.0 is refused)."""
    return _strict_validator()(load_schema(name))


def json_path(path: Iterable[str | int]) -> str:
    """A JSON path such as $.nodes[3].inputs[0] for a sequence of keys and indices."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def schema_problems(doc: Any, schema_name: str, source: str, *,
                    error: type[GraphRuntimeError] = GraphError, where: Where | None = None,
                    limit: int = MAX_PROBLEMS) -> list[GraphRuntimeError]:
    """Every way doc breaks the schema (at most limit), as errors naming the JSON path.

    Args:
        error: the exception type to build (GraphError for graphs, LibraryError for lib files).
        where: adds a label after the path (the node or entry the path points into).
    """
    problems: list[GraphRuntimeError] = []
    seen: set[str] = set()
    wrong_tags: list[list[str | int]] = []
    for count, err in enumerate(validator(schema_name).iter_errors(doc)):
        if count >= 20 * limit:  # mostly repeats (skipped below); stop rather than walk them all
            problems.append(error(f"{source}: stopped checking after {count} schema errors"))
            break
        path = list(err.absolute_path)
        if any(path[:len(tag)] == tag for tag in wrong_tags):
            continue  # values under a wrong type tag would only repeat it
        if _is_tag_error(err):
            wrong_tags.append(path[:-1])
        message = describe(err, doc, source, where)
        if message in seen:
            continue
        seen.add(message)
        if len(problems) >= limit:
            problems.append(error(f"{source}: more than {limit} schema problems; stopped checking"))
            break
        problems.append(error(message))
    return problems


def describe(err: ValidationError, doc: Any, source: str, where: Where | None = None) -> str:
    """One readable line for a jsonschema error: where, what was expected, what was found."""
    path = list(err.absolute_path)
    keyword = err.validator
    value = err.instance
    schema = err.schema if isinstance(err.schema, dict) else {}
    # x-hint-minimum: why a value is below the minimum, e.g. TVM's -1 for dynamic shapes.
    hint = schema.get("x-hint-minimum") if keyword == "minimum" else None
    if _is_tag_error(err):
        # The first item of a two-item array is a type tag: ["list_int", [...]].
        path = path[:-1]
        tags = [err.validator_value] if keyword == "const" else list(err.validator_value)
        expected = "[" + " | ".join(json.dumps(t) for t in tags) + ", [...]]"
        detail = f"expected {expected}, got {brief(_lookup(doc, path))}"
    else:
        detail = _detail(err, keyword, value)
    if hint:
        detail += f"; {hint}"
    label = where(path) if where is not None else ""
    location = f"{source} at {json_path(path)}"
    if label:
        location += f", {label}"
    return f"{location}: {detail}"


def _is_tag_error(err: ValidationError) -> bool:
    """A const/enum on prefixItems[0] failed: the type tag of ["list_int", [...]]."""
    schema_path = list(err.absolute_schema_path)[-3:]
    return err.validator in ("const", "enum") and schema_path[:2] == ["prefixItems", 0]


def _detail(err: ValidationError, keyword: Any, value: Any) -> str:
    schema = err.schema if isinstance(err.schema, dict) else {}
    expected_text = schema.get("x-expected")
    rule = err.validator_value
    if keyword == "type":
        types = [rule] if isinstance(rule, str) else list(rule)
        expected = expected_text or " or ".join(types)
        shown = brief(value)
        kind = type_name(value)
        # null is its own type name: "got null", not "got null null".
        return f"expected {expected}, got {kind}" + ("" if value is None else f" {shown}")
    if keyword == "required":
        missing = [key for key in rule if isinstance(value, dict) and key not in value]
        return (f"missing key{'s' if len(missing) > 1 else ''} {_names(missing)}; "
                f"required keys: {', '.join(rule)}")
    if keyword == "additionalProperties" and rule is False:
        allowed = list(schema.get("properties", {}))
        unknown = [key for key in value if key not in allowed]
        text = f"unknown key{'s' if len(unknown) > 1 else ''} {_names(unknown)}; allowed keys: "
        text += ", ".join(allowed)
        close = difflib.get_close_matches(str(unknown[0]), allowed, n=1) if unknown else []
        if close:
            text += f" (did you mean {close[0]!r}?)"
        return text
    if keyword == "enum":
        choices = list(rule)
        if all(isinstance(c, str) and c.isidentifier() for c in choices):
            shown = ", ".join(choices)
        else:
            shown = ", ".join(json.dumps(c) for c in choices)
        return f"expected one of {shown}, got {brief(value)}"
    if keyword == "const":
        return f"expected {json.dumps(rule)}, got {brief(value)}"
    if keyword in ("minItems", "maxItems"):
        bound = "at least" if keyword == "minItems" else "at most"
        return f"expected {bound} {rule} items, got {len(value)}: {brief(value)}"
    if keyword in ("minimum", "maximum"):
        bound = ">=" if keyword == "minimum" else "<="
        return f"expected {expected_text or 'a value'} {bound} {rule}, got {brief(value)}"
    if keyword == "pattern":
        expected = expected_text or f"a string matching {rule}"
        return f"expected {expected}, got {brief(value)}"
    if keyword == "minProperties":
        return f"expected at least {rule} key{'s' if rule != 1 else ''}, got {brief(value)}"
    if keyword == "minLength":
        return f"expected at least {rule} characters, got {brief(value)}"
    return err.message


def _names(keys: Sequence[Any]) -> str:
    return ", ".join(repr(k) for k in keys)


def _lookup(doc: Any, path: Sequence[str | int]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def type_name(value: Any) -> str:
    """The JSON type of a Python value (a Python type name for non-JSON values)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def brief(value: Any, depth: int = 0) -> str:
    """A short JSON rendering for messages: nested containers become [...] / {...}."""
    if isinstance(value, list):
        if depth > 0:
            return "[...]"
        items = [brief(v, depth + 1) for v in value[:4]]
        if len(value) > 4:
            items.append("...")
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        if depth > 0 or len(value) > 4:
            return "{...}"
        return "{" + ", ".join(f"{json.dumps(str(k))}: {brief(v, depth + 1)}"
                               for k, v in value.items()) + "}"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = f"<{type(value).__name__}>"
    if len(text) > 40:
        text = text[:36] + ('..."' if isinstance(value, str) else "...")
    return text

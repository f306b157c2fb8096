"""Symbolic dimensions: the `shape` column's extension where a dim is a name or an expression.

A dim in a graph's `shape` column is an int (TVM's format) or a string: a name (`"batch"`), an
expression over names and ints with `+ - * // %`, `min(a, b)`, `max(a, b)` and parentheses
(`"seq*4"`, `"batch*seq"`, `"(seq-3)//2+1"`, `"min(seq, 512)"`), or
`"?"`, a size only the producing node's shape rule (or its data) decides. Names are bound by the
graph inputs' shapes when a module specialises (runtime/specialize.py).
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

UNKNOWN = "?"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEXT = re.compile(r"^[A-Za-z0-9_+\-*/%(), ]{1,400}$")
_CALLS: dict[str, Callable[[int, int], int]] = {"min": min, "max": max}
_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}

Dim = Any  # int | str


class DimError(ValueError):
    """A symbolic dim that is not an expression this module reads, or a name left unbound."""


def is_symbolic(dim: Any) -> bool:
    return isinstance(dim, str)


def shape_is_symbolic(shape: Sequence[Any]) -> bool:
    return any(isinstance(d, str) for d in shape)


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.expr:
    if text == UNKNOWN:
        raise DimError("'?' has no value until its producer runs")
    if not _TEXT.match(text):
        raise DimError(f"dim {text!r}: expected a name, an int, or an expression of them with "
                       "+ - * // % and parentheses (e.g. \"batch\", \"seq*4\"), or \"?\"")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise DimError(f"dim {text!r}: not an expression ({e.msg})") from None
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        ok = isinstance(node, (ast.BinOp, ast.Name, ast.Load, ast.UnaryOp, ast.USub, ast.UAdd,
                               *_OPS)) or (isinstance(node, ast.Constant)
                                           and type(node.value) is int)
        if isinstance(node, ast.Call):
            ok = (isinstance(node.func, ast.Name) and node.func.id in _CALLS
                  and len(node.args) == 2 and not node.keywords)
        if isinstance(node, ast.Name) and node.id in _CALLS and id(node) not in calls:
            ok = False  # min/max are functions, never dim names
        if not ok:
            raise DimError(f"dim {text!r}: {type(node).__name__} is not allowed; use names, ints, "
                           "+ - * // %, min(a, b) and max(a, b)")
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)) \
                and not _names(node.right) and _eval(node.right, {}, text) == 0:
            raise DimError(f"dim {text!r} divides by {ast.unparse(node.right)!r}, which is "
                           "always 0")
    return tree


def check_dim(dim: Any) -> str | None:
    """None when dim is a valid dim (an int >= 0, '?', or a readable expression); else why not."""
    if isinstance(dim, bool):
        return "a bool is not a dimension"
    if isinstance(dim, int):
        return None if dim >= 0 else f"{dim} is negative"
    if not isinstance(dim, str):
        return f"expected an int or a string, got {type(dim).__name__}"
    if dim == UNKNOWN:
        return None
    try:
        _parse(dim)
    except DimError as e:
        return str(e)
    return None


def names_in(dim: Any) -> list[str]:
    """The symbol names a dim refers to, in order of appearance."""
    if not isinstance(dim, str) or dim == UNKNOWN:
        return []
    return _names(_parse(dim))


def _names(node: ast.expr) -> list[str]:
    calls = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return list(dict.fromkeys(n.id for n in ast.walk(node)
                              if isinstance(n, ast.Name) and id(n) not in calls))


def evaluate(dim: Any, env: Mapping[str, int]) -> int:
    """The dim's value with names bound by env; DimError for '?' or a name env lacks."""
    if isinstance(dim, int):
        return dim
    try:
        value = eval(_code(dim), _GLOBALS, env)  # noqa: S307 (a checked expression: _code)
        if type(value) is int:
            return value
    except (ArithmeticError, NameError, TypeError):
        pass  # the walk below names the dim, the unbound name or the zero divisor
    return _eval(_parse(dim), env, dim)


_GLOBALS: dict[str, Any] = {"__builtins__": {}, **_CALLS}


@lru_cache(maxsize=4096)
def _code(text: str) -> Any:
    """The expression compiled once. NOTE: only what _parse accepts (names, ints, + - * // %,
    unary minus, min and max) gets here, so Python evaluates exactly what _eval would walk,
    several times faster (a decoder's step evaluates some 500 dims)."""
    return compile(ast.fix_missing_locations(ast.Expression(_parse(text))), "<dim>", "eval")


def _eval(node: ast.expr, env: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise DimError(f"dim {text!r}: name {node.id!r} is not bound by any input's shape")
        return int(env[node.id])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _CALLS[node.func.id](*(_eval(a, env, text) for a in node.args))
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _eval(node.left, env, text)
        right = _eval(node.right, env, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            bound = ", ".join(f"{n} = {env[n]}" for n in _names(node.right))
            raise DimError(f"dim {text!r} divides by {ast.unparse(node.right)!r}, which is 0"
                           + (f" for {bound}" if bound else ""))
        return _OPS[type(node.op)](left, right)
    raise DimError(f"dim {text!r}: cannot evaluate {type(node).__name__}")


def evaluate_shape(shape: Sequence[Any], env: Mapping[str, int]) -> tuple[int, ...]:
    """Every dim's value (one compiled evaluation for the whole shape where it can)."""
    shape = tuple(shape)
    try:
        value = eval(_shape_code(shape), _GLOBALS, env)  # noqa: S307 (checked: _code)
        if all(type(d) is int for d in value):
            return value  # type: ignore[no-any-return]
    except (ArithmeticError, NameError, TypeError, DimError):
        pass  # per dim below: the error names the dim
    return tuple(evaluate(d, env) for d in shape)


@lru_cache(maxsize=4096)
def _shape_code(shape: tuple[Any, ...]) -> Any:
    """A shape's dims as one compiled tuple expression, each dim checked by _parse."""
    return compile(_shape_text(shape), "<shape>", "eval")


def _shape_text(shape: tuple[Any, ...]) -> str:
    parts = [repr(d) if isinstance(d, int) and not isinstance(d, bool)
             else f"({ast.unparse(_parse(d))})" for d in shape]
    return "(" + "".join(p + "," for p in parts) + ")"


@lru_cache(maxsize=256)
def _shapes_code(shapes: tuple[tuple[Any, ...], ...]) -> Any:
    """The shapes' dims as one compiled tuple of tuples (each module of a model compiles the
    same: a server's fresh module for each request, ~0.5 ms a compile)."""
    return compile("(" + "".join(_shape_text(s) + "," for s in shapes) + ")", "<shapes>", "eval")


def shapes_evaluator(shapes: Sequence[Sequence[Any]]) -> Callable[[Mapping[str, int]], Any]:
    """evaluate_shape of every shape in one compiled call: f(env) gives their tuples, or None
    where a dim is not an int for env (a divisor 0, a name env lacks: evaluate_shape then names
    it). A decoder's next length evaluates the ~23 shapes its past length moves at once."""
    code = _shapes_code(tuple(tuple(s) for s in shapes))

    def run(env: Mapping[str, int]) -> Any:
        try:
            values = eval(code, _GLOBALS, env)  # noqa: S307 (each dim checked by _parse)
        except (ArithmeticError, NameError, TypeError):
            return None
        for shape in values:
            for d in shape:
                if type(d) is not int:
                    return None
        return values
    return run


def format_shape(shape: Sequence[Any]) -> str:
    """(batch, seq, 768) as people read it."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"

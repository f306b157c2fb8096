"""index_expr: a value worked out from its output's indices as one kernel.

The exporters write a decoder's causal and padding mask as index arithmetic: Ranges over the
sequence and the past, unsqueezed, compared, a Gather of the attention mask at
batch * total + position, logical ands and a Where (transformers' mask builder). As some
twenty ops of a few hundred elements, a decode step ran each at every new length and specialised
each new shape. frontend/fusion/fuse_index_expr.py writes such a region as one index_expr, whose
kernel evaluates it with NumPy on index grids no larger than its output: the same arithmetic on
the same values (each op of the region kept as the NumPy function the op runs), so the same
result, bit for bit.

Attrs:
- at: [[name, input, axis], ...]: each dim name read from an input's shape at each run
  (dim_values' `at`), so one kernel serves every value of the dims.
- shape: the output's dims: ints or expressions over those names ("past+seq").
- dtype: the output's dtype.
- expr: the output's element at each index, as a program of steps (a flat list: attrs hold
  no deeper lists) run on a stack of arrays, each broadcasting to the grid it is made on (the
  output's shape; an axis of size one reads index 0):
  ["idx", axis]: the index along an axis of the grid (int64); ["const", value, dtype]: a
  scalar; ["dim", "expression"]: a dim's value (int64);
  ["read", input]: the input's element at the index arrays popped, one per axis of the input;
  ["grid", dim, ...]: the next steps make a value on a grid of these dims, which ["flat"] pops,
  broadcasts to that grid and pushes flattened (its elements in order), back on the grid before;
  ["take", mode]: NumPy's take of the flattened value below the indices popped (a Gather);
  ["cast", dtype]; [fn]: an elementwise NumPy function of the values popped: add, subtract,
  multiply, the comparisons, logical_and, logical_or, logical_not, where.
  The program leaves one value: the output, broadcast to its shape.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ...graph.symbolic import check_dim, evaluate, evaluate_shape, names_in
from ..attrs import op_error, short_repr
from ..library import TensorSpec
from ..prepared import AnyShape
from ..registry import define_op, kernel
from .shape_of import dims_at

OP = "index_expr"
DTYPES = ("bool", "int32", "int64", "float32", "float64")
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "equal": np.equal, "not_equal": np.not_equal, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "logical_not": np.logical_not, "where": np.where}
ARITY = {"logical_not": 1, "where": 3}  # the others take two
MODES = ("clip", "wrap")
MAX_STEPS = 1024  # (attrs hold lists of at most 1024 values)


def _dtype(value: Any, where: str) -> str:
    if value not in DTYPES:
        raise op_error(OP, f"{where}: dtype {short_repr(value)}; expected one of "
                           f"{', '.join(DTYPES)}")
    return str(value)


def _dims(value: Any, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise op_error(OP, f"{where}: {short_repr(value)}; expected a list of dims")
    for d in value:
        problem = check_dim(d)
        if problem or d == "?":
            raise op_error(OP, f"{where}: dim {short_repr(d)}: {problem or 'unknown'}")
    return list(value)


def _check(program: Any, rank: int, inputs: Sequence[TensorSpec], names: set[str]) -> None:
    """program well formed for an output grid of rank dims: each step's kind and arguments,
    the axes, inputs, dtypes and dim names (placed by at) it reads, and the stack it leaves
    (one value, on the output's grid)."""
    if not isinstance(program, (list, tuple)) or not 0 < len(program) <= MAX_STEPS:
        raise op_error(OP, f"expr {short_repr(program)}; expected a list of 1 to {MAX_STEPS} "
                           "steps")
    depth, grids = 0, [rank]  # values on the stack, the ranks of the grids entered
    flats = 0  # flattened values on the stack, each read by one take
    for k, step in enumerate(program):
        if not isinstance(step, (list, tuple)) or not step or not isinstance(step[0], str):
            raise op_error(OP, f"expr step {k}: {short_repr(step)}; expected [kind, ...]")
        kind, args = step[0], list(step[1:])

        def wrong(expected: str) -> Exception:
            return op_error(OP, f"expr step {k}: {short_repr(step)}; expected {expected}")
        pops, pushes = 0, 1
        if kind == "idx":
            if len(args) != 1 or type(args[0]) is not int or not 0 <= args[0] < grids[-1]:
                raise wrong(f'["idx", axis] with an axis of the {grids[-1]}-dim grid')
        elif kind == "const":
            if len(args) != 2 or not isinstance(args[0], (bool, int, float)):
                raise wrong('["const", number, dtype]')
            _dtype(args[1], f"expr step {k}")
        elif kind == "dim":
            if len(args) != 1 or not isinstance(args[0], (str, int)) or check_dim(args[0]):
                raise wrong('["dim", "expression"]')
            _placed(names_in(args[0]), names, k)
        elif kind == "read":
            if len(args) != 1 or type(args[0]) is not int or not 0 <= args[0] < len(inputs):
                raise wrong(f'["read", input] with one of the {len(inputs)} inputs')
            pops = len(inputs[args[0]].shape)
        elif kind == "grid":
            _dims(args, f"expr step {k}")
            _placed([n for d in args for n in names_in(d)], names, k)
            grids.append(len(args))
            pushes = 0
            if len(grids) > MAX_STEPS:
                raise wrong("fewer grids")
        elif kind == "flat":
            if len(grids) < 2 or args:
                raise wrong('["flat"] closing a ["grid", ...]')
            grids.pop()
            pops, flats = 1, flats + 1
        elif kind == "take":
            if len(args) != 1 or args[0] not in MODES or not flats:
                raise wrong(f'["take", mode] (mode {" or ".join(MODES)}) after a ["flat"]')
            pops, flats = 2, flats - 1
        elif kind == "cast":
            if len(args) != 1:
                raise wrong('["cast", dtype]')
            _dtype(args[0], f"expr step {k}")
            pops = 1
        elif kind in FUNCTIONS:
            if args:
                raise wrong(f"[{kind!r}] alone")
            pops = ARITY.get(kind, 2)
        else:
            raise op_error(OP, f"expr step {k}: unknown kind {short_repr(kind)}; expected idx, "
                               f"const, dim, read, grid, flat, take, cast or one of "
                               f"{', '.join(FUNCTIONS)}")
        if depth < pops:
            raise wrong(f"{pops} values on the stack; it holds {depth}")
        depth += pushes - pops
    if depth != 1 or len(grids) != 1 or flats:
        raise op_error(OP, f"expr leaves {depth} values and {len(grids) - 1} grids open; "
                           "expected the output alone")


def _placed(read: Sequence[str], names: set[str], k: int) -> None:
    missing = [n for n in read if n not in names]
    if missing:
        raise op_error(OP, f"expr step {k}: reads {', '.join(missing)}, which `at` does not "
                           "place")


def _params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
            ) -> tuple[list[tuple[str, int, int]], list[Any], str, Any]:
    shape = _dims(attrs.get("shape"), "shape")
    items = dims_at(inputs, attrs, shape, OP)
    dtype = _dtype(attrs.get("dtype"), "dtype")
    expr = attrs.get("expr")
    _check(expr, len(shape), inputs, {name for name, _, _ in items})
    return items, shape, dtype, expr


def _env(items: Sequence[tuple[str, int, int]], shapes: Sequence[Sequence[int]]
         ) -> dict[str, int]:
    return {name: int(shapes[pos][axis]) for name, pos, axis in items}


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    items, shape, dtype, _ = _params(inputs, attrs)
    dims = evaluate_shape(shape, _env(items, [i.shape for i in inputs]))
    if any(d < 0 for d in dims):
        raise op_error(OP, f"shape {shape} is {list(dims)} at these inputs' shapes")
    return [TensorSpec(dims, dtype)]


def compile_program(program: Sequence[Any], ranks: Sequence[int], rank: int
                    ) -> Callable[[Sequence[np.ndarray], Mapping[str, int], tuple[int, ...]],
                                  np.ndarray]:
    """The program (checked by _check for an output of rank dims; ranks: its inputs') as one
    Python function of the inputs, the dims' values and the output's dims, giving an array
    that broadcasts to them: each step's NumPy call written out once (interpreted, a decode
    step's mask took 21 us a call, 75 after the weights' stream). An index grid read once is
    made where it is read, so an input read whole (its grid its shape) makes none."""
    space: dict[str, Any] = {"_axis": _axis, "_take": np.take, "_flat": _flat, "_dim": _dim,
                             "_i64": np.int64, "_shape": evaluate_shape}
    space.update({f"_{name}": fn for name, fn in FUNCTIONS.items()})
    on = _grids_of(program)
    uses = Counter((on[k], step[1]) for k, step in enumerate(program) if step[0] == "idx")
    lines: list[str] = []
    stack: list[str] = []
    made: dict[tuple[str, int], str] = {}  # (grid, axis) read more than once -> its name

    def name(value: Any) -> str:
        key = f"c{len(space)}"
        space[key] = value
        return key

    def axis(grid: str, a: int) -> str:
        if uses[(grid, a)] < 2:
            return f"_axis({grid}, {a})"
        if (grid, a) not in made:
            made[(grid, a)] = f"i{len(made)}"
            lines.append(f"{made[(grid, a)]} = _axis({grid}, {a})")
        return made[(grid, a)]
    ranks_of = {"g0": rank}
    for k, step in enumerate(program):
        kind, grid = step[0], on[k]
        if kind == "idx":
            stack.append(axis(grid, step[1]))
        elif kind == "const":
            stack.append(name(np.array(step[1], dtype=step[2])))
        elif kind == "dim":
            dim = step[1]
            stack.append(f"_i64(env[{dim!r}])" if isinstance(dim, str) and dim.isidentifier()
                         else f"_dim({name(dim)}, env)")
        elif kind == "read":
            count = ranks[step[1]]
            index = stack[len(stack) - count:]
            del stack[len(stack) - count:]
            x = f"inputs[{step[1]}]"
            read = f"{x}[({''.join(i + ', ' for i in index)})]"
            if ranks_of[grid] == count and index == [
                    made.get((grid, a), f"_axis({grid}, {a})") for a in range(count)]:
                # its grid's axes in order: the input itself where the grid is its shape
                read = f"({x} if {x}.shape == {grid} else {read})"
            stack.append(read)
        elif kind == "grid":  # (on the grid it opens)
            ranks_of[grid] = len(step) - 1
            lines.append(f"{grid} = _shape({name(tuple(step[1:]))}, env)")
        elif kind == "flat":  # (on the grid it closes)
            stack.append(f"_flat({stack.pop()}, {grid})")
        elif kind == "take":
            where = stack.pop()
            stack.append(f"_take({stack.pop()}, {where}, mode={name(step[1])})")
        elif kind == "cast":
            stack.append(f"{stack.pop()}.astype({name(step[1])})")
        else:
            arity = ARITY.get(kind, 2)
            args = stack[len(stack) - arity:]
            del stack[len(stack) - arity:]
            stack.append(f"_{kind}({', '.join(args)})")
    body = "".join(f"    {line}\n" for line in lines)
    exec(f"def run(inputs, env, g0):\n{body}    return {stack[0]}\n", space)  # noqa: S102
    return space["run"]  # type: ignore[no-any-return]


def _grids_of(program: Sequence[Any]) -> list[str]:
    """The name of the grid each step is made on ("g0": the output's), each ["grid", ...]
    naming a new one (the step itself is on it; its ["flat"] is on the grid it closes)."""
    names, open_ = [], ["g0"]
    made = 0
    for step in program:
        if step[0] == "grid":
            made += 1
            open_.append(f"g{made}")
        names.append(open_[-1])
        if step[0] == "flat":
            open_.pop()
    return names


def _axis(dims: Sequence[int], axis: int) -> np.ndarray:
    """The index along axis of a grid of dims, shaped to broadcast against it."""
    view = [1] * len(dims)
    view[axis] = dims[axis]
    return np.arange(dims[axis], dtype=np.int64).reshape(view)


def _flat(value: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    return (value if value.shape == dims else np.broadcast_to(value, dims)).reshape(-1)


def _dim(expression: Any, env: Mapping[str, int]) -> np.ndarray:
    return np.array(evaluate(expression, env), np.int64)


class IndexExprKernel(AnyShape):
    """The expression on host arrays, its dims read from the inputs' shapes at each call: one
    kernel serves every shape (a decoder's every past length). On a GPU or OpenCL device the
    inputs it reads are copied to the host and the output back (a mask of a few hundred
    elements)."""

    def __init__(self, backend: Backend, items: list[tuple[str, int, int]], shape: list[Any],
                 expr: Any, inputs: Sequence[TensorSpec], host: bool) -> None:
        super().__init__(self._write)
        self.backend, self.items, self.shape = backend, items, shape
        self.program = compile_program(expr, [len(i.shape) for i in inputs], len(shape))
        # the inputs whose elements it reads (the others give dims alone)
        self.read = frozenset(step[1] for step in expr if step[0] == "read")
        self.host = host  # its arrays are NumPy's (the CPU backend)

    def _write(self, *arrays: Any) -> None:
        inputs, out = arrays[:-1], arrays[-1]
        env = _env(self.items, [x.shape for x in inputs])
        dims = evaluate_shape(self.shape, env)
        if tuple(out.shape) != dims:
            raise op_error(OP, f"output of shape {list(out.shape)}; its shape {self.shape} is "
                               f"{list(dims)} at these inputs' shapes")
        if not self.host:
            inputs = tuple(self.backend.to_host(x) if k in self.read else x
                           for k, x in enumerate(inputs))
        value = self.program(inputs, env, dims)
        if self.host:
            np.copyto(out, value, casting="unsafe")
        else:
            self.backend.from_host(np.ascontiguousarray(
                np.broadcast_to(value, dims).astype(out.dtype)), out)


def _made(backend: Backend, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
          host: bool) -> IndexExprKernel:
    items, shape, _, expr = _params(inputs, attrs)
    return IndexExprKernel(backend, items, shape, expr, inputs, host)


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    return _made(backend, inputs, attrs, True)


def _device(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    return _made(backend, inputs, attrs, False)


define_op(OP, _infer, None, ("at", "shape", "dtype", "expr"))
kernel(OP, "cpu")(_cpu)
for _backend in ("cuda", "opencl"):
    kernel(OP, _backend)(_device)

"""Symbolic dims at import: integer polynomials over dim names, decided or refused, never guessed
(docs/symbolic_shapes.md)."""
from __future__ import annotations

import math
import re
from typing import Any, Sequence, Union

import numpy as np

from .ir import Unsupported

# Every symbolic value the import meets is a size or an index derived from sizes: its magnitude
# is below 2^62 (no tensor holds 2^62 elements), so min/max against such a bound is decided.
BOUND = 1 << 62
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Monomial = tuple[str, ...]  # sorted atom texts, repeated for powers


class Undecidable(Unsupported, ValueError):
    """A question about symbolic dims the import cannot answer without their values (a
    ValueError too: a fusion matcher meeting one leaves its prims, as for any shape it did not
    expect)."""


class Sym:
    """An integer polynomial over atoms (dim names, or opaque `(p)//q`, `(p)%q`, min, max)."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: dict[Monomial, int]) -> None:
        self.terms = tuple(sorted(((m, c) for m, c in terms.items() if c),
                                  key=lambda t: (not t[0], len(t[0]), t[0])))
        self._hash = hash(self.terms)

    @staticmethod
    def name(text: str) -> Sym:
        return Sym({(text,): 1})

    # -- canonical construction ----------------------------------------------------------------

    @staticmethod
    def _poly(x: Any) -> dict[Monomial, int]:
        if isinstance(x, Sym):
            return dict(x.terms)
        if _is_np_int(x):
            return {(): int(x)} if int(x) else {}
        if isinstance(x, bool) or not isinstance(x, int):
            raise Undecidable(f"arithmetic of a symbolic dim with {type(x).__name__} {x!r}: "
                              "only integer expressions are kept at import")
        return {(): x} if x else {}

    def constant(self) -> int:
        return dict(self.terms).get((), 0)

    def __add__(self, other: Any) -> SymInt:
        terms = self._poly(self)
        for m, c in self._poly(other).items():
            terms[m] = terms.get(m, 0) + c
        return make(terms)

    __radd__ = __add__

    def __neg__(self) -> SymInt:
        return make({m: -c for m, c in self.terms})

    def __pos__(self) -> Sym:
        return self

    def __sub__(self, other: Any) -> SymInt:
        return self + (-as_int(other))

    def __rsub__(self, other: Any) -> SymInt:
        return (-self) + other

    def __mul__(self, other: Any) -> SymInt:
        terms: dict[Monomial, int] = {}
        for m1, c1 in self._poly(self).items():
            for m2, c2 in self._poly(other).items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return make(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> SymInt:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Any) -> SymInt:
        return floordiv(other, self)

    def __mod__(self, other: Any) -> SymInt:
        return mod(self, other)

    def __rmod__(self, other: Any) -> SymInt:
        return mod(other, self)

    # -- questions -----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (int, Sym)) and not _is_np_int(other):
            return NotImplemented
        diff = self - other
        if isinstance(diff, int):
            return diff == 0
        if nonneg(diff - 1) or nonneg(-diff - 1):
            return False  # sizes are >= 0: batch == -1 is decided
        step = math.gcd(*(c for m, c in diff.terms if m))
        if diff.constant() % step:
            return False  # 2*batch == 1 has no integer solution
        raise Undecidable(f"cannot decide at import whether {short(self)} == {short(other)}")

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def _le(self, other: Any, op: str, strict: bool) -> bool:
        """self < other (strict) or self <= other, where decided."""
        gap = as_int(other) - self - (1 if strict else 0)  # the comparison holds iff gap >= 0
        if nonneg(gap):
            return True
        if nonneg(-gap - 1):
            return False
        raise Undecidable(f"cannot decide at import whether {short(self)} {op} {short(other)}")

    def __lt__(self, other: Any) -> bool:
        return self._le(other, "<", True)

    def __le__(self, other: Any) -> bool:
        return self._le(other, "<=", False)

    def __gt__(self, other: Any) -> bool:
        return not self._le(other, ">", False)

    def __ge__(self, other: Any) -> bool:
        return not self._le(other, ">=", True)

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        raise Undecidable(f"cannot decide at import whether {short(self)} is 0")

    def __index__(self) -> int:
        raise Undecidable(f"the symbolic dim {short(self)} is used where a number is needed at "
                          "import")

    __int__ = __index__

    def __float__(self) -> float:
        raise Undecidable(f"the symbolic dim {short(self)} is used where a number is needed at "
                          "import")

    def names(self) -> list[str]:
        """The dim names in the expression (inside opaque atoms too), in order."""
        found = [n for m, _ in self.terms for a in m for n in re.findall(r"[A-Za-z_]\w*", a)]
        return list(dict.fromkeys(n for n in found if n not in ("min", "max")))

    def __str__(self) -> str:
        parts = []
        for k, (m, c) in enumerate(self.terms):
            factors = [str(abs(c))] if abs(c) != 1 or not m else []
            text = "*".join(factors + list(m))
            if k == 0:
                parts.append(f"-{text}" if c < 0 else text)
            else:
                parts.append(f"-{text}" if c < 0 else f"+{text}")
        return "".join(parts)

    def __repr__(self) -> str:
        return f"Sym({self})"


SymInt = Union[int, Sym]


def short(x: Any, limit: int = 120) -> str:
    """x's text for a message, cut to limit characters."""
    text = str(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_np_int(x: Any) -> bool:
    return isinstance(x, np.integer)


def make(terms: dict[Monomial, int]) -> SymInt:
    """The canonical value of a polynomial: an int when it has no atoms."""
    terms = {m: c for m, c in terms.items() if c}
    if not terms:
        return 0
    if set(terms) == {()}:
        return terms[()]
    return Sym(terms)


def as_int(x: Any) -> SymInt:
    """x as a Python int or a Sym (NumPy integers included)."""
    if isinstance(x, Sym):
        return x
    if _is_np_int(x):
        return int(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    raise Undecidable(f"arithmetic of a symbolic dim with {type(x).__name__} {x!r}: only "
                      "integer expressions are kept at import")


def is_sym(x: Any) -> bool:
    return isinstance(x, Sym)


def _paren(x: SymInt) -> str:
    """x as an operand of // or %: parenthesised unless one atom or an int >= 0."""
    if isinstance(x, int):
        return str(x) if x >= 0 else f"({x})"
    if len(x.terms) == 1 and x.terms[0][1] == 1 and len(x.terms[0][0]) == 1:
        return str(x)
    return f"({x})"


# Opaque atoms known to be >= 0 (made from operands that are): a floor division or modulo by a
# positive int, min/max of values >= 0. The text decides the meaning, so the set is global.
_NONNEG: set[str] = set()
# Atoms the model being imported implies are >= 0 (window_length): cleared by reset().
_ASSUMED: set[str] = set()


def _atom(text: str, nonneg: bool = False) -> Sym:
    if nonneg:
        _NONNEG.add(text)
    return Sym({(text,): 1})


def window_length(x: SymInt) -> SymInt:
    """x, a sliding window's output length ((L + pads - span) // stride + 1), with its floor
    divisions known >= 0: the length exists only where the window fits (L + pads >= span),
    which the op's own rule checks when the module is specialised."""
    if isinstance(x, Sym):
        for m, _ in x.terms:
            for atom in m:
                if atom.startswith("(") and atom.endswith(")") and "//" in atom:
                    _ASSUMED.add(atom)
    return x


def reset() -> None:
    """Forget what earlier imports learned of atoms: an assumption holds for its model only
    (window_length's), and the tables stay small in a long process."""
    for table in (_NONNEG, _ASSUMED, _FLOORDIV, _ARGS):
        table.clear()


def nonneg(x: Any) -> bool:
    """Whether x >= 0 is decided (dim names are sizes: >= 0)."""
    x = as_int(x)
    if isinstance(x, int):
        return x >= 0
    return all(c > 0 if m else c >= 0 for m, c in x.terms) and all(
        a in _NONNEG or a in _ASSUMED or _NAME.match(a) for m, _ in x.terms for a in m)


def floordiv(a: Any, b: Any) -> SymInt:
    """a // b (Python's floor division): exact where b divides every coefficient."""
    a, b = as_int(a), as_int(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise Unsupported("a division by 0 in a dim computed at import")
        return a // b
    if isinstance(b, int):
        if b == 0:
            raise Unsupported(f"{a} // 0 in a dim computed at import")
        if b == 1:
            return a
        if all(c % b == 0 for _, c in a.terms):
            return make({m: c // b for m, c in a.terms})
        # NOTE: (b*q + r) // b = q + r // b only for the constant part: split it off when the
        # rest is exactly divisible (keeps ⌊(L - k)/s⌋ + 1 readable).
        rest = {m: c for m, c in a.terms if m}
        if all(c % b == 0 for c in rest.values()):
            q = make({m: c // b for m, c in rest.items()})
            return q + a.constant() // b
        inner = _FLOORDIV.get(next(iter(rest))[0]) if len(rest) == 1 and \
            list(rest.values()) == [1] and len(next(iter(rest))) == 1 else None
        if inner is not None and b > 0:
            # ⌊(⌊x/k⌋ + c)/b⌋ = ⌊(x + c·k)/(k·b)⌋ for integers, k, b > 0: a conv stack's
            # lengths flatten to one division, whichever way they were written.
            x, k = inner
            return floordiv(x + a.constant() * k, k * b)
    elif is_int(a, 0):
        return 0
    else:
        exact = _divide(a, b)
        if exact is not None:
            return exact
    positive_int = isinstance(b, int) and b > 0
    text = f"({_paren(a)}//{_paren(b)})"
    if positive_int:
        _FLOORDIV[text] = (a, b)
    return _atom(text, nonneg(a) and (positive_int or nonneg(b)))


def _divide(a: SymInt, b: Sym) -> SymInt | None:
    """a / b where a is b times one monomial (256*batch*(n+1) / (64*batch*(n+1)) is 4);
    None otherwise."""
    terms = Sym._poly(a)
    if not terms:
        return 0
    if len(b.terms) == 1:  # a monomial divides term by term
        (mb, cb), = b.terms
        out: dict[Monomial, int] = {}
        for m, c in terms.items():
            term = _term_quotient(m, c, mb, cb)
            if term is None:
                return None
            out[term[0]] = term[1]
        return make(out)
    (ma, ca), (mb, cb) = min(terms.items(), key=lambda t: (not t[0], len(t[0]), t[0])), \
        b.terms[0]
    lead = _term_quotient(ma, ca, mb, cb)
    if lead is None:
        return None
    q = make({lead[0]: lead[1]})
    product = q * b
    return q if isinstance(product, Sym) and product.terms == Sym(terms).terms else None


def _term_quotient(m: Monomial, c: int, mb: Monomial, cb: int) -> tuple[Monomial, int] | None:
    """c*m / (cb*mb) as (monomial, coefficient) where it is one; None otherwise."""
    left = list(m)
    for atom in mb:
        if atom not in left:
            return None
        left.remove(atom)
    return None if c % cb else (tuple(left), c // cb)


def mod(a: Any, b: Any) -> SymInt:
    """a % b (Python's sign rule): exact where b divides every non-constant coefficient."""
    a, b = as_int(a), as_int(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise Unsupported("a modulo by 0 in a dim computed at import")
        return a % b
    if isinstance(b, int):
        if b == 0:
            raise Unsupported(f"{a} % 0 in a dim computed at import")
        if b in (1, -1):
            return 0
        if all(c % b == 0 for m, c in a.terms if m):
            return a.constant() % b
    elif _divide(a, b) is not None:
        return 0  # d3 % d3
    return _atom(f"({_paren(a)}%{_paren(b)})", isinstance(b, int) and b > 0)


def _order(a: SymInt, b: SymInt) -> int | None:
    """-1, 0, 1 when a < b, a == b, a > b is decided; None otherwise."""
    diff = a - b
    if isinstance(diff, int):
        return (diff > 0) - (diff < 0)
    if nonneg(diff):
        return 1  # a >= b: either is right where they are equal
    if nonneg(-diff):
        return -1
    if isinstance(b, int) and abs(b) >= BOUND:
        return -1 if b > 0 else 1
    if isinstance(a, int) and abs(a) >= BOUND:
        return 1 if a > 0 else -1
    return None


# The dividend and the positive int divisor of each opaque floor-division atom, by its text.
_FLOORDIV: dict[str, tuple[SymInt, int]] = {}

# The operands of each opaque min/max atom, by its text: min(min(seq, 128), 128) is min(seq, 128).
_ARGS: dict[str, tuple[SymInt, SymInt]] = {}


def _operands(x: SymInt, fn: str) -> tuple[SymInt, SymInt] | None:
    if isinstance(x, Sym) and len(x.terms) == 1 and x.terms[0][1] == 1 \
            and len(x.terms[0][0]) == 1 and x.terms[0][0][0].startswith(fn + "("):
        return _ARGS.get(x.terms[0][0][0])
    return None


def _minmax(fn: str, a: SymInt, b: SymInt, keep_nonneg: bool) -> SymInt:
    for x, y in ((a, b), (b, a)):
        args = _operands(x, fn)
        if args is not None and any(same(y, arg) for arg in args):
            return x  # min(min(p, q), q) == min(p, q)
    first, second = sorted((a, b), key=str)
    text = f"{fn}({first}, {second})"
    _ARGS[text] = (first, second)
    return _atom(text, keep_nonneg)


def same_size(a: Any, b: Any) -> bool:
    """a == b for two sizes, where import cannot prove it, also: where they differ only by a
    clamp at 0 (max(x, 0) against x: a size is never negative), or where they agree at every
    one of SIZE_SAMPLES values of their names at which both are sizes of at least 1 (two
    formulas of one count: wav2vec2's dynamo export counts its frames through the convs'
    shapes, (s - 400)//320 + 1, and by its own floor arithmetic step by step). Never silently
    wrong: each node's shape rule checks its sizes again at every size specialised, and a
    difference there refuses the node, naming it. Undecidable where neither decides."""
    try:
        return bool(a == b)
    except Undecidable as undecided:
        plain_a, plain_b = unclamped_size(a), unclamped_size(b)
        try:
            if plain_a is not a or plain_b is not b:  # (else the same question again)
                return bool(plain_a == plain_b)
        except Undecidable:
            pass
        if _agree_where_sizes(a, b):
            return True
        raise undecided from None


def index_of_same_size(d: Any, candidates: Sequence[Any]) -> int | None:
    """The first candidate that is d itself or the same size (same_size), where none is
    undecidable before it decides; None where none is."""
    for k, c in enumerate(candidates):
        try:
            if c is d or same_size(c, d):
                return k
        except Undecidable:
            continue
    return None


SIZE_SAMPLES = 256  # values tried by _agree_where_sizes, from a fixed seed
SIZE_SAMPLES_NEEDED = 64  # of them, where both are sizes


def _agree_where_sizes(a: Any, b: Any) -> bool:
    """Whether a and b (symbolic, over the same names) are equal at every sampled binding of
    their names (1 to 2^20, seeded) where both evaluate to at least 1, with enough such."""
    import random

    from ..graph.symbolic import DimError, evaluate
    names = sorted(set(a.names() if isinstance(a, Sym) else []) |
                   set(b.names() if isinstance(b, Sym) else []))
    if not names or len(names) > 4:
        return False
    rng = random.Random(0)
    texts = (dim_text(a), dim_text(b))
    valid = 0
    for k in range(SIZE_SAMPLES):
        top = 1 << (4 + k % 17)  # small and large sizes alike
        env = {n: rng.randint(1, top) for n in names}
        try:
            x, y = (evaluate(t, env) for t in texts)
        except DimError:
            continue
        if x >= 1 and y >= 1:
            if x != y:
                return False
            valid += 1
    return valid >= SIZE_SAMPLES_NEEDED


def _clamp_of(x: Any) -> SymInt | None:
    """y where x is max(y, 0), else None."""
    args = _operands(x, "max") if isinstance(x, Sym) else None
    if args is None:
        return None
    lo, hi = args
    return hi if isinstance(lo, int) and lo == 0 else lo if isinstance(hi, int) and hi == 0 \
        else None


def unclamped_size(x: Any) -> Any:
    """The size x without its clamps at 0 (max(max(y, 0), 0) is y): a size is never negative,
    so where a model holds, they agree."""
    inner = _clamp_of(x)
    while inner is not None:
        x, inner = inner, _clamp_of(inner)
    return x


def clamped_by(x: SymInt, y: SymInt) -> bool:
    """Whether x is min(y, c) for some c: a slice's end clamped to a table's length."""
    args = _operands(x, "min")
    return args is not None and any(same(y, arg) for arg in args)


def sym_min(a: Any, b: Any) -> SymInt:
    a, b = as_int(a), as_int(b)
    order = _order(a, b)
    if order is not None:
        return a if order <= 0 else b
    return _minmax("min", a, b, nonneg(a) and nonneg(b))


def sym_max(a: Any, b: Any) -> SymInt:
    a, b = as_int(a), as_int(b)
    order = _order(a, b)
    if order is not None:
        return a if order >= 0 else b
    return _minmax("max", a, b, nonneg(a) or nonneg(b))


def same(a: Any, b: Any) -> bool:
    """Whether a == b is decided True (False where decided different or undecidable)."""
    try:
        return bool(as_int(a) == as_int(b))
    except Undecidable:
        return False


def decided_unequal(a: Any, b: Any) -> bool:
    """Whether a != b is decided True. A reshape's element counts that cannot be compared at
    import ((batch*d)//3*3 against batch*d) are compared by the op's own rule when the module is
    specialised, which refuses the sizes where they differ."""
    try:
        return bool(as_int(a) != as_int(b))
    except Undecidable:
        return False


def same_shape(a: Any, b: Any) -> bool:
    """Whether two shapes are decided equal (False where they differ or cannot be told)."""
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def is_int(x: Any, value: int) -> bool:
    """Whether x is the literal int value (a symbolic dim never is, whatever it may hold)."""
    return not isinstance(x, Sym) and x == value


def has_sym(values: Any) -> bool:
    """Whether a shape, list or object array holds a Sym."""
    if isinstance(values, Sym):
        return True
    if isinstance(values, np.ndarray):
        return values.dtype == object and any(isinstance(v, Sym) for v in values.reshape(-1))
    if isinstance(values, (list, tuple)):
        return any(has_sym(v) for v in values)
    return False


def to_json(value: Any) -> Any:
    """Attr values with each Sym as `{"dim": "expr"}` (lib.json's symbolic attr)."""
    if isinstance(value, Sym):
        return {"dim": str(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def dim_text(d: Any) -> Any:
    """A shape dim for the graph's shape column: an int, or the expression's text."""
    return str(d) if isinstance(d, Sym) else int(d)


def evaluate(value: SymInt, env: dict[str, int]) -> int:
    """value with names bound (through graph/symbolic.py's parser: the format's own meaning)."""
    from ..graph.symbolic import evaluate as evaluate_text
    return value if isinstance(value, int) else evaluate_text(str(value), env)


def slice_range(dim: Any, start: Any, end: Any, step: int) -> tuple[SymInt, SymInt, SymInt]:
    """(begin, end, count) of range(dim)[start:end:step] for a step > 0, begin and end clamped
    to [0, dim]; Undecidable where a sign or a clamp is not decided."""
    if step <= 0:
        raise Undecidable(f"a slice of step {step} over the symbolic dim {short(dim)}")

    def clamp(v: SymInt) -> SymInt:
        if isinstance(v, int) and v <= -BOUND:
            return 0
        if not nonneg(v):
            if not nonneg(-as_int(v) - 1):
                raise Undecidable(f"cannot decide at import whether the slice bound {short(v)} is "
                                  "negative")
            v = v + dim
            return sym_max(v, 0) if not nonneg(v) else v
        return sym_min(v, dim)

    first, last = clamp(as_int(start)), clamp(as_int(end))
    count = sym_max(floordiv(last - first + step - 1, step), 0)
    return first, last, count


def broadcast_dims(dims: list[Any], what: str) -> SymInt:
    """One axis of NumPy broadcasting over ints and Syms: literal 1s first, then equal dims."""
    rest = [d for d in dims if not (isinstance(d, int) and d == 1)]
    if not rest:
        return 1
    first = rest[0]
    for d in rest[1:]:
        if clamped_by(first, d):
            first = d  # see below
        elif clamped_by(d, first):
            pass
        elif not same_size(first, d):
            raise Unsupported(f"{what}: dims {[str(x) for x in dims]} do not broadcast")
    # NOTE: min(seq, 128) meets seq where a slice of a 128-row table (BERT's position ids) is
    # broadcast against the input: the model holds only for seq <= 128, where they are equal.
    # The result is seq; specialising for a larger seq refuses that node (its shape rule sees
    # 128 against seq), so the assumption is checked, never silently wrong.
    return first

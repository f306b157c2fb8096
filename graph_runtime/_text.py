"""Text helpers shared by messages and reports: byte counts, plurals, shapes, plain tables."""
from __future__ import annotations

from typing import Any, Sequence


def fmt_bytes(n: int) -> str:
    """n bytes for people: "512 B", "1.5 KiB" ... "8.0 PiB"."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def count_of(count: int, noun: str, plural: str | None = None) -> str:
    """ "1 output", "2 outputs"; plural for nouns not made with an s ("entries")."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural or noun + 's'}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    """A plain text table; numbers are right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if numeric[i] else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"

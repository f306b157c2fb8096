"""Symbolic dims at import (frontend/symdim.py): canonical arithmetic, decisions, refusals."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from graph_runtime.frontend.symdim import (Sym, Undecidable, broadcast_dims, floordiv, mod,
                                           nonneg, same_size, slice_range, sym_max, sym_min)
from graph_runtime.graph.symbolic import DimError, check_dim, evaluate, names_in

SEQ, PAST, BATCH = Sym.name("seq"), Sym.name("past"), Sym.name("batch")


def test_arithmetic_is_canonical_and_prints_an_expression_the_graph_reads() -> None:
    assert str(BATCH * SEQ * 16) == "16*batch*seq" and str(SEQ * 4 // 4) == "seq"
    assert (SEQ + 1) - SEQ == 1 and isinstance((SEQ + 1) - SEQ, int)
    assert SEQ * BATCH == BATCH * SEQ and hash(SEQ * BATCH) == hash(BATCH * SEQ)
    assert floordiv(256 * BATCH * (SEQ + 1), 64 * BATCH * (SEQ + 1)) == 4
    assert str((SEQ - 3) // 2 + 1) == "((seq-3)//2)+1"
    assert mod(4 * SEQ + 6, 4) == 2 and str(3 - SEQ) == "-seq+3"
    assert sym_min(SEQ, 2 ** 63 - 1) is SEQ and sym_max(SEQ, 0) is SEQ
    assert str(sym_min(sym_min(SEQ, 128), 128)) == "min(128, seq)"
    # Nested floor divisions flatten (a conv stack's length, however it was written).
    assert floordiv(floordiv(SEQ - 10, 5) + 1 - 3, 2) == floordiv(SEQ - 20, 10)
    assert str(floordiv(floordiv(floordiv(SEQ - 10, 5) - 2, 2) - 2, 2)) == "((seq-40)//20)"
    # Every expression evaluates, through the graph format's parser, as Python computes it.
    exprs = [((SEQ - 3) // 2 - 1) // 3 + 1, (BATCH * SEQ + 3) % (BATCH * SEQ),
             floordiv(BATCH * SEQ + 1, BATCH),
             sym_max(SEQ - 5, 0) // 3 - PAST, sym_min(SEQ, PAST + 2) * BATCH, -((-SEQ) // 4)]
    for seq, past, batch in itertools.product((1, 3, 17), (0, 5), (1, 2)):
        env = {"seq": seq, "past": past, "batch": batch}
        want = [((seq - 3) // 2 - 1) // 3 + 1, (batch * seq + 3) % (batch * seq),
                (batch * seq + 1) // batch,
                max(seq - 5, 0) // 3 - past, min(seq, past + 2) * batch, -((-seq) // 4)]
        assert [evaluate(str(e), env) for e in exprs] == want, env


def test_questions_are_decided_or_refused_never_guessed() -> None:
    assert (SEQ == SEQ + 1) is False and (SEQ + 1 == 1 + SEQ) is True
    assert (BATCH == -1) is False  # a size is >= 0
    assert (2 * BATCH == 1) is False  # no integer solution
    assert SEQ + 1 > SEQ and nonneg(BATCH * SEQ + 2) and not nonneg(SEQ - 1)
    with pytest.raises(Undecidable, match=r"cannot decide at import whether seq == past\+1"):
        _ = SEQ == PAST + 1
    with pytest.raises(Undecidable, match="whether seq < 4"):
        _ = SEQ < 4
    with pytest.raises(Undecidable, match="where a number is needed"):
        np.zeros((SEQ, 3))
    with pytest.raises(Undecidable):
        int(SEQ)
    with pytest.raises(Undecidable):
        bool(SEQ - PAST)


def test_slices_clamp_symbolically() -> None:
    assert slice_range(SEQ, 0, 2 ** 63 - 1, 1) == (0, SEQ, SEQ)
    first, last, count = slice_range(SEQ, 0, 128, 1)
    assert str(last) == "min(128, seq)" and count == last
    first, last, count = slice_range(SEQ, 1, -1, 1)
    assert str(first) == "min(1, seq)" and str(last) == "max(0, seq-1)"  # seq may be 0
    with pytest.raises(Undecidable, match="step -1"):
        slice_range(SEQ, -1, -2 ** 63, -1)


def test_dim_grammar_takes_min_and_max_and_stays_strict() -> None:
    assert evaluate("min(seq, 512)+max(a, 3)*((seq-3)//2)", {"seq": 9, "a": 1}) == 18
    assert names_in("min(seq, past+1)") == ["seq", "past"]
    for bad in ("min(a)", "foo(a, b)", "min", "max(a, b, c)", "min(a, b=1)", "abs(a)"):
        assert check_dim(bad) is not None, bad
    with pytest.raises(DimError):
        evaluate("min(seq)", {"seq": 1})


def _floor(a: object, b: int) -> object:
    """floor(a / b) as a dynamo export writes it for a that may be negative:
    max(a, 0) // b - ceil(max(-a, 0) / b)."""
    return floordiv(sym_max(a, 0), b) - floordiv(sym_max(-a, 0) + b - 1, b)


def test_one_size_under_two_formulas_is_the_same_size() -> None:
    """wav2vec2's frames counted through its convs ((s - 400)//320 + 1) and by its own floor
    arithmetic (negatives floored through max): equal wherever both are sizes, which the
    sampled values show; each node's shape rule checks them again at every size."""
    s = Sym.name("s")
    convs = floordiv(s - 400, 320) + 1
    steps = _floor(_floor(floordiv(s, 80) - 1, 2), 2)  # floor((s - 80) / 320), as dynamo wrote
    with pytest.raises(Undecidable):
        _ = convs == steps  # the plain question stays undecided
    assert same_size(convs, steps) and same_size(steps, convs)
    assert broadcast_dims([convs, steps], "add") is convs
    for samples in (400, 719, 720, 16000, 123457):
        assert evaluate(str(convs), {"s": samples}) == evaluate(str(steps), {"s": samples})
    # a clamp at 0 is no difference for a size
    assert same_size(sym_max(SEQ - 3, 0), SEQ - 3)
    # formulas that differ where both are sizes stay undecided, never taken as one
    for a, b in [(SEQ // 2, SEQ // 3), (SEQ, sym_max(SEQ, 5)), (SEQ + PAST, SEQ * PAST)]:
        with pytest.raises(Undecidable):
            same_size(a, b)
        with pytest.raises(Undecidable):
            broadcast_dims([a, b], "add")
    assert same_size(4, 4) and not same_size(4, 5) and not same_size(SEQ, SEQ + 1)

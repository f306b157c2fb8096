"""Run ONNX's backend node tests through graph_runtime and print the counts per op type.

Each case is PASS, REFUSED (a GraphRuntimeError at import/create) or FAILED (a wrong result or
any other exception; the test suite fails on those). The table lists every op type with its
counts, the ones with most cases not passing first, so the cheapest wins are easy to see; the
last line is the summary the README quotes. --write-list rewrites
tests/frontend/onnx_node_passing.txt from a CPU run.

Usage: python scripts/onnx_conformance.py [--device cpu|opencl] [--listed] [--every K]
           [--json OUT.json] [--write-list] [--refusals] [--no-freeze]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "frontend"))
from onnx_node_cases import (  # the test suite's own harness
    PASS,
    REFUSED,
    CaseFailure,
    node_cases,
    op_type,
    read_passing_list,
    run_case,
    write_passing_list,
)

FAILED = "failed"


def classify(name: str, device: str, freeze: bool = True) -> tuple[str, str]:
    """(status, detail) for one case; never raises."""
    try:
        outcome = run_case(node_cases()[name], device, freeze)
    except CaseFailure as e:
        return FAILED, "wrong result: " + str(e).strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001  (the point is to count every other exception)
        return FAILED, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    return outcome.status, outcome.detail.splitlines()[0] if outcome.detail else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--listed", action="store_true",
                        help="only the cases in tests/frontend/onnx_node_passing.txt")
    parser.add_argument("--every", type=int, default=1, help="every k-th case (a spread)")
    parser.add_argument("--json", metavar="OUT.json", help="write every case's outcome")
    parser.add_argument("--write-list", action="store_true",
                        help="rewrite tests/frontend/onnx_node_passing.txt (CPU, all cases)")
    parser.add_argument("--no-freeze", action="store_true",
                        help="feed every input at run time (no shape-deciding input frozen)")
    parser.add_argument("--refusals", action="store_true",
                        help="also print the most common refusal and failure messages")
    args = parser.parse_args()

    cases = node_cases()
    names = read_passing_list() if args.listed else list(cases)
    names = sorted(names)[::args.every]
    start = time.perf_counter()
    results = {name: classify(name, args.device, not args.no_freeze) for name in names}
    seconds = time.perf_counter() - start

    by_op: dict[str, Counter[str]] = defaultdict(Counter)
    for name, (status, _) in results.items():
        by_op[op_type(name)][status] += 1
    print(f"{'op type':<36} {'cases':>5} {'pass':>5} {'refused':>7} {'failed':>6}")
    for op, counts in sorted(by_op.items(), key=lambda kv: (-(sum(kv[1].values())
                                                               - kv[1][PASS]), kv[0])):
        print(f"{op:<36} {sum(counts.values()):>5} {counts[PASS]:>5} {counts[REFUSED]:>7} "
              f"{counts[FAILED]:>6}")
    totals = Counter(status for status, _ in results.values())
    if args.refusals:
        for status in (FAILED, REFUSED):
            messages = Counter(detail[:110] for s, detail in results.values() if s == status)
            print(f"\nmost common {status} messages:")
            for message, count in messages.most_common(25):
                print(f"{count:5d}  {message}")
    print(f"\nONNX backend node tests on {args.device}: {len(results)} cases, {totals[PASS]} pass, "
          f"{totals[REFUSED]} refused, {totals[FAILED]} failed; {seconds:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": args.device, "seconds": seconds, "counts": dict(totals),
             "cases": {n: {"op_type": op_type(n), "status": s, "detail": d}
                       for n, (s, d) in results.items()}}, indent=1), encoding="utf-8")
    if args.write_list:
        if args.device != "cpu" or args.listed or args.every != 1 or args.no_freeze:
            parser.error("--write-list needs a CPU run over every case")
        write_passing_list([n for n, (s, _) in results.items() if s == PASS])
        print(f"wrote tests/frontend/onnx_node_passing.txt ({totals[PASS]} cases)")


if __name__ == "__main__":
    main()

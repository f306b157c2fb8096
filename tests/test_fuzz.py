"""Fuzzing the input paths: mutated graph JSON, lib.json, TVM params, .npz and ONNX files.

Every mutated input must be accepted or refused with one of the project's own errors
(GraphRuntimeError subclasses): never another exception, never past a time bound per case, never
past a memory limit. Each target runs in a subprocess whose address space is capped with
resource.setrlimit, so an input that makes the loader allocate without bound shows up as a
MemoryError escape instead of taking the machine down. The mutator is our own and seeded, so a
failure names a case that reproduces: `python tests/test_fuzz.py TARGET CASES SEED`.

A longer campaign runs outside the suite: `python tests/test_fuzz.py campaign TARGET CASES SEED`
runs the cases in worker processes (many cases each, under the same memory limit), restarts a
worker that dies or hangs, and reports every case that escaped, crashed, hung, ran slow, grew
the process's (or a forked child's) peak memory by more than HEAVY_BYTES, or was refused with an
"internal error" (an exception relabelled: a check missing before it).
"""
from __future__ import annotations

import copy
import io
import json
import os
import random
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
from support import backend_missing, concrete_shape

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "graphs"
CASES = 500  # per target but onnx: 2,000 in all
TARGET_CASES = {"onnx": 600}  # ONNX seeds include the node-test models (~5 s to collect)
MEMORY_LIMIT = 3 << 30  # bytes of address space for the fuzzing process
CASE_SECONDS = 5.0  # one case slower than this is a finding
MEMORY_CAP = 64 << 20  # create()'s memory cap for graphs that load
HEAVY_BYTES = 512 << 20  # one case whose peak memory grows past this is a finding

# Values that broke loaders before: wrong types, huge and negative numbers, long strings.
HOSTILE = [None, True, False, 0, -1, 1, 2, 1.0, 64.0, 0.5, -2 ** 63, 2 ** 31, 2 ** 40, 2 ** 63,
           2 ** 64, 1e308, "", "0", "1", "x", "NaN", "-1", "1e9", "x" * 2000, [], {}, [0],
           [2 ** 40, 2 ** 40], [0, 2 ** 62], [[0, 0, 0]], {"op": "relu"}, ["list_int", [0]],
           "float32", "__copy", "__nop", "dense", "conv2d", "n % 0", "n / (n - 100)",
           "batch // 0", {"dim": "batch % (batch - 1)"}]
# Text that JSON parsers choke on, spliced into the serialized document.
HOSTILE_TEXT = ["[" * 5000, "9" * 5000, "NaN", "Infinity", "\"\\ud800\"", "\x00", "\xff",
                "{\"a\": 1, \"a\": 2}", "1e999", "-0"]


# ---- mutators ---------------------------------------------------------------------------------

def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (lists sampled to their first 6 items)."""
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:6]):
            out += _paths(value, prefix + (i,))
    return out


def mutate_doc(doc: Any, rng: random.Random) -> str:
    """The document's JSON text after 1-3 structural mutations, sometimes also a textual one;
    half the time instead one near miss (a leaf number or string nudged), which gets past
    the schema to the semantic checks, planning and kernels."""
    doc = copy.deepcopy(doc)
    if rng.random() < 0.5:
        _near_miss(doc, rng)
        return json.dumps(doc)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.6:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
        elif action < 0.75 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.9 and isinstance(parent, list):
            parent.append(copy.deepcopy(rng.choice(parent)) if parent else None)
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice([doc, parent]))
    text = json.dumps(doc)
    if rng.random() < 0.2:
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(HOSTILE_TEXT) + text[at:]
    return text


def _near_miss(doc: Any, rng: random.Random) -> None:
    """Replace one leaf with a plausible neighbour: an int +-1, 0, doubled, or another leaf."""
    leaves = [p for p in _paths(doc) if p and not isinstance(_get(doc, p), (dict, list))]
    path = rng.choice(leaves)
    value = _get(doc, path)
    if isinstance(value, int) and not isinstance(value, bool):
        # float(value): JSON Schema's "integer" takes 64.0; the loaders must not (issue 30)
        new: Any = rng.choice([value - 1, value + 1, 0, 2 * value, value * 1000, -value,
                               float(value)])
    elif isinstance(value, str) and value.isdigit():
        new = str(rng.choice([int(value) + 1, 0, int(value) * 1000]))
    elif isinstance(value, str) and ("/" in value or "%" in value):
        # A size expression: a divisor that is always 0, or 0 for KERNEL_GRAPH's n of 100.
        new = rng.choice([f"{value} % 0", f"({value}) / (n - 100)"])
    else:
        new = _get(doc, rng.choice(leaves))
    _get(doc, path[:-1])[path[-1]] = new


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """1-4 byte-level mutations: flips, 64-bit field overwrites, truncation, duplication."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        action = rng.random()
        at = rng.randrange(len(out))
        if action < 0.4:
            out[at] ^= 1 << rng.randrange(8)
        elif action < 0.7:
            value = rng.choice([0, 1, 2 ** 31, 2 ** 40, 2 ** 63, 2 ** 64 - 1, rng.getrandbits(64)])
            out[at:at + 8] = value.to_bytes(8, "little")
        elif action < 0.85:
            del out[rng.randrange(len(out)):]
        else:
            end = min(len(out), at + rng.randint(1, 64))
            out[at:at] = out[at:end]
    return bytes(out)


# ---- targets: (seed documents, one case) ------------------------------------------------------

def _graph_target() -> Callable[[random.Random], None]:
    import numpy as np

    import graph_runtime as gr
    names = ("mlp", "hetero_cnn", "duplex")
    docs = [json.loads((EXAMPLES / name / "graph.json").read_text()) for name in names]
    libs = [gr.load_module(EXAMPLES / name / "lib.json") for name in names]

    def case(rng: random.Random) -> None:
        k = rng.randrange(len(docs))
        text = mutate_doc(docs[k], rng)
        m = gr.create(text, libs[k], gr.cpu(), memory_cap=MEMORY_CAP, allow_uninitialized=True)
        shapes, dtypes = m.get_input_info()
        for name, shape in shapes.items():
            m.set_input(name, np.zeros(concrete_shape(shape), dtypes[name]))
        m.run()
    return case


# A raw OpenCL kernel and a graph calling it: mutations reach the size expressions, the count
# and the launch checks at create (on PoCL where OpenCL is available).
KERNEL_LIB = {"format": "graph_runtime.lib", "version": 1, "functions": {"twice": {"kernel": {
    "opencl": {"source": "__kernel void twice(__global const float* x, __global float* y, "
                         "int n) { int i = get_global_id(0); if (i < n) y[i] = 2.0f * x[i]; }",
               "entry": "twice", "global_size": "(n + 63) / 64 * 64", "local_size": 64,
               "count": "int32"}}}}}
KERNEL_GRAPH = {
    "nodes": [{"op": "null", "name": "x", "inputs": []},
              {"op": "tvm_op", "name": "twice0", "inputs": [[0, 0, 0]],
               "attrs": {"func_name": "twice", "num_inputs": "1", "num_outputs": "1",
                         "flatten_data": "0"}}],
    "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
    "attrs": {"dltype": ["list_str", ["float32", "float32"]],
              "shape": ["list_shape", [[100], [100]]], "storage_id": ["list_int", [0, 1]]}}


def _lib_target() -> Callable[[random.Random], None]:
    import numpy as np

    import graph_runtime as gr
    from graph_runtime.lib.loader import module_from_json
    docs = [json.loads((EXAMPLES / name / "lib.json").read_text()) for name in
            ("mlp", "hetero_cnn")] + [KERNEL_LIB]
    graphs: dict[int, Any] = {id(docs[0]): EXAMPLES / "mlp" / "graph.json",
                              id(docs[1]): EXAMPLES / "hetero_cnn" / "graph.json",
                              id(KERNEL_LIB): KERNEL_GRAPH}
    opencl = backend_missing("opencl") is None

    def case(rng: random.Random) -> None:
        seed = rng.choice(docs)
        text = mutate_doc(seed, rng)
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if doc is None:  # unreadable text goes through the file loader
            path = Path(os.environ["FUZZ_TMP"]) / "lib.json"
            path.write_text(text, errors="surrogatepass")
            gr.load_module(path)
            return
        lib = module_from_json(doc)
        if seed is not KERNEL_LIB:
            gr.create(graphs[id(seed)], lib, gr.cpu(), memory_cap=MEMORY_CAP,
                      allow_uninitialized=True)
        elif opencl:
            m = gr.create(KERNEL_GRAPH, lib, gr.opencl(), memory_cap=MEMORY_CAP)
            m.set_input("x", np.ones(100, np.float32))
            m.run()
            m.get_output(0).numpy()
    return case


def _params_target() -> Callable[[random.Random], None]:
    import numpy as np

    from graph_runtime.params import load_param_arrays, save_param_dict
    blobs = [save_param_dict({"w": np.arange(12, dtype="float32").reshape(3, 4),
                              "b": np.ones(4, "int64"), "s": np.float16(2.5)}),
             (EXAMPLES / "hetero_cnn" / "params").read_bytes()]

    def case(rng: random.Random) -> None:
        load_param_arrays(mutate_bytes(rng.choice(blobs), rng), "fuzz")
    return case


def _npz_target() -> Callable[[random.Random], None]:
    import numpy as np

    from graph_runtime.params import load_params_file
    seeds = []
    for compress in (np.savez, np.savez_compressed):
        buffer = io.BytesIO()
        compress(buffer, x=np.arange(40, dtype="float32").reshape(5, 8), y=np.eye(3, dtype="int8"))
        seeds.append(buffer.getvalue())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("notes.txt", "not an array")
    seeds.append(buffer.getvalue())
    path = Path(os.environ["FUZZ_TMP"]) / "p.npz"

    def case(rng: random.Random) -> None:
        path.write_bytes(mutate_bytes(rng.choice(seeds), rng))
        load_params_file(path)
    return case


def _onnx_target() -> Callable[[random.Random], None]:
    from fuzz_onnx import onnx_target
    return onnx_target(mutate_bytes, MEMORY_CAP)


TARGETS = {"graph": _graph_target, "lib": _lib_target, "params": _params_target,
           "npz": _npz_target, "onnx": _onnx_target}


def fuzz(target: str, cases: int, seed: int, first: int = 0,
         progress: Path | None = None) -> dict[str, Any]:
    """Run cases first..first+cases-1 of target; the report counts outcomes and lists every
    finding. progress, when given, gets each case's number before it runs (for the campaign)."""
    import logging

    from graph_runtime.errors import GraphRuntimeError
    logging.getLogger("graph_runtime").setLevel(logging.ERROR)
    case = TARGETS[target]()
    report: dict[str, Any] = {"target": target, "cases": cases, "accepted": 0, "refused": 0,
                              "escaped": [], "internal": [], "slow": [], "heavy": [],
                              "seconds": 0.0}
    start = time.perf_counter()
    for k in range(first, first + cases):
        if progress is not None:
            progress.write_text(str(k))
        rng = random.Random(f"{seed}:{target}:{k}")
        memory = _CaseMemory()
        t0 = time.perf_counter()
        try:
            case(rng)
            report["accepted"] += 1
        except GraphRuntimeError as e:
            report["refused"] += 1
            text = str(e)
            at = text.find("internal error")
            if at >= 0:
                # An exception relabelled as a refusal: a check missing before it (a finding).
                report["internal"].append(f"case {k}: {text[max(at - 80, 0):at + 200]}")
            if os.environ.get("FUZZ_VERBOSE"):
                print(f"case {k}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        except BaseException as e:  # noqa: BLE001 - a finding, reported with its case
            report["escaped"].append(f"case {k}: {type(e).__name__}: {str(e)[:200]}")
        elapsed = time.perf_counter() - t0
        if elapsed > CASE_SECONDS:
            report["slow"].append(f"case {k}: {elapsed:.1f} s")
        grown = memory.grown()
        if grown > HEAVY_BYTES:
            report["heavy"].append(f"case {k}: {grown >> 20} MiB")
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report


class _CaseMemory:
    """How far one case grew this process's resident memory at its peak, or a child's (onnx's
    shape inference runs in a forked one): the kernel's peak counter (VmHWM) is reset before
    the case (/proc/self/clear_refs), the children's peak is read before and after."""

    def __init__(self) -> None:
        import resource
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:  # not Linux, or not allowed: the peak is then since the process began
            pass
        self.before = _status_bytes("VmRSS")
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10

    def grown(self) -> int:
        import resource
        own = _status_bytes("VmHWM") - self.before
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10
        # NOTE: a forked child's resident set counts the parent's pages it shares; the
        # parent's size before the case is taken off.
        child = children - self.before if children > self.children else 0
        return max(own, child)


def _status_bytes(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def _limit_memory() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "FUZZ_TMP": str(tmp), "OPENBLAS_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzzed_inputs_give_only_our_errors(target: str, tmp_path: Path) -> None:
    if target == "onnx":
        pytest.importorskip("onnx")
    cases = TARGET_CASES.get(target, CASES)
    proc = subprocess.run([sys.executable, __file__, target, str(cases), "13"],
                          capture_output=True, text=True, timeout=240, env=_env(tmp_path),
                          preexec_fn=_limit_memory, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["accepted"] + report["refused"] + len(report["escaped"]) == cases
    assert report["escaped"] == [], report["escaped"][:10]
    assert report["internal"] == [], report["internal"][:10]
    assert report["slow"] == [], report["slow"]
    assert report["heavy"] == [], report["heavy"]
    assert report["refused"] > cases // 4  # the mutations really do reach the checks


def _add(total: dict[str, Any], report: dict[str, Any]) -> None:
    for key in ("accepted", "refused", "escaped", "internal", "slow", "heavy"):
        total[key] += report[key]


def campaign(target: str, cases: int, seed: int, hang_seconds: float = 60.0) -> dict[str, Any]:
    """cases of target in worker processes of up to 1,000 cases each; a worker that dies is a
    crash and one stuck on a case past hang_seconds a hang (both restarted past that case)."""
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-"))
    progress = tmp / "progress"
    total: dict[str, Any] = {"target": target, "cases": cases, "accepted": 0, "refused": 0,
                             "escaped": [], "internal": [], "slow": [], "heavy": [],
                             "crashed": [], "hung": [], "seconds": 0.0}
    start = time.perf_counter()
    k = 0
    while k < cases:
        count = min(1000, cases - k)
        progress.write_text(str(k))
        proc = subprocess.Popen([sys.executable, __file__, target, str(count), str(seed),
                                 str(k), str(progress)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=_env(tmp),
                                preexec_fn=_limit_memory, cwd=ROOT)
        at, since = k, time.perf_counter()
        while proc.poll() is None:
            time.sleep(0.5)
            now = int(progress.read_text() or at)
            if now != at:
                at, since = now, time.perf_counter()
            elif time.perf_counter() - since > hang_seconds:
                proc.kill()
                proc.wait()
                total["hung"].append(f"case {at}")
                break
        out = proc.stdout.read() if proc.stdout else ""
        if proc.returncode == 0 and out.strip():
            _add(total, json.loads(out.strip().splitlines()[-1]))
            k += count
            continue
        if not total["hung"] or total["hung"][-1] != f"case {at}":
            total["crashed"].append(f"case {at}: exit {proc.returncode}")
        # NOTE: the cases before `at` in this worker ran but their report died with it: rerun
        # them in the next worker so every case is counted once.
        if at > k:
            count = at - k
            sub = subprocess.run([sys.executable, __file__, target, str(count), str(seed),
                                  str(k)], capture_output=True, text=True, env=_env(tmp),
                                 preexec_fn=_limit_memory, cwd=ROOT)
            _add(total, json.loads(sub.stdout.strip().splitlines()[-1]))
        k = at + 1
        print(json.dumps({"at": k, "crashed": total["crashed"], "hung": total["hung"]}),
              file=sys.stderr, flush=True)
    total["seconds"] = round(time.perf_counter() - start, 2)
    return total


if __name__ == "__main__":
    if sys.argv[1] == "campaign":
        print(json.dumps(campaign(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        sys.exit(0)
    name, count, seed_arg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    first_arg = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    progress_arg = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    os.environ.setdefault("FUZZ_TMP", "/tmp")
    print(json.dumps(fuzz(name, count, seed_arg, first_arg, progress_arg)))

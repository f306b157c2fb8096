"""numba's CPU target set-up on a background thread (lib/kernels/cpu/jit_setup.py).

Each case runs in a fresh interpreter: the set-up happens once per process, and this one's
tests have long done it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import require_onednn

ROOT = Path(__file__).resolve().parents[2]

# A model with one layer norm (a compiled row kernel, rows_jit.py) or one MatMul (oneDNN or
# OpenBLAS, no compiled code), imported, created on the CPU, run, and checked against float64.
MODELS = r"""
import os, sys, threading
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import graph_runtime as gr
from graph_runtime.frontend import from_onnx
from graph_runtime.lib.kernels.cpu import jit_setup

rng = np.random.default_rng(0)
x = rng.standard_normal((5, 7)).astype(np.float32)

def model(kind):
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    if kind == "layer_norm":
        g, b = (rng.standard_normal(7).astype(np.float32) for _ in range(2))
        inits = [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)
        x64 = x.astype(np.float64)
        mean = x64.mean(-1, keepdims=True)
        ref = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    else:
        w = rng.standard_normal((7, 3)).astype(np.float32)
        inits = [numpy_helper.from_array(w, "w")]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        ref = x.astype(np.float64) @ w.astype(np.float64)
    graph = helper.make_graph([node], kind, [inp], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ref

def create(kind):
    onnx_model, ref = model(kind)
    graph, lib, params = from_onnx(onnx_model)
    module = gr.create(graph, lib, gr.cpu())
    module.load_params(params)
    return module, ref

def check(module, ref):
    module.run(x=x)
    np.testing.assert_allclose(module.get_output(0).numpy(), ref, rtol=1e-5, atol=1e-5)

def setup_threads():
    return [t for t in threading.enumerate() if t.name == "graph_runtime numba set-up"]
"""

STARTS_ONCE = MODELS + r"""
assert not jit_setup.started() and "numba.np.arraymath" not in sys.modules
first, ref = create("layer_norm")
assert jit_setup.started()
thread = jit_setup._thread
check(first, ref)  # the first call waits for the set-up (numba's lock), then loads its code
assert jit_setup.wait(60) and not thread.is_alive()
assert "numba.np.arraymath" in sys.modules  # imported by numba's target set-up only
second, ref = create("layer_norm")
assert jit_setup._thread is thread and setup_threads() == []  # no second thread
check(second, ref)
print("ok")
"""

NEVER_STARTS = MODELS + r"""
module, ref = create("matmul")
check(module, ref)
assert not jit_setup.started() and setup_threads() == []
assert "numba.np.arraymath" not in sys.modules
print("ok")
"""

FORK_WAITS = MODELS + r"""
from numba.core.compiler_lock import global_compiler_lock
module, ref = create("layer_norm")  # starts the set-up; fork at once, while it runs
pid = os.fork()
if pid == 0:
    # the child has no set-up thread: numba's lock must be free and the set-up done
    free = global_compiler_lock._lock.acquire(timeout=10)
    os._exit(0 if free and "numba.np.arraymath" in sys.modules else 1)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
check(module, ref)
print("ok")
"""


ONE_CPU = MODELS + r"""
module, ref = create("layer_norm")
check(module, ref)  # numba sets its target up on this thread, in the first call
assert not jit_setup.started() and "numba.np.arraymath" in sys.modules
print("ok")
"""


# create() and the first run inside an import (a module that runs a graph when imported): the
# thread imports numba's and scipy's modules while the main thread holds that module's import
# lock, then the main thread's first call waits for numba's lock; neither waits on the other.
IN_AN_IMPORT = MODELS + r"""
module, ref = create("layer_norm")
check(module, ref)
assert jit_setup.started()
"""

# A graph with symbolic dims makes its kernels at its first run: its create() starts the set-up
# (a server's first request then does not wait 0.3-0.5 s for it), and the answers are right at
# two lengths.
SYMBOLIC_CREATE_STARTS = MODELS + r"""
onnx_model, _ = model("layer_norm")
onnx_model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
graph, lib, params = from_onnx(onnx_model)
module = gr.create(graph, lib, gr.cpu())
module.load_params(params)
assert jit_setup.started()  # before any run
g, b = (numpy_helper.to_array(t).astype(np.float64) for t in onnx_model.graph.initializer)
for n in (5, 3):
    xs = x[:n]
    module.run(x=xs)
    x64 = xs.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(module.get_output(0).numpy(), ref, rtol=1e-5, atol=1e-5)
print("ok")
"""

# The process ends while the set-up still runs: a plain exit (the daemon thread inside an import
# as the interpreter shuts down) and graphrun's os._exit; neither may hang or print.
EXITS_AT_ONCE = MODELS + r"""
module, ref = create("layer_norm")
assert jit_setup._thread.is_alive()
print("ok", flush=True)
if sys.argv[1:] == ["os_exit"]:
    os._exit(0)
"""

# The set-up fails on its thread: the error is only logged, and the first call sets up again.
FAILS_ON_THE_THREAD = MODELS + r"""
from numba.core.registry import cpu_target
context = type(cpu_target.target_context)
refresh = context.refresh
def failing(self):
    if threading.current_thread().name == "graph_runtime numba set-up":
        raise RuntimeError("set-up failed on its thread")
    return refresh(self)
context.refresh = failing
module, ref = create("layer_norm")
assert jit_setup.wait(60)
check(module, ref)
print("ok")
"""

# Four threads create and run modules at once: one set-up thread, every answer right.
THREADS_AT_ONCE = MODELS + r"""
errors = []
def work():
    try:
        module, ref = create("layer_norm")
        check(module, ref)
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join(120)
assert not errors and not any(t.is_alive() for t in threads), errors
assert jit_setup.started() and len(setup_threads()) <= 1
print("ok")
"""

# A fork from another thread while start() is starting the set-up thread (start() made slow to
# widen that window): the fork must still wait for the set-up to end, as it does once the thread
# runs, not find a thread it cannot join yet and go on beside it.
FORK_DURING_START = MODELS + r"""
import time
from numba.core.compiler_lock import global_compiler_lock
real_start = threading.Thread.start
starting = threading.Event()
def slow_start(self):
    if self.name == "graph_runtime numba set-up":
        starting.set()
        time.sleep(1.0)
    return real_start(self)
threading.Thread.start = slow_start
status = []
def fork():
    starting.wait(60)
    pid = os.fork()
    if pid == 0:
        free = global_compiler_lock._lock.acquire(timeout=10)
        os._exit(0 if free and "numba.np.arraymath" in sys.modules else 1)
    status.append(os.waitpid(pid, 0)[1])
forker = threading.Thread(target=fork)
forker.start()
module, ref = create("layer_norm")
forker.join(120)
assert os.WIFEXITED(status[0]) and os.WEXITSTATUS(status[0]) == 0, status
check(module, ref)
print("ok")
"""


def _run(script: str, *args: str, **settings: str) -> str:
    # two workers unless a case says otherwise: the set-up starts only where there are two
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRAPH_RUNTIME_ONEDNN_THREADS="workers",
               GRAPH_RUNTIME_NUM_THREADS="2")
    env.update(settings)
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    return done.stderr


def test_a_compiled_kernel_starts_the_set_up_once() -> None:
    _run(STARTS_ONCE)


def test_a_graph_without_compiled_kernels_never_starts_it() -> None:
    _run(NEVER_STARTS)


def test_a_symbolic_module_starts_the_set_up_at_create() -> None:
    _run(SYMBOLIC_CREATE_STARTS)


def test_one_cpu_never_starts_it() -> None:
    _run(ONE_CPU, GRAPH_RUNTIME_NUM_THREADS="1")


def test_a_graph_run_inside_an_import_does_not_deadlock(tmp_path: Path) -> None:
    (tmp_path / "runs_a_graph.py").write_text(IN_AN_IMPORT)
    _run(f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import runs_a_graph; print('ok')")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_fork_waits_for_the_set_up() -> None:
    _run(FORK_WAITS)


@pytest.mark.parametrize("how", ["exit", "os_exit"])
def test_the_process_may_end_while_the_set_up_runs(how: str) -> None:
    assert _run(EXITS_AT_ONCE, how) == ""  # no error from the thread as the process ends


def test_a_set_up_failing_on_its_thread_leaves_the_first_call_to_do_it() -> None:
    _run(FAILS_ON_THE_THREAD)


def test_modules_created_on_several_threads_at_once() -> None:
    _run(THREADS_AT_ONCE)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_fork_while_the_thread_is_starting_waits_for_the_set_up() -> None:
    assert _run(FORK_DURING_START) == ""


# A kernel built for one size loads, at its first run, the compiled code other sizes of it
# take (the pass on this thread where its rows went to oneDNN's team), once a symbolic module
# is expected: a smaller size's first run then loads nothing. Without one, nothing is loaded
# ahead. Each answer is checked against NumPy in float64.
LOADS_AHEAD = r"""
import sys
import numpy as np
from numba.core import dispatcher
from graph_runtime.lib.kernels.cpu import attention, jit_setup, rows_jit
from graph_runtime.lib.kernels.cpu.omp_team import available

assert available()  # oneDNN in OpenMP mode: large rows go to its team
loaded = []
real = dispatcher.Dispatcher.compile
def compile_(self, sig):
    loaded.append(self.py_func.__name__)
    return real(self, sig)
dispatcher.Dispatcher.compile = compile_
ahead = sys.argv[1] == "ahead"
if ahead:
    jit_setup.expect_other_sizes()
rng = np.random.default_rng(0)

def normed(x, axes):
    x = x.astype(np.float64)
    return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5)

def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

def rows(kind, rows):
    shape = (rows, 512)
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(512).astype(np.float32)
    out = np.empty_like(x)
    if kind == "layer_norm":
        rows_jit.layer_norm_rows(shape, 1e-5, True, True)(x, g, g, out)
        return out, normed(x, -1) * g + g
    if kind == "rms_norm":
        rows_jit.rms_norm_rows(shape, 1e-5)(x, g, out)
        x64 = x.astype(np.float64)
        return out, x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * g
    if kind == "softmax":
        rows_jit.softmax_rows(shape)(x, out)
        return out, softmax(x.astype(np.float64))
    x = x.reshape(rows // 8, 64, 64)  # group_norm: 8 groups of 8 channels of 64
    out = out.reshape(x.shape)
    rows_jit.group_norm_rows(rows // 8, 64, 8, 64, 1e-5)(x, g[:64], g[64:128], out)
    by_group = normed(x.reshape(rows // 8, 8, -1), -1).reshape(x.shape)
    return out, by_group * g[:64, None] + g[64:128, None]

def attend(q_len):
    batch, heads, k_len, dim = 2, 4, 64, 16
    q, k, v = (rng.standard_normal((batch, n, heads * dim)).astype(np.float32)
               for n in (q_len, k_len, k_len))
    mask = rng.standard_normal((batch, 1, 1, k_len)).astype(np.float32)
    out = np.empty_like(q)
    attention.AttentionKernel(batch, heads, q_len, k_len, dim, (0, 0, 0), 0.25, False,
                              mask.shape, "float32")(q, k, v, mask, out)
    heads_of = lambda a: a.astype(np.float64).reshape(batch, -1, heads, dim).swapaxes(1, 2)
    p = softmax(heads_of(q) @ heads_of(k).swapaxes(-1, -2) * 0.25 + mask)
    return out, (p @ heads_of(v)).swapaxes(1, 2).reshape(out.shape)

kinds = [(kind, lambda n, kind=kind: rows(kind, n)) for kind in
         ("layer_norm", "rms_norm", "softmax", "group_norm")] + [("attention", attend)]
for kind, make in kinds:
    for size in (256, 8) if kind != "attention" else (64, 4):
        loaded.clear()
        got, want = make(size)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=kind)
        if size in (8, 4):  # the smaller size's first run: its pass loaded ahead, or now
            assert (loaded == []) == ahead, (kind, loaded)
        elif ahead:
            assert loaded, kind  # the large size's first run loaded the other pass
print("ok")
"""


@pytest.mark.parametrize("ahead", ["ahead", "not_ahead"])
def test_a_kernel_loads_the_other_sizes_code_ahead_where_shapes_change(ahead: str) -> None:
    require_onednn()
    _run(LOADS_AHEAD, ahead, GRAPH_RUNTIME_ONEDNN_THREADS="openmp",
         GRAPH_RUNTIME_ATTENTION_SPLIT="off")


def test_a_symbolic_module_expects_other_sizes() -> None:
    _run("import graph_runtime as gr, numpy as np\n"
         "from graph_runtime.lib.kernels.cpu import jit_setup\n"
         "from graph_runtime.frontend import from_onnx\n"
         "from onnx import TensorProto, helper\n"
         "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, ['n', 4])\n"
         "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, None)\n"
         "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', [x], [y])\n"
         "graph, lib, params = from_onnx(helper.make_model(g))\n"
         "assert not jit_setup.other_sizes_expected()\n"
         "module = gr.create(graph, lib, gr.cpu())\n"
         "assert jit_setup.other_sizes_expected()\n"
         "module.run(x=np.ones((3, 4), np.float32))\n"
         "assert (module.get_output(0).numpy() == 1).all()\n"
         "print('ok')\n")

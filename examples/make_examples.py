#!/usr/bin/env python
"""Generate examples/graphs/*: TVM-style graph JSON, lib.json, seeded weights, inputs and outputs.

Every file is a function of this script alone (seeded NumPy generators, fixed zip dates), so a
rerun rewrites identical bytes. Expected outputs come from the float64 NumPy reference below,
written independently of graph_runtime's kernels, and are stored as float32.

    python examples/make_examples.py           # (re)write every example
    python examples/make_examples.py --check   # compare with the files on disk, write nothing
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

HERE = Path(__file__).resolve().parent
GRAPHS = HERE / "graphs"

CPU, CUDA, OPENCL = 1, 2, 4  # DLPack device type codes, as the device_index column holds them
PREFIX = "tvmgen_default_fused_"
LIB_HEADER = {"format": "graph_runtime.lib", "version": 1}


# ---- graph building: TVM graph JSON with liveness-based storage sharing -------------------------

@dataclass
class GraphBuilder:
    """Collects nodes in topological order and writes TVM's graph JSON, planning storage ids."""

    nodes: list[dict] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)

    def input(self, name: str, shape: tuple[int, ...], device: int = CPU,
              dtype: str = "float32") -> int:
        """An arg node (data or a param); returns its node id."""
        self.nodes.append({"op": "null", "name": name, "inputs": []})
        return self._entry(shape, dtype, device)

    def op(self, func_name: str, inputs: list[int], shape: tuple[int, ...], device: int = CPU,
           name: str | None = None, flatten_data: int = 0, dtype: str = "float32") -> int:
        """A one-output kernel node reading output 0 of each input node; returns its node id."""
        self.nodes.append({
            "op": "tvm_op", "name": name or func_name,
            "attrs": {"flatten_data": str(flatten_data), "func_name": func_name,
                      "num_inputs": str(len(inputs)), "num_outputs": "1"},
            "inputs": [[nid, 0, 0] for nid in inputs]})
        return self._entry(shape, dtype, device)

    def copy(self, src: int, device: int, name: str) -> int:
        """A __copy node moving src's output to device."""
        return self.op("__copy", [src], tuple(self.shapes[src]), device, name=name,
                       dtype=self.dtypes[src])

    def _entry(self, shape: tuple[int, ...], dtype: str, device: int) -> int:
        self.shapes.append([int(d) for d in shape])
        self.dtypes.append(dtype)
        self.devices.append(device)
        return len(self.nodes) - 1

    def storage_ids(self, heads: list[int]) -> list[int]:
        """TVM's plan: inputs and outputs own their storage; an intermediate's id is reused once
        its last reader ran, on the same device only, and never by that reader's own output."""
        readers = [0] * len(self.nodes)
        for node in self.nodes:
            for nid, _, _ in node["inputs"]:
                readers[nid] += 1
        sizes: list[int] = []
        free: dict[int, list[int]] = {}
        sids: list[int] = []
        for nid, node in enumerate(self.nodes):
            nbytes = int(np.prod(self.shapes[nid])) * np.dtype(self.dtypes[nid]).itemsize
            pool = free.setdefault(self.devices[nid], [])
            reusable = node["op"] != "null" and nid not in heads and pool
            if reusable:
                sid = min(pool, key=lambda s: (sizes[s] < nbytes, abs(sizes[s] - nbytes), s))
                pool.remove(sid)
                sizes[sid] = max(sizes[sid], nbytes)
            else:
                sid = len(sizes)
                sizes.append(nbytes)
            sids.append(sid)
            for src, _, _ in node["inputs"]:
                readers[src] -= 1
                owned = self.nodes[src]["op"] == "null" or src in heads
                if readers[src] == 0 and not owned:
                    free.setdefault(self.devices[src], []).append(sids[src])
        return sids

    def to_dict(self, heads: list[int]) -> dict[str, Any]:
        """The graph as TVM writes it; a device_index column only when two devices are used."""
        attrs: dict[str, Any] = {
            "dltype": ["list_str", list(self.dtypes)],
            "storage_id": ["list_int", self.storage_ids(heads)],
            "shape": ["list_shape", [list(s) for s in self.shapes]],
        }
        if set(self.devices) != {CPU}:
            attrs["device_index"] = ["list_int", list(self.devices)]
        return {
            "nodes": self.nodes,
            "arg_nodes": [nid for nid, n in enumerate(self.nodes) if n["op"] == "null"],
            "heads": [[nid, 0, 0] for nid in heads],
            "attrs": attrs,
            "node_row_ptr": list(range(len(self.nodes) + 1)),
        }


def graph_text(graph: dict[str, Any]) -> str:
    """JSON with one node per line and one line per column: diffable and short."""
    def dump(value: Any) -> str:
        return json.dumps(value, separators=(", ", ": "))
    lines = ["{", '  "nodes": [']
    lines += [f"    {dump(n)}," for n in graph["nodes"]]
    lines[-1] = lines[-1].rstrip(",")
    lines.append("  ],")
    for key in ("arg_nodes", "heads"):
        lines.append(f'  "{key}": {dump(graph[key])},')
    lines.append('  "attrs": {')
    columns = [f'    "{k}": {dump(v)}' for k, v in graph["attrs"].items()]
    lines.append(",\n".join(columns))
    lines.append("  },")
    lines.append(f'  "node_row_ptr": {dump(graph["node_row_ptr"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def lib_text(functions: dict[str, Any], description: str) -> str:
    """A lib.json document with one function per line."""
    lines = ["{", '  "format": "graph_runtime.lib",', '  "version": 1,',
             f'  "description": {json.dumps(description)},', '  "functions": {']
    items = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in functions.items()]
    lines.append(",\n".join(items))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


# ---- float64 NumPy reference (independent of graph_runtime's kernels) --------------------------

def ref_dense(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Relay's dense ([N, K] x [M, K] -> [N, M]) plus a bias."""
    return x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)


def ref_relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def ref_conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """NCHW x OIHW, stride 1, symmetric zero padding, plus a per-channel bias [O, 1, 1]."""
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(xp, (kh, kw), axis=(2, 3))  # N, C, H, W, kh, kw
    out = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64), optimize=True)
    return out + b.astype(np.float64)


def ref_max_pool2d(x: np.ndarray, k: int) -> np.ndarray:
    """k x k max pooling with stride k (H and W divisible by k)."""
    n, c, h, w = x.shape
    return x.reshape(n, c, h // k, k, w // k, k).max(axis=(3, 5))


def ref_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- the examples ------------------------------------------------------------------------------

@dataclass
class Example:
    """Everything one folder holds, in memory."""

    name: str
    readme: str
    graphs: dict[str, dict[str, Any]]  # file name -> graph document
    functions: dict[str, Any]
    lib_description: str
    params: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    expected: list[np.ndarray]


def _vectors(names: str, seed: int, shape: tuple[int, ...] = (4,)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shape).astype(np.float32) for n in names}


ELEMWISE_FUNCTIONS = {"elemwise_add": {"op": "add"}, "elemwise_sub": {"op": "subtract"}}


def simplex_graph(host: int = CPU, dev: int = OPENCL) -> dict[str, Any]:
    """TVM's simplex graph (PR #1695): A + B on the device, one __copy, minus C on the host."""
    g = GraphBuilder()
    a = g.input("A", (4,), dev)
    b = g.input("B", (4,), dev)
    add = g.op("elemwise_add", [a, b], (4,), dev, flatten_data=1)
    back = g.copy(add, host, "__copy_add_to_sub")
    c = g.input("C", (4,), host)
    sub = g.op("elemwise_sub", [back, c], (4,), host, flatten_data=1)
    return g.to_dict([sub])


def duplex_graph(host: int = CPU, dev: int = OPENCL) -> dict[str, Any]:
    """TVM's duplex graph: copies there and back; ((A + B) - C) + D with the adds on the device."""
    g = GraphBuilder()
    a = g.input("A", (4,), dev)
    b = g.input("B", (4,), dev)
    add0 = g.op("elemwise_add", [a, b], (4,), dev, name="elemwise_add0", flatten_data=1)
    to_host = g.copy(add0, host, "__copy_add_to_sub")
    c = g.input("C", (4,), host)
    sub = g.op("elemwise_sub", [to_host, c], (4,), host, flatten_data=1)
    to_dev = g.copy(sub, dev, "__copy_sub_to_add")
    d = g.input("D", (4,), dev)
    add1 = g.op("elemwise_add", [to_dev, d], (4,), dev, name="elemwise_add1", flatten_data=1)
    return g.to_dict([add1])


def simplex() -> Example:
    x = _vectors("ABC", seed=10)
    expected = x["A"].astype(np.float64) + x["B"] - x["C"]
    return Example("simplex", "TVM's heterogeneous simplex graph: A + B on the accelerator "
                   "(device_index 4, OpenCL), one `__copy`, then - C on the CPU.",
                   {"graph.json": simplex_graph()}, ELEMWISE_FUNCTIONS,
                   "TVM's hand-written heterogeneous test functions", {}, x, [expected])


def duplex() -> Example:
    x = _vectors("ABCD", seed=11)
    expected = x["A"].astype(np.float64) + x["B"] - x["C"] + x["D"]
    return Example("duplex", "TVM's heterogeneous duplex graph: copies there and back, "
                   "((A + B) - C) + D with both adds on the accelerator (OpenCL).",
                   {"graph.json": duplex_graph()}, ELEMWISE_FUNCTIONS,
                   "TVM's hand-written heterogeneous test functions", {}, x, [expected])


MLP_SIZES = (784, 512, 512, 10)
MLP_FUNCTIONS = {
    PREFIX + "nn_dense_add_nn_relu": {"ops": [{"op": "dense"}, {"op": "add"}, {"op": "relu"}]},
    PREFIX + "nn_dense_add_nn_relu_1": {"ops": [{"op": "dense"}, {"op": "add"}, {"op": "relu"}]},
    PREFIX + "nn_dense_add": {"ops": [{"op": "dense"}, {"op": "add"}]},
    PREFIX + "nn_softmax": {"op": "softmax", "axis": -1},
}


def mlp_graph(batch: int = 1) -> dict[str, Any]:
    """784-512-512-10 with ReLU and softmax; dense and bias fused as TVM fuses them."""
    g = GraphBuilder()
    x = g.input("data", (batch, MLP_SIZES[0]))
    funcs = [PREFIX + "nn_dense_add_nn_relu", PREFIX + "nn_dense_add_nn_relu_1",
             PREFIX + "nn_dense_add"]
    for i, func in enumerate(funcs):
        k, m = MLP_SIZES[i], MLP_SIZES[i + 1]
        w = g.input(f"p{2 * i}", (m, k))
        b = g.input(f"p{2 * i + 1}", (m,))
        x = g.op(func, [x, w, b], (batch, m))
    out = g.op(PREFIX + "nn_softmax", [x], (batch, MLP_SIZES[-1]))
    return g.to_dict([out])


def mlp_params(seed: int = 20) -> dict[str, np.ndarray]:
    """He-initialised float32 weights p0..p5 (weight [out, in], bias [out])."""
    rng = np.random.default_rng(seed)
    params = {}
    for i in range(3):
        k, m = MLP_SIZES[i], MLP_SIZES[i + 1]
        params[f"p{2 * i}"] = (rng.standard_normal((m, k)) * np.sqrt(2.0 / k)).astype(np.float32)
        params[f"p{2 * i + 1}"] = (rng.standard_normal(m) * 0.05).astype(np.float32)
    return params


def mlp_reference(data: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    h = ref_relu(ref_dense(data, p["p0"], p["p1"]))
    h = ref_relu(ref_dense(h, p["p2"], p["p3"]))
    return ref_softmax(ref_dense(h, p["p4"], p["p5"]))


def mlp() -> Example:
    params = mlp_params()
    data = np.random.default_rng(21).random((1, MLP_SIZES[0])).astype(np.float32)
    return Example("mlp", "A 784-512-512-10 MLP (dense+bias+ReLU fused, softmax), batch 1, with "
                   "its weights in TVM's binary params format.",
                   {"graph.json": mlp_graph()}, MLP_FUNCTIONS, "MLP 784-512-512-10",
                   params, {"data": data}, [mlp_reference(data, params)])


CNN_INPUT = (3, 64, 64)
CNN_CHANNELS = (3, 16, 32)
CNN_CLASSES = 10
CONV = [{"op": "conv2d", "strides": [1, 1], "padding": [1, 1]}, {"op": "add"}, {"op": "relu"}]
POOL = {"op": "max_pool2d", "pool_size": [2, 2], "strides": [2, 2]}
CNN_FUNCTIONS = {
    PREFIX + "nn_conv2d_add_nn_relu": {"ops": CONV},
    PREFIX + "nn_max_pool2d": POOL,
    PREFIX + "nn_conv2d_add_nn_relu_1": {"ops": CONV},
    PREFIX + "nn_max_pool2d_1": POOL,
    PREFIX + "nn_batch_flatten": {"op": "batch_flatten"},
    PREFIX + "nn_dense_add": {"ops": [{"op": "dense"}, {"op": "add"}]},
    PREFIX + "nn_softmax": {"op": "softmax", "axis": -1},
}


def cnn_graph(batch: int = 1, accel: int | None = None) -> dict[str, Any]:
    """(conv3x3-relu-maxpool2) x 2, flatten, dense, softmax on 3x64x64 images.

    With accel set, the convolution stages run there and one __copy brings the pooled features
    to the CPU for flatten, dense and softmax.
    """
    conv_dev = CPU if accel is None else accel
    g = GraphBuilder()
    c, h, w = CNN_INPUT
    x = g.input("data", (batch, c, h, w), conv_dev)
    for i in range(2):
        cin, cout = CNN_CHANNELS[i], CNN_CHANNELS[i + 1]
        suffix = "" if i == 0 else "_1"
        wt = g.input(f"p{2 * i}", (cout, cin, 3, 3), conv_dev)
        bias = g.input(f"p{2 * i + 1}", (cout, 1, 1), conv_dev)
        x = g.op(PREFIX + "nn_conv2d_add_nn_relu" + suffix, [x, wt, bias], (batch, cout, h, w),
                 conv_dev)
        h, w = h // 2, w // 2
        x = g.op(PREFIX + "nn_max_pool2d" + suffix, [x], (batch, cout, h, w), conv_dev)
    if accel is not None:
        x = g.copy(x, CPU, "__copy_pool_to_flatten")
    features = CNN_CHANNELS[-1] * h * w
    x = g.op(PREFIX + "nn_batch_flatten", [x], (batch, features))
    wt = g.input("p4", (CNN_CLASSES, features))
    bias = g.input("p5", (CNN_CLASSES,))
    x = g.op(PREFIX + "nn_dense_add", [x, wt, bias], (batch, CNN_CLASSES))
    out = g.op(PREFIX + "nn_softmax", [x], (batch, CNN_CLASSES))
    return g.to_dict([out])


def cnn_params(seed: int = 30) -> dict[str, np.ndarray]:
    """He-initialised float32 weights: p0/p2 conv OIHW, p1/p3 bias [O, 1, 1], p4/p5 dense."""
    rng = np.random.default_rng(seed)
    params = {}
    for i in range(2):
        cin, cout = CNN_CHANNELS[i], CNN_CHANNELS[i + 1]
        scale = np.sqrt(2.0 / (cin * 9))
        params[f"p{2 * i}"] = (rng.standard_normal((cout, cin, 3, 3)) * scale).astype(np.float32)
        params[f"p{2 * i + 1}"] = (rng.standard_normal((cout, 1, 1)) * 0.05).astype(np.float32)
    features = CNN_CHANNELS[-1] * (CNN_INPUT[1] // 4) * (CNN_INPUT[2] // 4)
    scale = np.sqrt(2.0 / features)
    params["p4"] = (rng.standard_normal((CNN_CLASSES, features)) * scale).astype(np.float32)
    params["p5"] = (rng.standard_normal(CNN_CLASSES) * 0.05).astype(np.float32)
    return params


def cnn_reference(data: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    x = data.astype(np.float64)
    for i in range(2):
        x = ref_max_pool2d(ref_relu(ref_conv2d(x, p[f"p{2 * i}"], p[f"p{2 * i + 1}"], 1)), 2)
    x = x.reshape(x.shape[0], -1)
    return ref_softmax(ref_dense(x, p["p4"], p["p5"]))


def _cnn_data() -> np.ndarray:
    return np.random.default_rng(31).random((1,) + CNN_INPUT).astype(np.float32)


def cnn() -> Example:
    params = cnn_params()
    data = _cnn_data()
    return Example("cnn", "A small image classifier on 1x3x64x64: (conv3x3+bias+ReLU, maxpool 2x2) "
                   "x 2, flatten, dense, softmax — all on one device.",
                   {"graph.json": cnn_graph()}, CNN_FUNCTIONS, "small CNN classifier",
                   params, {"data": data}, [cnn_reference(data, params)])


def hetero_cnn() -> Example:
    params = cnn_params()
    data = _cnn_data()
    graphs = {"graph.json": cnn_graph(accel=OPENCL), "graph_cuda.json": cnn_graph(accel=CUDA)}
    return Example("hetero_cnn", "The cnn example split across devices: convolutions, ReLU and "
                   "pooling on the accelerator, one `__copy`, flatten+dense+softmax on the CPU "
                   "(graph.json: OpenCL, code 4; graph_cuda.json: CUDA, code 2).",
                   graphs,
                   CNN_FUNCTIONS, "small CNN classifier, convolutions on the accelerator",
                   params, {"data": data}, [cnn_reference(data, params)])


MIXED_INPUT = (8, 128, 128)
MIXED_CHANNELS = 32
# Per block: a 1x1 conv (a GEMM through OpenBLAS: NumPy's), a second-order integral image (four
# cumulative sums over H, W, H, W: PoCL's, whose kernels scan many rows at once on both cores
# where np.cumsum walks one strided axis on one), and a softmax over channels (NumPy's; PoCL's
# reductions are slow). Then a 2x2 max pool (NumPy's). The conv weights carry a 4 / (H * W)^2
# factor that brings the integral back to order 1 (a fused scalar multiply would cost PoCL a
# strided broadcast pass as long as two scans). Four scans rather than two because the first
# PoCL kernel after a copy from the CPU runs up to 2x its isolated time here, which two scans
# alone barely outrun.
MIXED_CONV = [{"op": "conv2d", "strides": [1, 1], "padding": [0, 0]}, {"op": "add"},
              {"op": "relu"}]
MIXED_INTEGRAL = [{"op": "cumsum", "axis": 2}, {"op": "cumsum", "axis": 3}] * 2
MIXED_SOFTMAX = {"op": "softmax", "axis": 1}
MIXED_FUNCTIONS = {
    PREFIX + "nn_conv2d_add_nn_relu": {"ops": MIXED_CONV},
    PREFIX + "cumsum_cumsum_cumsum_cumsum": {"ops": MIXED_INTEGRAL},
    PREFIX + "nn_softmax": MIXED_SOFTMAX,
    PREFIX + "nn_conv2d_add_nn_relu_1": {"ops": MIXED_CONV},
    PREFIX + "cumsum_cumsum_cumsum_cumsum_1": {"ops": MIXED_INTEGRAL},
    PREFIX + "nn_softmax_1": MIXED_SOFTMAX,
    PREFIX + "nn_max_pool2d": POOL,
}


def mixed_graph() -> dict[str, Any]:
    """(conv1x1+bias+ReLU, 2nd-order integral image, channel softmax) x 2, maxpool; no devices.

    Made for `graphrun plan --auto`: on PoCL the integral images are several times faster than
    NumPy's cumsum, everything else is faster in NumPy, so the best plan mixes the two.
    """
    g = GraphBuilder()
    x = g.input("data", (1,) + MIXED_INPUT)
    cin = MIXED_INPUT[0]
    h, w = MIXED_INPUT[1:]
    shape = (1, MIXED_CHANNELS, h, w)
    for i in range(2):
        suffix = "" if i == 0 else "_1"
        wt = g.input(f"p{2 * i}", (MIXED_CHANNELS, cin, 1, 1))
        bias = g.input(f"p{2 * i + 1}", (MIXED_CHANNELS, 1, 1))
        x = g.op(PREFIX + "nn_conv2d_add_nn_relu" + suffix, [x, wt, bias], shape)
        x = g.op(PREFIX + "cumsum_cumsum_cumsum_cumsum" + suffix, [x], shape)
        x = g.op(PREFIX + "nn_softmax" + suffix, [x], shape)
        cin = MIXED_CHANNELS
    out = g.op(PREFIX + "nn_max_pool2d", [x], (1, MIXED_CHANNELS, h // 2, w // 2))
    return g.to_dict([out])


def mixed_params(seed: int = 40) -> dict[str, np.ndarray]:
    """1x1 conv weights He-initialised, small biases, both scaled by 4 / (H * W)^2."""
    rng = np.random.default_rng(seed)
    params = {}
    cin = MIXED_INPUT[0]
    h, w = MIXED_INPUT[1:]
    mean = 4.0 / (h * w) ** 2
    for i in range(2):
        params[f"p{2 * i}"] = (rng.standard_normal((MIXED_CHANNELS, cin, 1, 1))
                               * np.sqrt(2.0 / cin) * mean).astype(np.float32)
        params[f"p{2 * i + 1}"] = (rng.standard_normal((MIXED_CHANNELS, 1, 1)) * 0.05
                                   * mean).astype(np.float32)
        cin = MIXED_CHANNELS
    return params


def mixed_reference(data: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    x = data.astype(np.float64)
    for i in range(2):
        x = ref_relu(ref_conv2d(x, p[f"p{2 * i}"], p[f"p{2 * i + 1}"], 0))
        x = x.cumsum(axis=2).cumsum(axis=3).cumsum(axis=2).cumsum(axis=3)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        x = e / e.sum(axis=1, keepdims=True)
    return ref_max_pool2d(x, 2)


def mixed() -> Example:
    params = mixed_params()
    data = np.random.default_rng(41).random((1,) + MIXED_INPUT).astype(np.float32)
    return Example("mixed", "Two blocks of (1x1 conv+bias+ReLU, a second-order integral image = "
                   "cumsum over H, W, H, W, softmax over channels) on 1x8x128x128, then "
                   "maxpool 2x2; no placement. Made for `graphrun plan --auto -d cpu -d opencl "
                   "--verify`: on PoCL the integral images run about 3-4x faster than NumPy's "
                   "cumsum (one pass over many rows on both cores, where np.cumsum walks a "
                   "strided axis on one), while the 1x1 convs (OpenBLAS), the channel softmaxes "
                   "and the pool are several times faster in NumPy; the 2 MiB copies between "
                   "them cost about 0.2 ms each. The best plan puts the integral images on "
                   "OpenCL and the rest on the CPU, and on the idle 2-core development machine "
                   "it runs about 40% faster than either device alone (measured 7.7-8.3 ms vs "
                   "13.6-14.6 ms all-cpu and 21-23 ms all-opencl).",
                   {"graph.json": mixed_graph()}, MIXED_FUNCTIONS,
                   "1x1 convs, integral images and channel softmaxes, for automatic placement",
                   params, {"data": data}, [mixed_reference(data, params)])


EXAMPLES: list[Callable[[], Example]] = [simplex, duplex, mlp, cnn, hetero_cnn, mixed]


# ---- writing and checking ----------------------------------------------------------------------

def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz that np.load reads, with a fixed member date so equal arrays give equal bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w") as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def example_files(ex: Example) -> dict[str, bytes]:
    """File name -> exact bytes for one example folder."""
    from graph_runtime.params import save_param_dict

    files = {name: graph_text(g).encode() for name, g in ex.graphs.items()}
    files["lib.json"] = lib_text(ex.functions, ex.lib_description).encode()
    if ex.params:
        files["params"] = save_param_dict(ex.params)
    files["inputs.npz"] = npz_bytes(ex.inputs)
    expected = {f"output_{i}": y.astype(np.float32) for i, y in enumerate(ex.expected)}
    files["expected.npz"] = npz_bytes(expected)
    files["README.md"] = f"# {ex.name}\n\n{ex.readme}\n".encode()
    return files


def validate(folder: Path, names: list[str]) -> list[str]:
    """Load every graph and the lib with graph_runtime's own loaders; the problems found."""
    from graph_runtime.errors import GraphRuntimeError
    from graph_runtime.graph.model import load_graph
    from graph_runtime.lib import load_module
    problems = []
    for name in names:
        if name.endswith(".json"):
            load = load_module if name == "lib.json" else load_graph
            try:
                load(folder / name)
            except GraphRuntimeError as e:
                problems.append(f"{folder / name}: {type(e).__name__}: {e}")
    return problems


def expected_matches(path: Path, data: bytes) -> bool:
    """expected.npz may differ in the last bits across BLAS builds; compare values, not bytes."""
    with np.load(path) as old, np.load(io.BytesIO(data)) as new:
        return (sorted(old.files) == sorted(new.files)
                and all(np.allclose(old[k], new[k], rtol=1e-6, atol=1e-9) for k in new.files))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files on disk instead of writing them")
    args = parser.parse_args(argv)
    problems = []
    for make in EXAMPLES:
        ex = make()
        folder = GRAPHS / ex.name
        files = example_files(ex)
        if args.check:
            problems += stale_files(folder, files)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        total = sum(len(d) for d in files.values())
        print(f"{ex.name:<12} {len(files)} files, {total / 1e6:.2f} MB")
        problems += validate(folder, list(files))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


def stale_files(folder: Path, files: dict[str, bytes]) -> list[str]:
    """Files on disk that differ from what this script writes now."""
    stale = []
    for name, data in files.items():
        path = folder / name
        if not path.exists():
            stale.append(f"{path}: missing (rerun examples/make_examples.py)")
        elif name == "expected.npz":
            if not expected_matches(path, data):
                stale.append(f"{path}: values differ (rerun examples/make_examples.py)")
        elif path.read_bytes() != data:
            stale.append(f"{path}: bytes differ (rerun examples/make_examples.py)")
    return stale


if __name__ == "__main__":
    sys.exit(main())

"""The ONNX target of tests/test_fuzz.py: seed models mutated at the protobuf level.

Seeds are the project's example model, small onnx.helper models that exercise folding, If,
Pad, Resize, OneHot, Split, Trilu, sparse and external data, and the ONNX backend node-test
models the importer passes (FUZZ_NODE_SEEDS of them, default all; every op it converts). A mutation changes one scalar field
anywhere in the message tree (names, dims, data types, attribute values and types, raw data
lengths, external data locations), removes or repeats an item of a repeated field, writes
invalid UTF-8 into a name, or damages the serialized bytes. Each case imports the model with
`from_onnx(path)` or `from_onnx(ModelProto, base_dir=...)` and, when it imports, creates and runs
it under a memory cap. An audit hook records any file opened outside the model's folder.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any, Callable

from support import concrete_shape

ROOT = Path(__file__).resolve().parents[1]
HOSTILE_INTS = [0, 1, 2, -1, 3, 7, 16, 255, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 62,
                2 ** 63 - 1, -2 ** 62, -2 ** 63]
HOSTILE_FLOATS = [0.0, -1.0, 0.5, 1e30, -1e30, float("nan"), float("inf"), float("-inf")]
# External data locations a hostile model would try (relative to the model's folder).
LOCATIONS = ["data.bin", "../secret.bin", "link_out", "hard_out", "fifo", "/dev/zero", "/etc/passwd",
             "sub/../data.bin", "", "missing.bin", "data.bin\x00x", "C:\\x", "./data.bin"]
WATCHED = ("secret.bin", "hard_out", "fifo", "/dev/zero", "/etc/passwd")


def _seed_models() -> list[Any]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64

    def make(nodes: list, inputs: list, outputs: list, inits: list = (),  # type: ignore
             opset: int = 17) -> Any:
        graph = helper.make_graph(nodes, "fuzz", inputs, outputs, list(inits))
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m

    def vi(name: str, elem: int, shape: Any) -> Any:
        return helper.make_tensor_value_info(name, elem, shape)

    def arr(name: str, value: Any) -> Any:
        return numpy_helper.from_array(np.asarray(value), name)

    seeds = [onnx.load(str(ROOT / "examples" / "onnx" / "cnn.onnx"))]
    seeds.append(make(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Add", ["r", "b"], ["y"])],
        [vi("x", f32, [2, 4])], [vi("y", f32, [2, 3])],
        [arr("w", np.ones((3, 4), np.float32)), arr("b", np.arange(3, dtype=np.float32))]))
    seeds.append(make(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
         helper.make_node("Unsqueeze", ["d", "ax"], ["du"]),
         helper.make_node("Concat", ["du", "m1"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"]),
         helper.make_node("ConstantOfShape", ["cs"], ["z"],
                          value=helper.make_tensor("v", f32, [1], [1.5])),
         helper.make_node("Range", ["r0", "r1", "r2"], ["rg"]),
         helper.make_node("Tile", ["z", "reps"], ["t"])],
        [vi("x", f32, [2, 3, 4])], [vi("y", f32, None), vi("t", f32, None), vi("rg", i64, None)],
        [arr("i", np.int64(0)), arr("ax", np.array([0], np.int64)),
         arr("m1", np.array([-1], np.int64)), arr("cs", np.array([2, 3], np.int64)),
         arr("r0", np.int64(0)), arr("r1", np.int64(6)), arr("r2", np.int64(2)),
         arr("reps", np.array([2, 1], np.int64))]))
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"])], "then", [],
                             [vi("t_out", f32, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
                              [vi("e_out", f32, [4])])
    seeds.append(make(
        [helper.make_node("Constant", [], ["c"], value=arr("cv", np.array([True]))),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("Pad", ["y", "pads"], ["p"], mode="edge"),
         helper.make_node("Trilu", ["m"], ["tri"], upper=1),
         helper.make_node("OneHot", ["idx", "depth", "vals"], ["oh"], axis=-1),
         helper.make_node("Split", ["p"], ["s0", "s1"], axis=0, num_outputs=2)],
        [vi("x", f32, [4])], [vi("s0", f32, None), vi("s1", f32, None), vi("tri", f32, None),
                              vi("oh", f32, None)],
        [arr("pads", np.array([1, 1], np.int64)), arr("m", np.ones((3, 3), np.float32)),
         arr("idx", np.array([0, 2], np.int64)), arr("depth", np.int64(3)),
         arr("vals", np.array([0, 1], np.float32))], opset=18))
    seeds.append(make(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"),
         helper.make_node("Constant", [], ["sp"], sparse_value=helper.make_sparse_tensor(
             arr("spv", np.array([1.0, 2.0], np.float32)), arr("spi", np.array([0, 3],
                                                                          np.int64)), [4])),
         helper.make_node("Mul", ["sp", "e"], ["z"]),
         helper.make_node("Gather", ["e", "gi"], ["g"], axis=0)],
        [vi("x", f32, [1, 1, 2, 2])], [vi("y", f32, None), vi("z", f32, None),
                                       vi("g", f32, None)],
        [arr("scales", np.array([1, 1, 2, 2], np.float32)), arr("e", np.ones(4, np.float32)),
         arr("gi", np.array([1, -1], np.int64))]))
    external = make([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", f32, [4])],
                    [vi("y", f32, [4])], [arr("w", np.arange(4, dtype=np.float32))])
    w = external.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "data.bin"), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    seeds.append(external)
    return seeds + _round_three_seeds(make, vi, arr)


def _round_three_seeds(make: Callable, vi: Callable, arr: Callable) -> list[Any]:
    """Seeds for the paths added since the first campaigns: QDQ, Loop, symbolic dims, data-sized
    Tile/Expand/Resize/ScatterND, large pooling windows, GridSample, RoiAlign, small exports."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    seeds = [onnx.load(str(ROOT / "tests" / "data" / "onnx" / f"{name}.onnx"))
             for name in ("loop_if_ts", "cond_dynamo", "gru_ts")]
    # NOTE: not a real transformer (bert_dyn): its first run compiles every chain (6-8 s), a
    # "slow" case the input did not cause; the symbolic seed below covers named dims.
    seeds.append(make(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
         helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"]),
         helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wdq"]),
         helper.make_node("MatMul", ["dq", "wdq"], ["y"])],
        [vi("x", f32, [2, 4])], [vi("y", f32, [2, 3])],
        [arr("s", np.float32(0.05)), arr("z", np.uint8(128)),
         arr("w", np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))], opset=13))
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=f32),
         helper.make_node("Mul", ["acc_out", "fi"], ["scan"])],
        "body", [vi("i", i64, []), vi("cond", TensorProto.BOOL, []), vi("acc", f32, [3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", f32, [3]), vi("scan", f32, [3])],
        [arr("step", np.ones(3, np.float32))])
    seeds.append(make(
        [helper.make_node("Loop", ["n", "", "x"], ["final", "scans"], body=body)],
        [vi("x", f32, [3])], [vi("final", f32, [3]), vi("scans", f32, None)],
        [arr("n", np.int64(4))]))
    seeds.append(make(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Slice", ["s", "b0", "b1"], ["bs"]),
         helper.make_node("Concat", ["bs", "m1"], ["flat"], axis=0),
         helper.make_node("Reshape", ["x", "flat"], ["r"]),
         helper.make_node("ReduceMean", ["r"], ["y"], axes=[1], keepdims=1),
         helper.make_node("Expand", ["y", "s2"], ["e"]),
         helper.make_node("Tile", ["x", "reps"], ["t"])],
        [vi("x", f32, ["batch", "seq", 4])],
        [vi("e", f32, None), vi("t", f32, None)],
        [arr("b0", np.array([0], np.int64)), arr("b1", np.array([1], np.int64)),
         arr("m1", np.array([-1], np.int64)),
         arr("s2", np.array([1, 1, 3], np.int64)), arr("reps", np.array([1, 2, 1], np.int64))]))
    seeds.append(make(
        [helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[5, 5], strides=[5, 5],
                          ceil_mode=1),
         helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="linear"),
         helper.make_node("ScatterND", ["d", "si", "su"], ["sc"]),
         helper.make_node("GridSample", ["x", "grid"], ["g"]),
         helper.make_node("RoiAlign", ["x", "rois", "bi"], ["ra"], output_height=2,
                          output_width=2)],
        [vi("x", f32, [1, 2, 3, 3])],
        [vi(n, f32, None) for n in ("a", "m", "r", "sc", "g", "ra")],
        [arr("sizes", np.array([1, 2, 5, 4], np.int64)), arr("d", np.zeros((4, 3), np.float32)),
         arr("si", np.array([[1], [3]], np.int64)), arr("su", np.ones((2, 3), np.float32)),
         arr("grid", np.zeros((1, 2, 2, 2), np.float32)),
         arr("rois", np.array([[0, 0, 2, 2]], np.float32)), arr("bi", np.array([0], np.int64))],
        opset=17))
    seeds.append(make(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
         helper.make_node("MatMulInteger", ["q", "wq", "qz", "wz"], ["acc"]),
         helper.make_node("Cast", ["acc"], ["y"], to=f32)],
        [vi("x", f32, [2, 4])], [vi("y", f32, None)],
        [arr("wq", np.arange(12, dtype=np.uint8).reshape(4, 3)), arr("wz", np.uint8(3))],
        opset=13))
    return seeds


def _node_test_seeds(limit: int) -> list[Any]:
    """Up to limit of the ONNX node-test models in the passing list, spread over the list."""
    sys.path.insert(0, str(ROOT / "tests" / "frontend"))
    from onnx_node_cases import node_cases, read_passing_list
    names = read_passing_list()
    if limit < len(names):
        names = names[::max(len(names) // max(limit, 1), 1)][:limit]
    cases = node_cases()
    return [cases[name].model for name in names if name in cases]


def _prepare_folder(tmp: Path) -> Path:
    """The model's folder with its external data file, plus the traps around it."""
    import numpy as np
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    (folder / "data.bin").write_bytes(np.arange(64, dtype=np.float32).tobytes())
    (tmp / "secret.bin").write_bytes(b"S" * 4096)
    for name, make in (("link_out", lambda p: p.symlink_to(tmp / "secret.bin")),
                       ("hard_out", lambda p: os.link(tmp / "secret.bin", p)),
                       ("fifo", lambda p: os.mkfifo(p))):
        path = folder / name
        if not os.path.lexists(path):
            make(path)
    return folder


def _fields(message: Any, out: list, depth: int = 0) -> list:
    """(message, field descriptor, index or None) for scalar fields; repeated ones sampled."""
    from google.protobuf.descriptor import FieldDescriptor
    if depth > 12:
        return out
    for field, value in message.ListFields():
        repeated = field.is_repeated if hasattr(field, "is_repeated") else \
            field.label == field.LABEL_REPEATED
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            items = list(value)[:8] if repeated else [value]
            for item in items:
                _fields(item, out, depth + 1)
            if repeated:
                out.append((message, field, None))
        else:
            out.append((message, field, 0 if repeated and len(value) else None))
    return out


def _hostile_value(field: Any, old: Any, rng: random.Random) -> Any:
    from google.protobuf.descriptor import FieldDescriptor
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rng.choice(HOSTILE_FLOATS)
    if field.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(["", "x", "y", "data", "w", "c", "Relu", "Unknown", "ai.onnx",
                           "location", *LOCATIONS])
    if field.type == FieldDescriptor.TYPE_BYTES:
        old = bytes(old or b"")
        return rng.choice([b"", old[:len(old) // 2], old + old, old[:-1], b"\xff\xfe",
                           old + b"\x00" * 8])
    if field.type == FieldDescriptor.TYPE_BOOL:
        return not old
    if field.type == FieldDescriptor.TYPE_ENUM:  # proto2 enums: only declared numbers parse
        return rng.choice([v.number for v in field.enum_type.values])
    near = [old - 1, old + 1, old * 2, -old] if isinstance(old, int) else []
    value = rng.choice(HOSTILE_INTS + near)
    unsigned = field.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
                              FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64)
    bits = 32 if field.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT32,
                                FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_FIXED32,
                                FieldDescriptor.TYPE_SFIXED32) else 64
    if unsigned:
        return value % (1 << bits)
    return (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _mutate_field(model: Any, rng: random.Random) -> None:
    from google.protobuf.descriptor import FieldDescriptor
    fields = _fields(model, [])
    message, field, index = rng.choice(fields)
    if field.type == FieldDescriptor.TYPE_STRING and rng.random() < 0.7:
        # A renamed value mostly breaks a reference: keep most mutations on numbers and data.
        message, field, index = rng.choice(fields)
    value = getattr(message, field.name)
    if field.type == FieldDescriptor.TYPE_MESSAGE:  # a repeated message field
        action = rng.random()
        if len(value) and action < 0.5:
            del value[rng.randrange(len(value))]
        elif len(value):
            value.add().CopyFrom(value[rng.randrange(len(value))])
        return
    if index is not None:
        action = rng.random()
        if action < 0.25:
            del value[rng.randrange(len(value))]
            return
        if action < 0.4:
            value.append(value[rng.randrange(len(value))])
            return
        index = rng.randrange(len(value))
        value[index] = _hostile_value(field, value[index], rng)
        return
    setattr(message, field.name, _hostile_value(field, value, rng))


def _external(model: Any, rng: random.Random) -> None:
    """One tensor (initializer, Constant, sparse value) moved to a hostile external location."""
    from onnx import TensorProto

    from graph_runtime.frontend.external_data import model_tensors
    tensors = [t for _, t in model_tensors(model)]
    if not tensors:
        return
    t = rng.choice(tensors)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    entry = t.external_data.add()
    entry.key, entry.value = "location", rng.choice(LOCATIONS)
    if rng.random() < 0.5:
        entry = t.external_data.add()
        entry.key, entry.value = rng.choice(["offset", "length"]), str(rng.choice(HOSTILE_INTS))


def _bad_utf8(data: bytes, rng: random.Random) -> bytes:
    """A short name in the serialized model overwritten by invalid UTF-8 of the same length."""
    names = [b"x", b"y", b"w", b"data", b"prob", b"fuzz", b"cnn", b"then", b"c1", b"shape"]
    name = rng.choice(names)
    hits = [i for i in range(len(data)) if data.startswith(bytes([len(name)]) + name, i)]
    if not hits:
        return data
    at = rng.choice(hits) + 1
    return data[:at] + b"\xff" * len(name) + data[at + len(name):]


def mutate_model(seed: Any, rng: random.Random, mutate_bytes: Callable) -> bytes:
    """The serialized seed after 1-3 protobuf-level mutations (sometimes byte-level ones)."""
    import onnx
    model = onnx.ModelProto()
    model.CopyFrom(seed)
    for _ in range(rng.randint(1, 3)):
        action = rng.random()
        if action < 0.85:
            _mutate_field(model, rng)
        else:
            _external(model, rng)
    data = model.SerializeToString()
    action = rng.random()
    if action < 0.08:
        data = _bad_utf8(data, rng)
    elif action < 0.12:
        data = mutate_bytes(data, rng)
    return data


def onnx_target(mutate_bytes: Callable, memory_cap: int) -> Callable[[random.Random], None]:
    """One case: a mutated model through from_onnx (path or proto), then create and run."""
    import numpy as np
    import onnx

    import graph_runtime as gr
    from graph_runtime.errors import FrontendError
    from graph_runtime.frontend import from_onnx
    tmp = Path(os.environ["FUZZ_TMP"])
    folder = _prepare_folder(tmp)
    path = folder / "model.onnx"
    seeds = _seed_models()
    node_seeds = _node_test_seeds(int(os.environ.get("FUZZ_NODE_SEEDS", 100000)))
    outside: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            name = os.fsdecode(args[0])
            if name.endswith(WATCHED) or "/secret.bin" in name:
                outside.append(name)
    sys.addaudithook(audit)

    def case(rng: random.Random) -> None:
        pool = node_seeds if node_seeds and rng.random() < 0.6 else seeds
        data = mutate_model(rng.choice(pool), rng, mutate_bytes)
        if rng.random() < 0.5:
            path.write_bytes(data)
            model: Any = path
            base = None
        else:
            try:
                model = onnx.ModelProto.FromString(data)
            except Exception as e:  # noqa: BLE001 - damaged bytes: not a proto to hand over
                raise FrontendError(f"not a proto: {e}") from None
            base = folder if rng.random() < 0.8 else None
        try:
            graph_json, lib, params = from_onnx(model, base_dir=base)
        finally:
            if outside:
                opened = list(outside)
                outside.clear()
                raise AssertionError(f"opened outside the model's folder: {opened}")
        m = gr.create(graph_json, lib, gr.cpu(), memory_cap=memory_cap)
        m.load_params(params)
        shapes, dtypes = m.get_input_info()
        for name, shape in shapes.items():
            if name not in params:  # get_input_info lists params too, as TVM's does
                m.set_input(name, np.zeros(concrete_shape(shape), dtypes[name]))
        m.run()
    return case

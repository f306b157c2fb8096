"""One graphrun job: find a graph's files, pick devices, load inputs, build, run and compare."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import settings
from ..backends import available_backends, check_device
from ..device import Device
from ..device import device as parse_device
from ..errors import DeviceError, GraphError, GraphRuntimeError, ParamsError
from ..graph.model import Graph
from ..params import load_params_file
from ..graph.symbolic import format_shape, shape_is_symbolic
from ..runtime.graph_module import create
from ..runtime.module_base import ModuleBase

# The files an example folder (examples/graphs/<name>/) holds, by the flag they stand in for.
FOLDER_FILES = {"graph": ("graph.json",), "lib": ("lib.json", "lib.py"), "params": ("params",),
                "inputs": ("inputs.npz",), "expected": ("expected.npz",)}


@dataclass(frozen=True)
class GraphFiles:
    """The graph file and the files that go with it; None where there is none."""

    graph: Path
    lib: Path | None = None
    params: Path | None = None
    inputs: Path | None = None
    expected: Path | None = None
    folder: Path | None = None  # the example folder GRAPH named, if it named one
    lib_beside: bool = False  # lib found beside a graph file (not given with --lib)


def resolve_files(graph: str | os.PathLike[str], lib: str | os.PathLike[str] | None = None,
                  params: str | os.PathLike[str] | None = None,
                  inputs: str | os.PathLike[str] | None = None,
                  expected: str | os.PathLike[str] | None = None) -> GraphFiles:
    """GraphFiles for a graph file, or for an example folder whose files fill flags not given."""
    path = Path(graph)
    given = {"lib": lib, "params": params, "inputs": inputs, "expected": expected}
    chosen = {key: Path(value) if value is not None else None for key, value in given.items()}
    if not path.is_dir():
        if not path.exists():
            raise GraphError(f"{path}: no such graph file or example folder")
        if not path.is_file():
            raise GraphError(f"{path}: not a regular file (a FIFO or a device); give a graph "
                             "JSON file or an example folder")
        if chosen["lib"] is None:
            # The lib beside a graph file goes with it, as in an example folder (said in notes).
            found = [path.parent / name for name in FOLDER_FILES["lib"]
                     if (path.parent / name).is_file()]
            if found:
                return GraphFiles(path, found[0], chosen["params"], chosen["inputs"],
                                  chosen["expected"], lib_beside=True)
        return GraphFiles(path, chosen["lib"], chosen["params"], chosen["inputs"],
                          chosen["expected"])
    graph_file = path / "graph.json"
    if not graph_file.is_file():
        raise GraphError(f"{path}: an example folder needs a graph.json; found "
                         + (", ".join(sorted(p.name for p in path.iterdir())) or "nothing"))
    for key, value in chosen.items():
        if value is None:
            found = [path / name for name in FOLDER_FILES[key] if (path / name).is_file()]
            chosen[key] = found[0] if found else None
    return GraphFiles(graph_file, chosen["lib"], chosen["params"], chosen["inputs"],
                      chosen["expected"], folder=path)


def parse_devices(specs: Sequence[str], *, check: bool = True, flag: str = "-d") -> list[Device]:
    """Devices from -d specs in order ("cpu", "opencl:0", "auto"); no specs means "auto".

    "auto" is cpu:0, then opencl:0 and cuda:0 where this machine has them. With check, a device
    this machine lacks is a DeviceError naming the flag.
    """
    devices: list[Device] = []
    for spec in specs or ["auto"]:
        if spec.strip().lower() == "auto":
            found = [parse_device(kind) for kind in available_backends()]
        else:
            try:
                found = [parse_device(spec)]
                if check:
                    check_device(found[0])
            except DeviceError as e:
                detail = str(e)
                kind = spec.partition(":")[0].strip().lower()
                if detail.startswith(f"{kind}: "):  # backends start with their name already
                    detail = detail[len(kind) + 2:]
                raise DeviceError(f"{flag} {spec}: {detail}") from e
        for dev in found:
            if dev in devices:
                raise DeviceError(f"{flag} {spec}: {dev.spec} is given twice; list each device "
                                  "once")
            devices.append(dev)
    return devices


def read_array(path: Path, where: str) -> np.ndarray:
    """A .npy file as an array (no pickles); ParamsError names where it was asked for."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ParamsError(f"{where}: no such file {str(path)!r}") from None
    except (OSError, ValueError, EOFError) as e:
        raise ParamsError(f"{where}: cannot read {str(path)!r} as a .npy array: {e}") from e


def param_names(files: GraphFiles) -> list[str]:
    """Names the params file sets (empty without one)."""
    return list(load_params_file(files.params)) if files.params is not None else []


@dataclass
class Inputs:
    """Values for the graph's data inputs, and which of them were drawn at random."""

    values: dict[str, np.ndarray] = field(default_factory=dict)
    random: list[str] = field(default_factory=list)


def load_inputs(graph: Graph, files: GraphFiles, pairs: Sequence[str] = (), seed: int = 0,
                skip: Sequence[str] = (), draw: bool = True) -> Inputs:
    """Inputs from files.inputs (.npz) and NAME=FILE.npy pairs; others (not in skip) at random.

    draw=False leaves the random ones to draw_missing (after create() has checked the cap).
    """
    eids = graph.input_entries
    result = Inputs()
    given: list[tuple[str, str, np.ndarray]] = []
    if files.inputs is not None:
        where = f"--inputs {files.inputs}"
        if not files.inputs.is_file():
            raise ParamsError(f"{where}: no such file")
        given += [(where, name, value)
                  for name, value in load_params_file(files.inputs, "inputs").items()]
    for item in pairs:
        name, sep, filename = item.partition("=")
        if not sep or not name or not filename:
            raise ParamsError(f"--input {item}: expected NAME=FILE.npy, e.g. --input data=x.npy")
        given.append((f"--input {item}", name, read_array(Path(filename), f"--input {item}")))
    for where, name, value in given:
        eid = eids.get(name)
        if eid is None:
            raise GraphError(f"{where}: graph has no input {name!r}; inputs are: "
                             + ", ".join(eids))
        want = (tuple(graph.shape(eid)), np.dtype(graph.dtype(eid)))
        if shape_is_symbolic(want[0]) and len(value.shape) == len(want[0]):
            # NOTE: any shape the symbolic dims allow; the module checks it when it specialises.
            want = (tuple(value.shape), want[1])
        if (tuple(value.shape), value.dtype) != want:
            raise ParamsError(f"{where}: input {name!r} (eid {eid}) expects {want[0]} {want[1]}, "
                              f"got {tuple(value.shape)} {value.dtype}")
        result.values[name] = value
    if draw:
        draw_missing(graph, result, seed, skip)
    return result


def draw_missing(graph: Graph, inputs: Inputs, seed: int, skip: Sequence[str] = ()) -> None:
    """Random values for the inputs neither given nor in skip (recorded in inputs.random)."""
    rng = np.random.default_rng(seed)
    for name, eid in graph.input_entries.items():
        if name in inputs.values or name in skip:
            continue
        shape = tuple(graph.shape(eid))
        if shape_is_symbolic(shape):
            raise GraphError(f"input {name!r} has symbolic dims {format_shape(shape)}; give it "
                             f"with --input {name}=FILE.npy or --inputs FILE.npz (any shape the "
                             "dims allow)")
        inputs.values[name] = random_array(rng, shape, graph.dtype(eid))
        inputs.random.append(name)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard normal floats, small non-negative ints (valid as indices), or random bools."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    raise GraphError(f"cannot draw random values of dtype {dtype}; give the input with --input")


def output_names(graph: Graph) -> list[str]:
    """A name per output: the graph's declared names (an imported model's own,
    docs/output_names.md), else its head node's name (as TVM names outputs), ':i' when needed."""
    return list(graph.output_names)


def output_keys(graph: Graph) -> list[str]:
    """The key of each output in the .npz files graphrun writes: its declared name, else
    output_<i>."""
    declared = graph.declared_output_names
    return declared if declared is not None else [f"output_{i}" for i in range(len(graph.heads))]


@dataclass
class Job:
    """A built module with its inputs set: what run, compare, profile and regress share."""

    files: GraphFiles
    graph: Graph
    devices: list[Device]
    module: ModuleBase
    inputs: Inputs
    seconds: float = 0.0  # the last run's wall time, outputs fetched
    float32_products: bool = False  # CUDA's TF32 turned off for this comparison

    def run(self) -> list[np.ndarray]:
        """Run once and fetch every output to the host (which waits for the devices)."""
        start = time.perf_counter()
        # a symbolic graph makes a new shape's kernels in run(): they keep create()'s precision
        with settings.overridden(settings.CUDA_TF32, "off" if self.float32_products else None):
            self.module.run()
        outputs = [self.module.get_output(i).numpy()
                   for i in range(self.module.get_num_outputs())]
        self.seconds = time.perf_counter() - start
        return outputs


def job_from_files(files: GraphFiles, devices: Sequence[Device], pairs: Sequence[str] = (),
                   seed: int = 0, strict: bool = False) -> Job:
    """Read the graph, create the module on devices, load params, set inputs."""
    graph = Graph.from_json(files.graph)
    # NOTE: read once; weight files can be large.
    # views: the module's load_params reads each weight straight into its storage (preadv).
    params = load_params_file(files.params, views=True) if files.params is not None else {}
    # NOTE: create first: it checks the memory cap, so a huge graph is refused before random
    # inputs are drawn for it (that died allocating 74.5 GiB).
    inputs = load_inputs(graph, files, pairs, seed, skip=list(params), draw=False)
    float32 = float32_for_comparison(files, devices)
    with settings.overridden(settings.CUDA_TF32, "off" if float32 else None):
        module = create(graph, files.lib, list(devices), strict=strict)
    draw_missing(graph, inputs, seed, skip=list(params))
    if files.params is not None:
        module.load_params(params, source=os.fspath(files.params))
    module.set_input(inputs.values)
    return Job(files, graph, list(devices), module, inputs, float32_products=float32)


def float32_for_comparison(files: GraphFiles, devices: Sequence[Device]) -> bool:
    """Whether a job's CUDA products run in full float32 rather than TF32 (the runtime's default
    there, GRAPH_RUNTIME_CUDA_TF32): when its outputs are compared with expected values, whose
    default tolerances are float32's and TF32's ~1e-3 would not meet them; not when the user
    set the variable."""
    return (files.expected is not None and settings.CUDA_TF32.name not in os.environ
            and any(d.kind == "cuda" for d in devices))


@dataclass(frozen=True)
class Comparison:
    """One output against its expected value."""

    index: int
    name: str
    ok: bool
    max_abs: float
    max_rel: float
    problem: str = ""  # why it cannot be compared (shape or dtype differ), else empty


def expected_outputs(path: Path, names: Sequence[str],
                     aliases: Sequence[str] = ()) -> list[np.ndarray]:
    """Expected value per output from an .npz: key output_<i> (as examples/ write), the output's
    name, or its alias (TVM's head node name, for a graph that declares names); a key that is
    another output's name means that output."""
    if not path.is_file():
        raise ParamsError(f"--expected {path}: no such file")
    arrays = load_params_file(path, "expected values")
    result = []
    for i, name in enumerate(names):
        keys = [f"output_{i}", name] + ([aliases[i]] if i < len(aliases) else [])
        keys = [k for j, k in enumerate(keys) if j == 1 or k not in names]
        keys = list(dict.fromkeys(keys))
        found = next((k for k in keys if k in arrays), None)
        if found is None:
            tried = " or ".join(repr(k) for k in keys)
            raise ParamsError(f"--expected {path}: no array for output {i} {name!r} (key "
                              f"{tried}); it has: {', '.join(arrays) or 'none'}")
        result.append(arrays[found])
    return result


# The one place for comparison tolerances: --rtol/--atol defaults and a suite's defaults.
TOLERANCES = {"rtol": 1e-4, "atol": 1e-5}


def tolerance_problem(value: Any) -> str:
    """Why value cannot be a tolerance ("" when it can): a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number >= 0, got {value!r}"
    if not math.isfinite(value) or value < 0:
        return f"expected a finite number >= 0, got {value!r}"
    return ""


def compare(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], names: Sequence[str],
            rtol: float, atol: float) -> list[Comparison]:
    """Max abs and rel error per output; ok when |got - want| <= atol + rtol * |want| everywhere.

    The relative error skips elements whose expected value is 0 (it is infinite there); it is
    NaN when every expected value is 0.
    """
    result = []
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if got.shape != want.shape or got.dtype != want.dtype:
            result.append(Comparison(i, names[i], False, float("nan"), float("nan"),
                                     f"expected {want.shape} {want.dtype}, got "
                                     f"{got.shape} {got.dtype}"))
            continue
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        diff = np.abs(g64 - w64)
        nonzero = w64 != 0
        max_abs = float(diff.max()) if diff.size else 0.0
        # NaN (shown as n/a) where every expected value is 0: no relative error exists.
        if nonzero.any():
            max_rel = float((diff[nonzero] / np.abs(w64[nonzero])).max())
        else:
            max_rel = float("nan") if w64.size else 0.0
        ok = bool(np.allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True))
        result.append(Comparison(i, names[i], ok, max_abs, max_rel))
    return result


def benchmark(job: Job, repeat: int, progress: Callable[[int], None] | None = None) -> Any:
    """Device-synchronised timing of repeat runs (one run each), after a warm-up run."""
    if repeat < 1:
        raise GraphRuntimeError(f"--repeat {repeat}: expected a count >= 1")
    return job.module.benchmark(repeat=repeat, number=1, progress=progress)


def describe_devices(devices: Sequence[Device]) -> dict[Device, str]:
    """Each device's name as its backend reports it (for the people reading the output)."""
    names = {}
    for dev in devices:
        try:
            names[dev] = check_device(dev).device_info(dev.device_id).name
        except DeviceError as e:
            names[dev] = f"not available: {e}"
    return names


"""Measuring auto placement's costs: kernel seconds per device, copy models, switch costs.

A kernel is measured once per cache key (cost_cache.py): warm-up, then device-synchronised
medians (graph_runtime._timing.time_runs with the backend's sync). A copy between two devices is
modelled as latency + bytes / bandwidth, fitted from three sizes. A kernel's switch cost is what
it loses when the step before it ran on another device rather than its own (PoCL's worker threads
wake, a CPU kernel shares the cores with PoCL's still-spinning ones): timed right after a touch of
each device, the difference of the medians. All go into the cache file, so a second plan of the
same graph measures nothing.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..._timing import time_runs
from ...backends import check_device, copy_array
from ...device import Device
from ...lib.library import Module, TensorSpec
from ...lib.prepared import capabilities
from .cost_cache import (CopyModel, CostCache, KernelCase, copy_key, device_name, kernel_key,
                         switch_key)

COPY_SIZES = (4 << 10, 256 << 10, 4 << 20)  # bytes; the fit's three points
TOUCH_BYTES = 4 << 20  # a step's worth of work on a device before a switch cost sample


@dataclass
class Measurer:
    """Times kernels and copies, filling a CostCache; counts what it really measured."""

    lib: Module
    cache: CostCache
    budget_s: float = 60.0
    repeat: int = 5
    kernels_measured: int = 0
    copies_measured: int = 0
    values: dict[str, np.ndarray] = field(default_factory=dict)  # value_digest -> the array
    _names: dict[Device, str] = field(default_factory=dict)
    _keys: dict[KernelCase, str] = field(default_factory=dict)

    def name(self, dev: Device) -> str:
        if dev not in self._names:
            self._names[dev] = device_name(dev)
        return self._names[dev]

    def key(self, case: KernelCase) -> str:
        key = self._keys.get(case)
        if key is None:
            self.name(case.device)
            key = self._keys[case] = kernel_key(case, self.lib, self._names)
        return key

    def missing(self, cases: Sequence[KernelCase], pairs: Sequence[tuple[Device, Device]]
                ) -> tuple[list[KernelCase], list[tuple[Device, Device]]]:
        """The cases and device pairs the cache lacks (a case lacking a switch cost counts)."""
        todo, pair_todo, _ = self._missing(cases, pairs)
        return todo, pair_todo

    def _missing(self, cases: Sequence[KernelCase], pairs: Sequence[tuple[Device, Device]]
                 ) -> tuple[list[KernelCase], list[tuple[Device, Device]],
                            dict[KernelCase, list[Device]]]:
        """missing(), plus per case the devices after which its switch cost is not cached."""
        switch_todo = self._switches_missing(cases, pairs)
        todo = [c for c in dict.fromkeys(cases)
                if self.key(c) not in self.cache.kernels or c in switch_todo]
        pair_todo = [(a, b) for a, b in dict.fromkeys(pairs)
                     if copy_key(a, b, self._name_map(a, b)) not in self.cache.copies]
        return todo, pair_todo, switch_todo

    def _switches_missing(self, cases: Sequence[KernelCase],
                          pairs: Sequence[tuple[Device, Device]]) -> dict[KernelCase, list[Device]]:
        """Per case, the other devices after which its switch cost is not cached."""
        found: dict[KernelCase, list[Device]] = {}
        for case in dict.fromkeys(cases):
            before = [a for a, b in pairs if b == case.device
                      and switch_key(self.key(case), a, self._name_map(a)) not in
                      self.cache.switches]
            if before:
                found[case] = before
        return found

    def _name_map(self, *devs: Device) -> dict[Device, str]:
        for dev in devs:
            self.name(dev)
        return self._names

    def measure(self, cases: Sequence[KernelCase], pairs: Sequence[tuple[Device, Device]],
                step: Callable[[str], None] | None = None) -> None:
        """Measure what the cache lacks, within budget_s (then one timed run each), and save."""
        todo, pair_todo, switch_todo = self._missing(cases, pairs)
        started = time.perf_counter()
        jobs = len(todo) + len(pair_todo)
        share_ms = 1e3 * self.budget_s / max(jobs, 1) / (self.repeat + 1)
        touches = _Touches()
        # One device at a time, copies last: PoCL's worker threads keep spinning a while after a
        # kernel, and a NumPy kernel timed right after one would pay for it.
        todo.sort(key=lambda c: (c.device.device_type, c.device.device_id))
        for case in todo:
            over = time.perf_counter() - started > self.budget_s
            repeat = 1 if over else self.repeat
            min_ms = None if over else min(20.0, share_ms)
            fn, args, backend = self._prepared(case)
            dev_id = case.device.device_id
            with backend.scope(dev_id), np.errstate(all="ignore"):
                self.cache.kernels[self.key(case)] = time_runs(
                    lambda: fn(*args), lambda: backend.sync(dev_id), repeat, 1, min_ms).median
                for before in switch_todo.get(case, []):
                    key = switch_key(self.key(case), before, self._names)
                    self.cache.switches[key] = touches.switch_seconds(
                        lambda: fn(*args), case.device, before, max(repeat, 3))
            self.kernels_measured += 1
            if step is not None:
                step(f"{case.func_name} on {case.device.spec}")
        for a, b in pair_todo:
            self.cache.copies[copy_key(a, b, self._names)] = measure_copy(a, b, self.repeat)
            self.copies_measured += 1
            if step is not None:
                step(f"copy {a.spec} -> {b.spec}")
        if jobs:
            self.cache.save()

    def kernel_seconds(self, case: KernelCase) -> float:
        return self.cache.kernels[self.key(case)]

    def copy_model(self, src: Device, dst: Device) -> CopyModel:
        return self.cache.copies[copy_key(src, dst, self._name_map(src, dst))]

    def switch_seconds(self, case: KernelCase, before: Device) -> float:
        """What case loses when the step before it ran on `before` instead of its device."""
        return self.cache.switches[switch_key(self.key(case), before, self._name_map(before))]

    def _prepared(self, case: KernelCase) -> tuple[Callable[..., Any], list[Any], Any]:
        """The case's kernel as the executor prepares it, its arguments, and its backend."""
        backend = check_device(case.device)
        dev_id = case.device.device_id
        rng = np.random.default_rng(0)
        args = []
        known = dict(case.constants)
        for pos, spec in enumerate(case.inputs):
            array = backend.empty(dev_id, tuple(spec.shape), np.dtype(spec.dtype))
            value = self.values.get(known.get(pos, ""))
            if value is not None and value.size == array.size:
                # NOTE: params may be stored (1,) for a () entry; load_params reshapes alike.
                host = np.ascontiguousarray(value, dtype=spec.dtype).reshape(spec.shape)
            else:
                host = _sample(rng, spec)
            backend.from_host(host, array)
            args.append(array)
        for spec in case.outputs:
            args.append(backend.empty(dev_id, tuple(spec.shape), np.dtype(spec.dtype)))
        if case.flatten:
            args = [a.reshape(-1) for a in args]
        attrs = {k: json.loads(v) for k, v in case.attrs}
        fn = self.lib.prepare(case.func_name, case.device, case.inputs, case.outputs, attrs,
                              node=f"measuring {case.func_name}")
        if not case.flatten:
            # As the executor does: an input the kernel wants in its own buffer (a padded GEMV
            # weight) lives there, so the kernel is timed on the path it takes in a graph.
            for pos, array in capabilities(fn).storage_requests().items():
                if pos < len(case.inputs):
                    backend.copy(args[pos], array)
                    args[pos] = array
        # NOTE: sampled values may leave an op's domain (log of a negative); the warnings would
        # be about samples, not the user's data (callers time under np.errstate(all="ignore")).
        return fn, args, backend


class _Touches:
    """A step's worth of work on each device (a TOUCH_BYTES copy there, synchronised), to time
    a kernel right after its own device worked and right after another did."""

    def __init__(self) -> None:
        self._buffers: dict[Device, tuple[Any, Any]] = {}

    def touch(self, dev: Device) -> None:
        backend = check_device(dev)
        if dev not in self._buffers:
            n = TOUCH_BYTES // 4
            pair = tuple(backend.empty(dev.device_id, (n,), np.dtype("float32")) for _ in "ab")
            backend.from_host(np.ones(n, dtype=np.float32), pair[0])
            self._buffers[dev] = (pair[0], pair[1])
        src, dst = self._buffers[dev]
        backend.copy(src, dst)
        backend.sync(dev.device_id)

    def switch_seconds(self, call: Callable[[], None], device: Device, before: Device,
                       repeat: int) -> float:
        """Median seconds of call (synchronised) after a touch of `before`, less the median
        after a touch of its own device; never below zero. Samples interleave the two."""
        backend = check_device(device)
        own: list[float] = []
        other: list[float] = []
        for _ in range(repeat):
            for where, samples in ((device, own), (before, other)):
                self.touch(where)
                start = time.perf_counter()
                call()
                backend.sync(device.device_id)
                samples.append(time.perf_counter() - start)
        return max(0.0, float(np.median(other) - np.median(own)))


def _sample(rng: np.random.Generator, spec: TensorSpec) -> np.ndarray:
    """Values a kernel accepts: normal floats, small non-negative ints (valid indices)."""
    kind = np.dtype(spec.dtype).kind
    if kind == "f":
        return rng.standard_normal(spec.shape).astype(spec.dtype)
    if kind == "b":
        return np.zeros(spec.shape, dtype=spec.dtype)
    return np.zeros(spec.shape, dtype=spec.dtype)


def measure_copy(src: Device, dst: Device, repeat: int = 5) -> CopyModel:
    """Latency and seconds per byte of copies src -> dst, a least-squares line over COPY_SIZES."""
    src_backend = check_device(src)
    dst_backend = check_device(dst)
    sizes = []
    seconds = []
    for nbytes in COPY_SIZES:
        n = nbytes // 4
        a = src_backend.empty(src.device_id, (n,), np.dtype("float32"))
        src_backend.from_host(np.ones(n, dtype=np.float32), a)
        b = dst_backend.empty(dst.device_id, (n,), np.dtype("float32"))

        def once(a: Any = a, b: Any = b) -> None:
            copy_array(src_backend, a, dst_backend, b)

        def sync() -> None:
            src_backend.sync(src.device_id)
            dst_backend.sync(dst.device_id)

        result = time_runs(once, sync, repeat, 1, 2.0)
        sizes.append(float(nbytes))
        seconds.append(result.median)
    slope, intercept = np.polyfit(np.asarray(sizes), np.asarray(seconds), 1)
    per_byte = max(float(slope), 0.0)
    latency = max(float(intercept), 0.0)
    if latency == 0.0:
        latency = min(seconds)  # a negative intercept: take the small copy as the floor
    return CopyModel(latency, per_byte)

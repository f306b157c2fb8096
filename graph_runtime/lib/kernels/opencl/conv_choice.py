"""Which OpenCL conv2d method runs a shape where several apply: forced, or the tuning service's.

GRAPH_RUNTIME_OPENCL_CONV: auto (default: where Winograd applies, time it against the GEMM
method on the device once per shape and device, keep the fastest, remember it in the tuning
cache, lib/tuning.py), or one of conv.METHODS to force it wherever it applies (elsewhere the
auto choice).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .... import settings
from ...._timing import Race, Verdict, sampler
from ...conv_params import ConvParams
from ...library import InputVersion
from ...prepared import capabilities
from ...tunable import Candidate, TunableOp
from ...tuning import Choice
from ..gpu_common import device_array
from ..winograd_math import winograd_applies
from .gemm import GemmShape, chosen_variant, is_cpu_device

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# The methods (conv.py builds them): the GEMM ones (gemm_method picks the one of them offered)
# and the Winograd ones where they apply. A forced name is taken by conv.conv2d_cl wherever it
# applies.
CONV2D: TunableOp[None] = TunableOp(Choice("opencl.conv2d", settings.OPENCL_CONV), tuple(
    Candidate(name) for name in settings.OPENCL_CONV.choices if name != "auto"))
CHOICE = CONV2D.choice
# On a CPU device a convolution with at most this many output channels per group (depthwise:
# 1) runs the direct kernel: the packed GEMM's 12-row register blocks would mostly idle
# (docs/measurements.md).
DIRECT_MAX_OG = 4
# The Winograd methods of conv2d_cl, by output tile size m (winograd.py).
WINOGRAD = {"winograd": 2, "winograd4": 4}

Build = Callable[[str], Callable[[Any, Any, Any], None]]


def gemm_method(backend: OpenCLBackend, device_id: int, p: ConvParams, shape: GemmShape) -> str:
    """The method without Winograd: a CPU device sums few-channel groups (depthwise) directly
    and feeds the rest to the packed GEMM through panel-writing im2col; other devices run
    im2col + GEMM."""
    if is_cpu_device(backend, device_id) and p.og <= DIRECT_MAX_OG:
        return "direct"
    if chosen_variant(backend, device_id, shape) == "packed":
        return "panel"
    return "im2col"


def pick_method(backend: OpenCLBackend, device_id: int, p: ConvParams, shape: GemmShape,
                build: Build) -> str:
    """conv2d_cl's method for p: gemm_method's, or a Winograd size where Winograd applies and
    measured faster on this device (both sizes timed against the GEMM method once per shape
    and device).

    Args:
        shape: the GEMM of the im2col methods (gemm_method's choice depends on it).
        build: build(method) -> run(data, weight, out), for the timing.
    """
    base = gemm_method(backend, device_id, p, shape)
    if not winograd_applies(p) or p.n * p.o * p.oh * p.ow == 0:
        return base
    return measured_method(backend, device_id, p, [base, *WINOGRAD], build)


def measured_method(backend: OpenCLBackend, device_id: int, p: ConvParams,
                    candidates: Sequence[str],
                    build: Build) -> str:
    """The fastest of candidates for p on the device, timed once per shape and device (the
    tuning service remembers it).

    Args:
        candidates: method names; the first is the default, kept unless another is
            faster by what the speedup rule asks (_timing.min_speedup).
        build: build(method) -> run(data, weight, out).
    """
    device = f"opencl:{device_id} {backend.cl_device(device_id).name.strip()}"
    return CONV2D.choose(candidates, device, p.key(),
                         lambda race: _race(race, backend, device_id, p, candidates, build),
                         candidates[0])


def _race(race: Race, backend: OpenCLBackend, device_id: int, p: ConvParams,
          candidates: Sequence[str], build: Build) -> Verdict:
    """The candidates raced on device arrays of p's shapes, device-synchronised."""
    rng = np.random.default_rng(0)
    dtype = np.dtype(p.dtype)
    data = device_array(backend, device_id, rng.standard_normal((p.n, p.c, p.h, p.w)).astype(dtype))
    weight = device_array(backend, device_id,
                     rng.standard_normal((p.o, p.cg, p.kh, p.kw)).astype(dtype))
    out = backend.empty(device_id, (p.n, p.o, p.oh, p.ow), dtype)
    steady = InputVersion()  # constant weights, as params are: derived weights made once
    sources = {}
    for name in candidates:
        run = build(name)
        kernel = capabilities(run)
        kernel.bind_versions({pos: steady for pos in kernel.cached_inputs()})
        sources[name] = sampler(functools.partial(run, data, weight, out),
                                lambda: backend.sync(device_id))
    return race(sources)


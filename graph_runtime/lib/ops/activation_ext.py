"""ONNX's further activations (softplus ... thresholded_relu) with its attribute names/defaults,
and silu (x * sigmoid(x), which the import's silu pass forms)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..attrs import attr_error, float_attr
from ..expr_ops import ExprOp, host_compute, literal, register_family
from ..shapes import FLOAT_DTYPES

# ONNX's defaults, as the float32 values its schema stores.
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875
HARD_SIGMOID_ALPHA = 0.2
HARD_SIGMOID_BETA = 0.5

def _softplus(x: Any) -> Any:
    # NOTE: log(1 + exp(x)) overflows for large x; max(x, 0) + log1p(exp(-|x|)) never does.
    return np.logaddexp(0, x)


def _silu(x: Any) -> Any:
    # sigmoid as its own kernel computes it (0.5 tanh(x / 2) + 0.5 never overflows)
    return x * (np.tanh(x * 0.5) * 0.5 + 0.5)


def _hard_sigmoid(x: Any, alpha: float, beta: float) -> Any:
    return np.clip(x * alpha + beta, 0, 1)


def _alpha(op: str, attrs: Mapping[str, Any], default: float) -> float:
    return float(float_attr(op, attrs, "alpha", default))


def _celu_alpha(attrs: Mapping[str, Any]) -> float:
    alpha = _alpha("celu", attrs, 1.0)
    if alpha == 0:
        raise attr_error("celu", "alpha", alpha, "a non-zero number (celu divides by it)")
    return alpha


def _hs_params(attrs: Mapping[str, Any]) -> tuple[float, float]:
    return (_alpha("hard_sigmoid", attrs, HARD_SIGMOID_ALPHA),
            float(float_attr("hard_sigmoid", attrs, "beta", HARD_SIGMOID_BETA)))


def _selu_params(attrs: Mapping[str, Any]) -> tuple[float, float]:
    return (_alpha("selu", attrs, SELU_ALPHA),
            float(float_attr("selu", attrs, "gamma", SELU_GAMMA)))


def _hard_sigmoid_c(x: str, alpha: float, beta: float) -> str:
    """C clip of alpha * x + beta to [0, 1], NaN passing through as in np.clip."""
    v = f"({literal(alpha)} * {x} + {literal(beta)})"
    return f"({v} > ({{T}})1 ? ({{T}})1 : ({v} < ({{T}})0 ? ({{T}})0 : {v}))"


_SOFTPLUS_C = "(fmax({0}, ({T})0) + log1p(exp(-fabs({0}))))"


ACTIVATIONS: dict[str, ExprOp] = {
    "softplus": ExprOp(host_compute(lambda attrs, x: _softplus(x)), lambda attrs: _SOFTPLUS_C,
                       FLOAT_DTYPES),
    "softsign": ExprOp(host_compute(lambda attrs, x: x / (1 + np.abs(x))),
                       lambda attrs: "({0} / (({T})1 + fabs({0})))", FLOAT_DTYPES),
    # x * sigmoid(x) (SiLU, Swish with beta 1): one input, so it joins a conv's or dense's tail
    "silu": ExprOp(host_compute(lambda attrs, x: _silu(x)),
                   lambda attrs: "({0} * (({T})0.5 * tanh(({T})0.5 * {0}) + ({T})0.5))",
                   FLOAT_DTYPES),
    "hard_sigmoid": ExprOp(
        host_compute(lambda attrs, x: _hard_sigmoid(x, *_hs_params(attrs))),
        lambda attrs: _hard_sigmoid_c("{0}", *_hs_params(attrs)), FLOAT_DTYPES,
        ("alpha", "beta")),
    "hard_swish": ExprOp(
        host_compute(lambda attrs, x: x * _hard_sigmoid(x, 1 / 6, 0.5)),
        lambda attrs: f"({{0}} * {_hard_sigmoid_c('{0}', 1 / 6, 0.5)})", FLOAT_DTYPES),
    "elu": ExprOp(
        host_compute(lambda attrs, x: np.where(x < 0, _alpha("elu", attrs, 1.0) * np.expm1(x), x)),
        lambda attrs: f"({{0}} < 0 ? {literal(_alpha('elu', attrs, 1.0))} * expm1({{0}}) : {{0}})",
        FLOAT_DTYPES, ("alpha",)),
    "selu": ExprOp(
        host_compute(lambda attrs, x: _selu_params(attrs)[1] * np.where(
            x <= 0, _selu_params(attrs)[0] * np.expm1(x), x)),
        lambda attrs: (f"({literal(_selu_params(attrs)[1])} * ({{0}} <= 0 ? "
                       f"{literal(_selu_params(attrs)[0])} * expm1({{0}}) : {{0}}))"),
        FLOAT_DTYPES, ("alpha", "gamma")),
    # max(0, x) + min(0, alpha (exp(x / alpha) - 1)): the second term is <= 0 iff x <= 0.
    "celu": ExprOp(
        host_compute(lambda attrs, x: np.where(x > 0, x, _celu_alpha(attrs)
                                        * np.expm1(x / _celu_alpha(attrs)))),
        lambda attrs: (f"({{0}} > 0 ? {{0}} : {literal(_celu_alpha(attrs))} * "
                       f"expm1({{0}} / {literal(_celu_alpha(attrs))}))"),
        FLOAT_DTYPES, ("alpha",)),
    "mish": ExprOp(host_compute(lambda attrs, x: x * np.tanh(_softplus(x))),
                   lambda attrs: f"({{0}} * tanh({_SOFTPLUS_C}))", FLOAT_DTYPES),
    "thresholded_relu": ExprOp(
        host_compute(lambda attrs, x: np.where(x > _alpha("thresholded_relu", attrs, 1.0), x, 0)),
        lambda attrs: (f"({{0}} > {literal(_alpha('thresholded_relu', attrs, 1.0))} ? {{0}} "
                       ": ({T})0)"),
        FLOAT_DTYPES, ("alpha",)),
}

register_family(ACTIVATIONS, 1)

__all__ = ["ACTIVATIONS", "HARD_SIGMOID_ALPHA", "HARD_SIGMOID_BETA", "SELU_ALPHA", "SELU_GAMMA"]

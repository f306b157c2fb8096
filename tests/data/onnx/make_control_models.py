"""Rebuild the small control-flow ONNX models the frontend tests import (needs torch).

`loop_if_ts.onnx`: a torch.jit.script'ed module exported by the TorchScript exporter (opset
17): a Python `for` over a trip count given as an input (ONNX Loop, a hidden state carried, the
Linear's weights read from the outer graph) then an `if` on the data (ONNX If, both branches
reading outer values). `cond_dynamo.onnx`: torch.cond exported by the dynamo exporter (opset
18): an If whose branches call local functions. Seeded, so a rebuild gives the same weights.
CI never runs this: it imports the committed files.

Usage: python tests/data/onnx/make_control_models.py [--out DIR]
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
BATCH, FEATURES = 2, 8


class LoopIf(nn.Module):
    """h <- tanh(W h + b) + x, n times; then 2h + 1 if its sum is positive, else h - 1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(int(n)):
            h = torch.tanh(self.lin(h)) + x
        if bool(h.sum() > 0):
            y = h * 2.0 + 1.0
        else:
            y = h - 1.0
        return y


class Cond(nn.Module):
    """torch.cond on the sign of the input's sum: two different Linear heads."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Linear(FEATURES, FEATURES)
        self.neg = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def then(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.pos(x)) * 2.0

        def other(x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.neg(x)) - x

        return torch.cond(x.sum() > 0, then, other, (x,))


def export(out: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(BATCH, FEATURES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(LoopIf().eval())
        torch.onnx.export(scripted, (x, torch.tensor(3)), str(out / "loop_if_ts.onnx"),
                          opset_version=17, input_names=["x", "n"], output_names=["y"],
                          dynamo=False)
        torch.onnx.export(Cond().eval(), (x,), str(out / "cond_dynamo.onnx"), opset_version=18,
                          input_names=["x"], output_names=["y"], dynamo=True,
                          external_data=False)
    print("wrote loop_if_ts.onnx, cond_dynamo.onnx")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    export(parser.parse_args().out)

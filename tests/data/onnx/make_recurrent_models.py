"""Rebuild the small recurrent ONNX models the frontend tests import (needs torch).

PyTorch's nn.LSTM (2 layers, bidirectional, batch_first, with initial states) and nn.GRU (one
layer, forward), exported by the TorchScript exporter at opset 17 (`lstm_ts.onnx`,
`gru_ts.onnx`) and by the dynamo exporter at opset 18 (`lstm_dynamo.onnx`, `gru_dynamo.onnx`,
weights inside). Seeded, so a rebuild gives the same weights. CI never runs this: it imports the
committed files.

Usage: python tests/data/onnx/make_recurrent_models.py [--out DIR]
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
BATCH, SEQ, FEATURES, HIDDEN = 2, 7, 8, 16


class Lstm(nn.Module):
    """Two bidirectional LSTM layers over a batch-first sequence, states given."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple:
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


class Gru(nn.Module):
    """One forward GRU layer (PyTorch's GRU is ONNX's linear_before_reset=1)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(FEATURES, HIDDEN, batch_first=False)

    def forward(self, x: torch.Tensor) -> tuple:
        y, h = self.rnn(x)
        return y, h


def export(out: Path) -> None:
    torch.manual_seed(0)
    lstm = Lstm().eval()
    gru = Gru().eval()
    lstm_args = (torch.randn(BATCH, SEQ, FEATURES), torch.randn(4, BATCH, HIDDEN),
                 torch.randn(4, BATCH, HIDDEN))
    gru_args = (torch.randn(SEQ, BATCH, FEATURES),)
    models = [("lstm", lstm, lstm_args, ["x", "h0", "c0"], ["y", "h", "c"]),
              ("gru", gru, gru_args, ["x"], ["y", "h"])]
    for name, model, args, inputs, outputs in models:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, args, str(out / f"{name}_ts.onnx"), opset_version=17,
                              input_names=inputs, output_names=outputs, dynamo=False)
            torch.onnx.export(model, args, str(out / f"{name}_dynamo.onnx"), opset_version=18,
                              input_names=inputs, output_names=outputs, dynamo=True,
                              external_data=False)
        print("wrote", name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    export(parser.parse_args().out)

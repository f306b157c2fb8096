"""Export the small Hugging Face transformers bench/transformers.py measures (needs torch).

Tiny configurations with seeded random weights (no download), built by transformers' own model
code and exported by PyTorch's TorchScript exporter (opset 17) or its dynamo exporter (opset 18)
into a cache folder (never committed). Run it with a Python that has torch and transformers;
the bench itself needs only onnx and onnxruntime.

Usage: python bench/transformers_models.py [--out DIR] [--only vit bert_tiny ...]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# bench/transformers.py would shadow the transformers package when this runs as a script (or is
# imported by another bench/ export script): bench/ leaves the import path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_transformers"


class _Wrap(torch.nn.Module):
    """Calls a transformers model with keyword inputs and returns one tensor."""

    def __init__(self, model: torch.nn.Module, keys: list[str], output: str) -> None:
        super().__init__()
        self.model = model
        self.keys = keys
        self.output = output

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.keys, args)), return_dict=True)
        return out[self.output]


def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def _padding(batch: int, seq: int) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1:, seq * 3 // 4:] = 0  # the second sequence is padded
    return mask


def _bert(hidden: int, layers: int, heads: int, inner: int, batch: int, seq: int) -> Any:
    from transformers import BertConfig, BertModel
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=inner, vocab_size=1000 if hidden < 256 else 30522)
    model = BertModel(config)
    args = (_ids(batch, seq, config.vocab_size), _padding(batch, seq))
    return model, ["input_ids", "attention_mask"], args, "last_hidden_state"


def _distilbert() -> Any:
    from transformers import DistilBertConfig, DistilBertModel
    config = DistilBertConfig(dim=128, n_layers=2, n_heads=2, hidden_dim=512, vocab_size=1000)
    return (DistilBertModel(config), ["input_ids", "attention_mask"],
            (_ids(2, 32, 1000), _padding(2, 32)), "last_hidden_state")


def _vit() -> Any:
    from transformers import ViTConfig, ViTModel
    config = ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                       intermediate_size=768, image_size=224, patch_size=16)
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    return ViTModel(config, add_pooling_layer=False), ["pixel_values"], (pixels,), \
        "last_hidden_state"


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2Model
    config = GPT2Config(n_embd=128, n_layer=2, n_head=2, n_inner=512, vocab_size=1000,
                        n_positions=64)
    return GPT2Model(config), ["input_ids"], (_ids(2, 32, 1000),), "last_hidden_state"


def _whisper() -> Any:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    config = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=2,
                           encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=200)
    feats = torch.randn(1, 80, 400, generator=torch.Generator().manual_seed(3))
    return WhisperEncoder(config), ["input_features"], (feats,), "last_hidden_state"


# name -> (builder, exporter)
MODELS: dict[str, tuple[Callable[[], Any], str]] = {
    "vit_small": (_vit, "ts"),
    "bert_tiny": (lambda: _bert(128, 2, 2, 512, 2, 32), "ts"),
    "bert_tiny_dynamo": (lambda: _bert(128, 2, 2, 512, 2, 32), "dynamo"),
    "distilbert_tiny": (_distilbert, "ts"),
    "whisper_encoder_tiny": (_whisper, "ts"),
    "gpt2_tiny": (_gpt2, "dynamo"),
    "bert_base": (lambda: _bert(768, 12, 12, 3072, 1, 128), "ts"),
}


def export(name: str, out: Path) -> Path:
    torch.manual_seed(0)
    model, keys, args, output = MODELS[name][0]()
    model.eval()
    wrapped = _Wrap(model, keys, output).eval()
    path = out / f"{name}.onnx"
    onnx_export(wrapped, args, keys, path, MODELS[name][1])
    return path


def onnx_export(wrapped: Any, args: Any, keys: Any, path: Path, exporter: str) -> None:
    """wrapped's ONNX file at path by PyTorch's dynamo exporter (opset 18) or TorchScript's
    (opset 17), inputs named keys, the output y."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(wrapped, args, input_names=keys, output_names=["y"],
                                        dynamo=True, opset_version=18)
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(wrapped, args, str(path), input_names=keys, output_names=["y"],
                              opset_version=17, dynamo=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    for name in opts.only:
        print("wrote", export(name, opts.out))


if __name__ == "__main__":
    main()

"""Rebuild the small real-architecture ONNX models the frontend tests import (needs torch).

Five architectures written here in torch (torchvision is not usable with this torch) or built
by Hugging Face transformers from a tiny config with random weights (no download): a ResNet
(basic blocks, BatchNorm, residual adds), a MobileNetV2-style net (inverted residuals,
depthwise convs, ReLU6), a BERT encoder (int64 input ids and attention mask), a GPT-2 LM
(causal mask) and a small U-Net (ConvTranspose, Upsample, Concat). Each is exported with both
of PyTorch's exporters: TorchScript (`NAME_ts.onnx`, opset 17, weights inside) and dynamo
(`NAME_dynamo.onnx`, opset 18, weights in the external data file `NAME_dynamo.onnx.data`).
Seeded, so a rebuild gives the same files (the dynamo ones name this script's source lines in
their node metadata, so editing it changes those bytes, never the weights or the graph). CI never
runs this: it imports the committed files.

Usage: python tests/data/onnx/make_models.py [--out DIR] [--only resnet bert ...]
"""
from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
IMAGE = (1, 3, 32, 32)
SEQ = 16
VOCAB = 100


# ---- CNNs written here ----------------------------------------------------------------------

class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv+BN, a residual add (1x1 conv+BN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.down(x))


class ResNet(nn.Module):
    """A ResNet-18-shaped net, narrow: stem conv+BN+ReLU+MaxPool, 4 stages, avg pool, fc."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 48, 64), classes: int = 10,
                 blocks: int = 1, stem_kernel: int = 3) -> None:
        super().__init__()
        stride = 2 if stem_kernel == 7 else 1  # 7: ImageNet's stem (ResNet-18 is blocks=2)
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], stem_kernel, stride, stem_kernel // 2, bias=False),
            nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers = []
        cin = widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks):
                layers.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project; residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """A MobileNetV2-shaped net, narrow (`width` scales the channels, as MobileNet's alpha)."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 2, 2), (6, 96, 1, 1),
                (6, 160, 1, 2), (6, 320, 1, 1))  # (expand, channels, repeats, stride)

    def __init__(self, width: float = 0.25, classes: int = 10, last: int = 128,
                 settings: tuple[tuple[int, int, int, int], ...] = SETTINGS) -> None:
        super().__init__()
        cin = max(8, int(32 * width))
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin),
                                   nn.ReLU6()]
        for expand, channels, repeats, stride in settings:
            cout = max(8, int(channels * width))
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).mean((2, 3))
        return self.classifier(x)


class UNet(nn.Module):
    """A two-level U-Net: ConvTranspose up one level, Upsample (bilinear) the other, Concat skips."""

    def __init__(self, c: int = 8, classes: int = 3) -> None:
        super().__init__()

        def double(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout),
                                 nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())
        self.enc1 = double(3, c)
        self.enc2 = double(c, 2 * c)
        self.mid = double(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = double(4 * c, 2 * c)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec1 = double(3 * c, c)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(nn.functional.max_pool2d(e1, 2))
        m = self.mid(nn.functional.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


# ---- transformers from Hugging Face configs (random weights, no download) ---------------------

class Bert(nn.Module):
    """BertModel's two outputs from int64 input ids and an int64 attention mask."""

    def __init__(self, hidden: int = 32, layers: int = 2, heads: int = 2,
                 max_positions: int = 64) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel
        config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=2 * hidden,
                            max_position_embeddings=max_positions, attn_implementation="eager")
        self.bert = BertModel(config)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state, out.pooler_output


class Gpt2(nn.Module):
    """GPT2LMHeadModel's logits (causal self-attention), no key/value cache."""

    def __init__(self, positions: int = 64) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=positions,
                            use_cache=False, attn_implementation="eager")
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # NOTE: an explicit all-ones mask keeps transformers off its packed-sequence check
        # (torch.diff, which the TorchScript exporter cannot export); the mask stays causal.
        mask = torch.ones_like(input_ids)
        return self.gpt2(input_ids=input_ids, attention_mask=mask, use_cache=False,
                         return_dict=True).logits


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))


def _mask() -> torch.Tensor:
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[:, SEQ - 4:] = 0  # padding at the end, so the mask changes the result
    return mask


def _image() -> torch.Tensor:
    return torch.rand(IMAGE, generator=torch.Generator().manual_seed(1))


# name -> (model factory, example inputs, input names, output names)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]],
                        list[str], list[str]]] = {
    "resnet": (ResNet, lambda: (_image(),), ["data"], ["logits"]),
    "mobilenetv2": (MobileNetV2, lambda: (_image(),), ["data"], ["logits"]),
    "bert": (Bert, lambda: (_ids(), _mask()), ["input_ids", "attention_mask"],
             ["last_hidden_state", "pooler_output"]),
    "gpt2": (Gpt2, lambda: (_ids(),), ["input_ids"], ["logits"]),
    "unet": (UNet, lambda: (_image(),), ["data"], ["mask"]),
}


def build(name: str, **config: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The seeded model in eval mode, with BatchNorm statistics that are not the identity."""
    factory, example, _, _ = MODELS[name]
    torch.manual_seed(0)
    model = factory(**config).eval()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            with torch.no_grad():
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model, example()


def export(model: nn.Module, args: tuple[torch.Tensor, ...], path: Path, input_names: list[str],
           output_names: list[str], dynamo: bool,
           dynamic_axes: dict[str, dict[int, str]] | None = None) -> None:
    """One export; dynamo=True writes the weights to PATH.data beside the model."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, args, dynamo=True, opset_version=18,
                                        input_names=input_names, output_names=output_names,
                                        optimize=True, verbose=False)
            program.save(str(path), external_data=True)
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17,
                              input_names=input_names, output_names=output_names,
                              do_constant_folding=True, dynamic_axes=dynamic_axes)


def export_all(out: Path, names: list[str]) -> list[Path]:
    """Export every named model with both exporters into out; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        _, _, input_names, output_names = MODELS[name]
        model, args = build(name)
        for suffix, dynamo in (("ts", False), ("dynamo", True)):
            path = out / f"{name}_{suffix}.onnx"
            export(model, args, path, input_names, output_names, dynamo)
            written += [p for p in (path, Path(f"{path}.data")) if p.exists()]
    return written


# Transformers exported once with named batch and sequence dimensions (TorchScript exporter,
# 128 positions): the symbolic-shape tests import them without --shape and run any token count.
DYNAMIC = {"bert": {"max_positions": 128}, "gpt2": {"positions": 128}}


def export_dynamic(out: Path, names: list[str]) -> list[Path]:
    """NAME_dyn.onnx for each transformer in names: inputs [batch, seq], outputs likewise."""
    written = []
    for name in names:
        if name not in DYNAMIC:
            continue
        _, _, input_names, output_names = MODELS[name]
        model, args = build(name, **DYNAMIC[name])
        axes = {n: {0: "batch", 1: "seq"} for n in input_names}
        axes.update({n: {0: "batch"} if n == "pooler_output" else {0: "batch", 1: "seq"}
                     for n in output_names})
        path = out / f"{name}_dyn.onnx"
        export(model, args, path, input_names, output_names, False, dynamic_axes=axes)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    args = parser.parse_args()
    for path in export_all(args.out, args.only) + export_dynamic(args.out, args.only):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()

"""Export the Hugging Face convolutional nets bench/onednn_models.py measures (needs torch).

Full-size configurations (transformers' defaults, which are the published architectures) with
seeded random weights, no download: ResNet-50, ResNet-18, MobileNetV2 (1.0, 224), ConvNeXt-tiny
and SegFormer-b0 with its segmentation head. Each is built by transformers' own model code and
exported by PyTorch's TorchScript exporter (opset 17) with a named batch dimension into a cache
folder (never committed: ResNet-50 is 100 MB). Run it with a Python that has torch and
transformers; the bench needs only onnx and onnxruntime.

Usage: python bench/convnet_models.py [--out DIR] [--only resnet50 mobilenetv2 ...]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

# bench/transformers.py would shadow the transformers package for a script run from bench/.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_convnets"


class _Logits(torch.nn.Module):
    """Calls a transformers vision model on pixel values and returns its logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels, return_dict=True).logits


def _resnet(depths: list[int], widths: list[int], layer_type: str) -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(depths=depths, hidden_sizes=widths,
                                                     layer_type=layer_type, num_labels=1000))


def _mobilenetv2() -> torch.nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    return MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1000))


def _convnext() -> torch.nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification
    return ConvNextForImageClassification(ConvNextConfig(num_labels=1000))


def _segformer() -> torch.nn.Module:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    return SegformerForSemanticSegmentation(SegformerConfig(num_labels=150))


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "resnet50": lambda: _resnet([3, 4, 6, 3], [256, 512, 1024, 2048], "bottleneck"),
    "resnet18": lambda: _resnet([2, 2, 2, 2], [64, 128, 256, 512], "basic"),
    "mobilenetv2": _mobilenetv2,
    "convnext_tiny": _convnext,
    "segformer_b0": _segformer,
}
IMAGE = {"segformer_b0": (1, 3, 512, 512)}  # the others take ImageNet's 224x224


def _randomise_batchnorm(model: torch.nn.Module) -> None:
    """BatchNorm statistics that are not the identity, so folding them is exercised."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            with torch.no_grad():
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)


def export(name: str, out: Path) -> Path:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    _randomise_batchnorm(model)
    pixels = torch.rand(IMAGE.get(name, (1, 3, 224, 224)),
                        generator=torch.Generator().manual_seed(1))
    path = out / f"{name}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Logits(model).eval(), (pixels,), str(path), dynamo=False,
                          opset_version=17, input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--only", nargs="*", choices=list(MODELS), default=list(MODELS))
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    for name in opts.only:
        path = export(name, opts.out)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()

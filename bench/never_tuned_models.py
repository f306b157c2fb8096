"""Export bench/never_tuned.py's models from transformers' own model code (needs torch).

Architectures no other bench uses and nothing in graph_runtime was tuned for: decoder LLMs with
RMSNorm, rotary embeddings, grouped-query attention and SiLU-gated MLPs (LLaMA, Qwen2, Mistral,
Phi-3), a T5 encoder (relative position bias), ALBERT, ELECTRA, DeiT, CLIP's vision tower,
Swin, RegNet, ConvNeXt-v2, MobileViT and wav2vec2; then decoders with other attention (Bloom
with ALiBi biases, GPT-NeoX with partial rotary and parallel blocks, OPT), EfficientNet
(depthwise + squeeze-excite with SiLU) and DeBERTa-v2 (disentangled relative attention). Small
configurations with seeded random weights built from their configs (no download), static
shapes, each exported by PyTorch's TorchScript exporter (opset 17) and its dynamo exporter
(opset 18) where that works, into a cache folder (never committed). A failed export is printed
and skipped.

Usage: python bench/never_tuned_models.py [--out DIR] [--only llama qwen2 ...]
                                          [--exporters ts dynamo]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
# bench/: imports torch only, and takes bench/ off the import path (bench/transformers.py would
# shadow the transformers package)
from transformers_models import _ids, _Wrap, onnx_export

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_never_tuned"
SEQ = 128


def _pixels(size: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(2))


def _decoder(kind: str) -> Any:
    """A decoder LLM at hidden 512, 2 layers, 8 query heads over 2 K/V heads, seq 128."""
    import transformers as tf
    common = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=2000,
                  max_position_embeddings=512, use_cache=False, pad_token_id=0)
    config_class, model_class = {
        "llama": (tf.LlamaConfig, tf.LlamaModel), "qwen2": (tf.Qwen2Config, tf.Qwen2Model),
        "mistral": (tf.MistralConfig, tf.MistralModel), "phi3": (tf.Phi3Config, tf.Phi3Model),
    }[kind]
    config = config_class(**common)
    if kind == "mistral":
        config.sliding_window = None
    # an explicit mask of ones: without one, transformers looks for packed sequences with
    # torch.diff, which the TorchScript exporter cannot export
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    return (model_class(config), ["input_ids", "attention_mask"], (_ids(1, SEQ, 2000), mask),
            "last_hidden_state")


def _t5() -> Any:
    from transformers import T5Config, T5EncoderModel
    config = T5Config(d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8,
                      vocab_size=2000, feed_forward_proj="gated-gelu", use_cache=False)
    return T5EncoderModel(config), ["input_ids"], (_ids(1, SEQ, 2000),), "last_hidden_state"


def _albert() -> Any:
    from transformers import AlbertConfig, AlbertModel
    config = AlbertConfig(embedding_size=128, hidden_size=256, num_hidden_layers=4,
                          num_attention_heads=4, intermediate_size=1024, vocab_size=2000)
    return (AlbertModel(config, add_pooling_layer=False), ["input_ids"],
            (_ids(1, SEQ, 2000),), "last_hidden_state")


def _electra() -> Any:
    from transformers import ElectraConfig, ElectraModel
    config = ElectraConfig(embedding_size=128, hidden_size=256, num_hidden_layers=4,
                           num_attention_heads=4, intermediate_size=1024, vocab_size=2000)
    return ElectraModel(config), ["input_ids"], (_ids(1, SEQ, 2000),), "last_hidden_state"


def _deit() -> Any:
    from transformers import DeiTConfig, DeiTModel
    config = DeiTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                        intermediate_size=768, image_size=224, patch_size=16)
    return (DeiTModel(config, add_pooling_layer=False), ["pixel_values"], (_pixels(224),),
            "last_hidden_state")


def _clip() -> Any:
    from transformers import CLIPVisionConfig, CLIPVisionModel
    config = CLIPVisionConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=4, image_size=224, patch_size=16)
    return CLIPVisionModel(config), ["pixel_values"], (_pixels(224),), "last_hidden_state"


def _swin() -> Any:
    from transformers import SwinConfig, SwinModel
    config = SwinConfig(image_size=224, embed_dim=48, depths=[2, 2, 2, 2],
                        num_heads=[2, 4, 8, 16], window_size=7)
    return (SwinModel(config, add_pooling_layer=False), ["pixel_values"], (_pixels(224),),
            "last_hidden_state")


def _regnet() -> Any:
    from transformers import RegNetConfig, RegNetModel
    config = RegNetConfig(embedding_size=32, hidden_sizes=[48, 104, 208, 440],
                          depths=[1, 3, 6, 6], groups_width=8, layer_type="y")
    return RegNetModel(config), ["pixel_values"], (_pixels(224),), "last_hidden_state"


def _convnextv2() -> Any:
    from transformers import ConvNextV2Config, ConvNextV2Model
    config = ConvNextV2Config(hidden_sizes=[40, 80, 160, 320], depths=[2, 2, 6, 2])
    return ConvNextV2Model(config), ["pixel_values"], (_pixels(224),), "last_hidden_state"


def _mobilevit() -> Any:
    from transformers import MobileViTConfig, MobileViTModel
    config = MobileViTConfig(image_size=256, hidden_sizes=[64, 80, 96],
                             neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320])
    model = MobileViTModel(config, expand_output=True)
    return _he_initialised(model), ["pixel_values"], (_pixels(256),), "last_hidden_state"


def _he_initialised(model: Any) -> Any:
    """model with He-initialised convs and linears and unit batch-norm scales: MobileViT's and
    EfficientNet's own initializers (normal, std 0.02, batch-norm scales too) shrink the
    activations to denormals or zeros by the last stage, which would make any output match."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            torch.nn.init.ones_(module.weight)
            torch.nn.init.zeros_(module.bias)
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight)
        elif isinstance(module, torch.nn.Linear):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
    return model


def _wav2vec2() -> Any:
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    config = Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                            intermediate_size=1024, conv_dim=(128,) * 7,
                            num_conv_pos_embeddings=64, num_conv_pos_embedding_groups=16,
                            do_stable_layer_norm=False, feat_extract_norm="group",
                            apply_spec_augment=False)
    audio = torch.randn(1, 16000, generator=torch.Generator().manual_seed(3))
    return Wav2Vec2Model(config), ["input_values"], (audio,), "last_hidden_state"


def _causal_lm(kind: str) -> Any:
    """A decoder with another attention or block: Bloom (ALiBi biases, GELU MLP), GPT-NeoX
    (rotary on a quarter of each head, attention and MLP in parallel), OPT (learned positions,
    ReLU MLP); hidden 512, 2 layers, 8 heads. (Falcon with ALiBi is not here: both exporters
    write its slopes through a complex Mul, which ONNX Runtime refuses to load.)"""
    import transformers as tf
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    config = {
        "bloom": lambda: tf.BloomConfig(hidden_size=512, n_layer=2, n_head=8, vocab_size=2000),
        "gpt_neox": lambda: tf.GPTNeoXConfig(hidden_size=512, num_hidden_layers=2,
                                             num_attention_heads=8, intermediate_size=2048,
                                             vocab_size=2000, rotary_pct=0.25,
                                             max_position_embeddings=512),
        "opt": lambda: tf.OPTConfig(hidden_size=512, num_hidden_layers=2, ffn_dim=2048,
                                    num_attention_heads=8, vocab_size=2000,
                                    word_embed_proj_dim=512, max_position_embeddings=512),
    }[kind]()
    config.use_cache = False
    model_class = {"bloom": tf.BloomModel, "gpt_neox": tf.GPTNeoXModel,
                   "opt": tf.OPTModel}[kind]
    return (model_class(config), ["input_ids", "attention_mask"], (_ids(1, SEQ, 2000), mask),
            "last_hidden_state")


def _efficientnet() -> Any:
    from transformers import EfficientNetConfig, EfficientNetModel
    config = EfficientNetConfig(image_size=224, width_coefficient=1.0, depth_coefficient=1.0,
                                hidden_dim=1280)  # B0
    return (_he_initialised(EfficientNetModel(config)), ["pixel_values"], (_pixels(224),),
            "last_hidden_state")


def _deberta() -> Any:
    from transformers import DebertaV2Config, DebertaV2Model
    config = DebertaV2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                             intermediate_size=1024, vocab_size=2000, relative_attention=True,
                             position_buckets=64, pos_att_type=["p2c", "c2p"])
    return DebertaV2Model(config), ["input_ids"], (_ids(1, SEQ, 2000),), "last_hidden_state"


MODELS: dict[str, Callable[[], Any]] = {
    "llama": lambda: _decoder("llama"), "qwen2": lambda: _decoder("qwen2"),
    "mistral": lambda: _decoder("mistral"), "phi3": lambda: _decoder("phi3"),
    "t5_encoder": _t5, "albert": _albert, "electra": _electra, "deit": _deit,
    "clip_vision": _clip, "swin": _swin, "regnet": _regnet, "convnextv2": _convnextv2,
    "mobilevit": _mobilevit, "wav2vec2": _wav2vec2,
    "bloom": lambda: _causal_lm("bloom"), "gpt_neox": lambda: _causal_lm("gpt_neox"),
    "opt": lambda: _causal_lm("opt"),
    "efficientnet": _efficientnet, "deberta_v2": _deberta,
}
EXPORTERS = ("ts", "dynamo")


def export(name: str, exporter: str, out: Path) -> Path:
    torch.manual_seed(0)
    model, keys, args, output = MODELS[name]()
    model.eval()
    wrapped = _Wrap(model, keys, output).eval()
    path = out / f"{name}_{exporter}.onnx"
    onnx_export(wrapped, args, keys, path, exporter)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--exporters", nargs="*", default=list(EXPORTERS))
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    for name in opts.only:
        for exporter in opts.exporters:
            try:
                print("wrote", export(name, exporter, opts.out), flush=True)
            except Exception as exc:  # an exporter's failure skips that one model, not the rest
                print(f"skipped {name} ({exporter}): {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)


if __name__ == "__main__":
    main()

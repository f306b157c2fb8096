"""Export the dynamic-shape models bench/stream.py and bench/generate.py measure (needs torch).

Hugging Face transformers' own model code, small configurations with seeded random weights (no
download), exported with dynamic axes by PyTorch's TorchScript exporter (`_ts`, opset 17) and
its dynamo exporter (`_dynamo`, opset 18) into a cache folder (never committed):

- `llama_ts`, `llama_dynamo`: a LLaMA-style decoder (hidden 512, 4 layers, 8 query heads over 2
  key/value heads, RMSNorm, rotary, SiLU-gated MLP); inputs input_ids and attention_mask
  (batch, seq); output logits.
- `llama_kv_ts`: the same decoder for generation with a KV cache, as Hugging Face Optimum
  exports it: input_ids (batch, seq), attention_mask (batch, past+seq), position_ids (batch,
  seq), past_key_values.<i>.key/value (batch, 2, past, 64); outputs logits and
  present.<i>.key/value (batch, 2, past+seq, 64).
- `qwen2_kv_ts`, `phi3_kv_ts`: Qwen2 (q/k/v biases) and Phi-3 (one packed qkv_proj and
  gate_up_proj) at the same sizes, exported the same way: bench/generate.py --model on them.
- `cnn_hw_ts`: a small CNN (stride-2 convs, pads, pooling) with dynamic batch, height and width.
- `wav2vec2_ts`: wav2vec2's conv feature encoder and transformer (hidden 256, 2 layers) on
  dynamic batch and audio length.

Run it with a Python that has torch and transformers; the benches need only onnx and
onnxruntime. `--tiny` writes the tests' copies (hidden 64, 2 layers: `llama_tiny_ts.onnx`...)
into tests/data/onnx, where they are committed; CI never runs this script.
Usage: python bench/dynamic_models.py [--out DIR] [--only llama_ts ...] [--tiny] [--opset 13]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bench/transformers.py would shadow the transformers package for a script run from bench/.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_dynamic"
TESTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "onnx"
# (hidden, intermediate, layers, query heads, key/value heads, vocab) of the LLaMA decoder
SIZES = {"bench": (512, 1376, 4, 8, 2, 2000), "tiny": (64, 96, 2, 4, 2, 100)}
SIZE = SIZES["bench"]
TS_OPSET = 17  # --opset: the TorchScript exporter's opset (13 and up)


def _decoder(arch: str = "Llama") -> Any:
    """transformers' <arch>ForCausalLM at SIZE (Llama, Qwen2: q/k/v biases, Phi3: one packed
    qkv_proj and gate_up_proj)."""
    import transformers
    hidden, inner, layers, heads, kv_heads, vocab = SIZE
    config = getattr(transformers, f"{arch}Config")(
        hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=1024, attn_implementation="eager",
        # Phi-3's default pad id (32000) is past this vocabulary; the others keep theirs
        **({"pad_token_id": 0} if arch == "Phi3" else {}))
    return getattr(transformers, f"{arch}ForCausalLM")(config).eval()


def _llama() -> Any:
    return _decoder("Llama")


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False).logits


class _WithCache(torch.nn.Module):
    """Optimum's calling convention: the cache as flat key/value tensors in and out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        for i in range(SIZE[2]):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        flat: list[torch.Tensor] = []
        for i in range(SIZE[2]):
            layer = out.past_key_values.layers[i]
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, SIZE[5], (batch, seq), generator=torch.Generator().manual_seed(1))


def _export(module: torch.nn.Module, args: tuple, path: Path, names: list[str],
            outputs: list[str], axes: dict[str, dict[int, str]], dynamo: bool) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {name: {a: torch.export.Dim.AUTO for a in ax} for name, ax in axes.items()
                    if name in names}
            program = torch.onnx.export(module, args, input_names=names, output_names=outputs,
                                        dynamic_shapes=tuple(dims.get(n) for n in names),
                                        dynamo=True, opset_version=18)
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs,
                              dynamic_axes=axes, opset_version=TS_OPSET, dynamo=False)


def llama(path: Path, dynamo: bool) -> None:
    model = _Logits(_llama())
    args = (_ids(2, 16), torch.ones(2, 16, dtype=torch.int64))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"}}
    _export(model, args, path, ["input_ids", "attention_mask"], ["logits"], axes, dynamo)


def llama_kv(path: Path, dynamo: bool, arch: str = "Llama") -> None:
    model = _WithCache(_decoder(arch))
    batch, past, seq = 1, 7, 3
    names = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    past_kv = []
    hidden, _, layers, heads, kv_heads, _ = SIZE
    for i in range(layers):
        for kind in ("key", "value"):
            names.append(f"past_key_values.{i}.{kind}")
            outputs.append(f"present.{i}.{kind}")
            axes[names[-1]] = {0: "batch", 2: "past"}
            axes[outputs[-1]] = {0: "batch", 2: "total"}
            past_kv.append(torch.randn(batch, kv_heads, past, hidden // heads))
    args = (_ids(batch, seq), torch.ones(batch, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq).unsqueeze(0), *past_kv)
    _export(model, args, path, names, outputs, axes, dynamo)


class _Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=2, padding=1),
            torch.nn.Conv2d(32, 64, 5, stride=2), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


def cnn_hw(path: Path, dynamo: bool) -> None:
    axes = {"x": {0: "batch", 2: "height", 3: "width"}, "y": {0: "batch"}}
    _export(_Cnn().eval(), (torch.randn(1, 3, 64, 48),), path, ["x"], ["y"], axes, dynamo)


def wav2vec2(path: Path, dynamo: bool) -> None:
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    width, hidden = (16, 32) if SIZE == SIZES["tiny"] else (128, 256)
    config = Wav2Vec2Config(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=4 * hidden, conv_dim=(width,) * 7,
                            num_conv_pos_embeddings=16, attn_implementation="eager")

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Wav2Vec2Model(config).eval()

        def forward(self, audio: torch.Tensor) -> torch.Tensor:
            return self.model(audio).last_hidden_state

    axes = {"audio": {0: "batch", 1: "samples"}, "y": {0: "batch", 1: "frames"}}
    _export(Hidden().eval(), (torch.randn(1, 16000),), path, ["audio"], ["y"], axes, dynamo)


# Architectures whose dynamo exports the probe import refused (issue 32), tiny: import once.
ARCHS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_key_value_heads": 2, "pad_token_id": 0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_head": 4, "n_layer": 2}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"new_decoder_architecture": False}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 128, "word_embed_proj_dim": 64}),
    "t5_encoder": ("T5Config", "T5EncoderModel", {"d_model": 64, "d_kv": 16, "d_ff": 128,
                                                  "num_layers": 2, "num_heads": 4}),
    "albert": ("AlbertConfig", "AlbertModel", {"embedding_size": 32}),
    "roberta": ("RobertaConfig", "RobertaModel", {}),
    "mpnet": ("MPNetConfig", "MPNetModel", {}),
    "clip_text": ("CLIPTextConfig", "CLIPTextModel", {}),
}


def arch(name: str) -> Callable[[Path, bool], None]:
    """Export ARCHS[name] (hidden 64, 2 layers, 4 heads, vocab 1000) with dynamic batch and seq;
    inputs input_ids and attention_mask, output the first output (logits or hidden states)."""
    def build(path: Path, dynamo: bool) -> None:
        import transformers
        config_name, model_name, extra = ARCHS[name]
        config = getattr(transformers, config_name)(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=1000, max_position_embeddings=512, attn_implementation="eager",
            **extra)
        model = getattr(transformers, model_name)(config).eval()

        class First(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                        ) -> torch.Tensor:
                return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]

        ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
        mask = torch.ones(2, 16, dtype=torch.int64)
        axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                "y": {0: "batch", 1: "seq"}}
        _export(First().eval(), (ids, mask), path, ["input_ids", "attention_mask"], ["y"],
                axes, dynamo)
    return build


MODELS: dict[str, tuple[Callable[[Path, bool], None], bool]] = {
    **{f"{a}_{kind}": (arch(a), kind == "dynamo") for a in ARCHS for kind in ("dynamo", "ts")},
    "llama_ts": (llama, False),
    "llama_dynamo": (llama, True),
    "llama_kv_ts": (llama_kv, False),
    # architectures no fusion was written for, in the same calling convention
    "qwen2_kv_ts": (lambda path, dynamo: llama_kv(path, dynamo, "Qwen2"), False),
    "phi3_kv_ts": (lambda path, dynamo: llama_kv(path, dynamo, "Phi3"), False),
    "cnn_hw_ts": (cnn_hw, False),
    "cnn_hw_dynamo": (cnn_hw, True),
    "wav2vec2_ts": (wav2vec2, False),
    "wav2vec2_dynamo": (wav2vec2, True),
}


def export(name: str, out: Path, tiny: bool = False) -> Path:
    torch.manual_seed(0)
    stem = name.replace("_", "_tiny_", 1) if tiny else name
    if TS_OPSET != 17 and not MODELS[name][1]:
        stem += f"_op{TS_OPSET}"
    path = out / f"{stem}.onnx"
    build, dynamo = MODELS[name]
    build(path, dynamo)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' sizes (hidden 64, 2 layers), named NAME_tiny_..., "
                             "written to tests/data/onnx unless --out is given")
    parser.add_argument("--opset", type=int, default=17,
                        help="the TorchScript exporter's opset (13-17); names get _opN")
    opts = parser.parse_args()
    global SIZE, TS_OPSET
    SIZE = SIZES["tiny" if opts.tiny else "bench"]
    TS_OPSET = opts.opset
    out = opts.out or (TESTS if opts.tiny else CACHE)
    out.mkdir(parents=True, exist_ok=True)
    for name in opts.only:
        try:
            print("wrote", export(name, out, opts.tiny), flush=True)
        except Exception as e:  # one failing exporter must not stop the others
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()

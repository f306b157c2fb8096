"""Text generation with a KV cache: a greedy loop where every step is a new sequence length.

The decoder (default: llama_kv_ts from bench/dynamic_models.py; qwen2_kv_ts and phi3_kv_ts
there are architectures no fusion was written for; Hugging Face Optimum's convention:
input_ids, attention_mask, position_ids, past_key_values.<i>.key/value in; logits and
present.<i>.key/value out) is imported once without --shape. A prompt of 32 tokens is
prefilled, then 128 new tokens are generated greedily, each step feeding the previous step's
present tensors back as the past: the past length grows by one every step, so every step runs a
shape not seen before. graph_runtime and ONNX Runtime (default session options, and one thread:
bench/peers.py) each run the whole generation in turn with a pause between them, over several
rounds (a fresh module per round), then the same generation again on the same module or session
(a server's next request: every length met before) and a third time (its steady state: a
generation's first repeat still meets the views it made before the shared input and output
bytes last grew); the tokens must agree. Prints the per-token
latency (median over the decode steps, and the mean, which the steps that derive a new
size class or compile raise) of both and the prefill time, and the ratio paired by round (each
round's ratio, then their median); writes bench/results/generate.json.
Usage: python bench/generate.py [--model PATH] [--new 128] [--prompt 32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from import_once import import_timed  # noqa: E402  (bench/)
from interleave import settle, round_ratios  # noqa: E402  (bench/)
from peers import DEFAULT, machine_line, onnxruntime_sessions  # noqa: E402  (bench/)

DEFAULT_MODEL = Path.home() / ".cache" / "graph_runtime" / "bench_dynamic" / "llama_kv_ts.onnx"

Step = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def past_names(input_names: list[str]) -> list[str]:
    return [n for n in input_names if n.startswith("past_key_values.")]


def generate(step: Step, names: list[str], kv_shape: tuple[int, int], prompt: np.ndarray,
             new: int) -> tuple[list[int], list[float], float]:
    """(tokens, seconds per decode step, prefill seconds) of a greedy generation."""
    pasts = past_names(names)
    heads, dim = kv_shape
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
             "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]}
    feeds.update({n: np.zeros((1, heads, 0, dim), np.float32) for n in pasts})
    tokens: list[int] = []
    times: list[float] = []
    prefill = 0.0
    for k in range(new):
        t = time.perf_counter()
        outs = step(feeds)
        elapsed = time.perf_counter() - t
        if k == 0:
            prefill = elapsed
        else:
            times.append(elapsed)
        token = int(np.argmax(outs[0][0, -1]))
        tokens.append(token)
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {"input_ids": np.array([[token]], np.int64),
                 "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.array([[total - 1]], np.int64)}
        feeds.update(dict(zip(pasts, outs[1:])))
    return tokens, times, prefill


def ours_step(module: Any) -> Step:
    """A step as ONNX Runtime's session.run(None, feeds) is one: run_with sets the inputs, runs
    and returns every output as a host array of its own."""
    return lambda feeds: module.run_with(**feeds)


def _paired(times: dict[str, list[float]], peers: list[str]) -> tuple[float, list[float]]:
    """The median over rounds of ours' time in a round over the faster peer's in the same
    round, and each round's ratio (interleave.round_ratios, one value a round)."""
    rounds = round_ratios(times, "graph_runtime", peers, 1)
    return statistics.median(rounds), rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        default=ROOT / "bench" / "results" / "generate.json")
    opts = parser.parse_args()
    result = import_timed(opts.model)
    sessions = onnxruntime_sessions(opts.model)
    names = [i.name for i in sessions[DEFAULT].get_inputs()]
    kv = next(i for i in sessions[DEFAULT].get_inputs() if i.name in past_names(names))
    kv_shape = (int(kv.shape[1]), int(kv.shape[3]))
    # token ids the model's vocabulary holds (the logits' last dim): the tests' tiny decoder
    # has 100, the bench's 2000
    vocab = sessions[DEFAULT].get_outputs()[0].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 2000
    prompt = np.random.default_rng(0).integers(0, vocab, (1, opts.prompt)).astype(np.int64)
    lib = result.module()

    per_token: dict[str, list[float]] = {"graph_runtime": [], **{k: [] for k in sessions}}
    mean_token: dict[str, list[float]] = {k: [] for k in per_token}  # spikes count here
    prefill: dict[str, list[float]] = {k: [] for k in per_token}
    again: dict[str, list[float]] = {k: [] for k in per_token}
    steady: dict[str, list[float]] = {k: [] for k in per_token}
    tokens: dict[str, list[int]] = {}
    for _ in range(opts.rounds):
        for name in per_token:
            settle()
            if name == "graph_runtime":
                module = gr.create(result.graph_json, lib)
                module.load_params(result.params)
                step = ours_step(module)
            else:
                session = sessions[name]
                step = (lambda s: lambda feeds: s.run(None, feeds))(session)
            got, times, first = generate(step, names, kv_shape, prompt, opts.new)
            tokens.setdefault(name, got)
            per_token[name].append(statistics.median(times))
            mean_token[name].append(statistics.mean(times))
            prefill[name].append(first)
            # a server's next request of the same lengths, on the same module or session, then
            # once more: its steady state (every length met twice before)
            for label, repeated in (("again", again), ("steady", steady)):
                settle()
                got, times, _ = generate(step, names, kv_shape, prompt, opts.new)
                tokens.setdefault(f"{name} {label}", got)
                repeated[name].append(statistics.median(times))
            del step  # a round's module: its garbage collected by the next settle()
            if name == "graph_runtime":
                del module
    same = all(t == tokens[DEFAULT] for t in tokens.values())
    print(f"\ngreedy generation of {opts.new} tokens after a {opts.prompt}-token prompt, "
          f"{opts.rounds} rounds; tokens agree with ONNX Runtime: {same}")
    for name in per_token:
        print(f"  {name:24s} per token {statistics.median(per_token[name]) * 1e3:7.2f} ms "
              f"(mean {statistics.median(mean_token[name]) * 1e3:.2f})   "
              f"prefill {statistics.median(prefill[name]) * 1e3:7.1f} ms   again "
              f"{statistics.median(again[name]) * 1e3:7.2f}, steady "
              f"{statistics.median(steady[name]) * 1e3:.2f} ms a token   (rounds: "
              + ", ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}/{c * 1e3:.2f}" for a, b, c in zip(
                  per_token[name], again[name], steady[name])) + ")")
    ratio, rounds_ratio = _paired(per_token, list(sessions))
    again_ratio, rounds_again = _paired(again, list(sessions))
    mean_ratio, _ = _paired(mean_token, list(sessions))
    steady_ratio, rounds_steady = _paired(steady, list(sessions))
    print(f"  per-token ratio to ONNX Runtime's faster setting (median over rounds of each "
          f"round's ratio): {ratio:.2f}x (a fresh module; rounds "
          + ", ".join(f"{r:.2f}" for r in rounds_ratio) + f"), mean token {mean_ratio:.2f}x; "
          f"{again_ratio:.2f}x generating again (every length met before; rounds "
          + ", ".join(f"{r:.2f}" for r in rounds_again) + f"), {steady_ratio:.2f}x the third "
          "time (a server's steady state; rounds "
          + ", ".join(f"{r:.2f}" for r in rounds_steady) + ")")
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({
        "machine": machine_line(), "load": os.getloadavg()[0], "model": opts.model.name,
        "per_token_s": per_token, "mean_token_s": mean_token, "prefill_s": prefill,
        "ratio": ratio, "ratio_rounds": rounds_ratio, "mean_token_ratio": mean_ratio,
        "again_per_token_s": again, "again_ratio": again_ratio,
        "steady_per_token_s": steady, "steady_ratio": steady_ratio,
        "tokens_agree": same}, indent=1))
    print(f"wrote {opts.json}")
    if not same:
        sys.exit("the generated tokens differ from ONNX Runtime's")


if __name__ == "__main__":
    main()

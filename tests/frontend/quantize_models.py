"""Random feeds for a model's inputs and ONNX Runtime's own quantization of a float32 model,
shared by the quantized-model tests and bench/int8_models.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np

MODES = ("dynamic", "static_qdq")


def feeds_for(path: Path, seed: int, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input: token ids (a 0/1 mask for a 'mask' input) for int64,
    standard normal float32 else; a symbolic dimension is `batch`."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in info.shape]
        if info.type == "tensor(int64)":
            high = 2 if "mask" in info.name else 100
            feeds[info.name] = rng.integers(1 if high == 2 else 0, high, shape)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def quantized(source: Path, mode: str, folder: Path, batch: int = 1) -> Path:
    """source quantized by ONNX Runtime into folder (kept when already there): quantize_dynamic
    (int8 weights) or quantize_static (QDQ, per channel, calibrated on 4 seeded feeds)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    out = Path(folder) / f"{source.stem}_{mode}.onnx"
    if out.exists():
        return out
    if mode == "dynamic":
        quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8)
        return out
    if mode != "static_qdq":
        raise ValueError(f"mode {mode!r}; expected one of {MODES}")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([feeds_for(source, seed, batch) for seed in range(4)])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.batches, None)

    quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True)
    return out

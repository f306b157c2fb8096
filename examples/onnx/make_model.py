"""Write examples/onnx/cnn.onnx: a small image classifier built with onnx.helper (no torch).

Conv 3x3 + BatchNormalization + Relu, MaxPool 2x2, Conv 3x3 + Relu, GlobalAveragePool,
Flatten, Gemm, Softmax on a 1x3x32x32 input named `data`; output `prob` (1x10). Seeded weights,
so the file is the same on every run. Usage: python examples/onnx/make_model.py [-o PATH]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def cnn_model() -> onnx.ModelProto:
    """The classifier, opset 17."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int, scale: float = 0.2) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    def positive(name: str, n: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.random(n) + 0.5).astype(np.float32), name)

    inits = [weight("conv1_w", 16, 3, 3, 3), weight("conv1_b", 16), positive("bn_scale", 16),
             weight("bn_bias", 16), weight("bn_mean", 16), positive("bn_var", 16),
             weight("conv2_w", 32, 16, 3, 3, scale=0.1), weight("conv2_b", 32),
             weight("fc_w", 10, 32), weight("fc_b", 10)]
    nodes = [
        helper.make_node("Conv", ["data", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                         ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="graph_runtime examples/onnx/make_model.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=HERE / "cnn.onnx")
    args = parser.parse_args()
    onnx.save(cnn_model(), str(args.output))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds the upsampling heads of the transposed-convolution measurements in docs/perf
(session 45) as ONNX files: `ct.onnx`, a 1x1 conv then ConvTranspose(64, 64, 2, stride 2) on
a [1, 64, 80, 80] input, with onnx.helper; `dbhead.onnx`, a DBNet-style binarization head
(Conv(256, 64, 3) BN ReLU ConvTranspose(64, 64, 2, 2) BN ReLU ConvTranspose(64, 1, 2, 2)
Sigmoid) with random batch-norm statistics on [1, 256, H, W] features, exported by torch at
opset 17. Time them with `primjit bench-op --model OUT/NAME.onnx [--dims H=160,W=160]` beside
`../shared/peers/bench_model.py OUT/NAME.onnx [--dims H=160,W=160]`, alternately.

usage: make_heads.py OUT_DIR   (needs numpy, onnx and torch)
"""
import os
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn


def conv_transpose_graph(path):
    rng = np.random.default_rng(0)
    init = [
        numpy_helper.from_array(rng.standard_normal((64, 64, 1, 1)).astype(np.float32) * 0.1, "w0"),
        numpy_helper.from_array(rng.standard_normal((64, 64, 2, 2)).astype(np.float32) * 0.1, "w"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a0"]),
        helper.make_node("Relu", ["a0"], ["a"]),
        helper.make_node("ConvTranspose", ["a", "w", "b"], ["y"], strides=[2, 2], kernel_shape=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "ct",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 80, 80])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 160, 160])],
        init,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(256, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.ConvTranspose2d(64, 64, 2, 2),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.ConvTranspose2d(64, 1, 2, 2),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.body(x)


def dbnet_head(path):
    torch.manual_seed(0)
    model = Head().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    torch.onnx.export(
        model,
        torch.randn(1, 256, 160, 160),
        path,
        opset_version=17,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {2: "H", 3: "W"}},
    )


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    conv_transpose_graph(os.path.join(out, "ct.onnx"))
    dbnet_head(os.path.join(out, "dbhead.onnx"))


if __name__ == "__main__":
    main()

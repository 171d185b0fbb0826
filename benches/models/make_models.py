#!/usr/bin/env python3
"""Builds torchvision's ResNet18, ResNet50, ResNeXt50 32x4d, MobileNetV2 and DenseNet121, and
a VGG-style CRNN backbone (the architectures at full width, random weights, unfolded batch-norms, opset 17)
as ONNX files with onnx.helper, for the model table of docs/perf: `primjit bench-op --model
OUT/NAME.onnx --dims H=224,W=224` (the CRNN: `--dims W=280`) beside
`../shared/peers/bench_model.py OUT/NAME.onnx --dims H=224,W=224`, alternately.

usage: make_models.py OUT_DIR   (needs onnx, onnxruntime and numpy, as make_families.py; the
files are 14-100 MB, not committed)

Inputs are [1, 3, H, W] with symbolic H and W; the classifier is a global average pool,
Flatten and Gemm, as torchvision exports it. The CRNN backbone (Shi et al.'s, as OCR
recognizers run it) takes [1, 1, 32, W] text lines and gives [1, 512, 1, W/4 + 1] features.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

# The families' builder (tests/onnx/make_families.py): parameters, nodes, conv, batch-norm.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "onnx"))
from make_families import Net as FamilyNet  # noqa: E402


class Net(FamilyNet):
    def conv(self, x, name, cin, cout, k, stride=1, group=1):
        return super().conv(x, name, cin, cout, k, stride, pads=[k // 2] * 4, group=group)

    def cbr(self, x, name, cin, cout, k, stride=1, group=1, act="relu"):
        y = self.bn(self.conv(x, name + ".conv", cin, cout, k, stride, group), name + ".bn", cout)
        if act == "relu":
            return self.node("Relu", [y], name + ".relu")
        if act == "hardswish":
            return self.node("HardSwish", [y], name + ".hardswish")
        if act == "relu6":
            lo = self.param(name + ".min", np.array(0.0))
            hi = self.param(name + ".max", np.array(6.0))
            return self.node("Clip", [y, lo, hi], name + ".relu6")
        return y

    def head(self, x, cin, classes=1000):
        x = self.node("GlobalAveragePool", [x], "avgpool")
        x = self.node("Flatten", [x], "flatten", axis=1)
        return self.gemm(x, "fc", cin, classes)

    def model(self, name, out, x_shape=(1, 3, "H", "W"), out_shape=(1, 1000)):
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))],
            self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="make_models.py")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def stem(n):
    x = n.cbr("x", "stem", 3, 64, 7, 2)
    return n.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)


def resnet(blocks, bottleneck, name, groups=1, group_width=64):
    """ResNet (basic or bottleneck blocks); ResNeXt with `groups` convolutions of
    `group_width` channels per 64 of a layer's planes."""
    n = Net(18 if not bottleneck else 49 + groups)
    x, cin = stem(n), 64
    for layer, (planes, count) in enumerate(zip([64, 128, 256, 512], blocks)):
        for b in range(count):
            p = f"layer{layer + 1}.{b}"
            s = 2 if b == 0 and layer > 0 else 1
            cout = planes * 4 if bottleneck else planes
            width = planes * group_width // 64 * groups
            if bottleneck:
                y = n.cbr(x, p + ".1", cin, width, 1)
                y = n.cbr(y, p + ".2", width, width, 3, s, group=groups)
                y = n.cbr(y, p + ".3", width, cout, 1, act=None)
            else:
                y = n.cbr(x, p + ".1", cin, planes, 3, s)
                y = n.cbr(y, p + ".2", planes, planes, 3, act=None)
            if s != 1 or cin != cout:
                x = n.cbr(x, p + ".downsample", cin, cout, 1, s, act=None)
            x = n.node("Relu", [n.node("Add", [y, x], p + ".add")], p + ".relu")
            cin = cout
    return n.model(name, n.head(x, cin))


def mobilenet_v2(act="relu6", name="mobilenet_v2"):
    """MobileNetV2; with `act="hardswish"`, its ReLU6s are HardSwish, as MobileNetV3 and
    PP-LCNet have them."""
    n = Net(2)
    x, cin = n.cbr("x", "features.0", 3, 32, 3, 2, act=act), 32
    i = 1
    for t, c, reps, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for r in range(reps):
            p = f"features.{i}"
            hidden = cin * t
            y = x if t == 1 else n.cbr(x, p + ".expand", cin, hidden, 1, act=act)
            y = n.cbr(y, p + ".dw", hidden, hidden, 3, s if r == 0 else 1, group=hidden,
                      act=act)
            y = n.cbr(y, p + ".project", hidden, c, 1, act=None)
            x = n.node("Add", [y, x], p + ".add") if (r > 0 or s == 1) and cin == c else y
            cin, i = c, i + 1
    x = n.cbr(x, "features.18", cin, 1280, 1, act=act)
    return n.model(name, n.head(x, 1280))


def densenet121():
    """DenseNet121 as torchvision exports it: each layer's batch-norm, relu, 1x1 and 3x3 convs
    read the concat of the block's input and every feature before it (growth 32), transitions
    halve the channels and pool 2x2; a final batch-norm and relu before the head."""
    n = Net(121)
    x = n.cbr("x", "features.conv0", 3, 64, 7, 2)
    x = n.node("MaxPool", [x], "features.pool0", kernel_shape=[3, 3], strides=[2, 2],
               pads=[1] * 4)
    cin = 64
    for b, layers in enumerate([6, 12, 24, 16]):
        features = [x]
        for i in range(layers):
            p = f"features.denseblock{b + 1}.denselayer{i + 1}"
            joined = n.node("Concat", features, p + ".cat", axis=1) if i else x
            c = cin + 32 * i
            y = n.node("Relu", [n.bn(joined, p + ".norm1", c)], p + ".relu1")
            y = n.cbr(y, p + ".conv1", c, 128, 1)
            features.append(super(Net, n).conv(y, p + ".conv2", 128, 32, 3, pads=[1] * 4))
        x = n.node("Concat", features, f"features.denseblock{b + 1}.cat", axis=1)
        cin += 32 * layers
        if b < 3:
            p = f"features.transition{b + 1}"
            y = n.node("Relu", [n.bn(x, p + ".norm", cin)], p + ".relu")
            y = super(Net, n).conv(y, p + ".conv", cin, cin // 2, 1, pads=[0] * 4)
            x = n.node("AveragePool", [y], p + ".pool", kernel_shape=[2, 2], strides=[2, 2])
            cin //= 2
    x = n.node("Relu", [n.bn(x, "features.norm5", cin)], "features.relu5")
    return n.model("densenet121", n.head(x, cin))


def crnn():
    """The VGG-style CRNN backbone: 3x3 convs (batch-norms on the 512-channel ones), 2x2 max
    pools, then 2x1 pools that keep the width, and a final 2x2 conv without padding."""
    n = Net(7)
    x, cin = "x", 1
    plan = [(64, False, (2, 2)), (128, False, (2, 2)), (256, False, None),
            (256, False, (2, 1)), (512, True, None), (512, True, (2, 1))]
    for i, (cout, bn, pool) in enumerate(plan):
        y = n.conv(x, f"conv{i}", cin, cout, 3)
        y = n.bn(y, f"bn{i}", cout) if bn else y
        x, cin = n.node("Relu", [y], f"relu{i}"), cout
        if pool == (2, 2):
            x = n.node("MaxPool", [x], f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
        elif pool == (2, 1):
            x = n.node("MaxPool", [x], f"pool{i}", kernel_shape=[2, 2], strides=[2, 1],
                       pads=[0, 1, 0, 1])
    y = super(Net, n).conv(x, "conv6", 512, 512, 2, pads=[0] * 4)
    out = n.node("Relu", [n.bn(y, "bn6", 512)], "relu6")
    return n.model("crnn", out, (1, 1, 32, "W"), (1, 512, 1, "T"))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for name, m in [("resnet18", resnet([2, 2, 2, 2], False, "resnet18")),
                    ("resnet50", resnet([3, 4, 6, 3], True, "resnet50")),
                    ("resnext50_32x4d", resnet([3, 4, 6, 3], True, "resnext50_32x4d", 32, 4)),
                    ("densenet121", densenet121()),
                    ("crnn", crnn()),
                    ("mobilenet_v2", mobilenet_v2()),
                    ("mobilenet_v2_hardswish", mobilenet_v2("hardswish", "mobilenet_v2_hardswish"))]:
        path = os.path.join(out, name + ".onnx")
        onnx.save(m, path)
        print(path, os.path.getsize(path), "bytes")

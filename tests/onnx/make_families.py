#!/usr/bin/env python3
"""Builds small ONNX models of four CNN families with onnx.helper, and their expected outputs
from onnxruntime, into families/: NAME.onnx, NAME.input.npy, NAME.expected.npy.

Run by hand (not by CI) with a Python that has onnx, onnxruntime and numpy:

    python3 -m venv /tmp/ov && /tmp/ov/bin/pip install onnx onnxruntime numpy
    /tmp/ov/bin/python tests/onnx/make_families.py

Every model takes a batch of 2 with symbolic height and width (`H`, `W`); the input drawn for
the expected output has the size given below. Weights are seeded; batch-norm stays unfolded.

- resnet: a stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), two basic blocks (one with a 1x1/2
  downsample), global average pool, Flatten, Gemm (a classifier head).
- vgg: 3x3 convs with bias and ReLU, max pools with ceil_mode over odd extents, a global max
  pool, Flatten, Gemm, ReLU, Dropout, Gemm.
- mobilenet: inverted residuals: 1x1 expand, BN, Clip(0, 6); 3x3 depthwise, BN, Clip(0, 6);
  1x1 project, BN; a residual Add; Clip with its bounds as inputs (opset 13).
- deeplab: dilated 3x3 convs (dilations 2 and 4), asymmetric pads, an average pool with
  count_include_pad, a SAME_UPPER conv with stride 1, a 1x1 classifier conv (no head).
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "families")


class Net:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], [], 0

    def fresh(self, p):
        self.k += 1
        return f"{p}_{self.k}"

    def param(self, name, arr):
        self.inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def node(self, op, inputs, name, **attrs):
        out = self.fresh(name)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, name, cin, cout, k, stride=1, pads=None, dil=1, group=1, bias=False, **attrs):
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        ins = [x, self.param(name + ".weight", w)]
        if bias:
            ins.append(self.param(name + ".bias", self.rng.uniform(-0.1, 0.1, cout)))
        if pads is not None:
            attrs["pads"] = pads
        return self.node("Conv", ins, name, kernel_shape=[k, k], strides=[stride, stride],
                         dilations=[dil, dil], group=group, **attrs)

    def bn(self, x, name, c):
        r = self.rng
        ins = [x] + [self.param(f"{name}.{n}", v) for n, v in (
            ("weight", r.uniform(0.5, 1.0, c)), ("bias", r.uniform(-0.1, 0.1, c)),
            ("running_mean", r.uniform(-0.1, 0.1, c)), ("running_var", r.uniform(0.5, 1.5, c)))]
        return self.node("BatchNormalization", ins, name, epsilon=1e-5)

    def relu(self, x, name="relu"):
        return self.node("Relu", [x], name)

    def relu6(self, x, name):
        lo = self.param(name + ".min", np.array(0.0))
        hi = self.param(name + ".max", np.array(6.0))
        return self.node("Clip", [x, lo, hi], name)

    def gemm(self, x, name, cin, cout):
        w = self.rng.standard_normal((cout, cin)) * np.sqrt(1.0 / cin)
        return self.node("Gemm", [x, self.param(name + ".weight", w),
                                  self.param(name + ".bias", self.rng.uniform(-0.1, 0.1, cout))],
                         name, transB=1)

    def model(self, name, cin, out, out_shape, opset=17):
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, "H", "W"])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="make_families.py")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def resnet():
    n = Net(1)
    x = n.relu(n.bn(n.conv("x", "conv1", 3, 16, 7, 2, [3] * 4), "bn1", 16))
    x = n.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    for b, (cin, cout, s) in enumerate([(16, 16, 1), (16, 32, 2)]):
        p = f"layer1.{b}"
        y = n.relu(n.bn(n.conv(x, p + ".conv1", cin, cout, 3, s, [1] * 4), p + ".bn1", cout))
        y = n.bn(n.conv(y, p + ".conv2", cout, cout, 3, 1, [1] * 4), p + ".bn2", cout)
        if s != 1 or cin != cout:
            x = n.bn(n.conv(x, p + ".downsample.0", cin, cout, 1, s, [0] * 4), p + ".downsample.1", cout)
        x = n.relu(n.node("Add", [y, x], p + ".add"))
    x = n.node("GlobalAveragePool", [x], "avgpool")
    x = n.node("Flatten", [x], "flatten", axis=1)
    out = n.gemm(x, "fc", 32, 10)
    return n.model("resnet", 3, out, [2, 10]), (2, 3, 37, 45)


def vgg():
    n = Net(2)
    x = n.relu(n.conv("x", "features.0", 3, 8, 3, 1, [1] * 4, bias=True))
    x = n.node("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    x = n.relu(n.conv(x, "features.3", 8, 16, 3, 1, [1] * 4, bias=True))
    x = n.relu(n.conv(x, "features.5", 16, 16, 3, 1, [1] * 4, bias=True))
    x = n.node("MaxPool", [x], "pool2", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    x = n.node("GlobalMaxPool", [x], "gmp")
    x = n.node("Flatten", [x], "flatten")
    x = n.relu(n.gemm(x, "classifier.0", 16, 24))
    x = n.node("Dropout", [x], "drop")
    out = n.gemm(x, "classifier.3", 24, 5)
    return n.model("vgg", 3, out, [2, 5]), (2, 3, 23, 31)


def mobilenet():
    n = Net(3)
    x = n.relu6(n.bn(n.conv("x", "stem", 3, 8, 3, 2, [1] * 4), "stem.bn", 8), "stem.relu6")
    for b, (cin, cout, s, t) in enumerate([(8, 8, 1, 4), (8, 12, 2, 4), (12, 12, 1, 6)]):
        p, h = f"block{b}", cin * t
        y = n.relu6(n.bn(n.conv(x, p + ".expand", cin, h, 1), p + ".bn0", h), p + ".relu6a")
        y = n.relu6(n.bn(n.conv(y, p + ".dw", h, h, 3, s, [1] * 4, group=h), p + ".bn1", h), p + ".relu6b")
        y = n.bn(n.conv(y, p + ".project", h, cout, 1), p + ".bn2", cout)
        x = n.node("Add", [x, y], p + ".add") if s == 1 and cin == cout else y
    out = n.node("GlobalAveragePool", [x], "pool")
    return n.model("mobilenet", 3, out, [2, 12, 1, 1], opset=13), (2, 3, 33, 29)


def deeplab():
    n = Net(4)
    x = n.relu(n.conv("x", "stem", 3, 8, 3, 2, [1, 0, 2, 1], bias=True))
    x = n.relu(n.conv(x, "aspp.d2", 8, 8, 3, 1, [2] * 4, dil=2))
    x = n.relu(n.conv(x, "aspp.d4", 8, 8, 3, 1, [4, 3, 4, 5], dil=4))
    x = n.node("AveragePool", [x], "smooth", kernel_shape=[3, 3], pads=[1] * 4, count_include_pad=1)
    x = n.relu(n.conv(x, "same", 8, 8, 3, 1, None, auto_pad="SAME_UPPER"))
    out = n.conv(x, "classifier", 8, 4, 1, bias=True)
    return n.model("deeplab", 3, out, [2, 4, "OH", "OW"]), (2, 3, 26, 35)


def main():
    os.makedirs(OUT, exist_ok=True)
    for build in (resnet, vgg, mobilenet, deeplab):
        model, shape = build()
        name = model.graph.name
        path = os.path.join(OUT, name + ".onnx")
        onnx.save(model, path)
        x = np.random.default_rng(100).uniform(-1, 1, shape).astype(np.float32)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (y,) = sess.run(None, {"x": x})
        np.save(os.path.join(OUT, name + ".input.npy"), x)
        np.save(os.path.join(OUT, name + ".expected.npy"), y)
        print(f"{name}: {os.path.getsize(path)} bytes, input {list(x.shape)} -> {list(y.shape)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds block-level ONNX models of the CNN zoo of issue 55 with onnx.helper, at reduced
channel widths, and their expected outputs from onnxruntime, into zoo/: NAME.onnx,
NAME.input.npy, NAME.expected.npy (for the recognizer, one pair per width:
recognizer.wW.input.npy and recognizer.wW.expected.npy).

Run by hand (not by CI) with a Python that has onnx, onnxruntime and numpy:

    python3 -m venv /tmp/ov && /tmp/ov/bin/pip install onnx onnxruntime numpy
    /tmp/ov/bin/python tests/onnx/make_zoo.py

Weights and inputs are seeded; batch-norm stays unfolded, as torch.onnx.export writes it in
training-free exports without constant folding. Every model takes a batch of 2.

- mbv3: MobileNetV3's inverted residual with squeeze-excitation and HardSwish, behind an
  input normalization (Sub and Div by per-channel constants): 1x1 expand, BN, HardSwish; 3x3
  depthwise, BN, HardSwish; SE (GlobalAveragePool, 1x1 conv, ReLU, 1x1 conv, HardSigmoid,
  Mul with the block's activation); 1x1 project, BN; residual Add. Symbolic H and W.
- mbconv: EfficientNet's MBConv with SiLU written as Sigmoid + Mul, SE by ReduceMean
  (keepdims) and a Sigmoid gate, a channel count that is not a multiple of four. Symbolic H, W.
- densenet: a dense block of two layers (BN, ReLU, 1x1 conv, BN, ReLU, 3x3 conv, Concat with
  the block's input) and a transition (BN, ReLU, 1x1 conv, 2x2 average pool). Symbolic H, W.
- fire: SqueezeNet's fire module: 1x1 squeeze and ReLU, 1x1 and 3x3 expands with ReLU,
  Concat; then the classifier's ReduceMean without keepdims, its axes an input (opset 18).
  Symbolic H, W.
- vgg_head: conv features, a max pool to 3x3, Flatten of the 3x3 image, Gemm (transB),
  ReLU, Dropout, Gemm, as torchvision's VGG classifier. Fixed H and W.
- acts: the other activations after convs and alone: PRelu, LeakyRelu, Elu, Tanh, Sigmoid,
  a zero Pad before a conv, and a ReduceMax with keepdims. Symbolic H and W.
- shufflenet: a ShuffleNetV2 unit of stride 1: Split of the channels, a branch of 1x1,
  depthwise 3x3 and 1x1 convs, Concat, the channel shuffle (Reshape, Transpose, Reshape) at
  height 8 and any width, then a Slice of channels 3 to 10.
- inception: Inception v3's block A: 1x1, 5x5 and double 3x3 branches and an average pool
  branch, with BN and ReLU, joined by Concat (6 + 6 + 7 + 5 channels). Symbolic H, W.
- fcn: an FCN/DeepLab head: two stride-2 conv stages, a 1x1 classifier, and its logits resized
  (bilinear, pytorch_half_pixel) to the input's height and width, the sizes computed as torch
  writes them: Shape, Gather, Unsqueeze, Concat, Cast, and a Slice of the logits' Shape for
  the batch and channels. Symbolic H and W, run at three sizes (fcn.HxW.*.npy).
- fpn: an FPN top-down step: the top level upsampled x2 (nearest, asymmetric, floor: torch's
  `nearest`) plus a lateral, plus the top resized bilinearly (half_pixel) to the lateral's
  size, then resized (pytorch_half_pixel, torch's align_corners=False) to the size of a
  full-resolution lateral, `x.shape[-2:]` as a Slice of Shape, and concatenated with it.
  Symbolic H and W (multiples of 4, for the x2 upsampling to meet its lateral), run at
  three sizes (fpn.HxW.*.npy).
- lraspp: torchvision's LR-ASPP segmentation head over a small backbone: the high features
  (stride 16) through a 1x1 conv, BN and ReLU, gated by their global average pool, a 1x1
  conv and a Sigmoid (Mul), resized bilinearly to the low features' size (stride 8), the two
  classifiers' sum, resized to the input's size. Symbolic H and W, run at three sizes
  (lraspp.HxW.*.npy), one of them odd.
- dbnet: a DBNet-style text detector: a backbone of four stride-2 conv stages (BN, ReLU),
  an FPN over the last three (1x1 laterals, top-down nearest Resize to each lateral's size
  from its Shape, Add), 3x3 smoothing convs whose outputs are resized to the finest level and
  concatenated, and the probability head: 3x3 conv, BN, ReLU, ConvTranspose k2 s2 (bias),
  BN, ReLU, a depthwise ConvTranspose k3 s2 pad 1 output_padding 1, a 1x1 conv and a
  Sigmoid. Symbolic H and W, run at three sizes (dbnet.HxW.*.npy), one not a multiple of
  four (its output is then larger than its input).
- same: ONNX `auto_pad` over symbolic extents, as TensorFlow exports write it: a 3x3/2 Conv
  SAME_UPPER with bias and ReLU, a 3x3/2 MaxPool SAME_LOWER, a 3x3/2 Conv SAME_LOWER,
  a 2x3 AveragePool SAME_UPPER at stride 1 (its padding not counted) and a 1x1 classifier.
  Symbolic H and W, run at six sizes (same.HxW.*.npy): odd and even extents, one pixel, and
  one wide enough to stream in bands.
- recognizer: a 32xW text-line recognizer block in PP-LCNet's style: a stride-2 stem with
  HardSwish, depthwise-separable blocks with HardSwish and SE (HardSigmoid gate), run at
  widths 64, 100 and 160.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo")


class Net:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], [], 0

    def fresh(self, p):
        self.k += 1
        return f"{p}_{self.k}"

    def param(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name))
        return name

    def node(self, op, inputs, name, **attrs):
        out = self.fresh(name)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, name, cin, cout, k, stride=1, group=1, bias=False, pads=None):
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        ins = [x, self.param(name + ".weight", w)]
        if bias:
            ins.append(self.param(name + ".bias", self.rng.uniform(-0.1, 0.1, cout)))
        return self.node("Conv", ins, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[k // 2] * 4 if pads is None else pads, group=group)

    def deconv(self, x, name, cin, cout, k, stride, group=1, pads=(0, 0, 0, 0),
               output_padding=None, bias=True):
        w = self.rng.standard_normal((cin, cout // group, k, k)) * np.sqrt(2.0 / (cout // group * k * k))
        ins = [x, self.param(name + ".weight", w)]
        if bias:
            ins.append(self.param(name + ".bias", self.rng.uniform(-0.1, 0.1, cout)))
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=list(pads), group=group)
        if output_padding is not None:
            attrs["output_padding"] = list(output_padding)
        return self.node("ConvTranspose", ins, name, **attrs)

    def bn(self, x, name, c):
        r = self.rng
        ins = [x] + [self.param(f"{name}.{n}", v) for n, v in (
            ("weight", r.uniform(0.5, 1.0, c)), ("bias", r.uniform(-0.1, 0.1, c)),
            ("running_mean", r.uniform(-0.1, 0.1, c)), ("running_var", r.uniform(0.5, 1.5, c)))]
        return self.node("BatchNormalization", ins, name, epsilon=1e-5)

    def hswish(self, x, name):
        return self.node("HardSwish", [x], name)

    def silu(self, x, name):
        return self.node("Mul", [x, self.node("Sigmoid", [x], name + ".sigmoid")], name)

    def se(self, x, name, c, squeeze, gate="HardSigmoid", reduce=False, act="Relu"):
        if reduce:
            s = self.node("ReduceMean", [x], name + ".pool", axes=[2, 3], keepdims=1)
        else:
            s = self.node("GlobalAveragePool", [x], name + ".pool")
        s = self.conv(s, name + ".fc1", c, squeeze, 1, bias=True)
        s = self.silu(s, name + ".act") if act == "SiLU" else self.node(act, [s], name + ".act")
        s = self.conv(s, name + ".fc2", squeeze, c, 1, bias=True)
        if gate == "HardSigmoid":
            s = self.node("HardSigmoid", [s], name + ".gate", alpha=1.0 / 6.0, beta=0.5)
        else:
            s = self.node(gate, [s], name + ".gate")
        return self.node("Mul", [x, s], name + ".scale")

    def param_i64(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.int64), name))
        return name

    def model(self, name, cin, out, out_shape, in_shape, opset=17):
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="make_zoo.py")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def mbv3():
    n = Net(11)
    mean = n.param("mean", np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
    std = n.param("std", np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
    x = n.node("Div", [n.node("Sub", ["x", mean], "norm.sub"), std], "norm.div")
    x = n.hswish(n.bn(n.conv(x, "stem", 3, 16, 3, 2), "stem.bn", 16), "stem.act")
    y = n.hswish(n.bn(n.conv(x, "expand", 16, 48, 1), "expand.bn", 48), "expand.act")
    y = n.hswish(n.bn(n.conv(y, "dw", 48, 48, 3, group=48), "dw.bn", 48), "dw.act")
    y = n.se(y, "se", 48, 12)
    y = n.bn(n.conv(y, "project", 48, 16, 1), "project.bn", 16)
    out = n.node("Add", [x, y], "add")
    return n.model("mbv3", 3, out, [2, 16, "OH", "OW"], [2, 3, "H", "W"]), (2, 3, 29, 35)


def mbconv():
    n = Net(12)
    x = n.silu(n.bn(n.conv("x", "stem", 3, 12, 3, 2), "stem.bn", 12), "stem.act")
    y = n.silu(n.bn(n.conv(x, "expand", 12, 42, 1), "expand.bn", 42), "expand.act")
    y = n.silu(n.bn(n.conv(y, "dw", 42, 42, 5, group=42), "dw.bn", 42), "dw.act")
    y = n.se(y, "se", 42, 3, gate="Sigmoid", reduce=True, act="SiLU")
    y = n.bn(n.conv(y, "project", 42, 12, 1), "project.bn", 12)
    out = n.node("Add", [y, x], "add")
    return n.model("mbconv", 3, out, [2, 12, "OH", "OW"], [2, 3, "H", "W"], opset=13), (2, 3, 26, 31)


def densenet():
    n = Net(13)
    x = n.node("Relu", [n.bn(n.conv("x", "stem", 3, 10, 3), "stem.bn", 10)], "stem.relu")
    c = 10
    for i in range(2):
        p = f"layer{i}"
        y = n.conv(n.node("Relu", [n.bn(x, p + ".norm1", c)], p + ".relu1"), p + ".conv1", c, 16, 1)
        y = n.conv(n.node("Relu", [n.bn(y, p + ".norm2", 16)], p + ".relu2"), p + ".conv2", 16, 6, 3)
        x = n.node("Concat", [x, y], p + ".concat", axis=1)
        c += 6
    x = n.conv(n.node("Relu", [n.bn(x, "trans.norm", c)], "trans.relu"), "trans.conv", c, 11, 1)
    out = n.node("AveragePool", [x], "trans.pool", kernel_shape=[2, 2], strides=[2, 2])
    return n.model("densenet", 3, out, [2, 11, "OH", "OW"], [2, 3, "H", "W"]), (2, 3, 18, 23)


def fire():
    n = Net(14)
    x = n.node("Relu", [n.conv("x", "stem", 3, 16, 3, 2, bias=True)], "stem.relu")
    s = n.node("Relu", [n.conv(x, "squeeze", 16, 6, 1, bias=True)], "squeeze.relu")
    e1 = n.node("Relu", [n.conv(s, "expand1x1", 6, 13, 1, bias=True)], "expand1x1.relu")
    e3 = n.node("Relu", [n.conv(s, "expand3x3", 6, 11, 3, bias=True)], "expand3x3.relu")
    x = n.node("Concat", [e1, e3], "concat", axis=1)
    # Opset 18: the axes are an input.
    n.inits.append(numpy_helper.from_array(np.array([-1, -2], dtype=np.int64), "pool.axes"))
    out = n.node("ReduceMean", [x, "pool.axes"], "pool", keepdims=0)
    return n.model("fire", 3, out, [2, 24], [2, 3, "H", "W"], opset=18), (2, 3, 21, 27)


def vgg_head():
    n = Net(15)
    x = n.node("Relu", [n.conv("x", "features.0", 3, 8, 3, bias=True)], "features.1")
    x = n.node("MaxPool", [x], "features.2", kernel_shape=[2, 2], strides=[2, 2])
    x = n.node("Relu", [n.conv(x, "features.3", 8, 12, 3, bias=True)], "features.4")
    x = n.node("MaxPool", [x], "features.5", kernel_shape=[2, 2], strides=[2, 2])
    x = n.node("Flatten", [x], "flatten", axis=1)
    w = n.rng.standard_normal((20, 12 * 3 * 3)) * np.sqrt(1.0 / 108)
    x = n.node("Gemm", [x, n.param("classifier.0.weight", w),
                        n.param("classifier.0.bias", n.rng.uniform(-0.1, 0.1, 20))],
               "classifier.0", transB=1)
    x = n.node("Dropout", [n.node("Relu", [x], "classifier.1")], "classifier.2")
    w = n.rng.standard_normal((7, 20)) * np.sqrt(1.0 / 20)
    out = n.node("Gemm", [x, n.param("classifier.3.weight", w),
                          n.param("classifier.3.bias", n.rng.uniform(-0.1, 0.1, 7))],
                 "classifier.3", transB=1, alpha=0.5, beta=2.0)
    return n.model("vgg_head", 3, out, [2, 7], [2, 3, 12, 13]), (2, 3, 12, 13)


def acts():
    n = Net(16)
    x = n.conv("x", "c1", 3, 7, 3, bias=True)
    x = n.node("PRelu", [x, n.param("c1.slope", n.rng.uniform(0.0, 0.5, 7).reshape(7, 1, 1))], "prelu")
    # A zero Pad (opset 17: pads as an input) that joins the next conv's pads.
    n.inits.append(numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], dtype=np.int64), "pad.pads"))
    x = n.node("Pad", [x, "pad.pads"], "pad", mode="constant")
    x = n.node("LeakyRelu", [n.conv(x, "c2", 7, 9, 3, bias=True, pads=[0, 1, 0, 0])], "leaky", alpha=0.1)
    x = n.node("Elu", [n.conv(x, "c3", 9, 6, 1, bias=True)], "elu", alpha=0.7)
    x = n.node("Tanh", [x], "tanh")
    x = n.node("Sigmoid", [n.conv(x, "c4", 6, 5, 3, bias=True)], "sigmoid")
    out = n.node("ReduceMax", [x], "rmax", axes=[2, 3], keepdims=1)
    return n.model("acts", 3, out, [2, 5, 1, 1], [2, 3, "H", "W"]), (2, 3, 15, 19)


def shufflenet():
    n = Net(18)
    x = n.node("Relu", [n.bn(n.conv("x", "stem", 3, 12, 3), "stem.bn", 12)], "stem.relu")
    n.inits.append(numpy_helper.from_array(np.array([6, 6], dtype=np.int64), "split.sizes"))
    a, b = n.fresh("split.a"), n.fresh("split.b")
    n.nodes.append(helper.make_node("Split", [x, "split.sizes"], [a, b], name="split", axis=1))
    y = n.node("Relu", [n.bn(n.conv(b, "b2.pw1", 6, 6, 1), "b2.bn1", 6)], "b2.relu1")
    y = n.bn(n.conv(y, "b2.dw", 6, 6, 3, group=6), "b2.bn2", 6)
    y = n.node("Relu", [n.bn(n.conv(y, "b2.pw2", 6, 6, 1), "b2.bn3", 6)], "b2.relu2")
    x = n.node("Concat", [a, y], "concat", axis=1)
    # The channel shuffle of two groups, at the fixed height 8 and any width.
    n.inits.append(numpy_helper.from_array(np.array([2, 2, 6, 8, -1], dtype=np.int64), "shuffle.s1"))
    n.inits.append(numpy_helper.from_array(np.array([2, 12, 8, -1], dtype=np.int64), "shuffle.s2"))
    x = n.node("Reshape", [x, "shuffle.s1"], "shuffle.view")
    x = n.node("Transpose", [x], "shuffle.t", perm=[0, 2, 1, 3, 4])
    x = n.node("Reshape", [x, "shuffle.s2"], "shuffle.back")
    starts = n.param("slice.starts", np.array([3]))
    n.inits[-1] = numpy_helper.from_array(np.array([3], dtype=np.int64), "slice.starts")
    n.inits.append(numpy_helper.from_array(np.array([10], dtype=np.int64), "slice.ends"))
    n.inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "slice.axes"))
    out = n.node("Slice", [x, starts, "slice.ends", "slice.axes"], "slice")
    return n.model("shufflenet", 3, out, [2, 7, 8, "W"], [2, 3, 8, "W"]), (2, 3, 8, 13)


def inception():
    n = Net(19)
    x = n.node("Relu", [n.bn(n.conv("x", "stem", 3, 10, 3, 2), "stem.bn", 10)], "stem.relu")
    def basic(y, name, cin, cout, k):
        return n.node("Relu", [n.bn(n.conv(y, name, cin, cout, k), name + ".bn", cout)], name + ".relu")
    b1 = basic(x, "branch1x1", 10, 6, 1)
    b5 = basic(basic(x, "branch5x5_1", 10, 4, 1), "branch5x5_2", 4, 6, 5)
    b3 = basic(basic(basic(x, "branch3x3dbl_1", 10, 6, 1), "branch3x3dbl_2", 6, 7, 3), "branch3x3dbl_3", 7, 7, 3)
    bp = n.node("AveragePool", [x], "branch_pool.avg", kernel_shape=[3, 3], strides=[1, 1],
                pads=[1, 1, 1, 1], count_include_pad=1)
    bp = basic(bp, "branch_pool", 10, 5, 1)
    out = n.node("Concat", [b1, b5, b3, bp], "concat", axis=1)
    return n.model("inception", 3, out, [2, 24, "OH", "OW"], [2, 3, "H", "W"]), (2, 3, 23, 29)


def recognizer():
    n = Net(17)
    x = n.hswish(n.bn(n.conv("x", "stem", 3, 8, 3, 2), "stem.bn", 8), "stem.act")
    c = 8
    for i, (cout, stride, se) in enumerate([(16, 1, False), (16, 2, True), (24, 1, True)]):
        p = f"block{i}"
        x = n.hswish(n.bn(n.conv(x, p + ".dw", c, c, 3, stride, group=c), p + ".dw.bn", c), p + ".dw.act")
        if se:
            x = n.se(x, p + ".se", c, max(c // 4, 2))
        x = n.hswish(n.bn(n.conv(x, p + ".pw", c, cout, 1), p + ".pw.bn", cout), p + ".pw.act")
        c = cout
    out = n.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    m = n.model("recognizer", 3, out, [2, c, "OH", "OW"], [2, 3, 32, "W"])
    return m, [(2, 3, 32, w) for w in (64, 100, 160)]


def shape_hw(n, x, name):
    """[N, C, H, W] sizes of a Resize as torch writes `size=x.shape[2:]` for F.interpolate:
    the batch and channels of the resized value by a Slice of its Shape, the height and width of
    `x` gathered, unsqueezed, concatenated and cast."""
    s = n.node("Shape", [x], name + ".shape")
    dims = []
    for axis in (2, 3):
        k = n.param_i64(f"{name}.axis{axis}", np.array(axis, dtype=np.int64))
        g = n.node("Gather", [s, k], f"{name}.gather{axis}", axis=0)
        a = n.param_i64(f"{name}.unsq{axis}", np.array([0], dtype=np.int64))
        dims.append(n.node("Unsqueeze", [g, a], f"{name}.unsqueeze{axis}"))
    hw = n.node("Concat", dims, name + ".hw", axis=0)
    return n.node("Cast", [hw], name + ".cast", to=TensorProto.INT64)


def shape_slice(n, x, start, end, name):
    s = n.node("Shape", [x], name + ".shape")
    starts = n.param_i64(name + ".starts", np.array([start], dtype=np.int64))
    ends = n.param_i64(name + ".ends", np.array([end], dtype=np.int64))
    return n.node("Slice", [s, starts, ends], name + ".slice")


def fcn():
    n = Net(23)
    x = n.node("Relu", [n.bn(n.conv("x", "backbone.0", 3, 8, 3, 2), "backbone.0.bn", 8)], "backbone.0.relu")
    x = n.node("Relu", [n.conv(x, "backbone.1", 8, 12, 3, 2, bias=True)], "backbone.1.relu")
    logits = n.conv(x, "classifier", 12, 5, 1, bias=True)
    nc = shape_slice(n, logits, 0, 2, "head.nc")
    sizes = n.node("Concat", [nc, shape_hw(n, "x", "head.hw")], "head.sizes", axis=0)
    out = n.node("Resize", [logits, "", "", sizes], "head.resize", mode="linear",
                 coordinate_transformation_mode="pytorch_half_pixel")
    m = n.model("fcn", 3, out, [2, 5, "H", "W"], [2, 3, "H", "W"])
    return m, [(2, 3, h, w) for h, w in ((16, 20), (13, 9), (32, 24))]


def fpn():
    n = Net(29)
    c1 = n.node("Relu", [n.conv("x", "c1", 3, 8, 3, 2)], "c1.relu")
    c2 = n.node("Relu", [n.conv(c1, "c2", 8, 8, 3, 2)], "c2.relu")
    top = n.conv(c2, "inner.top", 8, 6, 1, bias=True)
    lat1 = n.conv(c1, "inner.lat1", 8, 6, 1, bias=True)
    scales = n.param("up.scales", [1.0, 1.0, 2.0, 2.0])
    up = n.node("Resize", [top, "", scales], "up", mode="nearest",
                coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    p1 = n.node("Add", [up, lat1], "p1")
    nc = shape_slice(n, top, 0, 2, "up2.nc")
    hw = shape_slice(n, lat1, -2, 2**63 - 1, "up2.hw")
    sizes = n.node("Concat", [nc, hw], "up2.sizes", axis=0)
    up2 = n.node("Resize", [top, "", "", sizes], "up2", mode="linear",
                 coordinate_transformation_mode="half_pixel")
    p1 = n.node("Add", [p1, up2], "p1b")
    lat0 = n.conv("x", "inner.lat0", 3, 4, 3, bias=True)
    nc = shape_slice(n, p1, 0, 2, "up3.nc")
    hw = shape_slice(n, lat0, -2, 2**63 - 1, "up3.hw")
    sizes = n.node("Concat", [nc, hw], "up3.sizes", axis=0)
    r = n.node("Resize", [p1, "", "", sizes], "up3", mode="linear",
               coordinate_transformation_mode="pytorch_half_pixel")
    cat = n.node("Concat", [r, lat0], "cat", axis=1)
    out = n.conv(cat, "out", 10, 3, 3, bias=True)
    m = n.model("fpn", 3, out, [2, 3, "H", "W"], [2, 3, "H", "W"])
    return m, [(2, 3, h, w) for h, w in ((16, 24), (20, 12), (8, 8))]


def lraspp():
    """torchvision's LR-ASPP head over a small backbone (low features at stride 8, high at 16)."""
    n = Net(31)
    x = n.node("Relu", [n.bn(n.conv("x", "backbone.0", 3, 8, 3, 2), "backbone.0.bn", 8)], "backbone.0.relu")
    x = n.node("Relu", [n.conv(x, "backbone.1", 8, 8, 3, 2, bias=True)], "backbone.1.relu")
    low = n.hswish(n.bn(n.conv(x, "backbone.2", 8, 12, 3, 2), "backbone.2.bn", 12), "backbone.2.act")
    high = n.hswish(n.conv(low, "backbone.3", 12, 16, 3, 2, bias=True), "backbone.3.act")
    cbr = n.node("Relu", [n.bn(n.conv(high, "head.cbr", 16, 8, 1), "head.cbr.bn", 8)], "head.cbr.relu")
    scale = n.node("GlobalAveragePool", [high], "head.scale.pool")
    scale = n.node("Sigmoid", [n.conv(scale, "head.scale.conv", 16, 8, 1)], "head.scale.sigmoid")
    x = n.node("Mul", [cbr, scale], "head.mul")
    nc = shape_slice(n, x, 0, 2, "head.up.nc")
    hw = shape_slice(n, low, -2, 2**63 - 1, "head.up.hw")
    sizes = n.node("Concat", [nc, hw], "head.up.sizes", axis=0)
    x = n.node("Resize", [x, "", "", sizes], "head.up", mode="linear",
               coordinate_transformation_mode="half_pixel")
    x = n.node("Add", [n.conv(low, "head.low_classifier", 12, 5, 1, bias=True),
                       n.conv(x, "head.high_classifier", 8, 5, 1, bias=True)], "head.add")
    nc = shape_slice(n, x, 0, 2, "out.nc")
    sizes = n.node("Concat", [nc, shape_hw(n, "x", "out.hw")], "out.sizes", axis=0)
    out = n.node("Resize", [x, "", "", sizes], "out", mode="linear",
                 coordinate_transformation_mode="pytorch_half_pixel")
    m = n.model("lraspp", 3, out, [2, 5, "H", "W"], [2, 3, "H", "W"])
    return m, [(2, 3, h, w) for h, w in ((32, 48), (40, 24), (27, 37))]


def dbnet():
    n = Net(31)
    x, stages, c = "x", [], 3
    for i, width in enumerate((6, 8, 12, 16)):
        x = n.node("Relu", [n.bn(n.conv(x, f"backbone.{i}", c, width, 3, 2), f"backbone.{i}.bn", width)],
                   f"backbone.{i}.relu")
        stages.append(x)
        c = width
    c2, c3, c4 = stages[1:]
    ins = [n.conv(v, f"neck.in{i}", w, 8, 1) for i, (v, w) in enumerate(((c2, 8), (c3, 12), (c4, 16)))]

    def up_to(v, like, name):
        nc = shape_slice(n, v, 0, 2, name + ".nc")
        hw = shape_slice(n, like, -2, 2**63 - 1, name + ".hw")
        sizes = n.node("Concat", [nc, hw], name + ".sizes", axis=0)
        return n.node("Resize", [v, "", "", sizes], name, mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    p4 = ins[2]
    p3 = n.node("Add", [ins[1], up_to(p4, ins[1], "neck.up4")], "neck.p3")
    p2 = n.node("Add", [ins[0], up_to(p3, ins[0], "neck.up3")], "neck.p2")
    outs = [n.conv(p, f"neck.out{i}", 8, 4, 3) for i, p in enumerate((p2, p3, p4))]
    fuse = n.node("Concat", [outs[0]] + [up_to(o, outs[0], f"neck.fuse{i}") for i, o in
                                         enumerate(outs[1:])], "neck.fuse", axis=1)
    h = n.node("Relu", [n.bn(n.conv(fuse, "head.conv", 12, 8, 3), "head.bn1", 8)], "head.relu1")
    h = n.deconv(h, "head.up1", 8, 6, 2, 2)
    h = n.node("Relu", [n.bn(h, "head.bn2", 6)], "head.relu2")
    h = n.deconv(h, "head.up2", 6, 6, 3, 2, group=6, pads=(1, 1, 1, 1), output_padding=(1, 1))
    h = n.conv(h, "head.prob", 6, 1, 1, bias=True)
    out = n.node("Sigmoid", [h], "head.sigmoid")
    m = n.model("dbnet", 3, out, [2, 1, "OH", "OW"], [2, 3, "H", "W"])
    return m, [(2, 3, h, w) for h, w in ((32, 32), (24, 40), (19, 30))]


def same():
    n = Net(41)

    # onnxruntime refuses dilations with SAME (its Conv: "Dilation not supported"), so none.
    def conv(x, name, cin, cout, auto_pad, bias=False):
        w = n.rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))
        ins = [x, n.param(name + ".weight", w)]
        if bias:
            ins.append(n.param(name + ".bias", n.rng.uniform(-0.1, 0.1, cout)))
        return n.node("Conv", ins, name, kernel_shape=[3, 3], strides=[2, 2], auto_pad=auto_pad)

    x = n.node("Relu", [conv("x", "stem", 3, 8, "SAME_UPPER", bias=True)], "stem.relu")
    x = n.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER")
    x = conv(x, "down", 8, 8, "SAME_LOWER")
    x = n.node("AveragePool", [x], "smooth", kernel_shape=[2, 3], auto_pad="SAME_UPPER")
    out = n.conv(x, "classifier", 8, 4, 1, bias=True)
    m = n.model("same", 3, out, [2, 4, "OH", "OW"], [2, 3, "H", "W"])
    return m, [(2, 3, h, w) for h, w in ((7, 9), (8, 8), (9, 12), (1, 1), (22, 31), (13, 150))]


def run(m, shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x})
    return x, y


def sized(make, seed):
    """A model run at several sizes: NAME.onnx and NAME.HxW.{input,expected}.npy."""
    m, shapes = make()
    name = m.graph.name
    onnx.save(m, os.path.join(OUT, f"{name}.onnx"))
    for j, shape in enumerate(shapes):
        x, y = run(m, shape, seed + j)
        tag = f"{shape[2]}x{shape[3]}"
        np.save(os.path.join(OUT, f"{name}.{tag}.input.npy"), x)
        np.save(os.path.join(OUT, f"{name}.{tag}.expected.npy"), y)
        print(name, x.shape, "->", y.shape)


def main():
    os.makedirs(OUT, exist_ok=True)
    # `make_zoo.py fcn fpn lraspp dbnet same` builds those alone.
    only = sys.argv[1:]
    if only:
        makers = {"fcn": (fcn, 300), "fpn": (fpn, 400), "lraspp": (lraspp, 500),
                  "dbnet": (dbnet, 500), "same": (same, 600)}
        for name in only:
            sized(*makers[name])
        return
    for i, make in enumerate([mbv3, mbconv, densenet, fire, vgg_head, acts, shufflenet, inception]):
        m, shape = make()
        name = m.graph.name
        onnx.save(m, os.path.join(OUT, f"{name}.onnx"))
        x, y = run(m, shape, 100 + i)
        np.save(os.path.join(OUT, f"{name}.input.npy"), x)
        np.save(os.path.join(OUT, f"{name}.expected.npy"), y)
        print(name, x.shape, "->", y.shape)
    m, shapes = recognizer()
    onnx.save(m, os.path.join(OUT, "recognizer.onnx"))
    for j, shape in enumerate(shapes):
        x, y = run(m, shape, 200 + j)
        w = shape[3]
        np.save(os.path.join(OUT, f"recognizer.w{w}.input.npy"), x)
        np.save(os.path.join(OUT, f"recognizer.w{w}.expected.npy"), y)
        print("recognizer", x.shape, "->", y.shape)
    sized(fcn, 300)
    sized(fpn, 400)
    sized(lraspp, 500)
    sized(dbnet, 500)
    sized(same, 600)


if __name__ == "__main__":
    main()

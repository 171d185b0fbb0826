#!/usr/bin/env python3
"""Writes one seed per op of issue 55 for the `onnx_import` fuzz target into onnx_import/:
a one-byte mode prefix (1: the rest is the model) and a small model whose one node (after a
conv, where the op needs an activation from one) is that op; for Resize, its sizes computed
by Shape, Gather, Unsqueeze, Slice, Concat and Cast, or its scales, and Upsample; two
ConvTransposes (k2 s2 with a bias, then a depthwise one with pads and output_padding), and
one with auto_pad SAME_UPPER and a dilation over symbolic extents. Run by hand
with a Python that has onnx (see tests/onnx/make_zoo.py):

    /tmp/ov/bin/python fuzz/seeds/make_onnx_seeds.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_import")


def model(name, nodes, inits, opset=17, out_shape=(1, 5, "H", "W"), in_shape=(1, 5, "H", "W")):
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(np.asarray(v, dtype=d), n) for n, v, d in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def unary(op, **attrs):
    return model(op, [helper.make_node(op, ["x"], ["y"], **attrs)], [])


def main():
    os.makedirs(OUT, exist_ok=True)
    f32, i64 = np.float32, np.int64
    rng = np.random.default_rng(0)
    seeds = {
        "sigmoid": unary("Sigmoid"),
        "hardsigmoid": unary("HardSigmoid", alpha=0.25, beta=0.4),
        "hardswish": unary("HardSwish"),
        "tanh": unary("Tanh"),
        "leakyrelu": unary("LeakyRelu", alpha=0.2),
        "elu": unary("Elu", alpha=0.5),
        "exp": unary("Exp"),
        "prelu": model("prelu", [helper.make_node("PRelu", ["x", "s"], ["y"])],
                       [("s", rng.uniform(0, 1, (5, 1, 1)), f32)]),
        "silu": model("silu", [helper.make_node("Sigmoid", ["x"], ["s"]),
                               helper.make_node("Mul", ["x", "s"], ["y"])], []),
        "mul_se": model("mul_se", [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
                                   helper.make_node("Mul", ["x", "p"], ["y"])], []),
        "sub_div_norm": model("sub_div_norm", [
            helper.make_node("Sub", ["x", "m"], ["t"]),
            helper.make_node("Div", ["t", "s"], ["y"])],
            [("m", rng.uniform(0, 1, (1, 5, 1, 1)), f32), ("s", rng.uniform(0.5, 1, (1, 5, 1, 1)), f32)]),
        "add_bcast": model("add_bcast", [helper.make_node("ReduceMax", ["x"], ["p"], axes=[2, 3]),
                                         helper.make_node("Add", ["p", "x"], ["y"])], []),
        "reducemean": model("reducemean", [helper.make_node("ReduceMean", ["x", "a"], ["y"], keepdims=0)],
                            [("a", [2, 3], i64)], opset=18, out_shape=[1, 5]),
        "pad_conv": model("pad_conv", [
            helper.make_node("Pad", ["x", "p"], ["px"]),
            helper.make_node("Conv", ["px", "w"], ["y"], kernel_shape=[3, 3])],
            [("p", [0, 0, 1, 1, 0, 0, 1, 1], i64), ("w", rng.standard_normal((5, 5, 3, 3)), f32)]),
        "split_slice": model("split_slice", [
            helper.make_node("Split", ["x", "sz"], ["a", "b"], axis=1),
            helper.make_node("Slice", ["b", "st", "en", "ax"], ["c"]),
            helper.make_node("Concat", ["c", "a"], ["y"], axis=1)],
            [("sz", [2, 3], i64), ("st", [1], i64), ("en", [3], i64), ("ax", [1], i64)],
            out_shape=(1, 4, "H", "W")),
        "shuffle": model("shuffle", [
            helper.make_node("Concat", ["x", "x"], ["c"], axis=1),
            helper.make_node("Reshape", ["c", "s1"], ["v"]),
            helper.make_node("Transpose", ["v"], ["t"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t", "s2"], ["y"])],
            [("s1", [1, 2, 5, 6, -1], i64), ("s2", [1, 10, 6, -1], i64)],
            out_shape=(1, 10, 6, "W"), in_shape=(1, 5, 6, "W")),
        "concat": model("concat", [helper.make_node("Relu", ["x"], ["r"]),
                                   helper.make_node("Concat", ["x", "r", "x"], ["y"], axis=1)], []),
    }
    hw = [helper.make_node("Shape", ["x"], ["s"]),
          helper.make_node("Gather", ["s", "i2"], ["h"], axis=0),
          helper.make_node("Gather", ["s", "i3"], ["w"], axis=0),
          helper.make_node("Unsqueeze", ["h", "a0"], ["hu"]),
          helper.make_node("Unsqueeze", ["w", "a0"], ["wu"]),
          helper.make_node("Slice", ["s", "st", "en"], ["nc"]),
          helper.make_node("Concat", ["nc", "hu", "wu"], ["c"], axis=0),
          helper.make_node("Cast", ["c"], ["sz"], to=TensorProto.INT64)]
    seeds.update({
        "resize_sizes": model("resize_sizes", [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])] + hw + [
            helper.make_node("Resize", ["p", "", "", "sz"], ["y"], mode="linear",
                             coordinate_transformation_mode="pytorch_half_pixel")],
            [("i2", 2, i64), ("i3", 3, i64), ("a0", [0], i64), ("st", [0], i64), ("en", [2], i64)],
            opset=13),
        "resize_scales": model("resize_scales", [
            helper.make_node("Resize", ["x", "roi", "sc"], ["y"], mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
            [("roi", [], f32), ("sc", [1, 1, 2, 3], f32)], opset=11, out_shape=(1, 5, "H2", "W3")),
        "upsample": model("upsample", [helper.make_node("Upsample", ["x", "sc"], ["y"], mode="linear")],
                          [("sc", [1, 1, 2, 2], f32)], opset=9, out_shape=(1, 5, "H2", "W2")),
    })
    w = rng.standard_normal((4, 5, 3, 3)).astype(f32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["f"]),
         helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)], "flatten_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w.reshape(4, 45), "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    seeds["flatten_gemm"] = m
    # Drawn last, so that the seeds above keep their bytes.
    seeds.update({
        "conv_transpose": model("conv_transpose", [
            helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["u"], kernel_shape=[2, 2],
                             strides=[2, 2]),
            helper.make_node("ConvTranspose", ["u", "w2"], ["y"], strides=[2, 2], group=5,
                             pads=[1, 1, 1, 1], output_padding=[1, 1])],
            [("w1", rng.standard_normal((5, 5, 2, 2)), f32), ("b1", rng.uniform(-1, 1, 5), f32),
             ("w2", rng.standard_normal((5, 1, 3, 3)), f32)], out_shape=(1, 5, "H4", "W4")),
        "conv_transpose_same": model("conv_transpose_same", [
            helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                             auto_pad="SAME_UPPER", dilations=[2, 1])],
            [("w", rng.standard_normal((5, 3, 3, 3)), f32)], out_shape=(1, 3, "H2", "W2")),
    })
    for name, m in seeds.items():
        with open(os.path.join(OUT, f"{name}.bin"), "wb") as f:
            f.write(b"\x01" + m.SerializeToString())
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks `primjit run` against onnxruntime on ONNX Resize with fractional scale factors
(docs/decisions/028-dyadic-resize-scales.md): for each pair of factors, mode (nearest in
every rounding mode, linear) and coordinate mode, one model at symbolic H and W, run at five
sizes from 1x1. An input whose output is empty must be refused (onnxruntime returns an empty
tensor). Prints each mismatch and the count.

usage: resize_scales.py PRIMJIT_BINARY   (needs numpy, onnx and onnxruntime)
"""
import itertools
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

FACTORS = [[0.5, 0.5], [1.5, 0.75], [2.5, 0.25], [0.375, 3.0], [1.25, 2.0]]
COORDS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SIZES = [(1, 1), (3, 7), (8, 8), (13, 5), (17, 33)]


def model(path, scales, mode, coord, nearest):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    sc = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1] + scales)
    attrs = dict(mode=mode, coordinate_transformation_mode=coord)
    if mode == "nearest":
        attrs["nearest_mode"] = nearest
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    graph = helper.make_graph([node], "r", [x], [y], initializer=[sc])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def main():
    cli = sys.argv[1]
    tmp = tempfile.mkdtemp()
    path, xin, yout = (os.path.join(tmp, n) for n in ["r.onnx", "x.npy", "y.npy"])
    rng = np.random.default_rng(0)
    bad = total = 0
    for scales, mode, coord, nearest in itertools.product(
        FACTORS, ["nearest", "linear"], COORDS, NEAREST
    ):
        if mode == "linear" and nearest != "floor":
            continue
        model(path, scales, mode, coord, nearest)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for h, w in SIZES:
            x = rng.standard_normal((1, 5, h, w)).astype(np.float32)
            want = session.run(None, {"x": x})[0]
            np.save(xin, x)
            run = subprocess.run(
                [cli, "run", path, "--dims", f"H={h},W={w}", "--input", xin, "--output", yout],
                capture_output=True,
                text=True,
            )
            total += 1
            case = f"{scales} {mode} {coord} {nearest} {h}x{w}"
            if run.returncode != 0:
                if 0 not in want.shape:
                    bad += 1
                    print("refused", case, run.stderr.strip())
                continue
            got = np.load(yout)
            if got.shape != want.shape:
                bad += 1
                print("shape", case, got.shape, want.shape)
                continue
            err = np.abs(got - want).max() / max(1e-6, np.abs(want).max())
            if err > 1e-5:
                bad += 1
                print("differs", case, err)
    print(f"{total} cases, {bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

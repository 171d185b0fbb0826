"""Resident memory stays flat over many calls: outputs, inputs and workspaces are not leaked."""

from __future__ import annotations

import gc

import numpy as np

import primjit
from conftest import EXAMPLES, random_input, rss_kb

CALLS = 10_000


def test_rss_stays_flat_over_ten_thousand_small_calls():
    engine = primjit.Engine(threads=1)
    model = engine.load(EXAMPLES / "residual.ir", random_params=0)
    x = random_input((1, 4, 6, 8))
    inputs = {"x": x}
    # Warm up: primitives compiled, workspace and allocator pools at their steady size.
    for _ in range(1_000):
        model(x)
        model.run(inputs)
    gc.collect()
    before = rss_kb()
    for _ in range(CALLS // 2):
        model(x)
        model.run(inputs)
    gc.collect()
    growth = rss_kb() - before
    # One leaked output array (1x8x3x4 floats and its object) per call would be over 4 MB.
    assert growth < 1024, f"RSS grew by {growth} kB over {CALLS} calls"
    assert engine.cache_stats()["compiles"] == engine.cache_stats()["entries"]


def test_rss_stays_flat_over_ten_thousand_primitive_calls():
    engine = primjit.Engine(threads=1)
    # A Winograd convolution: each call without a scratch argument allocates its own.
    op = engine.compile_op("mb1ic8ih8iw8oc8kh3ph1", layout="nchw4c", conv_algo="winograd")
    src, weights, dst, _scratch = (np.zeros(b["len"], np.float32) for b in op.buffers())
    packed = op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    assert packed.shape == weights.shape
    for _ in range(1_000):
        op.execute(src, dst, packed)
    gc.collect()
    before = rss_kb()
    for _ in range(CALLS):
        op.execute(src, dst, packed)
        op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    gc.collect()
    growth = rss_kb() - before
    # A leaked scratch (27 KiB) or packed weights (9 KiB) per call would be over 90 MB.
    assert growth < 1024, f"RSS grew by {growth} kB over {CALLS} calls"

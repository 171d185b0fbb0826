"""The engine's cache as Python sees it: statistics, entries, budget changes; and single
primitives against numpy."""

from __future__ import annotations

import re
import numpy as np
import pytest

import primjit
from conftest import EXAMPLES, REPO, random_input


def test_version_is_the_workspace_version():
    workspace = (REPO / "Cargo.toml").read_text().split("[workspace.package]")[1]
    version = re.search(r'^version = "(.+)"$', workspace, re.M)
    assert version and primjit.__version__ == version.group(1)


def test_every_public_name_has_a_docstring():
    names = [n for n in primjit.__all__ if n != "__version__"]
    for name in names:
        obj = getattr(primjit, name)
        assert obj.__doc__, name
        for attr, member in vars(obj).items():
            if not attr.startswith("_"):
                assert getattr(member, "__doc__", None), f"{name}.{attr}"


def test_stats_count_compiles_hits_and_bytes():
    engine = primjit.Engine(budget="64MiB", threads=1)
    stats = engine.cache_stats()
    assert stats["entries"] == 0 and stats["budget"] == 64 << 20 and stats["capacity"] is None
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    model(random_input((1, 3, 9, 11)))
    first = engine.cache_stats()
    assert first["compiles"] == first["entries"] == first["misses"] == 3
    assert first["hits"] == 0 and first["bytes"] > 0 and first["peak_bytes"] == first["bytes"]
    model(random_input((1, 3, 9, 11)))
    second = engine.cache_stats()
    assert second["hits"] == 3 and second["compiles"] == 3
    model(random_input((1, 3, 9, 12)))  # a new width: three more primitives
    assert engine.cache_stats()["entries"] == 6


def test_entries_are_listed_most_recent_first_with_their_costs():
    engine = primjit.Engine(threads=1)
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    model(random_input((1, 3, 9, 11)))
    model(random_input((1, 3, 9, 11)))
    entries = engine.cache_entries()
    assert len(entries) == 3
    for e in entries:
        assert set(e) == {"key", "bytes", "code_bytes", "mapped_bytes", "heap_bytes", "hits", "idle_s", "compile_time_s"}
        assert e["key"].startswith("conv mb1")
        assert e["bytes"] == e["mapped_bytes"] + e["heap_bytes"] and e["hits"] == 1
        assert e["mapped_bytes"] % 4096 == 0 and e["code_bytes"] <= e["mapped_bytes"]
    # The last node ran last: the 1x1 projection, 4 channels in, 6 out.
    assert re.match(r"conv mb1ic4ih5iw5oc6", entries[0]["key"]), entries[0]["key"]
    assert sum(e["bytes"] for e in entries) == engine.cache_stats()["bytes"]


def test_budget_changes_show_in_the_stats():
    engine = primjit.Engine(budget="64MiB", threads=1)
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    for w in range(11, 23, 2):  # stem outputs 5 to 10 wide: three new keys per width
        model(random_input((1, 3, 9, w)))
    full = engine.cache_stats()
    assert full["entries"] == 18 and full["evictions"] == 0
    # A budget below what the cache holds evicts the least recently used at once.
    smaller = full["bytes"] // 2
    engine.set_budget(smaller)
    stats = engine.cache_stats()
    assert stats["budget"] == smaller
    assert stats["bytes"] <= smaller and stats["evictions"] > 0
    assert stats["evicted_bytes"] == full["bytes"] - stats["bytes"]
    engine.set_budget("1MiB")
    assert engine.cache_stats()["budget"] == 1 << 20 and engine.budget == "1MiB"
    engine.set_budget("unlimited")
    assert engine.cache_stats()["budget"] is None and engine.budget == "unlimited"
    engine.set_budget(0)
    stats = engine.cache_stats()
    assert stats["entries"] == 0 and stats["bytes"] == 0
    # With no room, each call compiles again.
    model(random_input((1, 3, 9, 11)))
    assert engine.cache_stats()["compiles"] == full["compiles"] + 3
    assert engine.cache_stats()["entries"] == 0


def test_capacity_and_clear():
    engine = primjit.Engine(capacity=4, threads=1)
    assert engine.capacity == 4 and engine.cache_stats()["capacity"] == 4
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    model(random_input((1, 3, 9, 11)))
    model(random_input((1, 3, 9, 12)))
    assert engine.cache_stats()["entries"] == 4
    engine.set_capacity(1)
    assert engine.cache_stats()["entries"] == 1
    engine.set_capacity(None)
    model(random_input((1, 3, 9, 15)))  # three keys the kept one is not
    assert engine.cache_stats()["entries"] == 4
    evictions = engine.cache_stats()["evictions"]
    engine.clear()
    stats = engine.cache_stats()
    assert stats["entries"] == 0 and stats["bytes"] == 0 and stats["evictions"] == evictions


def test_dynamic_mode_compiles_one_primitive_per_node_for_every_width():
    engine = primjit.Engine(threads=1)
    model = engine.load(EXAMPLES / "conv_basics.ir", mode="dynamic", random_params=0)
    exact = primjit.Engine(threads=1).load(EXAMPLES / "conv_basics.ir", random_params=0)
    assert model.mode == "dynamic" and exact.mode == "exact"
    for w in (11, 12, 13, 14):
        x = random_input((1, 3, 9, w))
        np.testing.assert_allclose(model(x), exact(x), rtol=1e-5, atol=1e-5)
    stats = engine.cache_stats()
    assert stats["compiles"] == 3 and stats["hits"] == 9
    assert all("*" in e["key"] for e in engine.cache_entries())


def test_model_describes_itself(engine):
    model = engine.load(EXAMPLES / "symbolic.ir", random_params=0)
    assert model.inputs == {"a": [1, 2, "H", "W"], "b": [1, 2, "H", "W"]}
    assert model.outputs == ["feature", "pooled"]
    assert model.conv_algo == engine.conv_algo == "auto"
    assert model.path.endswith("symbolic.ir")
    assert "symbolic.ir" in repr(model) and "%a: [1, 2, H, W]" in repr(model)
    assert repr(engine) == 'primjit.Engine(budget="64MiB", capacity=None, threads=1, conv_algo="auto")'


def numpy_conv(x, w, b, pad):
    """A direct NCHW convolution with unit strides, for comparison."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, oc, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    return out + b[None, :, None, None]


def test_a_compiled_op_matches_numpy(engine):
    op = engine.compile_op('mb1ic8ih10iw12oc16oh10ow12kh3kw3ph1pw1n"tiny"')
    assert op.key == op.problem == "conv mb1ic8ih10iw12oc16oh10ow12kh3kw3sh1sw1ph1pw1 bias nchw>nchw"
    assert op.name == "tiny" and op.flops == 2 * 16 * 10 * 12 * 8 * 9
    memory = op.memory()
    assert memory["total"] == memory["mapped"] + memory["heap"] and memory["code"] > 0
    assert [b["role"] for b in op.buffers()] == ["src", "weights", "dst"]
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 8, 10, 12)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 8, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 16).astype(np.float32)
    y = np.zeros((1, 16, 10, 12), np.float32)
    op.execute(x, y, op.pack_weights(w, b))
    np.testing.assert_allclose(y, numpy_conv(x, w, b, 1), rtol=1e-4, atol=1e-4)
    # The engine cached it: compiling again is a hit on the same primitive.
    engine.compile_op('mb1ic8ih10iw12oc16oh10ow12kh3kw3ph1pw1')
    assert engine.cache_stats()["hits"] == 1


def test_a_runtime_width_op_runs_at_the_descriptor_width(engine):
    op = engine.compile_op("mb1ic4ih6iw37*oc4kh3ph1")
    assert "iw*" in op.key and "iw37" in op.problem
    fixed = primjit.Engine(threads=1).compile_op("mb1ic4ih6iw37oc4kh3ph1")
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (1, 4, 6, 37)).astype(np.float32)
    w = op.pack_weights(rng.uniform(-1, 1, (4, 4, 3, 3)).astype(np.float32))
    y1, y2 = np.zeros((1, 4, 6, 37), np.float32), np.zeros((1, 4, 6, 37), np.float32)
    op.execute(x, y1, w)
    fixed.execute(x, y2, w)
    assert y1.tobytes() == y2.tobytes()


def test_a_pooling_op_matches_numpy(engine):
    op = engine.compile_op("mb1ic4ih6iw8kh2sh2", pool="max", layout="nchw")
    x = random_input((1, 4, 6, 8))
    y = np.zeros((1, 4, 3, 4), np.float32)
    op.execute(x, y)
    assert np.array_equal(y, x.reshape(1, 4, 3, 2, 4, 2).max(axis=(3, 5)))


def to_nchw4c(x):
    """NCHW to nChw4c (channels in blocks of four, zero-padded), as a flat array."""
    n, c, h, w = x.shape
    blocks = -(-c // 4)
    padded = np.zeros((n, blocks * 4, h, w), np.float32)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, blocks, 4, h, w).transpose(0, 1, 3, 4, 2)).ravel()


def test_a_winograd_op_matches_the_direct_one(engine):
    text = "mb1ic8ih12iw20oc8kh3ph1"
    winograd = engine.compile_op(text, layout="nchw4c", conv_algo="winograd")
    direct = engine.compile_op(text, layout="nchw4c", conv_algo="direct")
    assert "alg:wino" in winograd.key and "alg:wino" not in direct.key
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (1, 8, 12, 20)).astype(np.float32)
    w = rng.uniform(-1, 1, (8, 8, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 8).astype(np.float32)
    want = numpy_conv(x, w, b, 1)
    for op in (winograd, direct):
        [dst_len] = [buf["len"] for buf in op.buffers() if buf["role"] == "dst"]
        y = np.zeros(dst_len, np.float32)
        op.execute(to_nchw4c(x), y, op.pack_weights(w, b))
        np.testing.assert_allclose(y, to_nchw4c(want), rtol=1e-4, atol=1e-4)
    # A Winograd convolution takes scratch: allocated for the call, or given and checked.
    assert winograd.scratch_len > 0 and direct.scratch_len == 0
    src, packed = to_nchw4c(x), winograd.pack_weights(w, b)
    y = np.zeros(winograd.buffers()[2]["len"], np.float32)
    winograd.execute(src, y, packed, scratch=np.zeros(winograd.scratch_len, np.float32))
    np.testing.assert_allclose(y, to_nchw4c(want), rtol=1e-4, atol=1e-4)
    with pytest.raises(primjit.ExecError, match="the scratch buffer holds 3 floats"):
        winograd.execute(src, y, packed, scratch=np.zeros(3, np.float32))
    with pytest.raises(primjit.ExecError, match="takes no scratch buffer"):
        direct.execute(src, y, direct.pack_weights(w, b), scratch=np.zeros(8, np.float32))
    # The engine's choice is the default: "auto" picks Winograd from 8 channels and, at fixed
    # extents, 16 output tiles of 4x4 (this 12x20 output has 15; a 16x20 one 20).
    assert "alg:wino" not in engine.compile_op(text, layout="nchw4c").key
    assert "alg:wino" in engine.compile_op("mb1ic8ih16iw20oc8kh3ph1", layout="nchw4c").key

"""The vector tier cap, `Engine(max_isa=...)`: strictly parsed, never above the host's."""

import numpy as np
import pytest

import primjit

TIERS = ["x128", "avx2", "avx512"]


def test_the_default_tier_is_the_hosts_widest():
    engine = primjit.Engine(threads=1)
    assert engine.isa in TIERS
    assert primjit.Engine(threads=1, max_isa=None).isa == engine.isa


def test_a_cap_lowers_the_tier():
    assert primjit.Engine(threads=1, max_isa="x128").isa == "x128"


@pytest.mark.parametrize("bad", ["AVX2", "avx", "avx512f", "", 2, None.__class__])
def test_a_malformed_cap_is_a_config_error(bad):
    with pytest.raises(primjit.ConfigError, match="max_isa"):
        primjit.Engine(threads=1, max_isa=bad)


def test_a_cap_above_the_host_names_its_tiers():
    host = primjit.Engine(threads=1).isa
    above = TIERS[TIERS.index(host) + 1 :]
    if not above:
        pytest.skip(f"no tier above this host's ({host}) to refuse")
    with pytest.raises(primjit.ConfigError, match="above this host's: it runs x128"):
        primjit.Engine(threads=1, max_isa=above[0])


def test_models_run_at_every_tier_the_host_has(tmp_path):
    graph = tmp_path / "conv.ir"
    graph.write_text(
        "graph g {\n"
        "  input %x: f32[1, 16, 6, W]\n"
        "  param @w: f32[32, 16, 3, 3]\n"
        "  %c = conv2d(%x, @w, pads=[1, 1, 1, 1], post=[relu])\n"
        "  output y = %c\n"
        "}\n"
    )
    host = primjit.Engine(threads=1).isa
    x = np.random.default_rng(0).standard_normal((1, 16, 6, 19), dtype=np.float32)
    results = []
    for tier in TIERS[: TIERS.index(host) + 1]:
        engine = primjit.Engine(threads=1, max_isa=tier)
        model = engine.load(graph, random_params=3)
        results.append(np.asarray(model(x)))
    for y in results[1:]:
        np.testing.assert_allclose(y, results[0], rtol=1e-5, atol=1e-5)

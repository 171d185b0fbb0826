"""The package computes what the command line computes, to the last bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import primjit
from conftest import EXAMPLES, REPO, TRUNK, random_input, run_cli, write_safetensors

ONNX_FAMILIES = REPO / "tests" / "onnx" / "families"

# Every example with one input, at small extents for its symbols.
SINGLE_INPUT = {
    "conv_basics.ir": (1, 3, 9, 11),
    "conv_groups.ir": (2, 4, 8, 8),
    "fused_pool.ir": (1, 3, 12, 11),
    "pooling.ir": (1, 3, 12, 10),
    "residual.ir": (1, 4, 6, 13),
    "bnfold.ir": (1, 3, 8, 8),
}


def cli_outputs(
    cli: Path, tmp: Path, ir: Path, inputs: dict[str, np.ndarray], outputs: list[str], params: list[str]
) -> dict[str, np.ndarray]:
    args = ["run", str(ir), *params]
    for name, x in inputs.items():
        np.save(tmp / f"in_{name}.npy", x)
        args += ["--input", f"{name}={tmp / f'in_{name}.npy'}"]
    for name in outputs:
        args += ["--output", f"{name}={tmp / f'out_{name}.npy'}"]
    run_cli(cli, args)
    return {name: np.load(tmp / f"out_{name}.npy") for name in outputs}


def assert_bitwise_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == np.float32
        assert got[name].shape == want[name].shape, name
        assert got[name].tobytes() == want[name].tobytes(), f"output {name} differs"


@pytest.mark.parametrize("example", sorted(SINGLE_INPUT))
def test_examples_match_the_cli_bit_for_bit(cli, tmp_path, engine, example):
    ir = EXAMPLES / example
    x = random_input(SINGLE_INPUT[example], seed=7)
    model = engine.load(ir, random_params=0)
    want = cli_outputs(cli, tmp_path, ir, {"x": x}, model.outputs, ["--random-params", "0"])
    assert_bitwise_equal(model.run({"x": x}), want)
    # The call form gives the same arrays, in the graph's output order.
    called = model(x)
    if len(model.outputs) == 1:
        called = (called,)
    assert_bitwise_equal(dict(zip(model.outputs, called)), want)


def test_two_input_graph_matches_the_cli_bit_for_bit(cli, tmp_path, engine):
    ir = EXAMPLES / "symbolic.ir"
    inputs = {"a": random_input((1, 2, 9, 14), 1), "b": random_input((1, 2, 9, 14), 2)}
    model = engine.load(ir, random_params=3)
    want = cli_outputs(cli, tmp_path, ir, inputs, model.outputs, ["--random-params", "3"])
    assert_bitwise_equal(model.run(inputs), want)
    # Names may carry the IR's `%`.
    assert_bitwise_equal(model.run({"%a": inputs["a"], "%b": inputs["b"]}), want)


@pytest.mark.parametrize("mode", ["exact", "dynamic"])
def test_trunk_matches_the_cli_bit_for_bit(cli, tmp_path, mode):
    x = random_input((1, 3, 320, 200), seed=11)
    model = primjit.Engine(threads=2).load(TRUNK, mode=mode, random_params=0)
    want = cli_outputs(cli, tmp_path, TRUNK, {"x": x}, model.outputs, ["--random-params", "0"])
    got = model(x)
    assert got.shape == (1, 256, 20, 13)
    assert_bitwise_equal({model.outputs[0]: got}, want)


def test_file_and_dict_params_match_the_cli_bit_for_bit(cli, tmp_path, engine):
    ir = EXAMPLES / "residual.ir"
    model = engine.load(ir, random_params=0)
    rng = np.random.default_rng(5)
    shapes = {
        "conv1.weight": (4, 4, 3, 3),
        "bn1.weight": (4,),
        "bn1.bias": (4,),
        "bn1.running_mean": (4,),
        "bn1.running_var": (4,),
        "conv2.weight": (4, 4, 3, 3),
        "fused.weight": (4, 4, 3, 3),
        "down.weight": (8, 4, 1, 1),
    }
    params = {n: rng.uniform(0.5, 1.0, s).astype(np.float32) for n, s in shapes.items()}
    # A tensor the graph does not declare is ignored, as in a full model's state dict, with a
    # warning that names it.
    params["fc.weight"] = np.zeros((2, 2), dtype=np.float32)
    st = tmp_path / "p.safetensors"
    write_safetensors(st, params)
    x = random_input((1, 4, 6, 9), seed=3)
    want = cli_outputs(cli, tmp_path, ir, {"x": x}, model.outputs, ["--params", str(st)])
    with pytest.warns(UserWarning, match="1 tensors the graph does not use, ignored: fc.weight"):
        from_file = engine.load(ir, params=st)
    with pytest.warns(UserWarning, match="p.safetensors: 1 tensors"):
        from_str = engine.load(str(ir), params=str(st))
    with pytest.warns(UserWarning, match="params: 1 tensors"):
        from_dict = engine.load(ir, params={f"@{n}" if n.startswith("bn") else n: a for n, a in params.items()})
    for m in (from_file, from_str, from_dict):
        assert_bitwise_equal(m.run({"x": x}), want)
    # The random parameters are others, so the outputs differ.
    assert model(x).tobytes() != want["y"].tobytes()


def test_strided_inputs_are_converted_to_the_same_result(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    wide = random_input((1, 3, 9, 22), seed=4)
    strided = wide[:, :, :, ::2]
    assert not strided.flags.c_contiguous
    fortran = np.asfortranarray(strided)
    want = model(np.ascontiguousarray(strided))
    assert model(strided).tobytes() == want.tobytes()
    assert model(fortran).tobytes() == want.tobytes()


def test_outputs_are_new_writable_arrays(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    x = random_input((1, 3, 9, 11))
    y1, y2 = model(x), model(x)
    assert y1.flags.c_contiguous and y1.flags.writeable
    y1[...] = 0
    assert np.any(y2 != 0), "outputs of two calls share no memory"
    # The input is only read.
    assert np.array_equal(x, random_input((1, 3, 9, 11)))


@pytest.mark.parametrize("conv_algo", ["direct", "winograd"])
def test_conv_algorithms_match_the_cli_bit_for_bit(cli, tmp_path, conv_algo):
    x = random_input((1, 3, 320, 64), seed=12)
    engine = primjit.Engine(threads=1, conv_algo=conv_algo)
    model = engine.load(TRUNK, random_params=0)
    assert model.conv_algo == conv_algo
    want = cli_outputs(
        cli, tmp_path, TRUNK, {"x": x}, model.outputs,
        ["--random-params", "0", "--conv-algo", conv_algo],
    )
    assert_bitwise_equal({model.outputs[0]: model(x)}, want)
    winograd_keys = [e["key"] for e in engine.cache_entries() if "alg:wino" in e["key"]]
    assert bool(winograd_keys) == (conv_algo == "winograd")


@pytest.mark.parametrize("family", ["resnet.onnx", "vgg.onnx", "mobilenet.onnx", "deeplab.onnx"])
def test_onnx_models_match_the_cli_bit_for_bit(cli, tmp_path, engine, family):
    path = ONNX_FAMILIES / family
    # Its initializers are its parameters.
    model = engine.load(path)
    assert model.inputs == {"x": [2, 3, "H", "W"]}
    x = random_input((2, 3, 32, 40), seed=9)
    want = cli_outputs(cli, tmp_path, path, {"x": x}, model.outputs, [])
    assert_bitwise_equal(model.run({"x": x}), want)
    if family == "resnet.onnx":
        # A classifier's [N, K] output comes back as the file gives it.
        assert want["fc_23"].shape == (2, 10)


def test_params_override_an_onnx_models_initializers(cli, tmp_path, engine):
    path = ONNX_FAMILIES / "resnet.onnx"
    x = random_input((2, 3, 16, 16), seed=2)
    plain = engine.load(path)(x)
    # Random parameters replace every initializer; a dict replaces the ones it names.
    assert engine.load(path, random_params=0)(x).tobytes() != plain.tobytes()
    assert engine.load(path, params={})(x).tobytes() == plain.tobytes()

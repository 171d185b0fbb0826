"""The onnxruntime-style session, loading from bytes and by content, .npz parameters, override
names, the thread bound and the docstrings help() shows."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import primjit
from conftest import REPO, TRUNK, random_input, run_cli, write_safetensors

FAMILIES = REPO / "tests" / "onnx" / "families"
RESNET = FAMILIES / "resnet.onnx"
BNFOLD = REPO / "ir" / "examples" / "bnfold.ir"


def one_thread() -> primjit.SessionOptions:
    options = primjit.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def test_the_onnxruntime_loop_runs_on_bytes_and_matches_the_fixture():
    s = primjit.InferenceSession(RESNET.read_bytes(), one_thread())
    x = np.load(FAMILIES / "resnet.input.npy")
    y = s.run(None, {s.get_inputs()[0].name: x})[0]
    want = np.load(FAMILIES / "resnet.expected.npy")
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, want, atol=1e-4, rtol=1e-4)
    # From the path, the same values.
    by_path = primjit.InferenceSession(str(RESNET), one_thread())
    assert by_path.run(None, {by_path.get_inputs()[0].name: x})[0].tobytes() == y.tobytes()


def test_node_args_and_metadata_are_onnxruntime_shaped():
    s = primjit.InferenceSession(RESNET, one_thread())
    (i,) = s.get_inputs()
    assert isinstance(i.name, str) and i.type == "tensor(float)"
    assert len(i.shape) == 4 and all(isinstance(d, (int, str)) for d in i.shape)
    outputs = s.get_outputs()
    assert [o.type for o in outputs] == ["tensor(float)"] * len(outputs)
    # The classifier's output is [N, K] as the file gives it, not the IR's [N, K, 1, 1].
    assert len(outputs[0].shape) == 2
    meta = s.get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description"):
        assert isinstance(getattr(meta, field), str)
    assert isinstance(meta.version, int) and isinstance(meta.custom_metadata_map, dict)
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert primjit.get_available_providers() == ["CPUExecutionProvider"]


def test_run_selects_outputs_by_name_and_refuses_unknown_ones():
    s = primjit.InferenceSession(RESNET, one_thread())
    x = {s.get_inputs()[0].name: np.load(FAMILIES / "resnet.input.npy")}
    name = s.get_outputs()[0].name
    (y,) = s.run([name], x)
    assert y.tobytes() == s.run(None, x)[0].tobytes()
    with pytest.raises(primjit.ShapeError, match="'nope' is not an output"):
        s.run(["nope"], x)


def test_other_providers_warn_and_run_on_the_cpu():
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider ignored"):
        s = primjit.InferenceSession(
            RESNET, one_thread(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    assert s.get_providers() == ["CPUExecutionProvider"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        primjit.InferenceSession(RESNET, one_thread(), providers=["CPUExecutionProvider"])


def test_session_options_refuse_unknown_settings():
    options = primjit.SessionOptions()
    options.graph_optimization_level = 99  # onnxruntime's, accepted without effect
    with pytest.raises(AttributeError):
        options.intra_op_num_thread = 1  # type: ignore[attr-defined]
    options.intra_op_num_threads = 10**6
    with pytest.raises(primjit.ConfigError, match="to 1024"):
        primjit.InferenceSession(RESNET, options)


def test_ir_text_loads_from_bytes_and_its_session_runs(engine):
    data = TRUNK.read_bytes()
    model = engine.load_bytes(data, random_params=0)
    assert model.path == "<bytes>"
    x = random_input((1, 3, 320, 64))
    assert model(x).tobytes() == engine.load(TRUNK, random_params=0)(x).tobytes()
    assert model.metadata["graph_name"] == "resnet34_trunk"
    # A session on IR text with parameters from a dict runs it too.
    params = {n: np.ascontiguousarray(v) for n, v in bnfold_params(engine).items()}
    s = primjit.InferenceSession(BNFOLD.read_bytes(), one_thread(), params=params)
    x = random_input((1, 3, 8, 8))
    (y,) = s.run(None, {"x": x})
    assert y.tobytes() == engine.load(BNFOLD, params=params)(x).tobytes()


def test_the_format_is_told_by_content_not_the_name(engine, tmp_path):
    onnx_named_ir = tmp_path / "model.onnx"
    shutil.copy(TRUNK, onnx_named_ir)
    assert engine.load(onnx_named_ir, random_params=0).inputs == {"x": [1, 3, 320, "W"]}
    no_suffix = tmp_path / "model"
    shutil.copy(RESNET, no_suffix)
    x = np.load(FAMILIES / "resnet.input.npy")
    got = engine.load(no_suffix)(x)
    assert got.tobytes() == engine.load(RESNET)(x).tobytes()


def test_garbage_is_a_clear_error(engine, tmp_path):
    latin1 = tmp_path / "latin1.ir"
    latin1.write_bytes(b"# caf\xe9\ngraph g {}\n")
    with pytest.raises(primjit.IrError, match="not UTF-8 at byte 5"):
        engine.load(latin1)
    with pytest.raises(primjit.IrError, match="<bytes>"):
        engine.load_bytes(b"\x08\x07\xff\xff\xff")
    with pytest.raises(TypeError, match="data: expected bytes"):
        engine.load_bytes("graph g {}")  # type: ignore[arg-type]


BNFOLD_SHAPES = {
    "conv1.weight": (6, 3, 3, 3),
    "conv1.bias": (6,),
    "conv2.weight": (6, 6, 1, 1),
    **{f"bn{i}.{k}": (6,) for i in (1, 2, 3) for k in ("weight", "bias", "running_mean", "running_var")},
}


def bnfold_params(engine) -> dict[str, np.ndarray]:
    """Values for bnfold.ir's declared parameters (its derived ones are computed from them)."""
    rng = np.random.default_rng(5)
    return {n: rng.uniform(0.5, 1.5, s).astype(np.float32) for n, s in BNFOLD_SHAPES.items()}


def test_npz_parameters_load_as_safetensors_do(engine, tmp_path):
    params = bnfold_params(engine)
    np.savez(tmp_path / "p.npz", **params)
    np.savez_compressed(tmp_path / "pc.npz", **params)
    write_safetensors(tmp_path / "p.safetensors", params)
    x = random_input((1, 3, 8, 8))
    want = engine.load(BNFOLD, params=tmp_path / "p.safetensors")(x)
    for name in ("p.npz", "pc.npz"):
        got = engine.load(BNFOLD, params=tmp_path / name)(x)
        assert got.tobytes() == want.tobytes(), name
    # Told by content: an .npz under another name still loads.
    shutil.copy(tmp_path / "p.npz", tmp_path / "weights.bin")
    assert engine.load(BNFOLD, params=tmp_path / "weights.bin")(x).tobytes() == want.tobytes()


def test_a_state_dict_with_extra_names_warns_of_them(engine, tmp_path):
    params = bnfold_params(engine)
    extra = dict(params, **{"fc.weight": np.zeros(3, np.float32), "fc.bias": np.zeros(2, np.float32)})
    with pytest.warns(UserWarning, match=r"2 tensors the graph does not use, ignored: fc\.bias, fc\.weight|fc\.weight, fc\.bias"):
        engine.load(BNFOLD, params=extra)
    np.savez(tmp_path / "extra.npz", **extra)
    with pytest.warns(UserWarning, match="extra.npz: 2 tensors the graph does not use"):
        engine.load(BNFOLD, params=tmp_path / "extra.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.load(BNFOLD, params=params)


def test_overrides_of_an_onnx_model_must_name_its_parameters(engine):
    model = engine.load(RESNET)
    del model
    with pytest.raises(primjit.ParamError) as info:
        engine.load(RESNET, params={"conv1.wieght": np.zeros(3, np.float32), "fc.b": np.zeros(1, np.float32)})
    message = str(info.value)
    assert "params names parameters the graph does not have: @conv1.wieght, @fc.b" in message
    assert "its parameters: @" in message


def test_thread_counts_above_the_bound_fail_at_once():
    with pytest.raises(primjit.ConfigError, match=r"threads 1000000: expected 0 \(one per core\) to 1024"):
        primjit.Engine(threads=10**6)
    assert primjit.Engine(threads=None).threads >= 1


def test_thread_bound_applies_to_the_environment(monkeypatch):
    monkeypatch.setenv("PRIMJIT_THREADS", "65535")
    with pytest.raises(primjit.ConfigError, match="PRIMJIT_THREADS=65535: expected 0 .all cores. to 1024 threads"):
        primjit.Engine.from_env()


PUBLIC = [
    primjit.Engine,
    primjit.Model,
    primjit.Primitive,
    primjit.InferenceSession,
    primjit.SessionOptions,
    primjit.NodeArg,
    primjit.ModelMetadata,
]


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_every_public_method_has_a_docstring(cls):
    assert cls.__doc__ and len(cls.__doc__.strip()) > 20
    for name in dir(cls):
        if name.startswith("_") and name != "__call__":
            continue
        member = getattr(cls, name)
        if not callable(member) and not isinstance(member, property):
            continue
        doc = getattr(member, "__doc__", None)
        assert doc and doc.strip() and doc.strip() != "Call self as a function.", f"{cls.__name__}.{name}"


def test_help_of_call_explains_it():
    text = primjit.Model.__call__.__doc__ or ""
    assert "single input" in text and "ShapeError" in text


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_the_typed_example_passes_mypy_strict():
    example = Path(__file__).with_name("typed_example.py")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir=/dev/null", str(example)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_cli_reads_npz_and_notes_unused_names(cli, tmp_path, engine):
    params = bnfold_params(engine)
    extra = dict(params, unused_one=np.zeros(2, np.float32))
    np.savez(tmp_path / "extra.npz", **extra)
    x = random_input((1, 3, 8, 8))
    np.save(tmp_path / "x.npy", x)
    done = run_cli(
        cli,
        ["run", str(BNFOLD), "--params", str(tmp_path / "extra.npz"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")],
    )
    assert "1 tensors the graph does not use, ignored: unused_one" in done.stderr
    want = engine.load(BNFOLD, params=params)(x)
    assert np.load(tmp_path / "y.npy").tobytes() == want.tobytes()


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed"
)
def test_the_session_matches_onnxruntime_within_1e_4():
    import onnxruntime as ort  # type: ignore[import-not-found]

    for family in ("resnet", "mobilenet", "vgg"):
        path = FAMILIES / f"{family}.onnx"
        x = np.load(FAMILIES / f"{family}.input.npy")
        theirs = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"])
        ours = primjit.InferenceSession(path.read_bytes(), one_thread())
        assert [i.name for i in ours.get_inputs()] == [i.name for i in theirs.get_inputs()]
        assert [o.name for o in ours.get_outputs()] == [o.name for o in theirs.get_outputs()]
        feed = {theirs.get_inputs()[0].name: x}
        for a, b in zip(ours.run(None, feed), theirs.run(None, feed)):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=family)


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed"
)
def test_same_padding_over_symbolic_extents_matches_onnxruntime_at_every_size():
    """SAME_UPPER and SAME_LOWER convs and pools at stride 2 over symbolic H and W: one session
    runs every size, odd and even, as onnxruntime does."""
    import onnxruntime as ort  # type: ignore[import-not-found]

    path = REPO / "tests" / "onnx" / "zoo" / "same.onnx"
    theirs = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"])
    ours = primjit.InferenceSession(path.read_bytes(), one_thread())
    rng = np.random.default_rng(7)
    for h, w in ((7, 9), (8, 8), (9, 12), (1, 1), (10, 33)):
        x = rng.uniform(-1, 1, (2, 3, h, w)).astype(np.float32)
        (a,) = ours.run(None, {"x": x})
        (b,) = theirs.run(None, {"x": x})
        assert a.shape == b.shape, (h, w)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=f"{h}x{w}")

"""Each kind of bad input raises its documented exception, with the Rust message."""

from __future__ import annotations

import collections.abc
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import primjit
from conftest import BAD, EXAMPLES, random_input, write_safetensors

CONV = "mb1ic8ih10iw12oc8oh10ow12kh3kw3ph1pw1"


def test_the_exceptions_form_one_hierarchy():
    value_errors = [
        primjit.IrError,
        primjit.ParamError,
        primjit.ShapeError,
        primjit.ExecError,
        primjit.DescriptorError,
        primjit.ConfigError,
    ]
    for cls in value_errors:
        assert issubclass(cls, primjit.Error) and issubclass(cls, ValueError), cls
    assert issubclass(primjit.DtypeError, primjit.Error)
    assert issubclass(primjit.DtypeError, TypeError)
    assert issubclass(primjit.CompileError, primjit.Error)
    assert issubclass(primjit.CompileError, RuntimeError)
    assert not issubclass(primjit.CompileError, ValueError)


# ---- loading ----


def test_a_syntax_error_is_an_ir_error_located_in_the_file(engine):
    path = BAD / "unknown_op.ir"
    with pytest.raises(primjit.IrError) as e:
        engine.load(path)
    message = str(e.value)
    assert message.startswith(f"{path}:5:8: error: unknown op `softmax`"), message
    assert "%s = softmax(%x)" in message and "^" in message


def test_an_invalid_graph_is_an_ir_error_located_in_the_file(engine):
    path = BAD / "channel_mismatch.ir"
    with pytest.raises(primjit.IrError, match=r"channel_mismatch.ir:6:3: error: %c: channel mismatch"):
        engine.load(path, random_params=0)


def test_a_file_that_is_not_an_onnx_model_is_an_ir_error(engine, tmp_path):
    # Told by content: binary bytes are an ONNX model that does not decode, text under an
    # .onnx name is IR text, located where it goes wrong.
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x01\x3a\xff\xff")
    with pytest.raises(primjit.IrError, match=r"model.onnx: not a valid ONNX model"):
        engine.load(path)
    path.write_bytes(b"not protobuf at all")
    with pytest.raises(primjit.IrError, match=r"model.onnx:1:1: error: expected `graph`"):
        engine.load(path)
    with pytest.raises(FileNotFoundError):
        engine.load(tmp_path / "none.onnx")


def test_a_missing_file_is_a_file_not_found_error(engine, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        engine.load(tmp_path / "none.ir")
    assert e.value.filename == str(tmp_path / "none.ir")
    with pytest.raises(FileNotFoundError):
        engine.load(EXAMPLES / "residual.ir", params=tmp_path / "none.safetensors")


# Loads a model (argv[1]) with a parameter file (argv[2], if given) and prints the exception
# it raises: its type, whether it is a primjit.Error, and its message. Within 1 GiB of address
# space, so that a read of /dev/zero without end stops there.
LOAD = """
import resource
import sys
import primjit
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
engine = primjit.Engine(threads=1)
try:
    engine.load(sys.argv[1], **({"params": sys.argv[2]} if len(sys.argv) > 2 else {}))
except Exception as e:
    print(type(e).__name__, isinstance(e, primjit.Error), e, sep="\\n", end="")
"""


def test_files_that_are_not_regular_are_refused_naming_the_path(tmp_path):
    fifo_ir = tmp_path / "fifo.ir"
    fifo_params = tmp_path / "fifo.safetensors"
    fifo_onnx = tmp_path / "fifo.onnx"
    for fifo in (fifo_ir, fifo_params, fifo_onnx):
        os.mkfifo(fifo)
    zero_ir = tmp_path / "zero.ir"
    zero_ir.symlink_to("/dev/zero")
    folder = tmp_path / "folder.ir"
    folder.mkdir()
    ir = str(EXAMPLES / "residual.ir")
    device = "it is a character device, not a regular file"
    fifo = "it is a FIFO, not a regular file"
    for args, path, what in [
        ([str(fifo_ir)], fifo_ir, fifo),
        ([str(fifo_onnx)], fifo_onnx, fifo),
        ([ir, str(fifo_params)], fifo_params, fifo),
        (["/dev/zero"], "/dev/zero", device),
        ([str(zero_ir)], zero_ir, device),
        ([ir, "/dev/zero"], "/dev/zero", device),
        ([str(folder)], folder, "it is a directory, not a regular file"),
    ]:
        # In a child, so that a load that blocks on a FIFO or reads /dev/zero without end
        # fails the test (TimeoutExpired, the child killed) instead of hanging it.
        done = subprocess.run(
            [sys.executable, "-c", LOAD, *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"OSError\nFalse\ncannot read `{path}`: {what}", args


def test_a_graph_with_parameters_needs_them(engine):
    with pytest.raises(primjit.ParamError, match=r"the graph has parameters \(@stem.weight, @stem.bias, @dil.weight and 1 more\)"):
        engine.load(EXAMPLES / "conv_basics.ir")
    with pytest.raises(primjit.ParamError, match="not both"):
        engine.load(EXAMPLES / "conv_basics.ir", params={}, random_params=0)
    # A graph without parameters loads without them.
    assert "gap" in engine.load(EXAMPLES / "pooling.ir").outputs


def test_bad_dict_params(engine):
    ir = EXAMPLES / "conv_groups.ir"
    good = {
        "grouped.weight": np.zeros((8, 2, 3, 3), np.float32),
        "dw.weight": np.zeros((8, 1, 3, 3), np.float32),
        "dw.bias": np.zeros((8,), np.float32),
        "mult.weight": np.zeros((8, 1, 3, 3), np.float32),
    }
    model = engine.load(ir, params=good)
    assert model.outputs == ["dw", "mult"]
    missing = dict(good)
    del missing["dw.bias"]
    with pytest.raises(primjit.ParamError, match=r"parameter @dw.bias is missing \(expected shape \[8\]\)"):
        engine.load(ir, params=missing)
    wrong = dict(good, **{"dw.bias": np.zeros((4,), np.float32)})
    with pytest.raises(primjit.ParamError, match=r"@dw.bias has shape \[4\] but the graph declares \[8\]"):
        engine.load(ir, params=wrong)
    double = dict(good, **{"dw.bias": np.zeros((8,), np.float64)})
    with pytest.raises(primjit.DtypeError, match=r"parameter @dw.bias: the array's dtype is float64"):
        engine.load(ir, params=double)
    with pytest.raises(primjit.ParamError, match=r"expected a .safetensors or .npz path \(str, bytes or os.PathLike\) or a dict"):
        engine.load(ir, params=42)


def test_bad_safetensors_files(engine, tmp_path):
    ir = EXAMPLES / "residual.ir"
    not_st = tmp_path / "x.safetensors"
    not_st.write_bytes(b"not a safetensors file")
    with pytest.raises(primjit.ParamError, match="is not a safetensors file"):
        engine.load(ir, params=not_st)
    partial = tmp_path / "partial.safetensors"
    write_safetensors(partial, {"conv1.weight": np.zeros((4, 4, 3, 3), np.float32)})
    with pytest.raises(primjit.ParamError, match=r"parameter @bn1.weight is missing from `.*partial.safetensors`"):
        engine.load(ir, params=partial)
    f64 = tmp_path / "f64.safetensors"
    write_safetensors(f64, {"conv1.weight": np.zeros((4, 4, 3, 3), np.float64)})
    with pytest.raises(primjit.ParamError, match=r"@conv1.weight in `.*` has dtype F64; only F32"):
        engine.load(ir, params=f64)


def test_bad_settings_are_config_errors(engine):
    for kwargs, pattern in [
        ({"budget": "12XB"}, r"budget `12XB`: unknown unit `XB`"),
        ({"budget": -1}, r"budget -1"),
        ({"budget": 1.5}, r"budget: expected a string"),
        ({"capacity": -1}, r"capacity -1"),
        ({"capacity": 2**64}, r"capacity 18446744073709551616"),
        ({"capacity": "8"}, r"capacity: expected a number of entries.*found str"),
        ({"budget": 2**200}, r"budget 1606938044258990275541962092341162602522202993782792835301376"),
        ({"threads": -2}, r"threads -2"),
        ({"threads": 2**64}, r"threads 18446744073709551616: expected 0 \(one per core\) to 1024"),
        ({"threads": 1025}, r"threads 1025: expected 0 \(one per core\) to 1024"),
        ({"threads": True}, r"threads: expected 0 \(one per core\) to 1024, found bool"),
        ({"threads": 2.0}, r"threads: .*found float"),
        ({"verbose": 3}, r"verbose 3"),
        ({"verbose": False}, r"verbose: expected 0, 1 or 2, found bool"),
        ({"conv_algo": "fft"}, r"conv_algo: unknown convolution algorithm `fft`"),
    ]:
        with pytest.raises(primjit.ConfigError, match=pattern):
            primjit.Engine(**kwargs)
    with pytest.raises(primjit.ConfigError, match=r"mode `fast`"):
        engine.load(EXAMPLES / "pooling.ir", mode="fast")
    with pytest.raises(primjit.ConfigError, match=r"budget `lots`"):
        engine.set_budget("lots")
    with pytest.raises(primjit.ConfigError, match=r"capacity -3"):
        engine.set_capacity(-3)
    # Integer-like objects are ints.
    e = primjit.Engine(budget=np.int64(1 << 20), capacity=np.uint8(3), threads=np.int32(1))
    assert (e.budget, e.capacity, e.threads) == ("1MiB", 3, 1)
    assert engine.budget == "64MiB", "a rejected budget changes nothing"


def test_a_malformed_environment_variable_is_a_config_error(monkeypatch):
    monkeypatch.setenv("PRIMJIT_CACHE_BUDGET", "many")
    with pytest.raises(primjit.ConfigError, match=r"PRIMJIT_CACHE_BUDGET=many"):
        primjit.Engine.from_env()
    monkeypatch.setenv("PRIMJIT_CACHE_BUDGET", "2MiB")
    monkeypatch.setenv("PRIMJIT_THREADS", "1")
    monkeypatch.setenv("PRIMJIT_CONV_ALGO", "direct")
    e = primjit.Engine.from_env()
    assert (e.budget, e.threads, e.conv_algo) == ("2MiB", 1, "direct")


# ---- running ----


def test_inputs_that_do_not_fit_the_graph_are_shape_errors(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    with pytest.raises(primjit.ShapeError, match="%x"):
        model(random_input((1, 4, 9, 11)))  # 4 channels, the graph takes 3
    with pytest.raises(primjit.ShapeError, match="%x"):
        model(random_input((3, 9, 11)))  # rank 3
    with pytest.raises(primjit.ShapeError, match="%y"):
        model.run({"y": random_input((1, 3, 9, 11))})
    with pytest.raises(primjit.ShapeError, match="%x"):
        model.run({})
    x = random_input((1, 3, 9, 11))
    with pytest.raises(primjit.ShapeError, match="%x: the input is given twice"):
        model.run({"x": x, "%x": x})
    two = engine.load(EXAMPLES / "symbolic.ir", random_params=0)
    with pytest.raises(primjit.ShapeError, match=r"the graph has 2 inputs \(%a: \[1, 2, H, W\], %b: \[1, 2, H, W\]\)"):
        two(random_input((1, 2, 8, 8)))
    with pytest.raises(primjit.ShapeError, match="%b"):
        two.run({"a": random_input((1, 2, 8, 8)), "b": random_input((1, 2, 8, 9))})
    with pytest.raises(ValueError):  # what a caller catching ValueError sees
        model(random_input((1, 4, 9, 11)))


def test_a_strided_view_larger_than_any_tensor_is_refused_before_its_copy(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    # 58 G elements viewing one float: copying it into C order would abort on memory.
    huge = np.lib.stride_tricks.as_strided(
        np.zeros(1, np.float32), shape=(1, 3, 9, 1 << 31), strides=(0, 0, 0, 0)
    )
    with pytest.raises(primjit.ShapeError, match=r"input %x: the array has 57982058496 elements"):
        model(huge)


def test_arrays_of_other_dtypes_are_refused(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    x = random_input((1, 3, 9, 11))
    with pytest.raises(primjit.DtypeError, match=r"input %x: the array's dtype is float64, expected float32"):
        model(x.astype(np.float64))
    with pytest.raises(primjit.DtypeError, match="dtype is int32"):
        model(x.astype(np.int32))
    with pytest.raises(primjit.DtypeError, match="dtype is >f4"):
        model(x.astype(">f4"))
    with pytest.raises(primjit.DtypeError, match=r"expected a numpy.ndarray of float32, found list"):
        model(x.tolist())
    with pytest.raises(TypeError):  # what a caller catching TypeError sees
        model.run({"x": x.astype(np.float16)})


# ---- single primitives ----


def test_bad_descriptors_are_descriptor_errors(engine):
    for text, pattern in [
        ("ic64x3", r"descriptor `ic64x3`: unknown entry `x`"),
        ("ic4oc4kh3", r"the descriptor needs `ih`"),
        ("ic4oc4ih2kh3", r"empty"),
        ("mb1g3ic8ih10oc8kh3", r"invalid primitive .*group"),
        ("mb1ic8ih10iw*oc8kh3", r"expected an entry"),
    ]:
        with pytest.raises(primjit.DescriptorError, match=pattern):
            engine.compile_op(text)
    with pytest.raises(primjit.ConfigError, match=r"pool `min`"):
        engine.compile_op("mb1ic8ih10kh3", pool="min")
    with pytest.raises(primjit.ConfigError, match=r"layout `nhwc`"):
        engine.compile_op(CONV, layout="nhwc")
    with pytest.raises(primjit.ConfigError, match=r"conv_algo: unknown convolution algorithm"):
        engine.compile_op(CONV, conv_algo="gemm")


def test_buffers_that_do_not_match_a_primitive_are_exec_errors(engine):
    op = engine.compile_op(CONV)
    src, w, dst = (np.zeros(b["len"], np.float32) for b in op.buffers())
    packed = op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    assert packed.shape == w.shape
    op.execute(src, dst, packed)
    dst[:] = 7.0
    with pytest.raises(primjit.ExecError, match=r"the dst buffer holds 959 floats but shape \[1, 8, 10, 12\] needs 960"):
        op.execute(src, np.zeros(959, np.float32), packed)
    with pytest.raises(primjit.ExecError, match=r"the src buffer holds 3 floats"):
        op.execute(src[:3], dst, packed)
    assert np.all(dst == 7.0), "a rejected call writes nothing"
    with pytest.raises(primjit.ExecError, match=r"the weights buffer is missing"):
        op.execute(src, dst)
    with pytest.raises(primjit.ExecError, match=r"expected 0 extra buffers"):
        op.execute(src, dst, packed, extra=[src])
    with pytest.raises(primjit.ExecError, match=r"the weights have shape \[8, 4, 3, 3\]"):
        op.pack_weights(np.zeros((8, 4, 3, 3), np.float32))
    with pytest.raises(primjit.ExecError, match=r"the bias has shape \[7\]"):
        op.pack_weights(np.zeros((8, 8, 3, 3), np.float32), np.zeros(7, np.float32))
    # The destination may not be a source.
    with pytest.raises(primjit.ExecError, match="dst"):
        op.execute(dst, dst, packed)
    pool = engine.compile_op("mb1ic8ih10kh3sh2", pool="max")
    src, dst = (np.zeros(b["len"], np.float32) for b in pool.buffers())
    with pytest.raises(primjit.ExecError, match=r"this primitive takes no weights buffer"):
        pool.execute(src, dst, packed)
    with pytest.raises(primjit.ExecError, match="only a convolution takes weights"):
        pool.pack_weights(np.zeros((8, 8, 3, 3), np.float32))


def test_destinations_must_be_writable_float32_in_c_order(engine):
    op = engine.compile_op("mb1ic8ih10kh3sh2", pool="max")
    src = np.zeros(op.buffers()[0]["len"], np.float32)
    n = op.buffers()[1]["len"]
    with pytest.raises(primjit.DtypeError, match="dst: the array's dtype is float64"):
        op.execute(src, np.zeros(n, np.float64))
    with pytest.raises(primjit.DtypeError, match="dst: the array must be C-contiguous"):
        op.execute(src, np.zeros(2 * n, np.float32)[::2])
    frozen = np.zeros(n, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(primjit.ExecError, match="dst: the array cannot be written"):
        op.execute(src, frozen)


# ---- arguments of the wrong kind or type ----


GROUPS_PARAMS = {
    "grouped.weight": np.zeros((8, 2, 3, 3), np.float32),
    "dw.weight": np.zeros((8, 1, 3, 3), np.float32),
    "dw.bias": np.zeros((8,), np.float32),
    "mult.weight": np.zeros((8, 1, 3, 3), np.float32),
}


def test_a_numpy_scalar_or_0d_array_input_is_a_shape_error_naming_the_rank(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    for value, found in [
        (np.float32(1.0), "a numpy scalar (numpy.float32)"),
        (np.float64(1.0), "a numpy scalar (numpy.float64)"),
        (np.array(1.0, np.float32), "a 0-d array"),
        (np.array(1.0, np.float64), "a 0-d array"),
    ]:
        want = f"input %x: expected an array of rank 4 ([1, 3, H, W]), found {found}"
        with pytest.raises(primjit.ShapeError) as called:
            model(value)
        assert str(called.value) == want
        with pytest.raises(primjit.ShapeError) as run:
            model.run({"x": value})
        assert str(run.value) == want
    # A scalar under a name the graph does not have: the name is the fault.
    with pytest.raises(primjit.ShapeError, match="%y"):
        model.run({"x": random_input((1, 3, 9, 11)), "y": np.float32(1.0)})


def test_a_numpy_scalar_is_read_as_a_0d_array_and_never_written(engine):
    params = dict(GROUPS_PARAMS, **{"dw.bias": np.float32(1.0)})
    with pytest.raises(primjit.ParamError, match=r"parameter @dw.bias has shape \[\] but the graph declares \[8\]"):
        engine.load(EXAMPLES / "conv_groups.ir", params=params)
    params["dw.bias"] = np.float64(1.0)
    with pytest.raises(primjit.DtypeError) as e:
        engine.load(EXAMPLES / "conv_groups.ir", params=params)
    assert str(e.value).startswith("parameter @dw.bias: the numpy scalar's dtype is float64, expected float32")
    op = engine.compile_op(CONV)
    src, _, dst = (np.zeros(b["len"], np.float32) for b in op.buffers())
    packed = op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    with pytest.raises(primjit.ExecError, match=r"the src buffer holds 1 floats"):
        op.execute(np.float32(1.0), dst, packed)
    with pytest.raises(primjit.ExecError) as e:
        op.execute(src, np.float32(0.0), packed)
    assert str(e.value) == "dst: a numpy scalar (numpy.float32) cannot be written: pass a writable float32 array"


def test_buffers_a_call_writes_must_not_overlap_the_others(engine):
    op = engine.compile_op(CONV)
    n = op.buffers()[0]["len"]
    src = random_input((n,))
    packed = op.pack_weights(random_input((8, 8, 3, 3), seed=1))
    overlap = "a buffer the kernels write must not overlap another of the call (pass a separate array)"
    buf = np.zeros(2 * n, np.float32)
    for args, kwargs, message in [
        ((src, src, packed), {}, f"dst: the array shares memory with src: {overlap}"),
        ((src, packed[:n], packed), {}, f"dst: the array shares memory with weights: {overlap}"),
        ((src, buf[1 : n + 1], packed), {"extra": [buf[:n]]}, f"dst: the array shares memory with extra[0]: {overlap}"),
    ]:
        with pytest.raises(primjit.ExecError) as e:
            op.execute(*args, **kwargs)
        assert str(e.value) == message
    # Halves of one array do not overlap: the check is by memory, not by array.
    buf[:n] = src
    op.execute(buf[:n], buf[n:], packed)
    want = np.zeros(n, np.float32)
    op.execute(src, want, packed)
    assert buf[n:].tobytes() == want.tobytes()

    # Two arrays over one buffer through different objects, which numpy's borrow flags do not
    # relate: the kernels would have read what they wrote.
    shared = bytearray(src.tobytes())
    a = np.frombuffer(memoryview(shared), np.float32)
    b = np.frombuffer(memoryview(shared), np.float32)
    assert a.base is not b.base
    with pytest.raises(primjit.ExecError, match=r"^dst: the array shares memory with src: "):
        op.execute(a, b, packed)
    assert bytes(shared) == src.tobytes(), "a rejected call writes nothing"

    wino = engine.compile_op(CONV, layout="nchw4c", conv_algo="winograd")
    s, _, d, scratch = (np.zeros(b["len"], np.float32) for b in wino.buffers())
    w = wino.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    for given, other in [(d, "dst"), (s, "src"), (w, "weights")]:
        with pytest.raises(primjit.ExecError) as e:
            wino.execute(s, d, w, scratch=given)
        assert str(e.value) == f"scratch: the array shares memory with {other}: {overlap}"
    wino.execute(s, d, w, scratch=scratch)


def test_an_array_another_running_call_holds_is_refused(engine):
    # Calls that run Python code while they hold their arrays (reading a sequence, an
    # isinstance check) stand in for a call running in another thread.
    op = engine.compile_op(CONV)
    src, _, dst = (np.zeros(b["len"], np.float32) for b in op.buffers())
    packed = op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    model = engine.load(EXAMPLES / "pooling.ir")
    errors = []

    class Extra(collections.abc.Sequence):
        """Writes src with another call while execute reads it."""

        def __len__(self):
            return 0

        def __getitem__(self, i):
            try:
                op.execute(np.zeros_like(src), src, packed)
            except primjit.ExecError as e:
                errors.append(str(e))
            raise IndexError(i)

    op.execute(src, dst, packed, extra=Extra())
    assert errors == ["dst: the array cannot be written: another call still running reads or writes it"]

    class Scratch:
        """Reads dst with a model run while execute writes it (isinstance looks up __class__)."""

        @property
        def __class__(self):
            try:
                model(dst)
            except primjit.ExecError as e:
                errors.append(str(e))
            return type(self)

    errors.clear()
    with pytest.raises(primjit.DtypeError, match="scratch: expected a numpy.ndarray of float32, found Scratch"):
        op.execute(src, dst, packed, scratch=Scratch())
    assert set(errors) == {
        "input %x: the array cannot be read: another call still running writes it (a Primitive.execute's dst or scratch)"
    }

    frozen = np.zeros_like(dst)
    frozen.flags.writeable = False
    with pytest.raises(primjit.ExecError) as e:
        op.execute(src, frozen, packed)
    assert str(e.value) == "dst: the array cannot be written: it is read-only (flags.writeable is False)"


def test_containers_of_the_wrong_type_are_named(engine):
    model = engine.load(EXAMPLES / "conv_basics.ir", random_params=0)
    x = random_input((1, 3, 9, 11))
    for inputs, found in [([x], "list"), (None, "NoneType"), (x, "ndarray")]:
        with pytest.raises(primjit.ShapeError) as e:
            model.run(inputs)
        assert str(e.value) == f"inputs: expected a dict of float32 arrays by input name, found {found}"
    with pytest.raises(primjit.ShapeError, match=r"^inputs: the dict's keys must be input names \(str\), found int$"):
        model.run({0: x})
    # Any mapping will do, as the stubs say.
    assert model.run(types.MappingProxyType({"x": x}))[model.outputs[0]].tobytes() == model(x).tobytes()

    ir = EXAMPLES / "conv_groups.ir"
    for params, found in [(list(GROUPS_PARAMS.values()), "list"), (42, "int")]:
        with pytest.raises(primjit.ParamError) as e:
            engine.load(ir, params=params)
        assert str(e.value) == (
            "params: expected a .safetensors or .npz path (str, bytes or os.PathLike) or a dict of float32"
            f" arrays by parameter name, found {found}"
        )
    with pytest.raises(primjit.ParamError, match=r"^params: the dict's keys must be parameter names \(str\), found int$"):
        engine.load(ir, params={1: np.zeros(1, np.float32)})
    assert engine.load(ir, params=types.MappingProxyType(GROUPS_PARAMS)).outputs == ["dw", "mult"]

    op = engine.compile_op(CONV)
    src, _, dst = (np.zeros(b["len"], np.float32) for b in op.buffers())
    packed = op.pack_weights(np.zeros((8, 8, 3, 3), np.float32))
    for extra, found in [("ab", "str"), (b"ab", "bytes"), (3, "int"), (src, "ndarray")]:
        with pytest.raises(primjit.ExecError) as e:
            op.execute(src, dst, packed, extra=extra)
        assert str(e.value) == (
            "extra: expected a list or tuple of float32 arrays (one per residual or second source),"
            f" found {found}"
        )
    # A tuple is a sequence of buffers (one too many here), None none.
    with pytest.raises(primjit.ExecError, match=r"expected 0 extra buffers \(residuals or second source\), found 1"):
        op.execute(src, dst, packed, extra=(src,))
    op.execute(src, dst, packed, extra=None)


def test_random_params_is_a_seed_from_0_to_2_64(engine):
    ir = EXAMPLES / "conv_basics.ir"
    expected = "expected a seed from 0 to 18446744073709551615, or None"
    for seed, message in [
        (-1, f"random_params -1: {expected}"),
        (2**64, f"random_params 18446744073709551616: {expected}"),
        (True, f"random_params: {expected}, found bool"),
        (False, f"random_params: {expected}, found bool"),
        (1.0, f"random_params: {expected}, found float"),
        ("3", f"random_params: {expected}, found str"),
    ]:
        with pytest.raises(primjit.ParamError) as e:
            engine.load(ir, random_params=seed)
        assert str(e.value) == message
    x = random_input((1, 3, 9, 11))
    three = engine.load(ir, random_params=3)(x)
    assert engine.load(ir, random_params=np.uint8(3))(x).tobytes() == three.tobytes()
    assert engine.load(ir, random_params=2**64 - 1)(x).tobytes() != three.tobytes()


def test_paths_are_str_bytes_or_path_like(engine, tmp_path):
    ir = EXAMPLES / "pooling.ir"

    class BytesPath:
        def __fspath__(self) -> bytes:
            return os.fsencode(ir)

    for path in [str(ir), ir, os.fsencode(ir), BytesPath()]:
        assert engine.load(path).path == str(ir)
    # A file name that is not UTF-8 opens by its bytes.
    odd = os.fsencode(tmp_path) + b"/pool\xff.ir"
    with open(odd, "wb") as f:
        f.write(ir.read_bytes())
    assert engine.load(odd).outputs == engine.load(ir).outputs
    with pytest.raises(FileNotFoundError) as missing:
        engine.load(os.fsencode(tmp_path / "none.ir"))
    assert missing.value.filename == str(tmp_path / "none.ir")
    for path, found in [(3, "int"), (None, "NoneType"), ([str(ir)], "list")]:
        with pytest.raises(TypeError) as e:
            engine.load(path)
        assert str(e.value) == f"path: expected a str, bytes or os.PathLike, found {found}"
        assert not isinstance(e.value, primjit.Error)
    st = tmp_path / "groups.safetensors"
    write_safetensors(st, GROUPS_PARAMS)
    assert engine.load(EXAMPLES / "conv_groups.ir", params=os.fsencode(st)).outputs == ["dw", "mult"]


def test_names_of_the_wrong_type_are_config_or_descriptor_errors(engine):
    for call, error, message in [
        (lambda: engine.load(EXAMPLES / "pooling.ir", mode=1), primjit.ConfigError, 'mode: expected "exact" or "dynamic", found int'),
        (lambda: primjit.Engine(conv_algo=1), primjit.ConfigError, 'conv_algo: expected "direct", "winograd" or "auto", found int'),
        (lambda: engine.compile_op(CONV, conv_algo=b"direct"), primjit.ConfigError, 'conv_algo: expected "direct", "winograd" or "auto", found bytes'),
        (lambda: engine.compile_op(CONV, layout=4), primjit.ConfigError, 'layout: expected "nchw" or "nchw4c", found int'),
        (lambda: engine.compile_op("mb1ic8ih10kh3", pool=True), primjit.ConfigError, 'pool: expected None, "max", "avg_np" or "avg_p", found bool'),
        (lambda: engine.compile_op(b"mb1ic8ih10kh3"), primjit.DescriptorError, 'descriptor: expected a str such as "mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1", found bytes'),
    ]:
        with pytest.raises(error) as e:
            call()
        assert str(e.value) == message
    # The defaults, given or not.
    assert engine.compile_op(CONV, layout="nchw").key == engine.compile_op(CONV).key
    assert engine.load(EXAMPLES / "pooling.ir", mode="exact").mode == "exact"

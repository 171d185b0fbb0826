"""Typed use of the package, checked with `mypy --strict` (test_session.py): a single-output
model's call is an array, a session's run a list of arrays."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import primjit


def trunk_width(path: str, x: npt.NDArray[np.float32]) -> int:
    engine = primjit.Engine(threads=None, budget="64MiB")
    model = engine.load(path, random_params=0, mode="dynamic")
    y = model(x)
    width: int = y.shape[-1]
    return width


def session_outputs(data: bytes, x: npt.NDArray[np.float32]) -> list[tuple[int, ...]]:
    options = primjit.SessionOptions()
    options.intra_op_num_threads = 1
    s = primjit.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feed = {s.get_inputs()[0].name: x}
    shapes: list[tuple[int, ...]] = [y.shape for y in s.run(None, feed)]
    meta: str = s.get_modelmeta().producer_name
    del meta
    return shapes

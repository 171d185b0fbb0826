"""Calls from several Python threads at once give the results of calls one after another."""

from __future__ import annotations

import os
import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import primjit
from conftest import EXAMPLES, TRUNK, random_input


def test_threads_sharing_a_model_get_identical_results():
    engine = primjit.Engine(threads=1)
    model = engine.load(EXAMPLES / "residual.ir", random_params=0)
    inputs = [random_input((1, 4, 6, w), seed=w) for w in range(5, 17)]
    expected = [model(x).tobytes() for x in inputs]
    engine.clear()  # so that the threads also compile concurrently

    def work(offset: int) -> list[tuple[int, bytes]]:
        # Each thread walks the widths from a different start, so that calls of all widths
        # overlap, and repeats them.
        order = [(offset + i) % len(inputs) for i in range(3 * len(inputs))]
        return [(i, model(inputs[i]).tobytes()) for i in order]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(work, range(4)))
    for per_thread in results:
        for i, y in per_thread:
            assert y == expected[i], f"width {i + 5} differs"
    stats = engine.cache_stats()
    # Concurrent misses on one key compile once: every primitive compiled exactly once more.
    assert stats["compiles"] == 2 * stats["entries"]


def test_threads_sharing_an_engine_with_a_multi_threaded_pool():
    engine = primjit.Engine(threads=2)
    model = engine.load(TRUNK, mode="dynamic", random_params=0)
    inputs = [random_input((1, 3, 320, w), seed=w) for w in (200, 232, 264)]
    expected = [model(x).tobytes() for x in inputs]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(lambda i: model(inputs[i % 3]).tobytes(), range(9)))
    assert got == [expected[i % 3] for i in range(9)]


def test_a_forked_child_gets_a_config_error_not_a_hang():
    """A child of `fork` inherits the engine but not its pool's threads: its runs raise at
    once (they used to wait for the missing threads forever), and an engine made in the child
    runs. The parent waits at most 60 s and kills a child that hangs."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    engine = primjit.Engine(threads=2)
    model = engine.load(EXAMPLES / "residual.ir", random_params=0)
    op = engine.compile_op("mb1ic4ih6iw6oc4oh6ow6kh3kw3ph1pw1", layout="nchw4c")
    x = random_input((1, 4, 6, 9), seed=1)
    expected = model(x).tobytes()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock the child.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 10
        try:
            try:
                model(x)
                code = 11
            except primjit.ConfigError as e:
                code = 0 if "a fork does not copy its threads" in str(e) else 12
            if code == 0:
                src = np.zeros(op.buffers()[0]["len"], np.float32)
                dst = np.zeros(op.buffers()[2]["len"], np.float32)
                try:
                    op.execute(src, dst, np.zeros(op.buffers()[1]["len"], np.float32))
                    code = 13
                except primjit.ConfigError:
                    pass
            if code == 0:
                child = primjit.Engine(threads=2).load(EXAMPLES / "residual.ir", random_params=0)
                code = 0 if child(x).tobytes() == expected else 14
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's run hung")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert model(x).tobytes() == expected

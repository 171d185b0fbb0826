"""Calls from several Python threads at once give the results of calls one after another."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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

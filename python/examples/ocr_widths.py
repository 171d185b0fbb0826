"""The variable-width benchmark of the original report, from Python.

Runs the ResNet34 trunk (ir/resnet34_trunk.ir, random parameters) at batch 1 on 1x3x320xW
inputs, W from benches/data/widths.txt, through one engine, and prints what `primjit bench`
prints: the memory growth every 100 calls (VmRSS after the call minus VmRSS after the first
call), the time per call, the cache's statistics and the memory growth over the run.

    python python/examples/ocr_widths.py --n 100 --policy exact --threads 0 --conv-algo auto

The time of a call is that of `model(x)` alone, as `primjit bench` times `run` alone: making
and padding the input are outside it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

import primjit

REPO = Path(__file__).resolve().parents[2]


def padded_width(policy: str, w: int) -> int:
    """The width a call runs at under a policy, as `primjit bench --policy` pads it."""
    if policy in ("exact", "dynamic"):
        return w
    if policy == "bucket320":
        step = 320
    else:  # bucketflex
        step = 40 if w < 640 else 80 if w < 1280 else 160 if w < 2560 else 320
    return -(-w // step) * step


def read_widths(path: Path) -> list[int]:
    widths = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            widths.append(int(line))
    return widths


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def thousands(n: int) -> str:
    return f"{n:,}"


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile, as `primjit bench` computes it."""
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(REPO / "ir" / "resnet34_trunk.ir"))
    parser.add_argument("--widths", default=str(REPO / "benches" / "data" / "widths.txt"))
    parser.add_argument("--n", type=int, default=100, help="calls, from the start of the widths")
    parser.add_argument(
        "--policy", default="exact", choices=["exact", "bucket320", "bucketflex", "dynamic"]
    )
    parser.add_argument("--budget", default="64MiB")
    parser.add_argument("--capacity", type=int, default=None)
    parser.add_argument("--threads", type=int, default=0, help="threads per primitive, 0 for all cores")
    parser.add_argument(
        "--conv-algo", default="auto", choices=["direct", "winograd", "auto"],
        help="convolution algorithm, as `primjit bench --conv-algo`",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the summary as JSON here")
    args = parser.parse_args()

    widths = read_widths(Path(args.widths))[: args.n]
    engine = primjit.Engine(
        budget=args.budget, capacity=args.capacity, threads=args.threads, conv_algo=args.conv_algo
    )
    mode = "dynamic" if args.policy == "dynamic" else "exact"
    model = engine.load(args.model, mode=mode, random_params=args.seed)
    [(input_name, shape)] = model.inputs.items()
    n, c, h = shape[:3]

    s = sorted(widths)
    print(
        f"widths: mean={sum(s) / len(s):.0f}, p50={percentile(s, 50):.0f} "
        f"p95={percentile(s, 95):.0f} max={s[-1]}"
    )
    capacity = "none" if engine.capacity is None else engine.capacity
    print(
        f"model={args.model} policy={args.policy} budget={engine.budget} "
        f"capacity={capacity} threads={engine.threads}"
    )

    times = []
    rss_per_call = []
    rss_first = 0
    rss = 0
    for i, w in enumerate(widths):
        # Uniform in [-1, 1), drawn in float32 in place: no float64 temporary twice the
        # input's size, which the allocator would keep and the memory growth would count.
        x = np.random.default_rng(args.seed + i).random((n, c, h, w), dtype=np.float32)
        x *= 2.0
        x -= 1.0
        run_width = padded_width(args.policy, w)
        if run_width != w:
            x = np.pad(x, ((0, 0), (0, 0), (0, 0), (0, run_width - w)))
        start = time.perf_counter()
        y = model(x)
        times.append(time.perf_counter() - start)
        del y
        rss = rss_kb()
        rss_per_call.append(rss)
        if i == 0:
            rss_first = rss
        if (i + 1) % 100 == 0:
            print(f"n={i + 1} memory growth (kb): {thousands(rss - rss_first)}")

    stats = engine.cache_stats()
    t = sorted(times)
    print(
        f"time: mean={sum(times) / len(times):.3f} s, p50={percentile(t, 50):.3f} s, "
        f"p95={percentile(t, 95):.3f} s"
    )
    print(f"memory (kb): {thousands(rss_first)} initial, {thousands(rss - rss_first)} growth")
    print(
        f"primitives: {stats['compiles']} compiles ({stats['failed_compiles']} failed), "
        f"{stats['hits']} hits, {stats['misses']} misses, {stats['evictions']} evictions "
        f"({stats['evicted_bytes']} bytes freed)"
    )
    print(
        f"cache: {stats['entries']} entries, {stats['bytes']} bytes now, "
        f"{stats['peak_bytes']} bytes peak"
    )
    print(
        f"compile time: {stats['compile_time_s']:.3f} s total, "
        f"{stats['max_compile_time_s'] * 1e3:.2f} ms max"
    )
    if args.json:
        summary = {
            "model": args.model,
            "policy": args.policy,
            "conv_algo": engine.conv_algo,
            "budget": engine.budget,
            "threads": engine.threads,
            "calls": len(times),
            "time_mean_s": sum(times) / len(times),
            "time_p50_s": percentile(t, 50),
            "time_p95_s": percentile(t, 95),
            "rss_initial_kb": rss_first,
            "rss_growth_kb": rss - rss_first,
            **{k: stats[k] for k in ("compiles", "hits", "misses", "evictions", "entries", "bytes", "peak_bytes")},
            "seconds": times,
            "rss_kb": rss_per_call,
        }
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

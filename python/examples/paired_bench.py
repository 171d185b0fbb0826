"""Two engines on the benchmark workload, call by call, each in a process of its own.

On a shared machine the speed moves by 10-25% from one minute to the next, so two benchmark
processes run one after the other compare the minutes as much as the engines. Here a driver
starts one worker process per side, sends both the same widths one call at a time, the order
alternating from call to call, and times each call inside its worker (the inference call
alone, as `primjit bench` and `../shared/peers/bench_peer.py` do). Both sides meet the same
minutes, so their ratio holds where their absolute times do not.

    python python/examples/paired_bench.py primjit:ir/resnet34_trunk.ir onnxruntime:trunk.onnx
    python python/examples/paired_bench.py --threads 1 --n 100 SIDE SIDE

A side is `primjit:MODEL` (an .ir file with random parameters, or an .onnx file with its
initializers; the `dynamic` mode) or `onnxruntime:MODEL.onnx`, optionally followed by
`:NAME=VALUE,...`, environment variables of that side's worker (`PRIMJIT_CONV_ALGO=direct`,
`PRIMJIT_WORKSPACE_BUDGET=unlimited`), so that two primjit configurations can be compared the
same way. Each side first makes one untimed call at the first width. Between calls the driver
waits `--gap` seconds (0.15 by default): onnxruntime's threads spin for about 50 ms after a
call, and with no gap they take a core from the other side's next call.

It prints each side's mean and p50 and the ratios B/A of the means, of the p50s, and the
median of the per-call ratios; `--json PATH` also writes every call's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("primjit", "onnxruntime")


def parse_side(spec: str) -> tuple[str, str, dict[str, str]]:
    """`ENGINE:MODEL[:NAME=VALUE,...]` as (engine, model, environment)."""
    engine, _, rest = spec.partition(":")
    if engine not in ENGINES or not rest:
        raise ValueError(
            f"side `{spec}`: expected ENGINE:MODEL[:NAME=VALUE,...] with ENGINE one of "
            + ", ".join(ENGINES)
        )
    model, _, assignments = rest.partition(":")
    env = {}
    for item in filter(None, assignments.split(",")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"side `{spec}`: `{item}` is not NAME=VALUE")
        env[name] = value
    return engine, model, env


def read_widths(path: Path) -> list[int]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [int(line) for line in lines if line]


def worker(engine: str, model: str, threads: int, shape: list[int], widest: int) -> None:
    """Answers each width read from stdin with the seconds of one call at that width."""
    n, c, h = shape
    source = np.random.default_rng(123).standard_normal(n * c * h * widest, dtype=np.float32)
    if engine == "primjit":
        import primjit

        # PRIMJIT_THREADS is the driver's --threads unless the side sets it.
        random = 0 if model.endswith(".ir") else None
        m = primjit.Engine.from_env().load(model, mode="dynamic", random_params=random)

        def run(x):
            return m(x)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name

        def run(x):
            return session.run(None, {name: x})[0]

    for line in sys.stdin:
        w = int(line)
        x = source[: n * c * h * w].reshape(n, c, h, w)
        start = time.perf_counter()
        run(x)
        print(time.perf_counter() - start, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sides", nargs="*", metavar="SIDE", help="ENGINE:MODEL[:NAME=VALUE,...], twice")
    ap.add_argument("--widths", type=Path, default=REPO / "benches" / "data" / "widths.txt")
    ap.add_argument("--n", type=int, default=100, help="the workload's first N widths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="1,3,320", help="N,C,H of the input (W: the widths)")
    ap.add_argument("--gap", type=float, default=0.15, help="seconds between calls")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--widest", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = [int(v) for v in args.shape.split(",")]
    if args.worker:
        worker(args.worker[0], args.worker[1], args.threads, shape, args.widest)
        return 0
    try:
        if len(args.sides) != 2:
            raise ValueError(f"expected two sides, found {len(args.sides)}")
        sides = [parse_side(s) for s in args.sides]
        if len(shape) != 3:
            raise ValueError(f"--shape: expected N,C,H, found `{args.shape}`")
        widths = read_widths(args.widths)[: args.n]
        if not widths or args.n < 1:
            raise ValueError(f"--n must be between 1 and the {len(widths)} widths of {args.widths}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    workers = []
    for engine, model, env in sides:
        cmd = [
            sys.executable, __file__, "--worker", engine, model, "--threads", str(args.threads),
            "--shape", args.shape, "--widest", str(max(widths)),
        ]
        env = {**os.environ, "PRIMJIT_THREADS": str(args.threads), **env}
        workers.append(
            subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )

    def call(side: int, w: int) -> float:
        p = workers[side]
        p.stdin.write(f"{w}\n")
        p.stdin.flush()
        answer = p.stdout.readline()
        if not answer:
            raise RuntimeError(f"side {args.sides[side]} stopped (exit code {p.wait()})")
        return float(answer)

    seconds: list[list[float]] = [[], []]
    try:
        for side in (0, 1):
            call(side, widths[0])
        for i, w in enumerate(widths):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                time.sleep(args.gap)
                seconds[side].append(call(side, w))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for p in workers:
            p.stdin.close()
            p.wait()
    a, b = seconds
    for label, spec, s in zip("AB", args.sides, seconds):
        print(f"{label} {spec}: mean={statistics.mean(s):.4f} s, p50={statistics.median(s):.4f} s")
    ratios = [y / x for x, y in zip(a, b)]
    summary = {
        "mean_ratio": statistics.mean(b) / statistics.mean(a),
        "p50_ratio": statistics.median(b) / statistics.median(a),
        "median_call_ratio": statistics.median(ratios),
    }
    print(
        f"B/A over {len(widths)} calls, {args.threads} threads: mean {summary['mean_ratio']:.3f}, "
        f"p50 {summary['p50_ratio']:.3f}, median per-call ratio {summary['median_call_ratio']:.3f}"
    )
    if args.json:
        record = {"sides": args.sides, "widths": widths, "a_s": a, "b_s": b, **summary}
        args.json.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

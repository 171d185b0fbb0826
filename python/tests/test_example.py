"""The ocr_widths example runs the benchmark workload and prints the report's lines."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

EXAMPLE = REPO / "python" / "examples" / "ocr_widths.py"


def test_the_example_prints_the_report(tmp_path):
    widths = tmp_path / "widths.txt"
    # 100 calls at two widths, so that the report's `n=100` line comes and the cache holds
    # exactly two widths' primitives.
    widths.write_text("# two widths\n" + "\n".join(["24", "40"] * 50) + "\n")
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [
            sys.executable, str(EXAMPLE), str(REPO / "ir" / "examples" / "residual.ir"),
            "--widths", str(widths), "--n", "100", "--threads", "1", "--policy", "bucket320",
            "--json", str(summary),
        ],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "widths: mean=32, p50=24 p95=40 max=40"
    assert lines[1].endswith("policy=bucket320 budget=64MiB capacity=none threads=1")
    assert lines[2].startswith("n=100 memory growth (kb): ")
    assert lines[3].startswith("time: mean=")
    assert lines[4].startswith("memory (kb): ")
    report = json.loads(summary.read_text())
    # Both widths pad to 320: one width's primitives, compiled once. The optimized graph has
    # four nodes and three keys (its two 4-channel 3x3 convs with a residual are alike), so
    # 400 lookups are 3 compiles and 397 hits.
    assert report["calls"] == 100
    assert report["compiles"] == report["entries"] == 3
    assert report["hits"] == 397
    assert f"primitives: {report['compiles']} compiles (0 failed), {report['hits']} hits" in done.stdout


PAIRED = REPO / "python" / "examples" / "paired_bench.py"


def test_the_paired_bench_times_both_sides_call_by_call(tmp_path):
    widths = tmp_path / "widths.txt"
    widths.write_text("24\n40\n33\n")
    record = tmp_path / "paired.json"
    model = str(REPO / "ir" / "examples" / "residual.ir")
    done = subprocess.run(
        [
            sys.executable, str(PAIRED), f"primjit:{model}",
            f"primjit:{model}:PRIMJIT_CONV_ALGO=direct,PRIMJIT_WORKSPACE_BUDGET=0",
            "--widths", str(widths), "--n", "3", "--threads", "1", "--shape", "1,4,6",
            "--gap", "0", "--json", str(record),
        ],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"A primjit:{model}: mean=")
    assert lines[1].startswith(f"B primjit:{model}:PRIMJIT_CONV_ALGO=direct")
    assert lines[2].startswith("B/A over 3 calls, 1 threads: mean ")
    report = json.loads(record.read_text())
    assert report["widths"] == [24, 40, 33]
    a, b = report["a_s"], report["b_s"]
    assert len(a) == len(b) == 3 and min(a + b) > 0
    assert abs(report["mean_ratio"] - sum(b) / sum(a)) < 1e-12


def test_the_paired_bench_rejects_a_bad_side():
    done = subprocess.run(
        [sys.executable, str(PAIRED), "tensorflow:model.pb", "primjit:x.ir"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 2
    assert "side `tensorflow:model.pb`: expected ENGINE:MODEL" in done.stderr

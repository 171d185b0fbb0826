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

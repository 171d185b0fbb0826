"""Shared fixtures: the repository's files, the `primjit` command line, and helpers."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import primjit

REPO = Path(__file__).resolve().parents[2]
IR = REPO / "ir"
EXAMPLES = IR / "examples"
BAD = IR / "bad"
TRUNK = IR / "resnet34_trunk.ir"


def cli_path() -> Path | None:
    """The `primjit` binary: $PRIMJIT_CLI, else the release build in the cargo target dir."""
    if "PRIMJIT_CLI" in os.environ:
        return Path(os.environ["PRIMJIT_CLI"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for candidate in (target / "release" / "primjit", shutil.which("primjit")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def cli() -> Path:
    path = cli_path()
    if path is None:
        pytest.fail(
            "the primjit binary was not found: build it with `cargo build --release -p primjit-cli`"
            " or set PRIMJIT_CLI"
        )
    return path


def run_cli(cli: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    # One thread, so that the command line and the tests do not fight over the cores; the
    # results do not depend on the thread count.
    env = dict(os.environ, PRIMJIT_THREADS="1")
    done = subprocess.run(
        [str(cli), *args], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def random_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A .safetensors file: an 8-byte little-endian header length, a JSON header, the data."""
    header: dict[str, object] = {}
    blobs = []
    offset = 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        dtype = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}[array.dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def rss_kb() -> int:
    """The process's resident set size (VmRSS), in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
def engine() -> primjit.Engine:
    return primjit.Engine(threads=1)

"""Builds a harness of tests/native/ against sources of csrc/ with a sanitizer, for the
tests that run one (skipped where no C++ compiler with that sanitizer is found)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The csrc/ folders the frame codec needs (no bindings, no pool or DSA).
CODEC_DIRS = ["frame", "entropy", "shuffle", "lz", "checksum", "parallel", "cpu", "deflate", "qat", "copy"]
SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "thread": ["-fsanitize=thread"],
}


def codec_sources() -> list[str]:
    return [str(p) for d in CODEC_DIRS for p in sorted((ROOT / "csrc" / d).glob("*.cpp"))]


def build_harness(tmp_path: Path, harness: str, sources: list[str], *, sanitizer: str = "address",
                  opt: str = "-O1") -> Path:
    """Compiles tests/native/<harness>.cpp with sources into tmp_path; returns the program."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / harness
    cmd = [cxx, "-std=c++17", opt, "-g", *SANITIZERS[sanitizer], f"-I{ROOT / 'csrc'}",
           str(ROOT / "tests" / "native" / f"{harness}.cpp"), *sources,
           "-lzstd", "-lxxhash", "-lisal", "-ldl", "-lpthread", "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"compiler lacks {sanitizer} sanitizer support: " + build.stderr[-300:])
    assert build.returncode == 0, build.stderr[-3000:]
    return exe

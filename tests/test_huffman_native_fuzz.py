"""Builds tests/native/huffman_fuzz.cpp with AddressSanitizer and UBSan and runs it briefly.

The Python mutation tests cannot see a read one byte past a buffer; this one can.
Skipped when no C++ compiler with sanitizers is available.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_huffman_decode_under_sanitizers(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "huffman_fuzz"
    cmd = [
        cxx, "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
        f"-I{ROOT / 'csrc'}", str(ROOT / "tests/native/huffman_fuzz.cpp"),
        str(ROOT / "csrc/entropy/huffman.cpp"), str(ROOT / "csrc/entropy/histogram.cpp"),
        str(ROOT / "csrc/cpu/cpu_features.cpp"), "-o", str(exe),
    ]  # fmt: skip
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip("compiler lacks sanitizer support")
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe), "12345", "6000"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok:")

"""Builds tests/native/huffman_fuzz.cpp with AddressSanitizer and UBSan and runs it briefly.

The Python mutation tests cannot see a read one byte past a buffer; this one can.
Skipped when no C++ compiler with sanitizers is available.
"""

import subprocess

import numpy as np
import pytest

from native_build import ROOT, build_harness


@pytest.mark.slow
def test_huffman_decode_under_sanitizers(tmp_path):
    sources = [str(ROOT / "csrc" / f) for f in (
        "entropy/huffman.cpp", "entropy/histogram.cpp", "entropy/histogram_avx512.cpp", "entropy/pair_index_avx512.cpp", "entropy/code_chunks_avx512.cpp",
        "entropy/code_lengths.cpp", "entropy/lane_code.cpp", "entropy/lane_kernels.cpp",
        "entropy/lane_kernels_avx2.cpp", "entropy/lane_kernels_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "huffman_fuzz", sources)
    legacy = []  # tag 2 and tag 3 streams, which the encoder no longer writes: mutated from these
    for tag in (2, 3):
        with np.load(ROOT / "tests" / "data" / f"huffman_tag{tag}.npz") as f:
            for key in (k for k in f.files if k.startswith("stream:")):
                path = tmp_path / f"{key[7:]}.tag{tag}"
                path.write_bytes(int(f["raw:" + key[7:]].size).to_bytes(4, "little") + f[key].tobytes())
                legacy.append(str(path))
    assert len(legacy) == 12
    run = subprocess.run([str(exe), "12345", "6000", *legacy], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok:")

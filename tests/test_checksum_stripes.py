"""The block checksum that decode computes from the merge kernels' registers
(csrc/checksum/xxh3_stripes*) against libxxhash's XXH3: tests/native/xxh3_stripes_check.cpp
built natively with ASan and UBSan, feeding random prefixes of stripes through the AVX-512
and AVX2 feeds the CPU has (test_shuffle_avx512_emulated.py runs the AVX-512 feed on
emulated intrinsics everywhere)."""

import subprocess

from native_build import ROOT, build_harness


def test_stripe_feeds_match_the_library(tmp_path):
    exe = build_harness(tmp_path, "xxh3_stripes_check", [str(ROOT / "csrc/checksum/xxh3_stripes.cpp")])
    run = subprocess.run([str(exe), "11"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok:")

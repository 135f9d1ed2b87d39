"""The channel transposes behind the grouped coder (csrc/shuffle/channel_transpose): each ISA
variant the CPU has, the AVX-512 tall tiles and the portable tiles (what CPUs other than x86-64
run; test_aarch64.py runs them there) called directly, against the scalar reference
on shapes around the tile edges, under ASan + UBSan (tests/native/channel_transpose_check.cpp).
Machines without AVX-512 check the tall tiles in test_shuffle_avx512_emulated.py."""

import subprocess

from native_build import ROOT, build_harness

SOURCES = [str(ROOT / "csrc" / p) for p in
           ("shuffle/channel_transpose.cpp", "shuffle/channel_transpose_avx512.cpp", "cpu/cpu_features.cpp")]


def test_every_variant_matches_the_reference(tmp_path):
    exe = build_harness(tmp_path, "channel_transpose_check", SOURCES)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok:")

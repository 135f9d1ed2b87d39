"""The block checksum that decode computes from the merge kernels' registers
(csrc/checksum/xxh3_stripes*) against libxxhash's XXH3: tests/native/xxh3_stripes_check.cpp
built natively with ASan and UBSan, feeding random prefixes of stripes through the AVX-512
and AVX2 feeds the CPU has (test_shuffle_avx512_emulated.py runs the AVX-512 feed on
emulated intrinsics everywhere)."""

import re
import subprocess

from isa_variants import VARIANTS
from native_build import ROOT, build_harness


def test_stripe_feeds_match_the_library(tmp_path):
    exe = build_harness(tmp_path, "xxh3_stripes_check", [str(ROOT / "csrc/checksum/xxh3_stripes.cpp")])
    run = subprocess.run([str(exe), "11"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok:")


def test_split_feeds_the_block_checksum_the_library_computes(tmp_path):
    """shuffle::split_hashed (compress splits every block with it and takes the block checksum
    from the stripes it fed) against the scalar split and libxxhash, under ASan and UBSan: every
    element size and transform, lengths around XXH3's long-input start, the split's peeling
    threshold and whole blocks, planes peeled or not, sources at any alignment. With AVX-512
    masked off (or absent) it must decline every call."""
    sources = [str(p) for d in ("shuffle", "checksum") for p in sorted((ROOT / "csrc" / d).glob("*.cpp"))]
    exe = build_harness(tmp_path, "split_hashed_check", [*sources, str(ROOT / "csrc/cpu/cpu_features.cpp")])
    run = subprocess.run([str(exe), "5", "400"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok: 400 splits")
    fed = int(re.search(r"\((\d+) fed the checksum\)", run.stdout).group(1))
    assert fed > 50 or "avx512" not in VARIANTS, run.stdout  # the feeding path ran

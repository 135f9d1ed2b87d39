"""The rows method's repeat search and join (lz/row_repeats.cpp, lz/row_search_avx2.cpp,
lz/row_join_avx512.cpp): the AVX2 search finds the same copies as the portable one, byte
for byte, and the AVX-512 join rebuilds the planes and refuses edited tables as the portable
one does, under ASan + UBSan (tests/native/row_search_check.cpp); frames with rows planes are
identical in every variant."""

import subprocess

import pytest
import torch

import kvcore
from isa_variants import VARIANTS, use_variant
from native_build import ROOT, build_harness


def test_avx2_search_matches_the_portable_one(tmp_path):
    sources = [str(ROOT / "csrc" / f) for f in ("lz/row_repeats.cpp", "lz/row_search_avx2.cpp",
                                                 "lz/row_join_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "row_search_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith(("ok:", "skip:")) and not run.stdout.startswith("ok: 0 ")


def test_avx512_join_kernels_match_their_specification(tmp_path):
    """Index unpacking and a word's row sources (tests/native/row_join_check.cpp), under ASan +
    UBSan, with fields that end at an inaccessible page; machines without AVX-512 run it
    emulated (test_shuffle_avx512_emulated.py)."""
    sources = [str(ROOT / "csrc" / f) for f in ("lz/row_join_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "row_join_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith("ok:")


@pytest.mark.parametrize("channels", [16, 24, 32, 64, 100, 384])
def test_frames_with_rows_planes_are_identical_in_every_variant(channels):
    # One row in five new, the others repeats of earlier rows: every plane a rows plane.
    g = torch.Generator().manual_seed(channels)
    distinct = (torch.randn(400, channels, generator=g) * 3).to(torch.bfloat16)
    picks = torch.randint(0, 400, (2000,), generator=g)
    picks[:400] = torch.arange(400)
    x = distinct[picks].contiguous()
    frames = {}
    try:
        for v in VARIANTS:
            use_variant(v)
            frames[v] = bytes(kvcore.compress(x, mode="dense", threads=1))
            assert "rows" in kvcore.frame_info(frames[v])["methods"]
            assert torch.equal(kvcore.decompress(frames[v]).view(torch.int16), x.view(torch.int16))
    finally:
        kvcore.set_disabled_isa("")
    assert len(set(frames.values())) == 1

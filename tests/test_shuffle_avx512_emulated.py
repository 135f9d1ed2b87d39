"""The AVX-512 shuffle, channel-transpose, low-bits, sign-bits, fastcode, Huffman chunk, presence,
value-count and row-join kernels on machines without AVX-512: compiled against SIMDe's portable intrinsics (apt package
libsimde-dev) and compared with the scalar reference or the format's specification.

On a machine with AVX-512 test_shuffle.py runs the real variant; this test still
checks the same source there.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIMDE = Path("/usr/include/simde/x86/avx512.h")


def build_and_run(tmp_path, harness: str, sources: list[str], libs: tuple[str, ...] = ()) -> str:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    if not SIMDE.exists():
        pytest.skip("SIMDe headers missing (apt-get install libsimde-dev)")
    exe = tmp_path / harness
    cmd = [cxx, "-std=c++17", "-O1", "-w", "-DKVCORE_EMULATE_AVX512", f"-I{ROOT / 'csrc'}",
           f"-I{ROOT / 'tests/native'}", str(ROOT / "tests/native" / f"{harness}.cpp"),
           *(str(ROOT / "csrc" / s) for s in sources), *libs, "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def test_avx512_variant_matches_scalar_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "shuffle_avx512_harness", [
        "shuffle/shuffle_avx512.cpp", "shuffle/shuffle_avx2.cpp", "shuffle/shuffle.cpp", "cpu/cpu_features.cpp"])
    assert "0 mismatches" in out


def test_avx512_channel_transposes_match_scalar_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "channel_transpose_check", [
        "shuffle/channel_transpose_avx512.cpp", "shuffle/channel_transpose.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:")


def test_avx512_fastcode_groups_match_the_layout_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "fastcode_avx512_check",
                        ["entropy/fastcode_avx512.cpp", "cpu/cpu_features.cpp", "checksum/xxh3_stripes.cpp"],
                        libs=("-lxxhash",))
    assert out.startswith("ok:") and not out.startswith("ok: 0 ")


def test_avx512_presence_scan_matches_scalar_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "histogram_avx512_check", [
        "entropy/histogram_avx512.cpp", "entropy/histogram.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:") and not out.startswith("ok: 0 ")


def test_avx512_code_chunks_match_the_specification_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "code_chunks_check", ["entropy/code_chunks_avx512.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:") and not out.startswith("ok: 0 ")


def test_avx512_value_counts_match_a_plain_count_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "value_counts_check", [
        "frame/value_counts.cpp", "frame/value_counts_avx2.cpp", "frame/value_counts_avx512.cpp",
        "cpu/cpu_features.cpp"])
    assert out.startswith("ok:") and out.rstrip().endswith("avx512")


def test_avx512_low_bits_join_matches_the_specification_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "low_bits_check", [
        "shuffle/low_bits_avx512.cpp", "shuffle/low_bits.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:")


def test_avx512_sign_bits_packing_matches_the_specification_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "sign_bits_check", [
        "shuffle/sign_bits_avx512.cpp", "shuffle/sign_bits.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:")


def test_avx512_row_join_kernels_match_the_specification_under_emulation(tmp_path):
    out = build_and_run(tmp_path, "row_join_check", ["lz/row_join_avx512.cpp", "cpu/cpu_features.cpp"])
    assert out.startswith("ok:") and not out.startswith("ok: 0 ")


def test_xxh3_stripe_feed_matches_the_library_under_emulation(tmp_path):
    """The decode checksum fed from the merge kernels' registers equals libxxhash's XXH3."""
    out = build_and_run(tmp_path, "xxh3_stripes_check", ["checksum/xxh3_stripes.cpp"], libs=("-lxxhash",))
    assert out.startswith("ok:")

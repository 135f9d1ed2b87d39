"""The low-bits plane method (docs/FORMAT.md, method 8): a byte plane whose low k bits are
close to random is stored as those bits packed raw plus its high bits entropy coded, so the
Huffman decoder handles short symbols. Checked here: the packing against its specification
(a native harness under ASan + UBSan), the encoder's choice of k on planes built to need it,
bit-exact round trips, and frames with edited low-bits payloads."""

import subprocess

import numpy as np
import pytest
import torch

import kvcore

import kvdata
from frame_layout import planes
from native_build import ROOT, build_harness, codec_sources

LOW_BITS = 8  # plane method id


def test_packing_matches_its_specification(tmp_path):
    sources = [str(ROOT / "csrc" / f) for f in ("shuffle/low_bits.cpp", "shuffle/low_bits_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "low_bits_check", sources)
    run = subprocess.run([str(exe), "11"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok:")


@pytest.mark.slow
def test_dense_round_trips_under_sanitizers(tmp_path):
    exe = build_harness(tmp_path, "dense_round_trip", codec_sources())
    run = subprocess.run([str(exe), "2026", "400"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: 400 frames")


def split_plane(k: int, n: int, seed: int) -> np.ndarray:
    """Bytes whose low k bits are uniform and whose high 8 - k bits are 2u, u following a
    geometric law: the plane the split is for, with nothing random above bit k (so the
    encoder should split off exactly k bits)."""
    rng = np.random.default_rng(seed)
    values = np.arange(1 << (7 - k))
    p = 0.85 ** values
    u = rng.choice(values, size=n, p=p / p.sum())
    return (u << (k + 1) | rng.integers(0, 1 << k, size=n)).astype(np.uint8)


def low_bits_of(frame: bytes) -> set[int]:
    """The k of every low-bits plane of a frame."""
    return {frame[at] for method, at, _ in planes(frame) if method == LOW_BITS}


@pytest.mark.parametrize("k", range(1, 7))
@pytest.mark.parametrize("n,block_bytes", [(70001, None), (70001, 16384), (4096 * 3 + 63, 4096)])
def test_encoder_splits_off_exactly_the_random_bits(k, n, block_bytes):
    x = torch.from_numpy(split_plane(k, n, seed=k * 1000 + n))
    frame = kvcore.compress(x, block_bytes=block_bytes)
    assert low_bits_of(frame) == {k}
    assert torch.equal(kvcore.decompress(frame), x)
    assert len(frame) < n  # the high bits did shrink


def test_fast_mode_and_small_planes_keep_whole_bytes():
    x = torch.from_numpy(split_plane(2, 70001, seed=1))
    assert low_bits_of(kvcore.compress(x, mode="fast")) == set()
    assert low_bits_of(kvcore.compress(x[:4000])) == set()  # below the size the split pays at


@pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")
@pytest.mark.parametrize("name", ["minilm_l6_kv", "stories260k_text_kv"])
def test_real_kv_fp16_and_fp8_split_bfloat16_does_not(name):
    fp16 = kvdata.stacked(f"{name}_fp16.safetensors")[:, :8192].contiguous()
    bf16 = kvdata.stacked(f"{name}_bf16.safetensors")[:, :8192].contiguous()
    fp8 = fp16.float().to(torch.float8_e4m3fn)
    for x, splits in ((fp16, True), (fp8, True), (bf16, False)):
        frame = kvcore.compress(x)
        assert bool(low_bits_of(frame)) == splits, x.dtype
        assert torch.equal(kvcore.decompress(frame).view(torch.uint8), x.view(torch.uint8))


BLOCK = 8192  # elements of a uint8 block below: 128 groups of 64


def edited(frame: bytes, edit) -> bytes:
    """The frame with edit(frame, payload offset, inner method offset) applied to the
    first low-bits plane."""
    out = bytearray(frame)
    at = next(at for method, at, _ in planes(frame) if method == LOW_BITS)
    packed = 8 * frame[at] * (BLOCK // 64)
    edit(out, at, at + 1 + packed)
    return bytes(out)


def put(offset: str, value):
    def edit(f: bytearray, at: int, inner: int) -> None:
        pos = at if offset == "k" else inner if offset == "inner" else at + 1
        f[pos] = value(f[pos]) if callable(value) else value
    return edit


@pytest.mark.parametrize(
    "edit",
    [
        put("k", 0),
        put("k", 8),
        put("k", 255),
        put("k", lambda k: k - 1),
        put("packed", lambda b: b ^ 4),
        put("inner", 7),  # rows
        put("inner", LOW_BITS),  # nested
        put("inner", 99),  # unknown
        put("inner", 0),  # raw: the payload has the wrong size for it
    ],
)
def test_edited_low_bits_planes_are_detected(edit):
    x = torch.from_numpy(split_plane(2, 2 * BLOCK, seed=5))
    frame = kvcore.compress(x, block_bytes=BLOCK)
    assert low_bits_of(frame) == {2}
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(edited(frame, edit))

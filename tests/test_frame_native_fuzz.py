"""Builds tests/native/frame_fuzz.cpp (the whole frame decoder, every plane method) with
AddressSanitizer and UBSan and runs it on mutants of real frames.

The Python corruption tests cannot see a read one byte past a buffer; this one can.
Skipped when no C++ compiler with sanitizers is available.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kvcore

import frame_layout
import kvdata
from native_build import ROOT, build_harness, codec_sources

pytestmark = pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")


def seed_frames(tmp_path: Path) -> list[str]:
    t = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[:, :64]
    tensors = kvdata.tensors("stories260k_text_kv_bf16.safetensors")
    v0, v1 = tensors["layer0.v"][:1024], tensors["layer1.v"][:1000]
    picks = torch.randint(0, 400, (2000,), generator=torch.Generator().manual_seed(3))
    repeated = tensors["layer2.k"][:400][picks].contiguous()
    wide = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[2:4, :1024].float()  # 65536 elements
    minilm = kvdata.stacked("minilm_l6_kv_fp16.safetensors")[2:3, :256].contiguous()  # plain by the estimate
    lanes = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[:, :256].contiguous()
    frames = {
        "dense": kvcore.compress(t, block_bytes=4096),  # Huffman and rows planes
        "max": kvcore.compress(t, mode="max", block_bytes=4096),  # signs planes
        "fast": kvcore.compress(t, mode="fast", block_bytes=4096),
        "fp32": kvcore.compress(t[:2].float(), block_bytes=4096),
        # packed planes: the sign alone, and the float16 mantissa's two lowest bits at bit 6
        "packed": kvcore.compress(kvdata.stacked("minilm_l6_kv_fp16.safetensors")[:1, :16].float(), block_bytes=4096),
        "fp8": kvcore.compress(t.float().to(torch.float8_e4m3fn), block_bytes=4096),
        "fp8-fast": kvcore.compress(t.float().to(torch.float8_e4m3fn), mode="fast", block_bytes=4096),  # escapes
        "fp16": kvcore.compress(t.half(), block_bytes=4096),
        # grouped planes without signs: max mode (dense mode charges each table for its decode
        # time, which these small blocks do not repay)
        "grouped": kvcore.compress(t.half(), mode="max", block_bytes=4096),
        "lowbits": kvcore.compress(t.half(), block_bytes=16384),  # low-bits planes (blocks of >= 4096)
        "uint8": kvcore.compress(t.view(torch.uint8), block_bytes=4096),
        "rows-fast": kvcore.compress(v0, mode="fast", block_bytes=16384),
        "rows": kvcore.compress(v0, block_bytes=16384),
        "rows-coded": kvcore.compress(repeated, block_bytes=32768),
        "zstd": kvcore.compress(v1, mode="max", block_bytes=8192),  # (dense keeps zstd only where it saves a quarter)
        "deflate": kvcore.compress(t, backend="software", block_bytes=8192),
        "lanes": kvcore.compress(lanes, block_bytes=65536, decoder="avx512"),  # lane-interleaved Huffman streams
        # Rotated layouts, which dense mode takes from 65536 elements: fp8 (the sign in the low
        # bits the low-bits split packs) and fp16 (the sign in the low plane)
        "fp8-rotated": kvcore.compress(wide.to(torch.float8_e4m3fn), block_bytes=16384),
        "fp16-rotated": kvcore.compress(minilm, block_bytes=32768),
    }
    # Written before the compact Huffman header and packed group maps (tag 3 streams, 4-bit maps)
    with np.load(ROOT / "tests" / "data" / "huffman_tag3.npz") as f:
        for name in ("minilm_bf16_max", "apart_bf16_dense"):
            frames[f"legacy-{name}"] = f[f"frame:{name}"].tobytes()
    assert all(kvcore.frame_info(frames[k])["layout"]["rotate"] for k in ("fp8-rotated", "fp16-rotated"))
    group_maps = {k: {p[3][0] >> 7 for p in frame_layout.block_planes(bytes(f)) if p[2] == 6} for k, f in frames.items()}
    assert group_maps["grouped"] == {1} and group_maps["legacy-apart_bf16_dense"] == {0}
    assert frames["lanes"] != kvcore.compress(lanes, block_bytes=65536)
    # Blocks whose planes share one row table, which decode as whole element rows
    assert all(frame_layout.shared_row_blocks(bytes(frames[k])) for k in ("rows", "rows-fast", "rows-coded"))
    paths = []
    for name, frame in frames.items():
        path = tmp_path / f"{name}.kvc"
        path.write_bytes(frame)
        paths.append(str(path))
    return paths


@pytest.mark.slow
def test_frame_decoder_under_sanitizers(tmp_path):
    exe = build_harness(tmp_path, "frame_fuzz", codec_sources())
    # 30000 mutants, a few seconds (3000 until 2026-12-07, when runs of a million with other seeds
    # found the lane streams' unchecked pad bits, which test_lane_code.py now checks; docs/CHANGES.md).
    run = subprocess.run([str(exe), "2026", "30000", *seed_frames(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok:")
    past_header = int(run.stdout.split(",")[1].split()[0])
    assert past_header > 300, run.stdout  # header edits (checksum recomputed) reach the block decoders

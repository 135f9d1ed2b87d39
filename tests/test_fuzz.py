"""Runs the atheris fuzz targets briefly (the decoder seeded with valid frames of real data,
the round trip of real KV slices with random inputs)."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvcore

import kvdata

FUZZER = Path(__file__).parent / "fuzz" / "fuzz_frame.py"
pytest.importorskip("atheris")


def run_fuzzer(target: str, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run(
        [sys.executable, str(FUZZER), target, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Done" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")
def test_fuzz_decoder_briefly(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    t = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[:, :40]
    g = torch.Generator().manual_seed(4)  # 2 random low bits under 3 random bits: a low-bits plane
    low_bits_plane = (torch.randint(0, 8, (5000,), generator=g) * 8 + torch.randint(0, 4, (5000,), generator=g))
    low_bits_plane = low_bits_plane.to(torch.uint8)
    seeds = {
        "dense": kvcore.compress(t, block_bytes=512),
        "fast": kvcore.compress(t, mode="fast", block_bytes=512),
        "fp32": kvcore.compress(t[:1, :8].float(), block_bytes=256),
        "packed": kvcore.compress(kvdata.stacked("minilm_l6_kv_fp16.safetensors")[:1, :8].float(),
                                  block_bytes=4096),  # packed fields (method 10)
        "constant": kvcore.compress(torch.zeros(64, 8, dtype=torch.bfloat16).repeat(4, 1), block_bytes=1024),
        "rows": kvcore.compress(kvdata.tensors("stories260k_text_kv_bf16.safetensors")["layer0.v"][:256],
                                block_bytes=2048),
        "lowbits": kvcore.compress(low_bits_plane),
        "signs": kvcore.compress(t, mode="max"),  # one block of 400 rows: signs coded by channel
    }
    for name, frame in seeds.items():
        (corpus / name).write_bytes(frame)
    run_fuzzer("decode", "-runs=4000", "-max_len=20000", "-seed=1", str(corpus))


def test_fuzz_roundtrip_briefly():
    run_fuzzer("roundtrip", "-runs=3000", "-max_len=4096", "-len_control=0", "-seed=2")


@pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")
def test_fuzz_kv_slices_briefly(tmp_path):
    """Round trips of real KV slices that the inputs choose and edit (fuzz_kv_slices). The
    fuzzer's coverage (kvcore's Python only) cannot tell those inputs apart, so it would
    mutate a single tiny one; libFuzzer runs every input of the corpus once, so a corpus of
    random inputs is what spreads the runs over dtypes, modes, shapes and methods."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(45)
    for i in range(2000):
        (corpus / f"{i:04}").write_bytes(rng.randbytes(rng.randrange(16, 256)))
    run_fuzzer("kvslices", "-runs=1000", "-max_len=512", "-len_control=0", "-seed=3", str(corpus))

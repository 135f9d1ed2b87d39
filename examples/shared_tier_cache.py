"""A prefix cache in DDR and on SSD that two processes share.

Process A stores the KV cache of a prompt; process B, another engine replica on the same
machine, finds the prefix on the shared SSD directory and restores it layer by layer into
its own tensor (bit-exact), without recomputing it. Both keep the directory within one
capacity.

    python examples/shared_tier_cache.py --tokens 1024 --dir /tmp/kv-ssd
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile

import torch

import kvcore
from kvcore.bench.kvgen import minilm_kv

NAMESPACE = kvcore.Namespace("sentence-transformers/all-MiniLM-L6-v2", "bfloat16", salt="example")


def real_kv(tokens: int) -> torch.Tensor:
    layers = minilm_kv(tokens)
    n = len(layers) // 2
    return torch.stack([torch.stack([layers[f"layer{i}.k"], layers[f"layer{i}.v"]]) for i in range(n)]).to(
        torch.bfloat16)


def replica_b(ssd_dir: str, tokens: list, shape: tuple, reference: torch.Tensor, done) -> None:
    with kvcore.TierManager(ddr_bytes=0, ssd_dir=ssd_dir, ssd_bytes=256 << 20, namespace=NAMESPACE) as tm:
        hit = tm.lookup(tokens)
        print(f"B: lookup finds {hit.tokens} of {len(tokens)} tokens in {sorted(set(hit.tiers))}")
        out = torch.zeros(shape, dtype=torch.bfloat16)
        ready = []
        n = tm.retrieve(tokens, out, on_layer=ready.append)  # an engine could start layer 0 at once
        same = torch.equal(out[:, :, :n].view(torch.int16), reference[:, :, :n].view(torch.int16))
        print(f"B: restored {n} tokens, layers in order {ready}, bit-exact: {same}")
        done.put(same and n == hit.tokens > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--dir", default=None, help="SSD directory (default: a temporary one)")
    args = ap.parse_args()
    ssd_dir = args.dir or tempfile.mkdtemp(prefix="kvcore-ssd-")

    kv = real_kv(args.tokens)
    tokens = list(range(1000, 1000 + args.tokens))  # the prompt's token ids
    with kvcore.TierManager(ddr_bytes=64 << 20, ssd_dir=ssd_dir, ssd_bytes=256 << 20, namespace=NAMESPACE,
                            write_through=True) as tm:
        queued = tm.store(tokens, kv)  # returns at once; compression runs in the background
        tm.flush()
        print(f"A: stored {queued} chunks; lookup: {tm.lookup(tokens).tiers}")
        ctx = mp.get_context("spawn")
        done = ctx.Queue()
        b = ctx.Process(target=replica_b, args=(ssd_dir, tokens, tuple(kv.shape), kv, done))
        b.start()
        ok = done.get(timeout=120)
        b.join(60)
        st = tm.status()["tiers"]
        print(f"A: DDR {st['ddr']['entries']} chunks, {st['ddr']['bytes_used'] / 1e6:.1f} MB; "
              f"SSD {st['ssd']['entries']} chunks, {st['ssd']['bytes_used'] / 1e6:.1f} MB "
              f"(ratio {tm.status()['compression_ratio']:.3f})")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

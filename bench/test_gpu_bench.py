"""GPU <-> host benchmarks (need a CUDA device; skipped without one).

On a 38 MB Qwen3-8B-shaped chunk of real bf16 KV (kvbench.qwen_chunk) held on the GPU:

- copies device -> pinned host and back: kvcore.copy_async into / from a PinnedPool
  buffer against torch's own copy_ to a pinned tensor and to pageable memory (.cpu());
- the tier manager's DDR tier: store() of the GPU chunk until it is compressed and
  placed (flush), and retrieve() into a GPU tensor (whole, and layer by layer with
  on_layer), against the raw round trip a non-compressing CPU tier does (pinned copy
  out, pinned copy back) in the same run.

GB/s are of original (uncompressed) bytes. Results go to bench/results/gpu_bench.json.
Run: python -m pytest bench/test_gpu_bench.py -q -s (about a minute).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import kvcore
from kvbench import qwen_chunk
from kvcore.tiers import Namespace, TierManager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 10
RESULTS: dict = {}


@pytest.fixture(scope="module")
def chunk() -> torch.Tensor:
    return qwen_chunk().cuda()


@pytest.fixture(scope="module")
def pool() -> kvcore.PinnedPool:
    return kvcore.PinnedPool(256 << 20)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def best_gbps(fn, size: int, benchmark=None) -> float:
    """Best of ROUNDS timed calls of fn (each ends synchronised), as GB/s of size bytes;
    under pytest-benchmark when given its fixture (which a test may use only once)."""
    times = []

    def timed():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)

    if benchmark is not None:
        benchmark.pedantic(timed, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    else:
        for _ in range(ROUNDS + 2):
            timed()
        del times[:2]
    return size / min(times) / 1e9


def record(group: str, name: str, value: float) -> None:
    RESULTS.setdefault(group, {})[name] = round(value, 3)


@pytest.mark.parametrize("impl", ["kvcore", "torch_pinned", "torch_pageable"])
def test_device_to_host(benchmark, chunk, pool, impl):
    benchmark.group = "device -> host"
    flat = chunk.reshape(-1).view(torch.uint8)
    if impl == "kvcore":
        buf = pool.alloc(flat.numel())
        fn = lambda: kvcore.copy_async(buf, flat).result()  # noqa: E731
        check = lambda: buf.tensor()  # noqa: E731
    elif impl == "torch_pinned":
        dst = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        fn = lambda: dst.copy_(flat, non_blocking=True)  # noqa: E731
        check = lambda: dst  # noqa: E731
    else:
        box = []
        fn = lambda: box.append(flat.cpu())  # noqa: E731
        check = lambda: box[-1]  # noqa: E731
    record("device_to_host_GBps", impl, best_gbps(fn, flat.numel(), benchmark))
    assert torch.equal(check().cuda(), flat)


@pytest.mark.parametrize("impl", ["kvcore", "torch_pinned"])
def test_host_to_device(benchmark, chunk, pool, impl):
    benchmark.group = "host -> device"
    flat = chunk.reshape(-1).view(torch.uint8)
    dev = torch.empty_like(flat)
    if impl == "kvcore":
        src = pool.alloc(flat.numel())
        src.tensor().copy_(flat.cpu())
        fn = lambda: kvcore.copy_async(dev, src).result()  # noqa: E731
    else:
        src = flat.cpu().pin_memory()
        fn = lambda: dev.copy_(src, non_blocking=True)  # noqa: E731
    record("host_to_device_GBps", impl, best_gbps(fn, flat.numel(), benchmark))
    assert torch.equal(dev, flat)


def test_raw_round_trip_reference(benchmark, chunk):
    """What a non-compressing CPU tier moves: a pinned copy out, and one back."""
    benchmark.group = "tier round trip"
    host = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=True)
    out = torch.empty_like(chunk)
    record("raw_reference_GBps", "store", best_gbps(lambda: host.copy_(chunk), nbytes(chunk)))
    record("raw_reference_GBps", "retrieve", best_gbps(lambda: out.copy_(host), nbytes(chunk), benchmark))
    assert torch.equal(out, chunk)


@pytest.mark.parametrize("codec", ["fast", "dense"])
def test_ddr_tier_from_and_to_the_gpu(benchmark, chunk, codec):
    benchmark.group = "tier round trip"
    tokens = chunk.shape[2]
    tm = TierManager(ddr_bytes=2 << 30, namespace=Namespace("qwen3-8b", "bfloat16", salt="gpu-bench"), codec=codec)
    n = [0]

    def store():
        toks = [n[0] * tokens + k for k in range(tokens)]
        n[0] += 1
        assert tm.store(toks, chunk) == 1
        assert tm.flush(60)

    record(f"ddr_{codec}_GBps", "store", best_gbps(store, nbytes(chunk)))
    out = torch.zeros_like(chunk)
    first = list(range(tokens))
    record(f"ddr_{codec}_GBps", "retrieve",
           best_gbps(lambda: tm.retrieve(first, out), nbytes(chunk), benchmark))
    assert torch.equal(out.view(torch.int16), chunk.view(torch.int16))
    out.zero_()
    record(f"ddr_{codec}_GBps", "retrieve_on_layer",
           best_gbps(lambda: tm.retrieve(first, out, on_layer=lambda layer: None), nbytes(chunk)))
    assert torch.equal(out.view(torch.int16), chunk.view(torch.int16))
    RESULTS[f"ddr_{codec}_GBps"]["ratio"] = round(tm.status()["compression_ratio"], 4)
    tm.close()


def test_summary():
    """Prints every measurement and kvcore's speed relative to the references of this run."""
    ref = RESULTS.get("raw_reference_GBps", {})
    for codec in ("fast", "dense"):
        row = RESULTS.get(f"ddr_{codec}_GBps", {})
        for op in ("store", "retrieve"):
            if op in row and op in ref:
                record("ratios", f"ddr_{codec}_{op}_vs_raw", row[op] / ref[op])
    for group in ("device_to_host_GBps", "host_to_device_GBps"):
        row = RESULTS.get(group, {})
        if "kvcore" in row and "torch_pinned" in row:
            record("ratios", f"{group[:-5]}_kvcore_vs_torch_pinned", row["kvcore"] / row["torch_pinned"])
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["host_threads"] = kvcore.features().get("hardware_threads")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps(RESULTS, indent=1))
    print("\n" + json.dumps(RESULTS, indent=1))

"""Data mover benchmarks: kvcore against numpy and torch measured in the same run.

- copy throughput, 4 KiB .. 64 MiB: kvcore.copy_async(...).result() vs numpy.copyto
  vs torch.Tensor.copy_ (group "copy <size>");
- gather / scatter of 32 KiB KV blocks (16 tokens x 8 heads x 128 dims x bf16), 256
  random blocks of a 1024-block layer: kvcore.gather/scatter vs torch.index_select /
  index_copy_ vs numpy.take / fancy assignment (group "gather" / "scatter");
- the overlapped pipeline copy -> compress of a 38 MB chunk (256 tokens of a
  Qwen3-8B-shaped model) vs the same stages one after the other (group "pipeline").

numpy runs on one thread, so the pair compared is kvcore with threads=1 against numpy, with
torch held to one thread beside them (torch spreads a large copy_ or index_select over its
intra-op threads). kvcore on all hardware threads (threads=None, its default) is measured too,
as "kvcore-allthreads", and reported on a line of its own, never as a factor over numpy.

Run: python -m pytest bench/test_mover_bench.py --benchmark-only -q (about a minute).
Rounds are few; GB/s are in each benchmark's extra_info, and the end-of-run summary gives the
copy / gather / scatter lines (bench/kvbench.py mover_summary_lines).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np
import pytest
import torch

import kvcore
from kvbench import KVCORE_ALL, KVCORE_ONE, TORCH_ONE, Row, record
from kvcore.bench.data import kvdata_dir

KiB, MiB = 1 << 10, 1 << 20
COPY_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
IMPLS = [KVCORE_ONE, "numpy", TORCH_ONE, KVCORE_ALL]


def kvcore_threads(impl: str, cpu_timer: bool) -> Optional[int]:
    """kvcore's threads argument for an impl: 1, or None (all hardware threads; skipped when
    timed in CPU time, which adds up over threads)."""
    if impl != KVCORE_ALL:
        return 1
    if cpu_timer:
        pytest.skip("all threads needs a wall-clock timer (CPU time adds up over threads)")
    return None


@pytest.fixture
def torch_one_thread() -> Iterator[None]:
    """torch held to one intra-op thread while a benchmark runs (its copy_, index_select and
    index_copy_ spread large work over all of them otherwise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def report(benchmark: Any, kv_mover: list, impl: str, nbytes: int) -> None:
    """GB/s in extra_info, and the row the end-of-run summary reads."""
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.mean / 1e9, 2)
    benchmark.extra_info["threads"] = kvcore.features()["hardware_threads"] if impl == KVCORE_ALL else 1
    record(kv_mover, benchmark, Row(benchmark.group, "bytes", impl, "move", nbytes, nbytes))


def _rounds(nbytes: int) -> tuple[int, int]:
    """(rounds, iterations) giving roughly 0.2 s of timed work on this machine."""
    per_iter_s = max(nbytes / 5e9, 2e-6)
    iters = max(1, min(2000, int(0.02 / per_iter_s)))
    return 10, iters


def _human(n: int) -> str:
    return f"{n // MiB}MiB" if n >= MiB else f"{n // KiB}KiB"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", COPY_SIZES, ids=_human)
def test_copy_throughput(benchmark, kv_mover, cpu_timer, torch_one_thread, size, impl):
    benchmark.group = f"copy {_human(size)}"
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    if impl.startswith("kvcore"):
        threads = kvcore_threads(impl, cpu_timer)
        fn = lambda: kvcore.copy_async(dst, src, threads=threads).result()  # noqa: E731
    elif impl == "numpy":
        fn = lambda: np.copyto(dst, src)  # noqa: E731
    else:
        ts, td = torch.from_numpy(src), torch.from_numpy(dst)
        fn = lambda: td.copy_(ts)  # noqa: E731
    rounds, iters = _rounds(size)
    benchmark.pedantic(fn, rounds=rounds, iterations=iters, warmup_rounds=1)
    assert np.array_equal(dst, src)
    report(benchmark, kv_mover, impl, size)


BLOCKS, PICK = 1024, 256
BLOCK_SHAPE = (16, 8, 128)  # bf16: 32 KiB


@pytest.fixture(scope="module")
def paged_layer():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn((BLOCKS, *BLOCK_SHAPE), generator=g).to(torch.bfloat16)
    idx = torch.randperm(BLOCKS, generator=g)[:PICK]
    return kv, idx


@pytest.mark.parametrize("impl", IMPLS)
def test_gather_32k_blocks(benchmark, kv_mover, cpu_timer, torch_one_thread, paged_layer, impl):
    benchmark.group = "gather 256 x 32KiB"
    kv, idx = paged_layer
    out = torch.empty((PICK, *BLOCK_SHAPE), dtype=kv.dtype)
    if impl.startswith("kvcore"):
        ids, threads = idx.numpy(), kvcore_threads(impl, cpu_timer)
        fn = lambda: kvcore.gather(kv, ids, out=out, threads=threads).result()  # noqa: E731
    elif impl == TORCH_ONE:
        fn = lambda: torch.index_select(kv, 0, idx, out=out)  # noqa: E731
    else:
        kvn, outn, ids = kv.view(torch.int16).numpy(), out.view(torch.int16).numpy(), idx.numpy()
        fn = lambda: np.take(kvn, ids, axis=0, out=outn)  # noqa: E731
    benchmark.pedantic(fn, rounds=10, iterations=5, warmup_rounds=1)
    assert torch.equal(out.view(torch.int16), kv[idx].view(torch.int16))
    report(benchmark, kv_mover, impl, out.numel() * 2)


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_32k_blocks(benchmark, kv_mover, cpu_timer, torch_one_thread, paged_layer, impl):
    benchmark.group = "scatter 256 x 32KiB"
    kv, idx = paged_layer
    staging = kv[idx].clone()
    dest = torch.zeros_like(kv)
    if impl.startswith("kvcore"):
        ids, threads = idx.numpy(), kvcore_threads(impl, cpu_timer)
        fn = lambda: kvcore.scatter(staging, dest, ids, threads=threads).result()  # noqa: E731
    elif impl == TORCH_ONE:
        fn = lambda: dest.index_copy_(0, idx, staging)  # noqa: E731
    else:
        dn, sn, ids = dest.view(torch.int16).numpy(), staging.view(torch.int16).numpy(), idx.numpy()

        def fn():
            dn[ids] = sn

    benchmark.pedantic(fn, rounds=10, iterations=5, warmup_rounds=1)
    assert torch.equal(dest[idx].view(torch.int16), staging.view(torch.int16))
    report(benchmark, kv_mover, impl, staging.numel() * 2)


# ---- the overlapped pipeline: copy -> compress of one 38 MB chunk ----
CHUNK_BYTES = 36 * 2 * 8 * 128 * 2 * 256  # 256 tokens of a Qwen3-8B-shaped model (bf16): 37,748,736
PIECES = 6  # the chunk moves in 6 pieces (layer groups), so stage i+1 overlaps stage i
KVDATA = kvdata_dir() / "minilm_l6_kv_bf16.safetensors"


@pytest.fixture(scope="module")
def chunk() -> torch.Tensor:
    """38 MB of real bf16 KV (MiniLM's KV is exactly that size), else random bf16."""
    if KVDATA.exists():
        from safetensors.torch import load_file

        tensors = load_file(str(KVDATA))
        flat = torch.cat([tensors[k].reshape(-1) for k in sorted(tensors)])
    else:  # pragma: no cover - data missing
        flat = torch.randn(CHUNK_BYTES // 2).to(torch.bfloat16)
    assert flat.numel() * 2 == CHUNK_BYTES
    return flat.view(PIECES, -1)


def _pipeline_stages(chunk: torch.Tensor, staging: torch.Tensor, overlapped: bool) -> list:
    if not overlapped:
        kvcore.copy_async(staging, chunk).result()  # the copy stage (stands in for D2H)
        return [kvcore.compress(staging[i]) for i in range(PIECES)]  # then the compress stage
    copies = [kvcore.copy_async(staging[i], chunk[i]) for i in range(PIECES)]
    frames = []
    for i in range(PIECES):
        copies[i].wait()
        frames.append(kvcore.compress_async(staging[i]))  # compress piece i while piece i+1 copies
    return [f.result() for f in frames]


@pytest.mark.parametrize("mode", ["sequential", "overlapped"])
def test_pipeline_copy_compress_38mb(benchmark, chunk, mode):
    if not hasattr(kvcore, "compress_async"):
        pytest.skip("kvcore.compress_async is not built into this version")
    benchmark.group = "pipeline copy+compress 38 MB"
    try:
        pool = kvcore.PinnedPool(64 * MiB)
    except kvcore.OutOfMemoryError:  # RLIMIT_MEMLOCK too low: the same memory, not page-locked
        pool = kvcore.PinnedPool(64 * MiB, lock=False)
    buf = pool.alloc(CHUNK_BYTES)
    staging = buf.tensor(torch.bfloat16, tuple(chunk.shape))
    frames = benchmark.pedantic(
        _pipeline_stages, args=(chunk, staging, mode == "overlapped"), rounds=5, iterations=1, warmup_rounds=1
    )
    back = torch.cat([kvcore.decompress(f) for f in frames])
    assert torch.equal(back.view(torch.int16), chunk.reshape(-1).view(torch.int16))
    benchmark.extra_info["GB/s"] = round(CHUNK_BYTES / benchmark.stats.stats.mean / 1e9, 3)
    benchmark.extra_info["ratio"] = round(sum(len(f) for f in frames) / CHUNK_BYTES, 4)
    del staging

"""CUDA device <-> pinned host copies on the mover's copy streams (GPU only)."""

import asyncio

import numpy as np
import pytest
import torch

import kvcore
from mover_util import make_pool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MiB = 1 << 20


@pytest.fixture(scope="module")
def pool():
    return make_pool(256 * MiB)


def test_pool_is_registered_with_cuda(pool):
    s = pool.stats()
    assert s["cuda_registered"] is True
    buf = pool.alloc(MiB)
    assert buf.tensor().is_pinned()


@pytest.mark.parametrize("size", [1, 4097, 38 * MiB + 3])
def test_device_to_pinned_and_back(pool, size):
    dev = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
    buf = pool.alloc(size)
    fut = kvcore.copy_async(buf, dev)
    assert fut.event is not None
    fut.result()
    assert torch.equal(buf.tensor().cuda(), dev)
    back = torch.zeros_like(dev)
    kvcore.copy_async(back, buf).result()
    assert torch.equal(back, dev)


def test_copy_is_ordered_after_pending_compute_on_the_current_stream(pool):
    x = torch.zeros(16 * MiB // 4, device="cuda")
    for _ in range(20):
        x.add_(1)  # queued on the current stream
    buf = pool.alloc(x.numel() * 4)
    kvcore.copy_async(buf, x).result()
    assert float(buf.tensor(torch.float32)[-1]) == 20.0


def test_consumer_stream_can_wait_on_the_event(pool):
    buf = pool.alloc(4 * MiB)
    buf.tensor()[:] = 5
    dev = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    fut = kvcore.copy_async(dev, buf)
    torch.cuda.current_stream().wait_event(fut.event)
    assert int(dev.sum().item()) == 5 * 4 * MiB


def test_gather_and_scatter_of_gpu_paged_blocks(pool):
    kv = torch.randint(-30000, 30000, (128, 16, 8, 128), dtype=torch.int16, device="cuda")
    ids = [5, 77, 0, 127, 64]
    out = pool.alloc(len(ids) * kv[0].numel() * 2)
    kvcore.gather(kv, ids, out=out).result()
    staged = out.tensor(torch.int16, (len(ids), 16, 8, 128))
    assert torch.equal(staged.cuda(), kv[ids])
    dest = torch.zeros_like(kv)
    kvcore.scatter(out, dest, ids).result()
    assert torch.equal(dest[ids], kv[ids]) and int(dest[1].abs().sum()) == 0
    auto = kvcore.gather(kv, ids).result()  # staging allocated (pinned) by gather
    assert auto.is_pinned() and torch.equal(auto.cuda(), kv[ids])


def test_await_a_cuda_copy(pool):
    dev = torch.ones(8 * MiB, dtype=torch.uint8, device="cuda")
    buf = pool.alloc(8 * MiB)

    async def main():
        return await kvcore.copy_async(buf, dev)

    assert asyncio.run(main()) is buf
    assert int(np.asarray(buf.numpy()).min()) == 1


def test_host_engine_cannot_copy_device_memory(pool):
    dev = torch.ones(16, device="cuda")
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.copy_async(torch.empty(16), dev, engine="cpu")

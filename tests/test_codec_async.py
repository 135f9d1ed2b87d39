"""compress_async / decompress_async: same frames as the synchronous codec,
errors through the Future, and a copy -> compress pipeline that overlaps."""

import asyncio

import numpy as np
import pytest
import torch

import kvcore
import frame_layout
from mover_util import make_pool

pytestmark = pytest.mark.skipif(not hasattr(kvcore, "compress_async"), reason="codec not built into this version")


@pytest.fixture(scope="module")
def kv(kvdata_dir) -> torch.Tensor:
    path = kvdata_dir / "minilm_l6_kv_bf16.safetensors"
    if not path.exists():
        pytest.skip("minilm_l6_kv_bf16.safetensors is not in ../shared/kvdata")
    from safetensors.torch import load_file

    return load_file(str(path))["layer2.k"]  # [4096, 12, 32] bf16, real keys


@pytest.mark.parametrize("mode", ["dense", "fast", "max"])
def test_async_frames_equal_sync_frames(kv, mode):
    frame = kvcore.compress_async(kv, mode=mode).result()
    assert isinstance(frame, bytes)
    assert frame == kvcore.compress(kv, mode=mode)
    back = kvcore.decompress_async(frame).result()
    assert back.dtype == kv.dtype and back.shape == kv.shape
    assert torch.equal(back.view(torch.int16), kv.view(torch.int16))


@pytest.mark.parametrize("backend", ["software", "auto"])
def test_async_deflate_frames_equal_sync_frames(kv, backend):
    """backend= codes DEFLATE planes from the mover's threads, as compress does (ISA-L here;
    "auto" without QAT hardware falls back to it). Their streams are compared by content
    (frame_layout.same_frame): ISA-L has coded a piece two ways within one process."""
    frame = kvcore.compress_async(kv, backend=backend).result()
    assert frame_layout.same_frame(frame, kvcore.compress(kv, backend=backend))
    assert kvcore.frame_info(frame)["methods"]["deflate"]["planes"] > 0
    assert torch.equal(kvcore.decompress_async(frame).result().view(torch.int16), kv.view(torch.int16))


def test_async_qat_backend_without_qat_fails_as_compress_does(kv):
    kvcore.qat.unload()
    if kvcore.features()["qat"]["hardware"]:
        pytest.skip("this machine has QAT")
    with pytest.raises(kvcore.UnsupportedError, match="QAT backend requested but not available"):
        kvcore.compress_async(kv, backend="qat").result()
    with pytest.raises(kvcore.InvalidArgumentError, match="backend must be"):
        kvcore.compress_async(kv, backend="gpu")


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_large_async_frames_on_two_threads(kv, mode):
    """A frame of several MiB into a new bytes object, and a new tensor decoded from it, by two
    threads: their pages are faulted in ahead of the blocks; the frame is the one a single
    thread writes."""
    big = torch.cat([kv, kv.flip(0), kv]).contiguous()
    frame = kvcore.compress_async(big, mode=mode, threads=2).result()
    assert frame == kvcore.compress(big, mode=mode, threads=1)
    back = kvcore.decompress_async(frame, threads=2).result()
    assert torch.equal(back.view(torch.int16), big.view(torch.int16))


def test_decompress_into_a_pinned_buffer(kv):
    pool = make_pool(16 << 20, huge_pages=False)
    buf = pool.alloc(kv.numel() * 2)
    out = buf.tensor(torch.bfloat16, tuple(kv.shape))
    frame = kvcore.compress(kv)
    assert kvcore.decompress_async(memoryview(frame), out=out).result() is out
    assert torch.equal(out.view(torch.int16), kv.view(torch.int16))


def test_small_odd_and_empty_tensors():
    for x in (torch.zeros(0, dtype=torch.float16), torch.arange(7, dtype=torch.uint8), np.ones((3, 5), np.float32)):
        frame = kvcore.compress_async(x).result()
        back = kvcore.decompress_async(frame).result()
        assert np.array_equal(back.numpy(), np.asarray(x))


def test_errors_propagate_through_the_future(kv):
    frame = bytearray(kvcore.compress(kv))
    frame[len(frame) // 2] ^= 0x40
    fut = kvcore.decompress_async(bytes(frame))
    with pytest.raises(kvcore.CorruptFrameError):
        fut.result()
    assert isinstance(fut.exception(), kvcore.CorruptFrameError)

    async def main():
        return await kvcore.decompress_async(bytes(frame))

    with pytest.raises(kvcore.CorruptFrameError):
        asyncio.run(main())
    with pytest.raises(kvcore.KVCoreError):
        kvcore.decompress_async(bytes(frame[:10])).result()
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress_async(bytes(kvcore.compress(kv)), out=torch.empty(kv.shape, dtype=torch.float16))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress_async(kv, mode="tiny")
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress_async(kv, decoder="avx2")


@pytest.mark.parametrize("mode", ["dense", "max"])
def test_async_frames_for_avx512_readers(kv, mode):
    frame = kvcore.compress_async(kv, mode=mode, decoder="avx512").result()
    assert frame == kvcore.compress(kv, mode=mode, decoder="avx512")
    back = kvcore.decompress_async(frame).result()
    assert torch.equal(back.view(torch.int16), kv.view(torch.int16))


def test_pipeline_copy_then_compress_overlapped(kv):
    """Copy piece i+1 into pinned staging while piece i compresses; every frame decodes to its piece."""
    pieces = kv.reshape(8, -1)
    pool = make_pool(16 << 20, huge_pages=False)
    staging = pool.alloc(kv.numel() * 2).tensor(torch.bfloat16, tuple(pieces.shape))
    copies = [kvcore.copy_async(staging[i], pieces[i]) for i in range(8)]
    frames = []
    for i in range(8):
        copies[i].wait()
        frames.append(kvcore.compress_async(staging[i]))

    async def collect():
        return await asyncio.gather(*frames)

    for i, frame in enumerate(asyncio.run(collect())):
        assert torch.equal(kvcore.decompress(frame).view(torch.int16), pieces[i].view(torch.int16))

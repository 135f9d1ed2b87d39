"""Bad arguments to the public API (codec, pinned pool, copies, tier manager) raise a
kvcore error (KVCoreError, mostly InvalidArgumentError), never another exception and
never a native crash: objects of the wrong kind, out-of-range options and shapes whose
size overflows."""

import mmap
import subprocess
import sys

import numpy as np
import pytest
import torch

import kvcore
from kvcore.tiers import RemoteConfig

X = torch.randn(64, 8, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
FRAME = kvcore.compress(X)

BAD_TENSORS = {
    "none": None, "int": 3, "str": "abc", "bytes": b"abc", "list": [1, 2],
    "float64": torch.zeros(3, dtype=torch.float64), "complex": torch.zeros(3, dtype=torch.complex64),
    "bool": torch.zeros(3, dtype=torch.bool), "int32": torch.zeros(3, dtype=torch.int32),
    "numpy float64": np.zeros(3), "rank 9": torch.zeros([1] * 9),
}
BAD_OPTIONS = {
    "mode": dict(mode="tiny"), "mode None": dict(mode=None), "threads 0": dict(threads=0),
    "threads -1": dict(threads=-1), "threads float": dict(threads=1.5), "threads str": dict(threads="2"),
    "block_bytes 0": dict(block_bytes=0), "block_bytes -5": dict(block_bytes=-5),
    "block_bytes 63": dict(block_bytes=63), "block_bytes 2**40": dict(block_bytes=1 << 40),
    "block_bytes 17 MiB": dict(block_bytes=17 << 20), "block_bytes bool": dict(block_bytes=True),
    "backend": dict(backend="nope"), "out too small": dict(out=bytearray(5)),
    "out read-only": dict(out=b"x" * 4096), "out strided": dict(out=np.zeros(8192, np.uint8)[::2]),
    "out str": dict(out="str"),
}
BAD_FRAMES = {
    "none": None, "int": 3, "str": "abc", "list": [1, 2], "empty": b"", "magic only": b"KV",
    "truncated": FRAME[:10], "one byte short": FRAME[:-1], "one byte long": FRAME + b"x",
    "strided view": memoryview(FRAME)[::2], "float tensor": torch.zeros(5),
    "cuda-less meta tensor": torch.empty(16, dtype=torch.uint8, device="meta"),
}



def _released_memoryview(size: int) -> memoryview:
    view = memoryview(bytearray(size))
    view.release()
    return view


def _closed_mmap(size: int) -> mmap.mmap:
    m = mmap.mmap(-1, size)
    m.close()
    return m


def _freed_pinned_buffer(size: int) -> "kvcore.PinnedBuffer":
    buf = kvcore.PinnedPool(1 << 20).alloc(size)
    buf.free()
    return buf


# Buffer objects that no longer give their memory: memoryview() raises ValueError or BufferError
# for them, which reached the caller as such, not as a kvcore error.
DEAD_BUFFERS = {"released memoryview": _released_memoryview, "closed mmap": _closed_mmap,
                "freed pinned buffer": _freed_pinned_buffer}
BAD_FRAMES.update({name: make(len(FRAME)) for name, make in DEAD_BUFFERS.items()})
BAD_OPTIONS.update({f"out {name}": dict(out=make(1 << 16)) for name, make in DEAD_BUFFERS.items()})


@pytest.mark.parametrize("name", BAD_TENSORS)
def test_compress_rejects_inputs(name):
    with pytest.raises(kvcore.KVCoreError):
        kvcore.compress(BAD_TENSORS[name])


@pytest.mark.parametrize("name", BAD_OPTIONS)
def test_compress_rejects_options(name):
    with pytest.raises(kvcore.KVCoreError):
        kvcore.compress(X, **BAD_OPTIONS[name])


@pytest.mark.parametrize("name", [n for n in BAD_OPTIONS if "out" not in n and n != "backend"])
def test_compress_async_rejects_options(name):
    with pytest.raises(kvcore.KVCoreError):
        kvcore.compress_async(X, **BAD_OPTIONS[name]).result(timeout=30)


@pytest.mark.parametrize("name", BAD_FRAMES)
def test_decoders_reject_frames(name):
    frame = BAD_FRAMES[name]
    for call in (kvcore.decompress, kvcore.frame_info, kvcore.frame_desc,
                 lambda f: kvcore.decompress_many([f], [torch.empty_like(X)])):
        with pytest.raises(kvcore.KVCoreError):
            call(frame)


def test_a_frame_held_in_a_cpu_tensor_decodes():
    held = torch.frombuffer(bytearray(FRAME), dtype=torch.uint8)
    assert torch.equal(kvcore.decompress(held).view(torch.int16), X.view(torch.int16))
    assert kvcore.frame_info(held)["shape"] == tuple(X.shape)


@pytest.mark.parametrize("args", [
    dict(frames=None, outs=[]), dict(frames=[FRAME], outs=None), dict(frames=[FRAME], outs=[]),
    dict(frames=[FRAME], outs=[torch.empty_like(X)], on_done=3),
])
def test_decompress_many_rejects_arguments(args):
    with pytest.raises(kvcore.KVCoreError):
        kvcore.decompress_many(**args)


@pytest.mark.parametrize("xs", [None, 3, X, np.zeros((2, 3), np.float32), b"ab"])
def test_compress_many_rejects_a_non_list(xs):
    """A tensor or array where a list of them was meant is refused, not split into rows."""
    with pytest.raises(kvcore.KVCoreError):
        kvcore.compress_many(xs)


def test_compress_many_takes_any_iterable():
    frames = kvcore.compress_many(X[i:i + 8] for i in range(0, 64, 8))
    assert frames == [kvcore.compress(X[i:i + 8]) for i in range(0, 64, 8)]


@pytest.mark.parametrize("shape", [(-3,), (2.5,), "abc", None, (True, 3)])
def test_max_frame_size_rejects_shapes(shape):
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.max_frame_size(torch.bfloat16, shape)


def test_max_frame_size_takes_numpy_dtypes():
    """max_frame_size(arr.dtype, arr.shape) for a numpy array that compress() takes: numpy's
    float16 was refused as "does not code float16" while float16 was listed as supported."""
    for np_dtype, dtype in ((np.float16, torch.float16), (np.dtype("float32"), torch.float32), ("uint8", torch.uint8)):
        assert kvcore.max_frame_size(np_dtype, (64, 8)) == kvcore.max_frame_size(dtype, (64, 8))
    for bad in (None, "nope", object(), np.float64, np.dtype(">f2")):
        with pytest.raises(kvcore.InvalidArgumentError):
            kvcore.max_frame_size(bad, (64, 8))


def test_max_frame_size_of_overflowing_shapes_is_an_error_not_a_crash():
    """A product of dimensions that wraps around 2^64 once divided by zero natively
    (SIGFPE), also in an empty tensor's channel count; a tensor needing more than
    2^32 - 1 blocks was truncated. Run in a child process, so that a crash shows as a
    failure of this test alone."""
    code = (
        "import torch, kvcore\n"
        "for shape, bb in [((1 << 62, 1 << 62), None), ((1 << 40, 1 << 40), None), ((1 << 63,), None),\n"
        "                  ((1 << 40,), 64)]:\n"
        "    try:\n"
        "        kvcore.max_frame_size(torch.uint8, shape, block_bytes=bb)\n"
        "    except kvcore.InvalidArgumentError:\n"
        "        continue\n"
        "    raise SystemExit(f'{shape} was accepted')\n"
        "assert kvcore.max_frame_size(torch.uint8, (0, 1 << 40, 1 << 40)) < 100  # empty: a header\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_max_frame_size_bounds_real_frames():
    for shape in [(0,), (1,), (3, 0, 5), (256, 8, 128), (4097, 33)]:
        x = torch.zeros(shape, dtype=torch.bfloat16)
        assert len(kvcore.compress(x, mode="fast")) <= kvcore.max_frame_size(x.dtype, x.shape)


def test_set_disabled_isa_rejects_a_non_string():
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.set_disabled_isa(3)


@pytest.mark.parametrize("args", [
    dict(capacity_bytes=0), dict(capacity_bytes=3.5), dict(capacity_bytes="x"), dict(capacity_bytes=True),
    dict(capacity_bytes=1 << 20, alignment=-4096), dict(capacity_bytes=1 << 20, alignment=3),
    dict(capacity_bytes=1 << 20, segment_bytes=0), dict(capacity_bytes=1 << 20, numa_node=-2),
])
def test_pinned_pool_rejects_arguments(args):
    with pytest.raises(kvcore.KVCoreError):
        kvcore.PinnedPool(**args)


@pytest.mark.parametrize("nbytes", [-1, 3.5, "x", None])
def test_pinned_alloc_rejects_sizes(nbytes):
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.PinnedPool(1 << 20).alloc(nbytes)


def test_a_freed_pinned_buffer_gives_no_views():
    buf = kvcore.PinnedPool(1 << 20).alloc(4096)
    buf.free()
    with pytest.raises(kvcore.InvalidArgumentError):
        buf.tensor()
    with pytest.raises(kvcore.InvalidArgumentError):
        buf.numpy()


@pytest.mark.parametrize("pairs", [None, 3, [(torch.zeros(4, dtype=torch.uint8),)]])
def test_copy_many_rejects_pairs(pairs):
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.copy_many(pairs)


@pytest.mark.parametrize("options", [
    dict(ddr_bytes=1.5), dict(ddr_bytes="x"), dict(ddr_bytes=-1), dict(ddr_bytes=1 << 20, frame_bytes=0),
    dict(ddr_bytes=1 << 20, chunk_tokens=0), dict(ddr_bytes=1 << 20, ttl_s=float("nan")),
    dict(ddr_bytes=1 << 20, hot_refresh_s=0), dict(ddr_bytes=1 << 20, read_ahead=-1),
    dict(ddr_bytes=1 << 20, bogus=1), dict(bogus=1),
    dict(ddr_bytes=1 << 20, remote_url=3), dict(ddr_bytes=1 << 20, remote="redis://127.0.0.1:6379/0"),
    dict(ddr_bytes=1 << 20, remote=RemoteConfig(op_timeout_s=-1)),
    dict(ddr_bytes=1 << 20, remote=RemoteConfig(lookup_timeout_s=float("inf"))),
    dict(ddr_bytes=1 << 20, remote=RemoteConfig(workers=0)), dict(ddr_bytes=1 << 20, remote=RemoteConfig(url="")),
    dict(ddr_bytes=1 << 20, remote=RemoteConfig(part_bytes=1.5)), dict(ddr_bytes=1 << 20, remote=RemoteConfig(cluster=1)),
])
def test_tier_manager_rejects_configurations(options):
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.TierManager(**options)


def test_tier_manager_takes_timeouts_longer_than_threading_can_wait():
    # Past threading.TIMEOUT_MAX, Python's waits overflow: the worker thread died of a
    # hot_refresh_s of 1e10, and flush/close raised OverflowError (close half-way through).
    tm = kvcore.TierManager(ddr_bytes=16 << 20, chunk_tokens=16, hot_refresh_s=1e10)
    kv = torch.zeros(1, 2, 16, 2, 8, dtype=torch.bfloat16)
    tm.store(list(range(16)), kv)
    assert tm.flush(timeout=2.0**70) and tm.flush(timeout=1e300)
    assert tm.lookup(list(range(16))).tokens == 16
    assert tm.close(timeout=1e10) and not tm._worker.is_alive()


def test_tier_manager_rejects_arguments():
    tm = kvcore.TierManager(ddr_bytes=16 << 20, chunk_tokens=16)
    try:
        tokens = list(range(16))
        out = torch.empty(1, 2, 16, 2, 8, dtype=torch.bfloat16)
        for call in (lambda: tm.set_ttl(tokens, float("nan")), lambda: tm.set_ttl(tokens, "x"),
                     lambda: tm.estimate(tokens, float("nan")), lambda: tm.evict(nbytes="x"),
                     lambda: tm.evict(count=-1), lambda: tm.flush(timeout="x"), lambda: tm.flush(timeout=-1),
                     lambda: tm.close(timeout="x"), lambda: tm.close(timeout=float("nan")),
                     lambda: tm.retrieve(tokens, out, on_layer=3)):
            with pytest.raises(kvcore.InvalidArgumentError):
                call()
    finally:
        tm.close()


def test_object_arrays_are_not_byte_buffers():
    # compress(out=) wrote a frame over the pointers of a numpy object array, whose
    # cleanup then crashed the process; copies and gathers would have done the same.
    x = torch.randn(64, 4, 8).to(torch.bfloat16)
    ones = np.ones(8192, np.uint8)
    calls = [lambda o: kvcore.compress(x, out=o), lambda o: kvcore.copy_async(o, ones),
             lambda o: kvcore.copy_async(memoryview(o), ones), lambda o: kvcore.copy_async(ones, o),
             lambda o: kvcore.gather(np.ones((2, 64), np.uint8), out=o), lambda o: kvcore.scatter(ones[:128], o.reshape(-1, 64))]
    for call in calls:
        objects = np.zeros(8192, dtype=object)
        with pytest.raises(kvcore.InvalidArgumentError, match="Python objects"):
            call(objects)
        assert (objects == 0).all()


def test_byte_tensor_of_a_numpy_array():
    # The CUDA copy paths view host buffers through byte_tensor; a numpy array raised NameError.
    from kvcore.mover.regions import byte_tensor, region

    arr = np.arange(16, dtype=np.uint8)
    t = byte_tensor(region(arr, writable=True, what="dst"), arr)
    assert t.dtype == torch.uint8 and t.tolist() == list(range(16))
    t[0] = 99
    assert arr[0] == 99


def test_decoded_tensor_too_large_to_allocate_is_out_of_memory(monkeypatch):
    # A frame may decode to a million times its size (16 MiB blocks of one value take
    # about 17 bytes each): the allocator's refusal is a kvcore error.
    frame = kvcore.compress(torch.zeros(1000, dtype=torch.bfloat16))

    def refuse(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(torch, "empty", refuse)
    with pytest.raises(kvcore.OutOfMemoryError, match="2000 bytes"):
        kvcore.decompress(frame)



@pytest.mark.parametrize("make", [lambda: torch.zeros(1, dtype=torch.uint8).expand(1 << 61),
                                  lambda: np.broadcast_to(np.zeros(1, np.uint8), (1 << 61,))],
                         ids=["expanded tensor", "broadcast array"])
def test_input_too_large_to_copy_is_out_of_memory(make):
    # A view of stride 0 stands for far more memory than it holds: its contiguous copy (2**61
    # bytes here, past any address space) was refused with torch's RuntimeError.
    for call in (kvcore.compress, kvcore.analyze, lambda x: kvcore.compress_many([x]), kvcore.compress_async):
        with pytest.raises(kvcore.OutOfMemoryError, match=str(1 << 61)):
            call(make())


def exotic_tensors() -> dict:
    import warnings

    x = torch.randn(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized and nested tensors are deprecated / prototype
        return {"sparse": x.to_sparse(), "csr": x.to_sparse_csr(), "meta": torch.empty(64, 8, device="meta"),
                "negated view": torch._neg_view(x), "quantized": torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
                "nested": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])}


@pytest.mark.parametrize("kind", list(exotic_tensors()))
def test_tensors_without_plain_memory_are_refused(kind):
    # Sparse, nested, quantized and meta tensors raised torch's RuntimeError or
    # NotImplementedError; a negated view (its memory holds the values before negation)
    # was copied raw: compress gave back the values un-negated.
    t = exotic_tensors()[kind]
    tm = kvcore.TierManager(ddr_bytes=8 << 20, chunk_tokens=16)
    frame = kvcore.compress(torch.randn(64, 8))
    calls = [lambda: kvcore.decompress(frame, out=t), lambda: kvcore.compress(torch.randn(4), out=t),
             lambda: kvcore.decompress(t), lambda: kvcore.copy_async(t, torch.randn(64, 8)),
             lambda: kvcore.copy_async(torch.randn(64, 8), t), lambda: kvcore.gather(t),
             lambda: kvcore.gather(torch.randn(64, 8), t), lambda: tm.store(list(range(16)), t),
             lambda: tm.retrieve(list(range(16)), t)]
    if kind != "negated view":
        calls += [lambda: kvcore.compress(t), lambda: kvcore.compress_async(t)]
    try:
        for call in calls:
            with pytest.raises(kvcore.InvalidArgumentError):
                call()
    finally:
        tm.close()


def test_negated_view_is_compressed_with_its_values():
    x = torch._neg_view(torch.arange(8, dtype=torch.float32))
    assert torch.equal(kvcore.decompress(kvcore.compress(x)), -torch.arange(8, dtype=torch.float32))
    frame = kvcore.compress_async(x).result(10)
    assert torch.equal(kvcore.decompress(frame), -torch.arange(8, dtype=torch.float32))


def test_compress_into_its_own_input_is_refused_by_name():
    # The overlap check is shared with decompress_many, whose wording it used.
    x = torch.randn(4096, 64).to(torch.bfloat16)
    buf = torch.zeros(x.numel() * 2 + kvcore.max_frame_size(x.dtype, tuple(x.shape)), dtype=torch.uint8)
    src = buf[: x.numel() * 2].view(torch.bfloat16).view(x.shape)
    src.copy_(x)
    with pytest.raises(kvcore.InvalidArgumentError, match="compress: an output overlaps a tensor being compressed"):
        kvcore.compress(src, out=buf[100:])
    assert torch.equal(src.view(torch.int16), x.view(torch.int16))

"""CPU copy engine through the public API: sizes, alignment, variants,
copy_many, gather/scatter, futures and asyncio, error propagation."""

import asyncio
import gc
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import kvcore
from mover_util import make_pool
from kvcore import _native

MiB = 1 << 20
SIZES = [0, 1, 7, 63, 4095, 4096, 65537, MiB + 3, 3 * MiB + 5, 37 * MiB + 1]


def rand_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(params=["avx2", "scalar"])
def isa(request):
    if request.param == "avx2" and "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("CPU has no AVX2")
    kvcore.set_disabled_isa("" if request.param == "avx2" else "avx2")
    yield request.param
    kvcore.set_disabled_isa("")


@pytest.mark.parametrize("size", SIZES)
def test_copy_async_every_size(size, isa):
    src = rand_bytes(size, size)
    dst = np.zeros(size, np.uint8)
    assert kvcore.copy_async(dst, src).result() is dst
    assert np.array_equal(dst, src)


def test_copy_256_mib():
    n = 256 * MiB
    src = rand_bytes(n, 7)
    dst = np.empty(n, np.uint8)
    kvcore.copy_async(dst, src).result()
    assert np.array_equal(dst, src)
    dst[::4096] = 0
    kvcore.copy_async(dst, src, threads=1).result()
    assert np.array_equal(dst, src)


@pytest.mark.parametrize("size", [1, 33, 4097, 300_001, 2 * MiB + 77])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 3), (31, 17), (5, 0)])
def test_streaming_variant_on_unaligned_pointers(size, offsets, isa):
    """nt_threshold=1 forces the streaming (non-temporal) kernel for every size."""
    do, so = offsets
    src_buf = rand_bytes(size + 64, size)
    dst_buf = np.zeros(size + 64, np.uint8)
    src = src_buf[so : so + size]
    dst = dst_buf[do : do + size]
    addr = lambda a: np.array([a.__array_interface__["data"][0]], np.uint64)  # noqa: E731
    _native.mover_copy_segments(addr(dst), addr(src), np.array([size], np.uint64), 1, 0, 1, False)
    assert np.array_equal(dst, src)
    assert not dst_buf[:do].any() and not dst_buf[do + size :].any()  # nothing written outside


def sysfs_last_level_cache() -> int:
    """cpu0's highest-level data or unified cache as the kernel describes it (0 if not)."""
    import pathlib
    best = (0, 0)
    for d in sorted(pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        if kind != "Instruction" and size.rstrip("KM").isdigit():
            best = max(best, (int(level), int(size.rstrip("KM")) * scale))
    return best[1]


def test_llc_size_is_the_kernels():
    """The copy engine streams copies above this size. glibc's sysconf derives it from cpuid,
    which a hypervisor may fill with the host's figures (320 MiB on an AMD EPYC VM whose
    kernel, and lscpu, report a 32 MiB L3)."""
    expected = sysfs_last_level_cache()
    if not expected:
        pytest.skip("no cache description in /sys")
    assert _native.llc_bytes() == expected


def test_copy_into_larger_destination_and_mixed_types():
    src = torch.arange(1000, dtype=torch.float32)
    dst = bytearray(8000)
    kvcore.copy_async(dst, src).result()
    assert np.array_equal(np.frombuffer(dst, np.float32)[:1000], src.numpy())
    assert not any(dst[4000:])
    with pytest.raises(kvcore.BufferTooSmallError):
        kvcore.copy_async(bytearray(10), src)


def test_copy_to_and_from_pinned_buffers():
    pool = make_pool(64 * MiB, huge_pages=False)
    src = rand_bytes(38 * MiB, 1)
    buf = pool.alloc(src.nbytes)
    kvcore.copy_async(buf, src).result()
    back = torch.empty(src.nbytes, dtype=torch.uint8)
    kvcore.copy_async(back, buf).result()
    assert np.array_equal(back.numpy(), src)
    buf.free()  # the finished copies hold no export any more


def test_pinned_buffer_cannot_be_freed_while_a_copy_uses_it():
    pool = make_pool(64 * MiB, huge_pages=False)
    buf = pool.alloc(48 * MiB)
    fut = kvcore.copy_async(buf, np.ones(48 * MiB, np.uint8))
    try:
        buf.free()
    except kvcore.InvalidArgumentError:
        pass  # still in flight: refused
    fut.result()
    buf.free()


@pytest.mark.parametrize("call", ["copy_async", "copy_many"])
def test_a_pinned_buffer_is_free_once_done_says_the_copy_finished(call):
    """done() answered True while the Future still held its buffers' exports until wait(),
    result() or kvcore's notifier let go of them: a free() right after it was refused."""
    pool = make_pool(64 * MiB, huge_pages=False)
    src = np.ones(8 * MiB, np.uint8)
    for _ in range(20):
        buf = pool.alloc(src.nbytes)
        fut = kvcore.copy_async(buf, src) if call == "copy_async" else kvcore.copy_many([(buf, src)])
        while not fut.done():
            pass
        buf.free()  # refused before: an export still held
        fut.result()


def test_a_freed_pinned_buffer_is_an_invalid_argument_everywhere():
    """Each operation raised Python's BufferError (from memoryview()) for a freed PinnedBuffer."""
    pool = make_pool(MiB, huge_pages=False)
    buf = pool.alloc(4096)
    buf.free()
    data = np.zeros(4096, np.uint8)
    calls = {
        "copy_async dst": lambda: kvcore.copy_async(buf, data),
        "copy_async src": lambda: kvcore.copy_async(data, buf),
        "copy_many": lambda: kvcore.copy_many([(data, data), (data, buf)]),
        "gather out": lambda: kvcore.gather(np.zeros((4, 1024), np.uint8), [0], out=buf),
        "gather blocks": lambda: kvcore.gather([buf], [0]),
        "scatter staging": lambda: kvcore.scatter(buf, np.zeros((4, 4096), np.uint8), [0]),
        "scatter blocks": lambda: kvcore.scatter(data, [buf], [0]),
        "decompress_async frame": lambda: kvcore.decompress_async(buf),
    }
    for name, call in calls.items():
        with pytest.raises(kvcore.InvalidArgumentError, match="freed"):
            call()
            pytest.fail(name)
    assert pool.stats()["used"] == 0


def _dead_buffers() -> dict:
    import mmap

    released = memoryview(bytearray(4096))
    released.release()
    closed = mmap.mmap(-1, 4096)
    closed.close()
    return {"released memoryview": released, "closed mmap": closed}


@pytest.mark.parametrize("kind", ["released memoryview", "closed mmap"])
def test_a_buffer_that_gives_no_memory_is_an_invalid_argument_everywhere(kind):
    """A released memoryview or a closed mmap raised Python's ValueError (from memoryview())."""
    dead = _dead_buffers()[kind]
    data = np.zeros(4096, np.uint8)
    calls = {
        "copy_async dst": lambda: kvcore.copy_async(dead, data),
        "copy_async src": lambda: kvcore.copy_async(data, dead),
        "copy_many": lambda: kvcore.copy_many([(data, data[:0]), (data, dead)]),
        "gather out": lambda: kvcore.gather(np.zeros((4, 1024), np.uint8), [0], out=dead),
        "gather blocks": lambda: kvcore.gather([dead], [0]),
        "scatter staging": lambda: kvcore.scatter(dead, np.zeros((4, 4096), np.uint8), [0]),
        "scatter blocks": lambda: kvcore.scatter(data, [dead], [0]),
    }
    for name, call in calls.items():
        with pytest.raises(kvcore.InvalidArgumentError, match="gives no memory"):
            call()
            pytest.fail(name)


class _TimedOutCopy:
    """A native operation that failed as a DSA copy the device did not finish in time
    (device_timed_out) or as any other backend failure."""

    def __init__(self, device_timed_out: bool) -> None:
        self.timed_out = device_timed_out

    def notify_with(self, token):
        pass  # the test finishes the Future itself

    def done(self):
        return True

    def wait(self, timeout):
        return True

    def check(self):
        error = kvcore.DeviceTimeoutError if self.timed_out else kvcore.BackendError
        raise error("DSA memmove on wq0.0 did not complete in 5000 ms")

    def device_timed_out(self):
        return self.timed_out


def check_a_failed_copy_keeps_its_buffers_only_after_a_timeout(monkeypatch, timed_out, native, src, **kwargs):
    """Runs copy_async(PinnedBuffer, src, **kwargs) with the native call `native` failing
    (DeviceTimeoutError when timed_out, else BackendError), and checks that the Future
    keeps both buffers after it exactly when the device timed out."""
    from kvcore.mover import copy as mover_copy

    pool = make_pool(MiB, huge_pages=False)
    buf = pool.alloc(src.nbytes)
    src_alive = weakref.ref(src)
    monkeypatch.setattr(mover_copy._native, native, lambda *args: _TimedOutCopy(timed_out))
    fut = kvcore.copy_async(buf, src, **kwargs)
    del src
    fut._part_finished()  # as kvcore's notifier does when the operation ends
    with pytest.raises(kvcore.DeviceTimeoutError if timed_out else kvcore.BackendError):
        fut.result()
    del fut
    gc.collect()
    assert (buf.exports > 0, src_alive() is not None) == (timed_out, timed_out)
    if not timed_out:
        buf.free()


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_copy_the_device_may_still_run_keeps_its_buffers(monkeypatch, timed_out):
    """A DSA descriptor that timed out may still be run by the device, which then writes the
    destination (and reads the source). The failed Future let go of its buffers like any
    other, so a PinnedBuffer could be freed and handed out again, and an array freed, while
    the device could still write it. A DeviceTimeoutError now keeps them for good; any
    other failure still lets them go."""
    check_a_failed_copy_keeps_its_buffers_only_after_a_timeout(
        monkeypatch, timed_out, "mover_copy", torch.ones(512 * 1024, dtype=torch.uint8), engine="dsa")


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_started_fast_copy_the_device_may_still_run_keeps_its_buffers(monkeypatch, timed_out):
    """The same for a copy copy_async's fast path started (engine="auto" may give it to DSA):
    a DeviceTimeoutError keeps its exports of both buffers for good."""
    check_a_failed_copy_keeps_its_buffers_only_after_a_timeout(
        monkeypatch, timed_out, "mover_submit_pair", np.ones(512 * 1024, np.uint8))


def test_an_inline_copy_the_device_may_still_run_keeps_its_buffers(monkeypatch):
    """A small copy runs inline, and engine="auto" may still give it to DSA: its
    DeviceTimeoutError, raised by the call itself, released the PinnedBuffer's export
    (release_exports_on_error) while the device might write it. (copy_async's native
    fast path declines a copy that auto gives to DSA, as stood in for here.)"""
    from kvcore.mover import copy as mover_copy

    def mover_copy_timing_out(*args):
        raise kvcore.DeviceTimeoutError("DSA batch on wq0.0 did not complete in 5000 ms")

    pool = make_pool(MiB, huge_pages=False)
    buf = pool.alloc(128 * 1024)
    monkeypatch.setattr(mover_copy._native, "mover_copy_small", lambda *args: False)
    monkeypatch.setattr(mover_copy._native, "mover_copy", mover_copy_timing_out)
    with pytest.raises(kvcore.DeviceTimeoutError):
        kvcore.copy_async(buf, np.zeros(128 * 1024, np.uint8))
    gc.collect()
    assert buf.exports > 0
    with pytest.raises(kvcore.InvalidArgumentError):
        buf.free()


def test_overlapping_copy_behaves_like_memmove():
    a = np.arange(10 * MiB, dtype=np.uint8)
    expect = a.copy()
    expect[1000:] = a[:-1000].copy()
    kvcore.copy_async(a[1000:], a[:-1000]).result()
    assert np.array_equal(a, expect)


def test_a_failed_call_leaves_no_export_of_a_pinned_buffer():
    """A call that failed after taking the export of a PinnedBuffer left it to the frames
    of the exception's traceback: while the caller kept the exception, free() was refused."""
    pool = make_pool(MiB, huge_pages=False)
    layer = np.zeros((4, 4096), np.uint8)
    calls = {
        "copy_async": lambda buf: kvcore.copy_async(buf, np.zeros(8192, np.uint8)),
        "copy_many": lambda buf: kvcore.copy_many([(buf, layer[0]), (layer[1], None)]),
        "gather out": lambda buf: kvcore.gather(layer, [0, 1], out=buf),
        "gather blocks": lambda buf: kvcore.gather([buf, layer[0, :100]], [0]),
        "scatter staging": lambda buf: kvcore.scatter(buf, layer, [0, 1]),
        "scatter blocks": lambda buf: kvcore.scatter(layer, [buf, layer[0]], [0, 1]),
        "engine": lambda buf: kvcore.copy_async(buf, layer[0], engine="no such engine"),
        "decompress_async": lambda buf: kvcore.decompress_async(buf),
    }
    for name, call in calls.items():
        buf = pool.alloc(4096)
        with pytest.raises(kvcore.KVCoreError) as kept:  # keeps the traceback
            call(buf)
        assert buf.exports == 0, name
        buf.free()
        del kept
    assert pool.stats()["used"] == 0


def test_copies_whose_result_depends_on_their_order_are_refused():
    """Copies of one operation run in any order or at once: where one wrote what another
    read or wrote, the result was silently wrong (gather into out one block after the
    blocks it read gave every block the first block's bytes)."""
    def layer():
        return np.stack([np.full(4096, i, np.uint8) for i in range(8)])

    kv = layer()
    calls = {
        "gather out over later blocks": lambda: kvcore.gather(kv, list(range(7)), out=kv[1:8]),
        "scatter staging over later blocks": lambda: kvcore.scatter(kv[0:7], kv, list(range(1, 8))),
        "copy_many chain": lambda: kvcore.copy_many([(kv[i + 1], kv[i]) for i in range(7)]),
        "scatter to one buffer twice": lambda: kvcore.scatter(kv[0:2], [kv[5], kv[5]], [0, 1]),
        "scatter to an expanded tensor": lambda: kvcore.scatter(
            torch.ones(2, 4096, dtype=torch.uint8), torch.zeros(1, 4096, dtype=torch.uint8).expand(3, 4096), [0, 2]),
        "copy_many to overlapping halves": lambda: kvcore.copy_many([(kv[0, :3000], kv[1, :3000]), (kv[0, 2000:], kv[2, 2000:])]),
    }
    for name, call in calls.items():
        with pytest.raises(kvcore.InvalidArgumentError, match="order"):
            call()
            pytest.fail(name)
    assert np.array_equal(kv, layer())  # nothing was written

    # What is independent still runs: repeated reads, a compaction whose reads and writes
    # do not meet, and copies that each overlap only their own source (memmove).
    assert np.array_equal(kvcore.gather(kv, [3, 3, 1]).result()[:, 0], [3, 3, 1])
    kvcore.gather(kv, [5, 6], out=kv[0:2]).result()
    assert list(kv[:, 0]) == [5, 6, 2, 3, 4, 5, 6, 7]
    a, b = np.arange(100, dtype=np.uint8), np.arange(100, 200, dtype=np.uint8)
    kvcore.copy_many([(a[10:], a[:90]), (b[:90], b[10:]), (a[:0], b[:0])]).result()
    assert list(a[10:13]) == [0, 1, 2] and list(b[:3]) == [110, 111, 112]


def test_bad_arguments():
    with pytest.raises(kvcore.InvalidArgumentError, match="read-only"):
        kvcore.copy_async(b"immutable", b"x")
    with pytest.raises(kvcore.InvalidArgumentError, match="contiguous"):
        kvcore.copy_async(np.zeros(10), np.zeros(20)[::2])
    with pytest.raises(kvcore.InvalidArgumentError, match="contiguous"):
        kvcore.copy_async(torch.zeros(4, 4).t(), torch.zeros(16))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.copy_async(np.zeros(4), 3.5)
    with pytest.raises(kvcore.InvalidArgumentError, match="engine"):
        kvcore.copy_async(np.zeros(4), np.zeros(4), engine="gpu")
    with pytest.raises(kvcore.InvalidArgumentError, match="cuda"):
        kvcore.copy_async(np.zeros(4), np.zeros(4), engine="cuda")
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.copy_async(np.zeros(4), np.zeros(4), threads=0)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.copy_many([(np.zeros(4),)])


# ---- copy_async's inline fast path (small host copies, checked and run natively) ----
INLINE = 256 * 1024  # kvcore.mover.copy.INLINE_BYTES


def test_a_small_host_copy_takes_the_native_fast_path(monkeypatch):
    """A 4 KiB copy_async(...).result() cost about 7.7 us, nearly all of it Python (regions,
    the checks, a Future's set-up): its copy is now checked and run by one native call,
    without region(), and a larger one is started without it; one with a tensor side still
    takes the general path."""
    from kvcore.mover import regions

    def no_region(obj, **kwargs):
        raise AssertionError("the general path ran")

    pool = make_pool(4 * MiB, huge_pages=False)
    buf = pool.alloc(8192)
    monkeypatch.setattr(regions, "_region_of", no_region)
    src = rand_bytes(4096)
    for dst, source in ((np.zeros(4096, np.uint8), src), (bytearray(4096), memoryview(src)), (buf, src),
                        (np.zeros(8192, np.uint8), buf), (np.zeros((64, 16), np.float32), src.reshape(4, -1))):
        fut = kvcore.copy_async(dst, source, threads=1)
        assert fut.done() and fut.result() is dst
        assert bytes(memoryview(dst).cast("B")[:4096]) == src.tobytes()
    large = pool.alloc(INLINE)
    src = rand_bytes(INLINE, 1)
    assert kvcore.copy_async(large, src).result(timeout=30) is large
    assert bytes(large) == src.tobytes()
    with pytest.raises(AssertionError, match="general path"):
        kvcore.copy_async(np.zeros(4096, np.uint8), torch.zeros(4096, dtype=torch.uint8))
    assert buf.exports == 0 and large.exports == 0
    buf.free()
    large.free()


class _HeldCopy:
    """A native operation that runs until the test lets it end (as kvcore's notifier would)."""

    def __init__(self) -> None:
        self.finished = False

    def notify_with(self, token):
        pass

    def done(self):
        return self.finished

    def wait(self, timeout):
        return self.finished

    def check(self):
        pass

    def device_timed_out(self):
        return False


def test_a_started_fast_copy_holds_exports_of_its_buffers_until_it_ends(monkeypatch):
    """A copy too large to run inline is started by the fast path: until it ends, a
    PinnedBuffer it uses cannot be freed and a bytearray cannot be resized, even if the
    caller dropped the Future."""
    from kvcore.mover import copy as mover_copy

    held = _HeldCopy()
    monkeypatch.setattr(mover_copy._native, "mover_submit_pair", lambda *args: held)
    pool = make_pool(MiB, huge_pages=False)
    buf = pool.alloc(INLINE)
    grows = bytearray(INLINE)
    fut = kvcore.copy_async(buf, grows)
    alive = weakref.ref(fut)
    del fut
    gc.collect()
    assert buf.exports == 1 and alive() is not None  # the notifier holds the pending Future
    with pytest.raises(kvcore.InvalidArgumentError, match="export"):
        buf.free()
    with pytest.raises(BufferError):
        grows.extend(b"x")
    held.finished = True
    alive()._part_finished()  # as kvcore's notifier does when the operation ends
    assert buf.exports == 0
    grows.extend(b"x")
    buf.free()


def test_a_fast_copy_that_cannot_start_keeps_no_export(monkeypatch):
    """Between the native check and the start, another thread may free a PinnedBuffer (its
    export then fails) or a check may decline: the general path reports it, and no export
    the fast path took is left behind."""
    from kvcore.mover import copy as mover_copy

    monkeypatch.setattr(mover_copy._native, "mover_copy_small", lambda *args: 2)  # "checked, too large"
    pool = make_pool(MiB, huge_pages=False)
    small = pool.alloc(4096)
    with pytest.raises(kvcore.BufferTooSmallError):
        kvcore.copy_async(small, np.zeros(INLINE, np.uint8))  # mover_submit_pair declines
    assert small.exports == 0
    freed = pool.alloc(4096)
    freed.free()
    for dst, src in ((freed, np.zeros(4096, np.uint8)), (np.zeros(4096, np.uint8), freed), (small, freed)):
        with pytest.raises(kvcore.InvalidArgumentError, match="freed"):
            kvcore.copy_async(dst, src)
    assert small.exports == 0
    small.free()


@pytest.mark.parametrize("size", [0, 1, 7, 63, 4095, 4097, 65535, 65537, INLINE - 1, INLINE, INLINE + 1, MiB + 3])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 3), (31, 17)])
def test_the_fast_path_copies_odd_sizes_at_odd_addresses(size, offsets):
    do, so = offsets
    src_buf = rand_bytes(size + 64, size)
    dst_buf = np.zeros(size + 128, np.uint8)
    dst, src = dst_buf[do : do + size + 32], src_buf[so : so + size]  # dst larger than src
    assert kvcore.copy_async(dst, src, engine="cpu").result() is dst
    assert np.array_equal(dst[:size], src)
    assert not dst_buf[:do].any() and not dst_buf[do + size :].any()  # nothing written outside


def test_the_fast_path_keeps_memmove_semantics():
    for n, shift in ((100_000, 1), (100_000, 1000), (100_000, -7), (3 * INLINE, 4096), (3 * INLINE, -1)):
        a = np.arange(n, dtype=np.uint8)
        expect = a.copy()
        if shift > 0:
            expect[shift:] = a[:-shift].copy()
            kvcore.copy_async(a[shift:], a[:-shift]).result()
        else:
            expect[:shift] = a[-shift:].copy()
            kvcore.copy_async(a[:shift], a[-shift:]).result()
        assert np.array_equal(a, expect)


def _bad_copies(n: int) -> dict:
    """Bad (dst, src, keyword arguments) of copies of about n bytes."""
    pool = make_pool(2 * MiB, huge_pages=False)
    freed = pool.alloc(n)
    freed.free()
    ro = np.zeros(n, np.uint8)
    ro.flags.writeable = False
    objects = np.zeros(n // 8, dtype=object)
    record = np.zeros(n // 16, dtype=[("n", np.int64), ("o", object)])
    z = np.zeros(n, np.uint8)
    return {
        "bytes dst": (bytes(n), z, {}),
        "read-only array dst": (ro, z, {}),
        "read-only memoryview dst": (memoryview(np.zeros(n, np.uint8)).toreadonly(), z, {}),
        "strided src": (z, np.zeros(2 * n, np.uint8)[::2], {}),
        "strided dst": (np.zeros(2 * n, np.uint8)[::2], z, {}),
        "Fortran-order dst": (np.zeros((n // 8, 8), np.uint8, order="F"), z, {}),
        "object dst": (objects, z, {}),
        "object src": (np.zeros(n, np.uint8), objects, {}),
        "object memoryview dst": (memoryview(objects), z, {}),
        "record with an object field": (record, z, {}),
        "dst too small": (np.zeros(n - 1, np.uint8), z, {}),
        "freed PinnedBuffer dst": (freed, z, {}),
        "freed PinnedBuffer src": (np.zeros(n, np.uint8), freed, {}),
        "not a buffer": (z, 3.5, {}),
        "None dst": (None, z, {}),
        "engine name": (z, z, {"engine": "gpu"}),
        "engine cuda": (z, z, {"engine": "cuda"}),
        "engine list": (z, z, {"engine": ["auto"]}),
        "engine str subclass": (z, z, {"engine": type("Name", (str,), {})("dsa-ish")}),
        "threads 0": (z, z, {"threads": 0}),
        "threads -1": (z, z, {"threads": -1}),
        "threads bool": (z, z, {"threads": True}),
        "threads float": (z, z, {"threads": 1.0}),
        "threads str": (z, z, {"threads": "1"}),
    }


@pytest.mark.parametrize("name", list(_bad_copies(64)))
@pytest.mark.parametrize("size", [64, INLINE + 64], ids=["inline", "started"])
def test_the_fast_path_refuses_what_the_general_path_refuses(name, size):
    """Bad input to copy_async gets the error the general path (copy_many) gives, class and
    message, and nothing is written."""
    dst, src, kwargs = _bad_copies(size)[name]
    before = dst.tobytes() if isinstance(dst, np.ndarray) and not dst.dtype.hasobject else None
    with pytest.raises(kvcore.KVCoreError) as general:
        kvcore.copy_many([(dst, src)], **kwargs)
    with pytest.raises(type(general.value)) as fast:
        kvcore.copy_async(dst, src, **kwargs)
    assert str(fast.value) == str(general.value)
    if before is not None:
        assert dst.tobytes() == before
    if isinstance(dst, np.ndarray) and dst.dtype.hasobject:
        assert all(v == 0 for v in dst.ravel().tolist() if not isinstance(v, tuple))


def test_a_finished_futures_state_is_that_of_a_future_made_without_work():
    """The fast path builds its Future's state directly (Future._completed): it must be the
    state Future(value=...) gives, and behave the same."""
    from kvcore.mover.future import Future

    dst = np.zeros(16, np.uint8)
    made, direct = Future(value=dst), Future._completed(dst)
    assert made.__dict__.keys() == direct.__dict__.keys()
    for key in made.__dict__:
        if key != "_lock":
            assert made.__dict__[key] is direct.__dict__[key] or made.__dict__[key] == direct.__dict__[key], key
    fut = kvcore.copy_async(dst, np.ones(16, np.uint8))
    assert fut.done() and fut.wait() and fut.wait(0) and fut.result(0) is dst and fut.result(1e300) is dst
    assert fut.exception() is None and fut.exception(0) is None and fut.event is None and "done" in repr(fut)
    for timeout in (-1, float("nan"), "1", True):
        with pytest.raises(kvcore.InvalidArgumentError, match="timeout"):
            fut.result(timeout)
    seen = []
    fut.add_done_callback(seen.append)  # already done: called at once
    assert seen == [fut]

    async def main():
        return await fut

    assert asyncio.run(main()) is dst


def test_fast_path_copies_from_many_threads_at_once():
    """Small copies run on the calling thread; many threads copying at once each get their
    own bytes (the GIL is released for those above 64 KiB)."""
    sizes = [4096, 100_000, 200_000]
    errors = []

    def worker(seed):
        try:
            for i in range(200):
                n = sizes[i % 3]
                src = rand_bytes(n, seed * 1000 + i)
                dst = np.empty(n, np.uint8)
                kvcore.copy_async(dst, src, threads=1).result()
                assert np.array_equal(dst, src)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_buffer_addresses_are_numpys():
    """region() and gather/scatter read an array's address from one native export, not
    numpy's __array_interface__ (a dict built per call: 1-2 us, most of what a copy_many
    pair cost); numpy's interface still serves what it exports no buffer for."""
    from kvcore.mover.regions import buffer_address

    base = np.arange(4096, dtype=np.uint8)
    arrays = [base, base[7:], base[:0], base.reshape(64, 64)[:, 3], base[::-2], base.view(np.float32).reshape(8, -1),
              np.arange(16).astype("datetime64[s]"), np.zeros(4, dtype=[("a", np.int8), ("b", np.float64)])]
    for a in arrays:
        assert buffer_address(a) == a.__array_interface__["data"][0], a.dtype
    view = memoryview(base.reshape(64, 64))
    assert buffer_address(view) == base.__array_interface__["data"][0]


def test_copy_many_and_gather_of_arrays_numpy_exports_no_buffer_for():
    dates = np.arange(512).astype("datetime64[s]")
    out = np.zeros_like(dates)
    kvcore.copy_many([(out[:256], dates[256:]), (out[256:], dates[:256])]).result()
    assert np.array_equal(out, np.concatenate([dates[256:], dates[:256]]))
    assert kvcore.copy_async(out, dates).result() is out and np.array_equal(out, dates)
    blocks = dates.reshape(16, 32)
    assert np.array_equal(kvcore.gather(blocks, [3, 1]).result(), blocks[[3, 1]])


def test_array_subclasses_numpy_exports_no_buffer_for_are_copied_as_arrays():
    """region() took only exact ndarrays as arrays: a subclass (masked array, memmap) went
    through memoryview(), which numpy refuses for datetime64, and the copy was refused as a
    buffer that "gives no memory" (gather, through its own path, copied it)."""
    dates = np.arange(512).astype("datetime64[s]")
    masked = np.ma.MaskedArray(np.zeros_like(dates))
    assert kvcore.copy_async(masked, dates).result() is masked and np.array_equal(masked.data, dates)
    out = np.zeros_like(dates)
    kvcore.copy_many([(out, masked[::-1].copy())]).result()
    assert np.array_equal(out, dates[::-1])
    with pytest.raises(kvcore.InvalidArgumentError, match="C-contiguous"):
        kvcore.copy_async(out, masked[::2])


def test_a_structured_buffer_with_an_o_in_a_field_name_is_plain_bytes():
    """A buffer's format names the fields of a structured array ("T{l:Offset:d:b:}"): an 'O'
    in a name was taken for Python objects, and a memoryview of such an array was refused as
    "an array of Python objects". A field that holds objects is still refused."""
    rec = np.zeros(64, dtype=[("Offset", np.int64), ("b", np.float64)])
    view = memoryview(rec)
    src = rand_bytes(rec.nbytes, 5)
    assert kvcore.copy_async(view, src).result() is view
    assert rec.tobytes() == src.tobytes()
    back = np.zeros(rec.nbytes, np.uint8)
    kvcore.copy_many([(back, view)]).result()
    assert np.array_equal(back, src)
    assert np.array_equal(kvcore.gather([view, view], [1]).result().ravel(), src)
    kvcore.scatter(np.zeros(rec.nbytes, np.uint8), [view], [0]).result()
    assert not rec.tobytes().strip(b"\0")
    objects = np.zeros(4, dtype=[("Offset", object)])
    with pytest.raises(kvcore.InvalidArgumentError, match="Python objects"):
        kvcore.copy_async(memoryview(objects), np.zeros(64, np.uint8))


def test_more_threads_than_32_bits_hold_means_all_threads():
    """threads >= 2**32 is a valid int that passed the checks, then failed with pybind11's
    TypeError (the native count is 32-bit)."""
    src = rand_bytes(MiB)
    dst = np.zeros_like(src)
    kvcore.copy_async(dst, src, threads=2**40).result()
    assert np.array_equal(dst, src)
    staging = kvcore.gather(src.reshape(16, -1), [3, 1], threads=2**32).result()
    assert np.array_equal(staging, src.reshape(16, -1)[[3, 1]])
    kv = torch.randn(16, 8, 128).to(torch.bfloat16)
    frame = kvcore.compress_async(kv, threads=2**40).result()
    assert frame == kvcore.compress(kv)
    out = kvcore.decompress_async(frame, threads=2**63 - 1).result()
    assert torch.equal(out.view(torch.int16), kv.view(torch.int16))


def test_copy_many_blocks():
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 200_000, 300)
    srcs = [rand_bytes(int(n), i) for i, n in enumerate(sizes)]
    dsts = [np.zeros_like(s) for s in srcs]
    fut = kvcore.copy_many(list(zip(dsts, srcs)), engine="cpu")
    assert fut.result() is None and fut.done()
    for d, s in zip(dsts, srcs):
        assert np.array_equal(d, s)


@pytest.mark.parametrize("threads", [None, 1])
def test_gather_then_scatter_round_trip(threads, isa):
    # one layer's paged KV: 64 blocks of 16 tokens x 8 heads x 128 dims (bf16 as int16)
    kv = torch.from_numpy(np.random.default_rng(5).integers(-30000, 30000, (64, 16, 8, 128), dtype=np.int16))
    ids = [7, 3, 63, 0, 41, 12]
    staging = kvcore.gather(kv, ids, threads=threads).result()
    assert staging.shape == (6, 16, 8, 128)
    for i, b in enumerate(ids):
        assert torch.equal(staging[i], kv[b])
    dest = torch.zeros_like(kv)
    assert kvcore.scatter(staging, dest, ids, threads=threads).result() is dest
    for b in range(64):
        assert torch.equal(dest[b], kv[b]) if b in ids else not dest[b].any()


def test_gather_into_pinned_buffer_from_numpy_and_lists():
    pool = make_pool(8 * MiB, huge_pages=False)
    kv = np.random.default_rng(6).integers(0, 255, (32, 32 * 1024), dtype=np.uint8)
    out = pool.alloc(5 * 32 * 1024)
    ids = np.array([31, 0, 5, 5, 17])  # gather may repeat blocks
    assert kvcore.gather(kv, ids, out=out).result() is out
    assert np.array_equal(out.numpy().reshape(5, -1), kv[ids])
    blocks = [bytearray(kv[i].tobytes()) for i in range(4)]
    staged = kvcore.gather(blocks).result()
    assert np.array_equal(staged, kv[:4])
    targets = [bytearray(32 * 1024) for _ in range(4)]
    kvcore.scatter(staged[::-1].copy(), targets).result()
    assert bytes(targets[0]) == kv[3].tobytes()


def test_gather_scatter_errors():
    kv = np.zeros((8, 4096), np.uint8)
    with pytest.raises(kvcore.InvalidArgumentError, match="range"):
        kvcore.gather(kv, [8])
    with pytest.raises(kvcore.InvalidArgumentError, match="range"):
        kvcore.gather(kv, [-1])
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.gather(kv, [[1, 2]])
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.gather(kv, [0.5])
    with pytest.raises(kvcore.BufferTooSmallError):
        kvcore.gather(kv, [1, 2], out=np.zeros(4096, np.uint8))
    with pytest.raises(kvcore.InvalidArgumentError, match="repeat"):
        kvcore.scatter(np.zeros((2, 4096), np.uint8), kv, [1, 1])
    with pytest.raises(kvcore.InvalidArgumentError, match="contiguous"):
        kvcore.gather(np.zeros((8, 4096))[:, ::2], [0])
    with pytest.raises(kvcore.InvalidArgumentError, match="size"):
        kvcore.gather([bytearray(10), bytearray(11)])
    with pytest.raises(kvcore.InvalidArgumentError, match="read-only"):
        ro = np.zeros((2, 8), np.uint8)
        ro.flags.writeable = False
        kvcore.scatter(np.zeros((1, 8), np.uint8), ro, [0])
    assert kvcore.gather(kv, []).result().shape == (0, 4096)


def test_future_api():
    src = rand_bytes(16 * MiB)
    dst = np.empty_like(src)
    fut = kvcore.copy_async(dst, src)
    assert fut.wait(30) and fut.done()
    assert fut.exception() is None and fut.event is None
    seen = []
    fut.add_done_callback(seen.append)  # already done: called at once
    assert seen == [fut]
    assert "done" in repr(fut)
    for timeout in (-1, float("nan"), float("inf"), "1", True):
        for call in (fut.wait, fut.result, fut.exception):  # exception() must raise it, not return it
            with pytest.raises(kvcore.InvalidArgumentError, match="timeout"):
                call(timeout)
    assert fut.wait(1e300) and fut.wait(0) and fut.result(None) is dst


def test_done_callback_runs_once_from_kvcore_thread():
    called = threading.Event()
    calls = []
    src = rand_bytes(32 * MiB)
    fut = kvcore.copy_async(np.empty_like(src), src)
    fut.add_done_callback(lambda f: (calls.append(f), called.set()))
    assert called.wait(30)
    time.sleep(0.05)
    assert calls == [fut]


@pytest.fixture
def notifier_restarted():
    """Restarts kvcore's notifier thread should a test end it (so later tests still complete)."""
    from kvcore.mover.future import _notifier

    yield
    if _notifier._thread is not None and not _notifier._thread.is_alive():
        _notifier._thread = None


@pytest.mark.parametrize("raised", [SystemExit, asyncio.CancelledError])
def test_a_callback_raising_a_base_exception_stops_no_other_callback(raised, notifier_restarted):
    """A done-callback's BaseException is logged like an Exception: it used to end the
    notifier thread, so the future's other callbacks, and every later Future's callbacks
    and awaits, waited forever."""

    def fail(_f):
        raise raised

    src = rand_bytes(4 * MiB)
    dst = np.empty_like(src)
    for _ in range(2):  # the second Future needs the notifier still running
        fut = kvcore.copy_async(dst, src)
        fut.done = lambda: False  # still running when the callbacks are added: kvcore's thread calls them
        called = threading.Event()
        fut.add_done_callback(fail)
        fut.add_done_callback(lambda f: called.set())
        assert called.wait(10)


class _Running:
    """A native operation that is still running (finished only for a wait without limit, at exit)."""

    def notify_with(self, token):
        pass

    def done(self):
        return False

    def wait(self, timeout_s):
        return timeout_s < 0

    def check(self):
        pass


def test_exception_of_a_running_operation_raises_timeout_error():
    """exception(timeout) returned the TimeoutError of its own wait, as if the operation
    had failed with it, while the operation was still running."""
    fut = kvcore.Future(native=[_Running()])
    for call in (fut.exception, fut.result):
        with pytest.raises(kvcore.TimeoutError):
            call(0.01)
    assert not fut.done()


def _stand_in_for_device_memory(monkeypatch) -> np.ndarray:
    """A host array that copy_many's regions take for CUDA memory (no GPU here)."""
    from kvcore.mover import copy as mover_copy

    on_device = np.zeros(4096, np.uint8)
    real_region = mover_copy.region

    def region(obj, **kwargs):
        r = real_region(obj, **kwargs)
        if obj is on_device:
            r.cuda = obj
        return r

    monkeypatch.setattr(mover_copy, "region", region)
    return on_device


def test_a_copy_many_with_a_device_pair_leaves_no_future_pending(monkeypatch):
    """The host pairs of a copy_many that also has CUDA pairs were started through a Future
    of their own, whose notification the returned Future took over: it stayed pending in
    the notifier for good (a leak per call). The CUDA side is stood in for here."""
    from kvcore.mover import copy as mover_copy
    from kvcore.mover.future import _notifier

    class Event:
        def query(self):
            return True

        def synchronize(self):
            pass

    on_device = _stand_in_for_device_memory(monkeypatch)
    monkeypatch.setattr(mover_copy._cuda, "device_of", lambda tensors: "cuda:0")
    monkeypatch.setattr(mover_copy._cuda, "submit", lambda device, work, tensors: Event())
    src = rand_bytes(4 * MiB)
    dst = np.zeros_like(src)
    before = set(map(id, _notifier._pending.values()))
    fut = kvcore.copy_many([(dst, src), (on_device, np.ones(16, np.uint8))])
    started = [f for f in _notifier._pending.values() if id(f) not in before]
    fut.result(timeout=30)
    assert np.array_equal(dst, src)
    assert all(f is fut for f in started)  # (fut itself may be done and gone already)


@pytest.mark.parametrize("fails", ["device_of", "submit"])
def test_a_mixed_copy_many_that_fails_leaves_no_host_copy_running(monkeypatch, fails):
    """copy_many started its host pairs before it checked the CUDA pairs' device and
    submitted them; when that raised, the error released the buffers' exports (so a
    caller could free() them) while the host copy still wrote into them. Now the device
    is checked before any copy starts, and a failed submission waits for the host copy."""
    from kvcore.mover import copy as mover_copy

    class Native:
        waited = False

        def wait(self, timeout):
            Native.waited = True
            return True

    started = []
    on_device = _stand_in_for_device_memory(monkeypatch)

    def device_of(tensors):
        if fails == "device_of":
            raise kvcore.InvalidArgumentError("a CUDA copy must involve exactly one device")
        return "cuda:0"

    def submit(device, work, tensors):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(mover_copy, "_host_copies", lambda *args: started.append(1) or [Native()])
    monkeypatch.setattr(mover_copy._cuda, "device_of", device_of)
    monkeypatch.setattr(mover_copy._cuda, "submit", submit)
    src = rand_bytes(4 * MiB)
    with pytest.raises(kvcore.InvalidArgumentError if fails == "device_of" else RuntimeError):
        kvcore.copy_many([(np.zeros_like(src), src), (on_device, np.ones(16, np.uint8))])
    assert (started, Native.waited) == (([], False) if fails == "device_of" else ([1], True))


class _Gate:
    """A CUDA event of a copy that ends when the test opens the gate."""

    def __init__(self):
        self.opened = threading.Event()

    def query(self):
        return self.opened.is_set()

    def synchronize(self):
        self.opened.wait()


def test_a_dropped_cuda_future_keeps_its_buffers_until_the_copy_ends():
    """A Future of CUDA copies was referenced by nothing of kvcore's (unless a callback was
    added): dropped, it released its buffers while the device still copied, and a
    PinnedBuffer could be freed, and handed out again, under the DMA."""
    pool = make_pool(MiB, huge_pages=False)
    buf = pool.alloc(4096)
    copy = _Gate()
    kvcore.Future(cuda_events=[copy], keep=[memoryview(buf)])  # dropped at once
    gc.collect()
    with pytest.raises(kvcore.InvalidArgumentError, match="export"):
        buf.free()
    copy.opened.set()
    deadline = time.monotonic() + 30
    while buf.exports and time.monotonic() < deadline:
        time.sleep(0.005)
    buf.free()
    assert pool.stats()["used"] == 0

    called = threading.Event()
    copy = _Gate()
    kvcore.Future(cuda_events=[copy]).add_done_callback(lambda f: called.set())
    assert not called.is_set()
    copy.opened.set()
    assert called.wait(30)


class _CountingGate(_Gate):
    """A _Gate that counts how often it is asked whether it finished."""

    def __init__(self):
        super().__init__()
        self.queries = 0

    def query(self):
        self.queries += 1
        return super().query()


def test_a_finished_cuda_copy_is_reported_while_another_device_still_copies():
    """The CUDA watcher waited for the events of all devices in one order: a finished copy on
    device 1 was not reported (no callback, no await, its buffers kept) while it waited for an
    unfinished copy of device 0. Every pending event is now polled."""
    slow, quick = _Gate(), _Gate()
    reported = threading.Event()
    try:
        kvcore.Future(cuda_events=[slow])
        kvcore.Future(cuda_events=[quick]).add_done_callback(lambda f: reported.set())
        time.sleep(0.05)  # the watcher is polling `slow` by now
        quick.opened.set()
        assert reported.wait(10), "a finished copy waited for another device's copy"
    finally:
        slow.opened.set()


def test_a_finished_cuda_copy_is_reported_though_watched_after_a_later_one(monkeypatch):
    """The watcher asked only the oldest watched event of a device, assuming the device's
    copy stream finishes them in the order watched. Events are recorded in one order and
    watched (Future made) in another when two threads copy to one GPU at once: thread A
    records its event, thread B records its own (its copy stream waits for B's compute
    first) and makes its Future before A does. A's finished copy then went unreported (no
    callback, no await, buffers kept) until B's copy, behind B's compute, ended. The CUDA
    side is stood in for here; the two Futures come in thread B's order."""
    from kvcore.mover import copy as mover_copy

    recorded_later, recorded_first = _Gate(), _Gate()
    events = iter([recorded_later, recorded_first])
    on_device = _stand_in_for_device_memory(monkeypatch)
    monkeypatch.setattr(mover_copy._cuda, "device_of", lambda tensors: torch.device("cuda", 0))
    monkeypatch.setattr(mover_copy._cuda, "submit", lambda device, work, tensors: next(events))
    reported = threading.Event()
    try:
        kvcore.copy_many([(on_device, np.ones(16, np.uint8))])  # thread B's, watched first
        kvcore.copy_many([(on_device, np.ones(16, np.uint8))]).add_done_callback(lambda f: reported.set())
        recorded_first.opened.set()
        assert reported.wait(10), "a finished copy waited for a later one of its device"
    finally:
        recorded_later.opened.set()


def test_the_cuda_watcher_naps_while_a_copy_runs():
    """Polling the events instead of waiting on one must not spin a core: between sweeps
    that find nothing finished the watcher naps (up to 2 ms)."""
    copy = _CountingGate()
    fut = kvcore.Future(cuda_events=[copy])
    try:
        time.sleep(0.5)
        queries = copy.queries
    finally:
        copy.opened.set()
    assert fut.wait(10)
    assert 0 < queries < 2000, queries  # about 260 at 2 ms naps; a busy loop asks 100 000s of times


class _EndsSoon(_Gate):
    """A copy that ends 50 ms after it starts."""

    def __init__(self):
        super().__init__()
        self.ends = time.monotonic() + 0.05

    def query(self):
        return time.monotonic() >= self.ends


def test_a_new_cuda_copy_is_asked_again_soon_though_an_older_one_runs_long(monkeypatch):
    """The watcher's nap kept doubling while an old copy ran (on another GPU, say): a new
    copy woke it, was not finished at once, and was asked again only after the longest nap
    (2 ms; 1 s here, so the test can tell: reported after 1 s, not 50 ms). A new event
    starts the naps over."""
    from kvcore.mover.future import _CudaWatcher

    monkeypatch.setattr(_CudaWatcher, "_LONGEST_NAP_S", 1.0)
    long_copy = _Gate()
    reported = threading.Event()
    try:
        kvcore.Future(cuda_events=[long_copy])
        time.sleep(2.5)  # 100 us doubling: the nap is at its longest by now
        kvcore.Future(cuda_events=[_EndsSoon()]).add_done_callback(lambda f: reported.set())
        assert reported.wait(0.6), "a new copy waited for the watcher's longest nap"
    finally:
        long_copy.opened.set()


def test_errors_in_async_work_propagate():
    """A native task that fails (a null destination) raises from result()/await."""
    native = _native.mover_copy_segments(
        np.array([0], np.uint64), np.array([np.zeros(8).ctypes.data], np.uint64), np.array([8], np.uint64), 0, 0, 0, True
    )
    fut = kvcore.Future(native=[native])
    assert fut.wait(10)
    with pytest.raises(kvcore.InvalidArgumentError, match="null"):
        fut.result()
    assert isinstance(fut.exception(), kvcore.InvalidArgumentError)

    async def main():
        return await kvcore.Future(native=[native])

    with pytest.raises(kvcore.InvalidArgumentError):
        asyncio.run(main())


def test_await_from_asyncio_overlaps_with_the_loop():
    srcs = [rand_bytes(8 * MiB, i) for i in range(4)]
    dsts = [np.empty_like(s) for s in srcs]

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        results = await asyncio.gather(*(kvcore.copy_async(d, s) for d, s in zip(dsts, srcs)))
        t.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert all(r is d for r, d in zip(results, dsts))
    assert all(np.array_equal(d, s) for d, s in zip(dsts, srcs))
    assert ticks > 0


def test_dropped_future_keeps_buffers_alive_until_done():
    dst = np.zeros(64 * MiB, np.uint8)
    kvcore.copy_async(dst, np.full(64 * MiB, 7, np.uint8))  # src and Future dropped at once
    gc.collect()
    deadline = time.monotonic() + 30
    # The copy runs in slices on several threads: its last byte may land before the rest.
    while int(dst.min()) != 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dst[0] == 7 and dst[-1] == 7 and int(dst.min()) == 7


def test_features_report_copy_engines():
    f = kvcore.features()
    assert f["copy_engines"][0] == "cpu"
    assert isinstance(f["dsa"]["available"], bool) and "reason" in f["dsa"]


def test_a_waiter_runs_a_short_host_copy_the_dispatch_threads_have_not_taken():
    """A started host copy waited on its turn behind every operation queued before it on the
    mover's dispatch threads (and for a thread's wake-up), while its caller sat in result().
    A caller that waits with no time limit now runs a short CPU copy itself when no
    dispatch thread has taken it yet; operations queued before it keep running."""
    x = torch.randn(8 << 20).to(torch.bfloat16)  # 16 MiB: each compression keeps a dispatch thread busy
    busy = [kvcore.compress_async(x, threads=1) for _ in range(4 * _native.mover_dispatch_threads())]
    src = rand_bytes(1 * MiB, 3)
    dst = np.zeros_like(src)
    kvcore.copy_async(dst, src, threads=1).result()
    still_queued = sum(not f.done() for f in busy)
    for f in busy:
        f.result()
    assert np.array_equal(dst, src)
    # Behind them it would have run once all but the last few had finished.
    assert still_queued > _native.mover_dispatch_threads()

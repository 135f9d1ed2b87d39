"""PinnedPool: bounds, allocator behaviour, buffers, huge pages, page locking."""

import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import kvcore
from mover_util import can_lock, make_pool

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def hugetlb_free_bytes() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    return int(info.get("HugePages_Free", "0").split()[0]) * (2 * MiB)


@pytest.fixture
def pool():
    return make_pool(16 * MiB, huge_pages=False)


def test_stats_of_a_new_pool(pool):
    s = pool.stats()
    assert s["capacity"] == 16 * MiB and s["used"] == 0 and s["free"] == 16 * MiB
    assert s["largest_free_block"] == 16 * MiB
    assert s["allocations"] == 0 and s["locked"] is can_lock(16 * MiB)
    assert s["page_kind"] == "normal" and s["segments"] == 1
    assert pool.capacity == 16 * MiB


def test_alloc_rounds_to_alignment_and_blocks_are_aligned(pool):
    bufs = [pool.alloc(n) for n in (1, 4095, 4096, 4097, 0)]
    for b in bufs:
        assert b.address % 4096 == 0
    assert [b.nbytes for b in bufs] == [1, 4095, 4096, 4097, 0]
    assert [b.block_bytes for b in bufs] == [4096, 4096, 4096, 8192, 4096]
    assert pool.stats()["used"] == 4096 * 6


def test_pool_is_bounded_and_never_grows(pool):
    a = pool.alloc(10 * MiB)
    b = pool.alloc(6 * MiB)
    with pytest.raises(kvcore.PoolExhausted):
        pool.alloc(1)
    s = pool.stats()
    assert s["capacity"] == 16 * MiB and s["used"] == 16 * MiB and s["largest_free_block"] == 0
    assert s["failed_allocations"] == 1
    hole = b.address
    b.free()
    with pytest.raises(kvcore.PoolExhausted):
        pool.alloc(6 * MiB + 1)
    c = pool.alloc(6 * MiB)
    assert c.address == hole  # best fit reuses the hole
    del a, c


def test_request_larger_than_a_segment_is_invalid():
    pool = make_pool(8 * MiB, huge_pages=False, segment_bytes=2 * MiB)
    s = pool.stats()
    assert s["segments"] == 4 and s["segment_bytes"] == 2 * MiB
    with pytest.raises(kvcore.InvalidArgumentError, match="segment"):
        pool.alloc(2 * MiB + 1)
    bufs = [pool.alloc(2 * MiB) for _ in range(4)]  # whole segments
    with pytest.raises(kvcore.PoolExhausted):
        pool.alloc(4096)
    # blocks never straddle two segments
    segs = pool.segments()
    for b in bufs:
        assert any(base <= b.address and b.address + b.nbytes <= base + size for base, size in segs)


def test_alloc_waits_for_a_release_up_to_timeout(pool):
    a = pool.alloc(16 * MiB)
    t0 = time.monotonic()
    with pytest.raises(kvcore.PoolExhausted):
        pool.alloc(MiB, timeout=0.2)
    assert time.monotonic() - t0 >= 0.19

    def release_later():
        time.sleep(0.1)
        a.free()

    threading.Thread(target=release_later).start()
    b = pool.alloc(MiB, timeout=5)
    assert b.nbytes == MiB


def test_an_alloc_that_waits_counts_one_failure_or_none(pool):
    """A waiting alloc tries again every 100 ms slice (and spun through the last part of
    a millisecond in slices of 0 ms): each try was counted, thousands of failed
    allocations for one alloc(timeout=...)."""
    a = pool.alloc(16 * MiB)
    with pytest.raises(kvcore.PoolExhausted):
        pool.alloc(MiB, timeout=0.3)
    assert pool.stats()["failed_allocations"] == 1

    def release_later():
        time.sleep(0.25)
        a.free()

    threading.Thread(target=release_later).start()
    b = pool.alloc(MiB, timeout=None)  # waits more than one slice, then succeeds
    s = pool.stats()
    assert s["failed_allocations"] == 1 and s["total_allocations"] == 2
    del b


def test_alloc_without_limit_wakes_on_gc_release(pool):
    holder = [pool.alloc(16 * MiB)]

    def drop_later():
        time.sleep(0.1)
        holder.clear()  # released by garbage collection, not by free()

    threading.Thread(target=drop_later).start()
    b = pool.alloc(MiB, timeout=None)
    assert b.nbytes == MiB


def test_release_on_garbage_collection(pool):
    bufs = [pool.alloc(MiB) for _ in range(8)]
    assert pool.stats()["allocations"] == 8
    del bufs
    gc.collect()
    s = pool.stats()
    assert s["allocations"] == 0 and s["used"] == 0 and s["free_extents"] == 1


def test_buffers_keep_their_pool_alive():
    pool = make_pool(4 * MiB, huge_pages=False)
    buf = pool.alloc(MiB)
    del pool
    gc.collect()
    buf.numpy()[:] = 9  # memory still mapped
    assert int(buf.numpy().sum()) == 9 * MiB
    assert buf.pool.stats()["used"] == MiB


def test_random_alloc_free_fragmentation_stays_bounded():
    """Seeded random workload (sizes 4 KiB..2 MiB, live set held near 60 % of
    capacity): no request that fits in 75 % of the pool is refused, blocks
    never overlap (checked with per-block patterns), and freeing everything
    coalesces back into one extent."""
    cap = 64 * MiB
    pool = make_pool(cap, huge_pages=False)
    rng = np.random.default_rng(1234)
    live: list[tuple[kvcore.PinnedBuffer, int]] = []
    refused = 0
    worst_frag = 0.0
    for step in range(6000):
        used = pool.stats()["used"]
        if live and (used > 0.6 * cap or rng.random() < 0.4):
            buf, tag = live.pop(int(rng.integers(len(live))))
            view = buf.numpy()
            assert view[0] == tag and view[-1] == tag, "a block was overwritten: blocks overlap"
            del view
            buf.free()
            continue
        size = int(np.exp(rng.uniform(np.log(4096), np.log(2 * MiB))))
        try:
            buf = pool.alloc(size)
        except kvcore.PoolExhausted:
            if used + size <= 0.75 * cap:
                refused += 1
            continue
        tag = step % 251
        view = buf.numpy()
        view[0] = view[-1] = tag
        del view
        live.append((buf, tag))
        s = pool.stats()
        if s["free"]:
            worst_frag = max(worst_frag, 1 - s["largest_free_block"] / s["free"])
    assert refused == 0
    addrs = sorted((b.address, b.block_bytes) for b, _ in live)
    for (a0, n0), (a1, _) in zip(addrs, addrs[1:]):
        assert a0 + n0 <= a1
    for b, _ in live:
        b.free()
    s = pool.stats()
    assert s["used"] == 0 and s["free_extents"] == 1 and s["largest_free_block"] == cap
    assert worst_frag < 0.9  # sanity: the free space is never shattered completely


def test_buffer_protocol_and_zero_copy_views(pool):
    buf = pool.alloc(4096)
    mv = memoryview(buf)
    assert mv.nbytes == 4096 and not mv.readonly and mv.format == "B"
    arr = buf.numpy()
    t = buf.tensor(torch.float32, (32, 32))
    t.fill_(1.5)
    assert np.frombuffer(mv, np.float32)[0] == 1.5  # one memory, three views
    assert arr.__array_interface__["data"][0] == buf.address == t.data_ptr()
    with pytest.raises(kvcore.InvalidArgumentError):
        buf.tensor(torch.float32, (3, 3))  # 4096 bytes are not 9 floats
    three = pool.alloc(3)
    with pytest.raises(kvcore.InvalidArgumentError):
        three.tensor(torch.int16)


def test_subclasses_export_and_count_like_the_buffer(pool):
    """Python 3.12+ builds a subclass's buffer slots from the __buffer__ descriptors, not
    from the base's slots: those must count exports too (under 3.12 every memoryview of a
    PinnedBuffer once failed with pybind11's 'Internal error')."""

    class Tagged(kvcore.PinnedBuffer):
        pass

    for buf in (pool.alloc(64), Tagged(pool, 64, 0.0)):
        mv = memoryview(buf)
        assert mv.nbytes == 64 and buf.exports == 1
        mv.release()
        assert buf.exports == 0
        if sys.version_info >= (3, 12):
            view = buf.__buffer__(0)
            assert view.nbytes == 64 and buf.exports == 1
            buf.__release_buffer__(view)
            assert buf.exports == 0
        buf.free()


def test_free_is_refused_while_views_are_alive(pool):
    buf = pool.alloc(MiB)
    mv = memoryview(buf)
    with pytest.raises(kvcore.InvalidArgumentError, match="export"):
        buf.free()
    mv.release()
    t = buf.tensor()
    with pytest.raises(kvcore.InvalidArgumentError, match="tensor"):
        buf.free()
    del t
    buf.free()
    buf.free()  # idempotent
    assert buf.freed and pool.stats()["used"] == 0
    with pytest.raises(BufferError):
        memoryview(buf)
    with pytest.raises(kvcore.InvalidArgumentError):
        _ = buf.address


def test_free_is_refused_while_a_view_of_a_tensor_view_is_alive(pool):
    """free() counted only the tensors tensor() returned: with one deleted, a view made from
    it (a layer of the KV chunk) still read the block, which the next alloc handed out."""
    buf = pool.alloc(4096)
    kv = buf.tensor(torch.bfloat16, (2, 1024))
    layer0 = kv[0]
    del kv
    gc.collect()
    with pytest.raises(kvcore.InvalidArgumentError, match="tensor"):
        buf.free()
    assert pool.stats()["used"] == 4096
    other = pool.alloc(4096)
    other.numpy()[:] = 7
    assert not bool(layer0.view(torch.uint8).eq(7).any())  # another block
    del layer0
    gc.collect()
    buf.free()
    assert buf.freed and pool.stats()["used"] == 4096


def test_concurrent_alloc_free_from_threads():
    pool = make_pool(32 * MiB, huge_pages=False)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                b = pool.alloc(int(rng.integers(1, 256 * 1024)), timeout=5)
                b.numpy()[:1] = 1
                b.free()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.stats()["used"] == 0 and pool.stats()["total_allocations"] == 1200


def test_invalid_arguments():
    with pytest.raises(kvcore.InvalidArgumentError):
        make_pool(0)
    with pytest.raises(kvcore.InvalidArgumentError):
        make_pool(MiB, alignment=100)
    with pytest.raises(kvcore.InvalidArgumentError):
        make_pool(MiB, alignment=32)
    with pytest.raises(kvcore.InvalidArgumentError):
        make_pool(MiB, numa_node=-2)
    with pytest.raises(kvcore.InvalidArgumentError, match="node"):
        make_pool(MiB, numa_node=4096)
    pool = make_pool(MiB, huge_pages=False)
    with pytest.raises(kvcore.InvalidArgumentError):
        pool.alloc(-1)
    for timeout in (-3, -1, float("inf"), float("nan"), True, "1"):  # -1 was once read as "no limit"
        with pytest.raises(kvcore.InvalidArgumentError, match="timeout"):
            pool.alloc(1, timeout=timeout)


def test_a_buffer_of_something_else_than_a_pool_is_an_invalid_argument():
    """PinnedBuffer(pool, nbytes, timeout) with another object as the pool raised AttributeError."""
    for not_a_pool in ("pool", None, make_pool(MiB, huge_pages=False)._native):
        with pytest.raises(kvcore.InvalidArgumentError, match="PinnedPool"):
            kvcore.PinnedBuffer(not_a_pool, 64, 0.0)


def test_alloc_with_a_huge_timeout_still_waits_for_a_release(pool):
    """A finite timeout too long for a deadline in int64 nanoseconds waits without limit (it
    once overflowed natively); the buffer freed by another thread ends the wait."""
    a = pool.alloc(16 * MiB)
    threading.Timer(0.2, a.free).start()
    b = pool.alloc(MiB, timeout=1e300)
    assert b.nbytes == MiB


def test_numa_node_binding_on_node0():
    pool = make_pool(4 * MiB, huge_pages=False, numa_node=0)
    assert pool.stats()["numa_node"] == 0
    buf = pool.alloc(MiB)
    buf.numpy()[:] = 3
    assert int(buf.numpy()[-1]) == 3


def test_small_alignment_packs_blocks():
    pool = make_pool(MiB, huge_pages=False, alignment=64)
    a, b = pool.alloc(100), pool.alloc(100)
    assert b.address - a.address == 128 and a.address % 64 == 0


def test_huge_page_fallback_and_forced_off():
    cap = 8 * MiB
    off = make_pool(cap, huge_pages=False)
    assert off.stats()["page_kind"] == "normal"
    on = make_pool(cap, huge_pages=True)
    kind = on.stats()["page_kind"]
    if hugetlb_free_bytes() >= cap:
        assert kind == "hugetlb"
    else:  # no reserved 2 MiB pages: falls back to normal pages (THP advised)
        assert kind in ("thp", "normal")
    buf = on.alloc(cap)
    buf.numpy()[:] = 1
    assert int(buf.numpy().sum()) == cap


MEMLOCK_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, resource, sys
    sys.path.insert(0, sys.argv[1])
    if os.geteuid() == 0:
        # root has CAP_IPC_LOCK, which ignores RLIMIT_MEMLOCK: drop it first.
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
        libc = ctypes.CDLL(None, use_errno=True)
        hdr = Header(0x20080522, 0)
        data = (Data * 2)()
        assert libc.capget(ctypes.byref(hdr), data) == 0
        data[0].effective &= ~(1 << 14); data[0].permitted &= ~(1 << 14)
        assert libc.capset(ctypes.byref(hdr), data) == 0, ctypes.get_errno()
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
    import kvcore
    try:
        kvcore.PinnedPool(64 << 20, huge_pages=False)
    except kvcore.OutOfMemoryError as e:
        print("ERROR:", e)
    else:
        print("NO ERROR")
    pool = kvcore.PinnedPool(64 << 20, huge_pages=False, lock=False)
    print("UNLOCKED:", pool.stats()["locked"])
    """
)


def test_memlock_limit_error_names_rlimit_memlock():
    out = subprocess.run(
        [sys.executable, "-c", MEMLOCK_SCRIPT, str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "ERROR:" in out.stdout, out.stdout
    assert "RLIMIT_MEMLOCK" in out.stdout and "lock=False" in out.stdout
    assert "UNLOCKED: False" in out.stdout

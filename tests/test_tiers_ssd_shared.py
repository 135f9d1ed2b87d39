"""Several SSD tiers (processes) on one directory: one capacity, each other's chunks,
no lost temporaries, dead owners cleaned up (kvcore/tiers/ssd_journal.py).

Two tiers in one process behave as two processes here (each is its own owner with its
own lock descriptions); the last tests use real child processes."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing as mp
import os
import threading
from pathlib import Path

import pytest

from kvcore.errors import InvalidArgumentError
from kvcore.tiers import ssd_journal
from kvcore.tiers.ssd import ScratchPool, SSDTier
from kvcore.tiers.hot_cold import HotColdFile
from ssd_workers import SIZE, chunk_blob, die_while_writing, key_of, open_and_die, pin_many, store_many
from tiers_support import errors_of_threads, leftover_temporaries

blob = chunk_blob


def put(t: SSDTier, owner: int, i: int) -> bool:
    return t.write(key_of(owner, i), blob(owner, i), ns_tag="ns")


def disk_bytes(directory: Path) -> int:
    """Chunk files plus temporaries, counted under the directory lock (a consistent view)."""
    root = Path(directory) / "kvcore-v1"
    with open(root / "lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            files = [p for d in root.iterdir() if d.is_dir() and d.name != "owners" for p in d.rglob("*")]
            return sum(p.stat().st_size for p in files if p.is_file())
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def test_each_sees_the_others_chunks(tmp_path):
    a, b = SSDTier(tmp_path, 1 << 30), SSDTier(tmp_path, 1 << 30)
    assert put(a, 0, 0)
    assert b.contains(key_of(0, 0)) and bytes(b.read(key_of(0, 0))) == blob(0, 0)
    assert b.used_bytes == a.used_bytes == SIZE
    assert b.remove(key_of(0, 0))
    assert not a.contains(key_of(0, 0)) and a.read(key_of(0, 0)) is None
    assert a.used_bytes == b.used_bytes == 0
    put(b, 1, 1)
    assert a.keys("ns") == [key_of(1, 1)] and len(a) == 1
    assert a.clear("ns") == 1 and len(b) == 0


def test_one_capacity_for_the_directory(tmp_path):
    cap = 5 * SIZE
    a, b = SSDTier(tmp_path, cap), SSDTier(tmp_path, cap)
    for i in range(12):
        assert put(a if i % 2 else b, i % 2, i)
        assert a.used_bytes <= cap and b.used_bytes <= cap and disk_bytes(tmp_path) <= cap
    assert a.used_bytes == b.used_bytes == disk_bytes(tmp_path) == cap
    assert set(a.index) == set(b.index) == {key_of(i % 2, i) for i in range(7, 12)}  # the newest five


def test_the_smallest_live_capacity_holds(tmp_path):
    """Owners given different capacities: the directory keeps to the smallest while its
    owner is open, and grows back when it leaves."""
    a = SSDTier(tmp_path, 8 * SIZE)
    for i in range(8):
        assert put(a, 0, i)
    b = SSDTier(tmp_path, 3 * SIZE)  # its start-up evicts down to its capacity
    assert disk_bytes(tmp_path) == 3 * SIZE
    assert a.capacity_bytes == b.capacity_bytes == 3 * SIZE and a.own_capacity_bytes == 8 * SIZE
    for i in range(8, 14):
        assert put(a, 0, i) and disk_bytes(tmp_path) <= 3 * SIZE
    b.close()
    assert a.capacity_bytes == 8 * SIZE
    for i in range(14, 20):
        assert put(a, 0, i)
    assert a.used_bytes == disk_bytes(tmp_path) == 8 * SIZE
    c = SSDTier(tmp_path, 10 * SIZE)  # a larger capacity changes nothing
    assert c.capacity_bytes == a.capacity_bytes == 8 * SIZE


def test_a_read_by_another_counts_for_eviction(tmp_path):
    a, b = SSDTier(tmp_path, 3 * SIZE), SSDTier(tmp_path, 3 * SIZE)
    for i in range(3):
        put(a, 0, i)
    assert b.read(key_of(0, 0)) is not None  # b's use of chunk 0 reaches a's order
    put(a, 0, 3)
    assert set(a.index) == {key_of(0, 0), key_of(0, 2), key_of(0, 3)}


def test_a_new_tier_keeps_a_live_writers_temporary(tmp_path):
    a = SSDTier(tmp_path, 4 * SIZE)
    data = blob(0, 0)
    buf = ScratchPool().get(SIZE + 8192)  # page-aligned, for O_DIRECT
    sw = a.begin_write(key_of(0, 0), buf, ns_tag="ns", reserve=SIZE)
    b = SSDTier(tmp_path, 4 * SIZE)  # start-up scan while a writes
    assert b.used_bytes == SIZE  # a's reservation counts
    buf[:SIZE] = data
    sw.add(0, SIZE)
    assert sw.commit(SIZE)
    assert bytes(b.read(key_of(0, 0))) == data
    assert b.used_bytes == a.used_bytes == SIZE and not leftover_temporaries(tmp_path)


def test_journal_replaced_when_long(tmp_path, monkeypatch):
    monkeypatch.setattr(ssd_journal, "COMPACT_BYTES", 40 * ssd_journal.RECORD_BYTES)
    a, b = SSDTier(tmp_path, 6 * SIZE), SSDTier(tmp_path, 6 * SIZE)
    for i in range(40):
        put(a if i % 3 else b, i % 3 % 2, i)
        if i % 5 == 0:
            a.read(a.keys()[0])
    journal = tmp_path / "kvcore-v1" / "journal"
    assert journal.stat().st_size <= 60 * ssd_journal.RECORD_BYTES
    files = {bytes.fromhex(p.name.split(".")[0]) for p in (tmp_path / "kvcore-v1" / "ns").iterdir()}
    assert set(a.keys()) == set(b.keys()) == files and len(files) == 6
    assert a.used_bytes == b.used_bytes == disk_bytes(tmp_path)
    assert set(SSDTier(tmp_path, 6 * SIZE).index) == files


def test_closed_tier_leaves_no_owner(tmp_path):
    a = SSDTier(tmp_path, 1 << 20)
    put(a, 0, 0)
    a.close()
    root = tmp_path / "kvcore-v1"
    assert not list((root / "owners").iterdir()) and not list((root / "tmp").iterdir())
    assert SSDTier(tmp_path, 1 << 20).contains(key_of(0, 0))


def test_namespace_tag_must_name_a_plain_directory(tmp_path):
    t = SSDTier(tmp_path, 1 << 20)
    for bad in ("../x", "", "a/b", "tmp", "owners", "x" * 17):
        with pytest.raises(InvalidArgumentError):
            t.write(key_of(0, 0), b"x", ns_tag=bad, verify_blob=False)
    assert not list((tmp_path / "kvcore-v1").glob("*/*.kvc"))


def test_processes_share_one_capacity(tmp_path):
    """Two processes store at once; the directory never holds more than the capacity."""
    cap = 6 * SIZE
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    SSDTier(tmp_path, cap)  # creates the layout before the children race
    procs = [ctx.Process(target=store_many, args=(str(tmp_path), cap, owner, 40, start, results))
             for owner in (0, 1)]
    for p in procs:
        p.start()
    start.set()
    peak_disk = 0
    while any(p.is_alive() for p in procs):
        peak_disk = max(peak_disk, disk_bytes(tmp_path))
    for p in procs:
        p.join(60)
    reports = sorted(results.get(timeout=10) for _ in procs)
    assert [r[3] for r in reports] == [None, None]
    assert all(peak <= cap for _, peak, _, _ in reports) and peak_disk <= cap
    assert [stored for _, _, stored, _ in reports] == [40, 40]
    t = SSDTier(tmp_path, cap)
    assert t.used_bytes == disk_bytes(tmp_path) <= cap and len(t) == 6
    assert not leftover_temporaries(tmp_path)


def test_processes_pinning_at_once_lose_no_pin(tmp_path):
    """Two processes change the pins file at once: every change of both is in it."""
    ctx = mp.get_context("spawn")
    together, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=pin_many, args=(str(tmp_path), owner, 60, together, results)) for owner in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(results.get(timeout=10) for _ in procs) == [(0, None), (1, None)]
    saved = HotColdFile(tmp_path, "ns").load()
    assert set(saved) == {key_of(owner, i) for owner in (0, 1) for i in range(60)}
    assert all(saved[key_of(owner, i)].priority == owner for owner in (0, 1) for i in range(60))


def test_dead_writer_is_cleaned_up(tmp_path):
    """A process that dies mid-write: its temporary goes and its reservation is released."""
    cap = 4 * SIZE
    live = SSDTier(tmp_path, cap)
    put(live, 0, 0)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=die_while_writing, args=(str(tmp_path), cap, 2 * SIZE, ready))
    p.start()
    assert ready.wait(60)
    p.join(60)
    assert live.used_bytes == 3 * SIZE and leftover_temporaries(tmp_path)
    assert put(live, 0, 1) and put(live, 0, 2)  # needs the dead writer's room: it is released
    assert live.used_bytes == 3 * SIZE and len(live) == 3
    assert not leftover_temporaries(tmp_path) and len(list((tmp_path / "kvcore-v1" / "owners").iterdir())) == 1


def test_dead_owners_capacity_stops_counting(tmp_path):
    """A process that opened the directory with a small capacity and died: its capacity
    counts no more once the live owner needs the room."""
    live = SSDTier(tmp_path, 6 * SIZE)
    ctx = mp.get_context("spawn")
    ready, die = ctx.Event(), ctx.Event()
    p = ctx.Process(target=open_and_die, args=(str(tmp_path), 2 * SIZE, ready, die))
    p.start()
    assert ready.wait(60)
    assert live.capacity_bytes == 2 * SIZE  # seen while its owner lives
    die.set()
    p.join(60)
    for i in range(6):
        assert put(live, 0, i)
    assert live.used_bytes == disk_bytes(tmp_path) == 6 * SIZE and live.capacity_bytes == 6 * SIZE


def test_threads_of_two_tiers(tmp_path):
    """Threads of two tiers storing and reading at once keep one consistent budget."""
    cap = 5 * SIZE
    tiers = [SSDTier(tmp_path, cap, fsync=False), SSDTier(tmp_path, cap, fsync=False)]

    def work(n: int) -> None:
        t = tiers[n % 2]
        for i in range(30):
            put(t, n, i)
            assert t.used_bytes <= cap
            got = t.read(key_of(n ^ 1, i))
            assert got is None or bytes(got) == blob(n ^ 1, i)

    errors = errors_of_threads(work, 4)
    assert not errors
    assert tiers[0].used_bytes == tiers[1].used_bytes == disk_bytes(tmp_path) <= cap
    assert set(tiers[0].keys()) == set(tiers[1].keys())


def test_a_lookup_waits_for_records_another_thread_is_applying(tmp_path, monkeypatch):
    """A TierManager's read-ahead threads look chunks up while its main thread takes in
    another process's records. The thread that finds nothing new left in the journal
    must still wait until the records read are applied, else it misses a chunk that is
    there (the flaky two-managers test: a restore stopped at the chunk being applied)."""
    a, b = SSDTier(tmp_path, 1 << 30), SSDTier(tmp_path, 1 << 30)
    a.refresh()  # takes in b's snapshot of the directory: b's stores then come as ADD records
    assert put(b, 1, 0) and put(b, 1, 1)
    applying, looked_up = threading.Event(), threading.Event()
    apply = a._apply

    def slow_apply(r):
        if r.op == ssd_journal.ADD and r.key == key_of(1, 0):
            applying.set()
            looked_up.wait(0.5)  # unblocks at once if the lookup does not wait (the bug)
        apply(r)

    monkeypatch.setattr(a, "_apply", slow_apply)
    first = threading.Thread(target=a.refresh)
    first.start()
    assert applying.wait(10)
    found = a.contains(key_of(1, 1))  # the journal is read to its end by now
    looked_up.set()
    first.join()
    assert found


def test_filesystem_without_flock_works_for_one_process(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ssd_journal.fcntl, "flock", no_flock)
    t = SSDTier(tmp_path, 2 * SIZE)
    assert not t._journal.shared
    for i in range(3):
        assert put(t, 0, i)
    assert bytes(t.read(key_of(0, 2))) == blob(0, 2) and t.used_bytes == 2 * SIZE


def test_damaged_or_hostile_journal_records(tmp_path):
    """Records that fail their CRC are skipped; an ADD naming a path outside the directory
    is ignored; whatever the journal says, nothing outside the directory is touched."""
    a, b = SSDTier(tmp_path, 2 * SIZE), SSDTier(tmp_path, 2 * SIZE)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / f"{key_of(7, 0).hex()}.0.0.0.kvc").write_bytes(b"keep me")
    journal = tmp_path / "kvcore-v1" / "journal"
    hostile = ssd_journal.Record(ssd_journal.ADD, bytes(8), key_of(7, 0), "../../precious", size=SIZE)
    damaged = bytearray(ssd_journal.Record(ssd_journal.ADD, bytes(8), key_of(7, 1), "ns", size=SIZE).pack())
    damaged[20] ^= 1
    no_room = ssd_journal.Record(ssd_journal.CAP, bytes(8), bytes(16), size=0)  # from no live owner
    with open(journal, "ab") as f:
        f.write(hostile.pack() + bytes(damaged) + ssd_journal.Record(ssd_journal.TOUCH, bytes(8), key_of(0, 0)).pack()
                + no_room.pack())
    assert not b.contains(key_of(7, 0)) and not b.contains(key_of(7, 1))
    for i in range(4):
        assert put(b, 1, i)  # evictions never reach the hostile entry
    assert (outside / f"{key_of(7, 0).hex()}.0.0.0.kvc").read_bytes() == b"keep me"
    assert b._journal.corrupt_records == 2 and a.used_bytes == b.used_bytes == 2 * SIZE
    assert a.capacity_bytes == b.capacity_bytes == 2 * SIZE


def test_two_tiers_writing_one_key_at_once_leave_one_file(tmp_path):
    """Two processes store the same chunk at once (replicas given one prompt, with other
    expiry times: other file names): each dropped the key's old file when it began, so
    the second to commit must remove the first's file, else it stays on disk uncounted."""
    a, b = SSDTier(tmp_path, 4 * SIZE), SSDTier(tmp_path, 4 * SIZE)
    data, pool = blob(0, 0), ScratchPool()
    writes = []
    for t, expires_ms in ((a, 0), (b, 2 ** 50)):  # both begun before either commits
        buf = pool.get(SIZE + 8192)
        buf[:SIZE] = data
        writes.append(t.begin_write(key_of(0, 0), buf, ns_tag="ns", reserve=SIZE, expires_ms=expires_ms))
    for sw in writes:
        sw.add(0, SIZE)
        assert sw.commit(SIZE)
    assert len(list((tmp_path / "kvcore-v1" / "ns").iterdir())) == 1
    assert a.used_bytes == b.used_bytes == disk_bytes(tmp_path) == SIZE
    assert bytes(a.read(key_of(0, 0))) == data and a.entry(key_of(0, 0)).expires_ms == 2 ** 50


def test_a_write_that_no_longer_fits_at_its_commit_is_refused_cleanly(tmp_path, monkeypatch):
    """An owner with a smaller capacity joins while a write is in flight and nothing can be
    evicted (pinned chunks): the write no longer fits when it commits. write() must say so,
    leave no temporary and give its reservation back (it returned True, and the reservation
    counted against the directory for as long as the tier lived)."""
    def keep(key):
        return False

    a = SSDTier(tmp_path, 4 * SIZE, evictable=keep)
    for i in range(3):
        assert put(a, 0, i)
    commit, joined = a._commit, []

    def join_then_commit(*args, **kwargs):
        joined.append(SSDTier(tmp_path, 2 * SIZE, evictable=keep))
        return commit(*args, **kwargs)

    monkeypatch.setattr(a, "_commit", join_then_commit)
    assert not put(a, 0, 3)
    assert not a.contains(key_of(0, 3)) and not leftover_temporaries(tmp_path)
    assert a.used_bytes == joined[0].used_bytes == disk_bytes(tmp_path) == 3 * SIZE


def test_a_write_that_reserves_while_its_tier_closes_is_not_counted_by_the_others(tmp_path, monkeypatch):
    """close() found the tier idle, then left the directory in another lock section: a write
    that reserved in between was recorded (RES), failed once the tier had left (its
    temporaries went with it) and could not record its release, so the other owners counted
    its bytes until they next needed room."""
    a, b = SSDTier(tmp_path, 4 * SIZE), SSDTier(tmp_path, 4 * SIZE)
    assert put(a, 0, 0) and a.read(key_of(0, 0)) is not None  # a's reader threads run
    pool, writes = ScratchPool(), []
    shutdown = a._readers.shutdown

    def write_meanwhile(*args, **kwargs):  # close() stops the reader threads between its two looks
        buf = pool.get(SIZE + 8192)
        buf[:SIZE] = blob(0, 1)
        writes.append(a.begin_write(key_of(0, 1), buf, ns_tag="ns", reserve=SIZE))
        return shutdown(*args, **kwargs)

    monkeypatch.setattr(a._readers, "shutdown", write_meanwhile)
    a.close()
    if writes[0] is not None:
        writes[0].add(0, SIZE)
        writes[0].commit(SIZE)
    assert not b.contains(key_of(0, 1)) and not leftover_temporaries(tmp_path)
    assert b.used_bytes == disk_bytes(tmp_path) == SIZE


def test_a_closed_tier_changes_nothing_in_the_directory(tmp_path):
    """A tier that has closed left the directory: it holds no lock and writes no journal
    any more. A remove through it deleted a file another owner still indexed and counted
    (unrecorded: the other's reads then missed), and a write failed only by accident."""
    a, b = SSDTier(tmp_path, 8 * SIZE), SSDTier(tmp_path, 8 * SIZE)
    assert put(b, 1, 0) and a.contains(key_of(1, 0))
    a.close()
    assert not a.remove(key_of(1, 0)) and a.clear() == 0
    assert not put(a, 0, 0)
    counts = a.metrics.snapshot()["tiers"]["ssd"]
    assert counts["rejected"] == 1 and counts["errors"] == 0  # refused, not a failed write
    assert bytes(b.read(key_of(1, 0))) == blob(1, 0)
    assert b.used_bytes == disk_bytes(tmp_path) == SIZE and not leftover_temporaries(tmp_path)


@pytest.mark.parametrize("failure", ["enospc", "short"])
def test_a_journal_append_that_fails_raises_nothing_and_is_repaired(tmp_path, monkeypatch, failure):
    """On a full disk the journal append (a read's TOUCH, a write's reservation, a
    removal's DEL) raised OSError out of read(), write() and remove(), and a write's
    reservation stayed counted forever; a short append left a partial record that
    misaligned every later one. The changes are made, and the next change replaces the
    journal with a snapshot, from which the other owners learn what they missed."""
    a, b = SSDTier(tmp_path, 1 << 30), SSDTier(tmp_path, 1 << 30)
    assert put(a, 0, 0) and put(a, 0, 1)
    real_write = os.write

    def failing_write(fd, data):  # every write to a's journal, its replacement's MOVED record too
        if a._journal._journal is None or fd != a._journal._journal.fileno():
            return real_write(fd, data)
        if failure == "short":
            return real_write(fd, bytes(data)[:30])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    assert bytes(a.read(key_of(0, 0))) == blob(0, 0)
    assert put(a, 0, 2)
    assert a.remove(key_of(0, 1))
    monkeypatch.setattr(os, "write", real_write)
    assert a.used_bytes == 2 * SIZE
    assert put(a, 0, 3)  # the next change replaces the journal
    assert set(b.keys()) == set(a.keys()) == {key_of(0, i) for i in (0, 2, 3)}
    assert b.used_bytes == a.used_bytes == 3 * SIZE
    assert put(b, 1, 0) and a.contains(key_of(1, 0))  # both on one journal again
    assert a.used_bytes == b.used_bytes == disk_bytes(tmp_path) == 4 * SIZE


def test_reads_alone_do_not_grow_the_journal_without_end(tmp_path, monkeypatch):
    """Every read hit appends a TOUCH record, but only a change (a write, an eviction, a
    removal) replaced a long journal: owners that only read grew it by 80 bytes a hit
    without end (and a tier opening the directory read all of it into memory)."""
    monkeypatch.setattr(ssd_journal, "COMPACT_BYTES", 40 * ssd_journal.RECORD_BYTES)
    a, b = SSDTier(tmp_path, 1 << 30), SSDTier(tmp_path, 1 << 30)
    assert put(a, 0, 0) and put(a, 0, 1)
    journal = tmp_path / "kvcore-v1" / "journal"
    for i in range(100):
        t = a if i % 2 else b
        assert bytes(t.read(key_of(0, i % 2))) == blob(0, i % 2)
    assert journal.stat().st_size <= 60 * ssd_journal.RECORD_BYTES
    assert set(a.keys()) == set(b.keys()) == {key_of(0, 0), key_of(0, 1)}
    assert a.used_bytes == b.used_bytes == disk_bytes(tmp_path) == 2 * SIZE


def test_a_dead_owners_unfinished_journal_snapshot_is_removed(tmp_path):
    """An owner that died while it wrote a journal snapshot (before the rename over the
    journal) left journal.<owner>.new behind, which no later owner removed: one more
    file of up to megabytes, outside the capacity, for every such crash."""
    a = SSDTier(tmp_path, 1 << 30)
    assert put(a, 0, 0)
    root = tmp_path / "kvcore-v1"
    dead = "0123456789abcdef"
    (root / "owners" / dead).write_bytes(b"")  # its lock went with its process
    (root / f"journal.{dead}.new").write_bytes(b"KVCJRNL\x01" + bytes(1000))
    b = SSDTier(tmp_path, 1 << 30)
    assert sorted(p.name for p in root.iterdir()) == ["journal", "lock", "ns", "owners", "tmp"]
    assert bytes(b.read(key_of(0, 0))) == blob(0, 0) and a.contains(key_of(0, 0))

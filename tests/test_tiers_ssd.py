"""SSD tier: atomic files, checksums, index rebuild, capacity, full disk, O_DIRECT."""

import os
import threading
import time

import pytest
import torch

from kvcore.tiers.blob import BlobHeader, decode_into, encode_chunk
from kvcore.tiers.codecs import make_codec
from kvcore.tiers.keys import chunk_keys
from kvcore.tiers.ssd import ScratchPool, SSDTier
from tiers_support import errors_of_threads, leftover_temporaries, load_kv, small_tmpfs, with_codec, with_version  # noqa: F401

CODEC = make_codec("auto")


@pytest.fixture(scope="module")
def chunks():
    kv = load_kv()[:, :, :1024]  # [6, 2, 1024, 12, 32] bf16, 1.5 MB per 256 tokens
    keys = chunk_keys(range(1024), "test-model", 256)
    return kv, keys, [bytes(encode_chunk(kv[:, :, k.start:k.end], CODEC, key=k.digest, index=k.index))
                      for k in keys]


def _check(blob, kv, k):
    out = torch.zeros_like(kv)
    decode_into(blob, BlobHeader.parse(blob, verify=True), out, CODEC, start=0)
    assert torch.equal(out[:, :, : k.ntokens].view(torch.int16),
                       kv[:, :, k.start:k.end].view(torch.int16))


@pytest.mark.parametrize("direct", [True, False])
def test_round_trip_bit_exact(tmp_path, chunks, direct):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30, direct_io="auto" if direct else False)
    for k, b in zip(keys, blobs):
        assert t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens)
    t.drop_page_cache()
    for k, b in zip(keys, blobs):
        got = t.read(k.digest, direct=direct)
        assert bytes(got) == b
        _check(got, kv, k)
    assert not leftover_temporaries(tmp_path)


def test_restart_recovers_index(tmp_path, chunks):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    for k, b in zip(keys, blobs):
        t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens)
    (tmp_path / "kvcore-v1" / "tmp" / "leftover.tmp").write_bytes(b"partial")  # a crash mid-write
    (tmp_path / "kvcore-v1" / "ns" / "garbage.kvc").write_bytes(b"x")
    t2 = SSDTier(tmp_path, 1 << 30)
    assert set(t2.index) == {k.digest for k in keys}
    assert t2.used_bytes == sum(len(b) for b in blobs)
    e = t2.entry(keys[2].digest)
    assert (e.start, e.ntokens, e.ns_tag) == (512, 256, "ns")
    assert bytes(t2.read(keys[3].digest)) == blobs[3]
    assert not (tmp_path / "kvcore-v1" / "tmp" / "leftover.tmp").exists()
    assert not (tmp_path / "kvcore-v1" / "ns" / "garbage.kvc").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "swap"])
def test_corrupt_or_partial_file_is_miss_and_removed(tmp_path, chunks, damage):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    for k, b in zip(keys[:2], blobs[:2]):
        t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens)
    path = t.entry(keys[0].digest).path
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) - 1000]
    elif damage == "empty":
        data = bytearray()
    elif damage == "swap":
        data = bytearray(t.entry(keys[1].digest).path.read_bytes())  # valid blob, wrong key
    path.write_bytes(data)
    if damage in ("truncate", "empty"):
        t = SSDTier(tmp_path, 1 << 30)  # also after a restart
    assert t.read(keys[0].digest) is None
    assert not path.exists() and not t.contains(keys[0].digest)
    assert bytes(t.read(keys[1].digest)) == blobs[1]
    if damage != "empty":
        assert t.metrics.snapshot()["tiers"]["ssd"]["corrupt"] == 1


def test_capacity_evicts_oldest_and_rejects_oversize(tmp_path, chunks):
    kv, keys, blobs = chunks
    cap = max(len(b) for b in blobs) * 2 + 10
    t = SSDTier(tmp_path, cap)
    for k, b in zip(keys, blobs):
        assert t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens)
        assert t.used_bytes <= cap
    assert set(t.index) == {keys[2].digest, keys[3].digest}
    assert sum(f.stat().st_size for f in (tmp_path / "kvcore-v1" / "ns").iterdir()) <= cap
    small = SSDTier(tmp_path / "small", 100)
    assert not small.write(keys[0].digest, blobs[0], ns_tag="ns")
    assert small.metrics.snapshot()["tiers"]["ssd"]["rejected"] == 1


def test_a_victim_is_found_until_on_evict_returns(tmp_path, chunks):
    """on_evict (a TierManager's demotion to Redis) ran after the victim had left the index:
    while its copy was on its way, a lookup or read of the chunk missed it. It is now found,
    and read from its file, until on_evict returns; then it is a miss and its file is gone."""
    kv, keys, blobs = chunks
    seen = []

    def on_evict(key, e):
        # From another thread, as a lookup or retrieve would (on_evict runs outside the locks).
        th = threading.Thread(target=lambda: seen.append((key, t.contains(key), t.read(key))))
        th.start()
        th.join(30)

    t = SSDTier(tmp_path, max(len(b) for b in blobs) + 10, on_evict=on_evict)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns", start=0, ntokens=256)
    assert t.write(keys[1].digest, blobs[1], ns_tag="ns", start=256, ntokens=256)  # evicts chunk 0
    assert [(k, there) for k, there, _ in seen] == [(keys[0].digest, True)]
    assert bytes(seen[0][2]) == blobs[0]
    assert not t.contains(keys[0].digest) and t.read(keys[0].digest) is None
    assert not leftover_temporaries(tmp_path) and t.used_bytes == len(blobs[1])
    assert t.metrics.snapshot()["tiers"]["ssd"]["corrupt"] == 0


def test_set_expiry_renames_the_file_without_rewriting_it(tmp_path, chunks):
    """set_expiry gives a file another expiry by renaming it (the name carries it): the
    same inode, seen by another tier on the directory and after a restart."""
    kv, keys, blobs = chunks
    k = keys[0]
    a = SSDTier(tmp_path, 1 << 30)
    b = SSDTier(tmp_path, 1 << 30)
    assert a.write(k.digest, blobs[0], ns_tag="ns", start=0, ntokens=256, expires_ms=4_000_000_000_000)
    inode = a.entry(k.digest).path.stat().st_ino
    assert a.set_expiry(k.digest, 5_000_000_000_000)
    e = a.entry(k.digest)
    assert e.expires_ms == 5_000_000_000_000 and e.path.stat().st_ino == inode
    assert b.entry(k.digest).expires_ms == 5_000_000_000_000 and bytes(b.read(k.digest)) == blobs[0]
    assert a.set_expiry(k.digest, 0) and b.entry(k.digest).expires_ms == 0
    assert not a.set_expiry(keys[1].digest, 0)  # no file
    a.close()
    b.close()
    t = SSDTier(tmp_path, 1 << 30)
    assert t.entry(k.digest).expires_ms == 0 and bytes(t.read(k.digest)) == blobs[0]
    assert len(list((tmp_path / "kvcore-v1" / "ns").iterdir())) == 1


def test_capacity_under_concurrent_writers(tmp_path, chunks):
    kv, keys, blobs = chunks
    cap = int(len(blobs[0]) * 2.5)
    t = SSDTier(tmp_path, cap, fsync=False)
    peak = [0]

    def writer(seed):
        for i in range(12):
            k = keys[(i + seed) % 4]
            t.write(bytes([seed, i]) + k.digest[2:], blobs[(i + seed) % 4], ns_tag="ns")
            peak[0] = max(peak[0], t.used_bytes)
            t.read(keys[i % 4].digest)

    errors = errors_of_threads(writer, 3)
    assert not errors
    assert peak[0] <= cap
    assert sum(f.stat().st_size for f in (tmp_path / "kvcore-v1" / "ns").iterdir()) <= cap


def test_eviction_takes_a_sequence_tail_first(tmp_path, chunks):
    """A retrieve reads a prefix from chunk 0 on, so under LRU chunk 0 was the first victim
    and the chunks after it were unreachable. A chunk written with its parent leaves only
    after the chunks held here that extend it."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, sum(len(b) for b in blobs[:3]) + 10)
    for k, b in zip(keys[:3], blobs[:3]):
        assert t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens, parent=k.parent)
    for k in keys[:3]:
        assert t.read(k.digest) is not None  # chunk 0 is now the least recent
    assert t.write(b"o" * 16, blobs[2], ns_tag="ns")  # the room of one chunk
    assert [t.contains(k.digest) for k in keys[:3]] == [True, True, False]


def test_a_write_does_not_evict_its_own_prefix(tmp_path, chunks):
    """A sequence longer than the room evicted its own prefix for its tail (chunk 2's write
    took chunk 1, a leaf until chunk 2 came). keep (the nearest chunk of the written one's
    prefix held here) is not evicted for it: the write is refused and goes elsewhere."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, sum(len(b) for b in blobs[:2]) + 10)
    for k, b in zip(keys[:2], blobs[:2]):
        assert t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens, parent=k.parent)
    assert not t.write(keys[2].digest, blobs[2], ns_tag="ns", parent=keys[2].parent, keep=keys[1].digest)
    assert [t.contains(k.digest) for k in keys[:3]] == [True, True, False]
    assert t.write(b"o" * 16, blobs[1], ns_tag="ns")  # another sequence's chunk: the tail leaves
    assert [t.contains(k.digest) for k in keys[:2]] == [True, False]


def test_eviction_follows_the_callers_levels_and_takes_expired_files_first(tmp_path, chunks):
    """The SSD tier ignored priorities (set_priority) and expiry: a chunk of a high level, or
    of none, left before an expired one or one of a lower level."""
    kv, keys, blobs = chunks
    blob = blobs[0]
    levels = {b"h" * 16: 1, b"l" * 16: -1}
    t = SSDTier(tmp_path, len(blob) * 3 + 10, levels=lambda: levels)
    for key in (b"h" * 16, b"l" * 16, b"0" * 16):
        assert t.write(key, blob, ns_tag="ns")
    assert t.write(b"1" * 16, blob, ns_tag="ns")  # the lowest level leaves
    assert set(t.index) == {b"h" * 16, b"0" * 16, b"1" * 16}
    assert t.write(b"x" * 16, blob, ns_tag="ns", expires_ms=int(time.time() * 1000) + 300)
    assert set(t.index) == {b"h" * 16, b"1" * 16, b"x" * 16}  # the oldest of level 0
    time.sleep(0.4)
    assert t.write(b"2" * 16, blob, ns_tag="ns")  # the expired file leaves, not the oldest
    assert set(t.index) == {b"h" * 16, b"1" * 16, b"2" * 16}


def test_a_file_given_an_expiry_by_set_expiry_leaves_first_once_expired(tmp_path, chunks):
    """set_expiry renamed the file but did not tell the tier's heap of expiries: a file
    given an expiry (or a shorter one) that then passed still left in policy order, after
    files that had not expired."""
    kv, keys, blobs = chunks
    blob = blobs[0]
    t = SSDTier(tmp_path, len(blob) * 2 + 10)
    assert t.write(b"a" * 16, blob, ns_tag="ns")
    assert t.write(b"b" * 16, blob, ns_tag="ns", expires_ms=int(time.time() * 1000) + 600_000)
    assert t.set_expiry(b"b" * 16, int(time.time() * 1000) + 300)
    time.sleep(0.4)
    assert t.write(b"c" * 16, blob, ns_tag="ns")  # the expired file leaves, not the oldest
    assert set(t.index) == {b"a" * 16, b"c" * 16}


def test_set_expiry_keeps_the_parent_link(tmp_path, chunks):
    """set_expiry replaced the index entry by one without its parent: a later rewrite of the
    file (same chunk) then lost the link, and the parent could leave before its child."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    assert t.write(keys[1].digest, blobs[1], ns_tag="ns", start=256, ntokens=256, parent=keys[0].digest)
    assert t.set_expiry(keys[1].digest, 5_000_000_000_000)
    assert t.entry(keys[1].digest).parent == keys[0].digest


def _write_sequence(t, keys, blobs, *, streamed):
    """Writes chunks 0..n-1 of a sequence, each with its parent, oldest first."""
    for k, b in zip(keys, blobs):
        parent = k.prev.digest if k.prev is not None else None
        if streamed:
            buf = ScratchPool().get(len(b) + 8192)
            memoryview(buf)[:len(b)] = b
            sw = t.begin_write(k.digest, buf, ns_tag="ns", reserve=len(b), start=k.start, ntokens=k.ntokens,
                               parent=parent)
            sw.add(0, len(b))
            assert sw.commit(len(b))
        else:
            assert t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens, parent=parent)


@pytest.mark.parametrize("streamed", [False, True])
def test_files_carry_their_parent_to_other_tiers_and_a_restart(tmp_path, chunks, streamed):
    """A file's parent was known only to the tier that wrote it: another process sharing
    the directory, or this one after a restart, ordered the files by the policy alone, so a
    sequence's chunk 0 (its oldest file) was the first victim while the later chunks, then
    unreachable, stayed. The parent now travels with the file (an extended attribute): the
    others and a restart keep the prefix and evict the tail first."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    other = SSDTier(tmp_path, 1 << 30)  # another process's tier on the directory
    _write_sequence(t, keys[:3], blobs[:3], streamed=streamed)
    parents = [None, keys[0].digest, keys[1].digest]
    assert [other.entry(k.digest).parent for k in keys[:3]] == parents
    t.close()
    other.close()
    for age, k in enumerate(keys[:3]):  # chunk 0 the oldest file, by a second each
        os.utime(SSDTier(tmp_path, 1 << 30).entry(k.digest).path, (1e9 + age, 1e9 + age))
    assert [SSDTier(tmp_path, 1 << 30).entry(k.digest).parent for k in keys[:3]] == parents
    two = sum(len(b) for b in blobs[:2]) + 10
    small = SSDTier(tmp_path, two)  # a smaller reopen: one file must go
    assert [small.contains(k.digest) for k in keys[:3]] == [True, True, False]


def test_a_file_without_a_parent_attribute_is_read_as_before(tmp_path, chunks):
    """Files of earlier versions (or on a filesystem without extended attributes) carry no
    parent: they are indexed and read as before, ordered by the policy alone."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    assert t.write(keys[1].digest, blobs[1], ns_tag="ns", start=256, ntokens=256)
    t.close()
    again = SSDTier(tmp_path, 1 << 30)
    assert again.entry(keys[1].digest).parent is None and bytes(again.read(keys[1].digest)) == blobs[1]


@pytest.mark.parametrize("claim", ["itself", "its child"])
def test_a_parent_attribute_that_makes_a_loop_is_ignored(tmp_path, chunks, claim):
    """A file's parent attribute was trusted as it was read: one naming the file's own key
    (or a chunk that extends it, a loop of two) made it a chunk that a held chunk extends,
    so it was never a victim (nor its prefix): a file the tier could not evict, however
    full. A parent that is the chunk itself, or starts no earlier, is now ignored."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    _write_sequence(t, keys[:2], blobs[:2], streamed=False)
    paths = [t.entry(k.digest).path for k in keys[:2]]
    t.close()
    # damaged attributes: chunk 1 claims itself as its parent, or chunk 0 claims chunk 1
    os.setxattr(paths[1 if claim == "itself" else 0], "user.kvcore.parent", keys[1].digest)
    small = SSDTier(tmp_path, 10)  # a reopen with room for no file: every one must go
    assert small.used_bytes == 0 and not any(small.contains(k.digest) for k in keys[:2])


@pytest.mark.parametrize("how", ["remove", "clear"])
def test_a_victim_removed_while_it_is_demoted_is_gone(tmp_path, chunks, how):
    """remove() (and clear()) of a chunk being demoted (on_evict still running) returned
    False and left it findable: contains() and read() still found it until the demotion
    ended, and its caller (the manager's evict/clear) could not tell that its copy was on its
    way to Redis. It is now gone at once, and leaving() says so to on_evict."""
    kv, keys, blobs = chunks
    seen = []

    def on_evict(key, e):
        removed = t.remove(key) if how == "remove" else t.clear("ns")
        seen.append((removed, t.contains(key), t.read(key), t.leaving(key, e)))

    t = SSDTier(tmp_path, max(len(b) for b in blobs) + 10, on_evict=on_evict)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns", start=0, ntokens=256)
    assert t.write(keys[1].digest, blobs[1], ns_tag="other", start=256, ntokens=256)  # evicts chunk 0
    assert seen == [(1, False, None, False)]
    assert not t.contains(keys[0].digest) and t.contains(keys[1].digest)
    assert not leftover_temporaries(tmp_path) and t.used_bytes == len(blobs[1])


def test_a_victim_given_an_expiry_while_it_is_demoted_takes_it_along(tmp_path, chunks):
    """set_expiry of a chunk being demoted (on_evict still running) returned False and
    changed nothing: its copy elsewhere kept the old expiry. The victim's entry, which
    on_evict holds, now takes the new one (its temporary file keeps its name)."""
    kv, keys, blobs = chunks
    seen = []

    def on_evict(key, e):
        before = e.expires_ms
        seen.append((t.set_expiry(key, 5_000_000_000_000), before, e.expires_ms, e.path.exists()))

    t = SSDTier(tmp_path, max(len(b) for b in blobs) + 10, on_evict=on_evict)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns", start=0, ntokens=256, expires_ms=4_000_000_000_000)
    assert t.write(keys[1].digest, blobs[1], ns_tag="ns", start=256, ntokens=256)  # evicts chunk 0
    assert seen == [(True, 4_000_000_000_000, 5_000_000_000_000, True)]
    assert not t.contains(keys[0].digest) and not t.set_expiry(keys[0].digest, 0)  # gone once demoted
    assert not leftover_temporaries(tmp_path) and t.used_bytes == len(blobs[1])


@pytest.mark.parametrize("direct", [True, False])
def test_a_read_finds_the_file_that_set_expiry_renamed_after_its_lookup(tmp_path, chunks, monkeypatch, direct):
    """A read that had looked the chunk up just before set_expiry renamed its file (another
    thread's set_ttl, or another process's) opened the old name: a miss for a chunk that was
    there. It now looks the chunk up again once and reads the renamed file."""
    kv, keys, blobs = chunks
    k = keys[0]
    t = SSDTier(tmp_path, 1 << 30, direct_io="auto" if direct else False)
    other = SSDTier(tmp_path, 1 << 30)  # the renaming tier: another process's, or this one
    assert t.write(k.digest, blobs[0], ns_tag="ns", start=0, ntokens=256, expires_ms=4_000_000_000_000)
    live = t._live_entry

    def renamed_after_the_lookup(key):
        e = live(key)
        assert other.set_expiry(key, 5_000_000_000_000)
        return e

    monkeypatch.setattr(t, "_live_entry", renamed_after_the_lookup)
    got = t.read(k.digest)
    assert got is not None and bytes(got) == blobs[0]
    assert t.metrics.snapshot()["tiers"]["ssd"].get("misses", 0) == 0
    assert t.entry(k.digest).expires_ms == 5_000_000_000_000


def test_restart_with_smaller_capacity_trims(tmp_path, chunks):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    for k, b in zip(keys, blobs):
        t.write(k.digest, b, ns_tag="ns")
    cap = max(len(b) for b in blobs) + 1
    t2 = SSDTier(tmp_path, cap)
    assert len(t2) == 1 and t2.used_bytes <= cap


def test_clear_namespace(tmp_path, chunks):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    t.write(keys[0].digest, blobs[0], ns_tag="a")
    t.write(keys[1].digest, blobs[1], ns_tag="b")
    assert t.clear("a") == 1
    assert not t.contains(keys[0].digest) and t.contains(keys[1].digest)


def test_full_disk_stops_cleanly(small_tmpfs, chunks):
    kv, keys, blobs = chunks
    t = SSDTier(small_tmpfs, 1 << 30)  # capacity far above the 4 MiB filesystem
    results = [t.write(k.digest, b, ns_tag="ns", start=k.start, ntokens=k.ntokens)
               for k, b in zip(keys, blobs)]
    assert results[0] and not all(results)
    snap = t.metrics.snapshot()["tiers"]["ssd"]
    assert snap["errors"] >= 1 and "ENOSPC" in t.last_error
    assert not leftover_temporaries(small_tmpfs)  # no partial file left
    for k, b, ok in zip(keys, blobs, results):
        assert (bytes(t.read(k.digest)) == b) if ok else t.read(k.digest) is None
    assert t.used_bytes == sum(len(b) for b, ok in zip(blobs, results) if ok)
    assert SSDTier(small_tmpfs, 1 << 30).used_bytes == t.used_bytes  # restart agrees


def test_expired_files(tmp_path, chunks):
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    t.write(keys[0].digest, blobs[0], ns_tag="ns", expires_ms=1)  # long ago
    assert t.read(keys[0].digest) is None and len(t) == 0


def test_a_read_after_close_is_a_miss_and_starts_no_thread(tmp_path, chunks):
    """A read that comes after close() (a TierManager's read-ahead still running while it
    closes) started a new pool of reader threads that nothing shut down: a leaked thread.
    It is a miss instead, as every read cut short by close() is, never an exception."""
    import threading

    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns")
    assert bytes(t.read(keys[0].digest)) == blobs[0]  # the tier's reader threads run
    t.close()
    before = set(threading.enumerate())
    assert t.read(keys[0].digest) is None
    assert t.stream(keys[0].digest) is None
    started = [th.name for th in threading.enumerate() if th not in before]
    assert t._readers is None and not started, started
    assert t.metrics.snapshot()["tiers"]["ssd"]["misses"] == 2


def test_directories_that_are_no_namespace_are_left_alone(tmp_path, chunks):
    """Every directory under the layout was taken for a namespace: one whose name did not
    fit a journal record's ASCII tag (a non-ASCII name) made the tier fail to open
    (UnicodeEncodeError), a longer name went into the journal cut to 16 characters (the
    other processes looked for its files elsewhere), and their other files were deleted."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns")
    t.close()
    root = tmp_path / "kvcore-v1"
    foreign = [root / "né" / t.entry(keys[0].digest).path.name, root / "a_longer_directory_name" / "notes.txt",
               root / "a_longer_directory_name" / f"{keys[1].digest.hex()}.0.256.0.kvc"]
    for f in foreign:
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(b"not the tier's")
    t = SSDTier(tmp_path, 1 << 30)
    assert set(t.index) == {keys[0].digest} and t.used_bytes == len(blobs[0])
    assert all(f.read_bytes() == b"not the tier's" for f in foreign)
    assert bytes(t.read(keys[0].digest)) == blobs[0]


def test_chunk_files_only_under_the_names_the_tier_writes(tmp_path, chunks):
    """A file name of the chunk pattern whose numbers do not fit a journal record made the
    tier fail to open (struct.error); one with numbers in another form (leading zeros) was
    indexed under the name the tier would write, so a process that took it from the
    journal missed it and left the real file on disk, uncounted; a directory under a
    chunk's name was counted and failed every read."""
    kv, keys, blobs = chunks
    t = SSDTier(tmp_path, 1 << 30)
    assert t.write(keys[0].digest, blobs[0], ns_tag="ns", start=0, ntokens=256)
    t.close()
    ns = tmp_path / "kvcore-v1" / "ns"
    bad = [f"{keys[1].digest.hex()}.{1 << 64}.256.0.kvc", f"{keys[2].digest.hex()}.0.{1 << 32}.0.kvc",
           f"{keys[3].digest.hex()}.0256.256.0.kvc"]
    for name in bad:
        (ns / name).write_bytes(blobs[1])
    (ns / f"{bytes(16).hex()}.0.256.0.kvc").mkdir()
    t = SSDTier(tmp_path, 1 << 30)
    other = SSDTier(tmp_path, 1 << 30)  # replaces the journal: t reloads from it
    for tier in (t, other):
        assert set(tier.index) == {keys[0].digest} and tier.used_bytes == len(blobs[0])
        assert bytes(tier.read(keys[0].digest)) == blobs[0]
    assert sorted(p.name for p in ns.iterdir()) == sorted([t.entry(keys[0].digest).path.name,
                                                           f"{bytes(16).hex()}.0.256.0.kvc"])


@pytest.mark.parametrize("streamed", [True, False])
def test_a_blob_of_fewer_tokens_under_a_chunks_key_is_a_corrupt_miss(tmp_path, chunks, streamed):
    """A valid blob that claims chunk 0's key but holds 128 of its 256 tokens (forged, or
    written by a faulty peer) restored those 128 while retrieve counted all 256 restored:
    the rest of out kept what it held. It is a miss now, counted corrupt, the file removed."""
    import kvcore

    kv, keys, _ = chunks
    short = bytes(encode_chunk(kv[:, :, :128], CODEC, key=keys[0].digest, index=0))
    tm = kvcore.TierManager(ddr_bytes=0, ssd_dir=tmp_path, ssd_bytes=1 << 30, chunk_tokens=256,
                            namespace="test-model", read_ahead=0 if streamed else 2)
    assert tm.ssd.write(keys[0].digest, short, ns_tag=tm._ns_tag, start=0, ntokens=256)
    out = torch.zeros_like(kv)
    assert tm.retrieve(list(range(1024)), out, on_layer=None if streamed else (lambda layer: None)) == 0
    assert not tm.ssd.contains(keys[0].digest)
    assert tm.metrics.snapshot()["tiers"]["ssd"]["corrupt"] == 1
    tm.close()


@pytest.mark.parametrize("streamed", [True, False])
def test_a_fifo_in_place_of_a_chunk_file_is_a_corrupt_miss(tmp_path, chunks, streamed):
    """A FIFO put where a chunk's file was blocked the read's open for good (until some
    writer opened it), and drop_page_cache's too. Now it is refused at once: a corrupt
    miss, removed."""
    import kvcore

    kv, keys, blobs = chunks
    tm = kvcore.TierManager(ddr_bytes=0, ssd_dir=tmp_path, ssd_bytes=1 << 30, chunk_tokens=256,
                            namespace="test-model", read_ahead=0 if streamed else 2)
    assert tm.ssd.write(keys[0].digest, blobs[0], ns_tag=tm._ns_tag, start=0, ntokens=256)
    path = tm.ssd.entry(keys[0].digest).path
    path.unlink()
    os.mkfifo(path)
    done = []

    def reads() -> None:
        tm.ssd.drop_page_cache()
        done.append(tm.retrieve(list(range(1024)), torch.zeros_like(kv),
                                on_layer=None if streamed else (lambda layer: None)))

    th = threading.Thread(target=reads, daemon=True)
    th.start()
    th.join(60)
    if th.is_alive():  # unblock the open so the thread ends, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("a read opened the FIFO and waited for a writer")
    assert done == [0] and not path.exists()
    assert tm.metrics.snapshot()["tiers"]["ssd"]["corrupt"] == 1
    tm.close()


@pytest.mark.parametrize("streamed", [True, False])
def test_a_chunk_of_a_newer_blob_version_is_a_miss_and_stays(tmp_path, chunks, streamed):
    """A blob of a later format version (a newer kvcore sharing the directory in a rolling
    upgrade) was counted corrupt and its file deleted by every older reader. It is a miss,
    and the file stays for the processes that read it."""
    import kvcore

    kv, keys, blobs = chunks
    tm = kvcore.TierManager(ddr_bytes=0, ssd_dir=tmp_path, ssd_bytes=1 << 30, chunk_tokens=256,
                            namespace="test-model", read_ahead=0 if streamed else 2)
    assert tm.ssd.write(keys[0].digest, with_version(blobs[0], 2), ns_tag=tm._ns_tag, start=0, ntokens=256,
                        verify_blob=False)  # this kvcore would not write it
    out = torch.zeros_like(kv)
    assert tm.retrieve(list(range(1024)), out, on_layer=None if streamed else (lambda layer: None)) == 0
    assert tm.ssd.contains(keys[0].digest) and tm.ssd.entry(keys[0].digest).path.exists()
    snap = tm.metrics.snapshot()["tiers"]["ssd"]
    assert snap["corrupt"] == 0 and snap["misses"] >= 1
    tm.close()


@pytest.mark.parametrize("streamed", [True, False])
def test_a_chunk_of_a_codec_this_build_lacks_is_a_miss_and_stays(tmp_path, chunks, streamed):
    """A valid blob stored with a codec this build cannot decode (a newer kvcore's; the
    native codec in a build without it) passed the read's checks, and every retrieve of
    it raised CorruptFrameError. It is a miss, and the file stays for the processes that
    decode it."""
    import kvcore

    kv, keys, blobs = chunks
    tm = kvcore.TierManager(ddr_bytes=0, ssd_dir=tmp_path, ssd_bytes=1 << 30, chunk_tokens=256,
                            namespace="test-model", read_ahead=0 if streamed else 2)
    assert tm.ssd.write(keys[0].digest, with_codec(blobs[0], 9), ns_tag=tm._ns_tag, start=0, ntokens=256)
    path = tm.ssd.entry(keys[0].digest).path
    out = torch.zeros_like(kv)
    tokens = list(range(1024))
    assert tm.retrieve(tokens, out, on_layer=None if streamed else (lambda layer: None)) == 0
    assert tm.ssd.read(keys[0].digest) is None and path.exists()
    snap = tm.metrics.snapshot()["tiers"]["ssd"]
    assert snap["corrupt"] == 0 and snap["misses"] >= 2
    tm.close()

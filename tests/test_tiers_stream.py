"""Streamed tier I/O: SSD files written while their blob encodes (StreamWrite), read in
O_DIRECT segments hashed as they land (StreamRead), remote values decoded as their parts
arrive (RemoteRead), and the native pieces they use (Checksum64, compress_into)."""

import os
import threading

import numpy as np
import pytest
import torch
import xxhash

import kvcore
import kvcore.tiers.resp as resp
import kvcore.tiers.ssd as ssd
from kvcore import _native
from kvcore.errors import BufferTooSmallError, InvalidArgumentError
from kvcore.tiers import Namespace, TierManager
from kvcore.tiers.blob import BlobHeader, blob_bound, decode_into, encode_chunk, encode_chunk_into
from kvcore.tiers.codecs import RawCodec, make_codec
from kvcore.tiers.keys import chunk_keys
from kvcore.tiers.remote import RemoteConfig, RemoteTier
from kvcore.tiers.ssd import ScratchPool, SSDTier
from isa_variants import VARIANTS, use_variant
from tiers_support import leftover_temporaries, load_kv, local_redis, redis_server, small_tmpfs  # noqa: F401

CODEC = make_codec("auto")
NS = Namespace("minilm-l6", "bfloat16", salt="stream-tests")
FRAME = 2 * 256 * 12 * 32 * 2  # one layer of a 256-token chunk: 6 frames per chunk
# For the managers on the local test server: a call that times out opens the breaker and
# the next ones are skipped; the default lookup_timeout_s (0.25 s) could run out on a
# loaded machine. These tests are not about timeouts.
@pytest.fixture(scope="module")
def kv():
    return load_kv()[:, :, :1024].contiguous()  # [6, 2, 1024, 12, 32] bf16


@pytest.fixture(scope="module")
def keys():
    return chunk_keys(range(1024), "stream-model", 256)


@pytest.fixture
def small_pieces(monkeypatch):
    """Writes, flushes and reads in pieces far smaller than a chunk (many of each)."""
    monkeypatch.setattr(ssd, "WRITE_SEGMENT_BYTES", 8192)
    monkeypatch.setattr(ssd, "FLUSH_EVERY_BYTES", 32768)
    monkeypatch.setattr(ssd, "DIRECT_SEGMENT_BYTES", 8192)
    monkeypatch.setattr(ssd, "BUFFERED_SEGMENT_BYTES", 8192)
    monkeypatch.setattr(ssd, "DIRECT_MIN_BYTES", 4096)


def same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _stream_write(t, k, part, pool, codec=CODEC):
    buf = pool.get(blob_bound(part, codec, FRAME) + 4096)
    sw = t.begin_write(k.digest, buf, ns_tag="ns", reserve=blob_bound(part, codec, FRAME), start=k.start,
                       ntokens=k.ntokens)
    assert sw is not None
    n = encode_chunk_into(part, codec, memoryview(buf), key=k.digest, index=k.index, frame_bytes=FRAME,
                          on_frame=sw.add)
    return sw, buf, n


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("codec", ["auto", "raw"])
def test_stream_write_equals_blob_and_reads_back(tmp_path, kv, keys, small_pieces, direct, codec):
    codec = make_codec(codec)
    t = SSDTier(tmp_path, 1 << 30, direct_io="auto" if direct else False)
    pool = ScratchPool()
    for k in keys:
        part = kv[:, :, k.start:k.end]
        sw, buf, n = _stream_write(t, k, part, pool, codec)
        assert sw.direct == (direct and t._direct_ok)
        assert sw.commit(n)
        blob = bytes(encode_chunk(part, codec, key=k.digest, index=k.index, frame_bytes=FRAME))
        assert bytes(memoryview(buf)[:n]) == blob
        assert t.entry(k.digest).path.read_bytes() == blob  # exact size: the padding was cut off
    assert t.used_bytes == sum(e.size for e in t.index.values())
    assert not leftover_temporaries(tmp_path)
    t2 = SSDTier(tmp_path, 1 << 30, direct_io="auto" if direct else False)  # a restart finds them
    t2.drop_page_cache()
    for k in keys:
        got = t2.read(k.digest, direct=direct)
        out = torch.zeros_like(kv[:, :, :256])
        decode_into(got, BlobHeader.parse(got, verify=True), out, codec)
        assert same(out, kv[:, :, k.start:k.end])


def test_stream_write_abort_and_capacity(tmp_path, kv, keys, small_pieces):
    pool = ScratchPool()
    part = kv[:, :, :256]
    size = len(encode_chunk(part, CODEC, key=keys[0].digest, index=0, frame_bytes=FRAME))
    t = SSDTier(tmp_path, int(size * 2.5))
    sw, buf, n = _stream_write(t, keys[0], part, pool)
    sw.abort()
    assert t.used_bytes == 0 and len(t) == 0
    assert not leftover_temporaries(tmp_path)
    # a reservation below the real size: commit makes room (evicting the oldest) or refuses
    for k in keys:
        buf = pool.get(blob_bound(part, CODEC, FRAME) + 4096)
        sw = t.begin_write(k.digest, buf, ns_tag="ns", reserve=size // 2)
        n = encode_chunk_into(kv[:, :, k.start:k.end], CODEC, memoryview(buf), key=k.digest, index=k.index,
                              frame_bytes=FRAME, on_frame=sw.add)
        assert sw.commit(n)
        assert t.used_bytes <= t.capacity_bytes
    assert len(t) == 2 and t.used_bytes == sum(e.size for e in t.index.values())
    assert sum(f.stat().st_size for f in (tmp_path / "kvcore-v1" / "ns").iterdir()) <= t.capacity_bytes
    tiny = SSDTier(tmp_path / "tiny", size // 2)
    buf = pool.get(blob_bound(part, CODEC, FRAME) + 4096)
    sw = tiny.begin_write(keys[0].digest, buf, ns_tag="ns", reserve=size // 4)
    n = encode_chunk_into(part, CODEC, memoryview(buf), key=keys[0].digest, index=0, frame_bytes=FRAME,
                          on_frame=sw.add)
    assert not sw.commit(n)  # does not fit at all
    assert tiny.used_bytes == 0 and len(tiny) == 0
    assert tiny.metrics.snapshot()["tiers"]["ssd"]["rejected"] == 1
    assert not leftover_temporaries(tmp_path / "tiny")


def test_stream_write_full_disk(small_tmpfs, kv, keys, small_pieces):
    t = SSDTier(small_tmpfs, 1 << 30)  # far above the 4 MiB filesystem; tmpfs: no O_DIRECT
    pool = ScratchPool()
    results = []
    for k in keys:
        sw, buf, n = _stream_write(t, k, kv[:, :, k.start:k.end], pool)
        results.append(sw.commit(n))
    assert results[0] and not all(results)
    assert "ENOSPC" in t.last_error
    assert not leftover_temporaries(small_tmpfs)  # no partial file left
    assert t.used_bytes == sum(e.size for e in t.index.values())
    assert SSDTier(small_tmpfs, 1 << 30).used_bytes == t.used_bytes


def test_stream_read_corrupt_is_miss(tmp_path, kv, keys, small_pieces):
    t = SSDTier(tmp_path, 1 << 30)
    blob = bytes(encode_chunk(kv[:, :, :256], CODEC, key=keys[0].digest, index=0))
    assert t.write(keys[0].digest, blob, ns_tag="ns")
    path = t.entry(keys[0].digest).path
    data = bytearray(path.read_bytes())
    data[len(data) - 20] ^= 4  # in the last segment: hashed last
    path.write_bytes(data)
    t.drop_page_cache()
    assert t.read(keys[0].digest) is None and not path.exists()
    assert t.metrics.snapshot()["tiers"]["ssd"]["corrupt"] == 1


def test_manager_streams_to_ssd(tmp_path, kv, small_pieces):
    toks = list(range(1024))
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS,
                     frame_bytes=FRAME) as tm:
        assert tm.store(toks, kv) == 4
        assert tm.flush(30)
        assert tm.lookup(toks).tiers == ["ssd"] * 4
        st = tm.status()["tiers"]["ssd"]
        assert st["stores"] == 4 and st["bytes_used"] == tm.ssd.used_bytes
        assert st["bytes_used"] < kv.numel() * 2  # compressed
        tm.ssd.drop_page_cache()
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)  # after a restart


def test_manager_full_disk_falls_back_to_remote(small_tmpfs, redis_server, kv, small_pieces):
    toks = list(range(1024))
    with TierManager(ddr_bytes=0, ssd_dir=str(small_tmpfs), ssd_bytes=1 << 30, remote_url=redis_server.url,
                     remote=local_redis(), namespace=NS, frame_bytes=FRAME) as tm:
        tm.store(toks, kv)
        assert tm.flush(30)
        hit = tm.lookup(toks)
        assert hit.tokens == 1024 and "remote" in hit.tiers and "ssd" in hit.tiers
        assert not leftover_temporaries(small_tmpfs)
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)


# ---------------------------------------------------------------------------- remote
@pytest.mark.parametrize("hint", [1, 3, 40])
def test_remote_stream_round_trip(redis_server, kv, keys, hint):
    t = RemoteTier(RemoteConfig(url=redis_server.url, part_bytes=100_000))
    blob = bytes(encode_chunk(kv[:, :, :256], CODEC, key=keys[0].digest, index=0, frame_bytes=FRAME))
    assert t.put("ns", keys[0].digest, blob)
    t._parts_hint = hint  # GETs sent with part 0's: fewer, exactly, or more than the parts
    rr = t.stream("ns", keys[0].digest, scratch=ScratchPool())
    assert rr.wait(1) and rr.wait(len(blob))
    got = rr.finish()
    assert bytes(got) == blob
    assert t._parts_hint == -(-len(blob) // 100_000)
    assert bytes(t.get("ns", keys[0].digest)) == blob  # the connection is still in sync
    t.close()


def test_remote_stream_corrupt_or_missing_part(redis_server, kv, keys):
    import redis

    r = redis.Redis.from_url(redis_server.url)
    t = RemoteTier(RemoteConfig(url=redis_server.url, part_bytes=100_000))
    for i, k in enumerate(keys[:2]):
        t.put("ns", k.digest, bytes(encode_chunk(kv[:, :, k.start:k.end], CODEC, key=k.digest, index=i)))
    name = f"kvcore:ns:{{{keys[0].hex}}}:5"
    bad = bytearray(r.get(name))
    bad[100] ^= 1
    r.set(name, bytes(bad))
    assert t.stream("ns", keys[0].digest).finish() is None
    assert not r.keys(f"kvcore:ns:{{{keys[0].hex}}}:*")  # deleted
    r.delete(f"kvcore:ns:{{{keys[1].hex}}}:2")
    rr = t.stream("ns", keys[1].digest)
    assert not rr.wait(1 << 30)  # never complete
    assert rr.finish() is None
    assert t.stream("ns", b"\1" * 16).finish() is None  # absent
    snap = t.metrics.snapshot()["tiers"]["remote"]
    assert snap["corrupt"] == 2 and snap["misses"] == 3
    t.close()


def test_manager_remote_streamed_retrieve(redis_server, kv):
    toks = list(range(1024))
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, namespace=NS, frame_bytes=FRAME,
                     promote_on_hit=False, remote=local_redis(part_bytes=100_000)) as tm:
        tm.store(toks, kv)
        assert tm.flush(30)
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        assert tm.status()["tiers"]["remote"]["hits"] == 4


def test_resp_window_sizes(redis_server, monkeypatch):
    import redis

    r = redis.Redis.from_url(redis_server.url)
    data = os.urandom(1_000_000)
    for i in range(10):
        r.set(f"w:{i}", data[i * 100_000:(i + 1) * 100_000])
    g = resp.RawGetter(redis_server.url, timeout=2, connect_timeout=1)
    for window in (1, 2, 5, 50):
        monkeypatch.setattr(resp, "WINDOW", window)
        landed = []
        got = g.get_parts(lambda i: f"w:{i}".encode(), lambda p: len(data), 100_000,
                          lambda n: memoryview(bytearray(n)), guess_parts=4, on_landed=landed.append)
        assert bytes(got) == data and landed == sorted(landed) and landed[-1] == len(data)
    g.close()


# ---------------------------------------------------------------------------- native
@pytest.mark.parametrize("variant", VARIANTS)  # libxxhash (SSE2), or XXH3 built for AVX2 or AVX-512
def test_checksum64_pieces(variant):
    use_variant(variant)
    try:
        data = os.urandom(3_000_001)
        c = _native.Checksum64()
        for a, b in ((0, 1), (1, 4096), (4096, 1_000_000), (1_000_000, len(data))):
            c.update(memoryview(data)[a:b])
        assert c.intdigest() == xxhash.xxh3_64_intdigest(data) and c.nbytes == len(data)
        assert _native.Checksum64(seed=7).intdigest() == xxhash.xxh3_64_intdigest(b"", seed=7)
        with pytest.raises(InvalidArgumentError):
            c.update(np.zeros((4, 4), dtype=np.uint8)[:, ::2])  # not contiguous
    finally:
        kvcore.set_disabled_isa("")


def test_checksum64_fresh_state_ignores_leftover_memory():
    """A new seeded hasher must not trust what its memory held before: freed memory that
    held the same seed once made XXH3 skip deriving its secret (wrong digests)."""
    data = os.urandom(3000)
    wrong = 0
    for _ in range(10):
        for seed in (1, 0x9E3779B97F4A7C15):
            for size in range(560, 1200, 8):
                junk = [seed.to_bytes(8, "little") * (size // 8) for _ in range(16)]
                del junk  # freed heap memory reading "seed" at every word
                c = _native.Checksum64(seed)
                c.update(data)
                wrong += c.intdigest() != xxhash.xxh3_64_intdigest(data, seed)
    assert wrong == 0


def test_compress_batch_into(kv):
    parts = [kv[:2, :, :256].contiguous(), kv[2:3, :, :100].contiguous()]
    srcs = [(*kvcore.codec.tensor_span(t), kvcore.dtypes.code_of(t.dtype), list(t.shape)) for t in parts]
    bounds = [kvcore.max_frame_size(t.dtype, tuple(t.shape)) for t in parts]
    out = bytearray(sum(bounds) + 10)
    slots = [memoryview(out)[10:10 + bounds[0]], memoryview(out)[10 + bounds[0]:]]
    sizes = _native.compress_batch_into(srcs, slots, mode=1)
    for t, slot, n in zip(parts, slots, sizes):
        assert bytes(slot[:n]) == kvcore.compress(t, mode="fast")
    src, code, shape = srcs[0][:2], srcs[0][2], srcs[0][3]
    with pytest.raises(BufferTooSmallError):
        _native.compress_batch_into([srcs[0]], [bytearray(bounds[0] - 1)], mode=1)
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into([(*src, code, [3, 5])], [bytearray(bounds[0])])  # shape does not match
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into([srcs[0]], [bytes(bounds[0])])  # read-only output
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into([(*src, 99, shape)], [bytearray(bounds[0])])
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into([(0, 16, code, [8])], [bytearray(bounds[0])])  # no data at a null address
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into(srcs, [slots[0], slots[0]])  # two frames into one buffer
    with pytest.raises(InvalidArgumentError):
        _native.compress_batch_into(srcs, slots[:1])
    assert RawCodec().encode_into(parts[0], memoryview(bytearray(parts[0].nbytes))) == parts[0].nbytes


def test_stream_read_survives_executor_shutdown(tmp_path, kv, keys, small_pieces):
    import concurrent.futures as cf

    t = SSDTier(tmp_path, 1 << 30)
    blob = bytes(encode_chunk(kv[:, :, :256], CODEC, key=keys[0].digest, index=0))
    assert t.write(keys[0].digest, blob, ns_tag="ns")
    ex = cf.ThreadPoolExecutor(max_workers=1)
    gate = threading.Event()  # not a sleep: a machine that stalls that long ran the reads first
    ex.submit(gate.wait)  # the reads queue behind this
    sr = t.stream(keys[0].digest, executor=ex)
    ex.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert sr.finish() is None  # a miss, not a hang
    assert bytes(t.read(keys[0].digest)) == blob  # the file is intact

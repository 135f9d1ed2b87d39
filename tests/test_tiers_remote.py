"""Remote tier against a real redis-server: round trip, TTL, parts, kill/restart, hang, close."""

import socket
import sys
import threading
import time

import pytest
import torch

import kvcore
from kvcore import TierManager
from kvcore.errors import UnsupportedError
from kvcore.tiers.blob import BlobHeader, decode_into, encode_chunk
from kvcore.tiers.codecs import make_codec
from kvcore.tiers.keys import chunk_keys
from kvcore.tiers.remote import CircuitBreaker, RemoteConfig, RemoteTier
from tiers_support import load_kv, local_redis, redis_cluster, redis_server, with_codec, with_version  # noqa: F401

CODEC = make_codec("auto")


@pytest.fixture(scope="module")
def chunks():
    kv = load_kv()[:, :, :1024]
    keys = chunk_keys(range(1024), "remote-model", 256)
    return kv, keys, [bytes(encode_chunk(kv[:, :, k.start:k.end], CODEC, key=k.digest, index=k.index))
                      for k in keys]


def _tier(server, **kw):
    return RemoteTier(local_redis(url=server.url, **kw))


@pytest.mark.parametrize("raw", [True, False])
def test_timeouts_longer_than_sockets_take_mean_no_limit(redis_server, chunks, raw):
    # 1e10 s overflows Python's socket and thread timeouts; kvcore caps it instead.
    _kv, keys, blobs = chunks
    t = _tier(redis_server, op_timeout_s=1e10, connect_timeout_s=1e10, lookup_timeout_s=1e300, raw_reads=raw)
    try:
        assert t.put("big", keys[0].digest, blobs[0])
        assert t.exists_many("big", [keys[0].digest]) == [True]
        assert bytes(t.get("big", keys[0].digest)) == blobs[0]
    finally:
        t.close()


def test_round_trip_and_parts(redis_server, chunks):
    kv, keys, blobs = chunks
    t = _tier(redis_server, part_bytes=100_000)  # ~1 MB chunks split into ~10 parts
    for k, b in zip(keys, blobs):
        assert t.put("ns", k.digest, b)
    assert t.exists_many("ns", [k.digest for k in keys] + [b"\0" * 16]) == [True] * 4 + [False]
    for k, b in zip(keys, blobs):
        got = t.get("ns", k.digest)
        assert bytes(got) == b
        out = torch.zeros_like(kv[:, :, :256])
        decode_into(got, BlobHeader.parse(got), out, CODEC)
        assert torch.equal(out.view(torch.int16), kv[:, :, k.start:k.end].view(torch.int16))
    import redis
    r = redis.Redis.from_url(redis_server.url)
    names = [n.decode() for n in r.keys("kvcore:ns:*")]
    assert all("{" + keys[0].hex + "}" in n for n in names if keys[0].hex in n)  # hash tag
    assert len([n for n in names if keys[0].hex in n]) == -(-len(blobs[0]) // 100_000)
    assert t.delete("ns", [keys[0].digest]) == 1
    assert t.get("ns", keys[0].digest) is None
    assert not [n for n in r.keys("kvcore:ns:*") if keys[0].hex.encode() in n]
    assert t.clear("ns") >= 3 and t.get("ns", keys[1].digest) is None
    t.close()


def test_ttl(redis_server, chunks):
    kv, keys, blobs = chunks
    t = _tier(redis_server)
    t0 = time.monotonic()
    assert t.put("ns", keys[0].digest, blobs[0], ttl_s=2.0)  # outlives the next two calls on a loaded machine
    assert t.put("ns", keys[1].digest, blobs[1])
    assert t.exists_many("ns", [keys[0].digest]) == [True]
    time.sleep(max(0.0, t0 + 2.3 - time.monotonic()))
    assert t.get("ns", keys[0].digest) is None
    assert t.get("ns", keys[1].digest) is not None
    t.close()


def test_set_expiry_reaches_every_part_without_sending_the_data(redis_server, chunks):
    """set_expiry gives every part of a stored chunk a new TTL (or none): a reader never
    finds part 0 outliving the others. Missing keys and keys of another type are reported
    as not stored, and left alone."""
    import redis

    kv, keys, blobs = chunks
    t = _tier(redis_server, part_bytes=100_000)  # ~10 parts a chunk
    r = redis.Redis.from_url(redis_server.url)
    assert t.put("ns", keys[0].digest, blobs[0], ttl_s=60)
    assert t.put("ns", keys[1].digest, blobs[1])
    r.rpush(t._key("ns", keys[2].digest, 0), b"x")  # a list where part 0 would be
    stores = t.metrics.snapshot()["tiers"]["remote"]["stores"]

    def pttls(k):
        return [r.pttl(n) for n in r.keys(f"kvcore:ns:{{{k.hex}}}:*")]

    assert t.set_expiry("ns", [k.digest for k in keys], ttl_s=600) == [True, True, False, False]
    for k in keys[:2]:
        ttls = pttls(k)
        assert len(ttls) > 5 and all(590_000 < ms <= 600_000 for ms in ttls)
    assert r.ttl(t._key("ns", keys[2].digest, 0)) == -1 and not r.exists(t._key("ns", keys[3].digest, 0))
    assert t.set_expiry("ns", [keys[0].digest]) == [True] and set(pttls(keys[0])) == {-1}  # no TTL
    assert t.metrics.snapshot()["tiers"]["remote"]["stores"] == stores
    assert bytes(t.get("ns", keys[0].digest)) == blobs[0]
    redis_server.kill()
    assert t.set_expiry("ns", [keys[0].digest], ttl_s=1) == [False]  # a dead server: nothing raised
    t.close()


def test_corrupt_value_is_miss_and_deleted(redis_server, chunks):
    import redis
    kv, keys, blobs = chunks
    t = _tier(redis_server)
    t.put("ns", keys[0].digest, blobs[0])
    r = redis.Redis.from_url(redis_server.url)
    name = f"kvcore:ns:{{{keys[0].hex}}}:0"
    bad = bytearray(r.get(name))
    bad[5000] ^= 1
    r.set(name, bytes(bad))
    assert t.get("ns", keys[0].digest) is None
    assert not r.exists(name)
    assert t.metrics.snapshot()["tiers"]["remote"]["corrupt"] == 1
    t2 = _tier(redis_server, part_bytes=100_000)
    t2.put("ns", keys[1].digest, blobs[1])
    r.delete(f"kvcore:ns:{{{keys[1].hex}}}:3")  # a part lost (evicted by maxmemory, say)
    assert t2.get("ns", keys[1].digest) is None
    assert not r.keys(f"kvcore:ns:{{{keys[1].hex}}}:*")  # the rest was removed
    t2.close()
    t.close()


def test_killed_and_restarted_server(redis_server, chunks):
    kv, keys, blobs = chunks
    t = _tier(redis_server, reset_after_s=0.3)
    assert t.put("ns", keys[0].digest, blobs[0])
    redis_server.kill()
    t0 = time.monotonic()
    for _ in range(20):  # misses, skips, never an exception
        assert t.get("ns", keys[0].digest) is None
        assert t.exists_many("ns", [keys[0].digest]) == [False]
        assert t.put("ns", keys[1].digest, blobs[1]) is False
    assert time.monotonic() - t0 < 5
    assert t.breaker.state in ("open", "half-open")
    snap = t.metrics.snapshot()["tiers"]["remote"]
    assert snap["skipped"] > 0 and snap["errors"] >= 2
    redis_server.start()  # empty (no persistence): recovery means working again
    time.sleep(0.4)
    deadline = time.monotonic() + 5
    while not t.put("ns", keys[2].digest, blobs[2]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert bytes(t.get("ns", keys[2].digest)) == blobs[2]
    assert t.get("ns", keys[0].digest) is None  # lost with the server, no corruption
    assert t.breaker.state == "closed"
    t.close()


def test_hung_server_never_stalls_caller(redis_server, chunks):
    # The sockets wait 60 s (op_timeout_s), the lookup 0.2 s: a call that waited on the hung
    # server would take a minute, so bounds of 10 s tell the two apart with a margin that a
    # loaded machine never eats (0.5 s, the socket timeout before, did not leave one).
    kv, keys, blobs = chunks
    t = _tier(redis_server, lookup_timeout_s=0.2, op_timeout_s=60, reset_after_s=600)
    assert t.put("ns", keys[0].digest, blobs[0])
    redis_server.pause()  # accepts connections, never answers
    try:
        t0 = time.monotonic()
        assert t.exists_many("ns", [keys[0].digest]) == [False]  # timed out: the breaker opens
        assert time.monotonic() - t0 < 10
        assert t.breaker.state == "open"
        t0 = time.monotonic()
        for _ in range(10):
            assert t.get("ns", keys[0].digest) is None
            assert t.exists_many("ns", [keys[0].digest]) == [False]
        assert time.monotonic() - t0 < 10  # breaker open: skipped at once (one get waiting: 60 s)
        assert t.metrics.snapshot()["tiers"]["remote"]["skipped"] == 20
        t0 = time.monotonic()
        t.close()
        assert time.monotonic() - t0 < 10
    finally:
        redis_server.resume()


def test_close_with_dead_server_is_fast(redis_server):
    t = _tier(redis_server)
    redis_server.kill()
    t0 = time.monotonic()
    t.close()
    assert time.monotonic() - t0 < 5


def test_unreachable_url_never_raises():
    pytest.importorskip("redis")
    t = RemoteTier(RemoteConfig(url="redis://127.0.0.1:1/0"))
    assert t.get("ns", b"\1" * 16) is None
    assert t.put("ns", b"\1" * 16, b"x" * 100) is False
    assert t.exists_many("ns", [b"\1" * 16]) == [False]
    assert t.clear("ns") == 0
    t.close()


def test_without_the_redis_package_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis now raises ImportError
    with pytest.raises(UnsupportedError, match="pip install 'redis>=5'"):
        RemoteTier(RemoteConfig(url="redis://127.0.0.1:1/0"))


def test_breaker_states():
    now = [0.0]
    b = CircuitBreaker(failure_threshold=2, reset_after_s=1.0, clock=lambda: now[0])
    assert b.state == "closed" and b.allow()
    b.failure()
    assert b.allow()
    b.failure()
    assert b.state == "open" and not b.allow()
    now[0] = 1.5
    assert b.state == "half-open"
    assert b.allow() and not b.allow()  # one probe at a time
    b.failure()
    assert b.state == "open"
    now[0] = 3.0
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow()


def test_cluster_mode_hash_tags(redis_cluster, chunks):
    kv, keys, blobs = chunks
    t = RemoteTier(RemoteConfig(url=redis_cluster, part_bytes=100_000,  # ~10 parts per chunk, one slot
                                lookup_timeout_s=10.0, op_timeout_s=10.0))  # as in _tier
    for k, b in zip(keys, blobs):
        assert t.put("ns", k.digest, b)
    assert t.exists_many("ns", [k.digest for k in keys]) == [True] * 4
    assert t.holds_whole("ns", [(k.digest, k.index, k.ntokens) for k in keys]) == [True] * 4
    for k, b in zip(keys, blobs):
        assert bytes(t.get("ns", k.digest)) == b
    assert t.delete("ns", [keys[0].digest]) == 1 and t.get("ns", keys[0].digest) is None
    assert t.clear("ns") == 3
    assert t.exists_many("ns", [k.digest for k in keys]) == [False] * 4
    assert t.metrics.snapshot()["tiers"]["remote"]["errors"] == 0
    t.close()


def test_raw_reads_with_password_and_db(tmp_path, chunks):
    import shutil

    from tiers_support import RedisServer, start_on_a_free_port

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    kv, keys, blobs = chunks
    srv = start_on_a_free_port(lambda port: RedisServer(port, tmp_path, ("--requirepass", "s3cret")))
    try:
        url = f"redis://:s3cret@127.0.0.1:{srv.port}/3"
        for raw in (True, False):
            t = RemoteTier(RemoteConfig(url=url, part_bytes=300_000, raw_reads=raw))
            assert (t._raw is not None) == raw
            assert t.put("ns", keys[0].digest, blobs[0])
            assert bytes(t.get("ns", keys[0].digest)) == blobs[0]
            assert t.get("ns", keys[1].digest) is None
            t.close()
        import redis
        assert redis.Redis.from_url(url).dbsize() > 0 and redis.Redis.from_url(url[:-1] + "0").dbsize() == 0
        bad = RemoteTier(RemoteConfig(url=f"redis://:wrong@127.0.0.1:{srv.port}/3"))
        assert bad.get("ns", keys[0].digest) is None  # auth error: a miss, counted
        assert bad.metrics.snapshot()["tiers"]["remote"]["errors"] == 1
        bad.close()
    finally:
        srv.kill()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/abc", "redis://u:secret@127.0.0.1:99999/0", "http://x",
                                 "redis://[bad", "garbage"])
def test_malformed_urls_are_invalid_arguments(url, tmp_path):
    # They raised ValueError from redis-py or the raw reader (the message masks credentials).
    with pytest.raises(kvcore.InvalidArgumentError, match="RemoteConfig.url") as err:
        TierManager(ddr_bytes=1 << 20, remote_url=url, ssd_dir=str(tmp_path), ssd_bytes=1 << 20)
    assert "secret" not in str(err.value)
    assert not list(tmp_path.iterdir())  # the SSD tier was not joined by the half-built manager


def test_unreachable_cluster_is_a_backend_error():
    # redis-py's RedisClusterException (not a RedisError) escaped before.
    with pytest.raises(kvcore.BackendError, match="cannot reach the remote store"):
        TierManager(ddr_bytes=1 << 20, remote_url="redis+cluster://127.0.0.1:1/0")


class ScriptedServer:
    """A TCP server that answers every connection with one fixed byte string (or nothing)
    and keeps it open: a misbehaving or foreign server for the raw reader."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(1 << 16)
            if self.reply:
                conn.sendall(self.reply)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("reply", [b"$99999999999\r\n", b"$-5\r\n", b"+OK\r\n", b"$abc\r\n", b"$10\r\nshort", b"",
                                   b"-ERR nope\r\n", b"*3\r\n"])
def test_raw_reader_survives_a_misbehaving_server(reply):
    # A part 0 claiming 100 GB was allocated (bytearray of the claimed size) before its
    # size was checked; every other reply must end in a miss within the timeouts.
    srv = ScriptedServer(reply)
    t = _tier(srv, op_timeout_s=0.5, lookup_timeout_s=0.5, part_bytes=1 << 20)
    try:
        start = time.monotonic()
        assert t.get("ns", b"\1" * 16) is None
        assert time.monotonic() - start < 5
    finally:
        t.close()
        srv.close()


@pytest.mark.parametrize("raw", [True, False])
@pytest.mark.parametrize("claimed", [3 << 30, 1 << 44])
def test_damaged_size_in_part_zero_allocates_nothing(redis_server, chunks, raw, claimed):
    # Part 0's frame table gives the value's total size. The redis-py path allocated a
    # bytearray of whatever it said (MemoryError out of get, or gigabytes touched); both
    # paths now refuse sizes past max_parts parts and drop the entry.
    import redis
    import struct

    _kv, keys, blobs = chunks
    t = _tier(redis_server, part_bytes=100_000, raw_reads=raw, max_parts=64)
    try:
        assert t.put("dmg", keys[0].digest, blobs[0])
        r = redis.Redis.from_url(redis_server.url)
        name = next(n for n in r.keys("kvcore:dmg:*") if n.endswith(b":0"))
        head = bytearray(r.get(name))
        off, _length = struct.unpack_from("<QQ", head, 48)  # the first frame table entry, after the header
        struct.pack_into("<QQ", head, 48, off, claimed)
        r.set(name, bytes(head))
        assert t.get("dmg", keys[0].digest) is None
        assert not r.exists(name)  # dropped as corrupt
    finally:
        t.close()


def test_close_while_a_call_waits_for_the_pool(redis_server, chunks):
    """close() cancels the operations still queued on the tier's pool: a caller waiting for
    one gets a miss, as the tier promises, never the pool's CancelledError (a lookup or
    retrieve on another thread while a TierManager closes)."""
    kv, keys, blobs = chunks
    t = _tier(redis_server, workers=1, lookup_timeout_s=60, op_timeout_s=60)
    gate, queued = threading.Event(), threading.Event()
    t._pool.submit(gate.wait)  # the pool's one thread is busy: the next operations queue
    submit = t._pool.submit

    def submit_and_tell(fn):
        fut = submit(fn)
        queued.set()
        return fut

    t._pool.submit = submit_and_tell
    got = []
    try:
        waiting = threading.Thread(target=lambda: got.append(t.exists_many("ns", [keys[0].digest])))
        waiting.start()
        assert queued.wait(30)
        t.close()  # cancels it: the wait ends now, not in 60 s
        waiting.join(30)
    finally:
        gate.set()
    assert got == [[False]]


def test_close_while_a_value_is_being_sent_in_parts(redis_server, chunks):
    """close() shuts the parts pool down under a put that is sending a value in parts (a
    TierManager's persist() or writer while it closes): the put fails (False), as the tier
    promises, instead of raising the pool's RuntimeError."""
    kv, keys, blobs = chunks
    t = _tier(redis_server, part_bytes=100_000)
    send_parts = t._parts.map

    def close_first(*args, **kwargs):
        t.close()  # on another thread, between the put's start and its parts
        return send_parts(*args, **kwargs)

    t._parts.map = close_first
    assert t.put("ns", keys[0].digest, blobs[0]) is False


def test_close_while_a_stream_waits_for_the_pool(redis_server, chunks):
    """close() cancels a streamed read still queued on the tier's pool: its reader learns at
    once that nothing will land (a retrieve on another thread while a TierManager closes),
    instead of waiting out op_timeout_s."""
    kv, keys, blobs = chunks
    t = _tier(redis_server, workers=1, op_timeout_s=60)
    assert t.put("ns", keys[0].digest, blobs[0])
    gate = threading.Event()
    t._pool.submit(gate.wait)  # the pool's one thread is busy: the read queues
    got = []
    try:
        rr = t.stream("ns", keys[0].digest)
        t.close()  # cancels it
        reader = threading.Thread(target=lambda: got.append((rr.wait(1), rr.finish())), daemon=True)
        reader.start()
        reader.join(10)  # at once; without the cancel noticed, 60 s
    finally:
        gate.set()
    assert got == [(False, None)]


@pytest.mark.parametrize("read", ["raw", "redis-py", "stream"])
def test_a_key_of_another_type_is_a_corrupt_miss_not_a_server_failure(redis_server, chunks, read):
    """A key under the tier's names that holds a list or a hash (not a value of ours)
    answers GET with a WRONGTYPE error: that counted as a server failure, so two such
    keys opened the breaker and every remote read and lookup was skipped; and the key,
    never deleted (delete's GETRANGE failed the same way), did it again at every read.
    It is foreign data: a miss counted as corrupt, the key deleted, the breaker closed."""
    import redis

    kv, keys, blobs = chunks
    t = _tier(redis_server, raw_reads=read != "redis-py", part_bytes=1 << 20)
    r = redis.Redis.from_url(redis_server.url)
    assert t.put("ns", keys[0].digest, blobs[0]) and t.put("ns", keys[1].digest, blobs[1])
    r.delete(f"kvcore:ns:{{{keys[1].hex}}}:1")
    r.rpush(f"kvcore:ns:{{{keys[1].hex}}}:1", b"a list")  # a later part of another type
    r.hset(f"kvcore:ns:{{{keys[2].hex}}}:0", "a", "hash")
    r.rpush(f"kvcore:ns:{{{keys[3].hex}}}:0", b"a list")

    def get(k):
        return t.stream("ns", k.digest).finish() if read == "stream" else t.get("ns", k.digest)

    for k in keys[1:]:
        assert get(k) is None
    assert t.breaker.state == "closed"
    assert bytes(get(keys[0])) == blobs[0]
    snap = t.metrics.snapshot()["tiers"]["remote"]
    assert (snap["corrupt"], snap["errors"], snap["skipped"]) == (3, 0, 0)
    assert sorted(r.keys("*")) == sorted(f"kvcore:ns:{{{keys[0].hex}}}:{i}".encode() for i in range(2))
    t.close()


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("read", ["raw", "redis-py", "stream"])
def test_a_value_of_a_newer_blob_version_is_a_miss_and_stays(redis_server, chunks, read, parts):
    """A blob of a later format version (a newer kvcore on the same Redis in a rolling
    upgrade) was counted corrupt and deleted by every older reader. It is a miss, and the
    value (every part) stays for the readers that read it."""
    import redis

    kv, keys, blobs = chunks
    blob = with_version(blobs[0], 2)
    t = _tier(redis_server, raw_reads=read != "redis-py", part_bytes=-(-len(blob) // parts))
    assert t.put("ns", keys[0].digest, blob)
    got = t.stream("ns", keys[0].digest).finish() if read == "stream" else t.get("ns", keys[0].digest)
    assert got is None
    r = redis.Redis.from_url(redis_server.url)
    assert all(r.exists(f"kvcore:ns:{{{keys[0].hex}}}:{i}") for i in range(parts))
    snap = t.metrics.snapshot()["tiers"]["remote"]
    assert (snap["misses"], snap["corrupt"]) == (1, 0)
    t.close()


@pytest.mark.parametrize("read", ["raw", "redis-py", "stream"])
def test_a_value_of_a_codec_this_build_lacks_is_a_miss_and_stays(redis_server, chunks, read):
    """A valid blob stored with a codec this build cannot decode (a newer kvcore's) passed
    the read's checks, and the caller's decode raised CorruptFrameError: a miss instead,
    the value left for the readers that decode it."""
    import redis

    kv, keys, blobs = chunks
    t = _tier(redis_server, raw_reads=read != "redis-py")
    assert t.put("ns", keys[0].digest, with_codec(blobs[0], 9))
    got = t.stream("ns", keys[0].digest).finish() if read == "stream" else t.get("ns", keys[0].digest)
    assert got is None
    assert redis.Redis.from_url(redis_server.url).exists(f"kvcore:ns:{{{keys[0].hex}}}:0")
    snap = t.metrics.snapshot()["tiers"]["remote"]
    assert (snap["misses"], snap["corrupt"]) == (1, 0)
    t.close()


@pytest.mark.parametrize("streamed", [True, False])
def test_a_value_of_fewer_tokens_under_a_chunks_key_is_a_corrupt_miss(redis_server, chunks, streamed):
    """A valid blob that claims chunk 0's key but holds 128 of its 256 tokens restored those
    128 while retrieve counted all 256 restored. It is a miss now, counted corrupt, deleted."""
    kv, keys, _ = chunks
    short = bytes(encode_chunk(kv[:, :, :128], CODEC, key=keys[0].digest, index=0))
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=local_redis(), namespace="remote-model",
                     read_ahead=0 if streamed else 2) as tm:
        assert tm.remote.put(tm._ns_tag, keys[0].digest, short)
        out = torch.zeros_like(kv)
        assert tm.retrieve(list(range(1024)), out, on_layer=None if streamed else (lambda layer: None)) == 0
        assert tm.metrics.snapshot()["tiers"]["remote"]["corrupt"] == 1
        assert tm.remote.get(tm._ns_tag, keys[0].digest) is None


def test_holds_whole_reads_headers_and_part_lengths(redis_server, chunks):
    """holds_whole (the store's look for chunks Redis holds) says which values are there
    whole and claim the chunk asked about: a part missing or of another type, a value of
    another chunk, one claiming another place or token count, are not held; a value of a
    later blob format is (it stays for its readers). The breaker stays closed."""
    import redis

    kv, keys, blobs = chunks
    t = _tier(redis_server, part_bytes=100_000)
    r = redis.Redis.from_url(redis_server.url)
    for k, b in zip(keys, blobs):
        assert t.put("ns", k.digest, b)
    claims = [(k.digest, k.index, k.ntokens) for k in keys]
    assert t.holds_whole("ns", claims) == [True] * 4
    r.delete(f"kvcore:ns:{{{keys[1].hex}}}:3")
    r.delete(f"kvcore:ns:{{{keys[2].hex}}}:2")
    r.rpush(f"kvcore:ns:{{{keys[2].hex}}}:2", b"a list")  # a part of another type
    assert t.put("ns", keys[3].digest, blobs[0])  # another chunk's value under keys[3]
    assert t.holds_whole("ns", claims) == [True, False, False, False]
    assert t.holds_whole("ns", [(keys[0].digest, 1, 256), (keys[0].digest, 0, 255), (b"\0" * 16, 0, 256)]) == [
        False, False, False]
    assert t.put("ns", keys[1].digest, with_version(blobs[1], 2))
    assert t.holds_whole("ns", claims[1:2]) == [True]
    assert t.breaker.state == "closed"
    t.close()


def test_holds_whole_of_an_unreachable_server_holds_nothing(redis_server, chunks):
    kv, keys, blobs = chunks
    t = _tier(redis_server)
    assert t.put("ns", keys[0].digest, blobs[0])
    redis_server.kill()
    assert t.holds_whole("ns", [(keys[0].digest, 0, 256)]) == [False]
    t.close()

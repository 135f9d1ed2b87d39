"""TierManager end to end on real KV data: every tier, capacity under threads, restart,
redis killed mid-run, full disk, the hot/cold API, metrics."""

import contextlib
import random
import threading
import time
from dataclasses import replace

import pytest
import torch

import kvcore
from kvcore.errors import InvalidArgumentError
from kvcore.tiers import Namespace, TierConfig, TierManager
from tiers_support import errors_of_threads, leftover_temporaries, load_kv, local_redis, redis_server, wait_until  # noqa: F401

NS = Namespace("minilm-l6", "bfloat16", salt="tests")


@pytest.fixture(scope="module")
def kv():
    return load_kv()[:, :, :1024].contiguous()  # [6, 2, 1024, 12, 32] bf16; 2.36 MB per chunk


def tokens_for(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(30000) for _ in range(n)]


def same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def chunk_blob_bytes(tm):
    return max(e.size for e in tm.ddr.entries.values())


def test_round_trip_ddr(kv):
    toks = tokens_for(1024)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        assert tm.store(toks, kv) == 4
        assert tm.flush(30)
        assert tm.store(toks, kv) == 0  # already stored
        hit = tm.lookup(toks)
        assert hit.tokens == 1024 and hit.tiers == ["ddr"] * 4
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024
        assert same(out, kv)
        st = tm.status()
        assert st["tiers"]["ddr"]["entries"] == 4 and st["tiers"]["ddr"]["hits"] == 4
        assert st["tiers"]["ddr"]["bytes_used"] <= 64 << 20


def test_round_trip_ssd_only_and_demotion(tmp_path, kv):
    toks = tokens_for(1024, 1)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        assert tm.lookup(toks).tiers == ["ssd"] * 4
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)  # with read-ahead
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS, read_ahead=0) as tm:
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)  # without
    with TierManager(ddr_bytes=3 << 20, ssd_dir=str(tmp_path / "b"), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        # DDR holds one chunk: chunk 0, which the others need, stays; they go below
        assert tm.lookup(toks).tiers == ["ddr", "ssd", "ssd", "ssd"]
        assert tm.ddr.allocator.used_bytes <= 3 << 20
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        st = tm.status()["tiers"]
        assert st["ddr"]["evictions"] == 0 and st["ssd"]["hits"] >= 2


def test_round_trip_remote(redis_server, kv):
    toks = tokens_for(1024, 2)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=local_redis(), namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        assert tm.lookup(toks).tiers == ["remote"] * 4
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
    # another process (manager) on the same Redis finds it
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=local_redis(), namespace=NS) as tm:
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        tm.flush()
        assert tm.lookup(toks).tiers == ["ddr"] * 4  # promoted on hit


def test_remote_staging_buffers_are_reused_only_after_a_completed_send(redis_server, kv):
    """A chunk staged for Redis: its buffer goes back to the pool once the send completed
    (no fresh pages for the next chunk), never after a send that timed out (it may still
    be reading the buffer)."""
    # Sends wait up to 10 s until the server hangs: 0.3 s (the limit the hung send runs into)
    # could run out on a loaded machine before, so the first buffer was not handed back.
    rc = local_redis(op_timeout_s=10, reset_after_s=60)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as tm:
        tm.store(tokens_for(256, 30), kv[:, :, :256])
        assert tm.flush(30) and tm.lookup(tokens_for(256, 30)).tiers == ["remote"]
        assert len(tm._scratch._free) == 1
        tm.store(tokens_for(256, 31), kv[:, :, :256])
        assert tm.flush(30) and len(tm._scratch._free) == 1  # the same buffer again
        redis_server.pause()  # a hung server: the send times out (its socket still waits)
        tm.remote.config = replace(tm.remote.config, op_timeout_s=0.3)
        try:
            tm.store(tokens_for(256, 32), kv[:, :, :256])
            assert tm.flush(30)
            assert len(tm._scratch._free) == 0  # taken, and not handed back
        finally:
            redis_server.resume()


def blob_size(kv):
    from kvcore.tiers.blob import encode_chunk
    from kvcore.tiers.codecs import make_codec

    return max(len(encode_chunk(kv[:, :, i:i + 256], make_codec("auto"), key=bytes(16), index=0))
               for i in range(0, kv.shape[2], 256))


def test_demotion_chain_ddr_ssd_remote(tmp_path, redis_server, kv):
    toks = tokens_for(1024, 3)
    cap = int(blob_size(kv) * 1.5)  # one chunk each in DDR and on SSD, the rest in Redis
    with TierManager(ddr_bytes=cap, ssd_dir=str(tmp_path), ssd_bytes=cap,
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS, promote_on_hit=False) as tm:
        tm.store(toks, kv)
        tm.flush()
        tiers = tm.lookup(toks).tiers  # the prefix in the fastest tiers: the chunks after it need it
        assert tiers == ["ddr", "ssd", "remote", "remote"], tiers
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)


def test_partial_prefix_and_tail(kv):
    toks = tokens_for(1000, 4)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :1000])
        tm.flush()
        other = toks[:600] + [1] * 400  # diverges inside chunk 2
        hit = tm.lookup(other)
        assert hit.tokens == 512 and len(hit.tiers) == 2
        out = torch.zeros_like(kv)
        assert tm.retrieve(other, out) == 512
        assert same(out[:, :, :512], kv[:, :, :512]) and not out[:, :, 512:].any()
        assert tm.retrieve(toks, out) == 1000 and same(out[:, :, :1000], kv[:, :, :1000])
        small = torch.zeros_like(kv[:, :, :300])  # out shorter than the prefix: whole chunks that fit
        assert tm.retrieve(toks, small) == 256
    with TierManager(ddr_bytes=64 << 20, namespace=NS, store_partial=False) as tm:
        assert tm.store(toks, kv[:, :, :1000]) == 3


@pytest.mark.parametrize("frame_bytes", [1, 4 << 20])  # one layer per frame; all 6 layers in one
def test_layerwise_retrieve(tmp_path, kv, frame_bytes):
    toks = tokens_for(1024, 5)
    with TierManager(ddr_bytes=3 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS,
                     frame_bytes=frame_bytes) as tm:
        tm.store(toks, kv)
        tm.flush()
        out = torch.zeros_like(kv)
        seen = []

        def on_layer(l):
            assert same(out[l], kv[l])  # layer l is complete for every chunk
            seen.append(l)

        assert tm.retrieve(toks, out, on_layer=on_layer) == 1024
        assert seen == list(range(kv.shape[0])) and same(out, kv)


def test_layerwise_retrieve_decodes_later_layers_while_on_layer_runs(kv):
    """on_layer(0) blocks until the last layer has been decoded: it can only return if
    the native threads go on decoding while the engine works on layer 0."""
    toks = tokens_for(1024, 15)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, frame_bytes=1) as tm:
        tm.store(toks, kv)
        tm.flush()
        out = torch.zeros_like(kv)
        waited = []

        def on_layer(l):
            if l == 0:
                deadline = time.monotonic() + 60
                while not same(out[-1], kv[-1]) and time.monotonic() < deadline:
                    time.sleep(0.001)
                waited.append(same(out[-1], kv[-1]))

        assert tm.retrieve(toks, out, on_layer=on_layer) == 1024
        assert waited == [True] and same(out, kv)


def test_layerwise_retrieve_raises_what_on_layer_raises(kv):
    toks = tokens_for(1024, 16)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, frame_bytes=1) as tm:
        tm.store(toks, kv)
        tm.flush()

        def on_layer(l):
            if l == 2:
                raise KeyError("engine failed at layer 2")

        with pytest.raises(KeyError, match="layer 2"):
            tm.retrieve(toks, torch.zeros_like(kv), on_layer=on_layer)
        out = torch.zeros_like(kv)  # nothing stays held: the same chunks restore again
        assert tm.retrieve(toks, out, on_layer=lambda l: None) == 1024 and same(out, kv)
        assert tm.status()["tiers"]["ddr"]["entries"] == 4


@pytest.mark.parametrize("codec", ["auto", "raw"])
def test_chunks_decode_straight_into_out_and_all_layers_in_one_call(kv, monkeypatch, codec):
    """A chunk's slice of out (a token range) is decoded into directly, with no staging
    copy; layer by layer, one decode call covers every layer of every chunk."""
    from kvcore.tiers import blob

    toks = tokens_for(1024, 8)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, frame_bytes=1, codec=codec) as tm:
        tm.store(toks, kv)
        tm.flush()

        def no_staging(*args):
            raise AssertionError("a CPU output went through the staging buffer")

        monkeypatch.setattr(blob, "_decode_staged", no_staging)
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        if codec == "raw":
            return
        calls = []
        decode_many = tm.codec.decode_many
        monkeypatch.setattr(tm.codec, "decode_many",
                            lambda fs, outs, **kw: (calls.append(len(fs)), decode_many(fs, outs, **kw)))
        out.zero_()
        assert tm.retrieve(toks, out, on_layer=lambda l: None) == 1024 and same(out, kv)
        assert calls == [4 * kv.shape[0]]  # every layer's frame of each of the 4 chunks, at once


@pytest.mark.parametrize("codec", ["auto", "raw", "max"])
def test_retrieve_into_an_out_of_any_layout(kv, codec):
    """An out whose chunk slices are not runs at one stride (here its heads and tokens are
    swapped in memory) is filled through the staging buffer, whole and layer by layer."""
    toks = tokens_for(1024, 9)
    layers, _, tokens, heads, dim = kv.shape
    with TierManager(ddr_bytes=64 << 20, namespace=NS, codec=codec) as tm:
        tm.store(toks, kv)
        tm.flush()
        out = torch.zeros(layers, 2, heads, tokens, dim, dtype=kv.dtype).transpose(2, 3)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        out.zero_()
        assert tm.retrieve(toks, out, on_layer=lambda l: None) == 1024 and same(out, kv)


def test_every_codec_mode_writes_the_frames_of_kvcore_compress(kv):
    """The tier codec's one-call path (encode_many, what stores use) codes in its own mode, as
    kvcore.compress does; "max" codes the signs of real KV by channel."""
    from kvcore.tiers.codecs import make_codec

    layer = kv[0, 0]
    for mode in ("dense", "fast", "max"):
        codec = make_codec(mode)
        out = bytearray(codec.max_encoded_size(layer))
        n = codec.encode_many([layer], [memoryview(out)])[0]
        assert bytes(out[:n]) == kvcore.compress(layer, mode=mode) == codec.encode(layer)
        assert ("signs" in kvcore.frame_info(bytes(out[:n]))["methods"]) == (mode == "max")
    with pytest.raises(kvcore.InvalidArgumentError):
        make_codec("maximum")


def test_codec_decoder_writes_frames_for_avx512_readers(kv):
    """codec_decoder="avx512": the tier codec writes kvcore.compress(..., decoder="avx512")
    frames in both its paths, and chunks stored with them come back bit-exact."""
    from kvcore.tiers.codecs import make_codec

    layer = kv[0, 0]
    for mode in ("dense", "max"):
        codec = make_codec(mode, decoder="avx512")
        out = bytearray(codec.max_encoded_size(layer))
        n = codec.encode_many([layer], [memoryview(out)])[0]
        assert bytes(out[:n]) == kvcore.compress(layer, mode=mode, decoder="avx512") == codec.encode(layer)
    toks = tokens_for(1024, 23)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, codec="dense", codec_decoder="avx512") as tm:
        assert tm.status()["codec"] == "kvcore-dense-avx512"
        tm.store(toks, kv)
        tm.flush()
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
    with pytest.raises(kvcore.InvalidArgumentError):
        make_codec("dense", decoder="avx2")
    with pytest.raises(kvcore.InvalidArgumentError):
        TierManager(ddr_bytes=64 << 20, codec_decoder="avx2")


def test_layerwise_staging_is_bounded_by_windows_of_layers(kv, monkeypatch):
    """Frames that go through staging (an out the codec cannot write into) are decoded in
    windows of layers whose staged bytes fit STAGING_WINDOW_BYTES (at least one layer):
    one codec call per window, layers still complete and in order."""
    from kvcore.tiers import blob

    toks = tokens_for(1024, 17)
    layers, _, tokens, heads, dim = kv.shape
    with TierManager(ddr_bytes=64 << 20, namespace=NS, frame_bytes=1) as tm:
        tm.store(toks, kv)
        tm.flush()
        layer_bytes = kv[0].nbytes  # one layer of all 4 chunks
        monkeypatch.setattr(blob, "STAGING_WINDOW_BYTES", 2 * layer_bytes)
        calls = []
        decode_many = tm.codec.decode_many
        monkeypatch.setattr(tm.codec, "decode_many",
                            lambda fs, outs, **kw: (calls.append(len(fs)), decode_many(fs, outs, **kw)))
        out = torch.zeros(layers, 2, heads, tokens, dim, dtype=kv.dtype).transpose(2, 3)
        seen = []

        def on_layer(l):
            assert same(out[l], kv[l])
            seen.append(l)

        assert tm.retrieve(toks, out, on_layer=on_layer) == 1024 and same(out, kv)
        assert seen == list(range(layers))
        assert calls == [8] * (layers // 2) + [4] * (layers % 2)  # 2 layers x 4 chunks a window


def test_pending_chunks_are_retrievable(kv):
    toks = tokens_for(1024, 6)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, queue_chunks=1) as tm:
        tm.store(toks, kv)
        hit = tm.lookup(toks)
        assert hit.tokens == 1024 and set(hit.tiers) <= {"pending", "ddr"}
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)


def hold_worker(tm):
    """Blocks tm's worker until the returned event is set: what store() queues meanwhile stays pending."""
    gate = threading.Event()
    tm._put(("call", gate.wait, [], threading.Event()))
    return gate


@pytest.mark.parametrize("by_layer", [False, True])
def test_a_pending_chunk_restores_only_into_an_out_its_blob_would(kv, by_layer):
    """A chunk still in the store queue is restored from its raw copy: an out of another dtype
    used to be filled with converted values (and n reported), an out of more layers with the
    one stored layer repeated, and another head_dim raised torch's RuntimeError. Now each is
    the InvalidArgumentError a placed chunk raises."""
    toks = tokens_for(512, 43)
    one_layer = kv[:1, :, :512]
    on_layer = (lambda layer: None) if by_layer else None
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        gate = hold_worker(tm)
        try:
            tm.store(toks, one_layer)
            assert tm.lookup(toks).tiers == ["pending"] * 2
            for out in (torch.zeros(one_layer.shape, dtype=torch.float32), torch.zeros(3, 2, 512, 12, 32).to(kv.dtype),
                        torch.zeros(1, 2, 512, 12, 16).to(kv.dtype)):
                with pytest.raises(InvalidArgumentError):
                    tm.retrieve(toks, out, on_layer=on_layer)
            out = torch.zeros_like(one_layer)
            assert tm.retrieve(toks, out, on_layer=on_layer) == 512 and same(out, one_layer)
        finally:
            gate.set()


@pytest.mark.parametrize("by_layer", [False, True])
def test_retrieve_refuses_an_expanded_out(kv, by_layer):
    """An out whose elements share memory (expand()) cannot hold a chunk: torch's RuntimeError
    came out of the staging copy; now the InvalidArgumentError of other unusable outs."""
    toks = tokens_for(256, 56)
    on_layer = (lambda layer: None) if by_layer else None
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :256])
        assert tm.flush(30)
        for out in (torch.zeros(1, 2, 256, 12, 32).to(kv.dtype).expand(6, -1, -1, -1, -1),
                    torch.zeros(6, 2, 1, 12, 32).to(kv.dtype).expand(-1, -1, 256, -1, -1)):
            with pytest.raises(InvalidArgumentError):
                tm.retrieve(toks, out, on_layer=on_layer)


def test_retrieve_checks_prefill_s_per_token(kv):
    """retrieve(prefill_s_per_token=) takes what estimate() takes: NaN used to restore every
    chunk, 0 and negative values none, and a str raised TypeError."""
    toks = tokens_for(256, 44)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :256])
        assert tm.flush(30)
        out = torch.zeros_like(kv[:, :, :256])
        for bad in ("x", float("nan"), 0, -1.0, True):
            with pytest.raises(InvalidArgumentError):
                tm.retrieve(toks, out, prefill_s_per_token=bad)
        assert tm.retrieve(toks, out, prefill_s_per_token=1.0) == 256 and same(out, kv[:, :, :256])


def test_store_copies_caller_buffer(kv):
    toks = tokens_for(1024, 7)
    buf = kv.clone()
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, buf)
        buf.zero_()  # the engine reuses its buffer at once
        tm.flush()
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)


def test_capacity_never_exceeded_under_threads(tmp_path, kv):
    ddr_cap, ssd_cap = 6 << 20, 10 << 20
    tm = TierManager(ddr_bytes=ddr_cap, ssd_dir=str(tmp_path), ssd_bytes=ssd_cap, namespace=NS,
                     queue_chunks=2, fsync=False, policy="cost")
    seqs = [tokens_for(512, 100 + i) for i in range(8)]  # 16 distinct chunks, ~2.4x the capacity
    stop = threading.Event()
    peak = {"ddr": 0, "ssd": 0}

    def monitor():
        while not stop.is_set():
            peak["ddr"] = max(peak["ddr"], tm.ddr.allocator.used_bytes)
            peak["ssd"] = max(peak["ssd"], tm.ssd.used_bytes)
            time.sleep(0.0005)

    def client(seed):
        rng = random.Random(seed)
        out = torch.zeros_like(kv[:, :, :512])
        for _ in range(15):
            i = rng.randrange(len(seqs))
            src = kv[:, :, 512 * (i % 2):512 * (i % 2) + 512]
            if rng.random() < 0.5:
                tm.store(seqs[i], src)
            else:
                out.zero_()
                n = tm.retrieve(seqs[i], out)
                assert n in (0, 256, 512)
                assert same(out[:, :, :n], src[:, :, :n])

    mon = threading.Thread(target=monitor)
    mon.start()
    errors = errors_of_threads(client, 3)
    tm.flush()
    stop.set()
    mon.join()
    assert not errors, errors
    assert 0 < peak["ddr"] <= ddr_cap and 0 < peak["ssd"] <= ssd_cap
    files = sum(f.stat().st_size for f in (tmp_path / "kvcore-v1").rglob("*.kvc"))
    assert files <= ssd_cap and files == tm.ssd.used_bytes
    assert tm.close()


def test_restart_recovers_ssd(tmp_path, kv):
    toks = tokens_for(1024, 8)
    tm = TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS)
    tm.store(toks, kv)
    assert tm.persist(toks) == 4
    tm.close()
    tm2 = TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS)
    assert tm2.lookup(toks).tiers == ["ssd"] * 4
    out = torch.zeros_like(kv)
    assert tm2.retrieve(toks, out) == 1024 and same(out, kv)
    other = TierManager(ddr_bytes=1 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30,
                        namespace=Namespace("minilm-l6", "bfloat16", salt="other-tenant"))
    assert other.lookup(toks).tokens == 0  # a different salt sees nothing
    other.close()
    tm2.close()


def test_redis_killed_mid_run(tmp_path, redis_server, kv):
    toks = [tokens_for(512, 200 + i) for i in range(6)]
    # A killed server refuses connections at once: no call waits for a timeout, and timeouts
    # short enough to run out on a loaded machine would fail the calls after the restart.
    rc = local_redis(reset_after_s=0.3, op_timeout_s=10)
    tm = TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS)
    src = kv[:, :, :512]
    tm.store(toks[0], src)
    tm.flush()
    redis_server.kill()
    out = torch.zeros_like(src)
    for t in toks[:3]:  # no exception into the caller, misses
        tm.store(t, src)
        assert tm.flush(10)  # the store is dropped (counted), the caller sees nothing
        assert tm.retrieve(t, out) == 0
        assert tm.lookup(t).tokens == 0
    assert tm.flush(10)
    redis_server.start()
    time.sleep(0.4)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tm.store(toks[4], src)
        tm.flush()
        if tm.lookup(toks[4]).tokens == 512:
            break
        time.sleep(0.2)
    out.zero_()
    assert tm.retrieve(toks[4], out) == 512 and same(out, src)  # recovered, data intact
    assert tm.retrieve(toks[0], out) == 0  # lost with the server, not corrupt
    st = tm.status()["tiers"]["remote"]
    assert st["errors"] + st["skipped"] > 0 and st["breaker"] == "closed"
    assert tm.close()


def test_close_with_dead_redis_returns_after_its_own_timeout(redis_server, kv, monkeypatch):
    # The sends' sockets wait 60 s, so a close that waited on the hung server would take a
    # minute: close(timeout=4) must return after its own 4 s, and a bound of 30 s tells the
    # two apart with a margin a loaded machine never eats (5 s left about 1 s of it).
    rc = local_redis(op_timeout_s=60, reset_after_s=600)
    tm = TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS, queue_chunks=2)
    # The worker's look for chunks Redis holds already would time out and open the breaker,
    # and the sends would then be skipped: here it answers "none" at once, so a send hangs.
    monkeypatch.setattr(tm.remote, "holds_whole", lambda ns_tag, chunks: [False] * len(chunks))
    redis_server.pause()  # hung server, worst case
    try:
        for i in range(3):
            tm.store(tokens_for(256, 300 + i), kv[:, :, :256])
        t0 = time.monotonic()
        assert not tm.close(timeout=4)  # the first send still hangs: not all work was done
        assert time.monotonic() - t0 < 30
    finally:
        redis_server.resume()


def test_full_disk_capacity_below_data(tmp_path, kv):
    toks = tokens_for(1024, 9)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=2 << 20, namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        assert tm.ssd.used_bytes <= 2 << 20
        hit = tm.lookup(toks)
        out = torch.zeros_like(kv)
        n = tm.retrieve(toks, out)
        assert n == hit.tokens and same(out[:, :, :n], kv[:, :, :n])
        assert tm.status()["tiers"]["ssd"]["evictions"] + tm.status()["tiers"]["ddr"]["rejected"] > 0


def test_pin_priority_evict(tmp_path, kv):
    a, b, c = tokens_for(256, 10), tokens_for(256, 11), tokens_for(256, 12)
    one = kv[:, :, :256]
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(a, one)
        tm.flush()
        cap = int(chunk_blob_bytes(tm) * 2.5)
    with TierManager(ddr_bytes=cap, namespace=NS) as tm:
        assert tm.pin(a) == 1
        tm.store(a, one)
        tm.store(b, one)
        tm.flush()
        tm.store(c, one)  # evicts b (a is pinned although older)
        tm.flush()
        assert tm.lookup(a).tiers == ["ddr"] and tm.lookup(b).tokens == 0 and tm.lookup(c).tokens == 256
        assert tm.status()["pinned_chunks"] == 1
        tm.unpin(a)
        tm.set_priority(c, 5)
        tm.store(b, one)  # now a (priority 0, oldest) goes, c stays
        tm.flush()
        assert tm.lookup(a).tokens == 0 and tm.lookup(c).tokens == 256 and tm.lookup(b).tokens == 256
        assert tm.evict(count=1) == 1  # b: lower priority than c
        assert tm.lookup(b).tokens == 0 and tm.lookup(c).tokens == 256
        assert tm.evict(c) == 1 and tm.lookup(c).tokens == 0
        with pytest.raises(InvalidArgumentError):
            tm.evict()
        with pytest.raises(InvalidArgumentError):
            tm.set_priority(c, 1.5)


def test_priorities_stay_above_the_expired_level(kv):
    """Eviction gives expired chunks a level below every priority (EXPIRED_LEVEL, -2**30),
    where they leave whatever extends them; set_priority took that level too (and bools, and
    any int), so a live chunk set to it was evicted as if expired, before the chunks that
    extend it."""
    from kvcore.tiers.policy import EXPIRED_LEVEL, MAX_PRIORITY

    toks = tokens_for(256, 71)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :256])
        assert tm.flush(30)
        for level in (EXPIRED_LEVEL, -MAX_PRIORITY - 1, MAX_PRIORITY + 1, 1 << 64, True):
            with pytest.raises(InvalidArgumentError, match="level must be an int"):
                tm.set_priority(toks, level)
        assert tm.set_priority(toks, -MAX_PRIORITY) == 1 and tm.set_priority(toks, MAX_PRIORITY) == 1


def test_a_pins_file_with_a_priority_at_the_expired_level_is_damaged(tmp_path):
    """The pins file's priorities are checked as set_priority checks them: one at the expired
    level (or a bool) makes the file damaged (read as empty, rewritten), not a live chunk
    that eviction takes for an expired one."""
    from kvcore.tiers.hot_cold import HotCold, HotColdFile
    from kvcore.tiers.policy import EXPIRED_LEVEL

    f = HotColdFile(tmp_path, "ns")
    f.update({b"a" * 16: HotCold(pinned=False, priority=3, start=0, ntokens=256)})
    assert f.load() and not f.damaged
    for bad in (EXPIRED_LEVEL, True):
        f._write({b"a" * 16: HotCold(pinned=False, priority=bad, start=0, ntokens=256)})
        assert f.load() == {} and f.damaged


def test_a_planned_victim_that_a_read_keeps_keeps_its_prefix(kv):
    """Room in DDR is made from a plan of victims, leaves first (a2, then a1). When a read
    began on a2 after the plan was made (during an earlier victim's demotion), a2 was
    skipped and a1, its parent, was still evicted: a2 stayed in DDR, unreachable.
    A planned victim that is no longer evictable now makes a new plan, which keeps the
    prefix of what the read keeps."""
    from kvcore.tiers.ddr import footprint

    a = tokens_for(768, 72)
    flat = torch.zeros_like(kv[:, :, :768])  # compresses to almost nothing
    with TierManager(ddr_bytes=64 << 20, namespace=NS, demote_on_pressure=False) as tm:
        asked = []  # the room each chunk asks for
        alloc = tm._alloc_blob
        tm._alloc_blob = lambda n, *args: asked.append(n) or alloc(n, *args)
        tm.store(tokens_for(256, 73), kv[:, :, :256])
        tm.store(a, flat)
        assert tm.flush(30)
        room = footprint(tm.ddr.allocator, max(asked))
        small = tm.ddr.allocator.used_bytes - room  # what the three chunks of a take
    # room for the new chunk once two of a's three chunks left
    with TierManager(ddr_bytes=room + small // 2, namespace=NS, demote_on_pressure=False) as tm:
        tm.store(a, flat)
        assert tm.flush(30) and tm.lookup(a).tiers == ["ddr"] * 3
        a2 = tm.keys(a)[2].digest
        plan = tm._victims_to_fit
        reads = []

        def plan_then_a_read_begins(*args):
            victims = plan(*args)
            if victims and not reads:
                reads.append(tm.ddr.acquire(a2))  # as a retrieve does, between two evictions
            return victims

        tm._victims_to_fit = plan_then_a_read_begins
        tm.store(tokens_for(256, 73), kv[:, :, :256])  # needs the room of all of a
        assert tm.flush(30) and reads
        tm.ddr.release(reads[0])
        assert tm.lookup(a).tiers == ["ddr"] * 3


@pytest.mark.parametrize("allocator", ["bytes", "pinned"])
def test_a_chunk_that_cannot_fit_evicts_nothing(kv, allocator):
    """A chunk that does not fit in DDR even once every evictable chunk has left (the rest
    is pinned; or its pinned-pool size class exceeds the capacity) goes below at once. It
    used to evict every unpinned chunk first, for nothing: without SSD or remote they were
    lost."""
    a, b, c = tokens_for(256, 45), tokens_for(64, 46), tokens_for(256, 47)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, allocator=allocator) as tm:
        for toks, part in ((a, kv[:, :, :256]), (b, kv[:, :, :64]), (c, kv[:, :, 256:512])):
            tm.store(toks, part)
            assert tm.flush(30)
            if toks is b:
                used = tm.ddr.allocator.used_bytes  # a and b
        half, c_size = tm.ddr.get(tm.keys(a)[0].digest).size // 2, tm.ddr.get(tm.keys(c)[0].digest).size
    with TierManager(ddr_bytes=used + half, namespace=NS, allocator=allocator) as tm:
        tm.pin(a)
        tm.store(a, kv[:, :, :256])
        tm.store(b, kv[:, :, :64])
        assert tm.flush(30) and tm.lookup(b).tiers == ["ddr"]
        tm.store(c, kv[:, :, 256:512])  # would fit only where the pinned a is
        assert tm.flush(30)
        assert tm.lookup(a).tiers == ["ddr"] and tm.lookup(b).tiers == ["ddr"] and tm.lookup(c).tokens == 0
        assert tm.status()["tiers"]["ddr"]["evictions"] == 0
    if allocator == "pinned":  # c's blob is within the capacity, its size class is not
        with TierManager(ddr_bytes=c_size, namespace=NS, allocator=allocator) as tm:
            tm.store(b, kv[:, :, :64])
            tm.store(c, kv[:, :, 256:512])
            assert tm.flush(30)
            assert tm.lookup(b).tiers == ["ddr"] and tm.lookup(c).tokens == 0


def test_a_chunk_whose_prefix_was_lost_takes_no_ddr_room_without_tiers_below(kv):
    """Without SSD or Redis, a chunk whose parent could not be placed (it did not fit) went
    into DDR all the same, where no prefix lookup could reach it: its room was lost to the
    chunks a lookup does find. It is now skipped and counted as rejected, as its parent."""
    toks = tokens_for(320, 71)  # a full chunk, then a 64-token one
    half = blob_size(kv) // 2  # the short chunk fits, the full one does not
    with TierManager(ddr_bytes=half, allocator="bytes", namespace=NS) as tm:
        assert tm.store(toks, kv[:, :, :320]) == 2
        assert tm.flush(30)
        assert tm.lookup(toks).tokens == 0
        assert len(tm.ddr) == 0 and tm.ddr.allocator.used_bytes == 0
        assert tm.status()["tiers"]["ddr"]["rejected"] == 2


def test_a_chunk_whose_parent_is_rejected_on_a_busy_writer_thread_takes_no_ddr_room(kv):
    """Without SSD or Redis, a parent that did not fit in DDR was handed to the writer thread
    (to be written below: nowhere) and stayed queued until it got there; its child, placed
    meanwhile, took it for placed and went into DDR, where no lookup reaches it. The parent
    is now rejected on the worker, before its child is placed."""
    toks = tokens_for(320, 72)  # a full chunk, then a 64-token one
    with TierManager(ddr_bytes=blob_size(kv) // 2, allocator="bytes", namespace=NS) as tm:
        busy = threading.Event()
        tm._writer.submit(busy.wait, 30)  # the writer thread is busy (e.g. a flush's drain)
        try:
            assert tm.store(toks, kv[:, :, :320]) == 2
            wait_until(lambda: tm._queue.unfinished_tasks == 0)  # both placed (or not) by the worker
        finally:
            busy.set()
        assert tm.flush(30)
        assert tm.lookup(toks).tokens == 0
        assert len(tm.ddr) == 0 and tm.ddr.allocator.used_bytes == 0
        assert tm.status()["tiers"]["ddr"]["rejected"] == 2


@pytest.mark.parametrize("ddr_bytes", [0, "one short chunk"])
def test_a_chunk_whose_parent_fits_in_no_tier_is_not_placed_with_ssd(tmp_path, kv, ddr_bytes):
    """With SSD (or Redis) configured, a chunk whose parent's store ended placed nowhere (it
    fit in no tier) was still placed, in DDR or on SSD, where no prefix lookup reaches it.
    The worker and the writer thread now skip it (rejected), as they do without tiers below."""
    toks = tokens_for(320, 79)  # a full chunk, then a 64-token one: only the short one fits
    small = blob_size(kv) // 2
    with TierManager(ddr_bytes=0 if ddr_bytes == 0 else small, allocator="bytes", ssd_dir=str(tmp_path),
                     ssd_bytes=small, namespace=NS) as tm:
        busy = threading.Event()
        tm._writer.submit(busy.wait, 30)  # the parent's write comes after the child is encoded
        threading.Timer(0.3, busy.set).start()
        assert tm.store(toks, kv[:, :, :320]) == 2
        assert tm.flush(30)
        assert tm.lookup(toks).tokens == 0
        assert len(tm.ddr) == 0 and len(tm.ssd) == 0
        assert tm.status()["tiers"]["ddr"]["rejected"] == 2


@pytest.mark.parametrize("again", [False, True])
def test_a_sequence_loses_its_tail_first(kv, again):
    """A store added (or, stored again, touched) its chunks from chunk 0 on, so under LRU
    chunk 0 was the first victim: the sequence's prefix lookup then found nothing while
    its other chunks still held the memory. Chunk 0 is now the most recent of a store's
    chunks, and pressure takes the tail first."""
    a, b = tokens_for(1024, 48), tokens_for(512, 49)
    with TierManager(ddr_bytes=1 << 30, namespace=NS) as tm:
        tm.store(a, kv)
        assert tm.flush(30)
        size = tm.ddr.allocator.used_bytes // 4
    with TierManager(ddr_bytes=int(size * 4.5), namespace=NS) as tm:
        tm.store(a, kv)
        assert tm.flush(30)
        if again:  # every chunk already stored: only touched
            assert tm.store(a, kv) == 0 and tm.flush(30)
        tm.store(b, kv[:, :, :512])  # room for two more chunks: two of a's leave
        assert tm.flush(30)
        assert tm.lookup(a).tokens == 512 and tm.lookup(b).tokens == 512


def test_the_cost_policy_keeps_a_sequence_prefix(kv):
    """The cost policy valued a sequence's early chunks least (cheapest to recompute), so
    pressure took chunk 0 first: a's prefix lookup then found nothing while its later
    chunks still held the memory (and b lost its chunk 0 to b's own chunk 1). A chunk now
    leaves only after the chunks that extend it."""
    a, b = tokens_for(1024, 63), tokens_for(512, 64)
    with TierManager(ddr_bytes=1 << 30, namespace=NS) as tm:
        tm.store(a, kv)
        assert tm.flush(30)
        size = tm.ddr.allocator.used_bytes // 4
    with TierManager(ddr_bytes=int(size * 4.5), namespace=NS, policy="cost") as tm:
        tm.store(a, kv)
        assert tm.flush(30)
        tm.store(b, kv[:, :, :512])  # room for two more chunks: two of a's leave, its tail
        assert tm.flush(30)
        assert tm.lookup(a).tokens == 512 and tm.lookup(b).tokens == 512


def test_a_shared_prefix_stays_while_a_higher_priority_sequence_extends_it(kv):
    """A prefix of a lower level than a sequence that extends it (a shared system prompt
    set to -1, b to 5) left first, and took a and b with it: their chunks stayed,
    unreachable. The prefix now stays while b does; a's own chunk leaves instead."""
    p = tokens_for(256, 65)
    a, b, c = p + tokens_for(256, 66), p + tokens_for(256, 67), tokens_for(256, 68)
    with TierManager(ddr_bytes=1 << 30, namespace=NS) as tm:
        tm.store(a, kv[:, :, :512])
        assert tm.flush(30)
        size = tm.ddr.allocator.used_bytes // 2
    with TierManager(ddr_bytes=int(size * 3.5), namespace=NS, policy="cost") as tm:
        tm.set_priority(b, 5)
        tm.set_priority(p, -1)
        tm.store(a, kv[:, :, :512])
        tm.store(b, kv[:, :, :512])
        assert tm.flush(30)
        tm.store(c, kv[:, :, 256:512])  # one chunk must leave: a's own, not the prefix b needs
        assert tm.flush(30)
        assert tm.lookup(b).tokens == 512 and tm.lookup(c).tokens == 256 and tm.lookup(a).tokens == 256


def test_ssd_eviction_follows_priorities(tmp_path, kv):
    """The SSD tier chose its victims by its own order alone: a chunk given a high priority
    left before one of the default level. The manager now gives it the levels DDR uses."""
    a, b, c = tokens_for(256, 60), tokens_for(256, 61), tokens_for(256, 62)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path / "probe"), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(a, kv[:, :, :256])
        assert tm.flush(30)
        size = tm.ssd.used_bytes
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path / "d"), ssd_bytes=int(size * 2.5), namespace=NS) as tm:
        tm.set_priority(a, 5)
        for toks in (a, b, c):  # c needs the room of one: b leaves, although a is older
            tm.store(toks, kv[:, :, :256])
            assert tm.flush(30)
        assert tm.lookup(a).tiers == ["ssd"] and tm.lookup(b).tokens == 0 and tm.lookup(c).tiers == ["ssd"]
        assert tm.status()["tiers"]["ssd"]["evictions"] == 1


def test_an_expired_chunk_is_the_first_to_leave_ddr(kv):
    """Expired chunks leave DDR before any other, also one that a store gave a shorter TTL
    when it was held already (and made the most recent)."""
    a, b, c = tokens_for(256, 70), tokens_for(256, 71), tokens_for(256, 72)
    with TierManager(ddr_bytes=1 << 30, namespace=NS) as tm:
        tm.store(a, kv[:, :, :256])
        assert tm.flush(30)
        size = tm.ddr.allocator.used_bytes
    with TierManager(ddr_bytes=int(size * 2.5), namespace=NS) as tm:
        tm.store(a, kv[:, :, :256])
        tm.store(b, kv[:, :, :256])
        assert tm.flush(30) and tm.store(a, kv[:, :, :256], ttl=0.3) == 0 and tm.flush(30)
        time.sleep(0.4)
        tm.store(c, kv[:, :, :256])  # one must leave: a, expired, although b is older
        assert tm.flush(30)
        assert [tm.keys(t)[0].digest in tm.ddr for t in (a, b, c)] == [False, True, True]


def test_evict_demotes_and_clear(tmp_path, kv):
    toks = tokens_for(1024, 13)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        assert tm.evict(nbytes=1) == 1  # one victim, demoted to SSD
        assert sorted(tm.lookup(toks).tiers) == ["ddr", "ddr", "ddr", "ssd"]
        assert tm.evict(count=10) == 3
        assert tm.lookup(toks).tiers == ["ssd"] * 4
        tm.prefetch(toks)
        tm.flush()
        assert tm.lookup(toks).tiers == ["ddr"] * 4
        assert tm.clear() >= 8
        assert tm.lookup(toks).tokens == 0 and len(tm.ssd) == 0


def test_ttl_expires_everywhere(tmp_path, redis_server, kv):
    toks = tokens_for(512, 14)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30,
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS, write_through=True) as tm:
        t0 = time.monotonic()
        tm.store(toks, kv[:, :, :512], ttl=2.0)  # outlives the store's writes (fsync, Redis) on a loaded machine
        tm.flush()
        assert tm.lookup(toks).tokens == 512
        time.sleep(max(0.0, t0 + 2.3 - time.monotonic()))
        assert tm.lookup(toks).tokens == 0
        out = torch.zeros_like(kv[:, :, :512])
        assert tm.retrieve(toks, out) == 0
        tm.store(toks, kv[:, :, :512])  # stored again, without a TTL: lives on
        tm.flush()
        assert tm.retrieve(toks, out) == 512 and same(out, kv[:, :, :512])
        tm.evict(toks)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30,
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS) as tm:
        assert tm.lookup(toks).tokens == 0  # expired on SSD and in Redis as well


def test_a_chunk_expired_here_does_not_come_back_from_redis(redis_server, kv):
    """A chunk whose TTL set_ttl() shortened expires in Redis later than here: the lookup that
    found it expired dropped its settings, and the next one found the Redis copy, a hit
    (retrieve restored it). Expiry removes the Redis copy too."""
    toks = tokens_for(512, 48)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=local_redis(), namespace=NS,
                     write_through=True) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30) and tm.lookup(toks).tiers == ["ddr"] * 2
        assert tm.set_ttl(toks, 0.05) == 2
        time.sleep(0.1)  # past the TTL
        assert tm.lookup(toks).tokens == 0
        assert tm.lookup(toks).tokens == 0
        assert tm.retrieve(toks, torch.zeros_like(kv[:, :, :512])) == 0


def test_a_lookup_deletes_an_expired_remote_copy_within_its_own_timeout(redis_server, kv, monkeypatch):
    """The Redis delete that expiry makes (above) ran under op_timeout_s (2 s by default)
    inside lookup(), whose remote calls are bounded by lookup_timeout_s (0.25 s)."""
    toks = tokens_for(512, 59)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, namespace=NS,
                     remote=local_redis(lookup_timeout_s=0.5, op_timeout_s=7.0), write_through=True) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30) and tm.set_ttl(toks, 0.05) == 2
        time.sleep(0.1)  # past the TTL
        timeouts = []
        delete = tm.remote.delete
        monkeypatch.setattr(tm.remote, "delete", lambda *a, timeout=None: timeouts.append(timeout) or delete(*a))
        assert tm.lookup(toks).tokens == 0 and timeouts == [0.5]


def test_persist_counts_the_chunks_already_in_redis(redis_server, kv):
    """persist() returns the number of chunks now on SSD or remote: chunks that had left DDR
    for Redis used to count as none (and stop the count)."""
    toks = tokens_for(512, 49)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=local_redis(), namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30) and tm.evict(count=1) == 1
        assert sorted(tm.lookup(toks).tiers) == ["ddr", "remote"]
        assert tm.persist(toks) == 2
        assert tm.evict(count=1) == 1 and tm.lookup(toks).tiers == ["remote"] * 2
        assert tm.persist(toks) == 2
        assert tm.persist(tokens_for(512, 50)) == 0


def test_a_chunk_that_expires_in_the_store_queue_is_never_a_hit(kv):
    """A chunk that expired while still queued: the lookup that found it expired dropped its
    settings, so the next one found it pending, and once the worker had placed it in DDR
    it never expired. The worker now drops it."""
    toks = tokens_for(512, 54)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        gate = hold_worker(tm)
        try:
            tm.store(toks, kv[:, :, :512], ttl=0.05)
            time.sleep(0.1)  # past the TTL
            assert tm.lookup(toks).tokens == 0 and tm.lookup(toks).tokens == 0
        finally:
            gate.set()
        assert tm.flush(30) and tm.lookup(toks).tokens == 0 and len(tm.ddr) == 0
        assert tm.retrieve(toks, torch.zeros_like(kv[:, :, :512])) == 0
        tm.store(toks, kv[:, :, :512])  # stored again without a TTL: lives on
        assert tm.flush(30) and tm.lookup(toks).tiers == ["ddr"] * 2


def test_persist_writes_no_expired_chunk(tmp_path, kv):
    """persist() wrote expired chunks through to SSD (with their past expiry) and counted
    them durable; an expired chunk is dropped instead, and the prefix ends there."""
    toks = tokens_for(512, 58)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS,
                     write_through=False) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30)
        tm.set_ttl(toks, 0.05)
        time.sleep(0.1)  # past the TTL
        assert tm.persist(toks) == 0
        assert len(tm.ssd) == 0 and tm.lookup(toks).tokens == 0


def test_a_chunk_promoted_from_ssd_keeps_its_expiry(tmp_path, kv, monkeypatch):
    """A chunk on SSD that this process has no settings for (stored before a restart, or by
    another process): its file name carries its expiry, but the copy a hit promoted into
    DDR had none, and was a hit forever."""
    toks = tokens_for(512, 55)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512], ttl=60)
        assert tm.flush(30)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        out = torch.zeros_like(kv[:, :, :512])
        assert tm.retrieve(toks, out) == 512 and tm.flush(30) and tm.lookup(toks).tiers == ["ddr"] * 2
        later = time.time() + 120
        monkeypatch.setattr(time, "time", lambda: later)  # past the TTL
        assert tm.lookup(toks).tokens == 0 and tm.retrieve(toks, out) == 0


def test_set_ttl_reaches_the_ssd_files(tmp_path, kv):
    """An SSD file's name carries its chunk's expiry, and the SSD tier drops a file past it.
    set_ttl() used to change only this process's settings: a chunk stored with a TTL and
    then given none still expired on SSD, and a TTL given to a chunk on SSD was gone after
    a restart (as was one given while the chunk was queued)."""
    toks = tokens_for(512, 51)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512], ttl=600)
        assert tm.set_ttl(toks, None) == 2
        assert [tm.ssd.entry(ck.digest).expires_ms for ck in tm.keys(toks)] == [0, 0]
        t0 = time.time()
        assert tm.set_ttl(toks, 1000) == 2
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.lookup(toks).tiers == ["ssd"] * 2
        for ck in tm.keys(toks):
            assert t0 + 999.99 <= tm.ssd.entry(ck.digest).expires_ms / 1000 <= time.time() + 1000
        out = torch.zeros_like(kv[:, :, :512])
        assert tm.retrieve(toks, out) == 512 and same(out, kv[:, :, :512])


def redis_pttls(tm, toks, url):
    """The PTTL (ms; -1: none) of every Redis part of the chunks of toks."""
    import redis

    r = redis.Redis.from_url(url)
    return [r.pttl(n) for ck in tm.keys(toks) for n in r.keys(f"kvcore:{tm._ns_tag}:{{{ck.hex}}}:*")]


def within(seconds, ttls_ms):
    """Whether every TTL (ms) is seconds, less at most 10 s of test time."""
    return bool(ttls_ms) and all(seconds * 1000 - 10_000 < ms <= seconds * 1000 for ms in ttls_ms)


@pytest.mark.parametrize("where", ["ssd", "remote", "every tier", "queued"])
def test_a_store_again_with_a_ttl_moves_the_expiry_of_every_copy(tmp_path, redis_server, kv, where):
    """A store of chunks stored already, with another ttl, changed only this process's
    settings: the SSD file (its name) and the Redis values kept the old expiry, which other
    processes, and this one after a restart, saw; chunks only in Redis were encoded and
    sent again instead. Now every copy takes the new expiry, and no data moves again."""
    toks = tokens_for(512, 60)
    ssd = {"ssd_dir": str(tmp_path), "ssd_bytes": 1 << 30}
    remote = {"remote_url": redis_server.url, "remote": local_redis(part_bytes=1 << 19)}  # 3 parts a chunk
    opts = {"ssd": {"ddr_bytes": 0, **ssd}, "remote": {"ddr_bytes": 0, **remote}}.get(
        where, {"ddr_bytes": 64 << 20, "write_through": True, **ssd, **remote})
    with TierManager(namespace=NS, queue_chunks=8, **opts) as tm:
        gate = hold_worker(tm) if where == "queued" else None  # the second store finds them queued
        tm.store(toks, kv[:, :, :512], ttl=60)
        assert gate is not None or tm.flush(30)
        tm.store(toks, kv[:, :, :512], ttl=600)
        if gate is not None:
            gate.set()
        assert tm.flush(30)
        tiers = tm.status()["tiers"]
        raw = kv[:, :, :512].nbytes
        assert tm.metrics.raw_bytes == raw  # encoded once
        if tm.ssd is not None:
            assert tiers["ssd"]["stores"] == 2
            assert within(600, [tm.ssd.entry(ck.digest).expires_ms - time.time() * 1000 for ck in tm.keys(toks)])
        if tm.remote is not None:
            assert tiers["remote"]["stores"] == 2
            assert within(600, redis_pttls(tm, toks, redis_server.url))
        assert tm.lookup(toks).tokens == 512


def test_set_ttl_reaches_the_redis_copies(redis_server, kv):
    """set_ttl() gave Redis copies nothing: a chunk given a longer TTL still expired there
    with its old one, and one given none as well."""
    toks = tokens_for(512, 62)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=local_redis(part_bytes=1 << 19),
                     namespace=NS, write_through=True) as tm:
        tm.store(toks, kv[:, :, :512], ttl=60)
        assert tm.flush(30) and within(60, redis_pttls(tm, toks, redis_server.url))
        assert tm.set_ttl(toks, 600) == 2 and within(600, redis_pttls(tm, toks, redis_server.url))
        assert tm.set_ttl(toks, None) == 2 and set(redis_pttls(tm, toks, redis_server.url)) == {-1}


@pytest.mark.parametrize("ddr_bytes", [0, 64 << 20])
def test_chunks_another_instance_put_in_redis_are_not_stored_again(redis_server, kv, monkeypatch, ddr_bytes):
    """store() encoded and sent again every chunk that only Redis held (stored by another
    instance or an earlier run). The worker now asks Redis once per store() call and sends
    none of the chunks it holds whole; a ttl still reaches them. Those that fit in DDR go
    there, as any stored chunk does; the others are not even encoded."""
    toks = tokens_for(768, 61)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
        a.store(toks[:512], kv[:, :, :512])
        assert a.flush(30)
    with TierManager(ddr_bytes=ddr_bytes, remote_url=redis_server.url, remote=rc, namespace=NS) as b:
        asked = []
        holds_whole = b.remote.holds_whole
        monkeypatch.setattr(b.remote, "holds_whole", lambda ns_tag, chunks: asked.append(len(chunks)) or
                            holds_whole(ns_tag, chunks))
        assert b.store(toks, kv[:, :, :768], ttl=600) == 3
        assert b.flush(30) and asked == [3]
        assert within(600, redis_pttls(b, toks[:512], redis_server.url))
        if ddr_bytes:
            assert b.metrics.raw_bytes == kv[:, :, :768].nbytes
            assert b.status()["tiers"].get("remote", {}).get("stores", 0) == 0
            assert b.lookup(toks).tiers == ["ddr", "ddr", "ddr"]
        else:
            assert b.metrics.raw_bytes == kv[:, :, 512:768].nbytes  # only the chunk Redis lacked
            assert b.status()["tiers"]["remote"]["stores"] == 1
            assert b.lookup(toks).tiers == ["remote", "remote", "remote"]
        out = torch.zeros_like(kv[:, :, :768])
        assert b.retrieve(toks, out) == 768 and same(out, kv[:, :, :768])


def test_a_long_store_asks_redis_about_its_chunks_a_few_at_a_time(redis_server, kv, monkeypatch):
    """The worker asked Redis about all of a store() call's chunks in one look, which grows
    with the call (up to 16 KiB of each value) while its bound, lookup_timeout_s, does not:
    a long store ran past it and opened the breaker. It now asks PROBE_CHUNKS at a time,
    each look from the first chunk not yet asked about, and still finds them all."""
    from kvcore.tiers import manager

    monkeypatch.setattr(manager, "PROBE_CHUNKS", 5, raising=False)
    toks = tokens_for(1024, 76)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS, chunk_tokens=64) as a:
        assert a.store(toks, kv) == 16
        assert a.flush(30)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=rc, namespace=NS,
                     chunk_tokens=64) as b:
        asked = []
        holds_whole = b.remote.holds_whole
        monkeypatch.setattr(b.remote, "holds_whole", lambda ns_tag, chunks: asked.append(len(chunks)) or
                            holds_whole(ns_tag, chunks))
        assert b.store(toks, kv) == 16
        assert b.flush(30) and asked == [5, 5, 5, 1]
        assert b.status()["tiers"]["remote"].get("stores", 0) == 0  # none sent again
        assert b.lookup(toks).tiers == ["ddr"] * 16


def test_a_pinned_chunk_redis_holds_is_kept_on_ssd_when_ddr_cannot_hold_it(tmp_path, redis_server, kv):
    """A pinned chunk is kept here: in DDR, else on SSD, where a pin keeps it from eviction.
    One that Redis held and that would not fit in DDR was skipped (the store's look for
    chunks Redis holds), so it stayed only in Redis, which may evict it and is slower to
    read. It is written to SSD again, as before that look skipped pinned chunks too."""
    toks = tokens_for(512, 80)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
        a.store(toks, kv[:, :, :512])
        assert a.flush(30)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, remote_url=redis_server.url,
                     remote=rc, namespace=NS) as b:
        b.pin(toks[:256])
        assert b.store(toks, kv[:, :, :512]) == 2
        assert b.flush(30)
        assert b.lookup(toks).tiers == ["ssd", "remote"]  # the unpinned chunk stays in Redis only
        out = torch.zeros_like(kv[:, :, :512])
        assert b.retrieve(toks, out) == 512 and same(out, kv[:, :, :512])


def damage_redis_copy(tm, toks, other, how, url):
    """Damages the Redis value of toks' first chunk: a part deleted or cut short, another
    chunk's value (other's) in its place, or one byte of its body changed."""
    import redis

    r = redis.Redis.from_url(url)
    name = f"kvcore:{tm._ns_tag}:{{{tm.keys(toks)[0].hex}}}:%d"
    if how == "a part missing":
        assert r.delete(name % 1) == 1
    elif how == "a part cut short":
        r.set(name % 1, r.get(name % 1)[:-1])
    elif how == "another chunk's value":
        src = f"kvcore:{tm._ns_tag}:{{{tm.keys(other)[0].hex}}}:%d"
        i = 0
        while (value := r.get(src % i)) is not None:
            r.set(name % i, value)
            i += 1
    else:  # a byte of the body
        r.setrange(name % 1, 100, bytes([r.getrange(name % 1, 100, 100)[0] ^ 0xFF]))


@pytest.mark.parametrize("ddr_bytes", [0, 64 << 20])
@pytest.mark.parametrize("how", ["a part missing", "a part cut short", "another chunk's value", "a byte of the body"])
def test_a_store_repairs_a_damaged_copy_in_redis(redis_server, kv, ddr_bytes, how):
    """A store skipped every chunk whose part 0 Redis held (one EXISTS), so a damaged copy
    stayed what the next read found: a miss. The chunk now goes into DDR when it fits (the
    copy below is then never read first, and its demotion writes over it), and the check
    for a chunk that would only go below reads each value's header and part lengths: a
    value with a part missing or short, or claiming another chunk, is sent again. A body
    changed in place passes that check (only reading it all would tell): the read that
    finds it corrupt deletes it, and the next store sends the chunk again."""
    toks, other = tokens_for(512, 74), tokens_for(256, 75)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
        a.store(toks, kv[:, :, :512])
        a.store(other, kv[:, :, 512:768])
        assert a.flush(30)
        damage_redis_copy(a, toks, other, how, redis_server.url)
    with TierManager(ddr_bytes=ddr_bytes, remote_url=redis_server.url, remote=rc, namespace=NS) as b:
        out = torch.zeros_like(kv[:, :, :512])
        b.store(toks, kv[:, :, :512])
        assert b.flush(30)
        if ddr_bytes == 0 and how == "a byte of the body":
            assert b.retrieve(toks, out) == 0 and b.status()["tiers"]["remote"]["corrupt"] == 1
            b.store(toks, kv[:, :, :512])
            assert b.flush(30)
        assert b.retrieve(toks, out) == 512 and same(out, kv[:, :, :512])
        assert b.lookup(toks).tiers == (["remote"] * 2 if ddr_bytes == 0 else ["ddr"] * 2)


@pytest.mark.parametrize("default_ttl", [None, 900])
def test_a_store_without_ttl_of_chunks_redis_holds_gives_them_the_default_ttl(redis_server, kv, default_ttl):
    """A store that finds its chunks in Redis does not send them again; before that check,
    the send gave them the store's TTL, without one the remote tier's default. Skipped,
    they kept the short TTL another instance gave them, and left Redis soon after being
    stored. They now get the TTL the send would have given them."""
    toks = tokens_for(512, 69)
    rc = local_redis(part_bytes=1 << 19, ttl_s=default_ttl)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
        a.store(toks, kv[:, :, :512], ttl=30)
        assert a.flush(30)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=rc, namespace=NS) as b:
        assert b.store(toks, kv[:, :, :512]) == 2
        assert b.flush(30) and b.status()["tiers"]["remote"].get("stores", 0) == 0  # not sent again
        ttls = redis_pttls(b, toks, redis_server.url)
        assert ttls and (all(t == -1 for t in ttls) if default_ttl is None else within(default_ttl, ttls))


def test_write_through_stores_chunks_redis_holds_in_every_tier(tmp_path, redis_server, kv):
    """write_through asks for a copy of every stored chunk in every tier; the look for
    chunks Redis holds skipped them, so they reached neither DDR nor SSD."""
    toks = tokens_for(512, 70)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
        a.store(toks, kv[:, :, :512])
        assert a.flush(30)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=tmp_path / "ssd", ssd_bytes=64 << 20, write_through=True,
                     remote_url=redis_server.url, remote=rc, namespace=NS) as b:
        assert b.store(toks, kv[:, :, :512]) == 2
        assert b.flush(30)
        assert b.lookup(toks).tiers == ["ddr", "ddr"]
        assert all(b.ssd.contains(ck.digest) for ck in b.keys(toks))


def test_a_pinned_chunk_that_redis_holds_is_still_stored_into_ddr(redis_server, kv):
    """pin() keeps a tokens' chunks in DDR, those stored later too; but a store of pinned
    chunks that another instance had put in Redis meanwhile skipped them (the worker's
    look for chunks Redis holds): pinned, they were in no DDR. Pinned chunks are now
    stored as before."""
    toks = tokens_for(512, 68)
    rc = local_redis(part_bytes=1 << 19)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=rc, namespace=NS,
                     promote_on_hit=False) as b:
        assert b.pin(toks) == 2  # nothing stored yet: nothing to pull in
        with TierManager(ddr_bytes=0, remote_url=redis_server.url, remote=rc, namespace=NS) as a:
            a.store(toks, kv[:, :, :512])
            assert a.flush(30)
        assert b.store(toks, kv[:, :, :512]) == 2
        assert b.flush(30) and b.lookup(toks).tiers == ["ddr", "ddr"]


def test_a_hung_redis_delays_no_store(redis_server, kv):
    """The look for chunks Redis holds runs on the worker, bounded by lookup_timeout_s: with
    a hung server, store() returns at once and the chunks are stored as without Redis."""
    toks = tokens_for(512, 63)
    rc = local_redis(lookup_timeout_s=2.0, reset_after_s=600)
    with TierManager(ddr_bytes=64 << 20, remote_url=redis_server.url, remote=rc, namespace=NS) as tm:
        redis_server.pause()
        try:
            assert tm.store(toks, kv[:, :, :512]) == 2
            assert tm.status()["queue"]["pending_chunks"] == 2  # the worker still waits on the server
            t0 = time.monotonic()
            assert tm.flush(30) and time.monotonic() - t0 < 15
            assert all(ck.digest in tm.ddr for ck in tm.keys(toks))
        finally:
            redis_server.resume()


@pytest.mark.parametrize("sent", [True, False])
def test_an_ssd_victim_is_found_while_it_is_demoted_to_redis(tmp_path, redis_server, kv, monkeypatch, sent):
    """An SSD victim left the SSD index before its send to Redis began: until the send
    landed, a lookup or retrieve missed a chunk that existed. It is now found on SSD (read
    from its file) until the send returns; then it is in Redis, or, when the send failed,
    dropped as an eviction without Redis drops it, its file and reservation gone."""
    first, second = tokens_for(256, 64), tokens_for(256, 65)
    cap = int(blob_size(kv) * 1.5)  # one chunk
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=cap, remote_url=redis_server.url,
                     remote=local_redis(), namespace=NS, promote_on_hit=False) as tm:
        tm.store(first, kv[:, :, :256])
        assert tm.flush(30) and tm.lookup(first).tiers == ["ssd"]
        entered, release = threading.Event(), threading.Event()
        put = tm.remote.put

        def gated_put(*args, **kwargs):
            entered.set()
            assert release.wait(30)
            return put(*args, **kwargs) if sent else False

        monkeypatch.setattr(tm.remote, "put", gated_put)
        tm.store(second, kv[:, :, 256:512])  # makes the first chunk the SSD tier's victim
        try:
            assert entered.wait(30)  # its send has begun
            assert tm.lookup(first).tiers == ["ssd"]
            out = torch.zeros_like(kv[:, :, :256])
            assert tm.retrieve(first, out) == 256 and same(out, kv[:, :, :256])
        finally:
            release.set()
        assert tm.flush(30)
        assert tm.lookup(first).tiers == (["remote"] if sent else [])
        assert tm.lookup(second).tiers == ["ssd"]
        assert not leftover_temporaries(tmp_path) and tm.ssd.used_bytes == tm.ssd.entry(tm.keys(second)[0].digest).size


@contextlib.contextmanager
def ssd_victim_held_in_its_send_to_redis(tm, monkeypatch, first, second):
    """With first on SSD and second in DDR: persists second on another thread, which makes
    first the SSD victim sent to Redis, and holds that send until the block ends. Yields
    first's key while the send is under way."""
    entered, release = threading.Event(), threading.Event()
    put, victim = tm.remote.put, tm.keys(first)[0].digest

    def gated_put(ns_tag, key, *args, **kwargs):
        if key == victim:
            entered.set()
            assert release.wait(30)
        return put(ns_tag, key, *args, **kwargs)

    monkeypatch.setattr(tm.remote, "put", gated_put)
    persisting = threading.Thread(target=tm.persist, args=(second,))
    persisting.start()
    try:
        assert entered.wait(30)
        yield victim
    finally:
        release.set()
        persisting.join(30)


def test_a_chunk_evicted_while_it_is_demoted_to_redis_stays_gone(tmp_path, redis_server, kv, monkeypatch):
    """evict(tokens) of an SSD victim whose send to Redis was under way removed nothing
    (SSDTier.remove missed a victim being demoted) and deleted from Redis before the send
    landed: the chunk came back as a remote hit after evict() had deleted it everywhere.
    Now the SSD tier drops it at once and the send that lands after is deleted."""
    first, second = tokens_for(256, 66), tokens_for(256, 67)
    one = int(blob_size(kv) * 1.5)
    with TierManager(ddr_bytes=one, allocator="bytes", ssd_dir=str(tmp_path), ssd_bytes=one,
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS, promote_on_hit=False) as tm:
        tm.store(first, kv[:, :, :256])
        tm.store(second, kv[:, :, 256:512])  # first is demoted to SSD
        assert tm.flush(30) and tm.lookup(first).tiers == ["ssd"] and tm.lookup(second).tiers == ["ddr"]
        with ssd_victim_held_in_its_send_to_redis(tm, monkeypatch, first, second) as victim:
            assert tm.evict(first) == 1
        assert tm.lookup(first).tiers == []
        assert not tm.remote.exists_many(tm.namespace.tag, [victim])[0]


@pytest.mark.parametrize("how", ["set_ttl", "store"])
def test_an_expiry_set_while_a_chunk_is_demoted_to_redis_reaches_its_redis_copy(tmp_path, redis_server, kv,
                                                                               monkeypatch, how):
    """A new expiry (set_ttl, or a store again with a ttl) for an SSD victim whose send to
    Redis was under way was lost: the SSD tier refused to rename a victim, Redis did not
    hold the chunk yet, and the send landed with the file's old TTL. The victim now takes
    the new expiry along, and the copy gets it once the send has landed."""
    first, second = tokens_for(256, 72), tokens_for(256, 73)
    one = int(blob_size(kv) * 1.5)
    with TierManager(ddr_bytes=one, allocator="bytes", ssd_dir=str(tmp_path), ssd_bytes=one,
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS, promote_on_hit=False) as tm:
        tm.store(first, kv[:, :, :256], ttl=60)
        tm.store(second, kv[:, :, 256:512])  # first is demoted to SSD
        assert tm.flush(30) and tm.lookup(first).tiers == ["ssd"] and tm.lookup(second).tiers == ["ddr"]
        with ssd_victim_held_in_its_send_to_redis(tm, monkeypatch, first, second):
            if how == "set_ttl":
                assert tm.set_ttl(first, 600) == 1
            else:
                assert tm.store(first, kv[:, :, :256], ttl=600) == 0  # held (on SSD): only its expiry moves
                assert tm.flush(30)
        assert tm.lookup(first).tiers == ["remote"]
        assert within(600, redis_pttls(tm, first, redis_server.url))


@pytest.mark.parametrize("below", ["ssd", "remote"])
@pytest.mark.parametrize("how", ["set_ttl", "evict"])
def test_a_ddr_victim_being_demoted_takes_a_set_ttl_or_an_evict_made_meanwhile(tmp_path, redis_server, kv,
                                                                                 monkeypatch, below, how):
    """A DDR victim's write below (the worker, making room for another thread's store) read
    the chunk's expiry before it began: a set_ttl() whose flush had run before that store was
    queued gave the chunk its new expiry while the copy below did not exist yet (an SSD file
    not yet renamed, a Redis value not yet there), and the copy landed with the old one; an
    evict(tokens) then deleted the copies below before it landed, and the copy brought the
    chunk back. The demotion now gives the landed copy the new expiry, or deletes it."""
    first, second = tokens_for(256, 77), tokens_for(256, 78)
    one = int(blob_size(kv) * 1.5)
    tiers = (dict(ssd_dir=str(tmp_path), ssd_bytes=1 << 30) if below == "ssd"
             else dict(remote_url=redis_server.url, remote=local_redis()))
    with TierManager(ddr_bytes=one, allocator="bytes", namespace=NS, promote_on_hit=False, **tiers) as tm:
        tm.store(first, kv[:, :, :256], ttl=60)
        assert tm.flush(30) and tm.lookup(first).tiers == ["ddr"]
        victim = tm.keys(first)[0].digest
        entered, release, flushed, go = (threading.Event() for _ in range(4))

        def gated(write):
            def write_gated(*args, **kwargs):
                if args[1 if below == "remote" else 0] == victim:
                    entered.set()
                    assert release.wait(30)
                return write(*args, **kwargs)
            return write_gated

        tier, name = (tm.ssd, "write") if below == "ssd" else (tm.remote, "put")
        monkeypatch.setattr(tier, name, gated(getattr(tier, name)))
        flush_open = tm._flush_open

        def flush_then_wait():  # the caller's flush has run: the store below is queued after it
            flush_open()
            flushed.set()
            assert go.wait(30)

        monkeypatch.setattr(tm, "_flush_open", flush_then_wait)
        caller = threading.Thread(target=tm.set_ttl if how == "set_ttl" else tm.evict,
                                  args=(first, 600) if how == "set_ttl" else (first,))
        caller.start()
        try:
            assert flushed.wait(30)
            tm.store(second, kv[:, :, 256:512])  # first is DDR's victim: written below
            assert entered.wait(30)
            go.set()
            caller.join(30)
        finally:
            go.set()
            release.set()
        assert not caller.is_alive() and tm.flush(30)
        if how == "evict":
            assert tm.lookup(first).tokens == 0
            assert not (tm.ssd.contains(victim) if below == "ssd" else tm.remote.exists_many(tm._ns_tag, [victim])[0])
        elif below == "ssd":
            assert tm.lookup(first).tiers == ["ssd"]
            assert 590_000 < tm.ssd.entry(victim).expires_ms - time.time() * 1000 <= 600_000
        else:
            assert tm.lookup(first).tiers == ["remote"]
            assert within(600, redis_pttls(tm, first, redis_server.url))


def test_ssd_victims_of_a_smaller_reopen_are_demoted_to_redis(tmp_path, redis_server, kv):
    """A manager that reopens an SSD directory with a smaller ssd_bytes evicts at start,
    while it is being built: those victims go to Redis as any SSD victim does, without an
    error."""
    toks = tokens_for(512, 69)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30) and tm.lookup(toks).tiers == ["ssd", "ssd"]
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=int(blob_size(kv) * 1.5),
                     remote_url=redis_server.url, remote=local_redis(), namespace=NS) as tm:
        assert sorted(tm.lookup(toks).tiers) == ["remote", "ssd"]
        assert tm.status()["tiers"]["ssd"].get("errors", 0) == 0


def test_restore_vs_recompute(tmp_path, kv):
    toks = tokens_for(1024, 15)
    with TierManager(ddr_bytes=3 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv)
        tm.flush()
        fast = tm.estimate(toks, prefill_s_per_token=1.0)  # recompute is very slow: restore all
        assert fast.tokens == 1024 and all(c["restore"] for c in fast.chunks)
        slow = tm.estimate(toks, prefill_s_per_token=1e-12)  # recompute is free: restore nothing
        assert slow.tokens == 0 and slow.chunks[0]["restore_s"] > slow.chunks[0]["recompute_s"]
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out, prefill_s_per_token=1e-12) == 0
        assert tm.retrieve(toks, out, prefill_s_per_token=1.0) == 1024 and same(out, kv)
        with pytest.raises(InvalidArgumentError):
            tm.estimate(toks, 0)


def test_status_and_prometheus(kv):
    toks = tokens_for(512, 16)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512])
        tm.flush()
        tm.retrieve(toks, torch.zeros_like(kv[:, :, :512]))
        tm.lookup(tokens_for(256, 99))
        st = tm.status()
        assert st["namespace"]["salt"] == "tests" and st["chunk_tokens"] == 256
        assert 0 < st["compression_ratio"] <= 1.01 and st["raw_bytes"] == kv[:, :, :512].numel() * 2
        assert st["latency"]["store"]["count"] == 1 and st["latency"]["retrieve"]["count"] == 1
        text = tm.prometheus()
        assert 'kvcore_tier_entries{tier="ddr"} 2' in text and "kvcore_lookup_seconds_count 1" in text


def test_bad_arguments(kv):
    with pytest.raises(InvalidArgumentError):
        TierManager()
    with pytest.raises(InvalidArgumentError):
        TierManager(ddr_bytes=-1)
    with pytest.raises(InvalidArgumentError):
        TierManager(ddr_bytes=1, codec="zip")
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        with pytest.raises(InvalidArgumentError):
            tm.store(tokens_for(10), kv[0])  # 4-D
        with pytest.raises(InvalidArgumentError):
            tm.store(tokens_for(2000), kv)  # more tokens than kv holds
        tm.store(tokens_for(256), kv[:, :, :256])
        tm.flush()
        with pytest.raises(InvalidArgumentError):
            tm.retrieve(tokens_for(256), torch.zeros(6, 2, 256, 12, 32, dtype=torch.float16))
    with pytest.raises(InvalidArgumentError):
        tm.store(tokens_for(256), kv[:, :, :256])  # closed


def test_store_refuses_another_models_kv(kv):
    """A namespace holds one model's KV: another dtype than it names, or other (layers,
    kv_heads, head_dim) than the first store, is refused before anything is queued."""
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        with pytest.raises(InvalidArgumentError, match="namespace's dtype"):
            tm.store(tokens_for(256, 7), kv[:, :, :256].to(torch.float16))
        assert tm.store(tokens_for(256, 8), kv[:, :, :256]) == 1
        for other in (kv[:5, :, :256], kv[:, :, :256, :6], kv[:, :, :256, :, :16]):
            with pytest.raises(InvalidArgumentError, match="this manager stores"):
                tm.store(tokens_for(256, 9), other)
        assert tm.flush(30) and tm.lookup(tokens_for(256, 9)).tokens == 0
        assert tm.status()["tiers"]["ddr"]["entries"] == 1
    with TierManager(ddr_bytes=64 << 20, namespace=Namespace("m")) as tm:  # no dtype named: any
        assert tm.store(tokens_for(256, 7), kv[:, :, :256].to(torch.float16)) == 1


def test_a_refused_store_does_not_fix_the_managers_geometry(kv):
    """The geometry a manager stores is that of its first store that is not refused: a first
    store refused for its tokens or TTL used to fix its (layers, kv_heads, head_dim), and
    every store of the model's real KV was then refused."""
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        with pytest.raises(InvalidArgumentError, match="fewer than"):
            tm.store(tokens_for(2000), kv[:, :, :, :6])
        with pytest.raises(InvalidArgumentError, match="ttl"):
            tm.store(tokens_for(256), kv[:, :, :256, :6], ttl=-1.0)
        assert tm.store(tokens_for(256, 41), kv[:, :, :256]) == 1


def test_store_ttl_is_checked_and_a_huge_one_never_expires(tmp_path, kv):
    """store(ttl=) refuses what set_ttl() refuses (NaN and inf used to be queued, and every
    SSD write of those chunks failed; a str raised TypeError), and a TTL too long for an SSD
    file name's expiry (or Redis' PX) never expires: 1e300 s made every SSD write fail."""
    toks = tokens_for(512, 42)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path / "a"), ssd_bytes=1 << 30, namespace=NS) as tm:
        for bad in (float("nan"), float("inf"), "5", True, 0, -1.0):
            with pytest.raises(InvalidArgumentError):
                tm.store(toks, kv[:, :, :512], ttl=bad)
        assert tm.flush(30) and tm.lookup(toks).tokens == 0
        assert tm.store(toks, kv[:, :, :512], ttl=1e300) == 2 and tm.flush(30)
        assert tm.lookup(toks).tiers == ["ssd"] * 2 and tm.status()["tiers"]["ssd"]["errors"] == 0
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path / "b"), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks, kv[:, :, :512])
        assert tm.flush(30) and tm.set_ttl(toks, 1e300) == 2
        assert tm.persist(toks) == 2 and tm.status()["tiers"]["ssd"]["errors"] == 0


def test_every_operation_after_close_raises(kv):
    toks = tokens_for(256, 11)
    tm = TierManager(ddr_bytes=64 << 20, namespace=NS)
    tm.store(toks, kv[:, :, :256])
    assert tm.close()
    calls = {
        "store": lambda: tm.store(toks, kv[:, :, :256]),
        "lookup": lambda: tm.lookup(toks),
        "retrieve": lambda: tm.retrieve(toks, torch.zeros_like(kv[:, :, :256])),
        "estimate": lambda: tm.estimate(toks, 1e-3),
        "prefetch": lambda: tm.prefetch(toks),
        "pin": lambda: tm.pin(toks),
        "unpin": lambda: tm.unpin(toks),
        "set_priority": lambda: tm.set_priority(toks, 1),
        "set_ttl": lambda: tm.set_ttl(toks, 10),
        "persist": lambda: tm.persist(toks),
        "evict": lambda: tm.evict(toks),
        "clear": lambda: tm.clear(),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgumentError, match="closed"):
            call()
    assert tm.close() and tm.flush(1)  # closing again and flushing nothing are fine
    assert tm.status()["namespace"]["model_id"] == NS.model_id

def test_close_while_other_threads_use_the_manager(tmp_path, kv):
    """close() while three threads retrieve, store, persist, evict, pin, prefetch, flush and
    clear, with the chunks on SSD (a DDR tier too small to hold them, so retrieves read ahead on
    the manager's I/O threads): every call returns (retrieves a bit-exact prefix) or raises the
    closed error, and no thread is left waiting. Before 2026-12-03 a retrieve could raise the
    executor's RuntimeError or CancelledError, an SSD read finishing after close wrote its journal
    record to the closed descriptor (EBADF; a reused descriptor would have taken it), and a flush
    (evict, persist, clear) queued behind close()'s stop waited forever."""
    stored = tokens_for(1024, 21)
    for trial in range(6):
        tm = TierManager(ddr_bytes=4 << 20, ssd_dir=tmp_path / str(trial), ssd_bytes=1 << 30, namespace=NS)
        tm.store(stored, kv)
        assert tm.flush(30)
        out = [torch.zeros_like(kv) for _ in range(3)]
        closed = threading.Event()

        def work(i):
            if i == 3:  # the closer (whether it finished the queued stores in time is not the point)
                time.sleep(0.05 + 0.04 * trial)
                tm.close(timeout=30)
                closed.set()
                return
            rng = random.Random(i * 100 + trial)
            while not closed.is_set():
                toks = stored if rng.random() < 0.6 else tokens_for(1024, rng.randrange(4))
                op = rng.randrange(8)
                try:
                    if op <= 2:
                        n = tm.retrieve(toks, out[i])
                        assert same(out[i][:, :, :n], kv[:, :, :n])  # every store stores kv
                    elif op == 3:
                        tm.store(toks, kv)
                    elif op == 4:
                        tm.persist(toks)
                        tm.prefetch(toks)
                    elif op == 5:
                        tm.evict(toks) if rng.random() < 0.5 else tm.evict(count=1)
                    elif op == 6:
                        tm.pin(toks)
                        tm.set_priority(toks, 2)
                        tm.unpin(toks)
                    else:
                        tm.clear() if rng.random() < 0.2 else tm.flush()
                except InvalidArgumentError as e:
                    assert "closed" in str(e) or "stopped" in str(e)
                    return

        assert errors_of_threads(work, 4, timeout=60) == []  # a call still waiting after close() fails it too


def test_config_object_and_export():
    cfg = TierConfig(ddr_bytes=1 << 20, chunk_tokens=64, namespace="m", policy="cost")
    with kvcore.TierManager(config=cfg) as tm:
        assert tm.chunk_tokens == 64 and tm.status()["policy"] == "cost"
    assert kvcore.TierConfig is TierConfig


class _FakeBuf(bytearray):
    """A pool buffer that refuses free() while a view of it is exported (as PinnedBuffer does)."""

    def free(self):
        try:
            self.append(0)  # a bytearray cannot resize while a memoryview of it is exported
            self.pop()
        except BufferError:
            raise kvcore.InvalidArgumentError("view alive") from None
        self.pool.live -= len(self)


class _FakePool:
    def __init__(self, cap):
        self.cap, self.live = cap, 0

    def alloc(self, n):
        if self.live + n > self.cap:
            raise kvcore.PoolExhausted("full")
        self.live += n
        buf = _FakeBuf(n)
        buf.pool = self
        return buf


def test_pins_and_priorities_survive_a_restart(tmp_path, kv):
    """A pin made before a restart still holds: the chunk comes back into DDR and DDR
    pressure does not evict it; priorities and unpins are kept too."""
    a, b, c, d = (tokens_for(256, s) for s in (20, 21, 22, 23))
    one = kv[:, :, :256]
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        for t in (a, b, c, d):
            tm.store(t, one)
        tm.flush()
        assert all(tm.persist(t) == 1 for t in (a, b, c, d))  # on SSD for the next process
        cap = int(chunk_blob_bytes(tm) * 2.5)
        assert tm.pin(a) == 1 and tm.set_priority(b, 7) == 1
        assert tm.pin(d) == 1 and tm.unpin(d) == 1
    with TierManager(ddr_bytes=cap, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.status()["pinned_chunks"] == 1
        assert tm.flush(30)
        assert tm.lookup(a).tiers == ["ddr"]  # prefetched at start
        for t in (c, d, b, c, d):  # DDR holds two chunks: a stays, c and d take turns
            out = torch.zeros_like(one)
            assert tm.retrieve(t, out) == 256 and same(out, one)
            tm.flush()
        assert tm.lookup(a).tiers == ["ddr"]
        assert tm._meta[tm.keys(b)[0].digest].priority == 7
        assert not tm._meta.get(tm.keys(d)[0].digest, None) or not tm._meta[tm.keys(d)[0].digest].pinned
        tm.evict(a)  # deleting a chunk drops its pin
    with TierManager(ddr_bytes=cap, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.status()["pinned_chunks"] == 0
    (tmp_path / "kvcore-hot" / f"{NS.tag}.json").write_text("{not json")
    with TierManager(ddr_bytes=cap, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.status()["pinned_chunks"] == 0 and tm.lookup(b).tokens == 256  # a damaged file is ignored
        assert tm.status()["tiers"]["ssd"]["errors"] >= 1  # and counted
        tm.pin(b)
    with TierManager(ddr_bytes=cap, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.status()["pinned_chunks"] == 1


def test_clear_of_another_namespace_drops_its_pins(tmp_path, kv):
    """clear(namespace) of another namespace deleted its chunks but kept its pins file: the
    pins and priorities came back at its next start and held for the chunks stored again."""
    other = replace(NS, salt="other")
    toks = tokens_for(256, 52)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=other) as tm:
        tm.store(toks, kv[:, :, :256])
        assert tm.pin(toks) == 1 and tm.set_priority(tokens_for(256, 53), 3) == 1 and tm.persist(toks) == 1
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.clear(other) == 1
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=other) as tm:
        assert tm.lookup(toks).tokens == 0 and tm.status()["pinned_chunks"] == 0 and not tm._meta


def test_managers_sharing_a_directory_merge_their_pins(tmp_path, kv):
    """Two managers on one SSD directory (e.g. two engine processes): each one's pins and
    priorities are merged into the file, so neither overwrites the other's, and a chunk's
    setting is the last one written by either; clear() drops them all."""
    a, b, c = (tokens_for(256, s) for s in (30, 31, 32))
    opts = dict(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS)
    with TierManager(**opts) as first, TierManager(**opts) as second:
        assert first.pin(a) == 1
        assert second.set_priority(b, 5) == 1 and second.pin(c) == 1  # second never saw a's pin
        assert first.unpin(c) == 1  # the latest change to c wins, whoever made it
        assert second.set_priority(b, 5) == 1  # repeated: nothing lost
    with TierManager(**opts) as tm:
        meta = {t[0]: tm._meta.get(tm.keys(t)[0].digest) for t in (a, b, c)}
        assert meta[a[0]].pinned and meta[b[0]].priority == 5
        assert meta[c[0]] is None or not meta[c[0]].pinned
        assert tm.status()["pinned_chunks"] == 1
        with TierManager(**opts) as other:
            other.pin(c)
        tm.clear()  # the namespace is emptied: every process's settings go
    with TierManager(**opts) as tm:
        assert tm.status()["pinned_chunks"] == 0 and not tm._meta


def test_pins_persist_on_a_filesystem_without_flock(tmp_path, kv, monkeypatch):
    """Where flock fails (some network filesystems), pins are still saved for one process."""
    import errno

    from kvcore.tiers import hot_cold

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(hot_cold.fcntl, "flock", no_flock)
    a = tokens_for(256, 45)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.pin(a) == 1
        assert tm.status()["tiers"]["ssd"]["errors"] == 0
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        assert tm.status()["pinned_chunks"] == 1


def test_a_pin_made_by_another_process_holds_here_too(tmp_path, kv):
    """Managers sharing an SSD directory take in each other's pins while running: the
    chunk another manager pinned is pulled into this one's DDR and is not evicted from
    it; its unpin is taken in too."""
    a, b, c = (tokens_for(256, s) for s in (40, 41, 42))
    one = kv[:, :, :256]
    opts = dict(ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS, hot_refresh_s=0.05)
    with TierManager(ddr_bytes=64 << 20, **opts) as writer:
        for t in (a, b, c):
            writer.store(t, one)
        writer.flush()
        assert all(writer.persist(t) == 1 for t in (a, b, c))
        cap = int(chunk_blob_bytes(writer) * 2.5)
    with TierManager(ddr_bytes=cap, **opts) as here, TierManager(ddr_bytes=64 << 20, **opts) as there:
        assert here.lookup(a).tiers == ["ssd"]
        there.pin(a)
        wait_until(lambda: here.lookup(a).tiers == ["ddr"])
        assert here.lookup(a).tiers == ["ddr"]  # pulled in without a call here
        for t in (b, c, b, c):  # DDR holds two chunks: a stays, b and c take turns
            out = torch.zeros_like(one)
            assert here.retrieve(t, out) == 256 and same(out, one)
            here.flush()
        assert here.lookup(a).tiers == ["ddr"]
        there.unpin(a)
        wait_until(lambda: not here._meta[here.keys(a)[0].digest].pinned)
        assert not here._meta[here.keys(a)[0].digest].pinned
        assert here.status()["pinned_chunks"] == 0


def test_settings_of_evicted_chunks_are_dropped(kv, monkeypatch):
    """Chunks stored with a TTL into a DDR that holds two leave no settings behind once
    evicted (a long-running server would grow without bound); pins stay, and the chunks
    still held keep their TTL."""
    import kvcore.tiers.manager as manager

    monkeypatch.setattr(manager, "META_SLACK", 0)
    one = kv[:, :, :256]
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as probe:
        probe.store(tokens_for(256, 50), one)
        probe.flush()
        cap = int(chunk_blob_bytes(probe) * 2.5)
    with TierManager(ddr_bytes=cap, namespace=NS, ttl_s=3600, hot_refresh_s=0.05) as tm:
        pinned = tokens_for(256, 51)
        tm.pin(pinned)
        for s in range(60, 80):
            tm.store(tokens_for(256, s), one)
            tm.flush()
        wait_until(lambda: len(tm._meta) <= 5)
        assert len(tm._meta) <= 5  # the pin, and at most the chunks held (with their TTLs)
        assert tm._meta[tm.keys(pinned)[0].digest].pinned
        last = tm.keys(tokens_for(256, 79))[0].digest
        assert last in tm.ddr and tm._meta[last].expires > time.time()


def test_pinned_allocator_defers_free_while_exported():
    from kvcore.tiers.ddr import PinnedPoolAllocator

    page = 4096  # blocks are whole pages (size classes)
    pool = _FakePool(100 * page)
    a = PinnedPoolAllocator(100 * page, pool=pool)
    b = a.alloc(60 * page)
    held = b.view[:10]  # e.g. a network send still holding the memory
    b.free()
    assert a.used_bytes == 60 * page and pool.live == 60 * page
    with pytest.raises(kvcore.PoolExhausted):
        a.alloc(60 * page)
    held.release()
    c = a.alloc(60 * page - 5)  # the deferred block went back first
    assert a.used_bytes == 60 * page and pool.live == 60 * page and len(c.view) == 60 * page - 5
    c.free()
    assert a.used_bytes == 0 and pool.live == 0


def test_pinned_blocks_of_nearly_equal_size_reuse_each_others_holes():
    """Chunks a page apart share a size class: evicting the oldest always makes room for the
    next (with exact sizes, a block one page larger than its hole needs a second eviction)."""
    from kvcore.tiers.ddr import PinnedPoolAllocator, size_class

    a = PinnedPoolAllocator(8 << 20, pool=kvcore.PinnedPool(8 << 20, huge_pages=False))
    sizes = [2_000_000] * 4 + [2_004_096] * 8  # the next chunks one page larger
    assert len({size_class(n) for n in sizes}) == 1
    live, held = [], []
    for n in sizes:
        while True:
            try:
                live.append(a.alloc(n))
                break
            except kvcore.PoolExhausted:
                live.pop(0).free()  # the oldest
        held.append(len(live))
    assert held == [1, 2, 3] + [4] * 9  # never a block short (exact sizes: 3 for a while)


def test_manager_over_pool_allocator(tmp_path, kv):
    """The DDR tier over a pool whose blocks refuse free() while exported (PinnedPool semantics)."""
    from kvcore.tiers.ddr import PinnedPoolAllocator

    cap = 6 << 20
    alloc = PinnedPoolAllocator(cap, pool=_FakePool(cap))
    toks = tokens_for(1024, 17)
    with TierManager(ddr_bytes=cap, allocator=alloc, ssd_dir=str(tmp_path), ssd_bytes=1 << 30,
                     namespace=NS) as tm:
        assert tm.status()["allocator"] == "pinned"
        tm.store(toks, kv)
        tm.flush()
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        assert alloc.pool.live <= cap and alloc.used_bytes <= cap


@pytest.mark.skipif(not hasattr(kvcore, "PinnedPool"), reason="kvcore.PinnedPool is not in this build yet")
def test_manager_over_real_pinned_pool(kv):
    toks = tokens_for(512, 18)
    with TierManager(ddr_bytes=32 << 20, allocator="pinned", namespace=NS) as tm:
        assert tm.status()["allocator"] == "pinned"
        tm.store(toks, kv[:, :, :512])
        tm.flush()
        out = torch.zeros_like(kv[:, :, :512])
        assert tm.retrieve(toks, out) == 512 and same(out, kv[:, :, :512])
        assert tm.evict(count=2) == 2


def test_store_queue_is_bounded(kv):
    """Back-pressure: chunks waiting for the worker never exceed the queue bound (+ the one
    being encoded + the one the caller is handing over)."""
    toks = tokens_for(1024, 19)
    with TierManager(ddr_bytes=64 << 20, namespace=NS, queue_chunks=1) as tm:
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], len(tm._pending))
                time.sleep(0.0002)

        w = threading.Thread(target=watch)
        w.start()
        for s in range(3):
            tm.store(tokens_for(1024, 50 + s), kv)
        tm.flush()
        stop.set()
        w.join()
        assert 1 <= peak[0] <= 3
        assert tm.status()["queue"]["capacity"] == 1 and tm.lookup(toks).tokens == 0


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_corrupt_ssd_chunk_mid_prefix(tmp_path, kv, read_ahead):
    """A damaged file in the middle of a prefix: the chunks before it are restored, it is a
    miss (counted, removed), nothing raises."""
    toks = tokens_for(1024, 20)
    with TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS,
                     read_ahead=read_ahead) as tm:
        tm.store(toks, kv)
        tm.flush()
        path = tm.ssd.entry(tm.keys(toks)[2].digest).path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(data)
        out = torch.zeros_like(kv)
        assert tm.retrieve(toks, out) == 512
        assert same(out[:, :, :512], kv[:, :, :512])
        assert not path.exists() and tm.status()["tiers"]["ssd"]["corrupt"] == 1
        assert tm.lookup(toks).tokens == 512


def test_two_managers_share_one_ssd_directory(tmp_path, kv):
    """Engines on one machine (e.g. data-parallel replicas) share a prefix cache on one SSD
    directory: what one stores the other restores, within one capacity."""
    toks, other = tokens_for(1024, 7), tokens_for(1024, 8)
    cap = 12 << 20  # the first prompt's four chunks fit, not both prompts' eight
    a = TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=cap, namespace=NS)
    b = TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=cap, namespace=NS)
    with a, b:
        a.store(toks[:512], kv[:, :, :512])
        assert a.flush(30)
        assert b.lookup(toks).tiers == ["ssd", "ssd"]
        assert b.store(toks, kv) == 2  # a's two chunks are not written again
        assert b.flush(30)
        for tm in (a, b):
            out = torch.zeros_like(kv)
            assert tm.retrieve(toks, out) == 1024 and same(out, kv)
        b.store(other, kv)
        assert b.flush(30)
        files = sum(p.stat().st_size for p in tmp_path.rglob("*.kvc"))
        assert files <= cap and files == a.ssd.used_bytes == b.ssd.used_bytes
        assert b.status()["tiers"]["ssd"]["evictions"] >= 1
        assert a.lookup(other).tokens == 1024  # the newest prompt stays whole


def test_a_lookup_finds_a_chunk_the_worker_moves_from_the_queue_into_ddr(kv, monkeypatch):
    """The worker puts a stored chunk into DDR, then takes it off the queue: a lookup that
    looked in DDR just before and among the queued chunks just after found it in neither
    (test_pending_chunks_are_retrievable could fail so on a loaded machine)."""
    from kvcore.tiers.ddr import DDRTier

    toks = tokens_for(256, 61)
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        gate = threading.Event()
        try:
            tm._put(("call", gate.wait, [], threading.Event()))  # the store stays queued until the gate opens
            assert tm.store(toks, kv[:, :, :256]) == 1
            key = tm.keys(toks)[0].digest
            contains = DDRTier.__contains__

            def looked_in_ddr(ddr, k):
                found = contains(ddr, k)
                if k == key and threading.current_thread() is threading.main_thread() and not gate.is_set():
                    gate.set()  # the worker places the chunk now, between the lookup's two looks
                    wait_until(lambda: key not in tm._pending, 1.0)  # at once, unless the lookup holds it off
                return found

            monkeypatch.setattr(DDRTier, "__contains__", looked_in_ddr)
            hit = tm.lookup(toks)
        finally:
            gate.set()
        assert hit.tokens == 256 and hit.tiers in (["pending"], ["ddr"])


def test_status_while_another_thread_changes_the_settings(kv):
    """status() counts the pinned chunks while other threads store with a TTL, pin or set
    priorities: an unlocked walk over the settings raised (the dict changed size under it)."""
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        other = threading.Thread(target=tm.set_ttl, args=(tokens_for(256, 62), 60))

        class Probe:  # a setting whose pin is read in the middle of status()'s walk
            priority, expires, start, ntokens = 0, 0.0, -1, 0

            @property
            def pinned(self):
                if threading.current_thread() is threading.main_thread() and other.ident is None:
                    other.start()  # another thread adds a setting now
                    other.join(1.0)  # at once, unless the walk holds it off
                return False

            def expired(self, now):
                return False

        tm._meta[bytes(16)] = Probe()
        assert tm.status()["pinned_chunks"] == 0
        other.join()
        assert len(tm._meta) == 2


def test_retrieve_reads_ahead_no_chunk_the_worker_is_placing(tmp_path, kv, monkeypatch):
    """retrieve() reads ahead only the chunks in neither DDR nor the store queue. Looked at
    without the lock, a chunk the worker moved from the queue into DDR in between was in
    neither: read from SSD too early (a miss), and once DDR demoted it to SSD, that miss
    ended the restore although the chunk was stored all along."""
    from kvcore.tiers.ddr import DDRTier

    toks = tokens_for(512, 63)
    with TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS) as tm:
        tm.store(toks[:256], kv[:, :, :256])
        assert tm.flush(30) and tm.evict(count=1) == 1 and tm.lookup(toks[:256]).tiers == ["ssd"]
        gate, demoted = threading.Event(), threading.Event()
        try:
            tm._put(("call", gate.wait, [], threading.Event()))  # the second chunk stays queued
            assert tm.store(toks, kv[:, :, :512]) == 1
            second = tm.keys(toks)[1].digest
            contains, fetch_below, stream_from_ssd = DDRTier.__contains__, tm._fetch_below, tm._stream_from_ssd

            def looked_in_ddr(ddr, k):
                found = contains(ddr, k)
                if k == second and threading.current_thread() is threading.main_thread() and not gate.is_set():
                    gate.set()  # the worker places the second chunk into DDR now
                    wait_until(lambda: second not in tm._pending, 1.0)  # at once, unless held off
                return found

            def fetch_then_demote(ck):
                got = fetch_below(ck)
                if ck.digest == second:
                    tm.evict(count=1)  # DDR pressure moves it to SSD after the early read
                    demoted.set()
                return got

            def stream_after_demotion(ck, out):
                demoted.wait(1.0)  # the first chunk decodes once that happened (if it does)
                return stream_from_ssd(ck, out)

            monkeypatch.setattr(DDRTier, "__contains__", looked_in_ddr)
            monkeypatch.setattr(tm, "_fetch_below", fetch_then_demote)
            monkeypatch.setattr(tm, "_stream_from_ssd", stream_after_demotion)
            out = torch.zeros_like(kv[:, :, :512])
            restored = tm.retrieve(toks, out)
        finally:
            gate.set()
        assert restored == 512 and same(out, kv[:, :, :512])


def test_a_close_that_runs_out_of_time_releases_a_queued_ssd_commit(tmp_path, kv):
    """close() that runs out of time cancels the jobs still queued for the writer thread. A
    chunk streamed to SSD whose commit was among them kept its temporary file, its
    reservation (so the tier never left the shared directory, and others counted it), its
    write slot and its queue entry."""
    from kvcore.tiers.ssd import SSDTier
    from tiers_support import leftover_temporaries

    toks = tokens_for(256, 64)
    tm = TierManager(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS)
    gate = threading.Event()
    try:
        tm._writer.submit(gate.wait)  # the writer thread is busy: the commit queues behind
        assert tm.store(toks, kv[:, :, :256]) == 1
        tm._call_in_worker(lambda: None, 30)  # the store job ran: its commit is queued
        assert tm.ssd._own_reserved and leftover_temporaries(tmp_path)  # streamed, not committed
        assert not tm.close(timeout=0)  # the writer is busy: its queued jobs are cancelled
    finally:
        gate.set()
    assert not leftover_temporaries(tmp_path) and not tm._pending
    assert tm._writes.acquire(blocking=False) and tm._writes.acquire(blocking=False)
    assert not list((tmp_path / "kvcore-v1" / "owners").iterdir())  # the tier left the directory
    assert SSDTier(tmp_path, 1 << 30).used_bytes == 0


def test_a_close_that_runs_out_of_time_releases_a_queued_write(tmp_path, kv):
    """As above, for a chunk encoded into DDR and queued to be written below (write-through):
    the cancelled job kept its write slot, its queue entry and its hold on the DDR block."""
    toks = tokens_for(256, 65)
    tm = TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30, namespace=NS,
                     write_through=True)
    gate = threading.Event()
    try:
        tm._writer.submit(gate.wait)  # the writer thread is busy: the write queues behind
        assert tm.store(toks, kv[:, :, :256]) == 1
        tm._call_in_worker(lambda: None, 30)  # the store job ran: its write is queued
        key = tm.keys(toks)[0].digest
        assert tm.ddr.get(key).readers == 1 and key in tm._pending
        assert not tm.close(timeout=0)  # the writer is busy: its queued jobs are cancelled
    finally:
        gate.set()
    assert not tm._pending and tm.ddr.get(key).readers == 0
    assert tm._writes.acquire(blocking=False) and tm._writes.acquire(blocking=False)
    assert not list((tmp_path / "kvcore-v1" / "owners").iterdir())


def test_write_through_chunks_do_not_wait_for_their_parents_write_below(tmp_path, kv):
    """With write_through every chunk is placed in DDR and handed to the writer thread, so
    each is still queued when the next one's job runs; a chunk whose parent is in DDR is
    placed whatever the parent's write below does, and must not wait for the writer (that
    would serialise encoding and writing, the pipeline write_through relies on)."""
    toks = tokens_for(1024, 81)
    with TierManager(ddr_bytes=64 << 20, allocator="bytes", ssd_dir=str(tmp_path), ssd_bytes=64 << 20,
                     write_through=True, namespace=NS) as tm:
        drains = []
        drain = tm._drain_writer
        tm._drain_writer = lambda *a, **k: (drains.append(threading.current_thread().name), drain(*a, **k))[1]
        busy = threading.Event()
        tm._writer.submit(busy.wait, 30)  # every write below waits: the parents stay queued
        try:
            assert tm.store(toks, kv[:, :, :1024]) == 4
            wait_until(lambda: len(tm.ddr) == 4)  # all four placed while no write below ran
            assert drains == []
        finally:
            busy.set()
        assert tm.flush(30)
        assert tm.lookup(toks).tokens == 1024 and len(tm.ssd) == 4

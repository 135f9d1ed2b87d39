"""Tier manager throughput per tier, side by side with LMCache 0.5.6 in the same run.

One chunk = 256 tokens of a Qwen3-8B-shaped KV cache (36 layers x 2 x 8 KV heads x 128
dims, bf16, 37.7 MB) built from the real values in ../shared/kvdata. Throughput is GB/s
of original (uncompressed) KV bytes. LMCache is benchmark-only: its part is skipped
when ``import lmcache`` fails. To include it (in a separate environment that sees the
system packages, so that kvcore's own environment stays clean)::

    python -m venv --system-site-packages /tmp/lmc && . /tmp/lmc/bin/activate
    pip install --no-deps lmcache==0.5.6
    pip install numba prometheus_client psutil aiohttp cachetools transformers aiofile msgspec pyzmq

LMCache runs in a child process per backend (its engine shutdown can hang with a Redis
backend: the child is killed after 10 s and the hang is reported). Its disk and redis://
backends take commands from the kvcore SSD / remote tests, so that their rounds alternate
with kvcore's (a shared machine's disk and CPU load change from second to second). Run:

    python -m pytest -q bench/test_tiers_bench.py -s

The summary test prints the kvcore/LMCache ratios and checks the issue's targets.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from kvbench import QWEN_CHUNK_SHAPE, qwen_chunk
from kvcore.bench.data import kvdata_dir
from kvcore.tiers import Namespace, RemoteConfig, TierManager

ROOT = Path(__file__).resolve().parent.parent
KVDATA = kvdata_dir()
L, _, T, H, D = QWEN_CHUNK_SHAPE
CHUNK_BYTES = L * 2 * T * H * D * 2
ROUNDS = 4
RESULTS: dict = {}


# ---------------------------------------------------------------------------- data
def toks(i: int) -> list:
    return [(i * 1_000_003 + k * 7919) % 151_936 for k in range(T)]


@pytest.fixture(scope="module")
def chunk():
    return qwen_chunk()


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def record(system: str, tier: str, op: str, value: float, **extra) -> None:
    RESULTS.setdefault(system, {}).setdefault(tier, {})[op] = round(value, 4)
    for k, v in extra.items():
        RESULTS[system][tier][k] = v


def drop_cache(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ---------------------------------------------------------------------------- redis
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url():
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    d = tempfile.mkdtemp()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    p.kill()
    p.wait()
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------- kvcore
def _kvcore_store(tm, chunk, first: int, n: int) -> float:
    """Best seconds to store one chunk until it is placed (durable for SSD), over n chunks."""
    best = float("inf")
    for i in range(first, first + n):
        t0 = time.perf_counter()
        tm.store(toks(i), chunk, copy=False)
        tm.flush()
        best = min(best, time.perf_counter() - t0)
    return best


def _kvcore_retrieve(tm, chunk, first: int, n: int, before=None, out=None) -> float:
    """Seconds spent in retrieve() alone (into a reused, already-touched out)."""
    out = torch.zeros_like(chunk) if out is None else out
    total = 0.0
    for i in range(first, first + n):
        if before:
            before()
        t0 = time.perf_counter()
        got = tm.retrieve(toks(i), out)
        total += time.perf_counter() - t0
        assert got == T
    assert torch.equal(out.view(torch.int16), chunk.view(torch.int16))
    return total


def _timed(benchmark, fn) -> float:
    """Runs fn ROUNDS times under pytest-benchmark; returns the best of fn's own timings
    (the machine is shared: the best run is the least disturbed one, for both systems)."""
    times = []
    benchmark.pedantic(lambda: times.append(fn()), rounds=ROUNDS, iterations=1)
    return min(times)


@pytest.mark.parametrize("codec", ["auto", "dense"])
def test_kvcore_ddr(chunk, benchmark, codec):
    tier = "ddr" if codec == "auto" else f"ddr_{codec}"
    tm = TierManager(ddr_bytes=2 << 30, namespace=Namespace("qwen3-8b", "bfloat16"), codec=codec)
    st = _kvcore_store(tm, chunk, 0, ROUNDS)
    out = torch.zeros_like(chunk)
    rt = _timed(benchmark, lambda: _kvcore_retrieve(tm, chunk, 0, 1, out=out))
    ratio = tm.status()["compression_ratio"]
    record("kvcore", tier, "store_GBps", gbps(CHUNK_BYTES, st))
    record("kvcore", tier, "retrieve_GBps", gbps(CHUNK_BYTES, rt), codec=tm.codec.name, ratio=round(ratio, 4))
    benchmark.extra_info.update(RESULTS["kvcore"][tier])
    tm.close()


SEQ_CHUNKS = 4


def test_kvcore_ddr_sequence(chunk, benchmark):
    """A 4-chunk prefix restored into one [layers, 2, 1024, heads, dim] out, whole and layer by
    layer: each chunk decodes into its token range of out (runs at one stride) directly."""
    kv = torch.cat([qwen_chunk(i) for i in range(SEQ_CHUNKS)], dim=2)
    seq = [t for i in range(SEQ_CHUNKS) for t in toks(200 + i)]
    tm = TierManager(ddr_bytes=2 << 30, namespace=Namespace("qwen3-8b", "bfloat16"))
    tm.store(seq, kv, copy=False)
    tm.flush()
    out = torch.zeros_like(kv)

    def timed(**kw) -> float:
        t0 = time.perf_counter()
        assert tm.retrieve(seq, out, **kw) == SEQ_CHUNKS * T
        return time.perf_counter() - t0

    whole = _timed(benchmark, timed)
    by_layer = min(timed(on_layer=lambda layer: None) for _ in range(ROUNDS))
    assert torch.equal(out.view(torch.int16), kv.view(torch.int16))
    record("kvcore", "ddr", "retrieve_4_chunks_GBps", gbps(SEQ_CHUNKS * CHUNK_BYTES, whole))
    record("kvcore", "ddr", "retrieve_4_chunks_by_layer_GBps", gbps(SEQ_CHUNKS * CHUNK_BYTES, by_layer))
    tm.close()


MANY_SEQUENCES, MANY_CHUNKS, MANY_TOKENS = 2560, 16, 16  # 40,960 small chunks in DDR


@pytest.mark.parametrize("policy", ["lru", "cost"])
def test_kvcore_ddr_eviction_with_many_chunks(benchmark, policy):
    """Choosing DDR victims with 40,960 chunks held (2,560 sequences of 16 chunks of 16
    tokens, bf16 [1, 2, 16, 1, 8] random values, raw codec), every chunk with a TTL (its
    expiry is one of the eviction levels): evict(count=1) on a full DDR, and the store of
    a 16-chunk sequence into it (16 victims chosen). Victims come from the policy's
    ordered leaves, not a sort of every chunk (docs/TIERS.md, Policies)."""
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(1, 2, MANY_CHUNKS * MANY_TOKENS, 1, 8, generator=gen).to(torch.bfloat16)
    seqs = [[(i * 1_000_003 + k * 7919) % 151_936 for k in range(MANY_CHUNKS * MANY_TOKENS)]
            for i in range(MANY_SEQUENCES + ROUNDS)]
    with TierManager(ddr_bytes=1 << 30, chunk_tokens=MANY_TOKENS, namespace="many", codec="raw",
                     allocator="bytes", policy=policy, ttl_s=3600) as tm:
        for seq in seqs[:MANY_SEQUENCES]:
            tm.store(seq, kv)
        assert tm.flush(600) and len(tm.ddr.entries) == MANY_SEQUENCES * MANY_CHUNKS
        tm.ddr.allocator.capacity_bytes = tm.ddr.allocator.used_bytes  # full from here on

        def evict_one() -> float:
            t0 = time.perf_counter()
            assert tm.evict(count=1) == 1
            return time.perf_counter() - t0

        def store_one(seq) -> float:
            t0 = time.perf_counter()
            tm.store(seq, kv)
            assert tm.flush(60)
            return time.perf_counter() - t0

        evict_s = _timed(benchmark, evict_one)
        store_s = min(store_one(seq) for seq in seqs[MANY_SEQUENCES:])
    record("kvcore", f"ddr_{policy}_40960_chunks", "evict_one_ms", evict_s * 1e3)
    record("kvcore", f"ddr_{policy}_40960_chunks", "store_16_chunks_full_ms", store_s * 1e3)


@pytest.mark.parametrize("codec", ["auto", "dense"])
def test_kvcore_ddr_density(chunk, codec):
    tier = "ddr" if codec == "auto" else f"ddr_{codec}"
    cap = int(CHUNK_BYTES * 6.5)  # LMCache's CPU tier holds 6 raw chunks in these bytes
    tm = TierManager(ddr_bytes=cap, namespace=Namespace("qwen3-8b", "bfloat16"), codec=codec)
    for i in range(12):
        tm.store(toks(100 + i), qwen_chunk(i), copy=False)
    tm.flush()
    held = sum(tm.lookup(toks(100 + i)).tiers == ["ddr"] for i in range(12))
    record("kvcore", tier, "chunks_in_6.5_raw_chunk_bytes", held)
    assert tm.ddr.allocator.used_bytes <= cap
    tm.close()


def _interleaved_stores(tm, chunk, lmc, *, sync: bool = False) -> float:
    """Best seconds of kvcore to store one chunk until placed (durable for SSD), over
    ROUNDS chunks; LMCache (when given) stores the same chunk right after each."""
    best = float("inf")
    for i in range(ROUNDS):
        best = min(best, _kvcore_store(tm, chunk, i, 1))
        if lmc is not None:
            lmc.run("store", i)
            if sync:
                # LMCache's disk store returns with its data still in the page cache; let
                # the write-back finish (untimed) so that it does not run during, and slow
                # down, kvcore's next durable store on the same disk.
                os.sync()
    return best


def _interleaved_retrieves(benchmark, tm, chunk, lmc, before=None) -> float:
    """Best seconds of kvcore to retrieve chunk 0 (before() ahead of each, untimed);
    LMCache (when given) retrieves one of its chunks right after each round."""
    out = torch.zeros_like(chunk)
    rounds = iter(range(1 << 20))

    def one_round() -> float:
        t = _kvcore_retrieve(tm, chunk, 0, 1, before=before, out=out)
        if lmc is not None:
            lmc.run("retrieve", next(rounds) % ROUNDS)
        return t

    return _timed(benchmark, one_round)


def _record_lmcache(tier: str, lmc, retrieve_key: str) -> None:
    if lmc is None:
        return
    _record_all(tier, {"store_GBps": lmc.best_gbps("store"), retrieve_key: lmc.best_gbps("retrieve"),
                       "close_s": lmc.close_s if lmc.close_s is not None else "hung (>10 s, killed)",
                       "measured": "interleaved with kvcore's rounds"})


def test_kvcore_ssd(chunk, benchmark, tmp_path):
    """kvcore's SSD tier; LMCache's disk backend (when importable) in alternate rounds."""
    tm = TierManager(ddr_bytes=0, ssd_dir=str(tmp_path / "kvcore"), ssd_bytes=4 << 30, promote_on_hit=False,
                     namespace=Namespace("qwen3-8b", "bfloat16"))
    (tmp_path / "lmcache").mkdir()
    lmc = _lmcache_child("disk", str(tmp_path / "lmcache"))
    try:
        st = _interleaved_stores(tm, chunk, lmc, sync=True)  # kvcore durable: fsync, rename, dir fsync
        record("kvcore", "ssd", "store_fsync_GBps", gbps(CHUNK_BYTES, st))
        rt = _interleaved_retrieves(benchmark, tm, chunk, lmc, before=tm.ssd.drop_page_cache)  # LMCache's too
    finally:
        if lmc is not None:
            lmc.close()
    _record_lmcache("disk", lmc, "retrieve_cold_GBps")
    record("kvcore", "ssd", "retrieve_cold_GBps", gbps(CHUNK_BYTES, rt),
           direct_io=tm.ssd._direct_ok)
    # the SSD read path alone: O_DIRECT vs page-cache reads, cold
    key = tm.keys(toks(0))[0].digest
    size = tm.ssd.entry(key).size
    for direct in (True, False):
        t = float("inf")
        for _ in range(ROUNDS):
            tm.ssd.drop_page_cache()
            t0 = time.perf_counter()
            v = tm.ssd.read(key, direct=direct, scratch=tm._scratch)
            t = min(t, time.perf_counter() - t0)
            assert v is not None
            tm._scratch.put(v.obj)
        record("kvcore", "ssd", f"read_cold_{'direct' if direct else 'buffered'}_GBps", gbps(size, t))
    t = float("inf")
    tm._scratch.put(tm.ssd.read(key, direct=False, scratch=tm._scratch).obj)
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        v = tm.ssd.read(key, direct=False, scratch=tm._scratch)
        t = min(t, time.perf_counter() - t0)
        tm._scratch.put(v.obj)
    record("kvcore", "ssd", "read_warm_buffered_GBps", gbps(size, t))
    benchmark.extra_info.update(RESULTS["kvcore"]["ssd"])
    tm.close()


def test_kvcore_remote(chunk, benchmark, redis_url):
    """kvcore's remote tier; LMCache's redis:// backend (when importable, same server) in
    alternate rounds."""
    tm = TierManager(ddr_bytes=0, remote_url=redis_url, promote_on_hit=False,
                     namespace=Namespace("qwen3-8b", "bfloat16"))
    lmc = _lmcache_child("remote", redis_url)
    try:
        st = _interleaved_stores(tm, chunk, lmc)
        rt = _interleaved_retrieves(benchmark, tm, chunk, lmc)
    finally:
        if lmc is not None:
            lmc.close()
    _record_lmcache("redis", lmc, "retrieve_GBps")
    record("kvcore", "remote", "store_GBps", gbps(CHUNK_BYTES, st))
    record("kvcore", "remote", "retrieve_GBps", gbps(CHUNK_BYTES, rt))
    # close() with the server dead
    dead = TierManager(ddr_bytes=0, remote_url=f"redis://127.0.0.1:{_free_port()}",
                       remote=RemoteConfig(), namespace="x")
    dead.store(toks(5), chunk)
    t0 = time.perf_counter()
    dead.close()
    record("kvcore", "remote", "close_dead_server_s", time.perf_counter() - t0)
    benchmark.extra_info.update(RESULTS["kvcore"]["remote"])
    tm.close()


# ---------------------------------------------------------------------------- LMCache
_LMCACHE_CHILD = r'''
import json, os, sys, time, threading, torch
sys.path.insert(0, sys.argv[1])
from test_tiers_bench import qwen_chunk, toks, drop_cache, CHUNK_BYTES, L, H, D, T, ROUNDS
from pathlib import Path
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

class CopyConnector(GPUConnectorInterface):
    """LMCache's GPU connector, with CPU tensors standing in for GPU memory."""
    def from_gpu(self, obj, start, end, **kw):
        n = end - start
        obj.tensor.view(2, L, n, H, D).copy_(kw["kvcaches"][:, :, start:end].transpose(0, 1))
    def to_gpu(self, obj, start, end, **kw):
        n = end - start
        kw["kvcaches"][:, :, start:end].copy_(obj.tensor.view(2, L, n, H, D).transpose(0, 1))
    def batched_from_gpu(self, objs, starts, ends, **kw):
        for o, s, e in zip(objs, starts, ends): self.from_gpu(o, s, e, **kw)
    def batched_to_gpu(self, objs, starts, ends, **kw):
        for o, s, e in zip(objs, starts, ends): self.to_gpu(o, s, e, **kw)
    def get_shape(self, n):
        return torch.Size([2, L, n, H * D])

kind, arg = sys.argv[2], sys.argv[3]
chunk = qwen_chunk()
opts = dict(chunk_size=256, save_unfull_chunk=True)
if kind == "cpu":
    opts.update(local_cpu=True, max_local_cpu_size=float(arg))
elif kind == "disk":
    opts.update(local_cpu=False, max_local_cpu_size=0.5, local_disk=f"file://{arg}/", max_local_disk_size=4.0)
else:
    opts.update(local_cpu=False, max_local_cpu_size=0.5, remote_url=arg, remote_serde="naive")
cfg = LMCacheEngineConfig.from_defaults(**opts)
meta = LMCacheMetadata(model_name="qwen3-8b", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                       kv_dtype=torch.bfloat16, kv_shape=(L, 2, T, H, D))
eng = LMCacheEngineBuilder.get_or_create("bench", cfg, meta, CopyConnector(), None, None)
eng.post_init()
res = {}
def present(i):
    return eng.lookup(torch.tensor(toks(i))) == T
if len(sys.argv) > 4 and sys.argv[4] == "serve":  # commands from the parent, one per line
    out = torch.zeros_like(chunk)
    print("READY", flush=True)
    for line in sys.stdin:
        op, i = line.split()
        i = int(i)
        if op == "store":  # one chunk, until the backend has it
            t0 = time.perf_counter()
            eng.store(torch.tensor(toks(i)), kvcaches=chunk)
            deadline = time.monotonic() + 60
            while not present(i) and time.monotonic() < deadline:
                time.sleep(0.0005)
            print("T %.9f" % (time.perf_counter() - t0), flush=True)
        elif op == "retrieve":
            if kind == "disk":
                drop_cache(Path(arg))
            t0 = time.perf_counter()
            mask = eng.retrieve(torch.tensor(toks(i)), kvcaches=out)
            dt = time.perf_counter() - t0
            assert int(mask.sum()) == T, int(mask.sum())
            assert torch.equal(out.view(torch.int16), chunk.view(torch.int16))
            print("T %.9f" % dt, flush=True)
        else:
            break
elif kind == "cpu" and float(arg) < 1.0:  # density: how many chunks fit
    for i in range(12):
        eng.store(torch.tensor(toks(100 + i)), kvcaches=qwen_chunk(i))
    time.sleep(0.5)
    res["chunks_held"] = sum(present(100 + i) for i in range(12))
else:
    best = float("inf")
    for i in range(ROUNDS):  # one chunk at a time, until the backend has it
        t0 = time.perf_counter()
        eng.store(torch.tensor(toks(i)), kvcaches=chunk)
        deadline = time.monotonic() + 60
        while not present(i) and time.monotonic() < deadline:
            time.sleep(0.0005)
        best = min(best, time.perf_counter() - t0)
    res["store_GBps"] = CHUNK_BYTES / best / 1e9
    out = torch.zeros_like(chunk)
    best = float("inf")
    for i in range(ROUNDS):
        if kind == "disk":
            drop_cache(Path(arg))
        t0 = time.perf_counter()
        mask = eng.retrieve(torch.tensor(toks(i)), kvcaches=out)
        best = min(best, time.perf_counter() - t0)
        assert int(mask.sum()) == T, int(mask.sum())
    assert torch.equal(out.view(torch.int16), chunk.view(torch.int16))
    res["retrieve_GBps" if kind != "disk" else "retrieve_cold_GBps"] = CHUNK_BYTES / best / 1e9
print("RESULT " + json.dumps(res), flush=True)
t0 = time.perf_counter()
LMCacheEngineBuilder.destroy("bench")
print("CLOSED %.3f" % (time.perf_counter() - t0), flush=True)
os._exit(0)
'''


def _lmcache_python() -> str | None:
    """An interpreter that can import lmcache: this one, else LMCACHE_PYTHON... none: skip."""
    import importlib.util
    import sys

    if importlib.util.find_spec("lmcache") is not None:
        return sys.executable
    return None


def _run_lmcache(kind: str, arg: str, timeout: float = 240.0) -> dict:
    py = _lmcache_python()
    if py is None:
        pytest.skip("lmcache is not importable (benchmark-only: pip install --no-deps lmcache==0.5.6 ...)")
    p = subprocess.Popen([py, "-c", _LMCACHE_CHILD, str(Path(__file__).parent), kind, arg],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                         start_new_session=True)
    res: dict = {}
    t_end = time.monotonic() + timeout
    closed = None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    close_deadline = None
    while True:
        now = time.monotonic()
        limit = close_deadline if close_deadline else t_end
        if now >= limit:
            break
        if not sel.select(timeout=limit - now):
            continue
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            close_deadline = time.monotonic() + 10.0  # shutdown gets 10 s
        elif line.startswith("CLOSED "):
            closed = float(line.split()[1])
            break
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    if not res:
        pytest.fail(f"LMCache {kind} run produced no result")
    res["close_s"] = closed if closed is not None else "hung (>10 s, killed)"
    return res


class LMCacheChild:
    """An LMCache engine in a child process that stores and retrieves on command, so that
    its rounds interleave with kvcore's: both see the same moments of a shared machine
    (disk and CPU load change from one second to the next)."""

    def __init__(self, kind: str, arg: str):
        py = _lmcache_python()
        if py is None:
            raise RuntimeError("lmcache is not importable")
        self.p = subprocess.Popen([py, "-c", _LMCACHE_CHILD, str(Path(__file__).parent), kind, arg, "serve"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, cwd=ROOT, start_new_session=True)
        self.times: dict = {"store": [], "retrieve": []}
        self.close_s = None
        self._expect("READY", 240.0)

    def _line(self, timeout: float) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout):
            raise TimeoutError("LMCache child did not answer")
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("LMCache child exited")
        return line

    def _expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self._line(max(0.0, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line

    def run(self, op: str, i: int) -> float:
        self.p.stdin.write(f"{op} {i}\n")
        self.p.stdin.flush()
        dt = float(self._expect("T ", 120.0).split()[1])
        self.times[op].append(dt)
        return dt

    def close(self) -> None:
        """Asks the engine to shut down; one that has not closed after 10 s is killed."""
        try:
            self.p.stdin.write("quit 0\n")
            self.p.stdin.flush()
            self._expect("RESULT", 30.0)
            self.close_s = float(self._expect("CLOSED ", 10.0).split()[1])
        except (TimeoutError, RuntimeError, OSError, ValueError):
            self.close_s = None
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def best_gbps(self, op: str) -> float:
        return gbps(CHUNK_BYTES, min(self.times[op]))


def _lmcache_child(kind: str, arg: str):
    """A served LMCache child, or None when lmcache is not importable."""
    return LMCacheChild(kind, arg) if _lmcache_python() is not None else None


def _record_all(tier: str, res: dict) -> None:
    RESULTS.setdefault("lmcache", {}).setdefault(tier, {}).update(
        {k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()})


def test_lmcache_cpu():
    _record_all("cpu", _run_lmcache("cpu", "2.0"))
    held = _run_lmcache("cpu", str(CHUNK_BYTES * 6.5 / 1e9))["chunks_held"]
    _record_all("cpu", {"chunks_in_6.5_raw_chunk_bytes": held})


# LMCache's disk and redis:// backends are measured by test_kvcore_ssd / test_kvcore_remote,
# in rounds alternating with kvcore's (LMCacheChild).


# ---------------------------------------------------------------------------- agent workload
def _agent_replay(codec: str, capacity: int, kv: torch.Tensor, sessions: int, turns: int) -> dict:
    """Sessions share a system prompt + tool descriptions (6 chunks) and each grows its own
    history by one chunk per turn; every request restores its context, then stores it."""
    import random

    rng = random.Random(7)
    shared = [rng.randrange(151_936) for _ in range(6 * T)]
    hist = [[rng.randrange(151_936) for _ in range(turns * T)] for _ in range(sessions)]
    tm = TierManager(ddr_bytes=capacity, codec=codec, namespace=Namespace("minilm-agent", "bfloat16"))
    out = torch.zeros_like(kv)
    hits = potential = 0
    for t in range(turns):
        for s in range(sessions):
            ctx = shared + hist[s][: t * T]
            if t or s:
                potential += len(ctx)  # everything in ctx was stored by an earlier request
            hits += tm.retrieve(ctx, out)
            full = ctx + hist[s][t * T:(t + 1) * T]
            tm.store(full, kv[:, :, : len(full)], copy=False)
            tm.flush()
    st = tm.status()
    ddr = st["tiers"]["ddr"]
    tm.close()
    return {"hit_rate": round(hits / potential, 4), "bytes_in_MB": round(ddr["bytes_in"] / 1e6, 1),
            "bytes_out_MB": round(ddr["bytes_out"] / 1e6, 1), "ratio": round(st["compression_ratio"], 4),
            "codec": st["codec"]}


def test_agent_workload():
    """Hit rate, bytes moved and sessions that fit, DDR capacity 10%..100% of the working set,
    with and without compression (real MiniLM KV, 2.36 MB per 256-token chunk)."""
    from safetensors.torch import load_file

    path = KVDATA / "minilm_l6_kv_bf16.safetensors"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    d = load_file(str(path))
    kv = torch.stack([torch.stack([d[f"layer{i}.k"], d[f"layer{i}.v"]]) for i in range(6)])[:, :, :3072]
    kv = kv.contiguous()
    sessions, turns = 12, 3
    chunk_raw = kv[:, :, :T].numel() * 2
    working_set = (6 + sessions * turns) * chunk_raw
    rows = []
    for frac in (0.1, 0.25, 0.5, 1.0):
        cap = int(working_set * frac)
        row = {"capacity_pct": int(frac * 100)}
        for label, codec in (("raw", "raw"), ("compressed", "auto")):
            r = _agent_replay(codec, cap, kv, sessions, turns)
            row[label] = r
            # sessions whose whole context (shared chunks stored once) fits in the capacity
            per_chunk = chunk_raw * r["ratio"]
            row[label]["sessions_fit"] = max(0, int((cap - 6 * per_chunk) // (turns * per_chunk)))
        row["more_sessions_fit_x"] = round(row["compressed"]["sessions_fit"] / max(1, row["raw"]["sessions_fit"]), 3)
        rows.append(row)
    RESULTS["agent_workload"] = {"sessions": sessions, "turns": turns, "chunk_raw_MB": round(chunk_raw / 1e6, 3),
                                 "working_set_MB": round(working_set / 1e6, 1), "rows": rows}
    for row in rows:
        assert row["compressed"]["hit_rate"] >= row["raw"]["hit_rate"] - 0.02
    assert rows[-1]["raw"]["hit_rate"] > 0.99  # everything fits at 100%


# ---------------------------------------------------------------------------- summary
def test_summary_ratios():
    """Prints every measurement and the kvcore/LMCache ratios; checks the issue's targets."""
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "tiers_bench.json").write_text(json.dumps(RESULTS, indent=1))
    print("\n" + json.dumps(RESULTS, indent=1))
    k, m = RESULTS.get("kvcore", {}), RESULTS.get("lmcache", {})
    if not k or not m:
        pytest.skip("needs both the kvcore and the LMCache measurements of this run")
    pairs = {  # name: (kvcore tier, kvcore field, LMCache tier, LMCache field)
        "ssd_store_fsync_vs_lmcache_disk_store": ("ssd", "store_fsync_GBps", "disk", "store_GBps"),
        "ssd_cold_retrieve_vs_lmcache_disk": ("ssd", "retrieve_cold_GBps", "disk", "retrieve_cold_GBps"),
        "remote_retrieve_vs_lmcache_redis": ("remote", "retrieve_GBps", "redis", "retrieve_GBps"),
        "remote_store_vs_lmcache_redis": ("remote", "store_GBps", "redis", "store_GBps"),
        "ddr_chunks_vs_lmcache_cpu": ("ddr", "chunks_in_6.5_raw_chunk_bytes", "cpu", "chunks_in_6.5_raw_chunk_bytes"),
        "ddr_retrieve_vs_lmcache_cpu": ("ddr", "retrieve_GBps", "cpu", "retrieve_GBps"),
        # the dense codec mode, for information
        "ddr_dense_chunks_vs_lmcache_cpu": ("ddr_dense", "chunks_in_6.5_raw_chunk_bytes", "cpu",
                                            "chunks_in_6.5_raw_chunk_bytes"),
        "ddr_dense_retrieve_vs_lmcache_cpu": ("ddr_dense", "retrieve_GBps", "cpu", "retrieve_GBps"),
    }
    # a narrower selection (-k) gives the ratios of what it measured
    ratios = {n: k[a][f] / max(1, m[b][g]) if g.startswith("chunks") else k[a][f] / m[b][g]
              for n, (a, f, b, g) in pairs.items() if f in k.get(a, {}) and g in m.get(b, {})}
    targets = {"ssd_store_fsync_vs_lmcache_disk_store": 1.0, "ssd_cold_retrieve_vs_lmcache_disk": 1.3,
               "remote_retrieve_vs_lmcache_redis": 2.0, "ddr_chunks_vs_lmcache_cpu": 1.45,
               "ddr_retrieve_vs_lmcache_cpu": 0.5}
    RESULTS["ratios"] = {n: round(v, 3) for n, v in ratios.items()}
    # A target whose two sides were not both measured (no redis-server, a -k selection) is
    # named, not passed over as if met.
    RESULTS["targets_not_measured"] = sorted(set(targets) - set(ratios))
    (out / "tiers_bench.json").write_text(json.dumps(RESULTS, indent=1))
    print(json.dumps({k: RESULTS[k] for k in ("ratios", "targets_not_measured")}, indent=1))
    missed = {n: (round(ratios[n], 3), t) for n, t in targets.items() if n in ratios and ratios[n] < t}
    if "close_dead_server_s" in k.get("remote", {}):
        assert k["remote"]["close_dead_server_s"] < 5.0
    assert not missed, f"targets missed (ratio, target): {missed}"

"""TierManager: where each KV chunk lives (DDR -> SSD -> remote) and getting it back fast.

>>> import tempfile, torch, kvcore
>>> kv = torch.randn(2, 2, 512, 4, 16).to(torch.bfloat16)   # [layers, K/V, tokens, heads, dim]
>>> tokens = list(range(512))
>>> with kvcore.TierManager(ddr_bytes=64 << 20, ssd_dir=tempfile.mkdtemp(), ssd_bytes=64 << 20) as tm:
...     n = tm.store(tokens, kv)          # returns at once; encoding runs in the background
...     _ = tm.flush()
...     hit = tm.lookup(tokens + [7, 7])
...     out = torch.empty_like(kv)
...     restored = tm.retrieve(tokens, out)
>>> hit.tokens, hit.tiers, restored, torch.equal(out, kv)
(512, ['ddr', 'ddr'], 512, True)
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import torch

from .._args import decoder_arg, int_arg, optional_int_arg, optional_seconds_arg, seconds_arg, wait_seconds
from ..errors import IOError as KVIOError
from ..errors import InvalidArgumentError, PoolExhausted
from .blob import (BlobHeader, blob_bound, check_kv, decode_into, decode_layers_into, encode_chunk,
                   encode_chunk_into, host_copy)
from .codecs import Codec, make_codec
from .ddr import DDRTier, footprint, make_allocator
from .hot_cold import HotCold, HotColdFile
from .keys import ChunkKey, Namespace, NamespaceLike, as_namespace, chunk_keys
from .metrics import Metrics
from .policy import MAX_PRIORITY, LevelIndex, is_priority, make_policy
from .remote import RemoteConfig, RemoteTier, redact_url
from .ssd import ScratchPool, SSDTier

log = logging.getLogger("kvcore.tiers")

TIERS = ("ddr", "ssd", "remote")


@dataclass
class TierConfig:
    """Everything a TierManager needs, as one explicit object.

    ddr_bytes: DDR capacity (compressed bytes); ssd_dir / ssd_bytes: SSD tier (off when
    ssd_dir is None or ssd_bytes is 0); remote_url: Redis/Valkey url (off when None),
    remote: its details (timeouts, TTL, cluster); chunk_tokens: tokens per chunk (a
    multiple of the engine's block size); namespace: a Namespace or a model id;
    policy: "lru" or "cost"; codec: "auto", "dense", "fast", "max" or "raw"; codec_decoder:
    "any", or "avx512" when every machine that reads the store has AVX-512 VBMI2 (dense and
    max frames that decode faster there, see kvcore.compress); allocator: "auto"
    (PinnedPool when built), "pinned", "bytes" or an Allocator object; queue_chunks: store queue bound
    (back-pressure); store_partial: also store the shorter last chunk;
    promote_on_hit: copy SSD/remote hits into DDR; demote_on_pressure: DDR victims go
    to SSD (else remote) instead of being dropped; write_through: every stored chunk
    also goes to SSD and remote at once; ttl_s: default per-entry TTL; direct_io,
    fsync: SSD options; read_ahead: chunks retrieve() reads from SSD/remote ahead of
    the one it decodes (0: none); frame_bytes: original bytes per coded frame (layers
    are grouped up to it: fewer codec calls; smaller = finer layer-by-layer restore);
    hot_refresh_s: how often the background worker looks for pins and priorities that
    other processes sharing the SSD directory changed (one stat of the pins file) and
    drops the settings of chunks no longer held.
    """

    ddr_bytes: int
    ssd_dir: Optional[str] = None
    ssd_bytes: int = 0
    remote_url: Optional[str] = None
    chunk_tokens: int = 256
    namespace: NamespaceLike = "default"
    policy: str = "lru"
    codec: str = "auto"
    codec_threads: Optional[int] = None
    codec_decoder: str = "any"
    allocator: object = "auto"  # "auto" | "pinned" | "bytes" | an Allocator (kvcore.tiers.ddr)
    queue_chunks: int = 4
    store_partial: bool = True
    promote_on_hit: bool = True
    demote_on_pressure: bool = True
    write_through: bool = False
    ttl_s: Optional[float] = None
    direct_io: Union[bool, str] = "auto"  # O_DIRECT where the filesystem allows it
    fsync: bool = True
    read_ahead: int = 2
    frame_bytes: int = 4 << 20
    remote: Optional[RemoteConfig] = None
    hot_refresh_s: float = 1.0

    def validate(self) -> None:
        int_arg(self.ddr_bytes, "ddr_bytes")
        int_arg(self.ssd_bytes, "ssd_bytes")
        int_arg(self.chunk_tokens, "chunk_tokens", 1)
        int_arg(self.queue_chunks, "queue_chunks", 1)
        int_arg(self.read_ahead, "read_ahead")
        int_arg(self.frame_bytes, "frame_bytes", 1)
        optional_seconds_arg(self.ttl_s, "ttl_s")
        decoder_arg(self.codec_decoder)
        seconds_arg(self.hot_refresh_s, "hot_refresh_s")
        if self.remote_url is not None and (not isinstance(self.remote_url, str) or not self.remote_url):
            raise InvalidArgumentError(f"remote_url must be a non-empty string, got {self.remote_url!r}")
        if self.remote is not None:
            if not isinstance(self.remote, RemoteConfig):
                raise InvalidArgumentError(f"remote must be a RemoteConfig, got {type(self.remote).__name__}")
            self.remote.validate()


@dataclass
class Hit:
    """The longest stored prefix: how many tokens, and the tier of each chunk."""

    tokens: int
    tiers: list = field(default_factory=list)
    chunks: list = field(default_factory=list)  # ChunkKey of each found chunk

    def __bool__(self) -> bool:
        return self.tokens > 0


@dataclass
class RestorePlan:
    """Per chunk of the stored prefix: its tier, estimated restore and recompute seconds."""

    tokens: int  # leading tokens worth restoring
    chunks: list = field(default_factory=list)  # dicts: tier, ntokens, restore_s, recompute_s, restore


@dataclass
class _Meta:
    pinned: bool = False
    priority: int = 0
    expires: float = 0.0  # time.time(); 0 = never
    start: int = -1  # the chunk's place in its sequence, once pin / set_priority named it
    ntokens: int = 0

    def expired(self, now: float) -> bool:
        return bool(self.expires) and now >= self.expires


# A TTL longer than this never expires (about 31.7 million years): a later expiry does not
# fit an SSD file name's 64-bit milliseconds, nor Redis' PX (now + PX below 2**63 ms).
MAX_TTL_S = 1e15


def _expiry(ttl: Optional[float], name: str) -> float:
    """The time.time() at which a chunk given ttl seconds from now expires (0: never)."""
    ttl = optional_seconds_arg(ttl, name)
    return time.time() + ttl if ttl is not None and ttl <= MAX_TTL_S else 0.0


def _ttl_left(expires: float) -> Optional[float]:
    """The remote TTL of a chunk that expires at expires (None: none given, the remote
    tier's default)."""
    return max(0.001, expires - time.time()) if expires else None


# A store of chunks already stored moves their expiry (and their copies' below) only when
# its TTL moves it by more than this fraction of the TTL: an engine that stores every
# request's prefix with one TTL renames files and sends Redis commands about once per
# 1% of the TTL, not at every store.
EXPIRY_SLACK = 0.01


# Keys of chunks whose store ended placed in no tier, remembered (the latest ones) so that
# a chunk that extends one is not placed either (TierManager._prefix_lost).
UNPLACED_KEPT = 4096

# Settings entries (TTL, pin, priority) kept beyond twice the chunks held before
# _prune_meta looks for ones to drop.
META_SLACK = 1024

# Default bandwidth guesses (bytes/s) until measured.
_DEFAULT_BW = {"ddr": 8e9, "ssd": 1.5e9, "remote": 0.5e9, "decode": 1.5e9, "pending": 5e9}


def _holds(ck: ChunkKey, header: BlobHeader) -> bool:
    """Whether a blob's header is ck's chunk: its key, and the place and token count that
    key stands for (a blob that claims ck's key with fewer tokens would restore only those
    while the chunk counted as restored whole)."""
    return header.key == ck.digest and header.index == ck.index and header.ntokens == ck.ntokens


def _checked_header(ck: ChunkKey, blob) -> BlobHeader:
    """The header of a fetched blob, which must be the one stored under ck's key."""
    header = BlobHeader.parse(blob)
    if not _holds(ck, header):
        raise InvalidArgumentError("stored chunk does not match its key")
    return header


def _check_raw_out(data: torch.Tensor, out: torch.Tensor) -> None:
    """A queued chunk's raw copy restores only into an out its blob would (blob._check_out):
    copy_() would convert another dtype and broadcast a chunk of one layer over many."""
    if out.shape[:2] != data.shape[:2] or out.shape[3:] != data.shape[3:]:
        raise InvalidArgumentError(f"out {tuple(out.shape)} does not match the stored chunk "
                                   f"[{data.shape[0]}, {data.shape[1]}, *, {data.shape[3]}, {data.shape[4]}]")
    if out.dtype != data.dtype:
        raise InvalidArgumentError(f"out dtype {out.dtype} differs from the stored {data.dtype}")


# Chunks of one store() call the worker asks Redis about at once (RemoteTier.holds_whole reads
# up to 16 KiB of each, and the length of each part): a look bounded in size, each within
# lookup_timeout_s. One look for all of a long store's chunks ran past that bound (1,024 held
# chunks took about 0.4 s on a local server, docs/TIERS.md) and so opened the breaker.
PROBE_CHUNKS = 64


class _RemoteProbe:
    """Which queued chunks of one store() call Redis holds already, whole (another instance
    or an earlier run stored them). Asked by the worker's store jobs, PROBE_CHUNKS chunks at
    a time from the first one not yet asked about: RemoteTier.holds_whole (each value's
    header and part lengths, not its body), bounded by lookup_timeout_s; a slow or
    unreachable server holds none (the chunks are stored as usual). Used on the worker
    thread only."""

    def __init__(self, chunks: list[ChunkKey]):
        self.chunks = chunks
        self._place = {ck.digest: i for i, ck in enumerate(chunks)}
        self._asked = 0  # chunks[:_asked] have been asked about
        self._held: set = set()
        self.found: list = []  # the keys held() answered True for: not sent again

    def held(self, remote: RemoteTier, ns_tag: str, key: bytes) -> bool:
        i = self._place.get(key)
        if i is None:
            return False
        if i >= self._asked:  # (the jobs come in the call's order)
            batch = self.chunks[i:i + PROBE_CHUNKS]
            claims = [(ck.digest, ck.index, ck.ntokens) for ck in batch]
            self._held.update(ck.digest for ck, there in zip(batch, remote.holds_whole(ns_tag, claims)) if there)
            self._asked = i + len(batch)
        if key in self._held:
            self.found.append(key)
            return True
        return False


class TierManager:
    """Keeps KV chunks in compressed DDR, a local SSD directory and Redis/Valkey.

    See TierConfig for the options; keyword arguments build one, or pass ``config=``.
    """

    def __init__(self, *, config: Optional[TierConfig] = None, **options):
        unknown = sorted(set(options) - {f.name for f in fields(TierConfig)})
        if unknown:
            raise InvalidArgumentError(f"unknown TierManager option(s) {', '.join(unknown)}; see TierConfig")
        if config is None:
            if "ddr_bytes" not in options:
                raise InvalidArgumentError("TierManager needs ddr_bytes (or config=TierConfig(...))")
            config = TierConfig(**options)
        elif options:
            config = replace(config, **options)
        config.validate()
        self.config = config
        self.namespace: Namespace = as_namespace(config.namespace)
        self._ns_tag = self.namespace.tag
        self.chunk_tokens = config.chunk_tokens
        self.metrics = Metrics()
        self.codec: Codec = make_codec(config.codec, config.codec_threads, config.codec_decoder)
        self._lock = threading.RLock()
        self._meta: dict[bytes, _Meta] = {}
        self._pending: dict[bytes, tuple] = {}  # key -> (ChunkKey, raw tensor)
        self._unplaced: OrderedDict[bytes, None] = OrderedDict()  # see UNPLACED_KEPT
        self._bw = dict(_DEFAULT_BW)
        if config.codec == "raw" or self.codec.code == 0:
            self._bw["decode"] = 5e9
        self._bytes_per_token = 0.0  # raw bytes per token of the chunks seen
        self._ratio_seen = 1.0

        self.ddr = DDRTier(make_allocator(config.ddr_bytes, config.allocator))
        self.ddr_policy = make_policy(config.policy)
        self._levels = LevelIndex(self._settings_of)  # priorities and expiries, for eviction
        # The remote tier first: it may refuse its url, and the SSD tier joins a shared
        # directory that a half-built manager would not leave.
        self.remote: Optional[RemoteTier] = None
        if config.remote_url is not None or config.remote is not None:
            rc = config.remote or RemoteConfig()
            if config.remote_url is not None:
                rc = replace(rc, url=config.remote_url)
            self.remote = RemoteTier(rc, metrics=self.metrics)
        self.ssd: Optional[SSDTier] = None
        if config.ssd_dir is not None and config.ssd_bytes > 0:
            try:
                self.ssd = SSDTier(config.ssd_dir, config.ssd_bytes, direct_io=config.direct_io,
                                   fsync=config.fsync, policy=make_policy(config.policy), metrics=self.metrics,
                                   evictable=self._ssd_evictable, levels=self._levels.current,
                                   on_evict=self._ssd_evicted)
            except OSError as e:
                raise KVIOError(f"cannot use ssd_dir {config.ssd_dir!r}: {e}") from e
        # pins and priorities outlive the process beside the SSD tier (hot_cold.py)
        self._hot = HotColdFile(config.ssd_dir, self._ns_tag) if self.ssd is not None else None
        self._hot_lock = threading.Lock()
        self._hot_saved: dict[bytes, HotCold] = {}  # the file's entries, as this manager last saw them
        pinned = self._take_in_hot(self._hot.load()) if self._hot is not None else []
        if self._hot is not None and self._hot.damaged:
            log.warning("kvcore: ignoring the unreadable pins file %s", self._hot.path)
            self.metrics.inc("ssd", "errors")
        self._scratch = ScratchPool(keep=max(2, config.queue_chunks) + config.read_ahead)
        self._writer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvcore-write")
        self._writes = threading.BoundedSemaphore(2)  # staged chunks being written: bounded memory
        self._stream_io = cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvcore-stream")
        self._io = cf.ThreadPoolExecutor(max_workers=max(1, config.read_ahead), thread_name_prefix="kvcore-read")
        self.metrics.set_gauges(self._gauges)

        self._queue: "queue.Queue" = queue.Queue(maxsize=config.queue_chunks)
        self._closed = False
        self._geometry: Optional[tuple[int, int, int]] = None  # (layers, kv_heads, head_dim) of the first store
        self._worker = threading.Thread(target=self._work, name="kvcore-tiers", daemon=True)
        self._worker.start()
        if pinned:
            self._put(("prefetch", pinned), block=False)  # pinned chunks belong in DDR

    # ------------------------------------------------------------------ keys
    def keys(self, tokens: Sequence[int]) -> list[ChunkKey]:
        """The chunk keys of tokens in this manager's namespace."""
        return chunk_keys(tokens, self.namespace, self.chunk_tokens)

    def _keys_for(self, tokens) -> list[ChunkKey]:
        return chunk_keys(tokens, self.namespace, self.chunk_tokens)

    # ------------------------------------------------------------------ meta
    def _meta_of(self, key: bytes) -> Optional[_Meta]:
        return self._meta.get(key)

    def _expired(self, key: bytes, now: Optional[float] = None) -> bool:
        m = self._meta.get(key)
        return m is not None and m.expired(now or time.time())

    def _pinned(self, key: bytes) -> bool:
        m = self._meta.get(key)
        return m is not None and m.pinned

    def _ddr_evictable(self, key: bytes) -> bool:
        e = self.ddr.get(key)
        return not self._pinned(key) and (e is None or e.readers == 0)

    def _ssd_evictable(self, key: bytes) -> bool:
        return not self._pinned(key) or key in self.ddr

    def _settings_of(self, key: bytes) -> Optional[tuple[int, float]]:
        """(priority, expiry) of key, for the LevelIndex (read without the lock: the SSD
        tier's eviction asks under its own lock)."""
        m = self._meta.get(key)
        return (m.priority, m.expires) if m is not None else None

    # ------------------------------------------------------------------ store
    def store(self, tokens: Sequence[int], kv: torch.Tensor, *, ttl: Optional[float] = None,
              copy: bool = True) -> int:
        """Queues the chunks of ``tokens`` (K/V in ``kv[:, :, :len(tokens)]``) for storing.

        Returns the number of chunks queued (chunks already in DDR, queued or on SSD are
        skipped). Each queued chunk goes into DDR when it fits there, else below; one the
        worker finds whole in Redis (stored by another instance or an earlier run; one look
        per PROBE_CHUNKS chunks, each at most lookup_timeout_s, on the worker; not with
        write_through) is not written below again (a pinned one is, to SSD, when DDR cannot
        hold it), and gets the TTL a send would have given it. A chunk whose parent is in
        no tier is not placed (counted as rejected).
        A ttl moves the expiry of chunks already stored, in every tier (their data is not
        written again; see EXPIRY_SLACK). Returns
        as soon as they are queued; blocks only while the bounded queue is full. With
        copy=False the caller promises not to modify kv until flush(). kv may live on a
        GPU: each chunk is then copied to pinned host memory on the current stream
        before this returns (compression runs in the background, on the host copy).
        ttl: seconds until the chunks expire (default: the config's ttl_s; none, or more
        than MAX_TTL_S: never).
        """
        t0 = time.perf_counter()
        self._check_open()
        check_kv(kv, host=False)
        expires = _expiry(ttl if ttl is not None else self.config.ttl_s, "ttl")
        keys = self._keys_for(tokens)
        if kv.shape[2] < (keys[-1].end if keys else 0):
            raise InvalidArgumentError(f"kv holds {kv.shape[2]} tokens, fewer than the {len(tokens)} given")
        self._check_same_model(kv)  # last: a store refused for another reason sets no geometry
        if not self.config.store_partial and keys and keys[-1].ntokens < self.chunk_tokens:
            keys = keys[:-1]
        todo: list[ChunkKey] = []
        retimed: list[bytes] = []  # stored already, under another expiry: their copies below take this one
        for ck in keys:
            with self._lock:
                moved = self._store_ttl(ck.digest, expires)
                if self._needs_store(ck):
                    todo.append(ck)
                elif moved:
                    retimed.append(ck.digest)
        # write_through asks for a copy in every tier: no chunk is skipped for Redis holding it
        ask_remote = self.remote is not None and todo and not self.config.write_through
        probe = _RemoteProbe(todo) if ask_remote else None
        queued = 0
        for ck in todo:
            part = kv[:, :, ck.start:ck.end]
            if copy or part.device.type != "cpu":  # outside the lock: 38 MB copies take a while
                part = host_copy(part)
            with self._lock:
                if not self._needs_store(ck):
                    continue
                self._store_ttl(ck.digest, expires)  # again with _pending: _prune_meta may have run meanwhile
                self._pending[ck.digest] = (ck, part)
                self._unplaced.pop(ck.digest, None)  # its fate is to be decided again
            self._put(("store", ck, part, expires, probe))
            queued += 1
        if retimed or probe is not None:  # after the stores: their writes land first
            self._put(("expire", retimed, probe, expires))
        # Chunk 0 the most recent, the last chunk the least: a prefix lookup cannot use a
        # chunk whose predecessor left, so a sequence must lose its tail first (the
        # chunks were added or touched from chunk 0 on). After the queued ones are placed.
        last_first = [ck.digest for ck in reversed(keys)]
        if queued:
            self._put(("arrange", last_first))
        else:
            self._job_arrange(last_first)
        self.metrics.observe("store", time.perf_counter() - t0)
        return queued

    def _check_same_model(self, kv: torch.Tensor) -> None:
        """A namespace is one model's KV: a store of another dtype than the namespace names,
        or of other (layers, kv_heads, head_dim) than this manager's first store, would put
        chunks under its keys that no retrieve of this model could use."""
        named = getattr(torch, self.namespace.dtype.removeprefix("torch."), None) if self.namespace.dtype else None
        if isinstance(named, torch.dtype) and kv.dtype != named:
            raise InvalidArgumentError(f"kv is {kv.dtype}, but the namespace's dtype is {self.namespace.dtype!r}")
        geometry = (kv.shape[0], kv.shape[3], kv.shape[4])
        with self._lock:
            if self._geometry is None:
                self._geometry = geometry
        if geometry != self._geometry:
            raise InvalidArgumentError(
                f"kv has (layers, kv_heads, head_dim) {geometry}, but this manager stores {self._geometry}")

    def _store_ttl(self, key: bytes, expires: float) -> bool:
        """Gives a stored chunk the expiry of a store (0: none, its own stays; lock held).
        True when that moved it (see EXPIRY_SLACK): the chunk's copies below, if any, are
        to take it too."""
        m = self._meta.get(key)
        if expires:
            if m is not None and m.expires and abs(expires - m.expires) <= EXPIRY_SLACK * (expires - time.time()):
                return False
            self._meta.setdefault(key, _Meta()).expires = expires
            return True
        if m is not None and m.expired(time.time()):
            m.expires = 0.0  # stored again without a TTL: no longer expired (its old copies are gone)
        return False

    def _prune_meta(self) -> None:
        """Drops the settings of chunks this process no longer holds: not pinned, no
        priority, in neither DDR, the store queue nor SSD (a remote copy keeps its own
        TTL). Without this, every chunk stored with a TTL and then evicted would leave
        its entry behind: growth without bound in a long-running server. Runs on the
        worker's refresh tick, only once the entries outnumber the chunks held."""
        held = len(self.ddr.entries) + len(self._pending) + (len(self.ssd.index) if self.ssd is not None else 0)
        if len(self._meta) <= 2 * held + META_SLACK:
            return
        ssd_index = self.ssd.index if self.ssd is not None else {}
        with self._lock:
            gone = [k for k, m in self._meta.items() if not m.pinned and not m.priority and k not in self.ddr
                    and k not in self._pending and k not in ssd_index]
            for k in gone:
                del self._meta[k]

    def _needs_store(self, ck: ChunkKey) -> bool:
        """False when the chunk is queued or stored already (lock held); touches it in DDR."""
        if ck.digest in self._pending:
            return False
        if ck.digest in self.ddr and not self._expired(ck.digest):
            self.ddr_policy.touch(ck.digest)
            return False
        if self.ssd is not None and self.ssd.contains(ck.digest) and not self._expired(ck.digest):
            return False
        return True

    def _put(self, job, block: bool = True) -> bool:
        if not block:
            try:
                self._queue.put_nowait(job)
                return True
            except queue.Full:
                return False
        while True:
            if not self._worker.is_alive():
                raise InvalidArgumentError("the TierManager worker has stopped (closed?)")
            try:
                self._queue.put(job, timeout=0.5)
                return True
            except queue.Full:
                continue

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        refresh_at = time.monotonic() + wait_seconds(self.config.hot_refresh_s)
        while True:
            try:
                job = self._queue.get(timeout=max(0.0, refresh_at - time.monotonic()))
            except queue.Empty:
                job = ()
            if time.monotonic() >= refresh_at:
                self._refresh_hot()
                self._prune_meta()
                refresh_at = time.monotonic() + wait_seconds(self.config.hot_refresh_s)
            if job == ():
                continue
            try:
                if job is None:
                    return
                getattr(self, "_job_" + job[0])(*job[1:])
            except Exception:  # background work must never die
                log.exception("kvcore tier worker: %s failed", job[0] if job else job)
                self.metrics.inc("manager", "errors")
            finally:
                self._queue.task_done()

    def _job_flush(self, event: threading.Event) -> None:
        self._drain_writer()
        event.set()

    def _job_arrange(self, keys: list) -> None:
        """Puts keys, in this order, at the recent end of DDR's order; their expiries (a
        store sets them) go to the eviction levels."""
        with self._lock:
            self.ddr_policy.arrange(keys)
        self._levels.note(keys)

    def _job_call(self, fn: Callable, box: list, event: threading.Event) -> None:
        try:
            box.append(fn())
        finally:
            event.set()

    def _job_store(self, ck: ChunkKey, part: torch.Tensor, expires: float,
                   probe: Optional["_RemoteProbe"] = None) -> None:
        t0 = time.perf_counter()
        handed_off = False
        try:
            if self._expired(ck.digest):  # expired while queued
                self._note_unplaced(ck.digest)
                return
            if self._prefix_lost(ck):
                self._rejected(ck.digest)
                return
            # A chunk Redis holds whole goes into DDR as any stored chunk does, but is not
            # written below again; one that would only go below is not even encoded. (A ttl
            # reaches its Redis copy through _job_expire.) A pinned one is kept here: on SSD
            # when DDR cannot hold it, where the pin keeps it (_ssd_evictable).
            held = probe is not None and probe.held(self.remote, self._ns_tag, ck.digest)
            remote_only = held and not (self.ssd is not None and self._pinned(ck.digest))
            if remote_only and self._expected_below(part):
                return
            handed_off = (self._stream_store(ck, part, expires, t0)
                          or self._encode_store(ck, part, expires, t0, below=not remote_only))
        finally:
            if not handed_off:
                with self._lock:
                    self._pending.pop(ck.digest, None)

    def _prefix_lost(self, ck: ChunkKey) -> bool:
        """Whether ck's parent is in no tier, so that a prefix lookup, which stops at the
        parent, would never reach ck: ck would hold room for nothing. The parent is in
        neither DDR, the store queue nor SSD, and either there is no tier below or its own
        store ended placed nowhere (it did not fit, or expired while queued: _unplaced).
        Asked by the worker before ck is placed (the queue is FIFO: a parent queued before
        ck has been placed, handed to the writer thread or dropped by now), and by the
        writer thread before ck is written below (its parent's write is done by then)."""
        if ck.parent is None:
            return False
        with self._lock:
            if ck.parent in self.ddr or ck.parent in self._pending:
                return False
            if self.ssd is None and self.remote is None:
                return True
            return ck.parent in self._unplaced and not (self.ssd is not None and ck.parent in self.ssd.index)

    def _parent_being_written(self, ck: ChunkKey) -> bool:
        """Whether ck's parent, not in DDR, is still queued when ck's own job runs: the worker
        has handed it to the writer thread (the queue is FIFO), where its write below may yet
        fail. (A write-through parent is in DDR too: placed, whatever its write below does,
        so its child does not wait for the writer.)"""
        with self._lock:
            return ck.parent is not None and ck.parent in self._pending and ck.parent not in self.ddr

    def _note_unplaced(self, key: bytes) -> None:
        """key's store ended placed in no tier (see UNPLACED_KEPT)."""
        with self._lock:
            self._unplaced[key] = None
            self._unplaced.move_to_end(key)
            if len(self._unplaced) > UNPLACED_KEPT:
                self._unplaced.popitem(last=False)

    def _rejected(self, key: bytes) -> None:
        """A queued chunk placed nowhere: it did not fit, or its prefix is in no tier."""
        self.metrics.inc("ddr", "rejected")
        self._note_unplaced(key)

    def _job_expire(self, retimed: list, probe: Optional["_RemoteProbe"], expires: float) -> None:
        """A store's expiry for its chunks stored already under another one (retimed) and
        for those the worker found in Redis: set below on the writer thread, after the
        writes queued before. A chunk found in Redis gets the TTL the store would have sent
        it with (without a ttl: the remote tier's default), as the send it saved would have:
        a chunk that one instance keeps storing does not expire in Redis under it."""
        found = probe.found if probe is not None else []
        if retimed or found:
            # (found chunks are on no SSD here; retimed ones only exist with an expiry)
            self._submit_write(lambda: None, self._set_expiry_below, retimed + found, expires, bool(retimed))

    def _set_expiry_below(self, keys: list, expires: float, on_ssd: bool = True) -> None:
        """Gives the SSD (unless on_ssd is False) and remote copies of keys the expiry
        expires (0: none) without moving their data: SSD files are renamed, Redis values
        get a new TTL (none: the remote tier's default)."""
        try:
            if self.ssd is not None and on_ssd:
                for key in keys:
                    self.ssd.set_expiry(key, int(expires * 1000))
            if self.remote is not None:
                self.remote.set_expiry(self._ns_tag, keys, ttl_s=_ttl_left(expires))
        except Exception:  # a new expiry is never worth the caller (nor the writer thread)
            log.exception("kvcore: setting the expiry of stored chunks failed")
            self.metrics.inc("manager", "errors")

    def _note_encoded(self, ck: ChunkKey, raw: int, nbytes: int, t0: float) -> None:
        self.metrics.add_encoded(raw, nbytes)
        self._ratio_seen = self.metrics.compression_ratio
        self._bytes_per_token = raw / max(1, ck.ntokens)
        self.metrics.observe("encode", time.perf_counter() - t0)
        if raw:
            self._bw["encode"] = raw / max(1e-9, time.perf_counter() - t0)

    def _expected_below(self, part: torch.Tensor) -> bool:
        """Whether a chunk of part's size is not expected to fit in DDR (at the compression
        ratio seen so far): it would go below."""
        return self.ddr.capacity_bytes < part.numel() * part.element_size() * self._ratio_seen

    def _encode_store(self, ck: ChunkKey, part: torch.Tensor, expires: float, t0: float, *,
                      below: bool = True) -> bool:
        """Encodes into DDR (or a staging buffer when it does not fit there, then written
        below unless below is False; rejected when there is no tier below). True when the
        blob was handed to the writer thread."""
        holder: dict = {}
        try:
            view = encode_chunk(part, self.codec, key=ck.digest, index=ck.index,
                                alloc=lambda n: self._alloc_blob(n, holder, ck),
                                frame_bytes=self.config.frame_bytes)
        except BaseException:
            if "block" in holder:
                holder["block"].free()
            raise
        self._note_encoded(ck, part.numel() * part.element_size(), view.nbytes, t0)
        block = holder.get("block")
        if block is not None and self._parent_being_written(ck):
            self._drain_writer()  # the parent's write below lands, or fails, first
            if self._prefix_lost(ck):
                block.free()
                self._rejected(ck.digest)
                return False
        if block is None and not below:  # Redis holds it whole
            self._scratch.put(view.obj)
            return False
        if block is None and self.ssd is None and self.remote is None:
            # Nowhere to go: rejected here, not on the writer thread, where it would stay
            # queued meanwhile and its child's _prefix_lost would take it for placed.
            self._rejected(ck.digest)
            self._scratch.put(view.obj)
            return False
        with self._lock:
            if block is not None:
                self.ddr.insert(ck.digest, block, view.nbytes)
                self.ddr_policy.add(ck.digest, size=view.nbytes, start=ck.start, ntokens=ck.ntokens,
                                    parent=ck.parent)
                self._levels.note([ck.digest])
                self.metrics.inc("ddr", "stores")
                self.metrics.inc("ddr", "bytes_in", view.nbytes)
        if block is None or self.config.write_through:
            # Did not fit in DDR (or write-through): place it below, on the writer
            # thread, so that the next chunk encodes while this one is written.
            entry = None
            if block is not None:
                with self._lock:
                    entry = self.ddr.acquire(ck.digest)  # not freed while being written
            self._writes.acquire()
            self._submit_write(lambda: self._write_done(ck, view, block is None, entry, still_read=False),
                               self._write_job, ck, view, expires, block is None, entry)
            return True
        return False

    def _stream_store(self, ck: ChunkKey, part: torch.Tensor, expires: float, t0: float) -> bool:
        """A chunk that is not expected to fit in DDR goes straight to SSD: it is encoded
        frame by frame into a staging buffer whose finished part is written to the file
        while later frames encode (SSDTier.begin_write); the writer thread then makes the
        file durable. False: not this path (no SSD, write-through, a codec without
        encode_into, or expected to fit in DDR); the caller encodes it as usual."""
        if self.ssd is None or self.config.write_through or not hasattr(self.codec, "encode_into"):
            return False
        raw = part.numel() * part.element_size()
        if not self._expected_below(part):
            return False
        bound = blob_bound(part, self.codec, self.config.frame_bytes)
        if self._ratio_seen < 1.0:  # expected size, with a margin; commit() settles the rest
            reserve = min(bound, int(raw * self._ratio_seen * 1.05) + (64 << 10))
        else:
            reserve = bound
        if reserve > self.ssd.capacity_bytes:
            return False
        self._writes.acquire()
        buf = self._scratch.get(bound + 4096)
        sw = self.ssd.begin_write(ck.digest, buf, ns_tag=self._ns_tag, reserve=reserve, start=ck.start,
                                  ntokens=ck.ntokens, expires_ms=int(expires * 1000), parent=ck.parent,
                                  keep=self._nearest_of_prefix(ck, self.ssd.index))
        if sw is None:
            self._scratch.put(buf)
            self._writes.release()
            return False
        try:
            total = encode_chunk_into(part, self.codec, memoryview(buf), key=ck.digest, index=ck.index,
                                      frame_bytes=self.config.frame_bytes, on_frame=sw.add)
            self._note_encoded(ck, raw, total, t0)
            self._submit_write(lambda: self._commit_done(ck, buf, lent=False, abort=sw),
                               self._commit_job, ck, sw, buf, total, expires)
        except BaseException:
            sw.abort()
            self._scratch.put(buf)
            self._writes.release()
            raise
        return True

    def _commit_job(self, ck: ChunkKey, sw, buf, total: int, expires: float) -> None:
        """Writer thread: makes a streamed SSD write durable (else sends the blob to remote)."""
        lent = False
        try:
            if self._prefix_lost(ck):
                sw.abort()
                placed = False
            else:
                placed = sw.commit(total)
                if not placed and self.remote is not None:
                    ttl = _ttl_left(expires)
                    lent = True  # (a remote send that timed out may still read it)
                    placed = self.remote.put(self._ns_tag, ck.digest, memoryview(buf)[:total], ttl_s=ttl)
            if not placed:
                self._rejected(ck.digest)
        except Exception:
            log.exception("kvcore tier writer failed")
            self.metrics.inc("manager", "errors")
        finally:
            self._commit_done(ck, buf, lent)

    def _commit_done(self, ck: ChunkKey, buf, lent: bool, abort=None) -> None:
        """The end of a streamed write (abort: its StreamWrite, when it never committed)."""
        try:
            if abort is not None:
                abort.abort()
        finally:
            if not lent:
                self._scratch.put(buf)
            with self._lock:
                self._pending.pop(ck.digest, None)  # until now, retrievable from its raw copy
            self._writes.release()

    def _submit_write(self, cancelled: Callable[[], None], job: Callable, *args) -> None:
        """Queues job(*args) on the writer thread. close() that runs out of time cancels the
        jobs still queued: cancelled() then releases what the job would have at its end (its
        write slot and queue entry; a streamed write's temporary file and reservation, else
        the SSD tier would never leave the shared directory)."""
        self._writer.submit(job, *args).add_done_callback(lambda fut: fut.cancelled() and cancelled())

    def _write_job(self, ck: ChunkKey, view, expires: float, staged: bool, entry) -> None:
        still_read = True
        try:
            if staged and self._prefix_lost(ck):
                self._rejected(ck.digest)
                still_read = False
                return
            placed, still_read = self._write_below(ck, view, expires, both=self.config.write_through)
            if staged and not placed:
                self._rejected(ck.digest)
        except Exception:
            log.exception("kvcore tier writer failed")
            self.metrics.inc("manager", "errors")
        finally:
            self._write_done(ck, view, staged, entry, still_read)

    def _write_done(self, ck: ChunkKey, view, staged: bool, entry, still_read: bool) -> None:
        if staged and not still_read:
            self._scratch.put(view.obj)  # reused: no fresh pages for the next chunk
        with self._lock:
            if entry is not None:
                self.ddr.release(entry)
            self._pending.pop(ck.digest, None)  # until now, retrievable from its raw copy
        self._writes.release()

    def _drain_writer(self, timeout: Optional[float] = None) -> bool:
        try:
            self._writer.submit(lambda: None).result(timeout)  # one thread: FIFO
            return True
        except (cf.TimeoutError, RuntimeError):
            return False

    def _alloc_blob(self, nbytes: int, holder: dict, ck: ChunkKey) -> memoryview:
        block = self._make_room(nbytes, ck)
        if block is None:  # not in DDR: a reusable staging buffer for the write below
            return memoryview(self._scratch.get(nbytes))[:nbytes]
        holder["block"] = block
        return block.view

    def _make_room(self, nbytes: int, ck: Optional[ChunkKey] = None):
        """Allocates nbytes in DDR, demoting policy victims as needed (worker thread only).
        None, with nothing evicted, when nbytes cannot fit even once every evictable chunk
        has left (pinned chunks, chunks being read, the capacity itself). ck: the chunk
        the room is for, whose prefix is not evicted for it (_nearest_of_prefix): kept,
        the nearest chunk of the prefix in DDR keeps the rest (the leaves rule). Else, a
        leaf until its child comes, a chunk would be the victim of the next chunk of its
        own store, and a store longer than DDR would push its prefix out for its tail."""
        with self._lock:
            needed = self._nearest_of_prefix(ck, self.ddr.entries) if ck is not None else None

        def evictable(key: bytes) -> bool:
            return key != needed and self._ddr_evictable(key)

        planned: Optional[Iterator[bytes]] = None
        while True:
            with self._lock:
                try:
                    return self.ddr.allocator.alloc(nbytes)
                except PoolExhausted:
                    pass
                if planned is None:
                    plan = self._victims_to_fit(nbytes, evictable)
                    if plan is None:
                        return None
                    planned = iter(plan)
                # The plan's victims first; then, should the allocator still refuse (its
                # size classes), the policy's next ones. A planned victim that is no longer
                # evictable (a read began during an earlier victim's demotion) keeps its
                # prefix, which may come later in the plan: then plan again.
                victim = next(planned, None)
                if victim is not None and not evictable(victim):
                    planned = None
                    continue
                if victim is None:
                    victim = next(self.ddr_policy.victims(evictable=evictable, levels=self._levels.current()), None)
                if victim is None:
                    return None
                entry = self.ddr.acquire(victim)
                if entry is None:
                    self.ddr_policy.remove(victim)
                    continue
            try:
                if self.config.demote_on_pressure and not self._expired(victim):
                    self._demote(victim, entry)
            finally:
                with self._lock:
                    self.ddr.release(entry)
                    if self.ddr.get(victim) is entry:
                        self.ddr.remove(victim)
                        self.ddr_policy.remove(victim)
                        self.metrics.inc("ddr", "evictions")

    @staticmethod
    def _nearest_of_prefix(ck: ChunkKey, held) -> Optional[bytes]:
        """The nearest chunk of ck's prefix that is in held (a tier's keys), through the
        chain of keys from chunk_keys; only ck's parent for a key without it."""
        k = ck.prev
        while k is not None:
            if k.digest in held:
                return k.digest
            k = k.prev
        return ck.parent if ck.parent is not None and ck.prev is None and ck.parent in held else None

    def _victims_to_fit(self, nbytes: int, evictable: Callable[[bytes], bool]) -> Optional[list[bytes]]:
        """The policy's victims, in order, whose leaving makes room for nbytes in DDR, or
        None when even every evictable chunk leaving would not (lock held). One pass over
        the policy's ordered leaves, stopping as soon as they are enough."""
        alloc = self.ddr.allocator
        short = alloc.used_bytes + footprint(alloc, nbytes) - alloc.capacity_bytes
        plan: list[bytes] = []
        for key in self.ddr_policy.victims(evictable=evictable, levels=self._levels.current()):
            if short <= 0:
                break
            e = self.ddr.get(key)
            if e is not None:
                plan.append(key)
                short -= footprint(alloc, e.size)
        return plan if short <= 0 else None

    def _demote(self, key: bytes, entry) -> None:
        if self.ssd is not None and self.ssd.contains(key):
            return
        h = BlobHeader.parse(entry.view)
        ck = ChunkKey(key, h.index, h.index * self.chunk_tokens, h.ntokens, self.ddr_policy.parent_of(key))
        m = self._meta.get(key)
        sent = m.expires if m else 0.0
        self._write_below(ck, entry.view, sent)
        self._settle_demoted(key, entry, sent)

    def _settle_demoted(self, key: bytes, entry, sent: float) -> None:
        """After a DDR victim's copy below has landed (written with the expiry sent): a
        caller that removed the chunk meanwhile (evict(tokens), clear(), an expiry) deleted
        its copies below before this one landed, and one that gave it another expiry
        (set_ttl) found no copy to give it to: the copy is deleted, or takes that expiry.
        One such change made after this look reaches the copy itself."""
        with self._lock:
            removed = self.ddr.get(key) is not entry
            m = self._meta.get(key)
        if removed:
            if self.ssd is not None:
                self.ssd.remove(key)
            if self.remote is not None:
                self.remote.delete(self._ns_tag, [key])
        elif (m.expires if m else 0.0) != sent:
            self._set_expiry_below([key], m.expires if m else 0.0)

    def _write_below(self, ck: ChunkKey, view, expires: float, *, both: bool = False) -> tuple[bool, bool]:
        """Writes a blob to SSD (else remote; both when asked). Returns (it landed somewhere,
        a remote send that failed or timed out may still be reading view)."""
        placed = still_read = False
        if self.ssd is not None:
            placed = self.ssd.write(ck.digest, view, ns_tag=self._ns_tag, start=ck.start, ntokens=ck.ntokens,
                                    expires_ms=int(expires * 1000), verify_blob=False, parent=ck.parent,
                                    keep=self._nearest_of_prefix(ck, self.ssd.index))
        if self.remote is not None and (both or not placed):
            ttl = _ttl_left(expires)
            sent = self.remote.put(self._ns_tag, ck.digest, view, ttl_s=ttl)
            still_read = not sent
            placed = sent or placed
        return placed, still_read

    def _ssd_evicted(self, key: bytes, e) -> None:
        """SSD victim: demote to remote when one is configured (called outside the SSD tier's locks,
        before the file is removed). Until this returns, the SSD tier still finds the chunk
        (lookups say "ssd", reads read its file: see SSDTier.on_evict); a send that fails
        leaves it dropped, as an eviction without a remote tier does, and a chunk removed
        during the send (SSDTier.leaving) is deleted from Redis again once it landed."""
        if self.remote is None or not self.config.demote_on_pressure or not self.remote.available:
            return
        if e.expired():
            return
        with open(e.path, "rb") as f:
            data = f.read()
        try:
            BlobHeader.parse(data, verify=True)
        except Exception:
            return
        sent_ms = e.expires_ms
        sent = self.remote.put(e.ns_tag, key, data, ttl_s=_ttl_left(sent_ms / 1000))
        # (self.ssd is None while the SSD tier is being built: its start trims the directory)
        if sent and self.ssd is not None and not self.ssd.leaving(key, e):
            # evict(tokens), clear() or an expiry removed it during the send, and deleted
            # from Redis before the send landed: the copy just sent would bring it back.
            self.remote.delete(e.ns_tag, [key])
        elif sent and e.expires_ms != sent_ms:
            # set_ttl() or a store's ttl gave it another expiry during the send
            # (SSDTier.set_expiry), while Redis did not hold it yet: the copy takes it now.
            # One given after this look reaches the copy itself (SSD first, then Redis).
            self.remote.set_expiry(e.ns_tag, [key], ttl_s=_ttl_left(e.expires_ms / 1000))

    def _job_promote(self, ck: ChunkKey, blob) -> None:
        try:
            self._promote(ck, blob)
        finally:
            self._scratch.put(getattr(blob, "obj", None))

    def _promote(self, ck: ChunkKey, blob) -> None:
        view = memoryview(blob).cast("B")
        with self._lock:
            if ck.digest in self.ddr or self._expired(ck.digest):
                return
        block = self._make_room(view.nbytes, ck)
        if block is None:
            return
        block.view[:] = view
        on_ssd = self.ssd.entry(ck.digest) if self.ssd is not None else None
        with self._lock:
            if on_ssd is not None and on_ssd.expires_ms:
                # The SSD file's name carries its expiry, which this process may not know
                # (stored by another process or before a restart): the DDR copy keeps it.
                m = self._meta.setdefault(ck.digest, _Meta())
                m.expires = m.expires or on_ssd.expires_ms / 1000
            self.ddr.insert(ck.digest, block, view.nbytes)
            self.ddr_policy.add(ck.digest, size=view.nbytes, start=ck.start, ntokens=ck.ntokens,
                                parent=ck.parent)
            self._levels.note([ck.digest])  # (the expiry its SSD file had)
        self.metrics.inc("ddr", "bytes_in", view.nbytes)

    def _job_prefetch(self, keys: list) -> None:
        try:
            for ck in keys:
                if ck.digest in self.ddr or ck.digest in self._pending:
                    continue
                src, blob = self._fetch_below(ck)
                if blob is None:
                    return
                self._job_promote(ck, blob)
        finally:  # promoted from chunk 0 on: the prefix most recent, as a store leaves it
            self._job_arrange([ck.digest for ck in reversed(keys)])

    def _await_job(self, ev: threading.Event, timeout: Optional[float]) -> Optional[bool]:
        """Waits for a queued job that sets ev: True once it ran, False on timeout, None when
        the worker stopped first (close() queued its stop ahead of the job, which then never
        runs: an unbounded wait on ev alone would never return)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            if ev.wait(left):
                return True
            if not self._worker.is_alive():
                return True if ev.is_set() else None
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _call_in_worker(self, fn: Callable, timeout: Optional[float] = None):
        box: list = []
        ev = threading.Event()
        self._put(("call", fn, box, ev))
        ran = self._await_job(ev, timeout)
        if ran is None:
            self._check_open()
            raise InvalidArgumentError("the TierManager worker has stopped")
        if not ran:
            raise TimeoutError("the tier worker did not answer in time")
        return box[0] if box else None

    # ------------------------------------------------------------------ lookup
    def lookup(self, tokens: Sequence[int]) -> Hit:
        """The longest stored prefix of tokens, chunk by chunk, and each chunk's tier.

        Tiers: "ddr", "ssd", "remote", or "pending" (queued by store(), not yet placed).
        """
        self._check_open()
        t0 = time.perf_counter()
        keys = self._keys_for(tokens)
        hit = Hit(0)
        now = time.time()
        local: list = []
        for ck in keys:
            if self._expired(ck.digest, now):
                self._drop_expired(ck.digest, remote_timeout=self.remote.config.lookup_timeout_s
                                   if self.remote is not None else None)
                break
            local.append(self._local_tier(ck.digest))
        below = [i for i, t in enumerate(local) if t is None]
        if below and self.remote is not None:
            present = self.remote.exists_many(self._ns_tag, [keys[i].digest for i in below])
            for i, p in zip(below, present):
                if p:
                    local[i] = "remote"
        for ck, tier in zip(keys, local):
            if tier is None:
                break
            hit.tiers.append(tier)
            hit.chunks.append(ck)
        hit.tokens = hit.chunks[-1].end if hit.chunks else 0
        self.metrics.observe("lookup", time.perf_counter() - t0)
        return hit

    def _in_memory(self, key: bytes) -> Optional[str]:
        """Where key is in memory: "ddr", "pending" (queued to be stored) or None. Both looks
        under the lock: the worker puts a chunk into DDR, then takes it off the queue, so a
        look at DDR before and at the queue after would find it in neither."""
        with self._lock:
            if key in self.ddr:
                return "ddr"
            if key in self._pending:
                return "pending"
        return None

    def _local_tier(self, key: bytes) -> Optional[str]:
        where = self._in_memory(key)
        if where is None and self.ssd is not None and self.ssd.contains(key):
            return "ssd"
        return where

    def _drop_expired(self, key: bytes, *, remote_timeout: Optional[float] = None) -> None:
        """Removes an expired chunk from every tier: its settings go, so a copy left anywhere
        would be a hit again (a reader's DDR copy is freed when it leaves; a remote copy's
        own TTL is later when another process gave it a longer one, or when set_ttl() or a store
        shortened it while the server did not answer). remote_timeout: the most
        the remote delete may take (a lookup's own bound; default op_timeout_s)."""
        with self._lock:
            # A queued chunk keeps its expired settings: the worker drops it (_job_store).
            m = self._meta.pop(key, None) if key not in self._pending else None
            self.ddr.remove(key)
            self.ddr_policy.remove(key)
        if self.ssd is not None:
            self.ssd.remove(key)
        if self.remote is not None:
            self.remote.delete(self._ns_tag, [key], timeout=remote_timeout)
        if m is not None and (m.pinned or m.priority):
            self._save_hot(touched=[key])  # an expired chunk's pin leaves the pins file too

    # ------------------------------------------------------------------ retrieve
    def _fetch_below(self, ck: ChunkKey):
        """(tier, verified blob) from SSD or remote, or (None, None)."""
        if self.ssd is not None:
            t0 = time.perf_counter()
            blob = self.ssd.read(ck.digest, scratch=self._scratch)
            if blob is not None and not self._foreign(ck, blob, "ssd"):
                self._measure("ssd", blob.nbytes, time.perf_counter() - t0)
                return "ssd", blob
        if self.remote is not None:
            t0 = time.perf_counter()
            blob = self.remote.get(self._ns_tag, ck.digest, scratch=self._scratch)
            if blob is not None and not self._foreign(ck, blob, "remote"):
                self._measure("remote", blob.nbytes, time.perf_counter() - t0)
                return "remote", blob
        return None, None

    def _foreign(self, ck: ChunkKey, blob, tier: str) -> bool:
        """Whether a verified blob read from tier under ck's key holds another chunk (see
        _holds): then it is counted corrupt and removed from that tier, and the read is a
        miss (its buffer is dropped, not given back: a streamed remote read's caller does that)."""
        if _holds(ck, BlobHeader.parse(blob)):
            return False
        self.metrics.inc(tier, "corrupt")
        if tier == "ssd":
            self.ssd.remove(ck.digest)
        else:
            self.remote.delete(self._ns_tag, [ck.digest])
        return True

    def _measure(self, what: str, nbytes: int, seconds: float) -> None:
        if nbytes > (1 << 16) and seconds > 0:
            self._bw[what] = 0.7 * self._bw[what] + 0.3 * (nbytes / seconds)

    def retrieve(self, tokens: Sequence[int], out: torch.Tensor, *,
                 on_layer: Optional[Callable[[int], None]] = None,
                 prefill_s_per_token: Optional[float] = None) -> int:
        """Restores the longest stored prefix of tokens into out[:, :, :n]; returns n.

        out: [layers, 2, >= n tokens, kv_heads, head_dim], decoded into directly; on a
        GPU, each frame is decoded into pinned host memory and copied on the current
        stream (it has arrived when its layer's on_layer call comes or this returns).
        on_layer(l): when given, all chunks are fetched first (SSD and remote ones read
        whole), then all their frames are decoded in one call, in layer order, and
        on_layer(l) is called as soon as layer l is complete while later layers go on
        decoding (an engine can start computing layer 0 while later layers load).
        prefill_s_per_token: when given, chunks are restored only while restoring them
        is estimated to be faster than recomputing them (see estimate()).
        """
        self._check_open()
        t0 = time.perf_counter()
        check_kv(out, host=False)
        if any(stride == 0 and size > 1 for size, stride in zip(out.shape, out.stride())):
            raise InvalidArgumentError("out is an expanded view: several of its elements share memory")
        prefill_s_per_token = optional_seconds_arg(prefill_s_per_token, "prefill_s_per_token")
        if on_layer is not None and not callable(on_layer):
            raise InvalidArgumentError(f"on_layer must be callable, got {type(on_layer).__name__}")
        keys = [ck for ck in self._keys_for(tokens) if ck.end <= out.shape[2]]
        fetched: list = []  # (ck, tier, blob or tensor, ddr entry or None)
        restored = 0
        ahead: dict = {}  # chunk number -> Future of _fetch_below (read-ahead from SSD/remote)

        def read_ahead(j: int) -> None:
            if self.config.read_ahead and j < len(keys) and j not in ahead and self._in_memory(keys[j].digest) is None:
                try:
                    ahead[j] = self._io.submit(self._fetch_below, keys[j])
                except RuntimeError:  # its pool is shut down: close() ran meanwhile
                    self._check_open()
                    raise

        try:
            now = time.time()
            for i, ck in enumerate(keys):
                if self._expired(ck.digest, now):
                    self._drop_expired(ck.digest)
                    break
                with self._lock:
                    entry = self.ddr.acquire(ck.digest)
                    pending = self._pending.get(ck.digest) if entry is None else None
                if entry is not None:
                    item = (ck, "ddr", entry.view, entry)
                elif pending is not None:
                    _check_raw_out(pending[1], out)
                    item = (ck, "pending", pending[1], None)
                else:
                    fut = ahead.pop(i, None)
                    for j in range(i + 1, i + 1 + self.config.read_ahead):
                        read_ahead(j)  # the next chunks load while this one decodes
                    tier, blob = None, None
                    if fut is None and on_layer is None and prefill_s_per_token is None:
                        if self.ssd is not None and self.ssd.contains(ck.digest):
                            blob = self._stream_from_ssd(ck, out)  # decodes while it reads
                            tier = "ssd-decoded" if blob is not None else None
                        elif self.remote is not None and self.remote.can_stream:
                            blob = self._stream_from_remote(ck, out)  # decodes while it arrives
                            tier = "remote-decoded" if blob is not None else None
                            if blob is None:
                                self.metrics.inc("ddr", "misses")
                                break
                    if blob is None:
                        try:
                            tier, blob = fut.result() if fut is not None else self._fetch_below(ck)
                        except cf.CancelledError:  # close() cancelled the read-ahead
                            self._check_open()
                            raise
                    if blob is None:
                        self.metrics.inc("ddr", "misses")
                        break
                    self.metrics.inc("ddr", "misses")
                    item = (ck, tier, blob, None)
                if prefill_s_per_token is not None:
                    nbytes = item[2].nbytes if isinstance(item[2], memoryview) else 0
                    if self._restore_s(item[1], nbytes, ck.ntokens) > ck.ntokens * prefill_s_per_token:
                        if item[3] is not None:
                            with self._lock:
                                self.ddr.release(item[3])
                        break
                if item[1] in ("ssd-decoded", "remote-decoded"):
                    item = (ck, item[1].split("-")[0], item[2], None)
                    fetched.append(item)
                    continue
                fetched.append(item)
                if on_layer is None:
                    self._decode(item, out)
            if on_layer is not None:
                self._decode_by_layer(fetched, out, on_layer)
            restored = fetched[-1][0].end if fetched else 0
        finally:
            for fut in ahead.values():  # read ahead, not used: give the buffers back
                fut.add_done_callback(lambda f: self._scratch.put(getattr(f.result()[1], "obj", None))
                                      if not f.cancelled() and f.exception() is None else None)
            with self._lock:
                for ck, tier, _, entry in reversed(fetched):  # prefix ends most recent
                    if entry is not None:
                        self.ddr.release(entry)
                        self.ddr_policy.touch(ck.digest)
                        self.metrics.inc("ddr", "hits")
                        self.metrics.inc("ddr", "bytes_out", entry.size)
        promoting = False
        for ck, tier, blob, _ in fetched:
            if tier in ("ssd", "remote"):
                if self.config.promote_on_hit and self._put(("promote", ck, blob), block=False):
                    promoting = True
                else:
                    self._scratch.put(getattr(blob, "obj", None))
        if promoting:  # the promoted chunks join DDR from chunk 0 on: the prefix last again
            self._put(("arrange", [ck.digest for ck, *_ in reversed(fetched)]), block=False)
        self.metrics.observe("retrieve", time.perf_counter() - t0)
        return restored

    def _stream_from_ssd(self, ck: ChunkKey, out: torch.Tensor):
        """Reads ck's file in segments and decodes each layer as soon as its frames have
        arrived (frames carry their own checksums; the blob checksum is checked at the
        end). Returns the verified blob, or None (nothing restored from this chunk)."""
        t0 = time.perf_counter()
        sr = self.ssd.stream(ck.digest, scratch=self._scratch, executor=self._stream_io)
        if sr is None:
            return None
        return self._decode_as_it_lands(sr, ck, out, "ssd", t0)

    def _stream_from_remote(self, ck: ChunkKey, out: torch.Tensor):
        """Receives ck's blob from the remote tier and decodes each layer as soon as its
        frames have arrived (as _stream_from_ssd). Returns the verified blob, or None."""
        t0 = time.perf_counter()
        rr = self.remote.stream(self._ns_tag, ck.digest, scratch=self._scratch)
        if rr is None:
            return None
        blob = None
        try:
            blob = self._decode_as_it_lands(rr, ck, out, "remote", t0)
            return blob
        finally:
            if blob is None and rr.view is not None and not rr.lent:
                self._scratch.put(rr.view.obj)

    def _decode_as_it_lands(self, stream, ck: ChunkKey, out: torch.Tensor, tier: str, t0: float):
        """Decodes the frames of a blob that is still arriving in stream.view (an SSD or
        remote read), each as soon as it has landed; stream.finish() then verifies the
        whole blob (and its key). Returns the verified blob, or None (a miss)."""
        try:
            if stream.wait(64 << 10):
                header = BlobHeader.parse(stream.view)
                if _holds(ck, header):
                    for i, (off, n) in enumerate(header.frames):
                        if not stream.wait(off + n):
                            break
                        decode_into(stream.view, header, out, self.codec, start=ck.start, frames=range(i, i + 1))
        except Exception:
            if stream.finish() is None:
                return None
            raise  # a valid blob that does not fit out: the caller's error
        blob = stream.finish()
        if blob is None or self._foreign(ck, blob, tier):
            return None
        self._measure(tier, blob.nbytes, time.perf_counter() - t0)
        return blob

    def _decode(self, item, out: torch.Tensor) -> None:
        ck, tier, data, _ = item
        t0 = time.perf_counter()
        if tier == "pending":
            out[:, :, ck.start:ck.end].copy_(data)
            return
        header = _checked_header(ck, data)
        decode_into(data, header, out, self.codec, start=ck.start)
        self._measure("decode", header.raw_bytes, time.perf_counter() - t0)

    def _decode_by_layer(self, fetched: list, out: torch.Tensor, on_layer: Callable[[int], None]) -> None:
        """Completes out for every fetched chunk, calling on_layer(l) as soon as layer l of
        every chunk is complete: all the frames are decoded in one call, in layer order,
        so later layers decode while on_layer runs (blob.decode_layers_into)."""
        pending = [(ck, data) for ck, tier, data, _ in fetched if tier == "pending"]

        def copy_pending(layer: int) -> None:
            for ck, data in pending:
                out[layer, :, ck.start:ck.end].copy_(data[layer])

        parts = [(data, _checked_header(ck, data), ck.start) for ck, tier, data, _ in fetched if tier != "pending"]
        decode_layers_into(parts, out, self.codec, on_layer, before_layer=copy_pending)

    # ------------------------------------------------------------------ restore vs recompute
    def _restore_s(self, tier: str, blob_bytes: int, ntokens: int) -> float:
        raw = self._bytes_per_token * ntokens
        if not blob_bytes:
            blob_bytes = int(raw * self._ratio_seen)
        if tier == "pending":
            return raw / self._bw["pending"]
        return blob_bytes / self._bw[tier] + raw / self._bw["decode"]

    def estimate(self, tokens: Sequence[int], prefill_s_per_token: float) -> RestorePlan:
        """Restore or recompute: for each stored chunk, the estimated seconds of each.

        Restore = blob bytes / the tier's measured bandwidth + original bytes / the
        measured decode bandwidth; recompute = tokens x prefill_s_per_token. A chunk is
        worth restoring when restoring is faster; plan.tokens is the prefix to restore.
        """
        self._check_open()
        seconds_arg(prefill_s_per_token, "prefill_s_per_token")
        hit = self.lookup(tokens)
        plan = RestorePlan(0)
        go = True
        for ck, tier in zip(hit.chunks, hit.tiers):
            size = 0
            if tier == "ddr":
                e = self.ddr.get(ck.digest)
                size = e.size if e is not None else 0
            elif tier == "ssd" and self.ssd is not None:
                e = self.ssd.entry(ck.digest)
                size = e.size if e is not None else 0
            r = self._restore_s(tier, size, ck.ntokens)
            c = ck.ntokens * prefill_s_per_token
            go = go and r < c
            plan.chunks.append({"tier": tier, "ntokens": ck.ntokens, "restore_s": r, "recompute_s": c,
                                "restore": go})
            if go:
                plan.tokens = ck.end
        return plan

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, tokens: Sequence[int]) -> int:
        """Schedules the stored chunks of tokens that are not in DDR to be pulled into DDR.

        Returns how many chunks were scheduled (0 when the queue is full: it never blocks).
        """
        self._check_open()
        hit = self.lookup(tokens)
        todo = [ck for ck, t in zip(hit.chunks, hit.tiers) if t in ("ssd", "remote")]
        if todo and self._put(("prefetch", todo), block=False):
            return len(todo)
        return 0

    # ------------------------------------------------------------------ hot/cold API
    def _set_meta(self, tokens, fn, *, persisted: bool = True) -> int:
        """Applies fn to the settings of tokens' chunks; persisted: the change belongs in
        the pins file (pins and priorities; TTLs live in the SSD file names)."""
        keys = self._keys_for(tokens)
        with self._lock:
            for ck in keys:
                m = self._meta.setdefault(ck.digest, _Meta())
                fn(m)
                m.start, m.ntokens = ck.start, ck.ntokens
        self._levels.note([ck.digest for ck in keys])
        if persisted:
            self._save_hot(touched=[ck.digest for ck in keys])
        return len(keys)

    def _hot_entry(self, key: bytes) -> Optional[HotCold]:
        """What the pins file should hold for key (None: nothing; lock held)."""
        m = self._meta.get(key)
        if m is None or m.start < 0:
            return None
        e = HotCold(m.pinned, m.priority, m.start, m.ntokens)
        return e if e.kept else None

    def _save_hot(self, touched: Iterable[bytes] = (), *, drop_all: bool = False) -> None:
        """Merges the settings of the chunks just set or deleted (touched; they may be
        entries of another process) into the SSD directory's pins file, when there is
        one; drop_all (``clear``) drops every process's entries first. Pins and
        priorities change only through these calls (and _take_in_hot, which reads the file)."""
        if self._hot is None:
            return
        with self._hot_lock:  # one writer at a time: the file ends as the latest state
            with self._lock:
                changes = {k: self._hot_entry(k) for k in touched}
            if not changes and not drop_all:
                return
            try:
                pinned = self._take_in_hot(self._hot.update(changes, drop_all=drop_all))
            except OSError:
                self.metrics.inc("ssd", "errors")
                return
        pinned = [ck for ck in pinned if ck.digest not in changes]  # this manager's own: pin() prefetches them
        if pinned:
            self._put(("prefetch", pinned), block=False)

    def _take_in_hot(self, saved: dict) -> list:
        """Applies the pins file's entries (saved) that differ from what this manager last
        saw of it (its own changes and other processes'); returns the chunks newly pinned
        there that are not in DDR. Called with _hot_lock held (or before the worker starts)."""
        saved = {k: e for k, e in saved.items() if e.kept}
        changed = {k: e for k, e in saved.items() if self._hot_saved.get(k) != e}
        with self._lock:
            for k, e in changed.items():
                m = self._meta.setdefault(k, _Meta())
                m.pinned, m.priority, m.start, m.ntokens = e.pinned, e.priority, e.start, e.ntokens
            for k in self._hot_saved.keys() - saved.keys():
                m = self._meta.get(k)
                if m is not None:
                    m.pinned, m.priority = False, 0
        self._levels.note(changed)
        self._hot_saved = saved
        return [ChunkKey(k, e.start // self.chunk_tokens, e.start, e.ntokens) for k, e in changed.items()
                if e.pinned and k not in self.ddr]

    def _refresh_hot(self) -> None:
        """Takes in the pins and priorities other processes wrote to the shared pins file
        since this manager last read or wrote it (on the worker thread, every hot_refresh_s)."""
        if self._hot is None or not self._hot.changed():
            return
        try:
            with self._hot_lock:
                pinned = self._take_in_hot(self._hot.load())
            if pinned:
                self._job_prefetch(pinned)  # newly pinned by another process: pulled into DDR
        except Exception:  # a settings file is never worth the worker
            log.exception("kvcore: reading the shared pins file failed")
            self.metrics.inc("ssd", "errors")

    def pin(self, tokens: Sequence[int]) -> int:
        """Keeps the chunks of tokens in DDR (never evicted; pulled in if stored below).

        Applies to chunks stored later too. With an SSD directory, pins and priorities
        are kept in it and hold again when a manager reopens it (pinned chunks are then
        prefetched); managers of other processes sharing the directory take them in
        within ``hot_refresh_s``. Returns the number of chunks pinned.
        """
        self._check_open()
        n = self._set_meta(tokens, lambda m: setattr(m, "pinned", True))
        self.prefetch(tokens)
        return n

    def unpin(self, tokens: Sequence[int]) -> int:
        """Makes the chunks of tokens evictable again."""
        self._check_open()
        return self._set_meta(tokens, lambda m: setattr(m, "pinned", False))

    def set_priority(self, tokens: Sequence[int], level: int) -> int:
        """Eviction priority of the chunks of tokens: lower levels leave first (default 0;
        an int within +-MAX_PRIORITY, 2**30 - 1: expired chunks leave before every level)."""
        self._check_open()
        if not is_priority(level):
            raise InvalidArgumentError(f"level must be an int from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {level!r}")
        return self._set_meta(tokens, lambda m: setattr(m, "priority", level))

    def set_ttl(self, tokens: Sequence[int], seconds: Optional[float]) -> int:
        """Expiry of the chunks of tokens, seconds from now (None, or more than MAX_TTL_S:
        never). Applies to DDR, SSD and remote. Waits for queued stores first; chunks on
        SSD are renamed under their new expiry (their file name carries it: it holds after
        a restart, and the SSD tier drops a file past it), Redis values get it as their TTL
        (none: the remote config's ttl_s)."""
        self._check_open()
        expires = _expiry(seconds, "seconds")
        self._flush_open()  # a queued chunk would be written with its store's expiry
        n = self._set_meta(tokens, lambda m: setattr(m, "expires", expires), persisted=False)
        self._set_expiry_below([ck.digest for ck in self._keys_for(tokens)], expires)
        return n

    def persist(self, tokens: Sequence[int]) -> int:
        """Writes the stored chunks of tokens through to SSD and remote now (durable).

        Waits for queued stores first. Returns the number of chunks now on SSD or remote.
        """
        self._check_open()
        self._flush_open()
        done = 0
        for ck in self._keys_for(tokens):
            if self._expired(ck.digest):  # written through, it would be a hit again elsewhere
                self._drop_expired(ck.digest)
                break
            with self._lock:
                entry = self.ddr.acquire(ck.digest)
            if entry is None:
                on_ssd = self.ssd is not None and self.ssd.contains(ck.digest)
                if on_ssd and self.remote is not None:
                    blob = self.ssd.read(ck.digest)
                    if blob is not None:
                        m = self._meta.get(ck.digest)
                        ttl = _ttl_left(m.expires if m else 0.0)
                        self.remote.put(self._ns_tag, ck.digest, blob, ttl_s=ttl)
                if on_ssd or (self.remote is not None and self.remote.exists_many(self._ns_tag, [ck.digest])[0]):
                    done += 1
                    continue
                break
            try:
                m = self._meta.get(ck.digest)
                expires = m.expires if m else 0.0
                ok = True
                if self.ssd is not None and not self.ssd.contains(ck.digest):
                    ok = self.ssd.write(ck.digest, entry.view, ns_tag=self._ns_tag, start=ck.start,
                                        ntokens=ck.ntokens, expires_ms=int(expires * 1000), verify_blob=False,
                                        parent=ck.parent)
                if self.remote is not None:
                    ttl = _ttl_left(expires)
                    ok = self.remote.put(self._ns_tag, ck.digest, entry.view, ttl_s=ttl) or (
                        ok and self.ssd is not None)
                if self.ssd is None and self.remote is None:
                    ok = False
                done += bool(ok)
            finally:
                with self._lock:
                    self.ddr.release(entry)
        return done

    def evict(self, tokens: Optional[Sequence[int]] = None, *, count: Optional[int] = None,
              nbytes: Optional[int] = None) -> int:
        """evict(tokens): deletes those chunks from every tier. evict(count=n) or
        evict(nbytes=b): moves policy victims out of DDR (demoted to SSD/remote as on
        pressure) until n chunks or b bytes left. Returns the number of chunks affected."""
        self._check_open()
        if (tokens is None) == (count is None and nbytes is None):
            raise InvalidArgumentError("evict takes tokens, or count= / nbytes=")
        if tokens is not None:
            keys = [ck.digest for ck in self._keys_for(tokens)]
            self._flush_open()
            n = 0
            for k in keys:
                found = False
                with self._lock:
                    self._meta.pop(k, None)
                    if self.ddr.remove(k):
                        found = True
                    self.ddr_policy.remove(k)
                if self.ssd is not None and self.ssd.remove(k):
                    found = True
                n += found
            if self.remote is not None:
                n = max(n, self.remote.delete(self._ns_tag, keys))
            self._save_hot(touched=keys)
            return n
        count, nbytes = optional_int_arg(count, "count"), optional_int_arg(nbytes, "nbytes")
        return self._call_in_worker(lambda: self._evict_some(count, nbytes))

    def _evict_some(self, count: Optional[int], nbytes: Optional[int]) -> int:
        n = freed = 0
        while (count is None or n < count) and (nbytes is None or freed < nbytes):
            with self._lock:
                victim = next(self.ddr_policy.victims(evictable=self._ddr_evictable, levels=self._levels.current()),
                              None)
                if victim is None:
                    break
                entry = self.ddr.acquire(victim)
            if entry is None:
                self.ddr_policy.remove(victim)
                continue
            try:
                if self.config.demote_on_pressure:
                    self._demote(victim, entry)
            finally:
                with self._lock:
                    self.ddr.release(entry)
                    if self.ddr.get(victim) is entry:
                        freed += self.ddr.remove(victim)
                        self.ddr_policy.remove(victim)
                        self.metrics.inc("ddr", "evictions")
                        n += 1
        return n

    def clear(self, namespace: Optional[NamespaceLike] = None) -> int:
        """Deletes every chunk of a namespace (default: this manager's) from every tier, and
        its pins and priorities (those of another namespace too: they would apply to the
        chunks it stores later)."""
        self._check_open()
        tag = self._ns_tag if namespace is None else as_namespace(namespace).tag
        n = 0
        if tag == self._ns_tag:
            self._flush_open()
            with self._lock:
                for k in list(self.ddr.entries):
                    self.ddr.remove(k)
                    n += 1
                self.ddr_policy.clear()
                self._meta.clear()
            self._save_hot(drop_all=True)
        elif self.ssd is not None:
            try:
                HotColdFile(self.config.ssd_dir, tag).update({}, drop_all=True)
            except OSError:
                self.metrics.inc("ssd", "errors")
        if self.ssd is not None:
            n += self.ssd.clear(tag)
        if self.remote is not None:
            n += self.remote.clear(tag)
        return n

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until everything queued before this call is placed. False on timeout, or
        when a close() from another thread stopped the worker first."""
        timeout = optional_seconds_arg(timeout, "timeout", allow_zero=True)
        if self._closed or not self._worker.is_alive():
            return True
        ev = threading.Event()
        try:
            self._put(("flush", ev))
        except InvalidArgumentError:  # the worker stopped meanwhile
            return False
        return bool(self._await_job(ev, None if timeout is None else wait_seconds(timeout)))

    def _flush_open(self) -> None:
        """flush() for the operations that go on to use the tiers: raises the closed error
        when a close() from another thread ran meanwhile."""
        self.flush()
        self._check_open()

    # ------------------------------------------------------------------ status
    def _gauges(self) -> dict:
        g = {"ddr": {"entries": len(self.ddr), "bytes_used": self.ddr.used_bytes,
                     "capacity_bytes": self.ddr.capacity_bytes}}
        if self.ssd is not None:
            g["ssd"] = {"entries": len(self.ssd), "bytes_used": self.ssd.used_bytes,
                        "capacity_bytes": self.ssd.capacity_bytes}
        return g

    def status(self) -> dict:
        """Configuration, per-tier occupancy and counters, compression ratio, latencies."""
        snap = self.metrics.snapshot()
        with self._lock:  # other threads add and drop settings: an unlocked walk may raise
            pinned = sum(1 for m in self._meta.values() if m.pinned)
        st = {
            "namespace": asdict(self.namespace),
            "namespace_tag": self._ns_tag,
            "chunk_tokens": self.chunk_tokens,
            "codec": self.codec.name,
            "policy": self.ddr_policy.name,
            "allocator": self.ddr.allocator.name,
            "queue": {"depth": self._queue.qsize(), "capacity": self.config.queue_chunks,
                      "pending_chunks": len(self._pending)},
            "pinned_chunks": pinned,
            "bandwidth_bytes_per_s": dict(self._bw),
            **snap,
        }
        if self.ssd is not None:
            st["tiers"].setdefault("ssd", {}).update(
                {"dir": str(self.ssd.root), "direct_io": self.ssd._direct_ok, "last_error": self.ssd.last_error})
        if self.remote is not None:
            st["tiers"].setdefault("remote", {}).update(
                {"url": redact_url(self.remote.config.url), "breaker": self.remote.breaker.state})
        return st

    def prometheus(self) -> str:
        """Metrics in Prometheus text format."""
        return self.metrics.prometheus()

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the TierManager is closed")

    def close(self, timeout: float = 4.0) -> bool:
        """Finishes queued work (up to timeout seconds), stops the worker, releases memory.

        Never waits on a dead or slow remote server beyond its timeouts. Returns True
        when all queued work was done.
        """
        timeout = wait_seconds(seconds_arg(timeout, "timeout", allow_zero=True))
        if self._closed:
            return True
        deadline = time.monotonic() + timeout
        self._closed = True
        clean = True
        try:
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            clean = False
        self._worker.join(max(0.0, deadline - time.monotonic()))
        clean = clean and not self._worker.is_alive()
        clean = self._drain_writer(max(0.0, deadline - time.monotonic())) and clean
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._stream_io.shutdown(wait=False, cancel_futures=True)
        if self.ssd is not None:
            self.ssd.close()
        if self.remote is not None:
            self.remote.close()
        if clean:
            with self._lock:
                for k in list(self.ddr.entries):
                    self.ddr.remove(k)
                self.ddr_policy.clear()
        return clean

    def __enter__(self) -> "TierManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close(timeout=1.0)
        except Exception:
            pass


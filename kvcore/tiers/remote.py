"""The remote tier: Redis or Valkey through redis-py, cluster mode included.

A dead or slow server never raises into the caller and never stalls it: every
operation runs with socket timeouts on a small worker pool and the caller waits at
most ``op_timeout_s`` for it (``lookup_timeout_s`` for existence checks); failures
open a circuit breaker, during which operations are skipped at once (a lookup
misses, a store is dropped), all counted in metrics. ``close()`` never waits on the
server.

Keys: ``<prefix>:<namespace tag>:{<chunk key hex>}:<part>``. The braces are a
cluster hash tag: all parts of one chunk live in one slot (one node). A chunk blob is split into parts of ``part_bytes``, moved in
parallel over several connections; part 0 holds the blob header (which gives the total
size) and is written last, as the commit record.

>>> from kvcore.tiers.remote import CircuitBreaker
>>> b = CircuitBreaker(failure_threshold=2, reset_after_s=60)
>>> b.failure(); b.allow()
True
>>> b.failure(); b.allow()
False
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from .._args import int_arg, optional_seconds_arg, seconds_arg, wait_seconds
from ..errors import BackendError, CorruptFrameError, InvalidArgumentError, UnsupportedError
from .blob import BlobHeader, NewerBlobError, StreamingChecksum, blob_identity, blob_total_size, body_size
from .codecs import can_decode
from .metrics import Metrics
from .resp import RawGetter, RespError


@dataclass
class RemoteConfig:
    """How to reach and treat the remote store.

    url: redis://host:port/db (rediss:// for TLS); cluster: use RedisCluster (also
    implied by a "redis+cluster://" url); ttl_s: default per-entry TTL (None = no
    expiry); connect_timeout_s / op_timeout_s: socket timeouts, and the longest a
    caller waits; lookup_timeout_s: the longest a lookup waits; failure_threshold:
    consecutive failures that open the breaker; reset_after_s: how long it stays open
    before one probe; part_bytes: largest value written per key; parallel_parts:
    parts moved at once (each on its own connection); raw_reads: read values straight
    into memory over plain sockets (standalone redis:// only; see resp.py); max_parts:
    largest number of parts a chunk may have.
    """

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False
    ttl_s: Optional[float] = None
    connect_timeout_s: float = 0.5
    op_timeout_s: float = 2.0
    lookup_timeout_s: float = 0.25
    failure_threshold: int = 2
    reset_after_s: float = 2.0
    part_bytes: int = 2 << 20
    prefix: str = "kvcore"
    workers: int = 4
    parallel_parts: int = 4
    raw_reads: bool = True
    max_parts: int = 4096

    def validate(self) -> None:
        """Raises InvalidArgumentError for a field of the wrong type or out of range."""
        for name in ("url", "prefix"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(f"RemoteConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("cluster", "raw_reads"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"RemoteConfig.{name} must be a bool, got {getattr(self, name)!r}")
        optional_seconds_arg(self.ttl_s, "RemoteConfig.ttl_s")
        for name in ("connect_timeout_s", "op_timeout_s", "lookup_timeout_s"):
            seconds_arg(getattr(self, name), f"RemoteConfig.{name}")
        seconds_arg(self.reset_after_s, "RemoteConfig.reset_after_s", allow_zero=True)
        for name in ("failure_threshold", "part_bytes", "workers", "parallel_parts", "max_parts"):
            int_arg(getattr(self, name), f"RemoteConfig.{name}", 1)


def redact_url(url: str) -> str:
    """url with its credentials masked, for messages and status()."""
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("", url)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


class CircuitBreaker:
    """closed -> (failure_threshold consecutive failures) -> open -> (reset_after_s) -> one probe."""

    def __init__(self, failure_threshold: int = 2, reset_after_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.failure_threshold = max(1, failure_threshold)
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0
        self._probing = False

    @property
    def state(self) -> str:
        with self._lock:
            if self._failures < self.failure_threshold:
                return "closed"
            return "open" if self._clock() < self._open_until else "half-open"

    def allow(self) -> bool:
        with self._lock:
            if self._failures < self.failure_threshold:
                return True
            if self._clock() < self._open_until or self._probing:
                return False
            self._probing = True  # one probe at a time in half-open
            return True

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False

    def trip(self) -> None:
        """Opens the breaker at once (a timeout: the server is hung or overloaded)."""
        with self._lock:
            self._failures = max(self._failures, self.failure_threshold - 1)
        self.failure()

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            self._probing = False
            if self._failures >= self.failure_threshold:
                self._open_until = self._clock() + self.reset_after_s


# Bytes of a value's part 0 read to learn its size (blob_total_size): its header and frame table.
HEAD_PEEK_BYTES = 1 << 16
# The same for holds_whole, which reads many at once: the header and a table of up to 1021
# frames (a blob with more is not held: sent again, which is correct, only slower).
CLAIM_PEEK_BYTES = 16 << 10


class _Skipped(Exception):
    pass


class RemoteTier:
    """Chunk blobs in Redis/Valkey. Every method returns a miss/False instead of raising."""

    name = "remote"

    def __init__(self, config: RemoteConfig, *, metrics: Optional[Metrics] = None):
        if not isinstance(config, RemoteConfig):
            raise InvalidArgumentError(f"config must be a RemoteConfig, got {type(config).__name__}")
        config.validate()
        # Sockets and waits take at most threading.TIMEOUT_MAX: longer is no limit.
        config = replace(config, **{name: wait_seconds(getattr(config, name))
                                    for name in ("connect_timeout_s", "op_timeout_s", "lookup_timeout_s")})
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:
            raise UnsupportedError("the remote tier needs the redis package: pip install 'redis>=5'") from e

        self.config = config
        self.metrics = metrics or Metrics()
        self.breaker = CircuitBreaker(config.failure_threshold, config.reset_after_s)
        url = config.url
        cluster = config.cluster or "+cluster" in url.split("://", 1)[0]
        url = url.replace("+cluster://", "://")
        common = dict(socket_timeout=config.op_timeout_s, socket_connect_timeout=config.connect_timeout_s,
                      retry=Retry(NoBackoff(), 0))
        self._raw: Optional[RawGetter] = None
        try:
            if cluster:
                from redis.cluster import RedisCluster

                self.client = RedisCluster.from_url(url, **common)
            else:
                self.client = redis.Redis.from_url(url, health_check_interval=0, **common)
                if config.raw_reads and url.startswith("redis://"):
                    self._raw = RawGetter(url, timeout=config.op_timeout_s, connect_timeout=config.connect_timeout_s)
        except ValueError as e:  # the url's scheme, port or database number
            raise InvalidArgumentError(f"RemoteConfig.url {redact_url(config.url)!r}: {e}") from None
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            # a cluster client asks a node for the slot map at once
            raise BackendError(f"cannot reach the remote store at {redact_url(config.url)}: {e}") from None
        # A failed read is a miss; so is one the memory for its value could not be found for,
        # and one close() cancelled while it waited for the pool (CancelledError).
        self._errors = (redis.RedisError, OSError, cf.TimeoutError, ValueError, MemoryError, cf.CancelledError)
        self._timeout_error = redis.TimeoutError
        self._reply_errors = (redis.ResponseError, RespError)  # see _holds_other_type
        self._pool = cf.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="kvcore-remote")
        self._parts = cf.ThreadPoolExecutor(max_workers=max(1, config.parallel_parts),
                                            thread_name_prefix="kvcore-remote-part")
        self._closed = False
        self._parts_hint = 1  # parts of the last value read: GETs sent along with part 0's

    # ---- plumbing ----
    def _key(self, ns_tag: str, key: bytes, part: int) -> str:
        return f"{self.config.prefix}:{ns_tag}:{{{key.hex()}}}:{part}"

    def _run(self, fn, timeout: float):
        """fn() on the pool within timeout; raises _Skipped when the breaker is open."""
        return self._result(self._submit(fn), timeout)

    def _submit(self, fn) -> cf.Future:
        """fn() started on the pool; raises _Skipped when the breaker is open or closed."""
        if self._closed or not self.breaker.allow():
            raise _Skipped()
        try:
            return self._pool.submit(fn)
        except RuntimeError:  # the pool was shut down (close() raced this call)
            raise _Skipped() from None

    def _result(self, fut: cf.Future, timeout: float):
        """fut's result within timeout, feeding the breaker; raises what the operation raised."""
        try:
            result = fut.result(timeout=max(0.0, timeout))
        except RuntimeError:
            if not self._closed:
                raise
            raise _Skipped() from None  # close() shut the parts pool down under the operation
        except self._errors as exc:
            fut.cancel()
            if isinstance(exc, (cf.TimeoutError, self._timeout_error)):
                self.breaker.trip()
            else:
                self.breaker.failure()
            self.metrics.inc(self.name, "errors")
            raise
        self.breaker.success()
        return result

    def _raw_parts(self, ns_tag: str, key: bytes, alloc, **kwargs):
        """The raw reader's read of every part of key's value (see RawGetter.get_parts): the
        value, None when missing, False when short or corrupt, a key of another type
        included (see _holds_other_type)."""
        def total_of(prefix):
            try:
                return blob_total_size(prefix)
            except CorruptFrameError:
                return len(prefix)

        pb = self.config.part_bytes
        try:
            data = self._raw.get_parts(lambda i: self._key(ns_tag, key, i).encode(), total_of, pb, alloc,
                                       self.config.max_parts, guess_parts=self._parts_hint, **kwargs)
        except RespError as exc:
            if not self._holds_other_type(exc):
                raise
            return False
        if data is not None and data is not False:
            self._parts_hint = -(-data.nbytes // pb)
        return data

    def _holds_other_type(self, exc: BaseException) -> bool:
        """Whether exc is the server's answer that a key holds another type of value (a list,
        a hash: not one of this tier's parts). Its data is foreign, like a corrupt value's;
        the server is fine, so it must not count against the breaker."""
        return isinstance(exc, self._reply_errors) and str(exc).startswith("WRONGTYPE")

    @property
    def available(self) -> bool:
        return not self._closed and self.breaker.state != "open"

    # ---- operations ----
    def exists_many(self, ns_tag: str, keys: Sequence[bytes]) -> list[bool]:
        """Which keys are stored (all False when the server is unreachable)."""
        if not keys:
            return []

        def op():
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(self._key(ns_tag, k, 0))
            return [bool(x) for x in pipe.execute()]

        return self._look(op, len(keys))

    def holds_whole(self, ns_tag: str, chunks: Sequence[tuple[bytes, int, int]]) -> list[bool]:
        """Which chunks, given as (key, chunk index, token count), are stored whole: every part
        of the value there at the length its header gives, and that header claiming this very
        chunk (blob_identity); a value of a later blob format counts as held (it is kept for
        its readers, not replaced). All False when the server does not answer within
        lookup_timeout_s. Two pipelined round trips, each part 0's header, then the length of
        every other part: the bodies are not read (a value whose bytes changed in place
        passes, and the read that finds it corrupt deletes it)."""
        if not chunks:
            return []
        pb = self.config.part_bytes

        def op():
            pipe = self.client.pipeline(transaction=False)
            for key, _, _ in chunks:
                pipe.getrange(self._key(ns_tag, key, 0), 0, CLAIM_PEEK_BYTES - 1)
                pipe.strlen(self._key(ns_tag, key, 0))
            replies = self._answers(pipe)
            totals = [self._whole_size(chunk, first, first_len)
                      for chunk, first, first_len in zip(chunks, replies[::2], replies[1::2])]
            pipe = self.client.pipeline(transaction=False)
            asked = []  # (chunk's place, the length its part must have)
            for j, ((key, _, _), total) in enumerate(zip(chunks, totals)):
                for i in range(1, -(-total // pb) if total else 0):
                    pipe.strlen(self._key(ns_tag, key, i))
                    asked.append((j, min(pb, total - i * pb)))
            held = [total is not None for total in totals]
            for (j, length), got in zip(asked, self._answers(pipe) if asked else []):
                held[j] = held[j] and got == length
            return held

        return self._look(op, len(chunks))

    def _look(self, op: Callable[[], list[bool]], n: int) -> list[bool]:
        """op's answers for n values, within lookup_timeout_s; all False when the server
        does not give them (unreachable, slow, the breaker open)."""
        try:
            return self._run(op, self.config.lookup_timeout_s)
        except _Skipped:
            self.metrics.inc(self.name, "skipped")
        except self._errors:
            pass
        return [False] * n

    def _answers(self, pipe) -> list:
        """A pipeline's replies; a key of another type answers WRONGTYPE (not one of ours,
        like a missing one: None), any other error is raised."""
        replies = pipe.execute(raise_on_error=False)
        for r in replies:
            if isinstance(r, Exception) and not self._holds_other_type(r):
                raise r
        return [None if isinstance(r, Exception) else r for r in replies]

    def _whole_size(self, chunk: tuple[bytes, int, int], first, first_len) -> Optional[int]:
        """The total size of the value whose part 0 begins with first and is first_len bytes
        long, when its header claims chunk and part 0 has the length it gives; 0 for a value
        of a later blob format (held: see holds_whole); None when it is no such value."""
        if not first:
            return None
        try:
            key, index, ntokens, total = blob_identity(first)
        except NewerBlobError:
            return 0
        except CorruptFrameError:
            return None
        if (key, index, ntokens) != tuple(chunk) or -(-total // self.config.part_bytes) > self.config.max_parts:
            return None
        return total if first_len == min(self.config.part_bytes, total) else None

    def get(self, ns_tag: str, key: bytes, *, scratch=None) -> Optional[memoryview]:
        """The verified blob or None (miss, server down, corrupt: the corrupt entry is deleted).

        scratch: a ScratchPool the value may be read into (give it back with
        ``scratch.put(view.obj)``)."""
        t0 = time.perf_counter()

        pb = self.config.part_bytes

        def alloc(n):
            return memoryview(scratch.get(n) if scratch is not None else bytearray(n))[:n]

        def raw_op():
            data = self._raw_parts(ns_tag, key, alloc)
            if data is None or data is False:
                return (None if data is None else b""), (None if data is None else False)
            return data, None

        def op():
            try:
                return parts()
            except self._reply_errors as exc:
                if not self._holds_other_type(exc):
                    raise
                return b"", False

        def parts():
            first = self.client.get(self._key(ns_tag, key, 0))
            if first is None:
                return first, None
            try:
                total = blob_total_size(first)
            except CorruptFrameError:
                return first, None
            nparts = -(-total // pb)
            if nparts <= 1 or len(first) != pb:
                return first, None
            if nparts > self.config.max_parts:  # a damaged size: allocate nothing for it
                return first, False
            buf = bytearray(total)
            mv = memoryview(buf)
            mv[:pb] = first

            def fetch(i):  # parts arrive in parallel, each on its own connection
                v = self.client.get(self._key(ns_tag, key, i))
                if v is None or len(v) != min(pb, total - i * pb):
                    return False
                mv[i * pb:i * pb + len(v)] = v
                return True

            ok = all(self._parts.map(fetch, range(1, nparts)))
            return first, (mv if ok else False)

        try:
            first, rest = self._run(raw_op if self._raw is not None else op, self.config.op_timeout_s)
        except _Skipped:
            self.metrics.inc(self.name, "skipped")
            self.metrics.inc(self.name, "misses")
            return None
        except self._errors:
            self.metrics.inc(self.name, "misses")
            return None
        return self._verify(ns_tag, key, first, rest, t0)

    @property
    def can_stream(self) -> bool:
        """True when stream() reads values as they arrive (standalone redis://)."""
        return self._raw is not None

    def stream(self, ns_tag: str, key: bytes, *, scratch=None) -> Optional["RemoteRead"]:
        """Starts receiving key's blob (pipelined GETs straight into memory); the caller
        decodes what has arrived (RemoteRead.wait) while the rest is in flight, then calls
        finish(). None when this tier cannot stream or the breaker is open (a miss)."""
        if self._raw is None:
            return None
        try:
            return RemoteRead(self, ns_tag, key, scratch)
        except _Skipped:
            self.metrics.inc(self.name, "skipped")
            self.metrics.inc(self.name, "misses")
            return None

    def _verify(self, ns_tag: str, key: bytes, first, rest, t0: float, digest: Optional[int] = None
                ) -> Optional[memoryview]:
        """The checks every read ends with: counts a hit, or a miss (deleting a corrupt entry)."""
        if first is None:
            self.metrics.inc(self.name, "misses")
            return None
        try:
            if rest is False:
                raise CorruptFrameError("missing or short parts")
            total = blob_total_size(first)
            data = memoryview(first) if rest is None else rest
            if data.nbytes != total:
                raise CorruptFrameError("size mismatch")
            h = BlobHeader.parse(data, verify=True, digest=digest)
            if h.key != key:
                raise CorruptFrameError("value holds another key")
        except CorruptFrameError as exc:
            self.metrics.inc(self.name, "misses")
            if not isinstance(exc, NewerBlobError):  # a newer kvcore's value stays for its readers
                self.metrics.inc(self.name, "corrupt")
                self.delete(ns_tag, [key])
            return None
        if not can_decode(h.codec):  # a newer kvcore's codec (or the native one, not built here): a
            self.metrics.inc(self.name, "misses")  # miss, and the value stays for the readers that decode it
            return None
        self.metrics.inc(self.name, "hits")
        self.metrics.inc(self.name, "bytes_out", data.nbytes)
        self.metrics.observe("remote_get", time.perf_counter() - t0)
        return data

    def put(self, ns_tag: str, key: bytes, blob, *, ttl_s: Optional[float] = None) -> bool:
        """Stores blob: parts 1.. in parallel, then part 0 (the commit record: a reader that
        finds part 0 finds every part). False when skipped or failed."""
        view = memoryview(blob).cast("B")
        total = view.nbytes
        pb = self.config.part_bytes
        nparts = max(1, (total + pb - 1) // pb)
        px = self._px(ttl_s)
        t0 = time.perf_counter()

        def put_part(i):
            self.client.set(self._key(ns_tag, key, i), view[i * pb:(i + 1) * pb], px=px)

        def op():
            for _ in self._parts.map(put_part, range(1, nparts)):
                pass
            put_part(0)

        try:
            self._run(op, max(self.config.op_timeout_s, total / 50e6))
        except _Skipped:
            self.metrics.inc(self.name, "skipped")
            return False
        except self._errors:
            return False
        self.metrics.inc(self.name, "stores")
        self.metrics.inc(self.name, "bytes_in", total)
        self.metrics.observe("remote_put", time.perf_counter() - t0)
        return True

    def delete(self, ns_tag: str, keys: Sequence[bytes], *, timeout: Optional[float] = None) -> int:
        """Deletes chunks (every part) and returns how many were there (0 after a failure or
        a timeout). Waits at most timeout seconds (default op_timeout_s)."""
        if not keys:
            return 0

        def op():
            n = 0
            for k in keys:
                try:
                    first = self.client.getrange(self._key(ns_tag, k, 0), 0, HEAD_PEEK_BYTES)
                except self._reply_errors as exc:
                    if not self._holds_other_type(exc):
                        raise
                    first = b""  # not a value of ours: one key to delete
                n += bool(self.client.delete(*[self._key(ns_tag, k, i) for i in range(self._parts_of(first))]))
            return n

        try:
            return self._run(op, self.config.op_timeout_s if timeout is None else timeout)
        except (_Skipped, *self._errors):
            return 0

    def _px(self, ttl_s: Optional[float]) -> Optional[int]:
        """The PX (ms) of a value given ttl_s (None: the config's ttl_s); None: no expiry."""
        ttl = ttl_s if ttl_s is not None else self.config.ttl_s
        return max(1, int(ttl * 1000)) if ttl else None

    def _parts_of(self, first: bytes) -> int:
        """How many parts the value whose part 0 begins with first has (1 when first is no
        blob header; a damaged size may claim millions: no value has more than max_parts)."""
        try:
            parts = -(-blob_total_size(first) // self.config.part_bytes)
        except CorruptFrameError:
            parts = 1
        return min(max(1, parts), self.config.max_parts)

    def set_expiry(self, ns_tag: str, keys: Sequence[bytes], *, ttl_s: Optional[float] = None,
                   timeout: Optional[float] = None) -> list[bool]:
        """Gives the stored chunks among keys a new TTL (None: the config's ttl_s; none: no
        expiry), every part of each, without sending their data: one pipelined read of
        each part 0's header (which gives the part count), then one pipeline of PEXPIRE
        (PERSIST), part 0 last as in put(). Returns which keys were stored (all False
        after a failure or a timeout); waits at most timeout seconds (default op_timeout_s)."""
        if not keys:
            return []
        px = self._px(ttl_s)

        def op():
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.getrange(self._key(ns_tag, k, 0), 0, HEAD_PEEK_BYTES)
            # a key of another type answers WRONGTYPE: not one of ours, like a missing one
            firsts = pipe.execute(raise_on_error=False)
            for first in firsts:
                if isinstance(first, Exception) and not self._holds_other_type(first):
                    raise first
            stored = [isinstance(first, bytes) and len(first) > 0 for first in firsts]
            pipe = self.client.pipeline(transaction=False)
            for k, first, there in zip(keys, firsts, stored):
                if not there:
                    continue
                for i in [*range(1, self._parts_of(first)), 0]:
                    if px:
                        pipe.pexpire(self._key(ns_tag, k, i), px)
                    else:
                        pipe.persist(self._key(ns_tag, k, i))
            pipe.execute()
            return stored

        try:
            return self._run(op, self.config.op_timeout_s if timeout is None else timeout)
        except _Skipped:
            self.metrics.inc(self.name, "skipped")
        except self._errors:
            pass
        return [False] * len(keys)

    def clear(self, ns_tag: Optional[str] = None) -> int:
        """Deletes every chunk of a namespace (all kvcore chunks when ns_tag is None);
        returns the number of chunks."""
        pattern = f"{self.config.prefix}:{ns_tag or '*'}:*"

        def op():
            chunks = 0
            batch = []
            for k in self.client.scan_iter(match=pattern, count=1000):
                batch.append(k)
                chunks += k.endswith(b":0")
                if len(batch) >= 1000:
                    self.client.delete(*batch)
                    batch = []
            if batch:
                self.client.delete(*batch)
            return chunks

        try:
            return self._run(op, max(self.config.op_timeout_s, 30.0))
        except (_Skipped, *self._errors):
            return 0

    def close(self) -> None:
        """Returns at once: pending operations are abandoned (they end at their socket timeout)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._parts.shutdown(wait=False, cancel_futures=True)
        if self._raw is not None:
            self._raw.close()
        try:
            if hasattr(self.client, "connection_pool"):
                self.client.connection_pool.disconnect(inuse_connections=False)
            else:
                self.client.close()
        except Exception:
            pass


class RemoteRead:
    """One blob being received from the remote tier (RemoteTier.stream): its parts land
    in order in ``view``; wait(upto) blocks until the first upto bytes are there (at most
    until op_timeout_s after the start), so the caller decodes them while the rest is in
    flight; the receiving thread hashes each part as it lands; finish() verifies."""

    def __init__(self, tier: RemoteTier, ns_tag: str, key: bytes, scratch):
        self.tier, self.ns_tag, self.key = tier, ns_tag, key
        self.view: Optional[memoryview] = None
        self.size: Optional[int] = None
        self._scratch = scratch
        self._landed = 0
        self._done = False
        self._sum = StreamingChecksum()
        self._hashed = 0
        self._cond = threading.Condition()
        self._t0 = time.perf_counter()
        self._deadline = time.monotonic() + tier.config.op_timeout_s
        self._fut = tier._submit(self._op)
        self._fut.add_done_callback(self._cancelled)

    def _cancelled(self, fut) -> None:
        if fut.cancelled():  # close() dropped it before it ran: the reader must not wait it out
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _alloc(self, n: int) -> memoryview:
        buf = self._scratch.get(n) if self._scratch is not None else bytearray(n)
        with self._cond:
            self.view = memoryview(buf)[:n]
            self.size = n
        return self.view

    def _on_landed(self, n: int) -> None:
        end = min(n, body_size(self.size))
        if end > self._hashed:
            self._sum.update(self.view[self._hashed:end])
            self._hashed = end
        with self._cond:
            self._landed = n
            self._cond.notify_all()

    def _op(self):
        try:
            return self.tier._raw_parts(self.ns_tag, self.key, self._alloc, on_landed=self._on_landed)
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def wait(self, upto: int) -> bool:
        """Blocks until the first upto bytes (clamped to the value's size) are in view;
        False when the value is missing, the read failed or ran out of time."""
        with self._cond:
            while True:
                if self.size is not None and self._landed >= min(upto, self.size):
                    return True
                if self._done:
                    return False
                left = self._deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)

    def finish(self) -> Optional[memoryview]:
        """The whole verified blob, or None (a miss: missing, failed, timed out or corrupt;
        counted, a corrupt entry deleted)."""
        t = self.tier
        try:
            data = t._result(self._fut, self._deadline - time.monotonic())
        except self._tier_errors():
            t.metrics.inc(t.name, "misses")
            return None
        if data is None:
            first, rest = None, None
        elif data is False:
            first, rest = b"", False
        else:
            first, rest = data, data
        return t._verify(self.ns_tag, self.key, first, rest, self._t0,
                         digest=self._sum.intdigest() if rest is not None and rest is not False else None)

    def _tier_errors(self) -> tuple:
        return self.tier._errors

    @property
    def lent(self) -> bool:
        """True while the receiving thread may still write into view (after a timeout):
        the buffer must then not be reused."""
        return not self._fut.done()

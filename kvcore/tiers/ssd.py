"""The SSD tier: one directory, one file per chunk, durable and self-checking.

- Writes are atomic: temporary file, write, fsync, rename, fsync of the directory.
  The written pages are then dropped from the page cache (the SSD tier must not
  silently occupy host memory).
- Reads verify the blob checksum; a corrupt or partial file is a miss and is removed.
- Reads go into reusable page-aligned buffers as 2 MiB O_DIRECT segments, several in
  flight (``direct_io="auto"``, the default: where the filesystem allows it; no page-cache
  copy or pollution); ``direct_io=False`` reads through the page cache.
- A byte capacity: policy victims are removed to make room (expired files first, then
  by the caller's levels, a chunk only after the chunks held here that extend it: see
  ``kvcore/tiers/policy.py``); a write that cannot fit, or that fails (ENOSPC, EIO), is
  skipped cleanly and counted.
- The index is rebuilt from the directory at start, so a restart keeps the cache.
- Several processes may open one directory (engine replicas on one machine): they see
  each other's chunks, keep the directory as a whole within the capacity and never
  remove each other's writes in flight (``ssd_journal``).

File layout under ``<dir>/kvcore-v1/``: ``<namespace tag>/<key hex>.<start>.<ntokens>.<expires>.kvc``
(expires: unix time in ms, 0 = never; the key of the chunk it extends, when known, in the
file's extended attribute ``user.kvcore.parent``); ``tmp/<owner>/`` (each process's
temporaries), ``owners/<owner>``, ``lock`` and ``journal`` (``kvcore/tiers/ssd_journal.py``).

>>> import tempfile
>>> from kvcore.tiers.ssd import SSDTier
>>> d = tempfile.mkdtemp()
>>> t = SSDTier(d, 1 << 20)
>>> t.write(b"k" * 16, b"not a real blob", ns_tag="00", verify_blob=False)
True
>>> SSDTier(d, 1 << 20).contains(b"k" * 16)  # a new process finds it
True
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import errno
import heapq
import mmap
import os
import re
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Union

from ..errors import CorruptFrameError, InvalidArgumentError
from .blob import BlobHeader, NewerBlobError, StreamingChecksum, body_size
from .codecs import can_decode
from .metrics import Metrics
from .policy import EXPIRED_LEVEL, LRUPolicy, Policy
from .ssd_journal import ADD, CAP, DEL, LEFT, OWNERS_DIR, REL, RES, TMP_DIR, TOUCH, DirJournal, Record

LAYOUT_DIR = "kvcore-v1"
_NAME = re.compile(r"^([0-9a-f]{32})\.(\d+)\.(\d+)\.(\d+)\.kvc$")
_NS_TAG = re.compile(r"^[0-9A-Za-z_-]{1,16}$")
_ALIGN = 4096
_HUGE = 2 << 20
DIRECT_MIN_BYTES = 1 << 20  # below this, buffered reads
# Reads of one file: O_DIRECT segments of 2 MiB, up to READ_THREADS in flight (on this
# project's VM disk: ~2.8 GB/s cold, vs ~1.5 GB/s for buffered reads with readahead and
# ~0.6 GB/s for one large O_DIRECT read); buffered reads in larger segments.
DIRECT_SEGMENT_BYTES = 2 << 20
BUFFERED_SEGMENT_BYTES = 4 << 20
READ_THREADS = 8
IN_FLIGHT = 4  # segments of one file read at once
# Streamed writes (StreamWrite): data is sent in pieces of at least this many bytes, on
# up to WRITE_THREADS threads, while the rest of the blob is still being encoded.
WRITE_SEGMENT_BYTES = 2 << 20
WRITE_THREADS = 4
FLUSH_EVERY_BYTES = 8 << 20
ROOM_ATTEMPTS = 4  # rounds of eviction before a write is refused (other processes take room too)
# A chunk file's parent (the key of the chunk it extends) rides in this extended attribute:
# not in its name, which kvcore versions before it would not parse (their start removes such
# files), nor in its blob or the journal's fixed records. It follows the file through renames.
PARENT_XATTR = "user.kvcore.parent"


@dataclass
class SSDEntry:
    path: Path
    size: int
    ns_tag: str
    start: int
    ntokens: int
    expires_ms: int
    # the key of the chunk this one extends, when known (PARENT_XATTR: files of earlier
    # versions, and on filesystems without user extended attributes, have none)
    parent: Optional[bytes] = None

    def expired(self, now_ms: Optional[int] = None) -> bool:
        return bool(self.expires_ms) and (now_ms or int(time.time() * 1000)) >= self.expires_ms


class SSDTier:
    """Chunk blobs as files under ``directory`` within ``capacity_bytes``. Thread-safe, and
    shared: tiers of several processes on one directory see each other's chunks and keep
    the directory as a whole within the capacity (``kvcore/tiers/ssd_journal.py``).
    ``used_bytes`` counts the whole directory: files plus every owner's writes in flight.
    """

    name = "ssd"

    def __init__(self, directory: Union[str, os.PathLike], capacity_bytes: int, *,
                 direct_io: Union[bool, str] = "auto", fsync: bool = True, drop_cache: bool = True,
                 policy: Optional[Policy] = None, metrics: Optional[Metrics] = None,
                 evictable: Optional[Callable[[bytes], bool]] = None,
                 levels: Optional[Callable[[], Mapping[bytes, int]]] = None,
                 on_evict: Optional[Callable[[bytes, "SSDEntry"], None]] = None):
        if capacity_bytes < 0:
            raise InvalidArgumentError("capacity_bytes must be >= 0")
        if direct_io not in (True, False, "auto"):
            raise InvalidArgumentError("direct_io must be True, False or 'auto'")
        self.root = Path(directory) / LAYOUT_DIR
        self.own_capacity_bytes = int(capacity_bytes)  # what this tier was given
        self.direct_io = direct_io
        self.fsync = fsync
        self.drop_cache = drop_cache
        self.policy = policy or LRUPolicy()
        self.metrics = metrics or Metrics()
        self.evictable = evictable
        # the eviction levels of the keys whose level is not 0 (Policy.victims; the
        # manager's priorities and expiries), asked for at each eviction
        self.levels = levels
        # called with a victim before its file is removed (a copy may be taken from
        # entry.path), after the tier's locks are released. The victim has left the index
        # by then, but stays in _leaving until on_evict returns: this process's lookups and
        # reads still find it (its file, moved into this owner's temporaries) while the
        # copy is on its way, unless remove() drops it first (leaving() then says so: the
        # copy is to be deleted). Other processes applied its DEL record: they miss it then.
        self.on_evict = on_evict
        self.index: dict[bytes, SSDEntry] = {}
        self._leaving: dict[bytes, SSDEntry] = {}  # victims offered to on_evict, not yet removed
        self._evicting = 0  # sections taking victims out of the index (see _find)
        self._expiring: list[tuple[int, bytes]] = []  # heap of (expires_ms, key); stale ones stay until compacted
        self.last_error: Optional[str] = None
        self._indexed_bytes = 0  # sizes of the files in the index
        self._own_reserved: dict[bytes, int] = {}  # reservation id -> bytes (this tier's writes)
        self._foreign_reserved: dict[tuple[bytes, bytes], int] = {}  # (owner, id) -> bytes
        self._foreign_caps: dict[bytes, int] = {}  # other owners' capacities
        self._reserved_bytes = 0  # both
        self._next_rid = 0
        self._pending: list[Record] = []  # journal records of the change in progress
        self._lock = threading.RLock()
        self._applying = False  # a thread is applying journal records (see refresh)
        self._direct_ok = hasattr(os, "O_DIRECT") and direct_io is not False
        self._readers: Optional[cf.ThreadPoolExecutor] = None
        self._writers: Optional[cf.ThreadPoolExecutor] = None
        self._closed = False
        self._journal = DirJournal(self.root)
        self._tmp = self._journal.tmp_dir
        self.rebuild_index()

    @property
    def used_bytes(self) -> int:
        """Bytes of the whole directory: every file plus every owner's writes in flight."""
        self.refresh()
        return self._used()

    def _used(self) -> int:
        return self._indexed_bytes + self._reserved_bytes

    @property
    def capacity_bytes(self) -> int:
        """The directory's capacity: the smallest of its live owners' (this tier's own
        is own_capacity_bytes), so no process sees the directory exceed what it was given."""
        self.refresh()
        return self._capacity()

    def _capacity(self) -> int:
        return min([self.own_capacity_bytes, *self._foreign_caps.values()])

    # ---- the shared directory ----
    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Holds the tier's lock and the directory's, with every other process's change
        applied; the journal records of this change are appended on the way out."""
        with self._lock, self._journal.exclusive():
            self._apply_journal()
            try:
                yield
            finally:
                records, self._pending = self._pending, []
                self._journal.append(*records)
                if self._journal.needs_compaction():
                    try:
                        self._journal.replace(self._snapshot())
                    except OSError as exc:  # a full disk: tried again at the next change
                        self._failed(exc)

    def refresh(self) -> None:
        """Applies what other processes changed since the last look (one fstat when nothing did).

        The journal counts records as read before they are applied, so a thread that
        finds nothing new while another thread is applying them waits for it; else it
        would look at the index without the records just read (a chunk that is there
        would be a miss)."""
        if self._journal.has_new() or self._applying:
            with self._lock:
                self._apply_journal()

    def _apply_journal(self) -> None:
        """(tier lock held) Applies the journal's new records."""
        self._applying = True
        try:
            reloaded, records = self._journal.read_new()
            if reloaded:
                self._reload(records)
                return
            me = self._journal.owner
            for r in records:
                if r.owner != me:
                    self._apply(r)
        finally:
            self._applying = False

    def _apply(self, r: Record) -> None:
        if r.op == ADD:
            if not _valid_ns_tag(r.ns_tag):  # never a path outside the directory
                self._journal.corrupt_records += 1
                return
            self._index_put(r.key, self._entry_of(r))
        elif r.op == DEL:
            self._index_pop(r.key)
        elif r.op == RES:
            self._foreign_reserved[(r.owner, r.key)] = r.size
            self._reserved_bytes += r.size
        elif r.op == REL:
            self._reserved_bytes -= self._foreign_reserved.pop((r.owner, r.key), 0)
        elif r.op == TOUCH:
            self.policy.touch(r.key)
        elif r.op == CAP:
            if self._journal.owner_alive(r.owner):  # a stale record never shrinks the directory
                self._foreign_caps[r.owner] = r.size
        elif r.op == LEFT:
            self._foreign_caps.pop(r.owner, None)

    def _reload(self, records: list[Record]) -> None:
        """The journal was replaced by a snapshot: it lists every file and reservation."""
        me = self._journal.owner
        files: dict[bytes, Record] = {}
        for r in records:
            if r.op == ADD and _valid_ns_tag(r.ns_tag):
                files[r.key] = r
            elif r.op == DEL:
                files.pop(r.key, None)
        for key in [k for k in self.index if k not in files]:
            self._index_pop(key)
        for key, r in files.items():
            e = self.index.get(key)
            if e is None or e.size != r.size or e.path.name != _file_name(key, r.start, r.ntokens, r.expires_ms):
                self._index_put(key, self._entry_of(r))
        self._reserved_bytes -= sum(self._foreign_reserved.values())
        self._foreign_reserved.clear()
        self._foreign_caps.clear()
        for r in records:
            if r.owner != me and r.op in (RES, REL, CAP, LEFT):
                self._apply(r)

    def _snapshot(self) -> list[Record]:
        me = self._journal.owner
        out = [Record(ADD, me, k, e.ns_tag, e.size, e.expires_ms, e.start, e.ntokens) for k, e in self.index.items()]
        out += [Record(RES, me, rid, size=n) for rid, n in self._own_reserved.items()]
        out += [Record(RES, o, rid, size=n) for (o, rid), n in self._foreign_reserved.items()]
        out += [Record(CAP, me, bytes(16), size=self.own_capacity_bytes)]
        out += [Record(CAP, o, bytes(16), size=n) for o, n in self._foreign_caps.items()]
        return out

    def _record(self, op: int, key: bytes, e: Optional[SSDEntry] = None, size: int = 0) -> None:
        if e is None:
            self._pending.append(Record(op, self._journal.owner, key, size=size))
        else:
            self._pending.append(Record(op, self._journal.owner, key, e.ns_tag, e.size, e.expires_ms, e.start,
                                        e.ntokens))

    def _entry(self, key: bytes, ns_tag: str, size: int, start: int, ntokens: int, expires_ms: int) -> SSDEntry:
        """The entry of key's file (its path follows from the other fields)."""
        return SSDEntry(self.root / ns_tag / _file_name(key, start, ntokens, expires_ms), size, ns_tag, start,
                        ntokens, expires_ms)

    def _entry_of(self, r: Record) -> SSDEntry:
        """The entry of the file another owner's ADD record names, its parent read from it."""
        e = self._entry(r.key, r.ns_tag, r.size, r.start, r.ntokens, r.expires_ms)
        e.parent = _parent_of_file(e.path, r.key, r.start)
        return e

    def _index_put(self, key: bytes, e: SSDEntry) -> None:
        old = self._index_pop(key)
        if e.parent is None and old is not None:  # rewritten (a new expiry): the same chunk
            e.parent = old.parent
        self.index[key] = e
        self._indexed_bytes += e.size
        self.policy.add(key, size=e.size, start=e.start, ntokens=e.ntokens, parent=e.parent)
        self._note_expiry(key, e)

    def _note_expiry(self, key: bytes, e: SSDEntry) -> None:
        """Puts an indexed entry's expiry on the heap _expired_keys walks (lock held)."""
        if e.expires_ms:
            if len(self._expiring) > 2 * len(self.index) + 64:
                self._expiring = [(x.expires_ms, k) for k, x in self.index.items() if x.expires_ms]
                heapq.heapify(self._expiring)
            heapq.heappush(self._expiring, (e.expires_ms, key))

    def _expired_keys(self, now_ms: int) -> list[bytes]:
        """The indexed keys past their expiry: a walk of the heap's expired top only."""
        heap, out, todo = self._expiring, [], [0]
        while todo:
            i = todo.pop()
            if i < len(heap) and heap[i][0] <= now_ms:
                expires_ms, key = heap[i]
                e = self.index.get(key)
                if e is not None and e.expires_ms == expires_ms:
                    out.append(key)
                todo += (2 * i + 1, 2 * i + 2)
        return out

    def _eviction_levels(self) -> dict[bytes, int]:
        """The caller's levels (the manager's priorities and expiries), with every file past
        its own expiry (maybe another process's) at EXPIRED_LEVEL."""
        levels = dict(self.levels()) if self.levels is not None else {}
        for key in self._expired_keys(int(time.time() * 1000)):
            levels[key] = EXPIRED_LEVEL
        return levels

    def _index_pop(self, key: bytes) -> Optional[SSDEntry]:
        e = self.index.pop(key, None)
        if e is not None:
            self._indexed_bytes -= e.size
            self.policy.remove(key)
        return e

    def _hold(self, size: int) -> bytes:
        """A reservation of size bytes for a write of this tier (recorded)."""
        self._next_rid += 1
        rid = self._next_rid.to_bytes(16, "little")
        self._own_reserved[rid] = size
        self._reserved_bytes += size
        self._record(RES, rid, size=size)
        return rid

    def _drop_hold(self, rid: bytes) -> None:
        if rid in self._own_reserved:
            self._reserved_bytes -= self._own_reserved.pop(rid)
            self._record(REL, rid)

    def _release(self, rid: bytes) -> None:
        with self._changing():
            self._drop_hold(rid)

    # ---- index ----
    def rebuild_index(self) -> None:
        """Scans the directory: indexes every well-named file, removes leftovers (the
        temporaries of owners that are gone) and writes the journal's snapshot."""
        with self._changing():
            for owner in self._journal.dead_owners():
                self._journal.remove_owner(owner)
            tmp_root = self.root / TMP_DIR
            for leftover in tmp_root.iterdir():
                if not leftover.is_dir():  # written by a kvcore before shared directories
                    _unlink(leftover)
            found = []
            now_ms = int(time.time() * 1000)
            for nsdir in self.root.iterdir():
                # a directory the tier did not make (its name is no namespace tag) is left alone:
                # its name would not fit a journal record, and its files are not chunks
                if not _valid_ns_tag(nsdir.name) or not nsdir.is_dir():
                    continue
                for f in nsdir.iterdir():
                    name = _parse_name(f.name)
                    try:
                        st = f.stat()
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):  # not one of the tier's (it makes none there)
                        continue
                    if name is None or st.st_size == 0:
                        _unlink(f)
                        continue
                    key, start, ntokens, expires_ms = name
                    e = SSDEntry(f, st.st_size, nsdir.name, start, ntokens, expires_ms, _parent_of_file(f, key, start))
                    if e.expired(now_ms):
                        _unlink(f)
                        continue
                    found.append((st.st_mtime, key, e))
            found.sort(key=lambda x: x[0])
            for key in list(self.index):
                self._index_pop(key)
            self.policy.clear()
            self._expiring.clear()
            for _, key, e in found:
                self._index_put(key, e)
            # reservations of owners still alive stay (their files are still being written)
            self._drop_dead_reservations()
            _, victims = self._take_room(0)  # a smaller capacity than last time
            self._pending.clear()
            self._journal.replace(self._snapshot())
        self._finish_evictions(victims)

    def __len__(self) -> int:
        self.refresh()
        return len(self.index)

    def contains(self, key: bytes) -> bool:
        self.refresh()  # another process may have stored or removed it
        e = self._find(key)
        if e is None:
            return False
        if e.expired():
            self.remove(key)
            return False
        return True

    def entry(self, key: bytes) -> Optional[SSDEntry]:
        """key's entry: its file in the directory, or a victim's still being demoted (its
        path then names the file in this owner's temporaries)."""
        self.refresh()
        return self._find(key)

    def _find(self, key: bytes) -> Optional[SSDEntry]:
        """key's entry in the index or among the victims being demoted. Without the lock
        while no victim is being taken or demoted (the common miss): a victim leaves the
        index and joins _leaving in one locked section, during which _evicting is set."""
        e = self.index.get(key)
        if e is None and (self._evicting or self._leaving):
            with self._lock:
                e = self.index.get(key) or self._leaving.get(key)
        return e

    def keys(self, ns_tag: Optional[str] = None) -> list[bytes]:
        with self._lock:
            self._apply_journal()
            return [k for k, e in self.index.items() if ns_tag is None or e.ns_tag == ns_tag]

    # ---- capacity ----
    def _make_room(self, nbytes: int, keep: Optional[bytes] = None) -> tuple[bool, list]:
        """(fits, victims) (inside _changing): evicts until nbytes more fit (never keep,
        nor what keep extends: see write()). Without
        on_evict a victim's file is removed at once. With it, the file is moved into this
        owner's temporaries and stays reserved until _finish_evictions (after the locks
        are released) has offered it to on_evict and removed it: fits is then False and
        the caller looks for room again (_with_room)."""
        victims: list = []
        if nbytes > self._capacity():
            return False, victims
        if self._used() + nbytes <= self._capacity():
            return True, victims
        if self._drop_dead_reservations() and self._used() + nbytes <= self._capacity():
            return True, victims
        leaving = 0  # bytes of victims still on disk
        def evictable(key: bytes) -> bool:
            return key != keep and (self.evictable is None or self.evictable(key))

        for key in self.policy.victims(evictable=evictable, levels=self._eviction_levels()):
            e = self._index_pop(key)
            if e is None:
                continue
            self._record(DEL, key)
            self.metrics.inc(self.name, "evictions")
            if self.on_evict is None:
                _unlink(e.path)
            else:
                moved = self._tmp / f"{key.hex()}.{self._next_rid + 1}.evicted"
                try:
                    os.rename(e.path, moved)
                except OSError:  # already gone
                    pass
                else:
                    victims.append((key, replace(e, path=moved), self._hold(e.size)))
                    leaving += e.size
            if self._used() - leaving + nbytes <= self._capacity():
                break
        return not victims and self._used() + nbytes <= self._capacity(), victims

    def _take_room(self, nbytes: int, keep: Optional[bytes] = None) -> tuple[bool, list]:
        """_make_room (inside _changing), its victims kept findable (_leaving) until
        _finish_evictions has offered them to on_evict."""
        self._evicting += 1
        try:
            fits, victims = self._make_room(nbytes, keep)
            self._leaving.update((key, e) for key, e, _ in victims)
        finally:
            self._evicting -= 1
        return fits, victims

    def _with_room(self, nbytes: int, then: Callable[[], None], first: Optional[Callable[[], None]] = None,
                   keep: Optional[bytes] = None) -> bool:
        """Runs then() inside _changing once nbytes more fit (first() before, once; keep:
        see _make_room); False (counted as rejected) when they cannot be made free."""
        for attempt in range(ROOM_ATTEMPTS):
            with self._changing():
                if self._journal.left:  # closed: without its lock and journal, nothing may change
                    break
                if first is not None and attempt == 0:
                    first()
                fits, victims = self._take_room(nbytes, keep)
                if fits:
                    then()
            self._finish_evictions(victims)
            if fits:
                return True
            if not victims:
                break
        self.metrics.inc(self.name, "rejected")
        return False

    def _drop_dead_reservations(self) -> bool:
        """Releases (and records) the reservations and capacities of owners whose process is gone."""
        owners = {o for o, _ in self._foreign_reserved} | set(self._foreign_caps)
        dead = {o for o in owners if not self._journal.owner_alive(o)}
        for o, rid in [k for k in self._foreign_reserved if k[0] in dead]:
            self._reserved_bytes -= self._foreign_reserved.pop((o, rid))
            self._pending.append(Record(REL, o, rid))
        for o in dead:
            if self._foreign_caps.pop(o, None) is not None:
                self._pending.append(Record(LEFT, o, bytes(16)))
            self._journal.remove_owner(o)
        return bool(dead)

    def _finish_evictions(self, victims: list) -> None:
        if not victims:
            return
        for key, e, _ in victims:
            if self.on_evict is not None:
                try:
                    self.on_evict(key, e)
                except Exception:
                    self.metrics.inc(self.name, "errors")
            with self._lock:  # from now on a miss: its copy has landed elsewhere, or failed to
                if self._leaving.get(key) is e:
                    del self._leaving[key]
            _unlink(e.path)  # a read that opened it first still reads it whole
        with self._changing():
            for _, _, rid in victims:
                self._drop_hold(rid)

    # ---- write ----
    def _reserve(self, key: bytes, size: int, keep: Optional[bytes] = None) -> Optional[bytes]:
        """Drops key's old file and holds size bytes of capacity for its new one: the
        reservation id, or None (counted as rejected) when they cannot be made free."""
        held: list[bytes] = []

        def drop_old() -> None:
            old = self._index_pop(key)
            if old is not None:
                self._record(DEL, key)
                _unlink(old.path)

        return held[0] if self._with_room(size, lambda: held.append(self._hold(size)), drop_old, keep) else None

    def _commit(self, key: bytes, tmp: Path, entry: SSDEntry, rid: bytes, extra: int = 0) -> bool:
        """Moves a written temporary file into place and indexes it, with extra bytes more
        than were reserved made free first; False (counted) when they cannot be."""
        def publish() -> None:
            entry.path.parent.mkdir(exist_ok=True)
            os.rename(tmp, entry.path)  # under the directory lock: others see it with its record
            # A write of key that began before ours committed first (another process's, with
            # another expiry: another file name): its file goes, else it stays uncounted.
            old = self.index.get(key)
            if old is not None and old.path != entry.path:
                _unlink(old.path)
            self._drop_hold(rid)
            self._index_put(key, entry)
            self._record(ADD, key, entry)
        return self._with_room(max(0, extra), publish)

    def write(self, key: bytes, blob, *, ns_tag: str, start: int = 0, ntokens: int = 0,
              expires_ms: int = 0, verify_blob: bool = True, parent: Optional[bytes] = None,
              keep: Optional[bytes] = None) -> bool:
        """Stores blob under key durably (parent: the key of the chunk it extends, when
        known: it is not evicted before this one; keep: the nearest chunk of its prefix
        held here, which its room is not made by evicting, so that a sequence longer than
        the room does not push its own prefix out). Returns False (and counts why) when
        it was skipped."""
        _check_ns_tag(ns_tag)
        view = memoryview(blob).cast("B")
        size = view.nbytes
        if verify_blob:
            BlobHeader.parse(view)  # refuse to persist garbage
        rid = self._reserve(key, size, keep)  # held while the file is written
        if rid is None:
            return False
        t0 = time.perf_counter()
        entry = replace(self._entry(key, ns_tag, size, start, ntokens, expires_ms), parent=parent)
        tmp = self._tmp / f"{key.hex()}.{threading.get_ident()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _mark_parent(fd, parent)
                pos = 0
                while pos < size:
                    pos += os.write(fd, view[pos:])
                if self.fsync:
                    os.fsync(fd)
                if self.drop_cache and hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            if not self._commit(key, tmp, entry, rid):  # no extra bytes, but the directory's capacity
                _unlink(tmp)  # may have shrunk meanwhile (an owner given less joined): counted
                self._release(rid)
                return False
            if self.fsync:
                _fsync_dir(entry.path.parent)
        except OSError as exc:
            _unlink(tmp)
            self._release(rid)
            self._failed(exc)
            return False
        self.metrics.inc(self.name, "stores")
        self.metrics.inc(self.name, "bytes_in", size)
        self.metrics.observe("ssd_write", time.perf_counter() - t0)
        return True

    def begin_write(self, key: bytes, buffer, *, ns_tag: str, reserve: int, start: int = 0, ntokens: int = 0,
                    expires_ms: int = 0, parent: Optional[bytes] = None,
                    keep: Optional[bytes] = None) -> Optional["StreamWrite"]:
        """Starts writing key's file while its blob is still being produced in buffer (a
        page-aligned writable buffer, e.g. from a ScratchPool, longer than the blob
        rounded up to 4 KiB). reserve: bytes to hold for it now (the blob's expected
        size; commit() settles the difference); parent, keep: as for write(). None when it
        cannot fit (counted).
        """
        _check_ns_tag(ns_tag)
        rid = self._reserve(key, reserve, keep)
        if rid is None:
            return None
        try:
            return StreamWrite(self, key, buffer, rid, ns_tag=ns_tag, reserve=reserve, start=start, ntokens=ntokens,
                               expires_ms=expires_ms, parent=parent)
        except OSError as exc:
            self._release(rid)
            self._failed(exc)
            return None

    def _failed(self, exc: Exception) -> None:
        self.metrics.inc(self.name, "errors")
        if isinstance(exc, OSError):
            self.last_error = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno, exc.errno)})"
        else:
            self.last_error = f"{type(exc).__name__}: {exc}"

    def _write_executor(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._writers is None:
                self._writers = cf.ThreadPoolExecutor(max_workers=WRITE_THREADS,
                                                      thread_name_prefix="kvcore-ssd-write")
            return self._writers

    def set_expiry(self, key: bytes, expires_ms: int) -> bool:
        """Gives key's file another expiry (0: never) by renaming it (its name carries the
        expiry; the data is not rewritten). A victim being demoted takes it along instead:
        its entry, which on_evict holds, gets it (the copy on_evict made is to take it once
        it has landed). False when key has no file here."""
        with self._changing():
            if self._journal.left:
                return False
            e = self.index.get(key)
            if e is None:
                return self._retime_leaving(key, expires_ms)
            if e.expires_ms == expires_ms:
                return True
            moved = replace(self._entry(key, e.ns_tag, e.size, e.start, e.ntokens, expires_ms), parent=e.parent)
            try:
                os.rename(e.path, moved.path)
            except OSError as exc:
                self._failed(exc)
                return False
            self.index[key] = moved  # same size; its place in the eviction order stays
            self._note_expiry(key, moved)  # (expired, it leaves first)
            self._record(DEL, key)
            self._record(ADD, key, moved)
        if self.fsync:
            try:
                _fsync_dir(moved.path.parent)
            except OSError as exc:
                self._failed(exc)
        return True

    def _retime_leaving(self, key: bytes, expires_ms: int) -> bool:
        """(lock held) Gives key's victim being demoted the expiry expires_ms; False when
        key is no such victim. Its file, in this owner's temporaries, keeps its name."""
        e = self._leaving.get(key)
        if e is None:
            return False
        e.expires_ms = expires_ms
        return True

    # ---- read ----
    def _live_entry(self, key: bytes):
        """key's index entry, or None (a miss, counted; an expired entry is removed)."""
        e = self.entry(key)
        if e is None or e.expired():
            if e is not None:
                self.remove(key)
            self.metrics.inc(self.name, "misses")
            return None
        return e

    def _renamed(self, key: bytes, e: SSDEntry) -> Optional[SSDEntry]:
        """key's entry now, when it is e's file under another name (set_expiry renamed it:
        same size, another path); else None."""
        now = self.entry(key)
        if now is None or now.path == e.path or now.size != e.size:
            return None
        return now

    def _touched(self, key: bytes) -> None:
        """A read hit: most recent in this tier's order and, through the journal, in the others'."""
        self.policy.touch(key)
        with self._lock:
            self._journal.append(Record(TOUCH, self._journal.owner, key))
            if self._journal.needs_compaction():  # reads alone must not grow the journal without end
                with self._changing():
                    pass

    def read(self, key: bytes, *, direct: Optional[bool] = None,
             scratch: Optional["ScratchPool"] = None) -> Optional[memoryview]:
        """The verified blob, or None (a miss; corrupt or partial files are removed).

        scratch: a ScratchPool to read into (reused, already-faulted memory); give the
        buffer back with ``scratch.put(view.obj)`` when done with the view.
        """
        sr = self.stream(key, scratch=scratch, direct=direct)
        return None if sr is None else sr.finish()

    def stream(self, key: bytes, *, scratch: Optional["ScratchPool"] = None, executor=None,
               segment_bytes: Optional[int] = None, direct: Optional[bool] = None) -> Optional["StreamRead"]:
        """Starts reading key's file in segments on executor (default: the tier's own
        reader threads); the caller decodes what has arrived (StreamRead.wait) while the
        rest loads, then calls finish() to verify. direct: O_DIRECT (default: the tier's
        setting; files under DIRECT_MIN_BYTES are read buffered)."""
        e = self._live_entry(key)
        if e is None:
            return None
        if executor is None:
            executor = self._executor()
            if executor is None:  # closed (a TierManager's read-ahead ran into its close()): a miss
                self.metrics.inc(self.name, "misses")
                return None
        use_direct = (self._direct_ok if direct is None else bool(direct)) and e.size >= DIRECT_MIN_BYTES
        if segment_bytes is None:
            segment_bytes = DIRECT_SEGMENT_BYTES if use_direct else BUFFERED_SEGMENT_BYTES
        return StreamRead(self, key, e, scratch if scratch is not None else ScratchPool(keep=0), executor,
                          segment_bytes, use_direct)

    def _executor(self) -> Optional[cf.ThreadPoolExecutor]:
        """The reader threads; None once closed (a pool started then would never be shut down)."""
        with self._lock:
            if self._closed:
                return None
            if self._readers is None:
                self._readers = cf.ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="kvcore-ssd-read")
            return self._readers

    def close(self) -> None:
        """Stops the tier's own reader and writer threads (I/O in flight finishes) and, when
        none of its writes is in flight, leaves the shared directory."""
        # One lock section from the look at the writes in flight to the leaving: a write
        # that reserved in between would record its reservation, fail once the tier's
        # temporaries are gone, and never record the release (the others would count it).
        # Under the tier's lock too: a read that finishes meanwhile (a TierManager's
        # read-ahead) appends its TOUCH record before the journal closes or not at all,
        # never to a closed (or reused) descriptor.
        with self._lock:
            self._closed = True
            pools = (self._readers, self._writers)
            self._readers = self._writers = None
            if not self._own_reserved:
                with self._changing():  # the others stop counting this tier's capacity
                    self._pending.append(Record(LEFT, self._journal.owner, bytes(16)))
                self._journal.close()
        for p in pools:
            if p is not None:
                p.shutdown(wait=False)

    # ---- removal ----
    def _forget(self, key: bytes, e: SSDEntry) -> bool:
        """Removes e's file, when it is still key's entry (not replaced by a newer write) and
        the tier is open (closed, it would remove a file the other owners still index)."""
        with self._changing():
            if self._journal.left or self.index.get(key) is not e:
                return False
            self._index_pop(key)
            self._record(DEL, key)
            _unlink(e.path)
            return True

    def remove(self, key: bytes) -> bool:
        """Removes key's file; a victim being demoted (on_evict running) is a miss from now
        on, and leaving() tells on_evict so."""
        e = self.entry(key)
        if e is None:
            return False
        return self._forget(key, e) or self._cancel_leaving(key, e)

    def _cancel_leaving(self, key: bytes, e: SSDEntry) -> bool:
        """Drops e from the victims being demoted (its file goes when on_evict returns)."""
        with self._lock:
            if self._leaving.get(key) is not e:
                return False
            del self._leaving[key]
            return True

    def leaving(self, key: bytes, e: SSDEntry) -> bool:
        """Whether e, a victim offered to on_evict, is still being demoted: False once a
        remove() or clear() removed it meanwhile (then a copy on_evict made elsewhere is one
        the caller deleted: it is to be deleted too)."""
        with self._lock:
            return self._leaving.get(key) is e

    def clear(self, ns_tag: Optional[str] = None) -> int:
        """Removes every file of a namespace (all when ns_tag is None), the victims being
        demoted included; returns how many."""
        with self._lock:
            leaving = [k for k, e in self._leaving.items() if ns_tag is None or e.ns_tag == ns_tag]
        return sum(self.remove(k) for k in dict.fromkeys([*self.keys(ns_tag), *leaving]))

    def drop_page_cache(self) -> None:
        """Drops every indexed file from the page cache (so the next reads are cold)."""
        for e in list(self.index.values()):
            try:
                fd = _open_to_read(e.path)
            except (OSError, CorruptFrameError):
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _open_to_read(path: Path, flags: int = 0) -> int:
    """A descriptor to read a chunk file with. O_NONBLOCK (no effect on regular files) so
    that a FIFO put in the file's place cannot block the open; anything but a regular
    file is refused as corrupt."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptFrameError("not a regular file")
    return fd


def _mark_parent(fd: int, parent: Optional[bytes]) -> None:
    """Records parent in the file open as fd (PARENT_XATTR); where the filesystem keeps no
    user extended attributes, the file goes without, as files of earlier versions do."""
    if parent is None:
        return
    try:
        os.setxattr(fd, PARENT_XATTR, parent)
    except (OSError, AttributeError):  # (AttributeError: a platform without xattr calls)
        pass


def _parent_of_file(path: Path, key: bytes, start: int) -> Optional[bytes]:
    """The parent recorded in key's chunk file (PARENT_XATTR), which starts at token start,
    or None: none recorded, the file is gone, or the value can be no parent of it (no key;
    key itself, or a parent of chunk 0: a damaged value that would make a loop of chunks
    that each extend another, none of them ever a victim)."""
    try:
        parent = os.getxattr(path, PARENT_XATTR)
    except (OSError, AttributeError):
        return None
    return parent if len(parent) == 16 and parent != key and start > 0 else None


def _file_name(key: bytes, start: int, ntokens: int, expires_ms: int) -> str:
    return f"{key.hex()}.{start}.{ntokens}.{expires_ms}.kvc"


def _parse_name(name: str) -> Optional[tuple[bytes, int, int, int]]:
    """(key, start, ntokens, expires_ms) of a chunk file's name, or None when the name is
    not one _file_name writes: other processes find the file by the name its journal
    record gives back, and the numbers must fit the record's fields."""
    m = _NAME.match(name)
    if m is None:
        return None
    key = bytes.fromhex(m.group(1))
    start, ntokens, expires_ms = (int(g) for g in m.group(2, 3, 4))
    if max(start, expires_ms) >= 1 << 64 or ntokens >= 1 << 32 or name != _file_name(key, start, ntokens, expires_ms):
        return None
    return key, start, ntokens, expires_ms


def _valid_ns_tag(ns_tag: str) -> bool:
    """A namespace tag names a directory: 1-16 of [0-9A-Za-z_-], not one of the tier's own."""
    return isinstance(ns_tag, str) and bool(_NS_TAG.match(ns_tag)) and ns_tag not in (TMP_DIR, OWNERS_DIR)


def _check_ns_tag(ns_tag: str) -> None:
    if not _valid_ns_tag(ns_tag):
        raise InvalidArgumentError(f"invalid namespace tag {ns_tag!r}")


def _load_sync_file_range():
    """libc's sync_file_range (Linux), or None: starts write-back of a range at once."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _align_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class StreamWrite:
    """One chunk file written while its blob is still being encoded (SSDTier.begin_write).

    add(first, end) says buffer[first:end] is final: its whole 4 KiB blocks go to the
    temporary file on the tier's writer threads (O_DIRECT where the filesystem allows
    it, else buffered writes whose write-back sync_file_range starts at once), so the
    device works while later frames are encoded. commit(total) writes the rest (the
    header before ``first``, the tail), then fsync, rename, fsync of the directory: the
    store is done only once it is durable. abort() removes the temporary file.
    """

    def __init__(self, tier: SSDTier, key: bytes, buffer, rid: bytes, *, ns_tag: str, reserve: int, start: int,
                 ntokens: int, expires_ms: int, parent: Optional[bytes] = None):
        self.tier, self.key, self.rid = tier, key, rid
        self.buf = memoryview(buffer).cast("B")
        self.ns_tag, self.start, self.ntokens, self.expires_ms = ns_tag, start, ntokens, expires_ms
        self.parent = parent
        self.reserved = reserve
        self._t0 = time.perf_counter()
        self._futures: list = []
        self._sent: Optional[int] = None  # bytes [aligned start of frames, _sent) are sent
        self._first = 0
        self._direct_refused = False
        self._done = False
        self._flush_lock = threading.Lock()
        self._flushing = False
        self._unflushed = 0
        self.tmp = tier._tmp / f"{key.hex()}.{threading.get_ident()}.{id(self)}.tmp"
        self._executor = tier._write_executor()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.direct = False
        if tier._direct_ok and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(self.tmp, flags | os.O_DIRECT, 0o644)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                tier._direct_ok = False  # filesystem without O_DIRECT (tmpfs)
        if not self.direct:
            self._fd = os.open(self.tmp, flags, 0o644)
        _mark_parent(self._fd, parent)

    def add(self, first: int, end: int) -> None:
        """buffer[first:end] is final (first: where the frames start; before it the header
        comes last). Sends its whole blocks once enough have gathered."""
        if self._sent is None:
            self._first = first
            self._sent = _align_up(first)
        upto = end // _ALIGN * _ALIGN
        if upto - self._sent >= WRITE_SEGMENT_BYTES:
            self._futures.append(self._executor.submit(self._pwrite, self._sent, upto))
            self._sent = upto

    def _pwrite(self, a: int, b: int) -> None:
        if self._direct_refused:
            return
        pos = a
        try:
            while pos < b:
                pos += os.pwrite(self._fd, self.buf[pos:b], pos)
        except OSError as exc:
            if not (self.direct and exc.errno == errno.EINVAL):
                raise
            self._direct_refused = True  # O_DIRECT refused at write time: commit() rewrites buffered
            return
        if not self.direct and _sync_file_range is not None:
            _sync_file_range(self._fd, a, b - a, _SYNC_FILE_RANGE_WRITE)
        if self.tier.fsync and FLUSH_EVERY_BYTES:
            self._maybe_flush(b - a)

    def _maybe_flush(self, nbytes: int) -> None:
        """fdatasync once FLUSH_EVERY_BYTES more have been written: a disk with a volatile
        write cache (a VM's host cache) then persists while later frames still encode,
        instead of all at the final fsync."""
        with self._flush_lock:
            self._unflushed += nbytes
            if self._flushing or self._unflushed < FLUSH_EVERY_BYTES:
                return
            self._flushing = True
            self._unflushed = 0
        try:
            os.fdatasync(self._fd)
        finally:
            with self._flush_lock:
                self._flushing = False

    def commit(self, total: int) -> bool:
        """Writes the rest of the total-byte blob, makes the file durable and indexes it.
        False when it failed or did not fit (counted; nothing is left behind)."""
        t = self.tier
        try:
            error = None
            for f in self._futures:
                try:
                    f.result()
                except Exception as exc:
                    error = error or exc
            if error is not None:
                raise error
            if self._direct_refused:  # the whole blob again, through the page cache
                os.close(self._fd)
                self._fd = os.open(self.tmp, os.O_WRONLY | os.O_TRUNC)
                self.direct = False
                t._direct_ok = False
                self._write_all(0, total)
            else:
                # O_DIRECT writes whole blocks: the last one is padded, then cut off
                end = _align_up(total) if self.direct else total
                head_end = min(_align_up(self._first), end) if self._sent is not None else 0
                self._write_all(max(self._sent or 0, head_end), end)  # the tail
                self._write_all(0, head_end)  # the header and frame table
                if end != total:
                    os.ftruncate(self._fd, total)
            if t.fsync:
                os.fsync(self._fd)
            if not self.direct and t.drop_cache and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(self._fd)
            self._fd = -1
            entry = replace(t._entry(self.key, self.ns_tag, total, self.start, self.ntokens, self.expires_ms),
                            parent=self.parent)
            if not t._commit(self.key, self.tmp, entry, self.rid, extra=total - self.reserved):
                self.abort()
                return False
            self._done = True
            if t.fsync:
                _fsync_dir(entry.path.parent)
        except Exception as exc:
            self.abort()
            t._failed(exc)
            return False
        t.metrics.inc(t.name, "stores")
        t.metrics.inc(t.name, "bytes_in", total)
        t.metrics.observe("ssd_write", time.perf_counter() - self._t0)
        return True

    def _write_all(self, a: int, b: int) -> None:
        pos = a
        while pos < b:
            pos += os.pwrite(self._fd, self.buf[pos:b], pos)

    def abort(self) -> None:
        """Drops the write: waits for writes in flight, removes the temporary file and
        releases the reservation."""
        if self._done:
            return
        self._done = True
        for f in self._futures:
            try:
                f.result()
            except Exception:
                pass
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        _unlink(self.tmp)
        self.tier._release(self.rid)


class StreamRead:
    """One file read as segments in parallel (a deep queue, like one large read) by an
    executor's threads, consumable in order as segments land; see SSDTier.stream().

    With ``direct`` the segments are aligned O_DIRECT reads into the page-aligned
    scratch buffer (no page-cache copy; several in flight keep the device busy); a
    filesystem that refuses O_DIRECT gets buffered reads instead.
    """

    def __init__(self, tier: SSDTier, key: bytes, entry: SSDEntry, scratch: "ScratchPool", executor,
                 segment_bytes: int, direct: bool = False):
        self.tier, self.key, self.entry = tier, key, entry
        self.size = entry.size
        aligned = (self.size + _ALIGN - 1) // _ALIGN * _ALIGN
        self.buffer = scratch.get(aligned)  # give back with scratch.put(view.obj)
        self._full = memoryview(self.buffer)[:aligned]
        self.view = self._full[:self.size]
        self._seg = max(_ALIGN, segment_bytes // _ALIGN * _ALIGN)
        nseg = max(1, -(-self.size // self._seg))
        self._landed = [False] * nseg
        self._done = 0  # bytes of the leading segments that have all landed
        self._error: Optional[BaseException] = None
        self._cond = threading.Condition()
        self._t0 = time.perf_counter()
        # the blob checksum, computed by the reader threads as the leading bytes land
        self._sum = StreamingChecksum()
        self._hash_end = max(0, body_size(self.size))
        self._hashed = 0
        self._hashing = False
        self._fd = -1
        self.direct = False
        try:
            try:
                self._open(direct)
            except FileNotFoundError:
                # set_expiry renamed the file after the lookup (its name carries the
                # expiry): the chunk is there under its new name, looked up once more
                moved = tier._renamed(key, entry)
                if moved is None:
                    raise
                self.entry = moved
                self._open(direct)
        except (OSError, CorruptFrameError) as exc:
            self._error = exc
            return
        self._left = nseg
        # a window of segments in flight, issued in order: the first ones land first
        # (all at once, they all finish late), so decoding starts early
        self._executor = executor
        self._next = window = min(nseg, IN_FLIGHT)
        for i in range(window):
            try:
                self._submit(i)
            except RuntimeError as exc:  # the executor was shut down (its TierManager closing)
                with self._cond:
                    self._error = self._error or exc
                    self._stop_issuing()
                    self._segment_settled(window - i)  # the window's segments never issued
                return

    def _open(self, direct: bool) -> None:
        """Opens the entry's file: O_DIRECT when asked and the filesystem allows it."""
        if direct:
            try:
                self._fd = _open_to_read(self.entry.path, os.O_DIRECT)
                self.direct = True
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.tier._direct_ok = False  # filesystem without O_DIRECT (tmpfs)
        self._fd = _open_to_read(self.entry.path)

    def _stop_issuing(self) -> None:
        """(cond held, after an error) Nothing more will be issued: count those as done."""
        self._left -= len(self._landed) - self._next
        self._next = len(self._landed)

    def _segment_settled(self, count: int) -> None:
        """(cond held) count more segments are done; the last one closes the file."""
        self._left -= count
        if self._left == 0:
            os.close(self._fd)
        self._cond.notify_all()

    def _submit(self, i: int) -> None:
        """Queues segment i (raises RuntimeError when the executor was shut down)."""
        self._executor.submit(self._read, i).add_done_callback(self._cancelled)

    def _cancelled(self, fut) -> None:
        if fut.cancelled():  # the executor was shut down: the reader must not wait forever
            with self._cond:
                self._error = self._error or RuntimeError("read cancelled")
                self._segment_settled(1)

    def _read(self, i: int) -> None:
        start = i * self._seg
        end = min(self.size, start + self._seg)
        try:
            pos = start
            if self.direct:  # whole aligned blocks; the last read stops at the end of the file
                stop = min(len(self._full), start + self._seg)
                while pos < end:
                    try:
                        n = os.preadv(self._fd, [self._full[pos:stop]], pos)
                    except OSError as exc:
                        if exc.errno != errno.EINVAL or pos % _ALIGN:
                            raise
                        self.tier._direct_ok = False  # O_DIRECT refused at read time
                        break
                    pos += n
                    if n <= 0 or (pos < end and pos % _ALIGN):
                        raise CorruptFrameError("file is shorter than indexed")
                if pos < end:  # O_DIRECT refused: the rest of this segment buffered
                    fd = _open_to_read(self.entry.path)
                    try:
                        pos = self._read_buffered(fd, pos, end)
                    finally:
                        os.close(fd)
            else:
                self._read_buffered(self._fd, pos, end)
        except BaseException as exc:  # reported to the reader
            with self._cond:
                self._error = self._error or exc
        with self._cond:
            if self._next < len(self._landed) and self._error is None:
                try:
                    self._submit(self._next)
                    self._next += 1
                except RuntimeError as exc:  # the executor was shut down
                    self._error = exc
            if self._error is not None:
                self._stop_issuing()
            self._landed[i] = True
            j = self._done // self._seg if self._done < self.size else len(self._landed)
            while j < len(self._landed) and self._landed[j]:
                j += 1
            self._done = min(self.size, j * self._seg)
            self._segment_settled(1)
            hash_now = self._claim_hashing()
        while hash_now:  # one thread at a time hashes what has landed, in order
            upto = min(self._done, self._hash_end)
            try:
                self._sum.update(self.view[self._hashed:upto])
            except BaseException as exc:
                with self._cond:
                    self._error = self._error or exc
                    self._hashing = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._hashed = upto
                self._hashing = False
                self._cond.notify_all()
                hash_now = self._claim_hashing()

    def _claim_hashing(self) -> bool:
        """(cond held) True when this thread is to hash the newly landed bytes."""
        if self._hashing or self._error is not None or self._hashed >= min(self._done, self._hash_end):
            return False
        self._hashing = True
        return True

    def _read_buffered(self, fd: int, pos: int, end: int) -> int:
        while pos < end:
            n = os.preadv(fd, [self.view[pos:end]], pos)
            if n <= 0:
                raise CorruptFrameError("file is shorter than indexed")
            pos += n
        return pos

    def landed(self) -> int:
        """Bytes of the file's beginning that are in view now."""
        return self._done

    def wait(self, upto: int) -> bool:
        """Blocks until the first upto bytes are in view; False when the read failed."""
        upto = min(upto, self.size)
        with self._cond:
            while self._done < upto and self._error is None:
                self._cond.wait()
            return self._done >= upto and self._error is None

    def finish(self) -> Optional[memoryview]:
        """The whole verified blob, or None (missing, short or corrupt: counted, file removed)."""
        ok = self.wait(self.size)
        if ok:
            with self._cond:
                while self._hashed < self._hash_end and self._error is None:
                    self._cond.wait()
                ok = self._error is None
        t = self.tier
        if not ok and self._error is not None and not isinstance(self._error, (CorruptFrameError, FileNotFoundError)):
            t.metrics.inc(t.name, "errors")  # an I/O error or a cancelled read: the file stays
            t.metrics.inc(t.name, "misses")
            return None
        try:
            if not ok:
                raise CorruptFrameError("short or missing file")
            h = BlobHeader.parse(self.view, verify=True, digest=self._sum.intdigest())
            if h.key != self.key:
                raise CorruptFrameError("file holds another key")
        except CorruptFrameError as exc:
            t.metrics.inc(t.name, "misses")
            if isinstance(exc, NewerBlobError):  # a newer kvcore's file stays for its readers
                return None
            if not isinstance(self._error, FileNotFoundError):
                t.metrics.inc(t.name, "corrupt")
            t._forget(self.key, self.entry)
            return None
        if not can_decode(h.codec):  # a newer kvcore's codec (or the native one, not built here): a
            t.metrics.inc(t.name, "misses")  # miss, and the file stays for the processes that decode it
            return None
        t._touched(self.key)
        t.metrics.inc(t.name, "hits")
        t.metrics.inc(t.name, "bytes_out", self.size)
        t.metrics.observe("ssd_read", time.perf_counter() - self._t0)
        return self.view


class ScratchPool:
    """Reusable page-aligned read buffers: a cold read then costs no page faults.

    Keeps at most ``keep`` free buffers; get() returns one at least n bytes long.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._free: list = []
        self._lock = threading.Lock()

    def get(self, n: int):
        with self._lock:
            best = None
            for i, b in enumerate(self._free):
                if len(b) >= n and (best is None or len(b) < len(self._free[best])):
                    best = i
            if best is not None:
                return self._free.pop(best)
        buf = mmap.mmap(-1, (n + _ALIGN - 1) // _ALIGN * _ALIGN)
        if n >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
            try:  # transparent huge pages: O_DIRECT requests of a few large segments, fewer TLB misses
                buf.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        return buf

    def put(self, buf) -> None:
        if not isinstance(buf, mmap.mmap):
            return
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

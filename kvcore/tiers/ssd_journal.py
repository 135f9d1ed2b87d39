"""Several processes on one SSD tier directory: owners, a shared lock and a journal.

Every SSD tier opened on a directory is an *owner*. It holds an exclusive ``flock`` on
``owners/<id>`` while it lives (so the others can tell whether it is still alive) and
writes its temporary files under ``tmp/<id>/``. What changes in the directory is
recorded in ``journal``, an append-only file of fixed-size records:

- ``ADD``: a chunk file was committed (key, namespace tag, start, ntokens, expiry, size);
- ``DEL``: a chunk file was removed;
- ``RES`` / ``REL``: an owner holds / releases capacity for a file it is writing;
- ``TOUCH``: a chunk was read (so other owners' eviction order sees the use);
- ``MOVED``: the last record of a journal that was replaced (see below);
- ``CAP`` / ``LEFT``: an owner's capacity (its ``capacity_bytes``) / the owner left.

Capacity decisions (reserve, evict, commit) are taken under an exclusive ``flock`` on
``lock`` after applying every record appended since the last look, so all processes
share one byte budget and see each other's chunks. That budget is the smallest capacity
of the owners present: the directory never grows past what any live process was told.
Records are appended with ``O_APPEND`` (one ``write`` per batch) and carry a CRC, so a
record still being written is not read early. A tier starting on the directory scans it
(the ground truth), drops the reservations and temporaries of owners that are gone, and
replaces the journal with a snapshot of what it found; a journal longer than
``COMPACT_BYTES`` is replaced the same way: the snapshot is renamed over the journal,
then ``MOVED`` is appended to the old file, so the others notice (a look that finds
nothing new is one ``fstat``) and reload.

>>> import tempfile
>>> from pathlib import Path
>>> j = DirJournal(Path(tempfile.mkdtemp()))
>>> with j.exclusive():
...     j.append(Record(ADD, j.owner, b"k" * 16, "ns", size=10))
>>> other = DirJournal(j.root)
>>> [(r.op, r.ns_tag, r.size) for r in other.read_new()[1]]
[(1, 'ns', 10)]
>>> other.owner_alive(j.owner)
True
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

ADD, DEL, RES, REL, TOUCH, MOVED, CAP, LEFT = 1, 2, 3, 4, 5, 6, 7, 8
OPS = (ADD, DEL, RES, REL, TOUCH, MOVED, CAP, LEFT)
MAGIC = b"KVCJRNL\x01"
# crc32 of the rest, op, owner, key, namespace tag (ASCII, NUL-padded), size,
# expiry (unix ms), start, ntokens
_RECORD = struct.Struct("<IB3x8s16s16sQQQI4x")
RECORD_BYTES = _RECORD.size  # 80
HEADER_BYTES = RECORD_BYTES  # MAGIC, zero-padded
COMPACT_BYTES = 4 << 20  # a journal past this is replaced by a snapshot
OWNERS_DIR, TMP_DIR = "owners", "tmp"
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # errnos of a filesystem without flock


@dataclass(frozen=True)
class Record:
    op: int
    owner: bytes  # 8 bytes
    key: bytes  # 16 bytes: a chunk key (ADD, DEL, TOUCH), a reservation id (RES, REL), else zeros
    ns_tag: str = ""
    size: int = 0
    expires_ms: int = 0
    start: int = 0
    ntokens: int = 0

    def pack(self) -> bytes:
        body = _RECORD.pack(0, self.op, self.owner, self.key, self.ns_tag.encode("ascii"), self.size,
                            self.expires_ms, self.start, self.ntokens)
        return struct.pack("<I", zlib.crc32(body[4:])) + body[4:]

    @staticmethod
    def unpack(b: bytes) -> Optional["Record"]:
        """The record in b (RECORD_BYTES), or None when its CRC or op is wrong."""
        crc, op, owner, key, ns, size, expires, start, ntokens = _RECORD.unpack(b)
        if crc != zlib.crc32(b[4:]) or op not in OPS:
            return None
        return Record(op, owner, key, ns.rstrip(b"\0").decode("ascii", "replace"), size, expires, start, ntokens)


class DirJournal:
    """This process's membership of one shared tier directory (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / OWNERS_DIR).mkdir(exist_ok=True)
        self.owner = os.urandom(8)
        self.path = self.root / "journal"
        self.corrupt_records = 0
        self.failed_appends = 0
        self._damaged = False  # an append failed or was cut short: replace the journal (needs_compaction)
        self.shared = True  # False where the filesystem has no flock: one process only
        self._lock_file = open(self.root / "lock", "a+b", buffering=0)
        self._owner_file = None
        self._journal = None
        self._ino = -1
        self._offset = HEADER_BYTES
        with self.exclusive():
            # created and locked under the directory lock, so nobody sees it unlocked
            self._owner_file = open(self.root / OWNERS_DIR / self.owner.hex(), "a+b", buffering=0)
            if self.shared:
                fcntl.flock(self._owner_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.tmp_dir = self.root / TMP_DIR / self.owner.hex()
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self._open_journal(repair=True)

    # ---- locking and owners ----
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Holds the directory lock (against other processes; threads need their own lock)."""
        locked = False
        if self.shared and not self._lock_file.closed:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
                locked = True
            except OSError as exc:
                if exc.errno not in NO_FLOCK:
                    raise
                self.shared = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)

    def owner_alive(self, owner: bytes) -> bool:
        """Whether owner's tier is still open (its owner file is locked)."""
        if owner == self.owner:
            return True
        if not self.shared:
            return False
        try:
            fd = os.open(self.root / OWNERS_DIR / owner.hex(), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def dead_owners(self) -> list[bytes]:
        """Owners with an owner file or a temporary directory whose tier is gone."""
        names = set()
        for sub in (OWNERS_DIR, TMP_DIR):
            for p in (self.root / sub).iterdir():
                if p.is_dir() == (sub == TMP_DIR) and len(p.name) == 16:
                    try:
                        names.add(bytes.fromhex(p.name))
                    except ValueError:
                        pass
        return [o for o in names if not self.owner_alive(o)]

    def remove_owner(self, owner: bytes) -> None:
        """Removes a dead owner's temporaries (a journal snapshot it was writing too) and
        owner file (directory lock held)."""
        shutil.rmtree(self.root / TMP_DIR / owner.hex(), ignore_errors=True)
        for path in (self._snapshot_path(owner), self.root / OWNERS_DIR / owner.hex()):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _snapshot_path(self, owner: bytes) -> Path:
        """Where owner writes a journal snapshot before it replaces the journal."""
        return self.root / f"journal.{owner.hex()}.new"

    # ---- the journal ----
    def _open_journal(self, repair: bool = False) -> bool:
        """(Re)opens the journal file; False when it is not one. repair (directory lock
        held): a missing, empty or foreign file is replaced by an empty journal."""
        f = open(self.path, "a+b", buffering=0)  # O_APPEND: concurrent appends never interleave
        st = os.fstat(f.fileno())
        if st.st_size < HEADER_BYTES or os.pread(f.fileno(), len(MAGIC), 0) != MAGIC:
            f.close()
            if repair:
                self.replace([])
            return repair
        if self._journal is not None:
            self._journal.close()
        self._journal = f
        self._ino = st.st_ino
        self._offset = HEADER_BYTES
        return True

    def has_new(self) -> bool:
        """Whether records were appended since the last read (one fstat); False once closed.

        The tier calls this without its lock, so a close() on another thread may close the
        file between the check and the fstat (EBADF; or, the descriptor reused meanwhile, the
        size of another file): the tier reads the records under its lock, where read_new
        sees the journal closed."""
        journal = self._journal
        if journal is None:
            return False
        try:
            return os.fstat(journal.fileno()).st_size - self._offset >= RECORD_BYTES
        except (OSError, ValueError):  # closed meanwhile
            return False

    def read_new(self) -> tuple[bool, list[Record]]:
        """(reloaded, records): the records appended since the last call. reloaded is True
        when the journal was replaced; records are then its whole content (a snapshot)."""
        if self._journal is None:  # closed
            return False, []
        fd = self._journal.fileno()
        end = os.fstat(fd).st_size
        if end - self._offset < RECORD_BYTES:
            return False, []
        data = os.pread(fd, end - self._offset, self._offset)
        out = []
        pos = 0
        while pos + RECORD_BYTES <= len(data):
            r = Record.unpack(data[pos:pos + RECORD_BYTES])
            if r is None:
                if pos + 2 * RECORD_BYTES <= len(data):  # damaged, with more after it: skip
                    self.corrupt_records += 1
                    pos += RECORD_BYTES
                    continue
                break  # possibly still being written: read it next time
            if r.op == MOVED and self._open_journal():
                return True, self.read_new()[1]
            out.append(r)
            pos += RECORD_BYTES
        self._offset += pos
        return False, out

    def append(self, *records: Record) -> None:
        """Appends records in one write. State changes need the directory lock (and every
        record up to the end read first), so the journal's order is the decisions' order.

        Never raises: the change is made either way (the files are the truth). When the
        write fails (ENOSPC, EIO) or is cut short (a partial record would misalign every
        later one), the others miss these records until the journal is replaced by a
        snapshot, which needs_compaction() then asks for."""
        if records and self._journal is not None:
            data = b"".join(r.pack() for r in records)
            try:
                written = os.write(self._journal.fileno(), data)
            except OSError:
                written = 0
            if written != len(data):
                self.failed_appends += 1
                self._damaged = True
                return
            if self._offset == os.fstat(self._journal.fileno()).st_size - len(data):
                self._offset += len(data)  # ours, already applied

    def needs_compaction(self) -> bool:
        return self._journal is not None and (self._damaged or self._offset > COMPACT_BYTES)

    def replace(self, records: list[Record]) -> None:
        """Replaces the journal with a snapshot (directory lock held, journal read up to its end)."""
        new = self._snapshot_path(self.owner)
        try:
            with open(new, "wb") as f:
                f.write(MAGIC.ljust(HEADER_BYTES, b"\0") + b"".join(r.pack() for r in records))
            os.rename(new, self.path)
        except OSError:
            try:
                os.unlink(new)
            except OSError:
                pass
            raise
        if self._journal is not None:
            fd = self._journal.fileno()
            # After an append cut short, the records that followed are off the others' record
            # grid: zeros up to it (every append is whole records) so they read MOVED.
            data = bytes(-(os.fstat(fd).st_size - HEADER_BYTES) % RECORD_BYTES) + Record(MOVED, self.owner,
                                                                                      bytes(16)).pack()
            if os.write(fd, data) != len(data):  # the others would not see it: stay, and try again
                raise OSError(errno.ENOSPC, "the journal's MOVED record was cut short")
            self._journal.close()
        self._journal = open(self.path, "a+b", buffering=0)
        st = os.fstat(self._journal.fileno())
        self._ino = st.st_ino
        self._offset = st.st_size
        self._damaged = False

    @property
    def left(self) -> bool:
        """Whether close() ran: this owner no longer takes part in the directory."""
        return self._owner_file is None

    def close(self) -> None:
        """Leaves the directory: removes this owner's temporaries and owner file."""
        if self._owner_file is None:
            return
        self.remove_owner(self.owner)
        for f in (self._owner_file, self._journal, self._lock_file):
            if f is not None:
                f.close()
        self._owner_file = self._journal = None

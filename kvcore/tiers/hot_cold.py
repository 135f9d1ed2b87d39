"""Pins and priorities that outlive the process, beside the SSD tier.

A TierManager with an SSD directory keeps the hot/cold settings of its namespace
(``pin``, ``set_priority``) in ``<ssd_dir>/kvcore-hot/<namespace tag>.json`` and reads
them when it opens the directory. Expiry needs no file: SSD chunk file names carry it.

Several processes may share the directory, so a change is merged into the file, never a
replacement of it: under an exclusive ``flock`` on ``<namespace tag>.lock`` the file is
read, the changed chunks' entries are set or removed, and the result is written
atomically (temporary file, rename). Each chunk's entry is the last one any process
wrote; the settings of chunks a process never touched are kept. A damaged file is
ignored (read as empty, and replaced at the next change). ``changed()`` tells a process
that another one wrote the file since it last read it (the manager then reloads it).

>>> import tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> merged = HotColdFile(d, "ns").update({b"a" * 16: HotCold(pinned=True, priority=0, start=0, ntokens=256)})
>>> merged = HotColdFile(d, "ns").update({b"b" * 16: HotCold(pinned=False, priority=2, start=256, ntokens=256)})
>>> sorted(k[:1] for k in merged) == sorted(k[:1] for k in HotColdFile(d, "ns").load()) == [b"a", b"b"]
True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional

from .policy import is_priority
from .ssd_journal import NO_FLOCK

HOT_DIR = "kvcore-hot"
VERSION = 1


@dataclass(frozen=True)
class HotCold:
    """One chunk's persisted settings, and where it sits in its sequence (for prefetching)."""

    pinned: bool
    priority: int
    start: int
    ntokens: int

    @property
    def kept(self) -> bool:
        """Whether the file holds this entry (default settings need none)."""
        return self.pinned or self.priority != 0


class HotColdFile:
    """The settings file of one namespace in one SSD directory."""

    def __init__(self, ssd_dir: Path, ns_tag: str):
        self.path = Path(ssd_dir) / HOT_DIR / f"{ns_tag}.json"
        self.damaged = False  # the last load found a file it could not use
        self.seen: Optional[tuple] = None  # stamp() of the file this object last read or wrote

    def stamp(self) -> Optional[tuple]:
        """Identity of the file's current version (None: no file). Every write replaces
        the file (rename), so another process's change shows as a new stamp."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def changed(self) -> bool:
        """Whether the file is not the version this object last read or wrote."""
        return self.stamp() != self.seen

    def load(self) -> dict[bytes, HotCold]:
        """The saved settings (empty when there are none or the file is damaged)."""
        self.damaged = False
        self.seen = self.stamp()
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("version") != VERSION:
                raise ValueError("unknown version")
            out = {}
            for hex_key, (pinned, priority, start, ntokens) in doc["chunks"].items():
                key = bytes.fromhex(hex_key)
                if len(key) != 16 or not is_priority(priority) or not all(isinstance(v, int) for v in (start, ntokens)):
                    raise ValueError("bad entry")
                out[key] = HotCold(bool(pinned), priority, start, ntokens)
            return out
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.damaged = True
            return {}

    def update(self, changes: Mapping[bytes, Optional[HotCold]], *,
               drop_all: bool = False) -> dict[bytes, HotCold]:
        """Merges changes into the file: each key's entry is set, or removed (None, or
        default settings); drop_all first empties the file (``clear``). Returns what the
        file now holds, other processes' entries included. Raises OSError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            before = self.load()
            entries = {} if drop_all else dict(before)
            for key, entry in changes.items():
                if entry is not None and entry.kept:
                    entries[key] = entry
                else:
                    entries.pop(key, None)
            if entries != before or self.damaged:  # a repeated pin rewrites nothing
                self._write(entries)
            return entries

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_suffix(".lock"), "a+b") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            except OSError as exc:  # a filesystem without flock: merging is safe for one process only
                if exc.errno not in NO_FLOCK:
                    raise
            yield  # closing the file releases the lock

    def _write(self, entries: dict[bytes, HotCold]) -> None:
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.seen = None
            return
        chunks = {k.hex(): [int(e.pinned), e.priority, e.start, e.ntokens] for k, e in entries.items()}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": VERSION, "chunks": chunks}))
        os.replace(tmp, self.path)
        self.seen = self.stamp()

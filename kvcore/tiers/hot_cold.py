"""Pins and priorities that outlive the process, beside the SSD tier.

A TierManager with an SSD directory keeps the hot/cold settings of its namespace
(``pin``, ``set_priority``) in ``<ssd_dir>/kvcore-hot/<namespace tag>.json``, rewritten
atomically (temporary file, rename) whenever they change and read when a manager opens
the directory. Expiry needs no file: SSD chunk file names carry it. Several processes on
one directory: each reads the file when it starts, and the last to change a setting
writes the file; a damaged file is ignored (the settings start empty).

>>> import tempfile
>>> from pathlib import Path
>>> f = HotColdFile(Path(tempfile.mkdtemp()), "ns")
>>> f.save({b"k" * 16: HotCold(pinned=True, priority=2, start=0, ntokens=256)})
>>> f.load()[b"k" * 16].pinned
True
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

HOT_DIR = "kvcore-hot"
VERSION = 1


@dataclass(frozen=True)
class HotCold:
    """One chunk's persisted settings, and where it sits in its sequence (for prefetching)."""

    pinned: bool
    priority: int
    start: int
    ntokens: int


class HotColdFile:
    """The settings file of one namespace in one SSD directory."""

    def __init__(self, ssd_dir: Path, ns_tag: str):
        self.path = Path(ssd_dir) / HOT_DIR / f"{ns_tag}.json"
        self.damaged = False  # the last load found a file it could not use

    def load(self) -> dict[bytes, HotCold]:
        """The saved settings (empty when there are none or the file is damaged)."""
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("version") != VERSION:
                raise ValueError("unknown version")
            out = {}
            for hex_key, (pinned, priority, start, ntokens) in doc["chunks"].items():
                key = bytes.fromhex(hex_key)
                if len(key) != 16 or not all(isinstance(v, int) for v in (priority, start, ntokens)):
                    raise ValueError("bad entry")
                out[key] = HotCold(bool(pinned), priority, start, ntokens)
            return out
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.damaged = True
            return {}

    def save(self, entries: dict[bytes, HotCold]) -> None:
        """Replaces the file with entries (those pinned or with a priority; none: removed)."""
        chunks = {k.hex(): [int(e.pinned), e.priority, e.start, e.ntokens] for k, e in entries.items()
                  if e.pinned or e.priority}
        if not chunks:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": VERSION, "chunks": chunks}))
        os.replace(tmp, self.path)

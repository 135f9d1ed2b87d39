"""A one-line progress display on a text stream (stderr), no dependencies.

On a terminal the line is redrawn in place; otherwise each step is its own line.

>>> import io
>>> s = io.StringIO()
>>> p = Progress(2, stream=s)
>>> p.step("zstd-1 compress"); p.step("lz4 compress"); p.done()
>>> s.getvalue().splitlines()[0]
'[1/2] zstd-1 compress'
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(self, total: int, stream: Optional[TextIO] = None, enabled: bool = True):
        self.total = max(1, total)
        self.n = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._width = 0

    def message(self, text: str) -> None:
        """A line that is not a step (loading data ...)."""
        if not self.enabled:
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        line = f"[{self.n}/{self.total}] {label}"
        if self.tty:
            elapsed = time.perf_counter() - self.t0
            line = f"{line}  ({elapsed:.0f}s)"
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0

    def done(self) -> None:
        if self.enabled:
            self._clear()
            self.stream.flush()

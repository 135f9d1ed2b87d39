"""A minimal RESP2 client for one job: reading large values straight into memory.

redis-py parses replies in Python (or hiredis, when installed), copying a large value
several times; reading a 38 MB chunk that way runs at ~0.1 GB/s on a small machine.
``RawGetter`` sends GETs pipelined on a plain socket and receives each bulk reply
directly into the destination buffer (``recv_into``), so the only copy is the kernel's.
Used by the remote tier for standalone, non-TLS servers; everything else goes through
redis-py.

>>> from kvcore.tiers.resp import encode_command
>>> encode_command(b"GET", b"k")
b'*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\nk\\r\\n'
"""

from __future__ import annotations

import socket
import threading
from typing import Callable, Optional
from urllib.parse import unquote, urlparse

from ..errors import InvalidArgumentError


WINDOW = 2  # GETs in flight on one connection


class RespError(OSError):
    """A protocol error or an error reply from the server."""


def encode_command(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _Conn:
    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float):
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self) -> None:
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        data = self.sock.recv(1 << 16)
        if not data:
            raise RespError("connection closed by the server")
        self.buf += data

    def readline(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = bytes(self.buf[self.pos:i])
                self.pos = i + 2
                return line
            if len(self.buf) - self.pos > 1 << 20:
                raise RespError("reply line too long")
            self._fill()

    def read_into(self, mv: memoryview) -> None:
        n = mv.nbytes
        have = min(n, len(self.buf) - self.pos)
        if have:
            mv[:have] = self.buf[self.pos:self.pos + have]
            self.pos += have
        while have < n:
            k = self.sock.recv_into(mv[have:], n - have)
            if not k:
                raise RespError("connection closed by the server")
            have += k

    def skip_crlf(self) -> None:
        tail = bytearray(2)
        self.read_into(memoryview(tail))
        if tail != b"\r\n":
            raise RespError("malformed bulk reply")

    def simple(self) -> bytes:
        line = self.readline()
        if line[:1] == b"-":
            raise RespError(line[1:].decode(errors="replace"))
        return line

    def bulk_header(self, limit: Optional[int] = None) -> int:
        """Length of the next bulk reply (-1: nil); a RespError past ``limit`` bytes, before
        anything is read or allocated for it."""
        line = self.readline()
        if line[:1] == b"-":
            raise RespError(line[1:].decode(errors="replace"))
        if line[:1] != b"$":
            raise RespError(f"unexpected reply {line[:20]!r}")
        n = int(line[1:])
        if limit is not None and n > limit:
            raise RespError(f"a reply of {n} bytes, at most {limit} expected")
        return n


class RawGetter:
    """GETs of large values into caller memory over a small pool of plain connections."""

    def __init__(self, url: str, *, timeout: float, connect_timeout: float):
        u = urlparse(url)
        if u.scheme != "redis":
            raise InvalidArgumentError("RawGetter handles redis:// urls only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 6379
        self.username = unquote(u.username) if u.username else None
        self.password = unquote(u.password) if u.password else None
        path = (u.path or "/").lstrip("/")
        self.db = int(path) if path else 0
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._idle: list = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> _Conn:
        c = _Conn(self.host, self.port, self.timeout, self.connect_timeout)
        try:
            if self.password is not None:
                auth = [b"AUTH"] + ([self.username.encode()] if self.username else []) + [self.password.encode()]
                c.sock.sendall(encode_command(*auth))
                c.simple()
            if self.db:
                c.sock.sendall(encode_command(b"SELECT", str(self.db).encode()))
                c.simple()
        except BaseException:
            c.close()
            raise
        return c

    def _take(self) -> _Conn:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give(self, c: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 8:
                self._idle.append(c)
                return
        c.close()

    def get_parts(self, key_of: Callable[[int], bytes], total_of: Callable[[bytes], int], part_bytes: int,
                  alloc: Callable[[int], memoryview], max_parts: int = 4096, *, guess_parts: int = 1,
                  on_landed: Optional[Callable[[int], None]] = None) -> Optional[memoryview]:
        """Reads part key_of(0) (a prefix from which total_of() gives the total size), then
        the remaining parts, pipelined, straight into alloc(total). None when part 0 is
        absent, False when another part is missing or has the wrong size.

        guess_parts: GETs sent with part 0's (the expected part count: saves a round trip;
        replies past the real count are drained). on_landed(n): called as the value
        arrives, with the number of leading bytes now in place (in order, increasing)."""
        c = self._take()
        ok = False
        try:
            # A window of GETs in flight, not all at once: a server answers a pipeline
            # by building every reply before sending any (26 MB of copies, ~15 ms to the
            # first byte); with a few in flight it copies the next part while this one
            # is on the wire.
            sent = max(1, min(int(guess_parts), max_parts, WINDOW))
            c.sock.sendall(b"".join(encode_command(b"GET", key_of(i)) for i in range(sent)))
            n0 = c.bulk_header()
            if n0 < 0:
                self._drain(c, 1, sent, part_bytes)
                ok = True
                return None
            if n0 > part_bytes:  # not a part of ours (another writer's key?): drop the connection unread
                return False
            first = bytearray(n0)
            c.read_into(memoryview(first))
            c.skip_crlf()
            total = total_of(first)
            nparts = -(-total // part_bytes)
            if n0 != min(part_bytes, total) or nparts > max_parts:
                self._drain(c, 1, sent, part_bytes)
                ok = True
                return False
            out = alloc(total)
            out[:n0] = first
            if on_landed is not None:
                on_landed(n0)
            short = False
            for i in range(1, max(nparts, sent)):
                if sent < nparts and sent < i + WINDOW:
                    upto = min(nparts, i + WINDOW)
                    c.sock.sendall(b"".join(encode_command(b"GET", key_of(k)) for k in range(sent, upto)))
                    sent = upto
                n = c.bulk_header(limit=part_bytes)
                if i >= nparts or n < 0 or short or n != min(part_bytes, total - i * part_bytes):
                    short = short or (i < nparts)
                    if n >= 0:  # drain it to keep the connection in sync
                        sink = bytearray(n)
                        c.read_into(memoryview(sink))
                        c.skip_crlf()
                    continue
                c.read_into(out[i * part_bytes:i * part_bytes + n])
                c.skip_crlf()
                if on_landed is not None:
                    on_landed(i * part_bytes + n)
            ok = True
            return False if short else out[:total]
        finally:
            if ok:
                self._give(c)
            else:
                c.close()

    @staticmethod
    def _drain(c: _Conn, first: int, end: int, part_bytes: int) -> None:
        """Reads and drops the replies to GETs first..end-1."""
        for _ in range(first, end):
            n = c.bulk_header(limit=part_bytes)
            if n >= 0:
                sink = bytearray(n)
                c.read_into(memoryview(sink))
                c.skip_crlf()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

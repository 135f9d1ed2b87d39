"""The DDR tier: compressed chunk blobs in host memory, within a byte capacity.

Blobs live in blocks from an ``Allocator``: ``PinnedPoolAllocator`` (kvcore.PinnedPool:
pinned, optionally huge-page memory that a GPU can copy from directly) when available,
else ``BytesArena`` (plain bytearrays under a byte budget). The tier itself only keeps
accounting; the TierManager decides what to evict and holds the lock.

>>> from kvcore.tiers.ddr import DDRTier, BytesArena
>>> t = DDRTier(BytesArena(1 << 20))
>>> b = t.allocator.alloc(100)
>>> b.view[:5] = b"hello"
>>> t.insert(b"k" * 16, b, 100)
>>> bytes(t.get(b"k" * 16).view[:5])
b'hello'
>>> t.used_bytes, t.capacity_bytes
(100, 1048576)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from ..errors import InvalidArgumentError, PoolExhausted


class Block(Protocol):
    view: memoryview  # writable, exactly the requested size

    def free(self) -> None: ...


class Allocator(Protocol):
    name: str
    capacity_bytes: int
    used_bytes: int

    def alloc(self, nbytes: int) -> Block: ...


def footprint(allocator: Allocator, nbytes: int) -> int:
    """The bytes of capacity a block of nbytes takes in allocator (an Allocator object
    without a ``footprint`` method: nbytes)."""
    fn = getattr(allocator, "footprint", None)
    return fn(nbytes) if fn is not None else nbytes


class _BytesBlock:
    __slots__ = ("view", "_arena", "_n")

    def __init__(self, arena: "BytesArena", n: int):
        self.view = memoryview(bytearray(n))
        self._arena = arena
        self._n = n

    def free(self) -> None:
        if self._arena is not None:
            self._arena._release(self._n)
            self._arena = None
            self.view = memoryview(b"")


class BytesArena:
    """Plain host memory under a hard byte budget (alloc raises PoolExhausted beyond it)."""

    name = "bytes"

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise InvalidArgumentError("capacity_bytes must be >= 0")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0

    def footprint(self, nbytes: int) -> int:
        return nbytes

    def alloc(self, nbytes: int) -> Block:
        if self.used_bytes + nbytes > self.capacity_bytes:
            raise PoolExhausted(f"arena: {nbytes} bytes requested, {self.capacity_bytes - self.used_bytes} free")
        self.used_bytes += nbytes
        try:
            return _BytesBlock(self, nbytes)
        except MemoryError:
            self.used_bytes -= nbytes
            raise PoolExhausted(f"arena: the host could not allocate {nbytes} bytes") from None

    def _release(self, n: int) -> None:
        self.used_bytes -= n


class _PinnedBlock:
    __slots__ = ("view", "_buf", "_alloc", "_n")

    def __init__(self, alloc: "PinnedPoolAllocator", buf, n: int, held: int):
        self._buf = buf
        self._alloc = alloc
        self._n = held  # the block's size class: what it occupies in the pool
        self.view = memoryview(buf).cast("B")[:n]

    def free(self) -> None:
        if self._buf is not None:
            self.view.release()
            self.view = memoryview(b"")
            buf, self._buf = self._buf, None
            self._alloc._release(buf, self._n)


class PinnedPoolAllocator:
    """Blocks from a kvcore.PinnedPool (pinned host memory).

    A block whose memory is still exported (a view held by a slow network send)
    cannot go back to the pool yet: it is kept, still counted as used, and
    returned as soon as it can be (retried on every alloc).
    """

    name = "pinned"

    def __init__(self, capacity_bytes: int, *, huge_pages: bool = True, numa_node: Optional[int] = None,
                 pool=None):
        import kvcore

        if pool is None:
            if not hasattr(kvcore, "PinnedPool"):
                raise InvalidArgumentError("kvcore.PinnedPool is not available in this build")
            pool = kvcore.PinnedPool(capacity_bytes, huge_pages=huge_pages, numa_node=numa_node)
        self.pool = pool
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self._deferred: list = []  # (buffer, nbytes) whose free was refused

    def _try_free(self, buf) -> bool:
        try:
            if hasattr(buf, "free"):
                buf.free()
            else:
                self.pool.free(buf)
            return True
        except (InvalidArgumentError, BufferError):
            return False

    def _release(self, buf, n: int) -> None:
        if self._try_free(buf):
            self.used_bytes -= n
        else:
            self._deferred.append((buf, n))

    def _retry_deferred(self) -> None:
        if self._deferred:
            keep = []
            for buf, n in self._deferred:
                if self._try_free(buf):
                    self.used_bytes -= n
                else:
                    keep.append((buf, n))
            self._deferred = keep

    def footprint(self, nbytes: int) -> int:
        return size_class(nbytes)

    def alloc(self, nbytes: int) -> Block:
        self._retry_deferred()
        size = size_class(nbytes)
        if self.used_bytes + size > self.capacity_bytes:
            raise PoolExhausted(f"pinned pool: {size} bytes requested, "
                                f"{self.capacity_bytes - self.used_bytes} free")
        buf = self.pool.alloc(size)  # raises PoolExhausted when fragmented/full
        self.used_bytes += size
        return _PinnedBlock(self, buf, nbytes, size)


def size_class(nbytes: int) -> int:
    """nbytes rounded up to its size class: 128 classes per power of two (at most 0.8% more),
    so blocks of nearly the same size (a model's chunks) fit the holes each other leave.
    With exact sizes, a chunk one page larger than the one evicted before it does not fit
    its hole, and every such store evicts a second chunk.

    >>> size_class(1), size_class(26_577_505), size_class(26_583_040)
    (4096, 26607616, 26607616)
    """
    step = 1 << max(12, nbytes.bit_length() - 8)
    return -(-max(1, nbytes) // step) * step


def make_allocator(capacity_bytes: int, kind="auto") -> Allocator:
    """"auto" (PinnedPool when this build has it, else bytes), "pinned", "bytes", or an
    Allocator object (used as it is)."""
    if not isinstance(kind, str):
        return kind
    if kind == "bytes":
        return BytesArena(capacity_bytes)
    if kind in ("auto", "pinned"):
        import kvcore

        if hasattr(kvcore, "PinnedPool"):
            try:
                return PinnedPoolAllocator(capacity_bytes, huge_pages=True)
            except Exception:
                if kind == "pinned":
                    raise
        elif kind == "pinned":
            raise InvalidArgumentError("kvcore.PinnedPool is not available in this build")
        return BytesArena(capacity_bytes)
    raise InvalidArgumentError(f"unknown allocator {kind!r} (auto, pinned, bytes)")


@dataclass
class DDREntry:
    block: Block
    size: int
    readers: int = 0
    doomed: bool = False  # removed while being read: freed by the last reader

    @property
    def view(self) -> memoryview:
        return self.block.view


class DDRTier:
    """Key -> blob accounting over an allocator. Not thread-safe: the manager locks."""

    name = "ddr"

    def __init__(self, allocator: Allocator):
        self.allocator = allocator
        self.entries: dict[bytes, DDREntry] = {}
        self.used_bytes = 0

    @property
    def capacity_bytes(self) -> int:
        return self.allocator.capacity_bytes

    def __contains__(self, key: bytes) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: bytes) -> Optional[DDREntry]:
        return self.entries.get(key)

    def insert(self, key: bytes, block: Block, size: int) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self._drop(old)
        self.entries[key] = DDREntry(block, size)
        self.used_bytes += size

    def remove(self, key: bytes) -> int:
        """Removes key; returns the bytes it held (freed now or when its last reader leaves)."""
        e = self.entries.pop(key, None)
        if e is None:
            return 0
        self._drop(e)
        return e.size

    def _drop(self, e: DDREntry) -> None:
        self.used_bytes -= e.size
        if e.readers:
            e.doomed = True
        else:
            e.block.free()

    def acquire(self, key: bytes) -> Optional[DDREntry]:
        e = self.entries.get(key)
        if e is not None:
            e.readers += 1
        return e

    def release(self, e: DDREntry) -> None:
        e.readers -= 1
        if e.readers == 0 and e.doomed:
            e.block.free()

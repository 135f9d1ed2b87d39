"""Pinned (page-locked) host memory pool and its buffers.

>>> import kvcore
>>> pool = kvcore.PinnedPool(64 << 20)
>>> buf = pool.alloc(1 << 20)
>>> t = buf.tensor()               # zero-copy torch.uint8 view
>>> t[:4] = 7
>>> bytes(memoryview(buf)[:4])
b'\\x07\\x07\\x07\\x07'
>>> del t; buf.free()
>>> pool.stats()["used"]
0
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

from .. import _native
from .._args import int_arg, optional_int_arg, optional_seconds_arg
from ..errors import BackendError, InvalidArgumentError

__all__ = ["PinnedPool", "PinnedBuffer"]


def _cuda_runtime() -> Any:
    """torch's CUDA runtime bindings when a GPU is usable, else None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.cudart()


def _unregister(cudart: Any, segments: Sequence[tuple[int, int]]) -> None:
    for addr, _size in segments:
        cudart.cudaHostUnregister(addr)


class PinnedBuffer(_native.PinnedBlock):
    """A block of a PinnedPool: exposes the buffer protocol (memoryview,
    numpy.frombuffer) and a zero-copy torch view.

    The block goes back to the pool on ``free()`` or when the buffer is
    garbage-collected. ``free()`` refuses (InvalidArgumentError) while a
    memoryview/array or a ``tensor()`` view of the buffer is still alive.

    >>> import kvcore, torch
    >>> pool = kvcore.PinnedPool(8 << 20)
    >>> buf = pool.alloc(16 * 8 * 128 * 2)
    >>> kv = buf.tensor(torch.bfloat16, (16, 8, 128))
    >>> kv.shape
    torch.Size([16, 8, 128])
    """

    def __init__(self, pool: "PinnedPool", nbytes: int, timeout: Optional[float]) -> None:
        if not isinstance(pool, PinnedPool):
            raise InvalidArgumentError(f"pool must be a kvcore.PinnedPool, got {type(pool).__name__}")
        nbytes = int_arg(nbytes, "nbytes")
        timeout = optional_seconds_arg(timeout, "timeout", allow_zero=True)
        super().__init__(pool._native, int(nbytes), -1.0 if timeout is None else timeout)
        self.pool = pool

    def tensor(self, dtype: Any = None, shape: Optional[Sequence[int]] = None) -> Any:
        """Zero-copy torch tensor over the buffer (uint8, 1-D by default).

        The tensor keeps the buffer alive; free() is refused while it, or any
        view made from it, exists.
        """
        import torch

        self._check_live()
        dtype = torch.uint8 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(f"dtype must be a torch.dtype, got {dtype!r}")
        item = torch.empty((), dtype=dtype).element_size()
        if self.nbytes % item:
            raise InvalidArgumentError(f"{self.nbytes} bytes is not a whole number of {dtype} elements")
        if self.nbytes == 0:
            t = torch.empty(0, dtype=torch.uint8)
        else:
            # Over a memoryview, which torch holds until the tensor's memory is freed: an
            # export that free() counts for every view made from the tensor (the tensor
            # itself holds no export, and a view outlives it).
            t = torch.frombuffer(memoryview(self), dtype=torch.uint8, count=self.nbytes)
        t = t.view(dtype)
        if shape is not None:
            if not isinstance(shape, (list, tuple, torch.Size)):
                raise InvalidArgumentError(f"shape must be a sequence of ints, got {shape!r}")
            shape = tuple(int_arg(d, "a dimension of shape", -1) for d in shape)  # -1: inferred, as in view()
            try:
                t = t.view(shape)
            except RuntimeError as e:
                raise InvalidArgumentError(f"cannot view {self.nbytes} bytes as {dtype} {tuple(shape)}: {e}") from None
        return t

    def numpy(self, dtype: Any = None) -> Any:
        """Zero-copy numpy array over the buffer (uint8 by default)."""
        import numpy as np

        self._check_live()
        try:
            dtype = np.dtype(np.uint8 if dtype is None else dtype)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"dtype must name a numpy dtype: {e}") from None
        if dtype.hasobject or dtype.itemsize == 0 or self.nbytes % dtype.itemsize:
            raise InvalidArgumentError(f"cannot view {self.nbytes} bytes as {dtype} elements")
        return np.frombuffer(self, dtype=dtype)

    def _check_live(self) -> None:
        if self.freed:
            raise InvalidArgumentError("the PinnedBuffer was freed")

    def free(self) -> None:
        """Returns the block to its pool now. Idempotent. Refused while a memoryview,
        array or tensor view of the buffer is alive."""
        self._free()

    def __repr__(self) -> str:
        if self.freed:
            return f"<kvcore.PinnedBuffer freed nbytes={self.nbytes}>"
        return f"<kvcore.PinnedBuffer nbytes={self.nbytes} address=0x{self.address:x}>"


class PinnedPool:
    """A bounded pool of page-locked host memory.

    The capacity is reserved up front in segments of at most ``segment_bytes``
    (default 1 GiB; also the largest block), backed by 2 MiB huge pages when
    the system has them (``huge_pages=False`` forces normal pages), bound to
    ``numa_node`` when given, page-locked (``lock=True``: a clear error naming
    RLIMIT_MEMLOCK when the limit is too low) and, when CUDA is available
    (``cuda_register=None`` means "if available"), registered segment by
    segment with the CUDA runtime so host<->device copies are true DMA.

    ``alloc(nbytes, timeout=0)`` hands out blocks aligned to ``alignment``
    (default 4096, so O_DIRECT and DSA are happy); when no free block is large
    enough it raises kvcore.PoolExhausted, or waits up to ``timeout`` seconds
    (None: without limit) for one to be freed. The pool never grows.

    >>> import kvcore
    >>> pool = kvcore.PinnedPool(4 << 20, huge_pages=False)
    >>> a = pool.alloc(3 << 20)
    >>> try:
    ...     pool.alloc(2 << 20)
    ... except kvcore.PoolExhausted:
    ...     print("full")
    full
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        huge_pages: bool = True,
        numa_node: Optional[int] = None,
        lock: bool = True,
        alignment: int = 4096,
        segment_bytes: Optional[int] = None,
        cuda_register: Optional[bool] = None,
    ) -> None:
        capacity_bytes = int_arg(capacity_bytes, "capacity_bytes", 1)
        numa_node = optional_int_arg(numa_node, "numa_node")
        segment_bytes = optional_int_arg(segment_bytes, "segment_bytes", 1)
        self._native = _native.PinnedPoolNative(
            capacity_bytes,
            segment_bytes or 0,
            int_arg(alignment, "alignment", 1),
            bool(huge_pages),
            bool(lock),
            -1 if numa_node is None else numa_node,
        )
        self._cuda_registered = False
        self._finalizer = None
        if cuda_register is not False:
            cudart = _cuda_runtime()
            if cudart is None and cuda_register:
                raise BackendError("cuda_register=True but CUDA is not available")
            if cudart is not None:
                segments = self._native.segments()
                done = []
                for addr, size in segments:
                    rc = cudart.cudaHostRegister(addr, size, 1)  # cudaHostRegisterPortable
                    if int(rc) != 0:
                        _unregister(cudart, done)
                        raise BackendError(f"cudaHostRegister of a {size}-byte pool segment failed (error {rc})")
                    done.append((addr, size))
                self._cuda_registered = True
                self._finalizer = weakref.finalize(self, _unregister, cudart, done)

    @property
    def capacity(self) -> int:
        """Bytes the pool can hand out."""
        return int(self._native.stats()["capacity"])

    def alloc(self, nbytes: int, *, timeout: Optional[float] = 0.0) -> PinnedBuffer:
        """A buffer of ``nbytes`` bytes; raises kvcore.PoolExhausted when full
        (after waiting up to ``timeout`` seconds; None waits without limit)."""
        return PinnedBuffer(self, nbytes, timeout)

    def stats(self) -> dict[str, Any]:
        """capacity, used, free, largest_free_block, allocations (live), total and
        failed allocations, free_extents, segments, page_kind ("hugetlb", "thp",
        "normal"), locked, numa_node, cuda_registered."""
        s = dict(self._native.stats())
        s["cuda_registered"] = self._cuda_registered
        return s

    def segments(self) -> list[tuple[int, int]]:
        """(address, size) of every segment (what CUDA registration covers)."""
        return list(self._native.segments())

    def __repr__(self) -> str:
        s = self._native.stats()
        return f"<kvcore.PinnedPool capacity={s['capacity']} used={s['used']} pages={s['page_kind']}>"

"""Exceptions raised by kvcore. Every error kvcore raises derives from KVCoreError."""

import builtins


class KVCoreError(Exception):
    """Base class of every kvcore error."""


class InvalidArgumentError(KVCoreError, ValueError):
    """An argument is out of range or of the wrong kind (size, dtype, shape, option)."""


class CorruptFrameError(KVCoreError):
    """A frame is truncated, corrupted or tampered with; nothing was decoded from it."""


class BufferTooSmallError(KVCoreError, ValueError):
    """A destination buffer is smaller than what the operation needs."""


class UnsupportedError(KVCoreError):
    """The feature or backend is not available on this machine."""


class OutOfMemoryError(KVCoreError, MemoryError):
    """Memory could not be allocated."""


class PoolExhausted(KVCoreError):
    """A bounded pool has no free block of the requested size."""


class TimeoutError(KVCoreError, builtins.TimeoutError):
    """An operation did not finish within its timeout."""


class IOError(KVCoreError, OSError):
    """A file or device operation failed."""


class BackendError(KVCoreError):
    """An optional backend (QAT, DSA, CUDA) reported a failure."""


class DeviceTimeoutError(BackendError):
    """A device (DSA) did not finish a copy in time. It may still read the copy's source and
    write its destination later, so kvcore keeps the copy's buffers for the rest of the
    process instead of letting them go: do not free or reuse that memory either."""


class ForkedOperationError(KVCoreError):
    """An asynchronous operation was waited for in a process forked while it ran: it
    belongs to the parent process and does not run in the child."""


__all__ = [
    "KVCoreError",
    "InvalidArgumentError",
    "CorruptFrameError",
    "BufferTooSmallError",
    "UnsupportedError",
    "OutOfMemoryError",
    "PoolExhausted",
    "TimeoutError",
    "IOError",
    "BackendError",
    "DeviceTimeoutError",
    "ForkedOperationError",
]

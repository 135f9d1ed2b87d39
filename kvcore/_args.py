"""Checks of plain arguments shared by the public API: each failure is an InvalidArgumentError."""

import math
import numbers
import threading
from typing import Any, Optional

import numpy as np

from .errors import InvalidArgumentError


# No size, count or index kvcore takes is larger; the native layer takes them as 64-bit ints.
MAX_INT = 2**63 - 1


def int_arg(value: Any, name: str, minimum: int = 0) -> int:
    """value as an int of at least ``minimum`` and at most MAX_INT (an int or numpy
    integer, not a bool or float)."""
    if type(value) is int and minimum <= value <= MAX_INT:  # (the common case, without the ABC check)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not minimum <= value <= MAX_INT:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum} (and below 2**63), got {value!r}")
    return int(value)


def optional_int_arg(value: Any, name: str, minimum: int = 0) -> Optional[int]:
    return None if value is None else int_arg(value, name, minimum)


def seconds_arg(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """value as a finite number of seconds, > 0 (>= 0 with allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not (
        value >= 0 if allow_zero else value > 0
    ):
        raise InvalidArgumentError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def optional_seconds_arg(value: Any, name: str, *, allow_zero: bool = False) -> Optional[float]:
    return None if value is None else seconds_arg(value, name, allow_zero=allow_zero)


def wait_seconds(seconds: float) -> float:
    """A checked timeout as Python's threading and sockets take it: capped at
    threading.TIMEOUT_MAX (about 292 years), past which they overflow; so a longer
    one waits without limit, as the native waits do."""
    return min(seconds, threading.TIMEOUT_MAX)


# The codec's modes and their native codes (no native import here: the tier and bench
# modules that list the modes work without the native build).
MODE_CODES = {"dense": 0, "fast": 1, "max": 2}
MODES = tuple(MODE_CODES)


def mode_arg(mode: Any) -> int:
    """The native code of a codec mode name."""
    if not isinstance(mode, str) or mode not in MODE_CODES:
        raise InvalidArgumentError(f"mode must be one of {sorted(MODE_CODES)}, got {mode!r}")
    return MODE_CODES[mode]


DECODERS = ("any", "avx512")


def decoder_arg(decoder: Any) -> bool:
    """The native ``lanes`` flag of a ``decoder=`` argument ("any" or "avx512")."""
    if not isinstance(decoder, str) or decoder not in DECODERS:
        raise InvalidArgumentError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
    return decoder == "avx512"


# What memoryview() raises for a buffer object that no longer gives its memory: a released
# memoryview or closed mmap (ValueError), a freed PinnedBuffer (BufferError).
DEAD_BUFFER_ERRORS = (ValueError, BufferError)


def check_plain_buffer(buf: Any, what: str) -> None:
    """Refuses a buffer of Python object pointers (a numpy object array, or a memoryview
    of one): writing bytes over them corrupts the objects, and the array's cleanup then
    crashes the process. A refused memoryview is released."""
    if _holds_objects(buf):
        if isinstance(buf, memoryview):
            buf.release()
        raise InvalidArgumentError(f"{what}: an array of Python objects is not a byte buffer")


def _holds_objects(buf: Any) -> bool:
    """Whether a numpy array or memoryview holds Python object pointers. A format also names
    a structured array's fields ("T{l:Offset:d:b:}"), where an 'O' is no object: a memoryview
    with an 'O' in its format, of a numpy array, is judged by the array's dtype. Of other
    exporters the format is all there is, and a name may hold any character (':' too, so
    names cannot be told from items): an 'O' anywhere counts."""
    dtype = getattr(buf, "dtype", None)
    if dtype is not None:
        return dtype.hasobject
    if "O" not in buf.format:
        return False
    exporter = buf.obj if isinstance(buf, memoryview) else None
    return exporter.dtype.hasobject if isinstance(exporter, np.ndarray) else True


def check_tensor_memory(t: Any, what: str) -> None:
    """Refuses a torch tensor whose memory is not its values as plain elements: sparse,
    nested, quantized and meta tensors, and lazily negated or conjugated views (their
    memory holds the values before the negation: a copy of it would change them)."""
    import torch

    if t.layout != torch.strided or t.is_nested or t.is_quantized:
        kind = "nested" if t.is_nested else "quantized" if t.is_quantized else str(t.layout)
        raise InvalidArgumentError(f"{what}: a {kind} tensor has no plain element memory")
    if t.is_meta:
        raise InvalidArgumentError(f"{what}: a meta tensor holds no data")
    if t.is_neg() or t.is_conj():
        raise InvalidArgumentError(
            f"{what}: a lazily negated or conjugated view; call .resolve_neg() / .resolve_conj() first")

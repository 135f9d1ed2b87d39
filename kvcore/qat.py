"""Intel QAT compression through QATzip, loaded at run time.

kvcore never links QATzip. On first use it looks for the system library
``libqatzip.so.3`` (Debian 13 / Ubuntu 24.04 package ``libqatzip3``) with dlopen
and probes for hardware with QATzip's software backup off, so "no hardware" is
known for certain. Without hardware the ``deflate`` plane method codes with
ISA-L, and streams written either way decode on every machine.

Configuration is an explicit object:

>>> import kvcore
>>> from kvcore.qat import QatConfig
>>> st = QatConfig().apply()          # the system's libqatzip.so.3, if present
>>> isinstance(st["hardware"], bool)
True
>>> kvcore.qat.status()["counters"]["hw_compress_calls"] >= 0
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import _native
from ._args import int_arg
from .errors import InvalidArgumentError

__all__ = ["QatConfig", "status", "summary", "unload", "reset_counters"]


@dataclass(frozen=True)
class QatConfig:
    """Which QATzip library to use and when ``backend="auto"`` sends work to QAT.

    library_path: a QATzip shared library; None means ``libqatzip.so.3`` from the
        loader's search path (its absence is not an error).
    min_bytes: with ``backend="auto"``, pieces smaller than this stay in software
        (a QAT submission costs microseconds; small inputs do not pay for it).

    >>> QatConfig(min_bytes=8192).min_bytes
    8192
    """

    library_path: str | os.PathLike[str] | None = None
    min_bytes: int = 4096

    def apply(self) -> dict[str, Any]:
        """Load the library, probe for hardware and return :func:`status`.

        Raises kvcore.UnsupportedError when an explicitly named library cannot be
        loaded or lacks a QATzip entry point, kvcore.InvalidArgumentError when
        library_path is no path or min_bytes no int in [0, 2**32).
        """
        path = None if self.library_path is None else _library_path(self.library_path)
        return _native.qat_load(path, int_arg(self.min_bytes, "min_bytes"))


def _library_path(path: Any) -> bytes:
    """path as dlopen takes it: bytes without a NUL (dlopen would read up to it, and load
    the library that names)."""
    try:
        raw = os.fsencode(path)
    except TypeError:
        raise InvalidArgumentError(f"library_path must be a str, bytes or os.PathLike, got {type(path).__name__}") from None
    if b"\0" in raw:
        raise InvalidArgumentError(f"library_path contains a NUL byte: {path!r}")
    return raw


def status() -> dict[str, Any]:
    """Library, hardware presence and per-call counters (whether QAT really ran).

    Keys: loaded, hardware, library, message, probe_code, hw_buffer_bytes,
    min_bytes, has_ext_api, last_error_code, and counters (hw_compress_calls,
    hw_decompress_calls, hw_bytes_in, hw_bytes_out, sw_execution_calls,
    fallback_pieces, buf_errors, data_errors, other_errors, sessions_opened,
    sessions_closed).
    """
    return _native.qat_status()


def summary() -> dict[str, Any]:
    """The short form kvcore.features() shows: present, hardware, library, message."""
    s = status()
    return {
        "present": s["loaded"],
        "hardware": s["hardware"],
        "library": s["library"],
        "message": s["message"],
        "hw_compress_calls": s["counters"]["hw_compress_calls"],
    }


def unload() -> None:
    """Stop using the loaded QATzip library (software DEFLATE from now on)."""
    _native.qat_unload()


def reset_counters() -> None:
    """Set the per-call counters of :func:`status` to zero."""
    _native.qat_reset_counters()

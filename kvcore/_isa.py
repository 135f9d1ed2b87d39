"""SIMD variant selection.

The native core picks the widest SIMD variant the CPU supports. Features can be
masked, so that tests run every variant on one machine: call
``kvcore.set_disabled_isa("avx512,avx2")``, or set ``KVCORE_DISABLE_ISA`` before
``import kvcore`` (read once, at import).
"""

import os

from . import _native
from .errors import InvalidArgumentError


def set_disabled_isa(names: str) -> None:
    """Disable SIMD variants by name ("", "avx512", "avx2" or "avx512,avx2").

    Masking avx2 also masks avx512. Compress and decompress calls running meanwhile in
    other threads stay correct (a kernel whose variant was masked after its call chose it
    falls back; tests/native/isa_switch_check.cpp), but may run part of their work in the
    variant they started with: call it between calls for one variant throughout.

    >>> import kvcore
    >>> kvcore.set_disabled_isa("avx2")   # portable C++ kernels from now on
    >>> kvcore.set_disabled_isa("")       # back to the widest variant
    """
    if not isinstance(names, str):
        raise InvalidArgumentError(f"names must be a str such as \"avx512,avx2\", got {type(names).__name__}")
    if not names.isascii():  # no ISA name is, and a lone surrogate would not even reach the native check
        raise InvalidArgumentError(f"unknown ISA name in {names!r} (known: avx2, avx512)")
    _native.set_disabled_isa(names)


def isa_variant() -> str:
    """The SIMD variant in use: "avx512", "avx2" or "scalar"."""
    return _native.isa_variant()


def _apply_environment() -> None:
    names = os.environ.get("KVCORE_DISABLE_ISA")
    if names:
        set_disabled_isa(names)

"""What this machine's kvcore can use: SIMD variant and optional backends."""

from typing import Any

from . import _native, qat


def features() -> dict[str, Any]:
    """Report the SIMD variant in use and which backends are present.

    >>> import kvcore
    >>> kvcore.features()["simd"] in ("scalar", "avx2", "avx512")
    True
    """
    detected = _native.detected_isa()
    from .mover.copy import copy_engines

    movers = copy_engines()
    return {
        "simd": _native.isa_variant(),
        "simd_detected": [name for bit, name in ((1, "avx2"), (2, "avx512")) if detected & bit],
        "hardware_threads": _native.hardware_threads(),
        "qat": qat.summary(),
        "copy_engines": movers["copy_engines"],
        "dsa": movers["dsa"],
    }

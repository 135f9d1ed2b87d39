"""The SIMD variants this CPU has, for tests that run each of them: ``VARIANTS`` (portable
first, widest last) and ``use_variant(name)``, which makes ``name`` the widest active one."""

import kvcore

# Variant name -> the kvcore.set_disabled_isa mask that makes it the widest active one.
MASK_FOR = {"scalar": "avx2", "avx2": "avx512", "avx512": ""}
VARIANTS = ["scalar", *kvcore.features()["simd_detected"]]


def use_variant(name: str) -> None:
    kvcore.set_disabled_isa(MASK_FOR[name])
    assert kvcore.isa_variant() == name

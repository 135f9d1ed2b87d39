import pytest

import kvcore


def test_features_reports_simd_variant():
    f = kvcore.features()
    assert f["simd"] in ("scalar", "avx2", "avx512")
    assert f["hardware_threads"] >= 1


def test_isa_mask_round_trip():
    detected = kvcore.features()["simd_detected"]
    try:
        kvcore.set_disabled_isa("avx2")
        assert kvcore.isa_variant() == "scalar"
    finally:
        kvcore.set_disabled_isa("")
    assert kvcore.isa_variant() == (detected[-1] if detected else "scalar")


def test_unknown_isa_name_is_a_kvcore_error():
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.set_disabled_isa("sse9")

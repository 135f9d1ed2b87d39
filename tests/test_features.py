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


@pytest.mark.parametrize("names", ["sse9", "AVX2", "avx2\0", "avx2,\udcff"])  # (a lone surrogate raised TypeError)
def test_unknown_isa_name_is_a_kvcore_error(names):
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.set_disabled_isa(names)
    assert kvcore.isa_variant() == (kvcore.features()["simd_detected"] or ["scalar"])[-1]

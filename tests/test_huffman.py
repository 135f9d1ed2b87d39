"""Tests of the dense entropy coder (csrc/entropy/huffman.cpp) through kvcore._native.

Every test runs on each SIMD variant the machine has (BMI2 build and portable
build) via kvcore.set_disabled_isa.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcore
from kvcore import _native

from conftest import KVDATA, ROOT
from isa_variants import VARIANTS, use_variant

PIECE = 128 * 1024
STREAMS = 6  # tags 3 and 5: six segments, each coded last symbol first
SIZES = 4 * (STREAMS - 1)  # tag 3's stream sizes after the code lengths
HEADER_MAX = 1 + 32 + 128 + SIZES  # tag 3: tag, symbol bitmap, 256 length nibbles, stream sizes
LEGACY = ROOT / "tests" / "data" / "huffman_tag2.npz"  # tag 2 streams and a frame, written at 9859826
LEGACY3 = ROOT / "tests" / "data" / "huffman_tag3.npz"  # tag 3 streams and frames, written at fcd1875


@pytest.fixture(params=VARIANTS)
def variant(request):
    use_variant(request.param)
    yield request.param
    kvcore.set_disabled_isa("")


def round_trip(data: bytes | np.ndarray) -> bytes:
    raw = bytes(data)
    stream = _native.huffman_encode(raw)
    back = _native.huffman_decode(stream, len(raw))
    assert back == raw
    out = bytearray(len(raw))
    _native.huffman_decode_into(stream, out)
    assert bytes(out) == raw
    return stream


def entropy_bits(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    p = c / c.sum()
    return float(-(c * np.log2(p)).sum())


def huffman_bits(counts: np.ndarray) -> int:
    """Size in bits of an optimal (unlimited) Huffman code: the sum of the merged weights."""
    heap = [int(c) for c in counts if c > 0]
    if len(heap) < 2:
        return 0
    heapq.heapify(heap)
    total = 0
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        total += a + b
        heapq.heappush(heap, a + b)
    return total


# ---------------------------------------------------------------- real planes


def _load_planes() -> dict[str, np.ndarray]:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    if not KVDATA.is_dir():
        pytest.skip("../shared/kvdata is not present")
    planes = {}
    for path in sorted(KVDATA.glob("*.safetensors")):
        tensors = load_file(str(path))
        v = torch.cat([t.reshape(-1) for t in tensors.values()]).view(torch.int16).numpy().view(np.uint16)
        planes[f"{path.stem}:high"] = (v >> 8).astype(np.uint8)
        if "bf16" in path.stem:
            planes[f"{path.stem}:exponent"] = ((((v << 1) | (v >> 15)) >> 8) & 0xFF).astype(np.uint8)
    return planes


@pytest.fixture(scope="module")
def planes() -> dict[str, np.ndarray]:
    return _load_planes()


def test_real_planes_round_trip(variant, planes):
    for name, plane in planes.items():
        # Pieces as the codec cuts them, plus one odd-sized piece and a 1 MiB one.
        for start in range(0, min(len(plane), 8 * PIECE), PIECE):
            round_trip(plane[start : start + PIECE])
        round_trip(plane[12345 : 12345 + 77777])
        round_trip(plane[: 1 << 20])


def test_real_planes_size_near_entropy(planes):
    """Per 128 KiB piece: within 0.5 % (bf16) / 1 % (fp16 high byte: many rare symbols) of
    the optimal unlimited Huffman code (what the length limit and stream padding cost).
    Huffman itself is ~1.4 % above the entropy on these skewed planes (a prefix code spends
    >= 1 bit on the two ~26 % exponents), so 1 % of H is out of reach for any prefix code."""
    for name, plane in planes.items():
        slack = 1.005 if "bf16" in name else 1.01
        total, total_h = 0, 0.0
        for start in range(0, len(plane), PIECE):
            piece = plane[start : start + PIECE]
            counts = np.bincount(piece, minlength=256)
            stream = _native.huffman_encode(piece.tobytes())
            header, size = _header(stream, len(piece)).end, len(stream)
            h = entropy_bits(counts) / 8
            assert size - header >= h - 1e-6, name  # no code beats the entropy
            assert size - header <= huffman_bits(counts) / 8 * slack + STREAMS, name
            total += size
            total_h += h
        # Over the whole file (headers included) within 2.5 % of the order-0 entropy.
        assert total <= total_h * 1.025, (name, total / total_h)


def _with_isa_masked(mask: str, call, raw: bytes):
    kvcore.set_disabled_isa(mask)
    try:
        return call(raw)
    finally:
        kvcore.set_disabled_isa("")


def _encode_with(mask: str, raw: bytes) -> bytes:
    return _with_isa_masked(mask, _native.huffman_encode, raw)


def _pairing_with(mask: str, raw: bytes) -> str:
    return _with_isa_masked(mask, _native.huffman_pairing, raw)


def _has_avx512() -> bool:
    return "avx512" in kvcore.features()["simd_detected"]


@pytest.mark.parametrize("lo", [100, 103, 245])
@pytest.mark.parametrize("width", [2, 17, 31, 32, 33, 63, 64, 65])
@pytest.mark.parametrize("n", [256, 257, 1001, 4099, 65536 + 3])
def test_windowed_pairs_match_the_single_symbol_coder(lo, width, n):
    """Symbols within a window of 32 or 64 values (mod 256) are coded two per lookup (BMI2
    build), and in chunks of four or eight at the AVX-512 level; the stream must be the same
    bytes the one-symbol-at-a-time coder writes, for odd lengths (segments starting at odd
    offsets), windows at, below and above 32 and 64 values, windows not starting at a
    multiple of 32, and windows that wrap through 0 (residual planes)."""
    if "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("no AVX2/BMI2 on this machine: only one coder to compare")
    rng = np.random.default_rng(width * 100003 + n + lo)
    offsets = np.minimum(rng.geometric(0.25, n) - 1, width - 1)
    sym = ((lo + offsets) % 256).astype(np.uint8)
    sym[:2] = (lo, (lo + width - 1) % 256)  # both ends present: the window is exactly `width`
    raw = sym.tobytes()
    if width <= 64:
        assert _pairing_with("avx512", raw) == "window"
        assert _native.huffman_pairing(raw) == ("chunks" if _has_avx512() else "window")
    paired, single = _encode_with("avx512", raw), _encode_with("avx2", raw)
    assert paired == single
    assert _encode_with("", raw) == single
    assert _native.huffman_decode(paired, n) == raw


@pytest.mark.parametrize("shift", [1, 2, 3, 5, 6, 7])
@pytest.mark.parametrize("width", [2, 17, 32, 33, 64, 65])
@pytest.mark.parametrize("n", [256, 1001, 65536 + 3])
def test_windowed_pairs_of_symbols_with_shared_low_zero_bits(shift, width, n):
    """Symbols that all share `shift` low zero bits (a byte plane of fp16 values cast to fp32
    holds three mantissa bits: multiples of 32) are paired by their shifted values, in windows
    of up to 64 of those, wrapping mod 256 >> shift. The stream must be the single-symbol
    coder's bytes; a window too wide (65) or an odd symbol among them (no shared zero bits)
    goes one symbol at a time."""
    if "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("no AVX2/BMI2 on this machine: only one coder to compare")
    values = 256 >> shift
    rng = np.random.default_rng(shift * 7919 + width * 101 + n)
    lo = int(rng.integers(0, values))
    offsets = np.minimum(rng.geometric(0.3, n) - 1, min(width, values) - 1)
    sym = (((lo + offsets) % values) << shift).astype(np.uint8)
    sym[:2] = (lo << shift, ((lo + min(width, values) - 1) % values) << shift)
    for plane in (sym, np.concatenate([sym[:-1], np.uint8([1])])):
        raw = plane.tobytes()
        paired, single = _encode_with("avx512", raw), _encode_with("avx2", raw)
        assert paired == single
        assert _encode_with("", raw) == single
        assert _native.huffman_decode(paired, len(raw)) == raw


def test_windowed_pairs_on_channel_groups(planes):
    """Real exponent symbols of one channel group (the dense codec's input to the pair coder)."""
    if "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("no AVX2/BMI2 on this machine: only one coder to compare")
    for name, plane in planes.items():
        if not name.endswith(":exponent"):
            continue
        mode = int(np.bincount(plane).argmax())
        group = plane[(plane >= mode - 20) & (plane < mode + 11)][: 1 << 18]
        raw = group.tobytes()
        single = _encode_with("avx2", raw)
        assert _encode_with("avx512", raw) == single, name
        assert _encode_with("", raw) == single, name
        assert _native.huffman_decode(single, len(raw)) == raw, name


@pytest.mark.parametrize("split,below_avx512", [(2, "window"), (1, "single")])
def test_pairs_on_float16_top_bytes(planes, split, below_avx512):
    """A float16 top byte with its low mantissa bits split off (the dense codec's low-bits
    method). Two bits off: sign and exponent, under 64 values, coded through the 64-value
    window below the AVX-512 level. One bit off (MiniLM): sign, exponent and a mantissa bit,
    60-76 symbols in two windows of about 38 values, one per sign, one symbol a lookup below
    the AVX-512 level (the ranked pairs need VBMI). At the AVX-512 level both are coded in
    chunks (one table; two, picked by the sign). Every way the stream is the same bytes."""
    if "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("no AVX2/BMI2 on this machine: only one coder to compare")
    for name, plane in planes.items():
        if "fp16" not in name or not name.endswith(":high"):
            continue
        raw = (plane[: 1 << 18] >> split).tobytes()
        assert _pairing_with("avx512", raw) == below_avx512, name
        assert _native.huffman_pairing(raw) == ("chunks" if _has_avx512() else below_avx512), name
        single = _encode_with("avx2", raw)
        assert _encode_with("avx512", raw) == single, name
        assert _encode_with("", raw) == single, name
        assert _native.huffman_decode(single, len(raw)) == raw, name


def _ranked_cases():
    # (alphabet size m, symbols, n): a window never fits (the symbols span over 64 values),
    # at and around the 127-symbol limit and the 8 * m * m plane size the ranks need.
    for m in (40, 65, 100, 127, 128):
        for n in (8 * m * m - 1, 8 * m * m, 8 * m * m + 4097):
            yield m, n


@pytest.mark.parametrize("m,n", list(_ranked_cases()))
def test_ranked_pairs_match_the_single_symbol_coder(m, n):
    """Alphabets of up to 127 symbols in no window of 64 values are paired by rank (AVX-512
    VBMI index lookup) on planes of at least 8 * m * m symbols: the stream must be the bytes
    the one-symbol-at-a-time coders write (BMI2 with AVX-512 masked, and portable), with
    symbols above and below 128 (both byte permutes), counts that tie, and odd lengths."""
    detected = kvcore.features()["simd_detected"]
    if "avx512" not in detected:
        pytest.skip("no AVX-512 on this machine: the ranked pairs do not run")
    rng = np.random.default_rng(m * 1009 + n)
    # Gaps under 100 values: no window fits; 3, 67 and 131 share an entry mod 64 in one table
    # and in both two-table layouts, so the chunk kernel does not take them either.
    spread = np.array([3, 67, 131, 180], dtype=np.uint8)
    rest = rng.choice(np.setdiff1d(np.arange(256), spread), size=m - len(spread), replace=False)
    values = np.concatenate([spread, rest]).astype(np.uint8)
    weights = np.repeat(rng.geometric(0.2, (m + 1) // 2).astype(float), 2)[:m]  # pairs of tied counts
    sym = values[rng.choice(m, size=n, p=weights / weights.sum())]
    sym[:m] = values  # every symbol present
    raw = sym.tobytes()
    assert _native.huffman_pairing(raw) == ("rank" if m <= 127 and n >= 8 * m * m else "single")
    ranked = _encode_with("", raw)
    assert ranked == _encode_with("avx512", raw)
    assert ranked == _encode_with("avx2", raw)
    assert _native.huffman_decode(ranked, n) == raw


# ---------------------------------------------------------------- synthetic inputs


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, 7, 11, 13, 100, 4097, 1 << 20])
def test_sizes(variant, n):
    rng = np.random.default_rng(n)
    skewed = np.minimum(rng.geometric(0.3, n), 255).astype(np.uint8)
    round_trip(skewed)
    round_trip(rng.integers(0, 256, n, dtype=np.uint8))
    round_trip(np.full(n, 0x3F, np.uint8))
    round_trip((rng.integers(0, 2, n, dtype=np.uint8) * 200))


def test_empty_and_constant_forms(variant):
    assert _native.huffman_encode(b"") == b"\x00"
    assert _native.huffman_decode(b"\x00", 0) == b""
    assert _native.huffman_encode(b"\x07" * 1000) == b"\x01\x07"
    assert _native.huffman_decode(b"\x01\x07", 5) == b"\x07" * 5
    for bad, n in [(b"\x00", 1), (b"\x01\x07", 0), (b"\x01", 3), (b"\x00\x00", 0), (b"", 0), (b"\x09", 1)]:
        with pytest.raises(kvcore.CorruptFrameError):
            _native.huffman_decode(bad, n)


def test_two_symbols_use_one_bit(variant):
    data = bytes([5, 9] * 5000)
    stream = round_trip(data)
    assert len(stream) <= 1 + 32 + 1 + SIZES + len(data) // 8 + STREAMS


def test_uniform_random_stays_near_raw(variant):
    data = np.random.default_rng(1).integers(0, 256, 1 << 18, dtype=np.uint8)
    stream = round_trip(data)
    assert len(stream) <= len(data) + HEADER_MAX + STREAMS
    assert len(stream) <= _native.huffman_bound(len(data))


def test_length_limiting_on_powers_of_two(variant):
    # Counts 2^k make an unlimited Huffman code as deep as the alphabet; the coder
    # must limit the lengths and still round trip.
    parts = [np.full(1 << k, k, np.uint8) for k in range(20)]
    data = np.concatenate(parts)
    np.random.default_rng(2).shuffle(data)
    stream = round_trip(data)
    counts = np.bincount(data, minlength=256)
    assert len(stream) * 8 <= huffman_bits(counts) * 1.02 + 8 * HEADER_MAX  # limiting costs little
    # Fibonacci counts are the worst case for code depth.
    fib = [1, 1]
    while len(fib) < 30:
        fib.append(fib[-1] + fib[-2])
    data = np.repeat(np.arange(30, dtype=np.uint8) * 7, fib)
    round_trip(data)


def test_all_256_symbols_and_zipf(variant):
    rng = np.random.default_rng(3)
    zipf = np.minimum(rng.zipf(1.3, 300000) - 1, 255).astype(np.uint8)
    round_trip(zipf)
    data = np.concatenate([np.arange(256, dtype=np.uint8), zipf[:1000]])
    round_trip(data)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000))
def test_hypothesis_round_trip(data):
    round_trip(data)


# ---------------------------------------------------------------- histogram


def test_histogram(variant):
    rng = np.random.default_rng(4)
    for n in [0, 1, 15, 16, 17, 100003]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert _native.byte_histogram(data) == np.bincount(data, minlength=256).tolist()
    data = np.full(70000, 9, np.uint8)
    assert _native.byte_histogram(data)[9] == 70000


@pytest.mark.parametrize("n", [1023, 1024, 1087, 64 * 255, 64 * 255 + 65, 64 * 510 + 7, 100003])
def test_histogram_of_narrow_windows(variant, n):
    """Planes whose values span few values (counted by compare where AVX-512 is on): windows
    of 1-25 values, unsigned, signed (wrapping through 0) and at the top of the byte range,
    across the counters' flush every 255 vectors; and a plane narrow in its first KiB only."""
    rng = np.random.default_rng(n)
    for lo in (0, 100, 250, 231):
        for width in (1, 2, 8, 9, 16, 17, 24, 25):
            data = ((rng.geometric(0.3, n).clip(1, width) - 1 + lo) % 256).astype(np.uint8)
            data[rng.integers(0, n, 3)] = [lo, (lo + width - 1) % 256, (lo + width // 2) % 256]
            assert _native.byte_histogram(data) == np.bincount(data, minlength=256).tolist(), (lo, width)
    data = (rng.geometric(0.3, n).clip(1, 8) + 100).astype(np.uint8)
    data[-1] = 7  # far outside the first KiB's window
    assert _native.byte_histogram(data) == np.bincount(data, minlength=256).tolist()


def _check_weights(data: np.ndarray) -> bool:
    weights, exact = _native.byte_histogram_estimate(data)
    counts = np.bincount(data, minlength=256)
    if exact:
        assert weights == counts.tolist()
    else:
        # Every present value has a weight, no absent one does, and the scale is about n.
        w = np.array(weights)
        assert ((w > 0) == (counts > 0)).all()
        assert abs(int(w.sum()) - len(data)) < 0.05 * len(data)
    return exact


def test_histogram_estimate(variant):
    rng = np.random.default_rng(5)
    assert _check_weights(rng.integers(0, 256, 1000, dtype=np.uint8))  # small: exact
    assert _check_weights(np.full(100000, 7, np.uint8))  # constant: exact
    # Skewed values around 0 (as a residual exponent plane) and a few rare ones just
    # past them, which the sample misses: still weighted.
    skew = np.clip(rng.geometric(0.4, 200003) * rng.choice([-1, 1], 200003), -9, 9).astype(np.int8).view(np.uint8)
    for rare in ([], [10], [-10, 11], [10, -11, 12]):
        d = skew.copy()
        d[rng.integers(0, len(d), len(rare))] = np.array(rare, np.int8).view(np.uint8)
        assert not _check_weights(d)
    # Outliers leaving 9-32 values of the range unseen (looked for 8 at a time), some of
    # them present: still estimated, every present value weighted, no absent one.
    for far, present in ((20, [13]), (30, [12, 17, 25]), (40, [15, 16, 33, 38])):
        d = skew.copy()
        d[[17, 1000, 5000, 9000, 40001][: len(present) + 1]] = [far, *present]
        assert not _check_weights(d)
    # A far outlier leaves most values of the range unseen (80-odd): still estimated, and
    # so is a range of 200 values with 50 of the unseen ones present.
    d = skew.copy()
    d[17] = 100
    assert not _check_weights(d)
    d[rng.integers(0, len(d), 50)] = rng.choice(np.arange(20, 200), 50, replace=False)
    assert not _check_weights(d)
    # Unsigned range (exponents near 120): also estimated.
    assert not _check_weights((rng.geometric(0.3, 100000).clip(1, 20) + 110).astype(np.uint8))
    # Uniform bytes: many values the sample may miss at the range's ends -> exact or complete.
    _check_weights(rng.integers(0, 256, 100000, dtype=np.uint8))


def test_which_planes_are_sampled(variant):
    """Planes below 8 KiB are counted exactly; from 8 KiB a plane whose values span at most
    64 values (a channel group's exponents) is sampled, a wider one only from 32 KiB."""
    rng = np.random.default_rng(12)

    def plane(n, width):
        d = (rng.geometric(0.3, n).clip(1, width) + 100).astype(np.uint8)
        d[[5, 6]] = [101, 100 + width]  # the range's ends
        return d

    for n, width, exact in ((8191, 64, True), (8192, 64, False), (8192, 65, True), (32767, 65, True),
                            (32768, 65, False), (20000, 2, False)):
        assert _check_weights(plane(n, width)) == exact, (n, width)
        assert _native.byte_histogram_estimate(plane(n, width), False)[1] == exact, (n, width)


@pytest.mark.parametrize("size", [300000, 20000])  # sampled at two periods: below 32 KiB, more densely
@pytest.mark.parametrize("row", [32, 384, 1024])
def test_sampled_weights_see_every_channel(variant, row, size):
    """The sample spreads over every channel of planes made of rows (32 or 384 bytes, as
    stories260K's and MiniLM's KV): each half of the row has values of its own, and both
    get weights near their counts. A sample taken at a period that divides the row would
    see one half only."""
    rng = np.random.default_rng(row)
    rows = size // row
    first = rng.integers(100, 104, (rows, row // 2))
    second = rng.integers(104, 108, (rows, row - row // 2))
    plane = np.concatenate([first, second], axis=1).astype(np.uint8).reshape(-1)
    counts = np.bincount(plane, minlength=256)
    for complete in (True, False):
        weights, exact = _native.byte_histogram_estimate(plane, complete)
        assert not exact
        w = np.array(weights)
        assert (abs(w[100:108] - counts[100:108]) < 0.2 * counts[100:108]).all(), (complete, w[100:108])
        assert w[:100].sum() == 0 and w[108:].sum() == 0


def test_weights_without_completeness(variant):
    """complete=False (fast mode): no presence check, so a rare value the sample missed
    may weigh 0; small and constant planes are still counted exactly."""
    rng = np.random.default_rng(8)
    d = (rng.geometric(0.35, 200000).clip(1, 30) + 100).astype(np.uint8)
    d[[20, 30]] = [60, 200]  # between the first two sampled pieces (bytes 0-15, 136-151)
    weights, exact = _native.byte_histogram_estimate(d, False)
    assert not exact and weights[60] == 0 and weights[200] == 0
    assert abs(sum(weights) - len(d)) < 0.05 * len(d)
    assert _native.byte_histogram_estimate(d[:1000], False) == (np.bincount(d[:1000], minlength=256).tolist(), True)
    assert _native.byte_histogram_estimate(np.full(100000, 3, np.uint8), False)[1]
    # A sample of one value from a plane that is not constant: estimated, not exact.
    d = np.full(100000, 3, np.uint8)
    d[[20, 30]] = [60, 200]
    weights, exact = _native.byte_histogram_estimate(d, False)
    assert not exact and weights[3] == 100000 and sum(weights) == 100000


def test_estimated_weights_code_round_trip(variant):
    rng = np.random.default_rng(6)
    d = (rng.geometric(0.35, 300001).clip(1, 30) + 100).astype(np.uint8)
    d[rng.integers(0, len(d), 3)] = [60, 61, 200]  # rare, far from the rest
    frame = kvcore.compress(np.ascontiguousarray(np.stack([d[:300000].reshape(-1, 48)] * 2, axis=1)).view(np.uint8))
    back = kvcore.decompress(frame).numpy()
    assert (back.reshape(-1) == np.stack([d[:300000].reshape(-1, 48)] * 2, axis=1).reshape(-1)).all()


# ---------------------------------------------------------------- corrupt input


def _decode_or_corrupt(stream: bytes, n: int) -> None:
    try:
        out = _native.huffman_decode(stream, n)
    except kvcore.CorruptFrameError:
        return
    assert len(out) == n


def _small_stream() -> tuple[bytes, int]:
    rng = np.random.default_rng(5)
    data = np.minimum(rng.geometric(0.35, 700), 40).astype(np.uint8)
    return _native.huffman_encode(data.tobytes()), len(data)


def test_truncation_at_every_length(variant):
    stream, n = _small_stream()
    for cut in range(len(stream)):
        with pytest.raises(kvcore.CorruptFrameError):
            _native.huffman_decode(stream[:cut], n)
    # Extra bytes at the end are corrupt too.
    with pytest.raises(kvcore.CorruptFrameError):
        _native.huffman_decode(stream + b"\x00", n)


def test_wrong_symbol_count(variant):
    stream, n = _small_stream()
    for m in [0, 1, n - 1, n + 1, 2 * n, 10 * n]:
        _decode_or_corrupt(stream, m)


def test_random_bit_flips(variant):
    stream, n = _small_stream()
    rng = random.Random(6)
    caught = 0
    for _ in range(3000):
        b = bytearray(stream)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b) * 8)
            b[i >> 3] ^= 1 << (i & 7)
        try:
            out = _native.huffman_decode(bytes(b), n)
            assert len(out) == n
        except kvcore.CorruptFrameError:
            caught += 1
    assert caught > 0


def test_random_garbage(variant):
    rng = random.Random(7)
    for _ in range(3000):
        size = rng.randint(0, 300)
        garbage = bytearray(rng.getrandbits(8) for _ in range(size))
        if garbage and rng.random() < 0.7:
            garbage[0] = rng.choice([2, 3, 5])  # Huffman tags: exercise the header and stream checks
        _decode_or_corrupt(bytes(garbage), rng.choice([0, 1, 5, 100, 1000, 5000]))


@pytest.mark.parametrize("tag", [5, 3])
def test_header_fields_checked(variant, tag):
    """The compact header (tag 5, what the encoder writes here) and the bitmap one (tag 3,
    from the legacy file)."""
    if tag == 5:
        stream, n = _small_stream()
    else:
        legacy = _legacy(LEGACY3)
        stream, n = legacy["stream:five_symbols_64"].tobytes(), legacy["raw:five_symbols_64"].size
    b = bytearray(stream)
    head = _header(stream, n)
    assert head.tag == tag
    w, mod = head.size_width, 1 << (8 * head.size_width)
    # Stream sizes that overrun the input or shift the streams.
    for k in range(STREAMS - 1):
        at = head.sizes_at + w * k
        for delta in (1, -1, 1 << 20, -(1 << 31)):
            c = bytearray(b)
            v = int.from_bytes(c[at : at + w], "little")
            if (v + delta) % mod == v:
                continue
            c[at : at + w] = ((v + delta) % mod).to_bytes(w, "little")
            with pytest.raises(kvcore.CorruptFrameError):
                _native.huffman_decode(bytes(c), n)
    # A length nibble of 0 or above the limit, or an incomplete code.
    first_nibble = 3 if tag == 5 else 33
    for nib in (0x0, 0xC, 0xF):
        c = bytearray(b)
        c[first_nibble] = (c[first_nibble] & 0xF0) | nib
        with pytest.raises(kvcore.CorruptFrameError):
            _native.huffman_decode(bytes(c), n)
    if tag == 5:
        # Another range for the same lengths (one longer, starting one earlier or ending one
        # later, with the nibbles shifted to match) spells the code a second way: refused.
        lengths = head.lengths
        first, span = b[1], b[2] + 1
        for first2, span2 in ((first - 1) % 256, span + 1), (first, span + 1):
            c = bytearray([5, first2, span2 - 1]) + _nibbles([lengths.get((first2 + i) % 256, 0) for i in range(span2)])
            c += b[head.sizes_at:]
            with pytest.raises(kvcore.CorruptFrameError):
                _native.huffman_decode(bytes(c), n)


def test_decode_into_checks_buffers(variant):
    stream = _native.huffman_encode(b"abcabcabd")
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.huffman_decode_into(stream, b"123456789")  # read-only
    with pytest.raises(kvcore.CorruptFrameError):
        _native.huffman_decode_into(stream, bytearray(8))
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.huffman_decode(stream, -1)


def test_unaligned_and_multidimensional_buffers(variant):
    rng = np.random.default_rng(8)
    data = np.minimum(rng.geometric(0.3, 50001), 255).astype(np.uint8)
    backing = bytearray(len(data) + 1)
    backing[1:] = data.tobytes()
    stream = _native.huffman_encode(memoryview(backing)[1:])  # odd address
    assert _native.huffman_encode(data) == stream
    sbacking = bytearray(len(stream) + 3)
    sbacking[3:] = stream
    out = bytearray(len(data) + 5)
    _native.huffman_decode_into(memoryview(sbacking)[3:], memoryview(out)[5:])
    assert bytes(out[5:]) == data.tobytes()
    # A C-contiguous 2-D array is its bytes in order.
    grid = data[:50000].reshape(100, 500)
    assert _native.huffman_decode(_native.huffman_encode(grid), grid.size) == grid.tobytes()


def test_non_contiguous_views_rejected(variant):
    a = np.arange(1000, dtype=np.uint8)
    for view in (a[::2], a[::-1], a.reshape(10, 100)[:, :50]):
        with pytest.raises(kvcore.InvalidArgumentError):
            _native.huffman_encode(view)
    stream = _native.huffman_encode(a[:500].copy())
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.huffman_decode_into(stream, np.zeros(1000, np.uint8)[::2])


def _reference_limited_cost(counts: list[int], limit: int) -> int:
    """Optimal cost (sum of count * length) of a prefix code with lengths <= limit:
    textbook package-merge, items carry the leaves they contain."""
    w = sorted(counts)
    leaves = [(x, (i,)) for i, x in enumerate(w)]
    items = list(leaves)
    for _ in range(limit - 1):
        packages = [(items[2 * i][0] + items[2 * i + 1][0], items[2 * i][1] + items[2 * i + 1][1])
                    for i in range(len(items) // 2)]  # fmt: skip
        items = sorted(leaves + packages, key=lambda t: t[0])
    lengths = [0] * len(w)
    for _, members in items[: 2 * len(w) - 2]:
        for i in members:
            lengths[i] += 1
    return sum(a * b for a, b in zip(w, lengths))


class Header(NamedTuple):
    tag: int
    lengths: dict[int, int]  # code length by symbol
    sizes_at: int  # where the stream sizes start
    size_width: int  # bytes a stream size
    end: int  # where stream 0 starts


def _nibbles(values: list[int]) -> bytes:
    padded = values + [0] * (len(values) % 2)
    return bytes(padded[i] | padded[i + 1] << 4 for i in range(0, len(padded), 2))


def _size_width(n: int) -> int:
    """Bytes of each stream size in a tag 5 header for n symbols: the fewest that hold
    ceil(11 L / 8), the most bytes the longest segment's L = ceil(n / 6) symbols can take."""
    longest = -(-n // STREAMS)
    return max(1, (((11 * longest + 7) // 8).bit_length() + 7) // 8)


def _header(stream: bytes, n: int) -> Header:
    """The header of a tag 2, 3 or 5 stream for n symbols, as the comment at the top of
    csrc/entropy/huffman.cpp and docs/FORMAT.md describe it."""
    tag = stream[0]
    streams = 4 if tag == 2 else STREAMS
    if tag == 5:
        first, span = stream[1], stream[2] + 1
        lengths = {(first + i) % 256: (stream[3 + i // 2] >> (4 * (i % 2))) & 15 for i in range(span)}
        lengths = {s: v for s, v in lengths.items() if v}
        sizes_at, width = 3 + (span + 1) // 2, _size_width(n)
    else:
        bitmap = stream[1:33]
        symbols = [s for s in range(256) if bitmap[s >> 3] >> (s & 7) & 1]
        lengths = {s: (stream[33 + j // 2] >> (4 * (j % 2))) & 15 for j, s in enumerate(symbols)}
        sizes_at, width = 33 + (len(symbols) + 1) // 2, 4
    return Header(tag, lengths, sizes_at, width, sizes_at + width * (streams - 1))


def _header_lengths(stream: bytes) -> dict[int, int]:
    return _header(stream, 0).lengths


def test_code_lengths_are_optimal_under_the_limit():
    rng = np.random.default_rng(9)
    for t in range(40):
        m = int(rng.integers(2, 40))
        if t % 2:
            counts = (2 ** rng.integers(0, 17, m)).astype(np.int64)  # deep trees: the limit binds
        else:
            counts = rng.integers(1, 3000, m)
        data = np.repeat(np.arange(m, dtype=np.uint8) * 5, counts)
        lengths = _header_lengths(_native.huffman_encode(data))
        assert max(lengths.values()) <= 11
        assert sum(2.0 ** -v for v in lengths.values()) == 1.0  # complete code
        got = sum(int(c) * lengths[5 * i] for i, c in enumerate(counts))
        assert got == _reference_limited_cost([int(c) for c in counts], 11)


def test_runs_of_longest_codes(variant):
    # A geometric head and 200 rare symbols: the limit binds and the rare ones get
    # 11-bit codes; placed together they fill the encoder's bit buffer to its limit.
    rng = np.random.default_rng(10)
    head = np.repeat(np.arange(201, 213, dtype=np.uint8), [1 << (18 - k) for k in range(12)])
    rng.shuffle(head)
    rare = np.repeat(np.arange(1, 201, dtype=np.uint8), 2)
    rng.shuffle(rare)
    data = np.concatenate([head, rare, head[:5], rare[::-1]])
    lengths = _header_lengths(round_trip(data))
    assert sum(1 for v in lengths.values() if v == 11) >= 100
    round_trip(data[3:])  # other alignments of the same runs
    round_trip(data[7:-5])


def test_estimate_bounds_the_encoded_size(variant):
    rng = np.random.default_rng(11)
    cases = [b"", b"x", b"xxxx", bytes(range(256))]
    for n in [2, 3, 100, 4097, 200000]:
        cases.append(np.minimum(rng.geometric(0.3, n), 255).astype(np.uint8).tobytes())
        cases.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    for data in cases:
        size = len(_native.huffman_encode(data))
        estimate = _native.huffman_estimate(data)
        assert size <= estimate <= size + STREAMS - 1, (len(data), size, estimate)


def _low_planes() -> list[np.ndarray]:
    """The low (mantissa) byte plane of every tensor of each bf16 file."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    out = []
    for path in sorted(KVDATA.glob("*bf16.safetensors")):
        for t in load_file(str(path)).values():
            out.append((t.reshape(-1).view(torch.int16).numpy().view(np.uint16) & 0xFF).astype(np.uint8))
    return out


def test_sampled_estimate_is_not_below_the_encoded_size(variant):
    """The frame encoder refuses a plane before coding it when the estimate from sampled
    weights does not fit: that estimate must not undercut the real size on planes near
    8 bits (mantissa bytes, where it used to run about 1% low), nor be far above it."""
    rng = np.random.default_rng(12)
    cases = [rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes(),
             np.minimum(rng.geometric(0.05, 1 << 20), 255).astype(np.uint8).tobytes()]
    cases += [p.tobytes() for p in _low_planes()]
    for data in cases:
        size = len(_native.huffman_encode(data))
        estimate = _native.huffman_estimate(data, sampled=True)
        assert size <= estimate <= size * 1.03 + 64, (len(data), size, estimate)


def test_avx512_presence_scan_matches_scalar(tmp_path):
    """The AVX-512 presence scan against the scalar one under ASan + UBSan
    (tests/native/histogram_avx512_check.cpp; machines without AVX-512 run it emulated in
    test_shuffle_avx512_emulated.py)."""
    import subprocess

    from native_build import ROOT, build_harness

    sources = [str(ROOT / "csrc/entropy" / f) for f in ("histogram_avx512.cpp", "histogram.cpp")]
    sources.append(str(ROOT / "csrc/cpu/cpu_features.cpp"))
    exe = build_harness(tmp_path, "histogram_avx512_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith("ok:")


def test_avx512_code_chunks_match_the_specification(tmp_path):
    """The encoder's AVX-512 chunk kernel against its specification under ASan + UBSan
    (tests/native/code_chunks_check.cpp; machines without AVX-512 run it emulated in
    test_shuffle_avx512_emulated.py)."""
    import subprocess

    from native_build import ROOT, build_harness

    sources = [str(ROOT / "csrc" / f) for f in ("entropy/code_chunks_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "code_chunks_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith("ok:")


# ---------------------------------------------------------------- stream layout, old and new


def _reference_decode(stream: bytes, n: int) -> bytes:
    """The layout documented at the top of csrc/entropy/huffman.cpp, read bit by bit:
    tag 3 codes each of six segments last symbol first, tag 2 each of four first symbol
    first; canonical codes by (length, symbol), MSB-first, zero pad to a byte."""
    head = _header(stream, n)
    tag, lengths = head.tag, head.lengths
    streams = 4 if tag == 2 else STREAMS
    by_code = {}
    code, prev_len = 0, 0
    for sym, length in sorted(lengths.items(), key=lambda kv: (kv[1], kv[0])):
        code <<= length - prev_len
        by_code[(length, code)] = sym
        code, prev_len = code + 1, length
    w = head.size_width
    sizes = [int.from_bytes(stream[head.sizes_at + w * k : head.sizes_at + w * (k + 1)], "little")
             for k in range(streams - 1)]  # fmt: skip
    pos = head.end
    sizes.append(len(stream) - pos - sum(sizes))
    out = []
    for k in range(streams):
        body = stream[pos : pos + sizes[k]]
        pos += sizes[k]
        bits = "".join(f"{b:08b}" for b in body)
        count = n // streams + (k < n % streams)
        segment, at, code, length = [], 0, 0, 0
        while len(segment) < count:
            code, length, at = code << 1 | int(bits[at]), length + 1, at + 1
            if (length, code) in by_code:
                segment.append(by_code[(length, code)])
                code, length = 0, 0
        assert set(bits[at:]) <= {"0"} and len(bits) - at < 8  # only the zero pad is left
        out += segment if tag == 2 else segment[::-1]
    return bytes(out)


@pytest.mark.parametrize("n", [2, 7, 13, 700, 5003])
def test_stream_layout_is_the_documented_one(variant, n):
    """An independent bit-by-bit reader of the documented layout decodes what the encoder
    writes, for windowed (two symbols a lookup) and wide alphabets and for segment lengths
    that differ by one."""
    rng = np.random.default_rng(n)
    for data in (np.minimum(rng.geometric(0.35, n), 30).astype(np.uint8),
                 rng.integers(0, 256, n, dtype=np.uint8)):
        raw = data.tobytes()
        stream = _native.huffman_encode(raw)
        assert stream[0] in (3, 5) or (n == 2 and stream[0] == 1), stream[0]
        if stream[0] != 1:
            assert _reference_decode(stream, n) == raw


def _legacy(path=LEGACY) -> dict[str, np.ndarray]:
    if not path.is_file():
        pytest.fail(f"{path} is missing")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("path,tag", [(LEGACY, 2), (LEGACY3, 3)])
def test_streams_written_before_still_decode(variant, path, tag):
    """Streams the encoder no longer writes: tag 2 (four segments coded first symbol first),
    written before tag 3 (9859826), and tag 3 (a 32-byte symbol bitmap, 4-byte stream sizes),
    written before tag 5 (fcd1875). Real exponent and fp16 planes, odd lengths, two symbols,
    all 256 symbols (the same planes in both files)."""
    legacy = _legacy(path)
    names = [k[4:] for k in legacy if k.startswith("raw:")]
    assert len(names) == 6
    for name in names:
        raw, stream = legacy[f"raw:{name}"].tobytes(), legacy[f"stream:{name}"].tobytes()
        assert stream[0] == tag
        assert _native.huffman_decode(stream, len(raw)) == raw, name
        assert _reference_decode(stream, len(raw)) == raw, name


def test_forward_stream_mutations_end_in_corrupt_or_exact_size(variant):
    legacy = _legacy()
    stream = legacy["stream:five_symbols_64"].tobytes()
    n = legacy["raw:five_symbols_64"].size
    for cut in range(len(stream)):
        with pytest.raises(kvcore.CorruptFrameError):
            _native.huffman_decode(stream[:cut], n)
    rng = random.Random(8)
    big = legacy["stream:stories_exponents_20003"].tobytes()
    for _ in range(300):
        b = bytearray(big)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b) * 8)
            b[i >> 3] ^= 1 << (i & 7)
        _decode_or_corrupt(bytes(b), 20003)


def test_frame_written_with_forward_streams_still_decodes():
    """A dense frame (grouped Huffman) of MiniLM bf16 rows written at 9859826."""
    torch = pytest.importorskip("torch")
    legacy = _legacy()
    frame = legacy["frame:minilm_bf16_dense"].tobytes()
    assert "grouped" in kvcore.frame_info(frame)["methods"]
    back = kvcore.decompress(frame)
    assert tuple(back.shape) == tuple(legacy["frame_shape:minilm_bf16_dense"])
    assert back.dtype == torch.bfloat16
    assert back.view(torch.int16).numpy().view(np.uint8).reshape(-1).tobytes() == \
        legacy["frame_raw:minilm_bf16_dense"].tobytes()


@pytest.mark.parametrize("name", ["minilm_bf16_dense", "minilm_bf16_max", "apart_bf16_dense"])
def test_frames_written_with_bitmap_headers_still_decode(name):
    """Frames written at fcd1875 (tag 3 streams; the max-mode and the synthetic frames hold a
    grouped plane with 4-bit group maps and 4-byte stream sizes): they decode to the bytes
    kept beside them."""
    torch = pytest.importorskip("torch")
    legacy = _legacy(LEGACY3)
    frame, x = legacy[f"frame:{name}"].tobytes(), name.rsplit("_", 1)[0]
    methods = kvcore.frame_info(frame)["methods"]
    assert ("grouped" in methods) == (name != "minilm_bf16_dense")
    back = kvcore.decompress(frame)
    assert tuple(back.shape) == tuple(legacy[f"frame_shape:{x}"]) and back.dtype == torch.bfloat16
    assert back.view(torch.int16).numpy().view(np.uint8).reshape(-1).tobytes() == legacy[f"frame_raw:{x}"].tobytes()


@pytest.mark.parametrize("symbols", [[7, 9], [250, 3], list(range(256)), [0, 128], [0, 85, 170], [1, 40, 80, 120, 200]])
def test_encoder_writes_the_smaller_header(variant, symbols):
    """Tag 5 (range map, sizes in as few bytes as the longest stream needs) where its header is
    not larger than tag 3's (symbol bitmap, 4-byte sizes), else tag 3: both decode."""
    rng = np.random.default_rng(len(symbols))
    for n in (100, 5000, 70000):
        data = rng.choice(np.array(symbols, np.uint8), n, p=np.arange(1, len(symbols) + 1) / sum(range(len(symbols) + 1)))
        stream = round_trip(data)
        head = _header(stream, n)
        present = sorted(set(data.tolist()))
        gaps = [(present[(i + 1) % len(present)] - s - 1) % 256 for i, s in enumerate(present)]
        span = 256 - max(gaps) if len(present) < 256 else 256
        compact = 3 + (span + 1) // 2 + (STREAMS - 1) * _size_width(n)
        bitmap = 1 + 32 + (len(present) + 1) // 2 + SIZES
        assert head.tag == (5 if compact <= bitmap else 3), (n, compact, bitmap)
        assert head.end == min(compact, bitmap)
        assert set(head.lengths) == set(present)
        assert _reference_decode(stream, n) == data.tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_order0_bits_is_the_entropy_of_the_counts(seed):
    """The estimates' entropy (csrc/entropy/histogram.cpp: t log2 t - sum c log2 c, c log2 c
    tabled below 4096) against sum c log2(t / c), for counts below, at and above the table's
    end, empty ranges and one symbol."""
    rng = np.random.default_rng(seed)
    counts = [0] * 256
    for s in rng.choice(256, int(rng.integers(1, 200)), replace=False):
        counts[int(s)] = int(rng.choice([rng.integers(1, 4096), 4095, 4096, rng.integers(4096, 1 << 24)]))
    for lo, hi in ((0, 255), (int(rng.integers(0, 128)), int(rng.integers(128, 256))), (7, 7)):
        part = [c for c in counts[lo : hi + 1] if c]
        t = sum(part)
        want = math.fsum(c * math.log2(t / c) for c in part)
        # (the difference of two sums near t log2 t keeps their absolute rounding error)
        assert _native.order0_bits(counts, lo, hi) == pytest.approx(want, rel=1e-12, abs=1e-13 * t * math.log2(max(t, 1)) + 1e-9)
    assert _native.order0_bits([0] * 256) == 0 and _native.order0_bits([0] * 9 + [5] + [0] * 246) == 0
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.order0_bits(counts[:255])


@pytest.mark.parametrize("symbols", [[0, 128], [7, 9, 200], [250, 3, 4], [0, 85, 170], [10, 20, 30, 40, 50, 60],
                                     [0, 1, 255], list(range(0, 256, 2)), list(range(256))])
def test_range_map_has_one_spelling(variant, symbols):
    """Every range that holds the coded values, one starting at each of them (ties between
    equally long ranges included), spells the same code; the decoder takes only the shortest,
    of those the one with the smallest first value (csrc/entropy/code_lengths.h), and refuses
    the others and any with an uncoded end."""
    rng = np.random.default_rng(len(symbols))
    n = 3000
    data = rng.choice(np.array(symbols, np.uint8), n)
    stream = _native.huffman_encode(data)
    head = _header(stream, n)
    lengths, payload = head.lengths, stream[head.sizes_at :]
    if head.tag == 3:  # tag 3's sizes are 4 bytes; tag 5's as few as the longest stream needs
        width = _size_width(n)
        sizes = [int.from_bytes(payload[4 * k : 4 * k + 4], "little") for k in range(STREAMS - 1)]
        payload = b"".join(v.to_bytes(width, "little") for v in sizes) + payload[4 * (STREAMS - 1) :]
    coded = sorted(lengths)
    gaps = {s: (s - coded[i - 1] - 1) % 256 for i, s in enumerate(coded)}  # uncoded values before s
    longest = max(gaps.values()) if len(coded) < 256 else 0
    canonical = min(s for s in coded if gaps[s] == longest) if len(coded) < 256 else 0
    spellings = [(s, 256 - gaps[s]) for s in coded] + [(coded[0], 256)] * (len(coded) < 256)
    spellings += [((coded[0] - 1) % 256, 256 - gaps[coded[0]] + 1)] * (gaps[coded[0]] > 0)  # an uncoded first value
    for first, span in spellings:
        c = bytes([5, first, span - 1]) + _nibbles([lengths.get((first + i) % 256, 0) for i in range(span)]) + payload
        if first == canonical and span == 256 - longest:
            assert _native.huffman_decode(c, n) == data.tobytes()
        else:
            with pytest.raises(kvcore.CorruptFrameError):
                _native.huffman_decode(c, n)

"""The "fast" mode plane coder (csrc/entropy/fastcode.*): round trips on real KV
byte planes, every code width and SIMD variant, the documented stream layout,
and corrupt input (bit flips, truncation, garbage) that must end in
CorruptFrameError or a clean n-byte result."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
from kvcore import _native as N

from conftest import KVDATA, kvdata_files
from isa_variants import VARIANTS, use_variant

WIDTHS = range(1, 8)
SIZES = [0, 1, 2, 3, 31, 32, 33, 255, 256, 257, 4097, 1 << 20]
PIECE = 128 * 1024


@pytest.fixture(params=VARIANTS)
def variant(request):
    use_variant(request.param)
    yield request.param
    kvcore.set_disabled_isa("")


def in_variant(name: str, fn, *args):
    use_variant(name)
    try:
        return fn(*args)
    finally:
        kvcore.set_disabled_isa("")


def skewed(n: int, seed: int = 0) -> np.ndarray:
    """Exponent-like bytes: a few frequent values and a tail of rare ones."""
    rng = np.random.default_rng(seed)
    return (rng.geometric(0.35, n) + 110).clip(0, 255).astype(np.uint8)


def encode_any(x: np.ndarray, width: int = 0) -> bytes:
    """Encodes with a capacity that any width fits (the stream may grow)."""
    return N.fastcode_encode(x, width, N.fastcode_bound(len(x)))


def load_planes(max_elems: int = 1 << 20) -> dict[str, np.ndarray]:
    import torch
    from safetensors.torch import load_file

    planes: dict[str, np.ndarray] = {}
    for path in kvdata_files():
        tensors = load_file(str(path))
        v = torch.cat([t.reshape(-1).view(torch.int16) for t in tensors.values()]).numpy().view(np.uint16)
        v = v[: max_elems]
        name = path.stem
        if "bf16" in name:
            planes[f"{name}:exponent"] = ((v >> 7) & 0xFF).astype(np.uint8)
        planes[f"{name}:high"] = (v >> 8).astype(np.uint8)
    return planes


@pytest.fixture(scope="module")
def planes():
    if not KVDATA.is_dir() or not kvdata_files():
        pytest.skip("../shared/kvdata is not present")
    return load_planes()


# ----------------------------------------------------------------- reference layout

def top_order(x: np.ndarray) -> list[int]:
    """Byte values by decreasing count, ties by value: the table of an arbitrary-table stream."""
    hist = np.bincount(x, minlength=256)
    return sorted(range(256), key=lambda s: (-hist[s], s))


def is_row_progressive(table: bytes) -> bool:
    """Each row of 16 codes maps to consecutive values (mod 256): the decoders' fast path."""
    return all((table[c & ~15] + (c & 15)) & 0xFF == table[c] for c in range(len(table)))


def stream_head(stream: bytes, w: int) -> tuple[int, bytes]:
    """The escape count (LEB128 after the width byte) and the symbol table of a stream."""
    nexc, pos, shift = 0, 1, 0
    while True:
        nexc |= (stream[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not stream[pos - 1] & 0x80:
            break
    return nexc, stream[pos : pos + (1 << w) - 1]


def ref_encode(x: np.ndarray, w: int, order=None) -> bytes:
    """The stream layout of csrc/entropy/fastcode_format.h, written out in numpy, for the
    symbol table `order` (default: the most frequent values first)."""
    n = len(x)
    order = list(order) if order is not None else top_order(x)
    esc = (1 << w) - 1
    code_of = np.full(256, esc, np.uint8)
    code_of[order[:esc]] = np.arange(esc, dtype=np.uint8)
    codes = code_of[x]
    lits = x[codes == esc]
    out = bytearray([w])
    v = len(lits)
    while True:
        out.append((v & 0x7F) | (0x80 if v >= 0x80 else 0))
        v >>= 7
        if not out[-1] & 0x80:
            break
    out += bytes(order[:esc])
    out += lits.tobytes()
    comps = [(c, sum(d for d in (4, 2) if d > c and w & d)) for c in (4, 2, 1) if w & c]
    for g in range(n // 256):
        cg = codes[256 * g : 256 * g + 256].reshape(8, 32)
        for c, o in comps:
            per = 8 // c
            for j in range(c):
                vec = np.zeros(32, np.uint8)
                for f in range(per):
                    vec |= ((cg[j * per + f] >> o) & ((1 << c) - 1)) << (c * f)
                out += vec.tobytes()
    tail = codes[(n // 256) * 256 :]
    acc = 0
    for j, c in enumerate(tail):
        acc |= int(c) << (j * w)
    out += acc.to_bytes((len(tail) * w + 7) // 8, "little")
    return bytes(out)


@pytest.mark.parametrize("w", WIDTHS)
def test_stream_matches_documented_layout(variant, w):
    for n in (0, 1, 33, 256, 700):
        x = skewed(n, seed=n + w)
        stream = encode_any(x, w)
        table = stream_head(stream, w)[1]
        # The encoder's table: the most frequent values, or (w >= 5) a row-progressive
        # one that costs at most 1/128 of the stream in extra escapes.
        if w < 5 or not is_row_progressive(table):
            assert list(table) == top_order(x)[: (1 << w) - 1], (n, w)
        else:
            assert len(stream) <= len(ref_encode(x, w)) * (1 + 1 / 128), (n, w)
        assert stream == ref_encode(x, w, table), (n, w)


@pytest.mark.parametrize("w", [5, 6, 7])
def test_row_progressive_tables(variant, w):
    """Tables whose rows of 16 codes are runs of consecutive values take the decoders'
    fast path (one lookup per code): the encoder picks them where they cost almost no
    escapes, and every variant decodes them like any other table, escapes and tail included."""
    rng = np.random.default_rng(w)
    # Exponent-like runs around 0 (wrapping from 255 to 0), with rare far values.
    x = (rng.normal(0, 18, 40 * 256 + 77).round().astype(np.int64) & 0xFF).astype(np.uint8)
    x[rng.integers(0, len(x), 20)] = 128
    stream = encode_any(x, w)
    assert is_row_progressive(stream_head(stream, w)[1])
    for dec in VARIANTS:
        assert in_variant(dec, N.fastcode_decode, stream, len(x)) == x.tobytes()
    # Hand-built row tables, decoded by every variant against the reference layout:
    # rows in any order and starting anywhere, escapes in every group.
    starts = rng.permutation(np.arange(0, 256, 16))[: 1 << (w - 4)] + rng.integers(0, 16)
    table = bytes(int(starts[c >> 4] + (c & 15)) & 0xFF for c in range((1 << w) - 1))
    y = rng.integers(0, 256, 9 * 256 + 13).astype(np.uint8)
    y[::3] = np.frombuffer(table, np.uint8)[rng.integers(0, len(table), len(y[::3]))]
    hand = ref_encode(y, w, table)
    for dec in VARIANTS:
        assert in_variant(dec, N.fastcode_decode, hand, len(y)) == y.tobytes()


def test_row_progressive_tables_on_fp8():
    """fp8 e4m3 KV bytes (a 7-bit code) get row-progressive tables for at most 0.2% more bytes."""
    import torch
    from safetensors.torch import load_file

    paths = [p for p in kvdata_files() if "fp16" in p.name]
    if not paths:
        pytest.skip("../shared/kvdata is not present")
    for path in paths:
        for t in list(load_file(str(path)).values())[::3]:
            x = t.reshape(-1)[: 1 << 18].to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            stream = encode_any(x, 7)
            assert is_row_progressive(stream_head(stream, 7)[1]), path.name
            assert len(stream) <= len(ref_encode(x, 7)) * 1.002, path.name


def test_hand_built_stream_decodes():
    # w=1, one escape literal (9), table [7], tail codes 0,1,0 -> bits 0b010
    stream = bytes([1, 1, 7, 9, 0b010])
    assert N.fastcode_decode(stream, 3) == bytes([7, 9, 7])


# ----------------------------------------------------------------- round trips

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("w", WIDTHS)
def test_round_trip_every_size_and_width(variant, n, w):
    x = skewed(n, seed=w)
    s = encode_any(x, w)
    assert s[0] == w
    assert len(s) <= N.fastcode_bound(n)
    assert N.fastcode_decode(s, n) == x.tobytes()


def test_real_planes_round_trip(variant, planes):
    for name, plane in planes.items():
        total = 0
        for start in range(0, len(plane), PIECE):
            piece = plane[start : start + PIECE]
            s = N.fastcode_encode(piece)
            total += len(s)
            back = np.empty_like(piece)
            N.fastcode_decode_into(s, back)
            assert np.array_equal(back, piece), name
        ratio = total / len(plane)
        p = np.bincount(plane, minlength=256) / len(plane)
        p = p[p > 0]
        entropy_ratio = float(-(p * np.log2(p)).sum()) / 8
        # fixed-width codes cost at most ~1 bit/symbol over the order-0 entropy here
        # (bf16 exponent: ~2.8-3.3 bits -> w = 3 plus escapes, ratio ~0.42)
        assert entropy_ratio < ratio < entropy_ratio + 0.1, (name, ratio, entropy_ratio)
        if "bf16" in name:
            assert ratio < 0.47, (name, ratio)


def test_real_planes_every_width(planes):
    plane = next(iter(planes.values()))[: 3 * PIECE + 77]
    for w in WIDTHS:
        s = encode_any(plane, w)
        for v in VARIANTS:
            assert in_variant(v, N.fastcode_decode, s, len(plane)) == plane.tobytes(), (w, v)


def test_estimated_weights(variant, planes):
    """Weights that are estimates (a sample's counts) choose the width and table; the escapes
    are counted while coding, so the stream is exact whatever the weights say."""
    plane = next(iter(planes.values()))[: 5 * PIECE + 77]
    exact = np.bincount(plane, minlength=256)
    sample = np.bincount(plane[::8], minlength=256) * 8
    absent = int(np.flatnonzero(exact == 0)[0])
    misleading = [
        exact,  # exact counts: the same stream as without weights
        sample,
        exact[::-1].copy(),  # the rarest values first
        np.eye(256, dtype=np.int64)[absent] * len(plane),  # all weight on a value that never occurs
        np.ones(256, dtype=np.int64),
    ]
    bound = N.fastcode_bound(len(plane))
    for weights in misleading:
        s = N.fastcode_encode(plane, 0, bound, weights=weights.tolist())
        for v in VARIANTS:
            assert in_variant(v, N.fastcode_decode, s, len(plane)) == plane.tobytes()
    assert N.fastcode_encode(plane, 0, bound, weights=exact.tolist()) == N.fastcode_encode(plane, 0, bound)
    sampled = N.fastcode_encode(plane, weights=sample.tolist())
    assert len(sampled) <= len(N.fastcode_encode(plane)) * 1.01  # a sample chooses about as well
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_encode(plane, weights=[1] * 255)
    with pytest.raises(kvcore.BufferTooSmallError):
        N.fastcode_encode(plane, 0, 10, weights=sample.tolist())


def test_auto_width_is_the_smallest(variant):
    for seed, n in [(1, 5000), (2, 1 << 16)]:
        x = skewed(n, seed)
        best = min(len(encode_any(x, w)) for w in WIDTHS)
        assert len(encode_any(x)) == best


def test_constant_plane(variant):
    x = np.full(1 << 20, 0x7F, np.uint8)
    s = N.fastcode_encode(x)
    assert s[0] == 1 and len(s) < (1 << 20) // 8 + 16
    assert N.fastcode_decode(s, len(x)) == x.tobytes()


def test_uniform_random_does_not_shrink(variant):
    x = np.random.default_rng(5).integers(0, 256, 1 << 16, dtype=np.uint8)
    with pytest.raises(kvcore.BufferTooSmallError):
        N.fastcode_encode(x)
    for w in WIDTHS:
        s = encode_any(x, w)
        assert N.fastcode_decode(s, len(x)) == x.tobytes()


def test_cap_is_respected():
    x = skewed(10000)
    s = N.fastcode_encode(x)
    assert N.fastcode_encode(x, 0, len(s)) == s
    with pytest.raises(kvcore.BufferTooSmallError):
        N.fastcode_encode(x, 0, len(s) - 1)
    with pytest.raises(kvcore.BufferTooSmallError):
        N.fastcode_encode(np.zeros(0, np.uint8))  # nothing to gain


def test_bad_width_is_invalid():
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_encode(skewed(100), 8, 1000)


@pytest.mark.parametrize("w", WIDTHS)
def test_cross_variant(w):
    x = skewed(3 * 256 + 45, seed=w)
    streams = {v: in_variant(v, encode_any, x, w) for v in VARIANTS}
    assert len(set(streams.values())) == 1
    for enc in VARIANTS:
        for dec in VARIANTS:
            assert in_variant(dec, N.fastcode_decode, streams[enc], len(x)) == x.tobytes()


def test_decode_into_buffers():
    x = skewed(5000)
    s = N.fastcode_encode(x)
    out = bytearray(len(x))
    N.fastcode_decode_into(s, out)
    assert bytes(out) == x.tobytes()
    with pytest.raises(kvcore.CorruptFrameError):
        N.fastcode_decode_into(s, bytearray(len(x) + 1))
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_decode_into(s, bytes(len(x)))
    strided = np.zeros(2 * len(x), np.uint8)[::2]
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_decode_into(s, strided)
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_encode(np.repeat(x, 2)[::2])
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_decode(np.frombuffer(s + s, np.uint8).reshape(2, -1)[:, :4].copy().T, 4)
    offset = np.zeros(len(x) + 1, np.uint8)[1:]  # unaligned destination
    N.fastcode_decode_into(s, offset)
    assert offset.tobytes() == x.tobytes()
    assert N.fastcode_decode(memoryview(bytearray(b"\0" + s))[1:], len(x)) == x.tobytes()  # unaligned source
    with pytest.raises(kvcore.InvalidArgumentError):
        N.fastcode_decode(s, -1)
    with pytest.raises(kvcore.CorruptFrameError):
        N.fastcode_decode(s, 1 << 50)  # refused before allocating


# ----------------------------------------------------------------- corrupt input

def decode_checked(stream: bytes, n: int) -> None:
    """Decoding must raise CorruptFrameError or return exactly n bytes."""
    try:
        out = N.fastcode_decode(stream, n)
    except kvcore.CorruptFrameError:
        return
    assert len(out) == n


@pytest.mark.parametrize("w", [1, 3, 4, 6, 7])
def test_bit_flips(variant, w):
    x = skewed(2 * 256 + 100, seed=w)
    s = bytearray(encode_any(x, w))
    for bit in range(len(s) * 8):
        s[bit // 8] ^= 1 << (bit % 8)
        decode_checked(bytes(s), len(x))
        s[bit // 8] ^= 1 << (bit % 8)


@pytest.mark.parametrize("w", [1, 3, 5, 7])
def test_truncation_and_extension(variant, w):
    x = skewed(600, seed=w)
    s = encode_any(x, w)
    for cut in range(len(s)):
        with pytest.raises(kvcore.CorruptFrameError):
            N.fastcode_decode(s[:cut], len(x))
    with pytest.raises(kvcore.CorruptFrameError):
        N.fastcode_decode(s + b"\0", len(x))
    for n in (len(x) - 1, len(x) + 1, 0):
        decode_checked(s, n)


def test_escape_count_must_match(variant):
    # w=1, table [5]: 300 codes, 256 in a group (32 bytes) + 44 in the tail
    def stream(nexc: int, ones: int) -> bytes:
        codes = np.zeros(300, np.uint8)
        codes[:ones] = 1
        group = np.packbits(codes[:256].reshape(8, 32).T, axis=1, bitorder="little").reshape(-1)
        tail = int("".join(str(b) for b in codes[256:][::-1]), 2).to_bytes(6, "little")
        return bytes([1, nexc, 5]) + bytes(range(nexc)) + group.tobytes() + tail

    good = N.fastcode_decode(stream(3, 3), 300)
    assert good[:3] == bytes([0, 1, 2]) and set(good[3:]) == {5}
    for nexc, ones in [(2, 3), (4, 3), (0, 1), (1, 0), (10, 40)]:
        with pytest.raises(kvcore.CorruptFrameError):
            N.fastcode_decode(stream(nexc, ones), 300)


def test_header_fields(variant):
    x = skewed(1000)
    s = bytearray(N.fastcode_encode(x))
    for b0 in (0, 8, 0x13, 0xFF):
        bad = bytes([b0]) + bytes(s[1:])
        with pytest.raises(kvcore.CorruptFrameError):
            N.fastcode_decode(bad, len(x))
    # escape count over n, and non-canonical / overlong varints
    for varint in (b"\xe9\x07", b"\x80\x00", b"\xff" * 11):
        bad = bytes([s[0]]) + varint + bytes(s[2:])
        with pytest.raises(kvcore.CorruptFrameError):
            N.fastcode_decode(bad, len(x))
    with pytest.raises(kvcore.CorruptFrameError):
        N.fastcode_decode(b"", 0)


def test_garbage(variant):
    rng = np.random.default_rng(11)
    for _ in range(3000):
        size = int(rng.integers(0, 400))
        g = rng.integers(0, 256, size, dtype=np.uint8)
        g[0:1] = rng.integers(1, 8)  # mostly a valid width so parsing goes deeper
        n = int(rng.integers(0, 2000))
        decode_checked(g.tobytes(), n)
        # a well-formed header over random codes: sizes consistent, data random
        w = int(rng.integers(1, 8))
        n = int(rng.integers(256, 3000))
        nexc = int(rng.integers(0, 100))
        body = rng.integers(0, 256, (1 << w) - 1 + nexc + (n // 256) * 32 * w + ((n % 256) * w + 7) // 8,
                            dtype=np.uint8)
        decode_checked(bytes([w, nexc]) + body.tobytes(), n)


@pytest.mark.parametrize("n", [241, 255, 256, 320, 321, 1088, 1089, 1090, 4161, 65536, 65537])
def test_fp8_blocks_checksummed_while_decoding(variant, n):
    """A one-byte fastcode plane decodes straight into the output, and where the AVX-512
    decoder runs it checksums the groups it writes (those before the block's last 64 bytes)
    from its registers, the rest after. Every block length around a group (256 bytes) or
    stripe (64) end decodes, and no changed byte of a block's payload gets past the check."""
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(skewed(n, n).astype(np.int8)).view(torch.float8_e4m3fn)
    frame = kvcore.compress(x, mode="fast", block_bytes=max(64, n))
    assert kvcore.frame_info(frame)["methods"].keys() == {"fastcode"}
    assert torch.equal(kvcore.decompress(frame).view(torch.uint8), x.view(torch.uint8))
    rng = np.random.default_rng(n)
    payload_start = len(frame) - kvcore.frame_info(frame)["methods"]["fastcode"]["bytes"]
    for at in rng.integers(payload_start, len(frame), 40):
        bad = bytearray(frame)
        bad[at] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(bad))


# ----------------------------------------------------------------- properties

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000), width=st.integers(0, 7), scalar=st.booleans())
def test_property_round_trip(data, width, scalar):
    x = np.frombuffer(data, np.uint8)
    widest = VARIANTS[-1]
    s = in_variant("scalar" if scalar else widest, encode_any, x, width)
    assert in_variant(widest if scalar else "scalar", N.fastcode_decode, s, len(x)) == data


@settings(max_examples=500, deadline=None)
@given(stream=st.binary(max_size=600), n=st.integers(0, 3000), scalar=st.booleans())
def test_property_any_bytes_decode_cleanly(stream, n, scalar):
    in_variant("scalar" if scalar else VARIANTS[-1], decode_checked, stream, n)


# ----------------------------------------------------------------- sanitizers

@pytest.mark.slow
def test_native_sanitizer_run(tmp_path):
    """Builds tests/native/fastcode_sanitize.cpp with ASan+UBSan and runs it."""
    import subprocess

    from native_build import ROOT, build_harness

    sources = [str(ROOT / "csrc/entropy" / f) for f in ("fastcode.cpp", "fastcode_avx512.cpp")]
    sources.append(str(ROOT / "csrc/cpu/cpu_features.cpp"))
    exe = build_harness(tmp_path, "fastcode_sanitize", sources, opt="-O0")
    run = subprocess.run([str(exe), "1500"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "corrupt" in run.stdout


def test_avx512_group_decoder_matches_the_layout(tmp_path):
    """The AVX-512 group decoder against groups packed from the documented layout, under
    ASan + UBSan (tests/native/fastcode_avx512_check.cpp); machines without AVX-512 run it
    emulated in test_shuffle_avx512_emulated.py."""
    import subprocess

    from native_build import ROOT, build_harness

    sources = [str(ROOT / "csrc/entropy/fastcode_avx512.cpp"), str(ROOT / "csrc/cpu/cpu_features.cpp"),
               str(ROOT / "csrc/checksum/xxh3_stripes.cpp")]
    exe = build_harness(tmp_path, "fastcode_avx512_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith("ok:")


@pytest.mark.parametrize("w", [1, 2, 3])
def test_escape_count_checked_on_dense_escapes(variant, w):
    # many escapes: the AVX2 decoder patches in the same pass as it decodes
    x = skewed(256 * 40 + 9, seed=3)
    s = encode_any(x, w)
    nexc, table = stream_head(s, w)
    assert nexc * 64 >= len(x)
    table = set(table)
    first_group = len(s) - (len(x) // 256) * 32 * w - ((len(x) % 256) * w + 7) // 8
    for group, b in ((0, 0), (20, 5), (39, 31)):
        at = [first_group + 32 * w * group + 32 * j + b for j in range(w)]  # byte b of every vector
        escaped = sum(int(x[256 * group + 32 * i + b]) not in table for i in range(8))
        for value, after in ((0x00, 0), (0xFF, 8)):  # the 8 symbols there: no escapes / all
            if escaped == after:
                continue
            bad = bytearray(s)
            for a in at:
                bad[a] = value
            with pytest.raises(kvcore.CorruptFrameError):
                N.fastcode_decode(bytes(bad), len(x))

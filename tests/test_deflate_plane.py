"""The deflate plane method (csrc/deflate/): format, interoperability, strict decoding.

Payloads kvcore writes are read piece by piece with ISA-L (python isal), zlib
and libdeflate; raw DEFLATE written by those libraries is read by kvcore.
"""

import ctypes
import ctypes.util
import random
import struct
import subprocess
import zlib

import numpy as np
import pytest
from isal import isal_zlib

import kvcore
from kvcore import _native
import frame_layout
from native_build import build_harness, codec_sources

PIECE = 64 * 1024


def parse(payload: bytes) -> list[tuple[int, int, bytes]]:
    """(original size, compressed size, piece bytes) per piece, per docs/FORMAT.md."""
    (count,) = struct.unpack_from("<I", payload, 0)
    table = [struct.unpack_from("<II", payload, 4 + 8 * i) for i in range(count)]
    pos, out = 4 + 8 * count, []
    for orig, comp in table:
        out.append((orig, comp, payload[pos : pos + comp]))
        pos += comp
    assert pos == len(payload)
    return out


def build(pieces: list[tuple[int, bytes]]) -> bytes:
    head = struct.pack("<I", len(pieces)) + b"".join(struct.pack("<II", o, len(c)) for o, c in pieces)
    return head + b"".join(c for _o, c in pieces)


class LibDeflate:
    """libdeflate's raw DEFLATE decompressor through ctypes (libdeflate.so.0, libdeflate-dev)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("deflate") or "libdeflate.so.0"
        self.lib = ctypes.CDLL(name)
        self.lib.libdeflate_alloc_decompressor.restype = ctypes.c_void_p
        self.lib.libdeflate_deflate_decompress_ex.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
        ]
        self.lib.libdeflate_free_decompressor.argtypes = [ctypes.c_void_p]
        self.lib.libdeflate_alloc_compressor.restype = ctypes.c_void_p
        self.lib.libdeflate_alloc_compressor.argtypes = [ctypes.c_int]
        self.lib.libdeflate_deflate_compress.restype = ctypes.c_size_t
        self.lib.libdeflate_deflate_compress.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
        ]
        self.lib.libdeflate_free_compressor.argtypes = [ctypes.c_void_p]

    def decompress(self, data: bytes, n: int) -> bytes:
        d = self.lib.libdeflate_alloc_decompressor()
        try:
            out = ctypes.create_string_buffer(max(n, 1))
            in_used, out_used = ctypes.c_size_t(), ctypes.c_size_t()
            rc = self.lib.libdeflate_deflate_decompress_ex(
                d, data, len(data), out, n, ctypes.byref(in_used), ctypes.byref(out_used)
            )
            assert rc == 0, f"libdeflate result {rc}"
            assert in_used.value == len(data), "libdeflate: piece has bytes after its final block"
            return out.raw[: out_used.value]
        finally:
            self.lib.libdeflate_free_decompressor(d)

    def compress(self, data: bytes, level: int) -> bytes:
        c = self.lib.libdeflate_alloc_compressor(level)
        try:
            cap = len(data) + len(data) // 8 + 64
            out = ctypes.create_string_buffer(cap)
            n = self.lib.libdeflate_deflate_compress(c, data, len(data), out, cap)
            assert n > 0
            return out.raw[:n]
        finally:
            self.lib.libdeflate_free_compressor(c)


@pytest.fixture(scope="module")
def libdeflate() -> LibDeflate:
    try:
        return LibDeflate()
    except OSError:
        pytest.skip("libdeflate.so.0 not installed (Debian package libdeflate-dev)")


@pytest.fixture(autouse=True)
def software_only():
    """These tests are about the format: no QATzip library takes part."""
    kvcore.qat.unload()
    yield


def sample(n: int, seed: int = 0) -> bytes:
    """Bytes like a bf16 exponent plane: few distinct values, some runs, some noise."""
    rng = np.random.default_rng(seed)
    exps = rng.choice(np.arange(116, 128, dtype=np.uint8), size=n, p=np.linspace(1, 12, 12) / 78)
    if n > 1000:
        exps[n // 3 : n // 3 + 500] = 0
    return exps.tobytes()


def zlib_raw_decompress(piece: bytes) -> bytes:
    d = zlib.decompressobj(wbits=-15)
    out = d.decompress(piece)
    assert d.eof and d.unused_data == b"", "zlib: piece is not exactly one complete DEFLATE stream"
    return out


SIZES = [0, 1, 127, 128, 1000, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 5]


@pytest.mark.parametrize("n", SIZES)
def test_round_trip_and_piece_table(n):
    data = sample(n, seed=n)
    payload = _native.deflate_plane_encode(data, backend="software")
    assert len(payload) <= _native.deflate_plane_bound(n)
    pieces = parse(payload)
    assert len(pieces) == -(-n // PIECE)
    assert [o for o, _c, _p in pieces] == [min(PIECE, n - i) for i in range(0, n, PIECE)]
    assert _native.deflate_plane_decode(payload, n) == data


@pytest.mark.parametrize("level", [0, 1, 2, 6, 9])
def test_every_level_decodes_with_isal_zlib_and_libdeflate(level, libdeflate):
    n = 2 * PIECE + 333
    data = sample(n, seed=level)
    payload = _native.deflate_plane_encode(data, backend="software", level=level)
    pieces = parse(payload)
    assert b"".join(isal_zlib.decompress(p, wbits=-15) for _o, _c, p in pieces) == data
    assert b"".join(zlib_raw_decompress(p) for _o, _c, p in pieces) == data
    assert b"".join(libdeflate.decompress(p, o) for o, _c, p in pieces) == data
    assert _native.deflate_plane_decode(payload, n) == data


def test_pieces_decode_independently():
    n = 4 * PIECE
    data = sample(n, seed=7)
    pieces = parse(_native.deflate_plane_encode(data, backend="software"))
    # decode only the third piece, alone
    o, _c, p = pieces[2]
    assert zlib_raw_decompress(p) == data[2 * PIECE : 3 * PIECE]


def test_incompressible_input_stays_within_bound(libdeflate):
    n = 3 * PIECE + 17
    data = random.Random(1).randbytes(n)
    payload = _native.deflate_plane_encode(data, backend="software", level=9)
    assert len(payload) <= _native.deflate_plane_bound(n)
    # 4 pieces: table 4 + 8 * 4 bytes; stored blocks: 5 bytes per 65535 bytes of a piece
    assert _native.deflate_plane_bound(n) == n + 4 + 8 * 4 + 3 * 10 + 5
    assert b"".join(libdeflate.decompress(p, o) for o, _c, p in parse(payload)) == data
    assert _native.deflate_plane_decode(payload, n) == data


@pytest.mark.parametrize("maker", ["zlib1", "zlib6", "zlib9", "zlib_fixed", "zlib_stored", "isal", "libdeflate"])
def test_foreign_raw_deflate_decodes_in_kvcore(maker, libdeflate):
    n = 3 * PIECE + 999
    data = sample(n, seed=3)
    chunks = [data[i : i + PIECE] for i in range(0, n, PIECE)]

    def make(chunk: bytes) -> bytes:
        if maker.startswith("zlib"):
            level = {"zlib1": 1, "zlib6": 6, "zlib9": 9, "zlib_fixed": 6, "zlib_stored": 0}[maker]
            strategy = zlib.Z_FIXED if maker == "zlib_fixed" else zlib.Z_DEFAULT_STRATEGY
            c = zlib.compressobj(level, zlib.DEFLATED, -15, 9, strategy)
            return c.compress(chunk) + c.flush()
        if maker == "isal":
            return isal_zlib.compress(chunk, 1, wbits=-15)
        return libdeflate.compress(chunk, 6)

    payload = build([(len(c), make(c)) for c in chunks])
    assert _native.deflate_plane_decode(payload, n) == data
    assert _native.deflate_plane_decode(payload, n, threads=2) == data


def test_pieces_up_to_the_largest_hardware_buffer_are_read():
    big = sample(512 * 1024, seed=9)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    payload = build([(len(big), c.compress(big) + c.flush())])
    assert _native.deflate_plane_decode(payload, len(big)) == big
    over = big + b"x"
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    with pytest.raises(kvcore.CorruptFrameError):
        _native.deflate_plane_decode(build([(len(over), c.compress(over) + c.flush())]), len(over))


def test_parallel_encode_equals_serial():
    data = sample(9 * PIECE + 11, seed=5)
    a = _native.deflate_plane_encode(data, backend="software", threads=1)
    b = _native.deflate_plane_encode(data, backend="software", threads=None)
    assert a == b
    assert _native.deflate_plane_decode(a, len(data), threads=None) == data


def test_real_kv_planes(kvdata_dir, libdeflate):
    import torch
    from safetensors.torch import load_file

    t = load_file(str(kvdata_dir / "minilm_l6_kv_bf16.safetensors"))["layer2.k"]
    raw = t.contiguous().view(torch.uint8).numpy().reshape(-1, 2)
    for plane in (raw[:, 1].tobytes(), raw[:, 0].tobytes()):  # exponent-carrying high byte, low byte
        payload = _native.deflate_plane_encode(plane, backend="software", level=1)
        assert _native.deflate_plane_decode(payload, len(plane)) == plane
        assert b"".join(libdeflate.decompress(p, o) for o, _c, p in parse(payload)) == plane
    high = raw[:, 1].tobytes()
    assert len(_native.deflate_plane_encode(high, backend="software")) < 0.5 * len(high)


# ---- strict decoding: corrupt payloads raise CorruptFrameError, never crash ----


def deflate_payload(n: int = 2 * PIECE + 100, seed: int = 11) -> tuple[bytes, bytes]:
    data = sample(n, seed=seed)
    return data, _native.deflate_plane_encode(data, backend="software", level=6)


def test_truncation_is_corrupt():
    data, payload = deflate_payload()
    cuts = sorted(set(range(0, 40)) | set(random.Random(2).sample(range(len(payload)), 60)))
    for cut in cuts:
        with pytest.raises(kvcore.CorruptFrameError):
            _native.deflate_plane_decode(payload[:cut], len(data))


def test_table_edits_are_corrupt():
    data, payload = deflate_payload()
    n = len(data)
    count = struct.unpack_from("<I", payload)[0]

    def edit(offset: int, value: int) -> bytes:
        b = bytearray(payload)
        struct.pack_into("<I", b, offset, value)
        return bytes(b)

    bad = [
        edit(0, count + 1), edit(0, count - 1), edit(0, 0), edit(0, 0xFFFFFFFF),
        edit(4, 0), edit(4, PIECE + 1), edit(4, PIECE - 1), edit(4, 0xFFFFFFFF),
        edit(8, 0), edit(8, struct.unpack_from("<I", payload, 8)[0] + 1),
        edit(8, struct.unpack_from("<I", payload, 8)[0] - 1), edit(8, 0xFFFFFFFF),
        payload + b"\x00",
    ]
    for b in bad:
        with pytest.raises(kvcore.CorruptFrameError):
            _native.deflate_plane_decode(b, n)
    for wrong_n in (0, n - 1, n + 1):
        with pytest.raises(kvcore.CorruptFrameError):
            _native.deflate_plane_decode(payload, wrong_n)


def test_piece_must_end_exactly_and_be_final():
    data = sample(5000, seed=4)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    good = c.compress(data) + c.flush()
    assert _native.deflate_plane_decode(build([(len(data), good)]), len(data)) == data
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    not_final = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)  # no final block
    cases = [
        build([(len(data), good + b"\x00")]),        # bytes after the final block
        build([(len(data), not_final)]),              # stream never ends
        build([(len(data) - 1, good)]),               # decodes to more than claimed
        build([(len(data) + 1, good)]),               # decodes to less than claimed
    ]
    sizes = [len(data), len(data), len(data) - 1, len(data) + 1]
    for payload, n in zip(cases, sizes):
        with pytest.raises(kvcore.CorruptFrameError):
            _native.deflate_plane_decode(payload, n)


def test_bit_flips_never_crash():
    data, payload = deflate_payload(n=PIECE + 500, seed=12)
    rng = random.Random(3)
    raised = 0
    trials = 400
    for _ in range(trials):
        b = bytearray(payload)
        pos = rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        try:
            out = _native.deflate_plane_decode(bytes(b), len(data))
        except kvcore.CorruptFrameError:
            raised += 1
        else:
            # DEFLATE has no checksum of its own: the frame's checksum catches the rest.
            assert len(out) == len(data)
    # About a quarter of single-bit flips make invalid DEFLATE; the others decode to
    # wrong bytes of the right length, which the frame's checksum rejects.
    assert raised > trials // 10


def test_bad_arguments():
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.deflate_plane_encode(b"abc", backend="gpu")
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.deflate_plane_encode(b"abc", level=10)
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.deflate_plane_decode(b"\x00" * 4, -1)


def test_qat_backend_without_qatzip_is_unsupported():
    with pytest.raises(kvcore.UnsupportedError):
        _native.deflate_plane_encode(sample(1000), backend="qat")
    # auto works everywhere
    data = sample(3 * PIECE, seed=1)
    payload, report = _native.deflate_plane_encode_report(data, backend="auto")
    assert report["software_pieces"] + report["stored_pieces"] == report["pieces"] == 3
    assert _native.deflate_plane_decode(payload, len(data)) == data


@pytest.mark.parametrize("threads", [1, None])
def test_output_capacity_below_the_bound(threads):
    data = sample(5 * PIECE + 3, seed=21)
    payload = _native.deflate_plane_encode(data, backend="software", threads=threads)
    again = _native.deflate_plane_encode(data, backend="software", threads=threads, max_bytes=len(payload))
    assert frame_layout.same_payloads(again, payload)
    with pytest.raises(kvcore.BufferTooSmallError):
        _native.deflate_plane_encode(data, backend="software", threads=threads, max_bytes=len(payload) - 1)
    with pytest.raises(kvcore.BufferTooSmallError):
        _native.deflate_plane_encode(data, backend="software", threads=threads, max_bytes=0)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=1 << 20))
def test_arbitrary_bytes_never_crash(payload, n):
    try:
        out = _native.deflate_plane_decode(payload, n)
    except kvcore.CorruptFrameError:
        return
    assert len(out) == n


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=2000), st.data())
def test_valid_table_random_pieces_never_crash(piece, data):
    orig = data.draw(st.integers(min_value=1, max_value=PIECE))
    payload = build([(orig, piece)])
    try:
        out = _native.deflate_plane_decode(payload, orig)
    except kvcore.CorruptFrameError:
        return
    assert len(out) == orig


def test_encoding_does_not_depend_on_stack_contents(tmp_path):
    # ISA-L's stateless init leaves the match-window size unset; built with ASan and
    # UBSan, the harness fills the stack with each window size before encoding.
    exe = build_harness(tmp_path, "deflate_window_check", codec_sources())
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok:")

"""The deflate plane method (id 4) inside kvcore frames: kvcore.compress(..., backend=...).

Frames whose planes are raw DEFLATE round-trip; their DEFLATE pieces decode with
zlib; a frame whose pieces were re-made by zlib still decodes in kvcore; frames
written through QAT (the QATzip test double) decode without QAT; corruption is
always caught (the frame checksums).
"""

import random
import struct
import zlib

import pytest
import torch
import xxhash

import kvcore
import kvdata
from frame_layout import DEFLATE, block_planes, deflate_pieces, header_length
from qat_double import double, double_path  # noqa: F401  (fixtures)


def rebuild_with_zlib(frame: bytes, level: int) -> bytes:
    """The same frame with every DEFLATE piece re-made by zlib (sizes and checksums updated)."""
    h = header_length(frame)
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    table = h - 4 - 4 * n_blocks
    blocks: list[bytearray] = [bytearray() for _ in range(n_blocks)]
    starts = {}
    for b, off, method, payload in block_planes(frame):
        if b not in starts:
            starts[b] = off - 8
            blocks[b] += frame[off - 8 : off]  # the block checksum
        if method == DEFLATE:
            new = []
            for orig, piece in deflate_pieces(payload):
                data = zlib.decompress(piece, -15)
                assert len(data) == orig
                c = zlib.compressobj(level, zlib.DEFLATED, -15)
                new.append((orig, c.compress(data) + c.flush()))
            payload = struct.pack("<I", len(new)) + b"".join(struct.pack("<II", o, len(p)) for o, p in new)
            payload += b"".join(p for _o, p in new)
        blocks[b] += bytes([method]) + struct.pack("<I", len(payload)) + payload
    head = bytearray(frame[:table]) + b"".join(struct.pack("<I", len(b)) for b in blocks)
    head += struct.pack("<I", xxhash.xxh3_64_intdigest(bytes(head)) & 0xFFFFFFFF)
    return bytes(head) + b"".join(bytes(b) for b in blocks)


@pytest.fixture(autouse=True)
def no_qat():
    kvcore.qat.unload()
    yield
    kvcore.qat.unload()


def kv_tensor(name="minilm_l6_kv_bf16.safetensors", key="layer3.v") -> torch.Tensor:
    """One tensor of a ../shared/kvdata file (the test is skipped where the file is missing)."""
    return kvdata.tensors(name)[key]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("name", ["minilm_l6_kv_bf16.safetensors", "stories260k_text_kv_fp16.safetensors"])
def test_real_kv_round_trip_and_pieces_decode_with_zlib(name):
    t = kv_tensor(name, "layer1.k")
    frame = kvcore.compress(t, backend="software")
    assert same(kvcore.decompress(frame), t)
    info = kvcore.frame_info(frame)
    assert info["methods"]["deflate"]["planes"] >= 1
    n_deflate = 0
    for _b, _off, method, payload in block_planes(frame):
        if method == DEFLATE:
            n_deflate += 1
            for orig, piece in deflate_pieces(payload):
                assert len(zlib.decompress(piece, -15)) == orig
    assert n_deflate == info["methods"]["deflate"]["planes"]
    assert len(frame) < t.numel() * t.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float8_e4m3fn, torch.uint8])
@pytest.mark.parametrize("numel", [1, 777, 300_001])
def test_dtypes_and_sizes(dtype, numel):
    g = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=g) * 3).to(dtype) if dtype != torch.uint8 else \
        torch.randint(0, 8, (numel,), generator=g, dtype=torch.uint8)
    for backend in ("software", "auto"):
        assert same(kvcore.decompress(kvcore.compress(x, backend=backend)), x)


def test_zlib_made_pieces_decode_in_a_frame():
    t = kv_tensor()
    frame = kvcore.compress(t, backend="software", block_bytes=128 << 10)
    for level in (1, 9):
        remade = rebuild_with_zlib(frame, level)
        assert remade != frame
        assert same(kvcore.decompress(remade), t)


def test_backend_argument():
    x = torch.randn(64, 8).to(torch.bfloat16)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(x, backend="gpu")
    with pytest.raises(kvcore.UnsupportedError):
        kvcore.compress(x, backend="qat")


def test_qat_written_frame_decodes_without_qat(double):  # noqa: F811
    t = kv_tensor()
    kvcore.qat.reset_counters()
    frame = kvcore.compress(t, backend="qat")
    c = kvcore.qat.status()["counters"]
    assert c["hw_compress_calls"] > 0 and c["hw_bytes_in"] > 0
    kvcore.qat.unload()
    assert same(kvcore.decompress(frame), t)
    # and the software-written frame is the same kind of stream
    soft = kvcore.compress(t, backend="software")
    assert kvcore.frame_info(soft)["methods"].keys() == kvcore.frame_info(frame)["methods"].keys()


def test_compress_async_codes_on_qat_from_the_movers_threads(double):  # noqa: F811
    t = kv_tensor()
    kvcore.qat.reset_counters()
    frame = kvcore.compress_async(t, backend="qat").result(timeout=60)
    assert kvcore.qat.status()["counters"]["hw_compress_calls"] > 0
    assert frame == kvcore.compress(t, backend="qat")
    kvcore.qat.unload()
    assert same(kvcore.decompress(frame), t)


def test_every_corruption_is_caught():
    t = kv_tensor()[:512]
    frame = kvcore.compress(t, backend="software")
    rng = random.Random(5)
    for _ in range(150):
        b = bytearray(frame)
        pos = rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(b))
    for cut in rng.sample(range(len(frame)), 40):
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(frame[:cut])
    # flips inside DEFLATE payloads only (most decode to wrong bytes: the checksum catches them)
    deflate_ranges = [(off + 5, off + 5 + len(p)) for _b, off, m, p in block_planes(frame) if m == DEFLATE]
    assert deflate_ranges
    for _ in range(100):
        lo, hi = rng.choice(deflate_ranges)
        b = bytearray(frame)
        b[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(b))


def test_repeated_rows_use_deflate_on_every_plane():
    rows = torch.randn(16, 256).to(torch.bfloat16)  # mantissa bytes: high order-0 entropy
    x = rows.repeat(64, 1)                            # ... but every row repeats
    frame = kvcore.compress(x, backend="software")
    assert same(kvcore.decompress(frame), x)
    methods = kvcore.frame_info(frame)["methods"]
    assert set(methods) == {"deflate"}
    assert len(frame) < 0.1 * x.numel() * 2

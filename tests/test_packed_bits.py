"""The packed plane method (docs/FORMAT.md, method 10): a plane whose bytes differ only in a
few adjacent bits, close to uniformly (the sign byte of a float32 upcast from bfloat16 or
float16), is stored as those bits packed raw instead of Huffman coded. Checked here: the
encoder's choice on planes built to need it and on planes that must not take it, bit-exact
round trips on every SIMD variant, real KV upcast to float32, and frames with edited packed
payloads. The bit layout itself is checked against its specification by
tests/native/low_bits_check.cpp (test_low_bits.py)."""

import numpy as np
import pytest
import torch

import kvcore

import kvdata
from frame_layout import planes
from isa_variants import VARIANTS, use_variant

PACKED = 10  # plane method id


def field_plane(n: int, shift: int, width: int, base: int, seed: int) -> np.ndarray:
    """n bytes base | f << shift, f uniform over 2^width values."""
    rng = np.random.default_rng(seed)
    return (base | rng.integers(0, 1 << width, size=n) << shift).astype(np.uint8)


def packed_heads(frame: bytes) -> set[tuple[int, int, int]]:
    """(shift, width, base) of every packed plane of a frame."""
    return {tuple(frame[at:at + 3]) for method, at, _ in planes(frame) if method == PACKED}


@pytest.mark.parametrize("shift,width,base", [(0, 1, 0), (0, 1, 0x80), (6, 2, 0), (3, 2, 0x41), (2, 3, 0x03),
                                              (0, 7, 0x80), (1, 7, 0)])
@pytest.mark.parametrize("n,block_bytes", [(70001, None), (70001, 16384), (4096 * 3 + 63, 4096)])
def test_encoder_packs_uniform_fields(shift, width, base, n, block_bytes):
    x = torch.from_numpy(field_plane(n, shift, width, base, seed=shift * 100 + width + n))
    frame = kvcore.compress(x, block_bytes=block_bytes)
    assert packed_heads(frame) == {(shift, width, base)}
    assert torch.equal(kvcore.decompress(frame), x)
    blocks = -(-n // (block_bytes or n))
    assert len(frame) < n * width / 8 + blocks * 80 + 200  # the field's bits, plus headers


@pytest.mark.parametrize("n", [2, 63, 64, 65, 100, 1000])
def test_small_planes_round_trip(n):
    x = torch.from_numpy(field_plane(n, 0, 1, 0, seed=n))
    assert torch.equal(kvcore.decompress(kvcore.compress(x)), x)


@pytest.mark.parametrize("mode", ["fast", "max"])
def test_every_mode_packs(mode):
    x = torch.from_numpy(field_plane(50000, 6, 2, 0, seed=3))
    frame = kvcore.compress(x, mode=mode)
    assert packed_heads(frame) == {(6, 2, 0)}
    assert torch.equal(kvcore.decompress(frame), x)


def test_skewed_fields_stay_huffman_coded():
    """Where Huffman codes the field in fewer bits than its width, it keeps the plane."""
    rng = np.random.default_rng(7)
    skewed = rng.choice(4, size=70000, p=[0.7, 0.1, 0.1, 0.1]).astype(np.uint8) << 6
    wide = field_plane(70000, 0, 4, 0, seed=8) & 0x0F  # uniform, but wider than packing may take: 4 bits
    wide[::3] = 0  # ... and skewed: 3.5 bits of entropy
    for plane in (skewed, wide):
        frame = kvcore.compress(torch.from_numpy(plane))
        assert packed_heads(frame) == set()
        assert len(frame) < plane.size * 0.95 * (2 if plane is skewed else 4) / 8
        assert torch.equal(kvcore.decompress(frame), torch.from_numpy(plane))


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_a_near_uniform_full_field_is_packed(mode):
    """A 7-bit field estimated a little under 7 bits (6.97 here; float32's top mantissa byte
    cast from bfloat16 is such a plane) is packed: no Huffman code of it can be shorter by
    more than that, and packing decodes at memory speed."""
    rng = np.random.default_rng(12)
    weights = np.ones(128)
    weights[:32] = 1.6  # 6.966 bits of entropy
    plane = (rng.choice(128, size=200000, p=weights / weights.sum()) << 1).astype(np.uint8)
    frame = kvcore.compress(torch.from_numpy(plane), mode=mode)
    assert packed_heads(frame) == {(1, 7, 0)}
    assert torch.equal(kvcore.decompress(frame), torch.from_numpy(plane))


@pytest.mark.parametrize("where", [0, 12345, 69999])
def test_a_value_the_sample_missed_is_kept(where):
    """The estimate comes from a sample; one byte outside the sampled field makes the block
    fall back to the other methods, never lose the byte."""
    plane = field_plane(70000, 0, 1, 0, seed=9)
    plane[where] = 0x40
    x = torch.from_numpy(plane)
    for block_bytes in (None, 16384):
        frame = kvcore.compress(x, block_bytes=block_bytes)
        assert torch.equal(kvcore.decompress(frame), x)
        if block_bytes:  # the blocks without the stray byte still pack
            assert packed_heads(frame) == {(0, 1, 0)}


def test_constant_blocks_of_a_packable_plane():
    plane = field_plane(4 * 16384, 0, 1, 0, seed=10)
    plane[16384:2 * 16384] = 1  # one block holds one value
    frame = kvcore.compress(torch.from_numpy(plane), block_bytes=16384)
    assert kvcore.frame_info(frame)["methods"]["constant"]["planes"] == 1
    assert torch.equal(kvcore.decompress(frame), torch.from_numpy(plane))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_decodes_what_every_variant_wrote(variant):
    x = torch.from_numpy(field_plane(70001, 6, 2, 0x15, seed=11))
    frames = {}
    try:
        for writer in VARIANTS:
            use_variant(writer)
            frames[writer] = kvcore.compress(x, block_bytes=16384)
        use_variant(variant)
        for writer, frame in frames.items():
            assert frame == frames[VARIANTS[0]], writer  # every variant writes the same bytes
            assert torch.equal(kvcore.decompress(frame), x), writer
    finally:
        kvcore.set_disabled_isa("")


@pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")
@pytest.mark.parametrize("source", ["bf16", "fp16"])
def test_real_kv_upcast_to_float32_packs_its_sign_plane(source):
    x = kvdata.stacked(f"minilm_l6_kv_{source}.safetensors")[:, :2048].float().contiguous()
    for mode in ("dense", "fast"):
        frame = kvcore.compress(x, mode=mode)
        heads = packed_heads(frame)
        assert (0, 1, 0) in heads, mode  # the rotated sign, alone in plane 0
        if source == "fp16":
            assert (6, 2, 0) in heads, mode  # the float16 mantissa's two lowest bits
        else:
            assert (1, 7, 0) in heads, mode  # the bfloat16 mantissa's 7 bits, near-uniform
        assert kvcore.frame_info(frame)["methods"]["packed"]["planes"] >= 1
        assert torch.equal(kvcore.decompress(frame).view(torch.int32), x.view(torch.int32))


BLOCK = 8192


def edited(frame: bytes, offset: int, value) -> bytes:
    """The frame with byte `offset` of the first packed payload set to value (or value(old))."""
    out = bytearray(frame)
    at = next(at for method, at, _ in planes(frame) if method == PACKED) + offset
    out[at] = value(out[at]) if callable(value) else value
    return bytes(out)


@pytest.mark.parametrize(
    "offset,value",
    [
        (0, 7),  # shift + width > 8
        (0, lambda s: s - 1),  # another shift: other bytes
        (1, 0),  # width 0
        (1, 8),  # width 8
        (1, lambda w: w + 1),  # payload size no longer matches
        (2, 0x40),  # base with a bit on the field
        (2, lambda b: b | 0x01),  # another base: other bytes
        (3, lambda b: b ^ 0x10),  # a packed bit
    ],
)
def test_edited_packed_planes_are_detected(offset, value):
    x = torch.from_numpy(field_plane(2 * BLOCK, 6, 2, 0, seed=12))
    frame = kvcore.compress(x, block_bytes=BLOCK)
    assert packed_heads(frame) == {(6, 2, 0)}
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(edited(frame, offset, value))


def test_nonzero_padding_is_detected():
    n = BLOCK - 10  # a last group of 54 elements: 10 padding elements
    x = torch.from_numpy(field_plane(n, 0, 1, 0, seed=13))
    frame = kvcore.compress(x)
    _, at, size = next(p for p in planes(frame) if p[0] == PACKED)
    out = bytearray(frame)
    out[at + size - 1] |= 0x80  # byte 7 of the last word: element 7 * 8 + 7 = 63, padding
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(bytes(out))

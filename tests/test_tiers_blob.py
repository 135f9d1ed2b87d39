"""The chunk blob format: round trip, and damaged blobs give CorruptFrameError, never a crash."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.errors import CorruptFrameError, InvalidArgumentError
from kvcore.tiers.blob import BlobHeader, blob_total_size, decode_into, encode_chunk
from kvcore.tiers.codecs import RawCodec, make_codec
from tiers_support import load_kv

CODEC = make_codec("auto")


@pytest.fixture(scope="module")
def blob():
    kv = load_kv("stories260k_text_kv_bf16.safetensors")[:, :, :64].contiguous()  # [5, 2, 64, 4, 8]
    return kv, bytes(encode_chunk(kv, CODEC, key=b"K" * 16, index=3))


def test_round_trip_and_header(blob):
    kv, b = blob
    h = BlobHeader.parse(b, verify=True)
    assert (h.layers, h.kv, h.ntokens, h.heads, h.head_dim, h.index, h.key) == (5, 2, 64, 4, 8, 3, b"K" * 16)
    assert h.dtype == torch.bfloat16 and h.size == len(b) == blob_total_size(b[:4096])
    out = torch.zeros(5, 2, 100, 4, 8, dtype=torch.bfloat16)
    decode_into(b, h, out, CODEC, start=10)
    assert torch.equal(out[:, :, 10:74].view(torch.int16), kv.view(torch.int16))
    assert not out[:, :, :10].any() and not out[:, :, 74:].any()
    assert h.layers_per_frame == 5 and len(h.frames) == 1  # 5 x 16 KB layers: one frame
    small = bytes(encode_chunk(kv, CODEC, key=b"K" * 16, index=3, frame_bytes=2 * 2 * 64 * 4 * 8 * 2))
    hs = BlobHeader.parse(small, verify=True)
    assert hs.layers_per_frame == 2 and len(hs.frames) == 3 and hs.frame_layers(2) == (4, 5)
    out.zero_()
    decode_into(small, hs, out, CODEC, start=0, frames=range(1, 2))  # layers 2 and 3 only
    assert torch.equal(out[2:4, :, :64].view(torch.int16), kv[2:4].view(torch.int16))
    assert not out[:2].any() and not out[4:].any()
    contiguous = torch.zeros_like(kv)  # out slice contiguous: decoded in place
    decode_into(small, hs, contiguous, CODEC)
    assert torch.equal(contiguous.view(torch.int16), kv.view(torch.int16))


@pytest.mark.parametrize("codec", [CODEC, make_codec("dense"), RawCodec()])
def test_blob_into_allocated_memory_is_the_same_blob(blob, codec):
    """encode_chunk(alloc=...) (coded in a staging buffer, all frames in one call, then
    copied once) writes the very bytes of the plain blob, for several frames too."""
    kv, _ = blob
    for frame_bytes in (4 << 20, 2 * 2 * 64 * 4 * 8 * 2):
        plain = bytes(encode_chunk(kv, codec, key=b"K" * 16, index=3, frame_bytes=frame_bytes))
        got = []
        view = encode_chunk(kv, codec, key=b"K" * 16, index=3, frame_bytes=frame_bytes,
                            alloc=lambda n: got.append(bytearray(n)) or memoryview(got[-1]))
        assert view.nbytes == len(plain) and bytes(view) == plain


def test_all_dtypes_raw():
    for dtype in (torch.float16, torch.float32, torch.uint8, torch.int8, torch.float8_e4m3fn):
        kv = (torch.arange(2 * 2 * 8 * 2 * 4) % 50).reshape(2, 2, 8, 2, 4).to(dtype)
        b = encode_chunk(kv, RawCodec(), key=bytes(16), index=0)
        out = torch.zeros_like(kv)
        decode_into(b, BlobHeader.parse(b, verify=True), out, RawCodec())
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))


@pytest.mark.parametrize("kv_field", [0, 1, 3, 0xFFFF])
def test_a_blob_of_other_than_k_and_v_is_corrupt(blob, kv_field):
    """A checksum-valid blob whose header holds other than 2 tensors a layer is no chunk:
    CorruptFrameError (a miss in every tier), not the InvalidArgumentError a retrieve
    gives for an out of the wrong shape (the caller's error)."""
    from tiers_support import with_bytes

    _, b = blob
    with pytest.raises(CorruptFrameError, match="K and V"):
        BlobHeader.parse(with_bytes(b, 10, kv_field.to_bytes(2, "little")), verify=True)


def test_decode_checks_out(blob):
    kv, b = blob
    h = BlobHeader.parse(b)
    with pytest.raises(InvalidArgumentError):
        decode_into(b, h, torch.zeros(5, 2, 64, 4, 8, dtype=torch.float16), CODEC)
    with pytest.raises(InvalidArgumentError):
        decode_into(b, h, torch.zeros(5, 2, 64, 4, 9, dtype=torch.bfloat16), CODEC)
    with pytest.raises(InvalidArgumentError):
        decode_into(b, h, torch.zeros(5, 2, 64, 4, 8, dtype=torch.bfloat16), CODEC, start=1)
    with pytest.raises(InvalidArgumentError):
        encode_chunk(kv[0], CODEC, key=bytes(16), index=0)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_blobs_never_crash(blob, data):
    kv, b = blob
    damaged = bytearray(b)
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "header"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(damaged) - 1))
            damaged[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        damaged = damaged[: data.draw(st.integers(0, len(damaged) - 1))]
    elif kind == "extend":
        damaged += data.draw(st.binary(min_size=1, max_size=64))
    else:
        i = data.draw(st.integers(0, 600))
        damaged[i:i + 8] = data.draw(st.binary(min_size=8, max_size=8))
    if bytes(damaged) == b:
        return
    with pytest.raises(CorruptFrameError):
        BlobHeader.parse(bytes(damaged), verify=True)
    try:  # without the checksum: parse and decode either work or raise a kvcore error
        h = BlobHeader.parse(bytes(damaged))
        if h.raw_bytes < 1 << 24:
            out = torch.zeros(h.layers, h.kv, h.ntokens, h.heads, h.head_dim, dtype=h.dtype)
            decode_into(bytes(damaged), h, out, CODEC)
    except (CorruptFrameError, InvalidArgumentError):
        pass

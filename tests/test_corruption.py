"""Every truncated, corrupted or tampered frame raises CorruptFrameError: never a crash, a hang,
or wrong data returned silently."""

import random
import struct

import pytest
import torch

import kvcore

import frame_layout
import kvdata
from frame_layout import header_length, planes, reseal

pytestmark = pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")


def sample_frames():
    t = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[:, :600]  # [tensors, 600, 4, 8]
    tensors = kvdata.tensors("stories260k_text_kv_bf16.safetensors")
    v0, v1 = tensors["layer0.v"][:2000], tensors["layer1.v"][:4000]
    picks = torch.randint(0, 1500, (6000,), generator=torch.Generator().manual_seed(3))
    repeated = tensors["layer2.k"][:1500][picks].contiguous()  # real rows, each about 4 times
    return {
        "dense": kvcore.compress(t, block_bytes=16384),
        "fast": kvcore.compress(t, mode="fast", block_bytes=16384),
        "fp16": kvcore.compress(t.float().half(), block_bytes=16384),
        "fp32": kvcore.compress(t[:2].float(), block_bytes=16384),
        "rows": kvcore.compress(v0, block_bytes=8192),
        # distinct rows entropy coded (max mode: channel groups, which dense mode finds too small to repay)
        "rows-coded": kvcore.compress(repeated, mode="max", block_bytes=65536),
        "zstd": kvcore.compress(v1, mode="max", block_bytes=16384),  # zstd and rows planes (dense: rows only)
        "tiny": kvcore.compress(torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)),
    }


FRAMES = sample_frames() if kvdata.files() else {}


@pytest.mark.parametrize("kind", sorted(FRAMES))
def test_valid_frames_decode(kind):
    kvcore.decompress(FRAMES[kind])


@pytest.mark.parametrize("kind", sorted(FRAMES))
def test_every_truncation_is_detected(kind):
    frame = FRAMES[kind]
    lengths = range(len(frame)) if len(frame) < 400 else sorted(
        set(range(0, 300)) | set(random.Random(1).sample(range(len(frame)), 300))
    )
    for n in lengths:
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(frame[:n])


@pytest.mark.parametrize("kind", sorted(FRAMES))
def test_every_single_bit_flip_is_detected(kind):
    frame = FRAMES[kind]
    rng = random.Random(kind)
    positions = range(len(frame)) if len(frame) < 400 else [rng.randrange(len(frame)) for _ in range(400)]
    for pos in positions:
        bad = bytearray(frame)
        bad[pos] ^= 1 << rng.randrange(8)
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(bad))


def test_appended_bytes_are_detected():
    for frame in FRAMES.values():
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(frame + b"\0")


@pytest.mark.parametrize(
    "offset,fmt,value",
    [
        (4, "B", 2),  # version
        (5, "B", 5),  # dtype bf16 -> fp16 (same element size)
        (5, "B", 9),  # unknown dtype
        (6, "B", 9),  # rank above 8
        (7, "B", 0x10),  # unknown flag
        (7, "B", 0),  # layout flags dropped
        (8, "I", 1),  # block_elems
        (8, "I", 0),
        (12, "I", 0xFFFFFFFF),  # n_blocks
        (16, "Q", 1 << 62),  # n_elems
        (24, "Q", 3),  # first dimension
    ],
)
def test_edited_header_fields_with_resealed_checksum(offset, fmt, value):
    frame = bytearray(FRAMES["dense"])
    struct.pack_into("<" + fmt, frame, offset, value)
    try:
        tampered = reseal(frame)
    except struct.error:
        tampered = bytes(frame)
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(tampered)



@pytest.mark.parametrize("dims", [(0, 1 << 63, 4), (0, (1 << 64) - 1, 4), (0, 1 << 62, 1 << 62)])
def test_empty_frame_of_a_shape_no_tensor_has(dims):
    # A frame of no elements whose other dimensions reach 2**63 (TypeError from torch.empty)
    # or whose strides would (RuntimeError, reported as an OutOfMemoryError of 0 bytes).
    # No tensor has such a shape, so kvcore never writes one.
    frame = bytearray(kvcore.compress(torch.empty(0, 4, 4, dtype=torch.bfloat16)))
    struct.pack_into("<3Q", frame, 24, *dims)
    tampered = reseal(frame)
    with pytest.raises(kvcore.CorruptFrameError, match="no tensor"):
        kvcore.decompress(tampered)
    out = torch.empty(0, dtype=torch.bfloat16)
    assert kvcore.decompress(tampered, out=out) is out  # (nothing to decode into it)


ROWS = 7  # the rows plane method (docs/FORMAT.md)


def row_table(frame: bytes, at: int) -> tuple[int, int, int, int]:
    """(row_bytes, rows, copies, table size) of the rows payload at `at` (a first block's plane)."""
    row_bytes, copies = struct.unpack_from("<II", frame, at)
    n = struct.unpack_from("<I", frame, 8)[0]  # block_elems: one plane byte each
    return row_bytes, n // row_bytes, copies, frame_layout.row_table_size(frame[at:at + 8], n)


def test_rows_frames_code_their_distinct_rows_both_ways():
    inner = set()
    for kind in ("rows", "rows-coded", "zstd"):
        frame = FRAMES[kind]
        for method, at, _ in planes(frame)[:2]:  # the first block's planes
            if method == ROWS:
                inner.add(frame[at + row_table(frame, at)[3]])
    assert {0, 6} <= inner  # raw low bytes; grouped Huffman exponents


@pytest.mark.parametrize(
    "field,value",
    [
        ("row_bytes", 0),
        ("row_bytes", 7),  # does not divide the block
        ("row_bytes", 0xFFFFFFFF),
        ("copies", 0),  # the bitmap marks more
        ("copies", 0xFFFFFFFF),
        ("bitmap", 0xFF),
        ("index", 0xFF),
        ("inner", ROWS),  # nested
        ("inner", 99),
    ],
)
def test_edited_row_tables_are_detected(field, value):
    for kind in ("rows", "rows-coded"):
        frame = bytearray(FRAMES[kind])
        method, at, size = next(p for p in planes(bytes(frame))[:2] if p[0] == ROWS)
        _, rows, copies, table = row_table(bytes(frame), at)
        bitmap = at + 8
        if field == "row_bytes":
            struct.pack_into("<I", frame, at, value)
        elif field == "copies":
            struct.pack_into("<I", frame, at + 4, value)
        elif field == "bitmap":
            frame[bitmap] ^= value
        elif field == "index":
            frame[bitmap + (rows + 7) // 8 + 1] ^= value
        else:
            assert table < size
            frame[at + table] = value
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(frame))


def rows_planes_to_edit(frame: bytes, edited: str) -> list[int]:
    """Payload offsets of the first block's rows planes to edit alike: the first one, or all of
    them (a block whose planes share one row table is joined as whole element rows, and the
    edit must be caught there too)."""
    at = [at + 5 for b, at, method, _ in frame_layout.block_planes(frame) if method == ROWS and b == 0]
    if edited == "every plane":
        assert 0 in frame_layout.shared_row_blocks(frame)
        return at
    return at[:1]


# (3800 distinct rows: few repeats, and its high plane is no rows plane.)
@pytest.mark.parametrize("n_distinct, n_rows, edited", [
    *[(d, 4096, e) for d in (5, 200, 700) for e in ("one plane", "every plane")], (3800, 4096, "one plane")])
def test_row_indices_past_the_distinct_rows_are_detected(n_distinct, n_rows, edited):
    # Index widths 3, 8, 10 and 12 bits; the last plane has few repeats, the
    # others many (their rows are joined by different loops).
    g = torch.Generator().manual_seed(n_distinct)
    distinct = (torch.randn(n_distinct, 32, generator=g) * 4).to(torch.bfloat16)
    picks = torch.cat([torch.arange(n_distinct), torch.randint(0, n_distinct, (n_rows - n_distinct,), generator=g)])
    frame = bytearray(kvcore.compress(distinct[picks].contiguous(), mode="fast"))
    for at in rows_planes_to_edit(bytes(frame), edited):
        _, rows, copies, _ = row_table(bytes(frame), at)
        assert (rows, rows - copies) == (n_rows, n_distinct)
        width = (n_distinct - 1).bit_length()
        first_index = at + 8 + (rows + 7) // 8
        value = int.from_bytes(frame[first_index : first_index + 2], "little") | ((1 << width) - 1)  # >= n_distinct
        frame[first_index : first_index + 2] = value.to_bytes(2, "little")
    with pytest.raises(kvcore.CorruptFrameError, match="does not exist"):
        kvcore.decompress(bytes(frame))


@pytest.mark.parametrize("layout", ["every other row", "every 8th row", "half, then every 64th"])
def test_a_repeat_of_a_row_still_to_come_is_detected(layout):
    # A new row followed by its own repeat, with their bitmap bits swapped, decodes to the
    # same bytes (the repeat names the next new row, the new row comes one later): the
    # decoder must refuse the repeat. The layouts of repeated rows take each of the join
    # loops: row by row (every other row repeats), runs between repeats (1 in 8), and a
    # plane with both, the swapped pair among the runs.
    period = {"every other row": lambda r: 2, "every 8th row": lambda r: 8,
              "half, then every 64th": lambda r: 2 if r < 2048 else 64}[layout]
    repeats = [r % period(r) == period(r) - 1 for r in range(4096)]  # each repeats the row before
    g = torch.Generator().manual_seed(len(layout))
    distinct = (torch.randn(4096 - sum(repeats), 32, generator=g) * 4).to(torch.bfloat16)
    picks, fresh = [], 0
    for again in repeats:
        picks.append(fresh - 1 if again else fresh)
        fresh += not again
    x = distinct[torch.tensor(picks)].reshape(4096, 4, 8).contiguous()  # rows of 32 channels
    pair = max(r for r in range(3 * 64) if repeats[r + 1] and not repeats[r]) if layout != "half, then every 64th" \
        else 2048 + 3 * 64 - 2  # a new row, then its repeat
    for mode in ("dense", "fast"):
        frame = bytearray(kvcore.compress(x, mode=mode, block_bytes=x.numel() * 2))  # one block
        for edited in ["one plane"] + (["every plane"] if layout == "every other row" else []):
            tampered = bytearray(frame)
            for at in rows_planes_to_edit(bytes(frame), edited):
                _, rows, copies, _ = row_table(bytes(frame), at)
                assert (rows, copies) == (4096, sum(repeats))
                byte, bit = at + 8 + pair // 8, pair % 8
                assert (tampered[byte] >> bit) & 3 == 0b10
                tampered[byte] ^= 0b11 << bit
            with pytest.raises(kvcore.CorruptFrameError, match="no earlier row"):
                kvcore.decompress(bytes(tampered))


def test_swapped_blocks_are_detected():
    frame = FRAMES["fp32"]
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    h = header_length(frame)
    table = h - 4 - 4 * n_blocks
    sizes = struct.unpack_from(f"<{n_blocks}I", frame, table)
    assert n_blocks >= 2
    blocks, pos = [], h
    for s in sizes:
        blocks.append(frame[pos : pos + s])
        pos += s
    swapped = bytearray(frame[:h])
    struct.pack_into("<2I", swapped, table, sizes[1], sizes[0])
    swapped = reseal(swapped) + blocks[1] + blocks[0] + b"".join(blocks[2:])
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(swapped)


def test_garbage_and_empty_input():
    rng = random.Random(5)
    for n in (0, 1, 3, 4, 23, 24, 100, 5000):
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(rng.randrange(256) for _ in range(n)))
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.frame_info(b"KVCF" + bytes(40))


def test_corrupt_frame_is_a_kvcore_error():
    assert issubclass(kvcore.CorruptFrameError, kvcore.KVCoreError)

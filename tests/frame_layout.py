"""Walks the frame format of docs/FORMAT.md, for tests that edit or compare frames."""

import struct
import zlib
from typing import Optional

import xxhash


def header_length(frame: bytes) -> int:
    ndim = frame[6]
    period = struct.unpack_from("<I", frame, 24 + 8 * ndim)[0]
    residual = period if frame[7] & 2 else 0
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    return 24 + 8 * ndim + 4 + residual + 4 * n_blocks + 4


def block_planes(frame: bytes) -> list[tuple[int, int, int, bytes]]:
    """(block index, offset of the plane's method byte, method, payload) of every plane,
    in frame order."""
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    h = header_length(frame)
    sizes = struct.unpack_from(f"<{n_blocks}I", frame, h - 4 - 4 * n_blocks)
    out, pos = [], h
    for b, size in enumerate(sizes):
        at, end = pos + 8, pos + size
        while at < end:
            method, payload = frame[at], struct.unpack_from("<I", frame, at + 1)[0]
            out.append((b, at, method, bytes(frame[at + 5:at + 5 + payload])))
            at += 5 + payload
        assert at == end
        pos = end
    assert pos == len(frame)
    return out


def planes(frame: bytes) -> list[tuple[int, int, int]]:
    """(method, payload offset, payload size) of every plane, in frame order."""
    return [(method, at + 5, len(payload)) for _b, at, method, payload in block_planes(frame)]


def deflate_pieces(payload: bytes) -> list[tuple[int, bytes]]:
    """(original size, raw DEFLATE piece) of each piece of a deflate plane's payload."""
    (count,) = struct.unpack_from("<I", payload)
    table = [struct.unpack_from("<II", payload, 4 + 8 * i) for i in range(count)]
    pos, out = 4 + 8 * count, []
    for orig, comp in table:
        out.append((orig, payload[pos:pos + comp]))
        pos += comp
    assert pos == len(payload)
    return out


DEFLATE = 4  # the plane method of raw DEFLATE pieces


def same_payloads(a: bytes, b: bytes) -> bool:
    """Whether two deflate-plane payloads hold the same pieces, each compared by what it decodes to.

    ISA-L has coded one 64 KiB piece two ways within one process (two valid streams,
    the same length or a byte apart; docs/QAT.md), so DEFLATE
    output of two calls is compared by content, and everything around it byte for byte.
    """
    pa, pb = deflate_pieces(a), deflate_pieces(b)
    return len(pa) == len(pb) and all(
        na == nb and (ca == cb or zlib.decompress(ca, -15) == zlib.decompress(cb, -15))
        for (na, ca), (nb, cb) in zip(pa, pb))


def same_frame(a: bytes, b: bytes) -> bool:
    """Whether frames a and b are the same, DEFLATE planes compared by content (same_payloads):
    the header up to its block sizes, every block's checksum, every plane's method, and
    every other plane's bytes must be equal."""
    a, b = bytes(a), bytes(b)
    if a == b:
        return True
    n_blocks = struct.unpack_from("<I", a, 12)[0]
    sizes_at = header_length(a) - 4 - 4 * n_blocks
    if a[:sizes_at] != b[:sizes_at]:
        return False
    pa, pb = block_planes(a), block_planes(b)
    if [(blk, m) for blk, _, m, _ in pa] != [(blk, m) for blk, _, m, _ in pb]:
        return False
    if _block_checksums(a, pa) != _block_checksums(b, pb):
        return False
    return all(same_payloads(x, y) if m == DEFLATE else x == y for (_, _, m, x), (_, _, _, y) in zip(pa, pb))


def _block_checksums(frame: bytes, planes: list[tuple[int, int, int, bytes]]) -> list[bytes]:
    # A block's 8-byte checksum (of the input it holds) sits just before its first plane.
    return [frame[at - 8:at] for k, (blk, at, _, _) in enumerate(planes) if k == 0 or planes[k - 1][0] != blk]


def reseal(frame: bytearray) -> bytes:
    """Recompute the header checksum, as a deliberate tamperer would."""
    end = header_length(bytes(frame)) - 4
    struct.pack_into("<I", frame, end, xxhash.xxh3_64_intdigest(bytes(frame[:end])) & 0xFFFFFFFF)
    return bytes(frame)


def residual(frame: bytes) -> Optional[bytes]:
    """The per-channel bytes of the RESIDUAL layout, or None when the frame has none."""
    ndim = frame[6]
    if not frame[7] & 2:
        return None
    at = 24 + 8 * ndim
    period = struct.unpack_from("<I", frame, at)[0]
    return bytes(frame[at + 4:at + 4 + period])


def row_table_size(payload: bytes, n: int) -> int:
    """Bytes of the row table that starts a rows plane's payload, for a plane of n bytes."""
    row_bytes, copies = struct.unpack_from("<II", payload)
    rows = n // row_bytes
    width = max(rows - copies - 1, 0).bit_length()
    return 8 + (rows + 7) // 8 + (copies * width + 7) // 8


def block_elems(frame: bytes, b: int) -> int:
    """Elements in block b (one byte each in every plane)."""
    per_block = struct.unpack_from("<I", frame, 8)[0]
    n_elems = struct.unpack_from("<Q", frame, 16)[0]
    return min(per_block, n_elems - b * per_block)


def row_tables(frame: bytes) -> list[tuple[int, int, bytes]]:
    """(block, copies, the table's bytes after its row length) of each rows plane."""
    tables = []
    for b, _at, method, payload in block_planes(frame):
        if method == 7:
            size = row_table_size(payload, block_elems(frame, b))
            tables.append((b, struct.unpack_from("<I", payload, 4)[0], payload[4:size]))
    return tables


def shared_row_blocks(frame: bytes) -> list[int]:
    """Indices of the blocks whose planes are all rows planes with one row table, at least
    quarter of its rows repeats (the decoder joins such a block's element rows whole)."""
    by_block: dict[int, list[tuple[int, bytes]]] = {}
    for b, _at, method, payload in block_planes(frame):
        by_block.setdefault(b, []).append((method, payload))
    shared = []
    for b, block in by_block.items():
        n = block_elems(frame, b)
        if len(block) < 2 or any(method != 7 for method, _ in block):
            continue
        tables = {payload[:row_table_size(payload, n)] for _, payload in block}
        row_bytes, copies = struct.unpack_from("<II", block[0][1])
        if len(tables) == 1 and 4 * copies >= n // row_bytes:
            shared.append(b)
    return shared

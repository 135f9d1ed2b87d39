"""Walks the frame format of docs/FORMAT.md, for tests that edit frames."""

import struct
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

"""Walks the frame format of docs/FORMAT.md, for tests that edit frames."""

import struct

import xxhash


def header_length(frame: bytes) -> int:
    ndim = frame[6]
    period = struct.unpack_from("<I", frame, 24 + 8 * ndim)[0]
    residual = period if frame[7] & 2 else 0
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    return 24 + 8 * ndim + 4 + residual + 4 * n_blocks + 4


def planes(frame: bytes) -> list[tuple[int, int, int]]:
    """(method, payload offset, payload size) of every plane, in frame order."""
    n_blocks = struct.unpack_from("<I", frame, 12)[0]
    h = header_length(frame)
    sizes = struct.unpack_from(f"<{n_blocks}I", frame, h - 4 - 4 * n_blocks)
    out, pos = [], h
    for size in sizes:
        at, end = pos + 8, pos + size
        while at < end:
            method, payload = frame[at], struct.unpack_from("<I", frame, at + 1)[0]
            out.append((method, at + 5, payload))
            at += 5 + payload
        pos = end
    return out


def reseal(frame: bytearray) -> bytes:
    """Recompute the header checksum, as a deliberate tamperer would."""
    end = header_length(bytes(frame)) - 4
    struct.pack_into("<I", frame, end, xxhash.xxh3_64_intdigest(bytes(frame[:end])) & 0xFFFFFFFF)
    return bytes(frame)

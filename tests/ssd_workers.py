"""Child-process bodies for tests/test_tiers_ssd_shared.py (run with multiprocessing spawn)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from kvcore.tiers.blob import encode_chunk
from kvcore.tiers.codecs import make_codec
from kvcore.tiers.hot_cold import HotCold, HotColdFile
from kvcore.tiers.ssd import SSDTier

RAW = make_codec("raw")


def key_of(owner: int, i: int) -> bytes:
    return bytes([owner]) + i.to_bytes(4, "little") + bytes(11)


def chunk_blob(owner: int, i: int) -> bytes:
    """A real chunk blob (raw codec: every one the same size) that says whose it is."""
    kv = torch.full((2, 2, 64, 4, 64), float(owner * 1000 + i), dtype=torch.bfloat16)
    return bytes(encode_chunk(kv, RAW, key=key_of(owner, i), index=0))


SIZE = len(chunk_blob(0, 0))


def store_many(directory: str, capacity: int, owner: int, count: int, start, results) -> None:
    """Writes count chunks of SIZE bytes (reading back an earlier one between writes) and
    reports the largest used_bytes it saw and what went wrong."""
    try:
        t = SSDTier(directory, capacity, fsync=False)
        start.wait(30)
        peak, stored = 0, 0
        for i in range(count):
            stored += t.write(key_of(owner, i), chunk_blob(owner, i), ns_tag="ns")
            peak = max(peak, t.used_bytes)
            if i >= 2:
                t.contains(key_of(1 - owner, i - 2))
        results.put((owner, peak, stored, None))
    except BaseException as exc:  # reported to the parent
        results.put((owner, 0, 0, repr(exc)))


def die_while_writing(directory: str, capacity: int, reserve: int, ready) -> None:
    """Starts a streamed write (a temporary file and a reservation), then dies without cleaning up."""
    t = SSDTier(directory, capacity, fsync=False)
    assert t.begin_write(key_of(9, 0), bytearray(reserve + 8192), ns_tag="ns", reserve=reserve) is not None
    ready.set()
    os._exit(0)


def open_and_die(directory: str, capacity: int, ready, die) -> None:
    """Opens a tier (declaring its capacity), then, when told, dies without leaving."""
    tier = SSDTier(directory, capacity, fsync=False)
    ready.set()
    die.wait(60)
    assert tier is not None  # the tier (and its owner lock) lives until here
    os._exit(0)


def pin_many(directory: str, owner: int, count: int, together, results) -> None:
    """Pins count chunks of its own in the directory's pins file, one change at a time,
    starting when every process of the barrier together is ready."""
    try:
        hot = HotColdFile(Path(directory), "ns")
        together.wait(60)
        for i in range(count):
            hot.update({key_of(owner, i): HotCold(pinned=True, priority=owner, start=256 * i, ntokens=256)})
        results.put((owner, None))
    except BaseException as exc:  # reported to the parent
        results.put((owner, repr(exc)))

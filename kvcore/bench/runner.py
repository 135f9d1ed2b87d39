"""Timing a codec on one input, and the ratio / GB/s table both benchmark front ends print.

Speeds are GB/s of ORIGINAL bytes (``original_bytes / seconds``, 1 GB = 1e9 bytes) in both
directions, so compress and decompress columns compare directly.

>>> import torch
>>> from kvcore.bench.peers import Memcpy
>>> from kvcore.bench.runner import measure, format_table
>>> r = measure(Memcpy(), torch.zeros(1024, dtype=torch.bfloat16), "zeros", repeat=2)
>>> r.ratio
1.0
>>> print(format_table([r]).splitlines()[0].split())
['data', 'dtype', 'codec', 'ratio', 'comp', 'GB/s', 'decomp', 'GB/s']
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from .data import DTYPES, dtype_name
from .peers import Codec


@dataclass
class Measurement:
    """One codec on one input."""

    data: str
    dtype: str
    codec: str
    original_bytes: int
    compressed_bytes: int
    compress_s: float  # seconds per call (best of the repeats)
    decompress_s: float
    repeat: int
    verified: bool  # decompress(compress(x)) was checked bit-exact
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.compressed_bytes / self.original_bytes if self.original_bytes else 1.0

    @property
    def compress_gbps(self) -> float:
        return gbps(self.original_bytes, self.compress_s)

    @property
    def decompress_gbps(self) -> float:
        return gbps(self.original_bytes, self.decompress_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ratio=self.ratio, compress_gbps=self.compress_gbps, decompress_gbps=self.decompress_gbps)
        return d


class VerificationError(AssertionError):
    """A codec did not give back the original bits."""


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "cpu": time.process_time,  # CPU time of the process (all threads): steadier on a busy machine
}


def _best_time(fn: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The shortest of ``repeat`` calls. A call's result is freed after the clock is read:
    freeing a peer's fresh output is not the call (kvcore's decode into out= frees nothing)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        kept = fn()
        best = min(best, clock() - t0)
        del kept
    return best


def measure(codec: Codec, data: torch.Tensor, name: str, repeat: int = 3, clock: str = "wall") -> Measurement:
    """Compress and decompress ``data`` with ``codec``; verify the round trip once, then time
    ``repeat`` calls of each direction and keep the best. ``clock``: "wall" or "cpu" (process
    CPU time, which adds up over threads).

    Raises VerificationError when the round trip is not bit-exact.
    """
    repeat = max(1, int(repeat))
    bound = codec.bind(data)
    payload = bound.compress()  # first call: also a warm-up
    result = bound.decompress(payload)
    if not bound.equal(result):
        raise VerificationError(f"{codec.name} on {name}: decompressed data differs from the input")
    size = bound.size(payload)
    extra: dict[str, Any] = {}
    if codec.kind == "kvcore":
        from .codecs import frame_summary

        extra = frame_summary(payload)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    tc = _best_time(bound.compress, repeat, CLOCKS[clock])
    td = _best_time(lambda: bound.decompress(payload), repeat, CLOCKS[clock])
    return Measurement(
        data=name,
        dtype=dtype_name(data.dtype),
        codec=codec.name,
        original_bytes=bound.original_bytes,
        compressed_bytes=size,
        compress_s=tc,
        decompress_s=td,
        repeat=repeat,
        verified=True,
        extra=extra,
    )


def _reference_rows(rows: list[Measurement], reference: str) -> dict[tuple[str, str], Measurement]:
    """(data, dtype) -> the reference's row. On 1-byte dtypes, where a byte shuffle does nothing
    and the "+shuffle" peer is not run, the same coder on the raw bytes stands in for it."""
    refs = {}
    for r in rows:
        one_byte = r.dtype in DTYPES and torch.empty(0, dtype=DTYPES[r.dtype]).element_size() == 1
        if r.codec == reference or (one_byte and r.codec == reference.removesuffix("+shuffle")):
            refs[(r.data, r.dtype)] = r
    return refs


def format_table(rows: Iterable[Measurement], reference: Optional[str] = "zstd-1+shuffle") -> str:
    """A fixed-width table: data, dtype, codec, ratio, compress GB/s, decompress GB/s, and the
    kvcore rows' speed relative to ``reference`` measured on the same data (when present; on
    fp8, where a shuffle does nothing, relative to the same coder without it)."""
    rows = list(rows)
    refs = _reference_rows(rows, reference) if reference else {}
    header = ["data", "dtype", "codec", "ratio", "comp GB/s", "decomp GB/s"]
    if refs:
        header.append(f"vs {reference} (c/d)")
    lines = []
    for r in rows:
        cells = [r.data, r.dtype, r.codec, f"{r.ratio:.4f}", f"{r.compress_gbps:.3f}", f"{r.decompress_gbps:.3f}"]
        if refs:
            ref = refs.get((r.data, r.dtype))
            if ref is not None and r.codec.startswith("kvcore"):
                cells.append(
                    f"{r.compress_gbps / ref.compress_gbps:.2f}x / {r.decompress_gbps / ref.decompress_gbps:.2f}x"
                )
            else:
                cells.append("")
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(header)]
    numeric = {3, 4, 5}

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [fmt(header), fmt(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(rows, lines):
        if prev is not None and (r.data, r.dtype) != prev:
            out.append("")
        prev = (r.data, r.dtype)
        out.append(fmt(cells))
    return "\n".join(out)

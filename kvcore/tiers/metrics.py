"""Tier metrics: per-tier counters, compression ratio and latency histograms.

>>> from kvcore.tiers.metrics import Metrics
>>> m = Metrics()
>>> m.inc("ddr", "hits")
>>> m.observe("retrieve", 0.002)
>>> m.snapshot()["tiers"]["ddr"]["hits"]
1
>>> "kvcore_tier_hits_total{tier=\\"ddr\\"} 1" in m.prometheus()
True
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import Callable, Optional

# Latency buckets in seconds (upper bounds), 10 us .. 10 s.
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

COUNTERS = ("hits", "misses", "bytes_in", "bytes_out", "stores", "evictions", "errors", "skipped",
            "corrupt", "rejected")
COUNTER_HELP = {
    "hits": "chunks found in the tier",
    "misses": "chunks looked for and not found in the tier",
    "bytes_in": "bytes written into the tier",
    "bytes_out": "bytes read out of the tier",
    "stores": "chunks written into the tier",
    "evictions": "chunks evicted or demoted out of the tier",
    "errors": "failed operations (I/O errors, timeouts, full disk)",
    "skipped": "operations skipped because the tier is unavailable (circuit open)",
    "corrupt": "corrupt or partial entries found and removed",
    "rejected": "chunks that did not fit (capacity, pinned data) or whose prefix did not",
}


class Histogram:
    """A cumulative-bucket latency histogram (Prometheus semantics)."""

    def __init__(self, buckets=LATENCY_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile q (0 when empty)."""
        if not self.count:
            return 0.0
        target = q * self.count
        acc = 0
        for i, c in enumerate(self.counts):
            acc += c
            if acc >= target:
                return self.buckets[i] if i < len(self.buckets) else float("inf")
        return float("inf")


class Metrics:
    """Thread-safe counters per tier, latency histograms per operation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTERS, 0))
        self._hist: dict[str, Histogram] = {}
        self.raw_bytes = 0  # original bytes of everything encoded
        self.encoded_bytes = 0  # their blob bytes
        self._gauges: Optional[Callable[[], dict]] = None

    def inc(self, tier: str, name: str, value: int = 1) -> None:
        with self._lock:
            self._counters[tier][name] += value

    def observe(self, op: str, seconds: float) -> None:
        with self._lock:
            h = self._hist.get(op)
            if h is None:
                h = self._hist[op] = Histogram()
            h.observe(seconds)

    def add_encoded(self, raw: int, encoded: int) -> None:
        with self._lock:
            self.raw_bytes += raw
            self.encoded_bytes += encoded

    def set_gauges(self, fn: Callable[[], dict]) -> None:
        """fn() -> {tier: {"entries": n, "bytes_used": b, "capacity_bytes": c}}."""
        self._gauges = fn

    @property
    def compression_ratio(self) -> float:
        """Encoded bytes / original bytes (1.0 before anything was stored)."""
        return self.encoded_bytes / self.raw_bytes if self.raw_bytes else 1.0

    def snapshot(self) -> dict:
        with self._lock:
            tiers = {t: dict(c) for t, c in self._counters.items()}
            lat = {op: {"count": h.count, "sum_s": h.sum, "p50_s": h.quantile(0.5), "p99_s": h.quantile(0.99)}
                   for op, h in self._hist.items()}
            raw, enc = self.raw_bytes, self.encoded_bytes
        gauges = self._gauges() if self._gauges else {}
        for tier, g in gauges.items():
            tiers.setdefault(tier, dict.fromkeys(COUNTERS, 0)).update(g)
        return {"tiers": tiers, "latency": lat, "raw_bytes": raw, "encoded_bytes": enc,
                "compression_ratio": enc / raw if raw else 1.0}

    def prometheus(self) -> str:
        """The metrics in Prometheus text exposition format."""
        with self._lock:
            counters = {t: dict(c) for t, c in self._counters.items()}
            hists = {op: (h.buckets, list(h.counts), h.sum, h.count) for op, h in self._hist.items()}
            raw, enc = self.raw_bytes, self.encoded_bytes
        gauges = self._gauges() if self._gauges else {}
        lines: list[str] = []
        for name in COUNTERS:
            lines.append(f"# HELP kvcore_tier_{name}_total {COUNTER_HELP[name]}")
            lines.append(f"# TYPE kvcore_tier_{name}_total counter")
            for tier in sorted(counters):
                lines.append(f'kvcore_tier_{name}_total{{tier="{tier}"}} {counters[tier][name]}')
        for gname, help_ in (("entries", "chunks held by the tier"), ("bytes_used", "bytes held by the tier"),
                             ("capacity_bytes", "byte capacity of the tier")):
            lines.append(f"# HELP kvcore_tier_{gname} {help_}")
            lines.append(f"# TYPE kvcore_tier_{gname} gauge")
            for tier in sorted(gauges):
                if gname in gauges[tier]:
                    lines.append(f'kvcore_tier_{gname}{{tier="{tier}"}} {gauges[tier][gname]}')
        lines.append("# HELP kvcore_compression_ratio encoded bytes / original bytes of stored chunks")
        lines.append("# TYPE kvcore_compression_ratio gauge")
        lines.append(f"kvcore_compression_ratio {enc / raw if raw else 1.0:.6f}")
        for op in sorted(hists):
            buckets, counts, total, count = hists[op]
            name = f"kvcore_{op}_seconds"
            lines.append(f"# HELP {name} latency of {op}")
            lines.append(f"# TYPE {name} histogram")
            acc = 0
            for le, c in zip(buckets, counts):
                acc += c
                lines.append(f'{name}_bucket{{le="{le:g}"}} {acc}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {count}')
            lines.append(f"{name}_sum {total:.9f}")
            lines.append(f"{name}_count {count}")
        return "\n".join(lines) + "\n"

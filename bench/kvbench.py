"""Helpers of the benchmark suite: its inputs, result rows and the summary table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from kvcore.bench.data import cast_kv, dtype_name, load_kv_file

ROOT = Path(__file__).resolve().parent.parent
KVDATA = ROOT.parent / "shared" / "kvdata"

NATIVE = ("bf16", "fp16")
DERIVED = ("fp8_e4m3", "fp8_e5m2", "fp32")  # cast from the model's fp16 file
THREADS_INPUT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class KVInput:
    """One benchmark input: a model's KV file, in one dtype."""

    model: str  # e.g. "minilm_l6_kv"
    dtype: str  # "bf16", "fp16", "fp8_e4m3", ...
    path: Path  # the file it comes from
    cast: bool  # derived by casting

    @property
    def id(self) -> str:
        return f"{self.model}-{self.dtype}"


def kv_inputs() -> list[KVInput]:
    """Every input the suite measures (empty when ../shared/kvdata is absent)."""
    out = []
    models: dict[str, dict[str, Path]] = {}
    for p in sorted(KVDATA.glob("*.safetensors")):
        stem, _, dt = p.stem.rpartition("_")
        if dt in NATIVE and stem:
            models.setdefault(stem, {})[dt] = p
    for model, files in models.items():
        for dt in NATIVE:
            if dt in files:
                out.append(KVInput(model, dt, files[dt], False))
        src = files.get("fp16") or files.get("bf16")
        for dt in DERIVED:
            out.append(KVInput(model, dt, src, True))
    return out


_tensors: dict[KVInput, torch.Tensor] = {}


def load_input(inp: KVInput) -> torch.Tensor:
    """The joined tensor of an input, loaded once per session."""
    t = _tensors.get(inp)
    if t is None:
        t = load_kv_file(inp.path, inp.dtype if inp.cast else None)
        if dtype_name(t.dtype) != inp.dtype:
            t = cast_kv(t, inp.dtype)
        _tensors[inp] = t
    return t


# ---- results and the summary table ---------------------------------------------------

@dataclass
class Row:
    data: str
    dtype: str
    codec: str
    direction: str  # "compress" / "decompress"
    original_bytes: int
    compressed_bytes: int
    mean_s: Optional[float]  # None when benchmarks are disabled

    @property
    def gbps(self) -> Optional[float]:
        return self.original_bytes / self.mean_s / 1e9 if self.mean_s else None


def record(results: list[Row], benchmark: Any, row: Row) -> None:
    """Store a finished benchmark's row (mean from pytest-benchmark's own stats)."""
    stats = getattr(benchmark, "stats", None)
    if stats is not None and not getattr(benchmark, "disabled", False):
        row.mean_s = stats.stats.mean
    results.append(row)


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary_lines(rows: list[Row]) -> list[str]:
    by: dict[tuple[str, str], dict[str, dict[str, Row]]] = {}
    threads: dict[str, Row] = {}
    for r in rows:
        if r.data == "threads-64MB":
            threads[f"{r.direction}-{r.codec}"] = r
            continue
        by.setdefault((r.data, r.dtype), {}).setdefault(r.codec, {})[r.direction] = r

    lines = ["ratio = compressed/original; GB/s of original bytes = original_bytes / mean time; 1 thread"]
    header = f"{'data':<18} {'dtype':<9} {'codec':<20} {'ratio':>7} {'comp GB/s':>10} {'decomp GB/s':>12}"
    lines += [header, "-" * len(header)]
    for (data, dtype), codecs in by.items():
        for codec, dirs in codecs.items():
            any_row = next(iter(dirs.values()))
            ratio = any_row.compressed_bytes / any_row.original_bytes
            c, d = dirs.get("compress"), dirs.get("decompress")
            lines.append(
                f"{data:<18} {dtype:<9} {codec:<20} {ratio:>7.4f} {_fmt(c.gbps if c else None):>10} "
                f"{_fmt(d.gbps if d else None):>12}"
            )
        lines.append("")

    # The issue's targets, each against a peer measured in this run.
    lines.append("targets (kvcore vs peers in this run):")

    def speed(codecs: dict[str, dict[str, Row]], codec: str, direction: str) -> Optional[float]:
        r = codecs.get(codec, {}).get(direction)
        return r.gbps if r else None

    def ratio_of(codecs: dict[str, dict[str, Row]], codec: str) -> Optional[float]:
        d = codecs.get(codec)
        if not d:
            return None
        r = next(iter(d.values()))
        return r.compressed_bytes / r.original_bytes

    def verdict(ok: Optional[bool]) -> str:
        return "n/a (not measured)" if ok is None else ("met" if ok else "NOT met")

    for (data, dtype), codecs in by.items():
        tag = f"{data} {dtype}"
        dense_r, zipnn_r = ratio_of(codecs, "kvcore-dense"), ratio_of(codecs, "zipnn")
        if dtype in NATIVE:
            ok = None if dense_r is None or zipnn_r is None else dense_r < zipnn_r
            lines.append(f"  {tag:<24} dense ratio < zipnn: {_fmt(dense_r, '.4f')} vs {_fmt(zipnn_r, '.4f')}"
                         f" -> {verdict(ok)}")
        for direction in ("compress", "decompress"):
            a, b = speed(codecs, "kvcore-dense", direction), speed(codecs, "zipnn", direction)
            if b is None and zipnn_r is None:
                continue  # zipnn does not handle this dtype
            f = a / b if a and b else None
            lines.append(f"  {tag:<24} dense {direction} >= 3x zipnn: {_fmt(f, '.2f')}x -> "
                         f"{verdict(None if f is None else f >= 3.0)}")
        a, b = speed(codecs, "kvcore-fast", "decompress"), speed(codecs, "memcpy", "decompress")
        f = a / b if a and b else None
        lines.append(f"  {tag:<24} fast decompress >= 0.5x memcpy: {_fmt(f, '.2f')}x -> "
                     f"{verdict(None if f is None else f >= 0.5)}")
    for direction in ("compress", "decompress"):
        one, two = threads.get(f"{direction}-threads=1"), threads.get(f"{direction}-threads=2")
        f = two.gbps / one.gbps if one and two and one.gbps and two.gbps else None
        lines.append(f"  {'64 MB bf16':<24} dense {direction} 2 threads >= 1.7x 1 thread: {_fmt(f, '.2f')}x -> "
                     f"{verdict(None if f is None else f >= 1.7)}")
    kv_ratios = [r.compressed_bytes / r.original_bytes for r in rows if r.codec.startswith("kvcore")]
    if kv_ratios:
        lines.append(f"  largest kvcore ratio over all inputs: {max(kv_ratios):.4f}")
    return lines



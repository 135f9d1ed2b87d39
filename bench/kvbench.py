"""Helpers of the benchmark suite: its inputs, result rows and the summary table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from kvcore.bench.data import cast_kv, dtype_name, kvdata_dir, load_kv_file

KVDATA = kvdata_dir()

NATIVE = ("bf16", "fp16")
DERIVED = ("fp8_e4m3", "fp8_e5m2", "fp32")  # cast from the model's fp16 file
THREADS_INPUT_BYTES = 64 * 1024 * 1024
QWEN_CHUNK_SHAPE = (36, 2, 256, 8, 128)  # 256 tokens of Qwen3-8B: [layers, K/V, tokens, kv_heads, head_dim]


@dataclass(frozen=True)
class KVInput:
    """One benchmark input: a model's KV file (or its first half), in one dtype."""

    model: str  # e.g. "minilm_l6_kv"
    dtype: str  # "bf16", "fp16", "fp8_e4m3", ...
    path: Path  # the file it comes from
    cast: bool  # derived by casting
    half: bool = False  # only the first half of the rows

    @property
    def data(self) -> str:
        """The name the summary shows."""
        return f"{self.model}/2" if self.half else self.model

    @property
    def id(self) -> str:
        return f"{self.data}-{self.dtype}"


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
        # The same data at half the size: a peer's speed can depend on the size alone (an
        # output above glibc's 32 MiB mmap threshold is a fresh, page-faulting mapping each call).
        if "bf16" in files:
            out.append(KVInput(model, "bf16", files["bf16"], False, half=True))
    return out


_tensors: dict[KVInput, torch.Tensor] = {}


def load_input(inp: KVInput) -> torch.Tensor:
    """The joined tensor of an input, loaded once per session."""
    t = _tensors.get(inp)
    if t is None:
        t = load_kv_file(inp.path, inp.dtype if inp.cast else None)
        if dtype_name(t.dtype) != inp.dtype:
            t = cast_kv(t, inp.dtype)
        if inp.half:
            t = t[: t.shape[0] // 2].contiguous()
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
    mean_s: Optional[float] = None  # None when benchmarks are disabled
    min_s: Optional[float] = None

    @property
    def ratio(self) -> float:
        return self.compressed_bytes / self.original_bytes

    @property
    def gbps(self) -> Optional[float]:
        """GB/s of original bytes over the mean time (the summary's speed)."""
        return self.original_bytes / self.mean_s / 1e9 if self.mean_s else None

    @property
    def best_gbps(self) -> Optional[float]:
        """Same over the fastest round (less sensitive to a busy machine)."""
        return self.original_bytes / self.min_s / 1e9 if self.min_s else None


def record(results: list[Row], benchmark: Any, row: Row) -> None:
    """Store a finished benchmark's row (times from pytest-benchmark's own stats)."""
    stats = getattr(benchmark, "stats", None)
    if stats is not None and not getattr(benchmark, "disabled", False):
        row.mean_s = stats.stats.mean
        row.min_s = stats.stats.min
    results.append(row)


@dataclass
class Paired:
    """One target measured paired: each round runs kvcore and its reference back to back (A B,
    then B A), so a change of machine load between rounds falls on both. factors[i] = the
    reference's time over kvcore's in round i (how many times faster kvcore ran)."""

    data: str
    dtype: str
    codec: str  # "kvcore-dense" / "kvcore-fast" / "kvcore-dense-avx512" / a peer
    reference: str  # "zipnn" / "memcpy"
    direction: str
    goal: Optional[float]  # None: a reference line for reading the targets, with no target of its own
    original_bytes: int
    note: str = "the machine's own scaling"  # what a line without a goal shows
    codec_s: list[float] = field(default_factory=list)
    reference_s: list[float] = field(default_factory=list)
    factors: list[float] = field(default_factory=list)

    def add(self, codec_s: float, reference_s: float) -> None:
        self.codec_s.append(codec_s)
        self.reference_s.append(reference_s)
        self.factors.append(reference_s / codec_s)

    def time_round(self, work: Callable[[], Any], reference_work: Callable[[], Any],
                   clock: Callable[[], float]) -> None:
        """One round: kvcore's call and the reference's back to back, kvcore first in even rounds
        (A B, then B A), each called twice and the second call timed, so it finds its own buffers
        warm as in a loop. The timed call's result is freed after the clock is read, as
        pytest-benchmark does: freeing a fresh output (a peer's new bytes; kvcore decodes into
        out=) is not the operation measured."""
        sides = [(work, True), (reference_work, False)]
        took = {}
        for fn, is_codec in sides if len(self.factors) % 2 == 0 else sides[::-1]:
            fn()  # untimed
            t0 = clock()
            kept = fn()
            took[is_codec] = max(clock() - t0, 1e-9)
            del kept
        self.add(took[True], took[False])

    def clear(self) -> None:
        self.codec_s.clear()
        self.reference_s.clear()
        self.factors.clear()

    @property
    def median(self) -> float:
        return statistics.median(self.factors)

    def gbps(self, seconds: list[float]) -> float:
        """GB/s of original bytes over the median time of one side."""
        return self.original_bytes / statistics.median(seconds) / 1e9


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _factor(a: Optional[Row], b: Optional[Row], best: bool = False) -> Optional[float]:
    if a is None or b is None:
        return None
    x, y = (a.best_gbps, b.best_gbps) if best else (a.gbps, b.gbps)
    return x / y if x and y else None


THREADS_DATA = "threads-64MB"
CHUNK_FRAMES_DATA = "qwen-chunk/frames"  # 72 frames of 512 KiB, one call each (test_chunk_frames), bf16 and fp16
PAGES_DATA = "qwen-chunk/pages"  # 16-token pages of 32 KiB (bf16), one call each or one batch (test_page_frames)


def summary_lines(rows: list[Row], paired: Optional[list[Paired]] = None) -> list[str]:
    """The end-of-session table and the issue's targets, met / NOT met."""
    by: dict[tuple[str, str], dict[str, dict[str, Row]]] = {}
    threads: dict[tuple[str, str], Row] = {}
    for r in rows:
        if r.data == THREADS_DATA:
            threads[(r.codec, r.direction)] = r
        else:
            by.setdefault((r.data, r.dtype), {}).setdefault(r.codec, {})[r.direction] = r

    wd = max([len("data")] + [len(d) for d, _ in by])
    lines = [
        "ratio = compressed/original; GB/s of original bytes = original_bytes / mean time "
        "(best = over the fastest round); single thread",
    ]
    wc = max([20] + [len(c) for codecs in by.values() for c in codecs])
    header = (f"{'data':<{wd}} {'dtype':<9} {'codec':<{wc}} {'ratio':>7} {'comp GB/s':>10} {'decomp GB/s':>12}"
              f" {'best comp':>10} {'best decomp':>12}")
    lines += [header, "-" * len(header)]
    for (data, dtype), codecs in by.items():
        for codec, dirs in codecs.items():
            ratio = next(iter(dirs.values())).ratio
            c, d = dirs.get("compress"), dirs.get("decompress")
            lines.append(
                f"{data:<{wd}} {dtype:<9} {codec:<{wc}} {ratio:>7.4f} {_fmt(c and c.gbps):>10} {_fmt(d and d.gbps):>12}"
                f" {_fmt(c and c.best_gbps):>10} {_fmt(d and d.best_gbps):>12}"
            )
        lines.append("")
    if threads:
        lines.append("kvcore dense on 64 MiB of real bf16 KV, by threads:")
        for (codec, direction), r in sorted(threads.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            lines.append(f"  {direction:<10} {codec:<10} ratio {r.ratio:.4f}  {_fmt(r.gbps)} GB/s  "
                         f"(best {_fmt(r.best_gbps)})")
        lines.append("")

    lines.append("targets (kvcore against peers measured in this run; factor on mean times, on best times in brackets):")

    def verdict(f: Optional[float], goal: float) -> str:
        return "n/a (not measured)" if f is None else ("met" if f >= goal else "NOT met")

    def row(codecs: dict[str, dict[str, Row]], codec: str, direction: str) -> Optional[Row]:
        return codecs.get(codec, {}).get(direction)

    wt = wd + 10
    for (data, dtype), codecs in by.items():
        tag = f"{data} {dtype}"
        zipnn = next(iter(codecs.get("zipnn", {}).values()), None)
        if dtype in NATIVE:
            for label, codec in (("dense", "kvcore-dense"), ("dense-avx512", "kvcore-dense-avx512")):
                mine = next(iter(codecs.get(codec, {}).values()), None)
                if mine is None and codec != "kvcore-dense":
                    continue
                ok = None if mine is None or zipnn is None else mine.ratio < zipnn.ratio
                lines.append(
                    f"  {tag:<{wt}} {label} ratio < zipnn: {_fmt(mine and mine.ratio, '.4f')} vs "
                    f"{_fmt(zipnn and zipnn.ratio, '.4f')} -> {'n/a (not measured)' if ok is None else ('met' if ok else 'NOT met')}"
                )
        # every dtype, fp8 included; without a zipnn row: "n/a (not measured)", not left out
        # the target holds for default frames and for decoder="avx512" ones (when measured)
        for label, codec in (("dense", "kvcore-dense"), ("dense-avx512", "kvcore-dense-avx512")):
            if codec not in codecs and codec != "kvcore-dense":
                continue
            for direction in ("compress", "decompress"):
                a, b = row(codecs, codec, direction), row(codecs, "zipnn", direction)
                f, fb = _factor(a, b), _factor(a, b, best=True)
                lines.append(f"  {tag:<{wt}} {label} {direction} >= 3x zipnn: {_fmt(f, '.2f')}x "
                             f"[{_fmt(fb, '.2f')}x] -> {verdict(f, 3.0)}")
        a, b = row(codecs, "kvcore-dense+out+layout", "compress"), row(codecs, "zipnn", "compress")
        if a is not None:
            f, fb = _factor(a, b), _factor(a, b, best=True)
            lines.append(f"  {tag:<{wt}} dense compress into out= in the layout of another chunk "
                         f"(compress(layout=)) vs zipnn: {_fmt(f, '.2f')}x [{_fmt(fb, '.2f')}x]")
        a, b = row(codecs, "kvcore-fast", "decompress"), row(codecs, "memcpy", "decompress")
        f, fb = _factor(a, b), _factor(a, b, best=True)
        lines.append(f"  {tag:<{wt}} fast decompress >= 0.5x memcpy: {_fmt(f, '.2f')}x "
                     f"[{_fmt(fb, '.2f')}x] -> {verdict(f, 0.5)}")
    for direction in ("compress", "decompress"):
        one, two = threads.get(("threads=1", direction)), threads.get(("threads=2", direction))
        f, fb = _factor(two, one), _factor(two, one, best=True)
        lines.append(f"  {'64 MiB bf16':<{wt}} dense {direction}, 2 threads >= 1.7x 1 thread: {_fmt(f, '.2f')}x "
                     f"[{_fmt(fb, '.2f')}x] -> {verdict(f, 1.7)}")
    kv_rows = [r for r in rows if r.codec.startswith("kvcore") and r.data != THREADS_DATA]
    if kv_rows:
        worst = max(kv_rows, key=lambda r: r.ratio)
        lines.append(f"  largest kvcore ratio: {worst.ratio:.4f} ({worst.codec} on {worst.data} {worst.dtype}; "
                     f"must not exceed raw + header)")
    if paired:
        lines += ["", "targets measured paired (kvcore and the reference alternating within each round; "
                      "median of the per-round factors, [min-max]):"]
        for p in paired:
            tag = f"{p.data} {p.dtype}"
            claim = f"vs {p.reference}" if p.goal is None else f">= {p.goal:g}x {p.reference}"
            outcome = f"(no target: {p.note})" if p.goal is None else f"-> {verdict(p.median, p.goal)}"
            lines.append(f"  {tag:<{wt}} {p.codec.removeprefix('kvcore-')} {p.direction} {claim}: "
                         f"{p.median:.2f}x [{min(p.factors):.2f}-{max(p.factors):.2f}] over {len(p.factors)} rounds "
                         f"({p.gbps(p.codec_s):.2f} vs {p.gbps(p.reference_s):.2f} GB/s) {outcome}")
    return lines


# The data mover's implementations besides numpy (bench/test_mover_bench.py).
KVCORE_ONE, TORCH_ONE, KVCORE_ALL = "kvcore-1thread", "torch-1thread", "kvcore-allthreads"


def mover_summary_lines(rows: list[Row]) -> list[str]:
    """The data mover's results per operation: kvcore at threads=1 against numpy, which runs on
    one thread (the pair compared, with the factor), torch at one thread beside them, and kvcore
    on all hardware threads on a line of its own, with no factor over a one-thread reference."""
    by: dict[str, dict[str, Row]] = {}
    for r in rows:
        by.setdefault(r.data, {})[r.codec] = r
    w = max([len(d) for d in by] + [4])

    def speed(r: Optional[Row]) -> str:
        return f"{_fmt(r and r.gbps, '.2f')} [{_fmt(r and r.best_gbps, '.2f')}]"

    lines = ["data mover: GB/s of bytes moved over the mean time [best round]; the pair compared is "
             "kvcore threads=1 against numpy (one thread):"]
    for op, impls in by.items():
        one, ref = impls.get(KVCORE_ONE), impls.get("numpy")
        f, fb = _factor(one, ref), _factor(one, ref, best=True)
        lines.append(f"  {op:<{w}} kvcore threads=1 {speed(one)} vs numpy {speed(ref)}: {_fmt(f, '.2f')}x "
                     f"[{_fmt(fb, '.2f')}x]; torch threads=1 {speed(impls.get(TORCH_ONE))}")
    lines.append("kvcore on all hardware threads (threads=None, its default; not compared with the one-thread "
                 "references):")
    for op, impls in by.items():
        lines.append(f"  {op:<{w}} kvcore all threads {speed(impls.get(KVCORE_ALL))}")
    return lines


def qwen_chunk(seed: int = 0, dtype: str = "bf16") -> torch.Tensor:
    """A Qwen3-8B-shaped chunk (QWEN_CHUNK_SHAPE, 38 MB) of real values from kvdata MiniLM, in
    "bf16" or "fp16" (each from its own file, both captured from the model, not cast).

    Each of a frame's 1024 channels is one MiniLM channel over 256 consecutive tokens: the 384
    channels of three consecutive MiniLM layers side by side, cut at 1024. A channel keeps its
    own statistics across tokens, as in a real KV cache, which channel-aware coding relies on
    (cutting MiniLM's rows into 1024-value rows instead, as this did until 2026-12-03, mixes
    three channels into each position and hides most of that structure).
    """
    import pytest
    from safetensors.torch import load_file

    path = KVDATA / f"minilm_l6_kv_{dtype}.safetensors"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    d = load_file(str(path))
    n_layers = len([k for k in d if k.endswith(".k")])
    n_tokens = d["layer0.k"].shape[0]
    width = d["layer0.k"][0].numel()  # channels of one MiniLM layer
    layers, _, tokens, heads, dim = QWEN_CHUNK_SHAPE
    channels = heads * dim
    out = torch.empty(QWEN_CHUNK_SHAPE, dtype=d["layer0.k"].dtype)
    for l in range(layers):
        for j, kv in enumerate("kv"):
            off = (seed * 97 + l * 37 + j * 11) % (n_tokens - tokens)
            parts = [d[f"layer{(l + q) % n_layers}.{kv}"].reshape(n_tokens, width)[off:off + tokens]
                     for q in range(-(-channels // width))]
            out[l, j] = torch.cat(parts, dim=1)[:, :channels].reshape(tokens, heads, dim)
    return out

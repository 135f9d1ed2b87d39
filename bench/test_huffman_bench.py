"""Speed of the dense entropy coder on the real bf16 exponent plane.

The plane is the 8-bit exponent of every bf16 value of
../shared/kvdata/minilm_l6_kv_bf16.safetensors (all tensors concatenated, after
rotating the sign bit to the bottom: ((v << 1) | (v >> 15)) >> 8), ~18.9 M
symbols, coded in 128 KiB pieces as the codec calls the coder. numpy.copyto of the
same pieces is measured in the same run as the reference; extra_info carries the
bytes, the compressed ratio and symbols/s relative to that copy.

Run: python -m pytest bench/test_huffman_bench.py --benchmark-only
On a shared, loaded machine add --benchmark-timer=time.thread_time (the native
work runs on the calling thread with the GIL released, so its CPU time counts).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvcore
from kvcore import _native
from kvcore.bench.data import kvdata_dir

KVDATA = kvdata_dir()
PIECE = 128 * 1024


@pytest.fixture(scope="module")
def plane_pieces() -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    path = KVDATA / "minilm_l6_kv_bf16.safetensors"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    tensors = load_file(str(path))
    v = torch.cat([t.reshape(-1) for t in tensors.values()]).view(torch.int16).numpy().view(np.uint16)
    plane = ((((v << 1) | (v >> 15)) >> 8) & 0xFF).astype(np.uint8)
    return [plane[i : i + PIECE] for i in range(0, len(plane), PIECE)]


def _copy_seconds(benchmark, pieces: list[np.ndarray], outs: list[np.ndarray]) -> float:
    """Best of 5 copies, timed with the benchmark's own timer (--benchmark-timer)."""
    timer = getattr(benchmark, "_timer", time.perf_counter)
    best = float("inf")
    for _ in range(5):
        t0 = timer()
        for p, o in zip(pieces, outs):
            np.copyto(o, p)
        best = min(best, timer() - t0)
    return best


def _best_seconds(benchmark) -> float:
    return benchmark.stats.stats.min


@pytest.fixture(params=["", "avx2"], ids=["best", "scalar"])
def isa(request):
    if request.param == "" and "avx2" not in kvcore.features()["simd_detected"]:
        pytest.skip("no AVX2/BMI2 on this machine")
    kvcore.set_disabled_isa(request.param)
    yield kvcore.isa_variant()
    kvcore.set_disabled_isa("")


def _report(benchmark, pieces, outs, streams, variant):
    n = sum(len(p) for p in pieces)
    copy_s = _copy_seconds(benchmark, pieces, outs)
    s = _best_seconds(benchmark)
    benchmark.extra_info.update(
        {
            "variant": variant,
            "symbols": n,
            "bytes_in": n,
            "bytes_compressed": sum(len(x) for x in streams),
            "ratio": sum(len(x) for x in streams) / n,
            "symbols_per_s": n / s,
            "copyto_bytes_per_s": n / copy_s,
            "speed_vs_copyto": copy_s / s,
        }
    )


def test_copyto_reference(benchmark, plane_pieces):
    outs = [np.empty_like(p) for p in plane_pieces]

    def run():
        for p, o in zip(plane_pieces, outs):
            np.copyto(o, p)

    benchmark(run)
    n = sum(len(p) for p in plane_pieces)
    benchmark.extra_info.update({"bytes": n, "bytes_per_s": n / _best_seconds(benchmark)})


def test_huffman_encode(benchmark, plane_pieces, isa):
    encode = _native.huffman_encode
    streams = benchmark(lambda: [encode(p) for p in plane_pieces])
    outs = [np.empty_like(p) for p in plane_pieces]
    _report(benchmark, plane_pieces, outs, streams, isa)


def test_huffman_decode(benchmark, plane_pieces, isa):
    streams = [_native.huffman_encode(p) for p in plane_pieces]
    outs = [np.empty_like(p) for p in plane_pieces]
    decode_into = _native.huffman_decode_into

    def run():
        for s, o in zip(streams, outs):
            decode_into(s, o)

    benchmark(run)
    for p, o in zip(plane_pieces, outs):
        assert np.array_equal(p, o)
    _report(benchmark, plane_pieces, outs, streams, isa)


def test_byte_histogram(benchmark, plane_pieces, isa):
    hist = _native.byte_histogram
    benchmark(lambda: [hist(p) for p in plane_pieces])
    n = sum(len(p) for p in plane_pieces)
    benchmark.extra_info.update({"variant": isa, "bytes": n, "bytes_per_s": n / _best_seconds(benchmark)})

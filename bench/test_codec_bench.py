"""kvcore against its peers on real KV data, single thread, plus 1 vs 2 threads on 64 MB, the
frames of one Qwen3-8B-shaped chunk coded one call each, and the issue's speed targets measured
paired (kvcore and its reference alternating within each round).

Every input x codec x direction is one benchmark in the group "<model>-<dtype> <direction>",
so pytest-benchmark's tables compare like with like. Each decompression benchmark checks once,
outside the timing, that the result is bit-exact. Rounds are few (pedantic): the whole suite
must run in minutes on a 2-core machine.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch

import kvcore

from kvbench import (CHUNK_FRAMES_DATA, PAGES_DATA, QWEN_CHUNK_SHAPE, THREADS_DATA, KVInput, Paired, Row, kv_inputs,
                     load_input, qwen_chunk, record)
from kvcore.bench.codecs import MODES, KvcoreCodec, frame_summary, kvcore_codec_available
from kvcore.bench.peers import PEER_NAMES, Bound, Codec, missing_peers, peer_codecs

# kvcore-dense-avx512: dense frames for AVX-512 VBMI2 readers (compress(decoder="avx512")).
CODECS = [f"kvcore-{m}" for m in MODES] + ["kvcore-dense-avx512"] + PEER_NAMES
INPUTS = kv_inputs()
TARGET_S = 0.6  # timed seconds per benchmark, roughly
MAX_ROUNDS = 25  # fast codecs get enough rounds that one disturbed round does not set the mean

_codecs: dict[str, Codec] = {}
_bound: dict[tuple[KVInput, str], Bound] = {}
_payloads: dict[tuple[KVInput, str], tuple[Any, float]] = {}


def get_codec(name: str) -> Codec:
    if name not in _codecs:
        if name.startswith("kvcore-"):
            why = kvcore_codec_available()
            if why:
                pytest.skip(why)
            base, *options = name.removeprefix("kvcore-").split("+")
            mode, _, decoder = base.partition("-")
            _codecs[name] = KvcoreCodec(mode, threads=1, reuse_output="out" in options, decoder=decoder or "any",
                                        reuse_layout="layout" in options)
        else:
            missing = missing_peers([name])
            if missing:
                pytest.skip(missing[name])
            (_codecs[name],) = peer_codecs(1, [name])
    return _codecs[name]


def bind(inp: KVInput, name: str) -> Bound:
    key = (inp, name)
    if key not in _bound:
        codec = get_codec(name)
        data = load_input(inp)
        why = codec.why_not(data.dtype)
        if why:
            pytest.skip(f"{name} on {inp.dtype}: {why}")
        _bound[key] = codec.bind(data)
    return _bound[key]


def first_payload(inp: KVInput, name: str) -> tuple[Any, float]:
    """One untimed compression (warm-up): the payload and how long it took."""
    key = (inp, name)
    if key not in _payloads:
        b = bind(inp, name)
        t0 = time.perf_counter()
        payload = b.compress()
        _payloads[key] = (payload, time.perf_counter() - t0)
    return _payloads[key]


def rounds_for(seconds: float) -> int:
    return max(1, min(MAX_ROUNDS, int(TARGET_S / max(seconds, 1e-6))))


def describe(benchmark: Any, inp: KVInput, name: str, direction: str, b: Bound, size: int) -> None:
    benchmark.group = f"{inp.id} {direction}"
    benchmark.extra_info.update(
        codec=name,
        data=inp.path.name,
        derived_by_cast=inp.cast,
        dtype=inp.dtype,
        original_bytes=b.original_bytes,
        compressed_bytes=size,
        ratio=round(size / b.original_bytes, 6),
    )


skip_no_data = pytest.mark.skipif(not INPUTS, reason="../shared/kvdata is not present")


@skip_no_data
@pytest.mark.parametrize("direction", ["compress", "decompress"])
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("inp", INPUTS, ids=lambda i: i.id)
def test_codec(benchmark: Any, kv_results: list, inp: KVInput, name: str, direction: str) -> None:
    """One codec, one input, one direction (compress runs before decompress for each pair)."""
    b = bind(inp, name)
    payload, t_first = first_payload(inp, name)
    size = b.size(payload)
    assert 0 < size
    describe(benchmark, inp, name, direction, b, size)
    if name.startswith("kvcore-"):
        benchmark.extra_info["frame"] = frame_summary(payload)
    if direction == "compress":
        benchmark.pedantic(b.compress, rounds=rounds_for(t_first), iterations=1)
    else:
        t0 = time.perf_counter()
        result = b.decompress(payload)
        t_first = time.perf_counter() - t0
        assert b.equal(result), f"{name} on {inp.id}: decompressed data is not bit-exact"
        del result
        benchmark.pedantic(b.decompress, args=(payload,), rounds=rounds_for(t_first), iterations=1)
        _payloads.pop((inp, name), None)  # this pair is done: free its buffers
        _bound.pop((inp, name), None)
    record(kv_results, benchmark, Row(inp.data, inp.dtype, name, direction, b.original_bytes, size))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("direction", ["compress", "decompress"])
def test_threads(
    benchmark: Any, kv_results: list, cpu_timer: bool, threads_input: Any, direction: str, threads: int
) -> None:
    if cpu_timer:
        pytest.skip("thread scaling needs a wall-clock timer (CPU time adds up over threads)")
    why = kvcore_codec_available()
    if why:
        pytest.skip(why)
    b = KvcoreCodec("dense", threads=threads).bind(threads_input)
    t0 = time.perf_counter()
    payload = b.compress()
    t_c = time.perf_counter() - t0
    size = b.size(payload)
    benchmark.group = f"threads-64MB dense {direction}"
    benchmark.extra_info.update(
        codec="kvcore-dense", threads=threads, data="64 MiB of repeated bf16 KV", dtype="bf16",
        original_bytes=b.original_bytes, compressed_bytes=size, ratio=round(size / b.original_bytes, 6),
    )
    if direction == "compress":
        benchmark.pedantic(b.compress, rounds=rounds_for(t_c), iterations=1)
    else:
        t0 = time.perf_counter()
        result = b.decompress(payload)
        t_d = time.perf_counter() - t0
        assert b.equal(result), f"threads={threads}: decompressed data is not bit-exact"
        benchmark.pedantic(b.decompress, args=(payload,), rounds=rounds_for(t_d), iterations=1)
    record(kv_results, benchmark,
           Row(THREADS_DATA, "bf16", f"threads={threads}", direction, b.original_bytes, size))


# "+out": compressed into a buffer reused per frame (out=), as the tier manager stores frames,
# instead of a new bytes object per call as from every peer. "+layout": each frame coded in the
# layout kvcore.analyze chose for the same layer's K or V in another chunk (compress(layout=)).
FRAME_CODECS = ["kvcore-dense", "kvcore-fast", "kvcore-dense+out", "kvcore-fast+out", "kvcore-dense+out+layout",
                "memcpy", "zipnn", "zstd-1+shuffle"]


def chunk_frames_of(chunk: torch.Tensor) -> list:
    return [chunk[l, j].contiguous() for l in range(QWEN_CHUNK_SHAPE[0]) for j in range(2)]


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def chunk_frames(request: Any) -> tuple[str, list, list]:
    """The dtype, the 72 [256 tokens, 8 heads, 128 dims] frames (512 KiB each) of one chunk (the
    unit a KV store codes, where a codec's fixed cost per call shows), and those of another chunk."""
    return (request.param, chunk_frames_of(qwen_chunk(dtype=request.param)),
            chunk_frames_of(qwen_chunk(seed=1, dtype=request.param)))


@pytest.mark.parametrize("direction", ["compress", "decompress"])
@pytest.mark.parametrize("name", FRAME_CODECS)
def test_chunk_frames(benchmark: Any, kv_results: list, chunk_frames: tuple[str, list], name: str,
                      direction: str) -> None:
    """One round codes every frame of the chunk, one call per frame, single thread."""
    if "+" in name and name.startswith("kvcore-") and direction == "decompress":
        pytest.skip("decodes as the codec without +out or +layout does")
    dtype, frames, earlier = chunk_frames
    codec = get_codec(name)
    if name.endswith("+layout"):
        bound = [codec.bind(frame, like=before) for frame, before in zip(frames, earlier)]
    else:
        bound = [codec.bind(frame) for frame in frames]
    time_frames(benchmark, kv_results, CHUNK_FRAMES_DATA, dtype, name, direction, bound)


# vLLM's unit of KV: a page of 16 tokens of one layer's K or V (32 KiB of bf16 for Qwen3-8B).
# "+batch": every page in one call each way (compress_many, decompress_many into outputs).
PAGE_TOKENS = 16
PAGE_LAYERS = 9  # of the chunk's 36: 288 pages a round, so that zipnn's ~0.2 ms a page fits the suite's minutes
PAGE_CODECS = ["kvcore-dense", "kvcore-fast", "kvcore-dense+out", "kvcore-dense+batch", "memcpy", "zipnn",
               "zstd-1+shuffle"]


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def page_frames(request: Any) -> tuple[str, list]:
    """The dtype and the 16-token pages of the first PAGE_LAYERS layers of one chunk."""
    chunk = qwen_chunk(dtype=request.param)
    return request.param, [chunk[l, j, t:t + PAGE_TOKENS].contiguous() for l in range(PAGE_LAYERS)
                           for j in range(2) for t in range(0, QWEN_CHUNK_SHAPE[2], PAGE_TOKENS)]


@pytest.mark.parametrize("direction", ["compress", "decompress"])
@pytest.mark.parametrize("name", PAGE_CODECS)
def test_page_frames(benchmark: Any, kv_results: list, page_frames: tuple[str, list], name: str,
                     direction: str) -> None:
    """One round codes every page, one call per page (kvcore "+batch": one call for all), single
    thread: where the fixed cost of a call and of a frame's tables and header shows."""
    if name == "kvcore-dense+out" and direction == "decompress":
        pytest.skip("decodes as kvcore-dense does")
    dtype, pages = page_frames
    if name.endswith("+batch"):
        bound = [get_codec(name.removesuffix("+batch")).bind_many(pages)]
    else:
        codec = get_codec(name)
        bound = [codec.bind(page) for page in pages]
    time_frames(benchmark, kv_results, PAGES_DATA, dtype, name, direction, bound)


def time_frames(benchmark: Any, kv_results: list, data: str, dtype: str, name: str, direction: str,
                bound: list[Bound]) -> None:
    """Times one round of coding every bound input. The round trip is checked bit-exact first
    in both directions: the "+out" / "+layout" codecs are timed compressing only, and their
    frames (another layout) are decoded nowhere else."""
    payloads = [b.compress() for b in bound]
    assert all(b.equal(b.decompress(p)) for b, p in zip(bound, payloads)), f"{name}: not bit-exact"
    original = sum(b.original_bytes for b in bound)
    size = sum(b.size(p) for b, p in zip(bound, payloads))
    benchmark.group = f"{data} {dtype} {direction}"
    benchmark.extra_info.update(codec=name, data=data, dtype=dtype, frames=len(bound),
                                original_bytes=original, compressed_bytes=size, ratio=round(size / original, 6))
    if direction == "compress":
        benchmark.pedantic(lambda: [b.compress() for b in bound], rounds=MAX_ROUNDS, iterations=1)
    else:
        benchmark.pedantic(lambda: [b.decompress(p) for b, p in zip(bound, payloads)], rounds=MAX_ROUNDS,
                           iterations=1)
    record(kv_results, benchmark, Row(data, dtype, name, direction, original, size))


# The speed targets: (kvcore codec, reference, direction, how many times the reference's
# speed kvcore must reach).
TARGETS = [("kvcore-dense", "zipnn", "compress", 3.0), ("kvcore-dense", "zipnn", "decompress", 3.0),
           ("kvcore-dense-avx512", "zipnn", "compress", 3.0), ("kvcore-dense-avx512", "zipnn", "decompress", 3.0),
           ("kvcore-fast", "memcpy", "decompress", 0.5)]
PAIRED_MIN_ROUNDS = 9


def paired_work(inp: KVInput, name: str, direction: str) -> Callable[[], Any]:
    """The zero-argument call timed for one codec on one input (decompression checked bit-exact
    once, outside the timing). Not cached: the paired tests free their buffers when done."""
    codec = get_codec(name)
    data = load_input(inp)
    why = codec.why_not(data.dtype)
    if why:
        pytest.skip(f"{name} on {inp.dtype}: {why}")
    b = codec.bind(data)
    if direction == "compress":
        return b.compress
    payload = b.compress()
    assert b.equal(b.decompress(payload)), f"{name} on {inp.id}: decompressed data is not bit-exact"
    return lambda: b.decompress(payload)


def run_paired(benchmark: Any, result: Paired, work: Callable[[], Any], reference_work: Callable[[], Any],
               clock: Callable[[], float]) -> None:
    """Times rounds of the two calls back to back, alternating which goes first, into result
    (Paired.time_round); the benchmark's own time is that of one round (both sides)."""

    def one_round() -> None:
        result.time_round(work, reference_work, clock)

    t0 = time.perf_counter()
    one_round()  # warm-up, not kept; its time sets the number of rounds
    t_round = time.perf_counter() - t0
    result.clear()
    benchmark.extra_info.update(codec=result.codec, reference=result.reference, direction=result.direction,
                                goal=result.goal)
    benchmark.pedantic(one_round, rounds=max(PAIRED_MIN_ROUNDS, rounds_for(t_round)), iterations=1)
    benchmark.extra_info.update(factors=[round(f, 4) for f in result.factors], median_factor=round(result.median, 4),
                                median_gbps={result.codec: round(result.gbps(result.codec_s), 3),
                                             result.reference: round(result.gbps(result.reference_s), 3)})


@skip_no_data
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-vs-{t[1]}-{t[2]}")
@pytest.mark.parametrize("inp", INPUTS, ids=lambda i: i.id)
def test_paired_targets(benchmark: Any, kv_paired: list, cpu_timer: bool, inp: KVInput,
                        target: tuple[str, str, str, float]) -> None:
    """One target on one input, measured paired: each round times kvcore and the reference back to
    back, in alternating order, and keeps the ratio of their times, so load that changes between
    rounds (this suite's main noise on a shared machine) cancels out of the factor; the summary
    gives the median factor. On inputs that fit in the last-level cache the other side's calls
    leave the caches cooler than a loop of one codec does (bench/README.md)."""
    codec, reference, direction, goal = target
    work = paired_work(inp, codec, direction)
    reference_work = paired_work(inp, reference, direction)
    result = Paired(inp.data, inp.dtype, codec, reference, direction, goal, load_input(inp).nbytes)
    benchmark.group = f"paired {inp.id} {direction}"
    benchmark.extra_info.update(data=inp.path.name, dtype=inp.dtype)
    run_paired(benchmark, result, work, reference_work, time.process_time if cpu_timer else time.perf_counter)
    kv_paired.append(result)


# The SIMD variants below this machine's widest (readers and writers of decoder="avx512" frames
# without AVX-512), each with the kvcore.set_disabled_isa mask that makes it the widest active one.
_MASKS = {"avx2": "avx512", "scalar": "avx512,avx2"}
NARROWER = [v for v in _MASKS if v != kvcore.isa_variant() and (v == "scalar" or v in kvcore.features()["simd_detected"])]


@skip_no_data
@pytest.mark.parametrize("direction", ["compress", "decompress"])
@pytest.mark.parametrize("variant", NARROWER)
@pytest.mark.parametrize("inp", [i for i in INPUTS if not i.cast and not i.half], ids=lambda i: i.id)
def test_paired_avx512_frames_on_narrower_cpus(benchmark: Any, kv_paired: list, cpu_timer: bool, inp: KVInput,
                                               variant: str, direction: str) -> None:
    """decoder="avx512" frames against default ones on a CPU without AVX-512 (this machine with
    the wider variants masked off), paired: what choosing them costs a reader or writer without
    AVX-512 VBMI2. No target."""
    kvcore.set_disabled_isa(_MASKS[variant])
    try:
        work = paired_work(inp, "kvcore-dense-avx512", direction)
        reference_work = paired_work(inp, "kvcore-dense", direction)
        result = Paired(inp.data, inp.dtype, f"kvcore-dense-avx512 ({variant})", f"default frames ({variant})",
                        direction, None, load_input(inp).nbytes, note=f"CPUs without AVX-512, as {variant}")
        benchmark.group = f"paired {inp.id} {direction} {variant}"
        benchmark.extra_info.update(data=inp.path.name, dtype=inp.dtype, variant=variant)
        run_paired(benchmark, result, work, reference_work, time.process_time if cpu_timer else time.perf_counter)
    finally:
        kvcore.set_disabled_isa("")
    kv_paired.append(result)


@pytest.mark.parametrize("direction, output", [("compress", "bytes"), ("compress", "out="), ("decompress", "out=")])
def test_paired_threads(benchmark: Any, kv_paired: list, cpu_timer: bool, threads_input: Any, direction: str,
                        output: str) -> None:
    """The 2-threads target (at least 1.7x the speed of 1 thread on 64 MB), measured paired.
    Compression is measured both into a new bytes object per call and into a reused buffer
    (out=): the fresh object's pages are faulted in by the coding threads, which on the 2-vCPU
    VM scaled worse than the coding itself (bench/README.md)."""
    if cpu_timer:
        pytest.skip("thread scaling needs a wall-clock timer (CPU time adds up over threads)")
    why = kvcore_codec_available()
    if why:
        pytest.skip(why)
    work = {}
    for threads in (2, 1):
        b = KvcoreCodec("dense", threads=threads, reuse_output=output == "out=").bind(threads_input)
        if direction == "compress":
            work[threads] = b.compress
        else:
            payload = b.compress()
            assert b.equal(b.decompress(payload)), f"threads={threads}: decompressed data is not bit-exact"
            work[threads] = lambda b=b, payload=payload: b.decompress(payload)
    label = f"{direction} ({output})"
    result = Paired(f"{THREADS_DATA} dense", "bf16", "threads=2", "threads=1", label, 1.7, threads_input.nbytes)
    benchmark.group = f"paired {THREADS_DATA} dense {label}"
    benchmark.extra_info.update(data="64 MiB of repeated bf16 KV", dtype="bf16")
    run_paired(benchmark, result, work[2], work[1], time.perf_counter)
    kv_paired.append(result)


def test_paired_threads_copy(benchmark: Any, kv_paired: list, cpu_timer: bool, threads_input: Any) -> None:
    """What the machine itself gives a second thread on the 64 MiB input: kvcore's CPU copy engine
    with 2 threads against 1, paired like test_paired_threads. A decode that runs near copy speed
    cannot scale beyond this; on the 2-vCPU VM a 64 MiB copy scaled 1.3-1.5x (bench/README.md)."""
    if cpu_timer:
        pytest.skip("thread scaling needs a wall-clock timer (CPU time adds up over threads)")
    import kvcore

    src = threads_input.view(-1).view(torch.uint8)
    dst = torch.empty_like(src)
    work = {n: (lambda n=n: kvcore.copy_async(dst, src, engine="cpu", threads=n).result()) for n in (2, 1)}
    result = Paired(f"{THREADS_DATA} copy", "bytes", "threads=2", "threads=1", "cpu copy engine", None, src.nbytes)
    benchmark.group = f"paired {THREADS_DATA} copy"
    benchmark.extra_info.update(data="64 MiB of repeated bf16 KV", dtype="bf16")
    run_paired(benchmark, result, work[2], work[1], time.perf_counter)
    assert torch.equal(dst, src)
    kv_paired.append(result)

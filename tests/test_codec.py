"""Round trips of kvcore.compress / kvcore.decompress: bit-exact on real KV data in every dtype,
mode and SIMD variant, on edge-case shapes and memory layouts."""

import numpy as np
import pytest
import torch

import kvcore
from kvcore.dtypes import SUPPORTED

import frame_layout
import kvdata
from isa_variants import VARIANTS, use_variant

MODES = ["dense", "fast", "max"]

pytestmark = pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, for bit-exact comparison (NaN-safe)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


METHODS = {"raw": 0, "huffman": 1, "fastcode": 2, "grouped": 6, "rows": 7, "lowbits": 8}  # docs/FORMAT.md


def assert_bit_exact(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


@pytest.fixture(params=VARIANTS)
def variant(request):
    use_variant(request.param)
    yield request.param
    kvcore.set_disabled_isa("")


@pytest.mark.parametrize("threads", [1, 2, None])
def test_decompress_many_reports_frames_in_order_as_they_complete(threads):
    """on_done(i) comes in order, once per frame, each when outs[0..i] hold their tensors
    (the layers of a real KV file, both modes, with an empty tensor among them)."""
    layers = list(kvdata.tensors("minilm_l6_kv_bf16.safetensors").values())
    xs = [t[:1024] for t in layers] + [torch.empty(0, 12, 32, dtype=torch.bfloat16)] + layers[:2]
    frames = [kvcore.compress(x, mode="fast" if i % 2 else "dense", block_bytes=1 << 16) for i, x in enumerate(xs)]
    outs = [torch.zeros_like(x) for x in xs]
    seen = []

    def on_done(i):
        assert all(torch.equal(bits(outs[k]), bits(xs[k])) for k in range(i + 1))
        seen.append(i)

    kvcore.decompress_many(frames, outs, threads=threads, on_done=on_done)
    assert seen == list(range(len(xs)))


def test_decompress_many_interrupted_in_its_last_wait_leaves_the_outs_to_the_batch(monkeypatch):
    """A second Ctrl-C, in the wait for the whole batch that follows the first, left
    decompress_many while the batch still decoded into the outs, which nothing then held:
    a caller that had dropped them freed memory still being written. The batch now holds
    them until it ends (its own release waits for it)."""
    import weakref

    from kvcore import _native

    xs = [torch.randn(1 << 16, 8).to(torch.bfloat16) for _ in range(4)]
    frames = [kvcore.compress(x) for x in xs]
    real = []

    class Interrupted:  # the native batch, with a Ctrl-C in each wait
        def __init__(self, batch):
            real.append(batch)

        def __setattr__(self, name, value):
            setattr(real[0], name, value)

        def wait(self, i):
            raise KeyboardInterrupt

        def wait_all(self):
            raise KeyboardInterrupt

    make = _native.decompress_batch_async
    monkeypatch.setattr(_native, "decompress_batch_async", lambda *a, **k: Interrupted(make(*a, **k)))
    outs = [torch.empty_like(x) for x in xs]
    with pytest.raises(KeyboardInterrupt):
        kvcore.decompress_many(frames, outs, on_done=lambda i: None)
    held = weakref.ref(outs[0])
    del outs
    assert held() is not None  # the batch holds it
    real[0].wait_all()
    for out, x in zip(real[0].outputs, xs):
        assert_bit_exact(out, x)
    real.clear()
    assert held() is None


def test_decompress_many_on_done_stops_at_a_bad_frame_or_an_exception():
    xs = [torch.full((4096, 8), float(i), dtype=torch.float16) + torch.arange(8, dtype=torch.float16)
          for i in range(6)]
    frames = [kvcore.compress(x, block_bytes=4096) for x in xs]
    outs = [torch.empty_like(x) for x in xs]
    bad = bytearray(frames[3])
    bad[len(bad) - 100] ^= 0x04
    seen = []
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress_many(frames[:3] + [bytes(bad)] + frames[4:], outs, on_done=seen.append)
    assert seen == [0, 1, 2]

    def fail_at_1(i):
        if i == 1:
            raise RuntimeError("caller failed")
        seen.append(i)

    seen.clear()
    with pytest.raises(RuntimeError, match="caller failed"):
        kvcore.decompress_many(frames, outs, on_done=fail_at_1)
    assert seen == [0]
    seen.clear()
    with pytest.raises(kvcore.InvalidArgumentError):  # checked before anything is decoded
        kvcore.decompress_many(frames[:2], [outs[0], outs[0]], on_done=seen.append)
    kvcore.decompress_many([], [], on_done=seen.append)
    assert seen == []
    kvcore.decompress_many(frames, outs, on_done=seen.append)  # nothing left running or held
    assert seen == list(range(6)) and all(torch.equal(o, x) for o, x in zip(outs, xs))


def test_a_dropped_decode_batch_finishes_before_its_frames_are_released():
    """The native batch object waits for its decode when dropped, so nothing reads the
    frames or writes the outputs after the last reference is gone."""
    from kvcore import _native
    from kvcore.runs import output_runs

    xs = [torch.randn(8192, 64).to(torch.bfloat16) for _ in range(8)]
    outs = [torch.zeros_like(x) for x in xs]
    frames = [bytearray(kvcore.compress(x)) for x in xs]
    dests = [(o.data_ptr(), o.nbytes, *output_runs(o)) for o in outs]
    batch = _native.decompress_batch_async(frames, dests)
    assert len(batch) == 8
    del batch
    for f in frames:
        f[:] = bytes(len(f))  # would corrupt a decode still running
    assert all(torch.equal(bits(o), bits(x)) for o, x in zip(outs, xs))


def real_in_dtype(name: str, dtype: torch.dtype) -> torch.Tensor:
    t = kvdata.stacked(name)
    return t if t.dtype == dtype else t.float().to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_block_checksums_of_every_length_class(variant, dtype, mode):
    """Decode checks each block's XXH3 from the merge kernel's registers (AVX-512) or by
    reading the block back: block outputs around XXH3's 240-byte short-input limit, its
    64-byte stripes and 1024-byte blocks, and the merge kernels' 128-element steps all
    decode, into contiguous and strided outputs (a wrong digest is a CorruptFrameError)."""
    src = real_in_dtype("stories260k_text_kv_fp16.safetensors", dtype).reshape(-1)
    esize = src.element_size()
    targets = [240, 241, 256, 257, 1023, 1024, 1025, 1088, 1089, 4096, 4160, 65535, 65536, 65537, 131073]
    for nbytes in targets:
        x = src[: max(1, nbytes // esize) + 1].reshape(-1, 1)
        for block_bytes in (None, 1024, 4160):
            frame = kvcore.compress(x, mode=mode, block_bytes=block_bytes)
            assert_bit_exact(kvcore.decompress(frame), x)
            wide = torch.zeros(x.shape[0], 3, dtype=dtype)
            kvcore.decompress(frame, out=wide[:, 1:2])
            assert_bit_exact(wide[:, 1:2].contiguous(), x)


@pytest.mark.parametrize("name", [p.name for p in kvdata.files()])
@pytest.mark.parametrize("mode", MODES)
def test_real_files_round_trip(name, mode):
    t = kvdata.stacked(name)
    frame = kvcore.compress(t, mode=mode)
    assert_bit_exact(kvcore.decompress(frame), t)
    assert len(frame) < t.numel() * t.element_size()


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8, torch.int8, torch.float16]
)
@pytest.mark.parametrize("mode", MODES)
def test_derived_dtypes_round_trip(dtype, mode):
    src = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[:2]
    t = src.float().to(dtype) if dtype.is_floating_point else src.view(torch.int16).to(dtype)
    assert_bit_exact(kvcore.decompress(kvcore.compress(t, mode=mode)), t)


@pytest.mark.parametrize("mode", MODES)
def test_every_variant_round_trips_real_data(variant, mode):
    for name in ("minilm_l6_kv_bf16.safetensors", "stories260k_text_kv_fp16.safetensors"):
        t = kvdata.stacked(name)[:2]
        assert_bit_exact(kvcore.decompress(kvcore.compress(t, mode=mode)), t)


@pytest.mark.parametrize("mode", MODES)
def test_frames_are_identical_across_variants_and_threads(mode):
    t = kvdata.stacked("minilm_l6_kv_bf16.safetensors")[:3]
    frames = set()
    for v in VARIANTS:
        use_variant(v)
        try:
            for threads in (1, 2):
                frames.add(kvcore.compress(t, mode=mode, threads=threads))
            # Cross-variant: what this variant wrote, every other variant reads.
            frame = kvcore.compress(t, mode=mode)
            for reader in VARIANTS:
                use_variant(reader)
                assert_bit_exact(kvcore.decompress(frame), t)
        finally:
            kvcore.set_disabled_isa("")
    assert len(frames) == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block_bytes", [None, 64 << 10])
def test_large_frames_into_new_bytes_are_those_of_one_thread(mode, block_bytes):
    """A frame of several MiB compressed by several threads into a new bytes object has its pages
    faulted in ahead of the blocks, by the size the first blocks foretell: the frame must be the
    one a single thread writes, whether that estimate is close (KV data), too low (a constant
    start, then noise) or too high (noise, then a constant end)."""
    kv = kvdata.stacked("minilm_l6_kv_bf16.safetensors")[:4]
    noise = torch.randint(-(1 << 15), 1 << 15, (kv.numel() // 2,), dtype=torch.int16,
                          generator=torch.Generator().manual_seed(5)).view(torch.bfloat16)
    constant = torch.zeros(kv.numel() // 2, dtype=torch.bfloat16)
    for t in (kv, torch.cat([constant, noise]).reshape(-1, 384), torch.cat([noise, constant]).reshape(-1, 384)):
        one = kvcore.compress(t, mode=mode, threads=1, block_bytes=block_bytes)
        assert kvcore.compress(t, mode=mode, threads=2, block_bytes=block_bytes) == one
        assert_bit_exact(kvcore.decompress(one, threads=2), t)


STREAMING_OUTPUT_BYTES = 32 << 20  # cpu::streaming_store_bytes() in csrc/cpu/cpu_features.cpp (half the LLC where less)


def offset_bytes(rows: int, channels: int) -> torch.Tensor:
    """[rows, channels] bytes, each channel a fixed offset plus small noise: coded with the
    residual transform (the 1-byte merge kernel)."""
    offsets = (torch.arange(channels) * 37) % 256
    noise = torch.randint(0, 3, (rows, channels), generator=torch.Generator().manual_seed(9))
    return ((offsets + noise) % 256).to(torch.uint8)


def large_tensor(dtype: torch.dtype) -> torch.Tensor:
    """At least STREAMING_OUTPUT_BYTES of real KV in bf16 or fp32, or of offset_bytes."""
    if dtype == torch.uint8:
        return offset_bytes(STREAMING_OUTPUT_BYTES // 384 + 1000, 384)
    t = kvdata.stacked("minilm_l6_kv_bf16.safetensors").reshape(-1, 384).float().to(dtype)
    while t.numel() * t.element_size() < STREAMING_OUTPUT_BYTES:
        t = torch.cat([t, t])
    return t


@pytest.mark.parametrize("block_bytes", [512, 1024, 1088, 2048, 2112, 8256, None])
@pytest.mark.parametrize("name", ["minilm_l6_kv_bf16.safetensors", "minilm_l6_kv_fp16.safetensors",
                                  "stories260k_text_kv_fp16.safetensors"])
def test_fast_blocks_merged_while_their_high_plane_is_decoded(variant, name, block_bytes):
    """Fast mode's 2-byte blocks of a raw low plane and a fastcode high plane are merged as the
    high plane is decoded, where AVX-512 runs (entropy::fastcode_decode_merged; other variants
    decode, then merge): blocks of 256 to 4128 elements, around a group (256), an XXH3 block of
    output (512) and the last stripe, and the default 256 KiB; the rotated layout (MiniLM bf16) and
    the plain one (stories260K fp16); one thread and two, into a new tensor and into a token range of
    a larger one (runs: decoded, then merged). A flipped bit anywhere past the header is caught."""
    t = kvdata.stacked(name)[0, :2048].reshape(2048, -1)[:, :32].contiguous()
    if block_bytes is None:
        t = kvdata.stacked(name)[:2].reshape(-1, 32).contiguous()
    kw = {} if block_bytes is None else {"block_bytes": block_bytes}
    frame = kvcore.compress(t, mode="fast", **kw)
    info = kvcore.frame_info(frame)
    assert "fastcode" in info["methods"]
    if name != "minilm_l6_kv_fp16.safetensors":  # (which takes either layout, by the slice)
        assert info["layout"]["rotate"] == name.startswith("minilm")
    for threads in (1, 2):
        assert_bit_exact(kvcore.decompress(frame, threads=threads), t)
        wide = torch.zeros(t.shape[0], 3, 32, dtype=t.dtype)
        kvcore.decompress(frame, out=wide[:, 1], threads=threads)
        assert_bit_exact(wide[:, 1], t)
        assert wide[:, 0].count_nonzero() == 0 and wide[:, 2].count_nonzero() == 0
    g = torch.Generator().manual_seed(len(frame))
    for at in torch.randint(64, len(frame), (8,), generator=g).tolist():
        damaged = bytearray(frame)
        damaged[at] ^= 1 << (at % 8)
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(bytes(damaged))


@pytest.mark.parametrize("values, escapes", [(1, 0.1), (1, 0.3), (3, 0.0), (3, 0.02), (7, 0.02), (15, 0.0),
                                             (15, 0.3), (31, 0.02), (63, 0.0), (63, 0.02), (127, 0.0), (127, 0.02)])
@pytest.mark.parametrize("consecutive", [True, False])
def test_fast_blocks_merged_while_decoded_at_every_code_width(variant, values, consecutive, escapes):
    """The merged fast decode (AVX-512 and AVX2) at every code width: high bytes drawn from
    `values` common bytes (2^w - 1 of them fill width w; consecutive ones give row-progressive
    tables at widths 5-7) plus a share of other bytes that the code escapes, low bytes random."""
    g = torch.Generator().manual_seed(values * 10 + int(escapes * 100) + consecutive)
    common = torch.arange(40, 40 + values) if consecutive else torch.randperm(256, generator=g)[:values]
    # (skewed, as exponents are: uniformly spread consecutive bytes would be packed instead)
    weights = 1.0 / torch.arange(1, values + 1, dtype=torch.float64)
    high = common[torch.multinomial(weights, 4096 * 64, replacement=True, generator=g)]
    rare = torch.rand(high.shape, generator=g) < escapes
    high[rare] = torch.randint(0, 256, (int(rare.sum()),), generator=g)
    low = torch.randint(0, 256, high.shape, generator=g)
    x = (high * 256 + low).to(torch.int16).view(torch.bfloat16).reshape(4096, 64)
    frame = kvcore.compress(x, mode="fast")
    assert "fastcode" in kvcore.frame_info(frame)["methods"]
    for threads in (1, 2):
        assert_bit_exact(kvcore.decompress(frame, threads=threads), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_outputs_of_32_mib_and_more_decode_bit_exact_with_streaming_stores(variant, dtype):
    """Outputs of 32 MiB and more are merged with non-temporal stores wherever a block's output
    is 64-byte aligned (and with cached stores elsewhere): into a new tensor, an aligned out= and a
    misaligned one, by one thread and by two, every variant must give the original bits; and a
    flipped bit must still be caught by the block checksum."""
    t = large_tensor(dtype)
    frame = kvcore.compress(t)
    assert dtype != torch.uint8 or kvcore.frame_info(frame)["layout"]["residual"]
    spare = torch.empty(t.numel() + 1, dtype=dtype)
    misaligned = spare[1:].view(t.shape)
    assert misaligned.data_ptr() % 64 != 0
    for threads in (1, 2):
        assert_bit_exact(kvcore.decompress(frame, threads=threads), t)
        for out in (torch.empty_like(t), misaligned):
            kvcore.decompress(frame, out=out, threads=threads)
            assert_bit_exact(out, t)
    damaged = bytearray(frame)
    damaged[len(frame) // 2] ^= 0x10
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(bytes(damaged))


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_frames_of_32_mib_and_more_compressed_by_two_threads_are_those_of_one(variant, mode):
    """Two threads spill nearly every block and copy it to its place once the blocks before it
    are sized; for frames that do not stay cached the copies use streaming stores (copy_bytes).
    Into a new bytes object, an aligned out= and a misaligned one, and as a compress_many batch
    of small frames, every variant must write the frames one thread writes."""
    t = large_tensor(torch.bfloat16)
    one = kvcore.compress(t, mode=mode, threads=1)
    assert len(one) >= STREAMING_OUTPUT_BYTES // 2  # past the threshold's estimate wherever the LLC sets it
    assert kvcore.compress(t, mode=mode, threads=2) == one
    spare = bytearray(kvcore.max_frame_size(t.dtype, tuple(t.shape)) + 1)
    for out in (memoryview(spare)[:-1], memoryview(spare)[1:]):
        assert bytes(kvcore.compress(t, mode=mode, threads=2, out=out)) == one
    pieces = list(t.reshape(-1, 8, 128).chunk(64))
    singles = [kvcore.compress(p, mode=mode, threads=1) for p in pieces]
    assert kvcore.compress_many(pieces, mode=mode, threads=2) == singles


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_batches_of_32_mib_and_more_decode_bit_exact_with_streaming_stores(variant, mode):
    """A decompress_many batch whose outputs total 32 MiB or more streams its outputs however
    small each frame is (here 64 frames of about 0.6 MiB, as a KV store restores a chunk): every
    frame must decode bit-exact into its slice of one tensor, and so must those decoded into a
    misaligned view (cached stores there), into runs that the merge chains (rows of 2 KiB at a
    stride, streamed) and into runs it cannot (rows of 768 bytes: merged piece by piece); a
    flipped bit in one frame must still be caught."""
    t = large_tensor(torch.bfloat16).reshape(-1, 8, 128)  # rows of 2 KiB, as Llama-style K/V
    pieces = list(t.chunk(64))
    pieces[3] = pieces[3].reshape(-1, 384)
    assert pieces[0].numel() * 2 < STREAMING_OUTPUT_BYTES // 32
    frames = kvcore.compress_many(pieces, mode=mode)
    spare = torch.empty(pieces[1].numel() + 1, dtype=t.dtype)
    views = {1: spare[1:].view(pieces[1].shape),
             2: torch.empty(pieces[2].shape[0], 2, 8, 128, dtype=t.dtype)[:, 1],
             3: torch.empty(pieces[3].shape[0], 2, 384, dtype=t.dtype)[:, 0]}
    assert views[1].data_ptr() % 64 != 0

    def outputs() -> list:
        outs = [o.view(p.shape) for o, p in zip(torch.empty_like(t).chunk(64), pieces)]
        return [views.get(i, o) for i, o in enumerate(outs)]

    for threads in (1, 2):
        outs = outputs()
        kvcore.decompress_many(frames, outs, threads=threads)
        for o, p in zip(outs, pieces):
            assert_bit_exact(o, p)
    bad = bytearray(frames[2])
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress_many(frames[:2] + [bytes(bad)] + frames[3:], outputs())


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_frames_decoded_one_call_each_into_buffers_past_the_cache_decode_bit_exact(variant, mode):
    """Small frames decoded one call each (a KV chunk restored layer by layer) stream their
    output once the calls before show it has left the cache: more than the streaming threshold
    of traffic since its buffer was last written (csrc/frame/recent_outputs.h; the rule
    itself: tests/native/recent_outputs_check.cpp). Two
    rounds over 48 frames of about 0.7 MiB (the second writes every buffer again after a
    round's traffic) into contiguous buffers, misaligned views (cached stores there) and
    strided token ranges, one thread and two, then small frames of odd sizes: each frame must
    decode bit-exact, and a flipped bit must still be caught."""
    t = large_tensor(torch.bfloat16).reshape(-1, 8, 128)
    pieces = list(t.chunk(48))
    frames = [kvcore.compress(p, mode=mode) for p in pieces]

    def output(i: int, p: torch.Tensor) -> torch.Tensor:
        if i % 5 == 1:
            return torch.empty(p.numel() + 1, dtype=p.dtype)[1:].view(p.shape)
        if i % 7 == 2:
            return torch.empty(p.shape[0], 2, *p.shape[1:], dtype=p.dtype)[:, 1]
        return torch.empty_like(p)

    outs = [output(i, p) for i, p in enumerate(pieces)]
    assert sum(o.numel() * 2 for o in outs) > STREAMING_OUTPUT_BYTES
    for _ in range(2):
        for i, (f, o, p) in enumerate(zip(frames, outs, pieces)):
            o.zero_()
            kvcore.decompress(f, out=o, threads=1 + i % 2)
            assert_bit_exact(o, p)
    # Right after that traffic, any buffer not among those counts as cold, however small:
    # odd sizes into misaligned views (partial lines at both ends).
    flat = t.reshape(-1)
    for n in (1, 31, 65, 1000, 4097, 33333):
        o = torch.zeros(n + 3, dtype=t.dtype)[3:]
        kvcore.decompress(kvcore.compress(flat[:n], mode=mode), out=o)
        assert_bit_exact(o, flat[:n])
    bad = bytearray(frames[3])
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(bytes(bad), out=outs[3])


def runs_input(dtype: torch.dtype, rows: int, heads: int, dim: int) -> torch.Tensor:
    """[4, rows, heads, dim] of real KV (4 runs when decoded into a token range), or of
    offset_bytes."""
    shape = (4, rows, heads, dim)
    if dtype == torch.uint8:
        return offset_bytes(4 * rows, heads * dim).reshape(shape)
    src = kvdata.stacked("minilm_l6_kv_bf16.safetensors").reshape(-1)
    return src[: 4 * rows * heads * dim].to(dtype).reshape(shape)


@pytest.mark.parametrize("dtype, rows, heads, dim, block_bytes", [
    (torch.bfloat16, 512, 8, 128, None),  # runs of 1 MiB, blocks of 1 MiB: each block in one run
    (torch.bfloat16, 512, 8, 128, 3 << 18),  # blocks of 768 KiB across runs of 1 MiB: chained
    (torch.float32, 512, 8, 128, 3 << 18),  # runs of 2 MiB
    (torch.uint8, 512, 8, 128, 3 << 18),  # runs of 512 KiB, residual transform
    (torch.bfloat16, 64, 1, 16, 2080),  # runs of 2 KiB, blocks ending 32 bytes into one: piece by piece
    (torch.uint8, 128, 1, 16, 2080),
])
def test_block_outputs_in_runs_decode_bit_exact(variant, dtype, rows, heads, dim, block_bytes):
    """A frame decoded into a token range of a larger tensor (out[:, a:b]: runs at one stride) is
    merged and checksummed in one pass across the runs where every run boundary falls on a 1 KiB
    XXH3 block from the block's start and the block's last piece holds 64 bytes, else piece by
    piece: every layout must decode bit-exact in every variant without touching the rest of the
    tensor, and a flipped bit must still be caught."""
    x = runs_input(dtype, rows, heads, dim)
    frame = kvcore.compress(x, block_bytes=block_bytes)
    assert dtype != torch.uint8 or kvcore.frame_info(frame)["layout"]["residual"]
    big = torch.empty(4, 3 * rows, heads, dim, dtype=dtype)
    out = big[:, rows:2 * rows]
    for threads in (1, 2):
        big.zero_()
        kvcore.decompress(frame, out=out, threads=threads)
        assert_bit_exact(out, x)
        assert not big[:, :rows].any() and not big[:, 2 * rows:].any()
    damaged = bytearray(frame)
    damaged[len(frame) // 3] ^= 0x04
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress(bytes(damaged), out=out)


@pytest.mark.parametrize("channels", [24, 31, 32, 33, 48, 100, 384])
@pytest.mark.parametrize("rows", [1000, 1023, 1025, 1040, 1057])
def test_channel_grouped_planes_on_every_tile_edge(rows, channels):
    """Dense mode transposes each block's exponent plane into channel-major order and back
    (64x16 tall tiles in AVX-512 and AVX2, 16x32 / 32x16 AVX2 tiles, 16x16 and 16x8 SSE2 tiles,
    single bytes; tests/native/channel_transpose_check.cpp covers more shapes): frames must be identical
    across variants and decode bit-exact with every variant, whatever the rows and channels
    left over at each tile size. Max mode groups wherever grouping estimates smaller (dense mode
    charges each table for its decode time and takes one on some of the narrow slices here)."""
    src = kvdata.stacked("minilm_l6_kv_bf16.safetensors").reshape(-1, 384)
    t = src[:rows, :channels].contiguous().reshape(rows, 1, channels)
    frames = set()
    for v in VARIANTS:
        use_variant(v)
        try:
            frames.add(kvcore.compress(t, mode="max", threads=1))
        finally:
            kvcore.set_disabled_isa("")
    assert len(frames) == 1
    (frame,) = frames
    assert "grouped" in kvcore.frame_info(frame)["methods"]
    for reader in VARIANTS:
        use_variant(reader)
        try:
            assert_bit_exact(kvcore.decompress(frame), t)
        finally:
            kvcore.set_disabled_isa("")


@pytest.mark.parametrize("channels", [17, 32, 33, 100, 384])
@pytest.mark.parametrize("rows", [2048, 4096])
def test_channel_grouped_planes_whose_streams_would_alias(rows, channels):
    """Blocks of a multiple of 2048 rows are transposed into channel streams a cache line
    further apart than their length, then closed up (channel_groups.cpp, transpose_stride):
    the frame must be the one every variant writes, the streams in place (bit-exact decode)."""
    src = kvdata.stacked("minilm_l6_kv_bf16.safetensors").reshape(-1, 384)
    t = src[:rows, :channels].contiguous().reshape(rows, 1, channels)
    block_bytes = rows * channels * 2  # one block of exactly these rows
    frames = set()
    for v in VARIANTS:
        use_variant(v)
        try:
            frames.add(kvcore.compress(t, mode="max", threads=1, block_bytes=block_bytes))
        finally:
            kvcore.set_disabled_isa("")
    assert len(frames) == 1
    (frame,) = frames
    info = kvcore.frame_info(frame)
    assert info["n_blocks"] == 1 and "grouped" in info["methods"]
    assert_bit_exact(kvcore.decompress(frame), t)


def _top_plane_tables(frame: bytes, n: int) -> tuple[int, int]:
    """(Huffman tables, payload bytes) of a one-block frame's top plane of n symbols: channel
    groups, one Huffman table, or either under the low-bits method (docs/FORMAT.md)."""
    *_, (_b, _at, method, payload) = frame_layout.block_planes(frame)
    size = len(payload)
    if method == METHODS["lowbits"]:
        inner = 1 + 8 * payload[0] * -(-n // 64)  # the bit count, then its packed bits
        method, payload = payload[inner], payload[inner + 1:]
    if method == METHODS["grouped"]:
        assert payload[0] == 0x80 | 8  # a packed map of 8 fine groups (256 rows); payload[1] coarse ones
        return payload[1], size
    assert method == METHODS["huffman"]
    return 1, size


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_mode_takes_fewer_channel_groups_where_more_save_little(dtype):
    """Each channel group is one more Huffman table to build, and six more streams to start, at
    decode. Dense mode charges each table 256 bytes on top of the estimated size when it picks the
    number of groups (one table: none); max mode takes the smallest estimate. On Qwen-shaped KV
    store chunks of 256 tokens x 8 heads x 128 of real values (kvdata MiniLM), where 8 groups save
    little over 4, dense frames use fewer tables, grow by under 1/128, and decode bit-exact."""
    name = "minilm_l6_kv_bf16.safetensors" if dtype == torch.bfloat16 else "minilm_l6_kv_fp16.safetensors"
    values = kvdata.stacked(name).reshape(-1)
    n = 256 * 8 * 128
    fewer = 0
    for f in range(6):
        t = values[f * n:(f + 1) * n].reshape(256, 8, 128).contiguous()
        dense, smallest = kvcore.compress(t, threads=1), kvcore.compress(t, mode="max", threads=1)
        (d_tables, d_size), (m_tables, m_size) = _top_plane_tables(dense, n), _top_plane_tables(smallest, n)
        assert d_tables <= m_tables
        fewer += d_tables < m_tables
        assert d_size <= m_size * (1 + 1 / 128) + 64, (f, d_size, m_size)
        assert_bit_exact(kvcore.decompress(dense), t)
    assert fewer >= 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.uint8])
@pytest.mark.parametrize(
    "shape", [(), (0,), (1,), (2,), (3,), (7,), (1, 1), (0, 4, 8), (5, 3, 7), (33, 2, 17), (2, 1, 3, 4, 5)]
)
def test_edge_shapes(dtype, shape):
    g = torch.Generator().manual_seed(1)
    t = (torch.randn(shape, generator=g) * 4).to(dtype) if dtype.is_floating_point else torch.randint(
        0, 255, shape, generator=g, dtype=torch.uint8
    )
    for mode in MODES:
        frame = kvcore.compress(t, mode=mode, block_bytes=64)
        assert_bit_exact(kvcore.decompress(frame), t)


def test_odd_lengths_and_block_sizes():
    t = kvdata.stacked("minilm_l6_kv_bf16.safetensors").reshape(-1)
    for n in (1, 2, 3, 255, 257, 4097, 65535, 131073, 1_000_003):
        for block_bytes in (64, 1000, 4096, 1 << 18, 1 << 22):
            x = t[:n]
            assert_bit_exact(kvcore.decompress(kvcore.compress(x, block_bytes=block_bytes)), x)


def test_non_contiguous_views():
    t = kvdata.stacked("stories260k_text_kv_bf16.safetensors")[0]  # [tokens, heads, dim]
    for view in (t.transpose(0, 1), t[:, 1], t[::3], t[..., ::2], t.permute(2, 0, 1)):
        assert not view.is_contiguous()
        back = kvcore.decompress(kvcore.compress(view))
        assert_bit_exact(back, view.contiguous())


def test_unaligned_input_and_frame_buffers():
    t = kvdata.stacked("minilm_l6_kv_fp16.safetensors")[0, :200]
    raw = t.reshape(-1).view(torch.uint8).numpy()
    for offset in (1, 2, 3, 5):
        buf = np.zeros(raw.size + 8, dtype=np.uint8)
        buf[offset : offset + raw.size] = raw
        unaligned = buf[offset : offset + raw.size].view(np.float16).reshape(t.shape)
        frame = kvcore.compress(unaligned)
        fbuf = bytearray(len(frame) + offset)
        fbuf[offset:] = frame
        back = kvcore.decompress(memoryview(fbuf)[offset:])
        assert_bit_exact(back, t)


def test_numpy_input_and_out_buffer():
    x = np.random.default_rng(0).standard_normal((64, 4, 8)).astype(np.float32)
    frame = kvcore.compress(x)
    out = torch.empty(64 * 4 * 8, dtype=torch.float32)
    assert kvcore.decompress(frame, out=out) is out
    assert np.array_equal(out.numpy().reshape(x.shape), x)


@pytest.mark.parametrize("x", [np.array(2.5, np.float32), np.zeros((0,), np.float16), np.ones((3, 0, 2), np.uint8)],
                         ids=["0-d", "empty", "zero dim"])
def test_numpy_input_keeps_its_shape(x):
    # A 0-d array's frame decoded to shape (1,) (np.ascontiguousarray gives it one dimension), and
    # an empty float16 array raised torch's RuntimeError (not a kvcore error).
    for frame in (kvcore.compress(x), kvcore.compress_many([x])[0]):
        assert kvcore.frame_info(frame)["shape"] == x.shape
        back = kvcore.decompress(frame)
        assert back.shape == x.shape and np.array_equal(back.numpy(), x)
    assert kvcore.analyze(x).channels == kvcore.analyze(torch.from_numpy(x)).channels


@pytest.mark.parametrize("dtype", [">f2", ">f4"])
def test_numpy_input_of_swapped_byte_order_is_refused_by_name(dtype):
    x = np.arange(6).astype(dtype)
    with pytest.raises(kvcore.InvalidArgumentError, match="byte order"):
        kvcore.compress(x)


def test_big_endian_bfloat16_is_refused_not_coded_as_other_values():
    # ml_dtypes' bfloat16 is found by name, which a swapped byte order keeps: its bytes
    # were coded as they lay, and decoded to other values (1.5 came back as -2.98).
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    swapped = x.astype(x.dtype.newbyteorder(">"))
    with pytest.raises(kvcore.InvalidArgumentError, match="byte order"):
        kvcore.compress(swapped)
    assert kvcore.decompress(kvcore.compress(x)).float().tolist() == [1.5, -2.25, 3.0]


def test_out_buffer_mismatch_is_rejected():
    frame = kvcore.compress(torch.ones(4, 4, dtype=torch.bfloat16))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress(frame, out=torch.empty(4, 4, dtype=torch.bfloat16).t())  # not runs at one stride


# Outputs whose dtype or size does not match a [4, 4] bfloat16 frame (the decode call
# reads the header itself: nothing may be written to them).
MISMATCHED_OUTS = [
    (lambda: torch.full((4, 4), 7.0, dtype=torch.float16), "out has dtype torch.float16"),  # same bytes
    (lambda: torch.full((8, 2), 7, dtype=torch.uint8), "out has dtype torch.uint8"),
    (lambda: torch.full((4, 4), 7.0, dtype=torch.float64), "out has dtype torch.float64"),  # no kvcore dtype
    (lambda: torch.full((15,), 7.0, dtype=torch.bfloat16), "out has 15 elements"),
    (lambda: torch.full((17,), 7.0, dtype=torch.bfloat16), "out has 17 elements"),
    (lambda: torch.full((0,), 7.0, dtype=torch.bfloat16), "out has 0 elements"),
    (lambda: torch.full((4, 8), 7.0, dtype=torch.bfloat16)[:, :2], "out has 8 elements"),  # runs
]


@pytest.mark.parametrize("make_out, message", MISMATCHED_OUTS)
def test_mismatched_out_is_refused_before_anything_is_written(make_out, message):
    frame = kvcore.compress(torch.ones(4, 4, dtype=torch.bfloat16))
    frames = [kvcore.compress(torch.zeros(2, dtype=torch.bfloat16)), frame]
    for view in (bytes, bytearray, memoryview, lambda f: torch.frombuffer(bytearray(f), dtype=torch.uint8)):
        out = make_out()
        before = out.clone()
        with pytest.raises(kvcore.InvalidArgumentError, match=message):
            kvcore.decompress(view(frame), out=out)
        assert torch.equal(out, before)
        first = torch.full((2,), 5.0, dtype=torch.bfloat16)
        with pytest.raises(kvcore.InvalidArgumentError, match=message):
            kvcore.decompress_many([view(f) for f in frames], [first, out])
        assert torch.equal(out, before) and (first == 5).all()  # not even the matching frame decoded


def test_a_corrupt_header_is_reported_before_the_out_check():
    frame = bytearray(kvcore.compress(torch.ones(4, 4, dtype=torch.bfloat16)))
    frame[0] ^= 1  # the magic
    for out in (torch.empty(4, 4, dtype=torch.bfloat16), torch.empty(3, dtype=torch.float64)):
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress(frame, out=out)
        with pytest.raises(kvcore.CorruptFrameError):
            kvcore.decompress_many([frame], [out])


def test_bad_arguments_raise_kvcore_errors():
    t = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(t, mode="tiny")
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(t, threads=0)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(torch.ones(8, dtype=torch.float64))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(torch.ones(8, dtype=torch.bool))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress([1, 2, 3])
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(torch.ones(*([1] * 9)))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(t, block_bytes=8)


def test_nothing_grows_past_raw_plus_header():
    raw = torch.randint(0, 256, (300_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    for dtype in (torch.bfloat16, torch.float32, torch.uint8, torch.float8_e5m2):
        x = raw.view(dtype)
        for mode in MODES:
            frame = kvcore.compress(x, mode=mode)
            assert len(frame) <= kvcore.max_frame_size(x.dtype, tuple(x.shape))
            n_blocks = kvcore.frame_info(frame)["n_blocks"]
            header = 24 + 8 + 4 + 4 * n_blocks + 4  # rank 1, no residual on random data
            assert len(frame) <= raw.numel() + header + n_blocks * (8 + 5 * x.element_size())


def test_frame_info_describes_the_frame():
    t = kvdata.stacked("minilm_l6_kv_bf16.safetensors")
    frame = kvcore.compress(t)
    info = kvcore.frame_info(frame)
    assert info["dtype"] == "bfloat16"
    assert info["shape"] == tuple(t.shape)
    assert info["original_bytes"] == t.numel() * 2
    assert info["frame_bytes"] == len(frame)
    assert info["n_blocks"] == -(-t.numel() // info["block_elems"])
    assert info["layout"]["rotate"] is True  # bf16: exponent in one byte measures better
    assert "huffman" in info["methods"] and "raw" in info["methods"]
    assert sum(m["planes"] for m in info["methods"].values()) == 2 * info["n_blocks"]
    assert kvcore.frame_desc(frame) == (torch.bfloat16, tuple(t.shape))


@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_duplicate_rows_use_the_rows_method(mode):
    # stories260K layer 0's V depends only on the token id: about 98% of its rows repeat.
    v = kvdata.tensors("stories260k_text_kv_bf16.safetensors")["layer0.v"]
    frame = kvcore.compress(v, mode=mode)
    info = kvcore.frame_info(frame)
    assert set(info["methods"]) == {"rows"}
    assert info["ratio"] < 0.07  # zstd, which this replaces, took 0.056 in dense mode
    assert_bit_exact(kvcore.decompress(frame), v)


def test_rows_repeated_in_part_use_zstd_in_max_mode():
    # Layer 1's V repeats many rows' leading channels but few whole rows: zstd's
    # partial matches beat the rows method on its exponent plane by about 10% (a
    # 512 KiB plane: zstd on its first eighth predicts the win before the whole
    # plane is tried). Max mode keeps that; dense mode does not, since zstd codes
    # such a plane at 0.3-0.6 GB/s and decodes it at about 1 GB/s.
    v = kvdata.tensors("stories260k_text_kv_bf16.safetensors")["layer1.v"]
    best = kvcore.compress(v, mode="max")
    dense = kvcore.compress(v)
    assert "zstd" in kvcore.frame_info(best)["methods"]
    assert "zstd" not in kvcore.frame_info(dense)["methods"]
    assert len(best) < len(dense) < len(best) * 1.03
    assert_bit_exact(kvcore.decompress(best), v)
    assert_bit_exact(kvcore.decompress(dense), v)


def test_a_sparse_plane_repeated_in_part_keeps_zstd():
    # Under 2 bits a byte a row's first 16 bytes repeat by chance and zstd is not tried
    # (a float32's sign plane), but below half a bit zstd's long runs beat the order-0
    # codes' floor of one bit a byte: there it is tried, and max mode keeps it.
    rng = np.random.default_rng(5)
    x = np.zeros((16384, 32), np.uint8)
    x[np.arange(16384), rng.integers(0, 32, 16384)] = rng.integers(1, 256, 16384)
    for r in range(64, 16384):
        x[r, :16] = x[rng.integers(0, r), :16]
    t = torch.from_numpy(x)
    best = kvcore.compress(t, mode="max")
    assert set(kvcore.frame_info(best)["methods"]) == {"zstd"}
    assert len(best) < 0.9 * len(kvcore.compress(t))
    assert torch.equal(kvcore.decompress(best), t)


@pytest.mark.parametrize("repeated", [16, 24])
def test_dense_mode_keeps_zstd_where_it_saves_a_quarter(repeated):
    # Every row's first `repeated` channels repeat a random earlier row's, the rest
    # are new: zstd codes the mantissa plane (raw otherwise) in about half its size
    # and dense mode keeps it; the exponent plane, which the channel-grouped coder
    # already shrinks, keeps zstd in dense mode only when 24 channels repeat.
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(16384, 32, generator=g) * 3).to(torch.bfloat16)
    for r in range(256, len(x)):
        x[r, :repeated] = x[int(torch.randint(0, r, (1,), generator=g)), :repeated]
    dense, best = kvcore.compress(x), kvcore.compress(x, mode="max")
    methods = kvcore.frame_info(dense)["methods"]
    assert methods["zstd"]["planes"] == (2 if repeated == 24 else 1)
    assert set(kvcore.frame_info(best)["methods"]) == {"zstd"}
    assert len(best) <= len(dense) < len(best) * 1.06
    assert_bit_exact(kvcore.decompress(dense), x)


def rows_from(distinct: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
    return distinct[picks].contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.uint8])
# Rows of 16 (channels 8), 32 and 64 bytes have their own unrolled search (lz/row_repeats.cpp).
@pytest.mark.parametrize("channels", [3, 8, 32, 64, 200])
@pytest.mark.parametrize("n_distinct", [1, 2, 200, 700, 5000])
@pytest.mark.parametrize("mode", MODES)
def test_repeated_rows_round_trip(dtype, channels, n_distinct, mode):
    g = torch.Generator().manual_seed(n_distinct * 1000 + channels)
    distinct = (torch.randn(n_distinct, channels, generator=g) * 4)
    distinct = distinct.to(dtype) if dtype.is_floating_point else (distinct * 16).to(torch.int16).to(torch.uint8)
    picks = torch.randint(0, n_distinct, (6000,), generator=g)
    picks[: min(n_distinct, 6000)] = torch.arange(min(n_distinct, 6000))[torch.randperm(min(n_distinct, 6000), generator=g)]
    x = rows_from(distinct, picks[torch.randperm(6000, generator=g)])
    frame = kvcore.compress(x, mode=mode, block_bytes=1 << 16)
    assert_bit_exact(kvcore.decompress(frame), x)
    if 2 <= n_distinct <= 700 and channels >= 16:  # one row: the residual makes it constant; shorter rows: compared in pairs or more
        assert "rows" in kvcore.frame_info(frame)["methods"]


@pytest.mark.parametrize("channels", [32, 48])  # rows of 32 bytes have their own search loop
@pytest.mark.parametrize("mode", MODES)
def test_rows_mixing_runs_of_new_rows_and_repeats(channels, mode):
    # Stretches of new rows, of rows that all repeat, and of both interleaved at
    # different densities: each 64 rows of the bitmap is joined by runs or row by row.
    g = torch.Generator().manual_seed(channels)
    distinct = (torch.randn(3000, channels, generator=g) * 4).to(torch.bfloat16)
    picks, fresh = [], 0
    for stretch, share in enumerate([0.0, 1.0, 0.1, 0.6, 0.45, 0.95, 0.0, 0.3, 1.0] * 3):
        for _ in range(37 + 23 * stretch):  # stretches that do not line up with 64 rows
            if fresh == 0 or (fresh < len(distinct) and torch.rand(1, generator=g).item() >= share):
                picks.append(fresh)
                fresh += 1
            else:
                picks.append(int(torch.randint(0, fresh, (1,), generator=g)))
    x = distinct[torch.tensor(picks)].contiguous()
    frame = kvcore.compress(x, mode=mode)
    assert "rows" in kvcore.frame_info(frame)["methods"]
    assert_bit_exact(kvcore.decompress(frame), x)


def whole_rows_repeated(dtype: torch.dtype, heads: int, dim: int, spread: int) -> torch.Tensor:
    """[rows, heads, dim] where one row in 64 is new and the rest repeat earlier ones whole (a
    token seen before), channel scales spread over 2^-spread..2^spread."""
    channels = heads * dim
    rows = max(512, (1 << 19) // channels)
    g = torch.Generator().manual_seed(channels + spread)
    scale = 2.0 ** torch.randint(-spread, spread + 1, (channels,), generator=g).float()
    distinct = (torch.randn(rows // 64, channels, generator=g) * scale).to(dtype)
    return rows_from(distinct, torch.randint(0, rows // 64, (rows,), generator=g)).reshape(rows, heads, dim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# 32 and 48 channels (element rows of 64 bytes have their own join loop); 1024 channels of
# widely spread scales, where fast mode keeps a residual.
@pytest.mark.parametrize("heads, dim, spread", [(4, 8, 0), (3, 16, 0), (8, 128, 20)])
@pytest.mark.parametrize("mode", MODES)
def test_blocks_whose_planes_repeat_the_same_rows_join_whole_element_rows(variant, dtype, heads, dim, spread, mode):
    """When every plane of a block is a rows plane with one row table, the decoder merges the
    distinct rows of all planes and joins whole element rows into the output; into a token range
    of a larger tensor (no contiguous run for the block) it joins each plane and merges them.
    Both must decode bit-exact in every variant, with one thread or two."""
    x = whole_rows_repeated(dtype, heads, dim, spread)
    frame = kvcore.compress(x, mode=mode, block_bytes=1 << 19)
    assert frame_layout.shared_row_blocks(bytes(frame))
    if mode == "fast" and spread:
        assert frame_layout.residual(bytes(frame)) is not None
    rows = x.shape[0]
    big = torch.zeros(rows, 3 * heads, dim, dtype=dtype)
    for threads in (1, 2):
        assert_bit_exact(kvcore.decompress(frame, threads=threads), x)
        kvcore.decompress(frame, out=big[:, heads:2 * heads], threads=threads)
        assert_bit_exact(big[:, heads:2 * heads], x)
        assert not big[:, :heads].any() and not big[:, 2 * heads:].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, "float32 from bfloat16"])
@pytest.mark.parametrize("mode", MODES)
def test_planes_that_repeat_whole_element_rows_share_one_search(variant, dtype, mode):
    """Where every plane that is not constant repeats rows about equally often, the block's
    element rows are searched once and each plane gets their table (frame/codec.cpp): one
    table, the same copies, in every plane of every block. Float32 cast from bfloat16 has a
    constant plane (its low mantissa bytes; the other holds the rotated sign) and shares the
    table among the other three."""
    x = whole_rows_repeated(torch.bfloat16 if dtype == "float32 from bfloat16" else dtype, 4, 8, 0)
    if dtype == "float32 from bfloat16":
        x = x.to(torch.float32)
    frame = bytes(kvcore.compress(x, mode=mode, block_bytes=1 << 18))
    tables = frame_layout.row_tables(frame)
    n_blocks = kvcore.frame_info(frame)["n_blocks"]
    planes = 3 if dtype == "float32 from bfloat16" else x.element_size()
    assert len(tables) == planes * n_blocks
    for b in range(n_blocks):
        assert len({(copies, table) for blk, copies, table in tables if blk == b}) == 1
    assert_bit_exact(kvcore.decompress(frame), x)


def test_a_plane_that_repeats_more_rows_than_its_elements_searches_its_own():
    """A fifth of the rows repeat whole and as many again repeat only their exponents: the
    high plane's sampled share is about twice the low plane's, so each plane is searched on its
    own, and the high plane's table lists about twice the copies (the element rows' table would
    list only the whole repeats)."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(16384, 32, generator=g) * 3).to(torch.bfloat16).view(torch.int16)
    for r in range(1, len(x)):
        u = torch.rand(1, generator=g).item()
        if u < 0.4:
            src = int(torch.randint(0, r, (1,), generator=g))
            x[r] = x[src] if u < 0.2 else (x[src] & 0x7F80) | (x[r] & ~0x7F80)
    x = x.view(torch.bfloat16)
    frame = bytes(kvcore.compress(x))
    (_, low, _), (_, high, _) = frame_layout.row_tables(frame)
    assert 0.17 * len(x) < low < 0.23 * len(x)
    assert high > 1.6 * low
    assert_bit_exact(kvcore.decompress(frame), x)


def exponent_prefixes_repeated(whole: float, prefix_only: float) -> torch.Tensor:
    """bf16 [16384, 32] (one dense block) where `whole` of the rows repeat an earlier row and
    `prefix_only` more repeat only the exponents of their first 16 channels. Each repeat's
    source row has the row's parity, so that the repeat sample (every other row here) sees it."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(16384, 32, generator=g) * 3).to(torch.bfloat16).view(torch.int16)
    for r in range(2, len(x)):
        u = torch.rand(1, generator=g).item()
        if u < whole + prefix_only:
            src = r % 2 + 2 * int(torch.randint(0, r // 2, (1,), generator=g))
            if u < whole:
                x[r] = x[src]
            else:
                x[r, :16] = (x[src, :16] & 0x7F80) | (x[r, :16] & ~0x7F80)
    return x.view(torch.bfloat16)


@pytest.mark.parametrize("whole, prefix_only, dense_high", [
    (0.04, 0.05, METHODS["huffman"]),  # 9% of prefixes, 4% of rows: dense mode does not search
    (0.08, 0.02, METHODS["rows"]),  # 10% of prefixes, 8% of rows: searched
])
def test_dense_mode_searches_rows_where_they_repeat_whole(whole, prefix_only, dense_high):
    """A plane whose sampled rows repeat their first 16 bytes less than an eighth of the time is
    sampled again with keys of whole rows, and dense mode searches its rows (60-70 us per 512 KiB
    plane) only where a sixteenth repeat whole. Max mode searches wherever a sixteenth of the
    prefixes repeat, and keeps the rows method where it is smaller."""
    x = exponent_prefixes_repeated(whole, prefix_only)
    dense, best = bytes(kvcore.compress(x)), bytes(kvcore.compress(x, mode="max"))
    high = lambda frame: frame_layout.block_planes(frame)[-1][2]  # noqa: E731
    assert high(dense) == dense_high
    assert high(best) == METHODS["rows"]
    assert len(best) <= len(dense)
    for frame in (dense, best):
        assert_bit_exact(kvcore.decompress(frame), x)


def test_a_near_random_plane_is_searched_with_its_top_plane():
    """A bf16 block where 40% of the rows repeat an earlier row's sign and mantissa bits under
    exponents of their own: the low plane (near-random bytes) repeats rows its high plane does
    not. Dense mode samples such a plane only where the high plane's rows are searched, so it
    stays raw; max mode samples every plane and codes the low one by rows."""
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(16384, 32, generator=g) * 3).to(torch.bfloat16).view(torch.int16)
    for r in range(1, len(x)):
        if torch.rand(1, generator=g).item() < 0.4:
            src = int(torch.randint(0, r, (1,), generator=g))
            x[r] = (x[src] & ~0x7F80) | (x[r] & 0x7F80)
    x = x.view(torch.bfloat16)
    dense, best = bytes(kvcore.compress(x)), bytes(kvcore.compress(x, mode="max"))
    low = lambda frame: frame_layout.block_planes(frame)[0][2]  # noqa: E731
    assert low(dense) == METHODS["raw"]
    assert low(best) == METHODS["rows"]
    for frame in (dense, best):
        assert_bit_exact(kvcore.decompress(frame), x)


def rows_repeated(share: float, whole: bool) -> torch.Tensor:
    """bf16 [8192, 4, 8] (one fast block per 4096 rows) where `share` of each block's rows repeat
    an earlier row of the block: whole, or only their exponents (the high plane after the
    rotation; the sign and mantissa stay the row's own)."""
    g = torch.Generator().manual_seed(int(share * 100) + whole)
    x = (torch.randn(8192, 32, generator=g) * 3).to(torch.bfloat16).view(torch.int16)
    for block in (0, 4096):
        for r in range(block + 1, block + 4096):
            if torch.rand(1, generator=g).item() < share:
                src = block + int(torch.randint(0, r - block, (1,), generator=g))
                x[r] = x[src] if whole else (x[src] & 0x7F80) | (x[r] & ~0x7F80)
    return x.view(torch.bfloat16).reshape(8192, 4, 8)


@pytest.mark.parametrize("share, whole, fast_high", [
    (0.1, False, "fastcode"),  # only exponent rows repeat: the high plane coded whole
    (0.4, False, "rows"),  # a quarter and more repeat
    (0.1, True, "rows"),  # the low plane is a rows plane: no fused decode either way
])
def test_fast_mode_codes_the_high_plane_whole_where_few_rows_repeat(share, whole, fast_high):
    """Fast mode decodes a bf16 block's high plane fused with its merge where the plane is coded
    whole and the low plane is raw; as a rows plane it takes three passes. Below a quarter of the
    rows repeating it keeps the whole plane unless the rows method saves over an eighth. Dense
    mode keeps the smaller."""
    x = rows_repeated(share, whole)
    fast, dense = kvcore.compress(x, mode="fast"), kvcore.compress(x)
    names = {code: name for name, code in METHODS.items()}
    fast_planes = [(names.get(m, m), b) for b, _at, m, _p in frame_layout.block_planes(bytes(fast))]
    assert fast_planes == [("rows" if whole else "raw", 0), (fast_high, 0), ("rows" if whole else "raw", 1),
                           (fast_high, 1)]
    assert [m for _b, _at, m, _p in frame_layout.block_planes(bytes(dense))][1] == METHODS["rows"]  # dense: rows
    for frame in (fast, dense):
        assert_bit_exact(kvcore.decompress(frame), x)


def test_one_distinct_row_and_constant_planes():
    row = torch.arange(32, dtype=torch.float32).to(torch.bfloat16)
    x = row.repeat(4096, 1)
    info = kvcore.frame_info(kvcore.compress(x))
    assert "rows" in info["methods"]  # the low bytes differ within the row: not constant
    assert info["ratio"] < 0.01
    assert_bit_exact(kvcore.decompress(kvcore.compress(x)), x)
    z = torch.full((4096, 32), 1.5, dtype=torch.bfloat16)
    info = kvcore.frame_info(kvcore.compress(z))
    assert set(info["methods"]) == {"constant"}
    assert_bit_exact(kvcore.decompress(kvcore.compress(z)), z)


@pytest.mark.parametrize(
    "name,zipnn_ratio",
    [("minilm_l6_kv_bf16.safetensors", 0.668)],  # zipnn's ratio measured in ../shared/kvdata/README.md
)
def test_dense_ratio_beats_zipnn_reference(name, zipnn_ratio):
    t = kvdata.stacked(name)
    assert kvcore.frame_info(kvcore.compress(t))["ratio"] < zipnn_ratio


def test_supported_dtypes_listed():
    assert set(SUPPORTED) == {"uint8", "int8", "float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32"}


def test_concurrent_calls_from_python_threads():
    # The GIL is released: several Python threads share the native pool and its scratch.
    from concurrent.futures import ThreadPoolExecutor

    tensors = [kvdata.stacked("minilm_l6_kv_bf16.safetensors")[i] for i in range(6)]

    def round_trip(i):
        t = tensors[i % len(tensors)]
        mode = MODES[i % len(MODES)]
        frame = kvcore.compress(t, mode=mode, threads=1 + i % 2, block_bytes=1 << 16)
        assert_bit_exact(kvcore.decompress(frame, threads=1 + (i + 1) % 2), t)
        return len(frame)

    with ThreadPoolExecutor(max_workers=4) as pool:
        sizes = list(pool.map(round_trip, range(24)))
    assert all(s > 0 for s in sizes)


# ---------------------------------------------------------------- decompress_many


def test_decompress_many_round_trip_and_errors():
    rng = np.random.default_rng(11)
    xs = [torch.from_numpy(rng.standard_normal((64, 4, 8)).astype(np.float32)).to(torch.bfloat16) for _ in range(7)]
    frames = [kvcore.compress(x, mode="fast" if i % 2 else "dense") for i, x in enumerate(xs)]
    outs = [torch.empty_like(x) for x in xs]
    kvcore.decompress_many(frames, outs, threads=2)
    assert all(torch.equal(o.view(torch.int16), x.view(torch.int16)) for o, x in zip(outs, xs))
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress_many(frames, outs[:-1])
    with pytest.raises(kvcore.KVCoreError):
        kvcore.decompress_many(frames[:1], [torch.empty(64, 4, 8)])  # wrong dtype
    bad = bytearray(frames[3])
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(kvcore.CorruptFrameError):
        kvcore.decompress_many(frames[:3] + [bytes(bad)], outs[:4])


@pytest.mark.parametrize("mode", MODES)
def test_compress_into_a_reused_buffer(mode):
    kv = kvdata.stacked("stories260k_text_kv_fp16.safetensors")[:2]
    buf = torch.full((kvcore.max_frame_size(kv.dtype, tuple(kv.shape)) + 7,), 0xEE, dtype=torch.uint8)
    for x in (kv, kv[1:], kv.float().to(torch.float8_e5m2)):  # smaller frames into the same buffer
        frame = kvcore.compress(x, mode=mode, out=buf)
        assert isinstance(frame, memoryview) and bytes(frame) == kvcore.compress(x, mode=mode)
        assert_bit_exact(kvcore.decompress(frame), x)
    raw = np.zeros(buf.numel(), dtype=np.uint8)
    assert frame_layout.same_frame(kvcore.compress(kv, out=raw, backend="software"), kvcore.compress(kv, backend="software"))
    with pytest.raises(kvcore.BufferTooSmallError):
        kvcore.compress(kv, out=bytearray(100))
    for bad in (bytes(buf.numel()), 7, np.zeros((64, 4096), dtype=np.uint8)[:, ::2], buf[::2]):
        with pytest.raises(kvcore.InvalidArgumentError):
            kvcore.compress(kv, out=bad)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress(kv, out=buf, block_bytes=8)  # options are checked before anything is written


@pytest.mark.parametrize("mode", MODES)
def test_compress_many_gives_the_frames_of_compress(mode):
    kv = kvdata.stacked("minilm_l6_kv_bf16.safetensors")
    xs = [kv[0], kv[1:3], kv[3, 0].half(), kv[4].float().to(torch.float8_e4m3fn), kv[5, 1, :1], kv[:0],
          kv[2].transpose(1, 2)]  # every dtype path, a one-row, an empty and a non-contiguous tensor
    for threads in (1, 2, None):
        frames = kvcore.compress_many(xs, mode=mode, threads=threads, block_bytes=65536)
        assert frames == [kvcore.compress(x, mode=mode, block_bytes=65536) for x in xs]
    outs = [torch.empty(x.shape, dtype=x.dtype) for x in xs]
    kvcore.decompress_many(frames, outs)
    for o, x in zip(outs, xs):
        assert_bit_exact(o, x.contiguous())
    assert kvcore.compress_many([]) == []
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress_many(xs, mode="tiny")
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.compress_many([kv[0], torch.zeros(4, dtype=torch.int32)])


def test_decompress_many_rejects_overlap():
    x = torch.arange(512, dtype=torch.float32).to(torch.bfloat16).reshape(64, 8)
    f = kvcore.compress(x)
    big = torch.empty(96, 8, dtype=torch.bfloat16)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress_many([f, f], [big[:64], big[32:]])  # the two outputs share rows
    buf = torch.empty(4096, dtype=torch.uint8)
    buf[: len(f)] = torch.frombuffer(bytearray(f), dtype=torch.uint8)
    frame_in_buf = buf[: len(f)].numpy()
    out_over_frame = buf[:1024].view(torch.bfloat16).reshape(64, 8)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress_many([frame_in_buf], [out_over_frame])
    kvcore.decompress_many([f, f], [big[:64], torch.empty_like(x)])  # disjoint: fine
    assert torch.equal(big[:64], x)


# ---------------------------------------------------------------- outputs made of runs at one stride


@pytest.mark.parametrize("dtype", [getattr(torch, name) for name in SUPPORTED])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block_bytes", [None, 3000])  # blocks longer than a run; runs spanning blocks
def test_decode_into_a_token_range_of_a_larger_tensor(dtype, mode, block_bytes):
    kv = real_in_dtype("minilm_l6_kv_bf16.safetensors", dtype)[:3, :, :200]  # [3, 2, 200, 12, 32]
    frame = kvcore.compress(kv[:, :, 40:143], mode=mode, block_bytes=block_bytes)
    for threads in (1, 2):
        big = torch.zeros_like(kv)
        assert kvcore.decompress(frame, out=big[:, :, 40:143], threads=threads) is not None
        assert_bit_exact(big[:, :, 40:143], kv[:, :, 40:143].contiguous())
        assert not bits(big[:, :, :40]).any() and not bits(big[:, :, 143:]).any()  # nothing outside


def test_decode_many_chunks_side_by_side(variant):
    kv = kvdata.stacked("stories260k_text_kv_fp16.safetensors")[:, :, :256]
    cuts = [0, 64, 100, 192, 256]
    frames = [kvcore.compress(kv[:, :, a:b], mode=("dense", "fast")[i % 2]) for i, (a, b) in
              enumerate(zip(cuts, cuts[1:]))]
    big = torch.zeros_like(kv)
    kvcore.decompress_many(frames, [big[:, :, a:b] for a, b in zip(cuts, cuts[1:])], threads=2)
    assert_bit_exact(big, kv)


def test_runs_of_single_elements_and_size_one_dims():
    x = torch.arange(300, dtype=torch.float32).to(torch.bfloat16).reshape(1, 300, 1)
    pair = torch.zeros(300, 2, dtype=torch.bfloat16)
    kvcore.decompress(kvcore.compress(x), out=pair[:, 1])  # 300 runs of one element
    assert torch.equal(pair[:, 1], x.reshape(300)) and not pair[:, 0].any()


def test_layouts_that_are_not_runs_at_one_stride_are_refused():
    frame = kvcore.compress(torch.ones(4, 2, 3, dtype=torch.float16))
    cube = torch.zeros(4, 4, 4, dtype=torch.float16)
    for bad in (cube[:, :2, :3],  # two levels of striding
                torch.zeros(2, 3, 4, dtype=torch.float16).permute(2, 0, 1)):
        with pytest.raises(kvcore.InvalidArgumentError):
            kvcore.decompress(frame, out=bad)
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.decompress(frame, out=torch.zeros(1, dtype=torch.float16).expand(24))  # zero stride


def test_overlap_checks_agree_with_byte_marking():
    """Random output layouts (runs at a stride) and frames placed in one buffer: decompress_many
    refuses exactly the calls where an output shares a byte with another output or a frame,
    and otherwise writes every output and nothing else. Up to eight outputs, any of whose
    frames may sit in the buffer, so that each frame is compared with several outputs."""
    rng = np.random.default_rng(5)
    refused = accepted = 0
    for _ in range(600):
        buf = torch.zeros(4096, dtype=torch.uint8)
        mark = np.zeros(4096, dtype=np.int32)
        outs, frames, wants = [], [], []
        for _ in range(int(rng.integers(1, 9))):
            run = int(rng.integers(1, 64))
            stride = run + int(rng.integers(0, 200))
            nruns = int(rng.integers(1, 9))
            at = int(rng.integers(0, 4096 - (nruns - 1) * stride - run))
            outs.append(buf.as_strided((nruns, run), (stride, 1), at))
            for k in range(nruns):
                mark[at + k * stride: at + k * stride + run] += 1
            want = torch.from_numpy(rng.integers(0, 4, (nruns, run), dtype=np.uint8))
            wants.append(want)
            frames.append(kvcore.compress(want))
        overlaps_frame = False
        holds_frame = np.zeros(4096, dtype=bool)  # frames in the buffer do not overlap one another
        for i in range(len(frames)):
            if rng.random() < 0.4:
                at = int(rng.integers(0, 4096 - len(frames[i])))
                if holds_frame[at:at + len(frames[i])].any():
                    continue
                holds_frame[at:at + len(frames[i])] = True
                buf[at:at + len(frames[i])] = torch.frombuffer(bytearray(frames[i]), dtype=torch.uint8)
                frames[i] = buf[at:at + len(frames[i])].numpy()
                overlaps_frame |= bool(mark[at:at + len(frames[i])].any())
        clash = bool((mark > 1).any()) or overlaps_frame
        before = buf.clone()
        if clash:
            with pytest.raises(kvcore.InvalidArgumentError):
                kvcore.decompress_many(frames, outs)
            assert torch.equal(buf, before)  # refused before anything was written
            refused += 1
        else:
            kvcore.decompress_many(frames, outs)
            assert all(torch.equal(o, w) for o, w in zip(outs, wants))
            untouched = torch.from_numpy(mark == 0)
            assert torch.equal(buf[untouched], before[untouched])
            accepted += 1
    assert refused > 50 and accepted > 50

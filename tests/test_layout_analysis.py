"""The encoder's choice of layout (csrc/frame/analysis.cpp): the RESIDUAL table holds each
channel's most common top byte, over the 64 rows the analysis samples (rows k * (rows // 64)),
the smallest value on ties; whether to have one is decided on every stride-th channel (at most
256 of them), and the table then holds every channel's. Each channel's sampled bytes are
counted by frame/value_counts: by one compare per value where they span a narrow range, else by
count tables (SSE2) or a sort of the 64 bytes (AVX2, AVX-512), so narrow and wide channels are
checked here in every variant, and the kernels against a plain count in
tests/native/value_counts_check.cpp."""

import numpy as np
import pytest
import torch

import kvcore

import frame_layout
from isa_variants import VARIANTS, use_variant

SAMPLED_ROWS = 64


def expected_modes(tops: np.ndarray) -> bytes:
    """Each column's mode over the sampled rows, the smallest value on ties."""
    sample = tops[np.arange(SAMPLED_ROWS) * (tops.shape[0] // SAMPLED_ROWS)]
    return bytes(int(np.bincount(col, minlength=256).argmax()) for col in sample.T.astype(np.int64))


def channel_data(rows: int, channels: int, spread: int, seed: int) -> torch.Tensor:
    """uint8 rows x channels: each channel around its own base, with outliers in some."""
    g = np.random.default_rng(seed)
    base = g.integers(0, 256, channels)
    x = (base + g.integers(0, spread, (rows, channels))) % 256
    x[::5, ::3] = (x[::5, ::3] + 100) % 256  # a wide range in every third channel
    x[:, 1] = base[1] + np.arange(rows) % 2  # two values, equally common: a tie
    return torch.from_numpy(x.astype(np.uint8))


@pytest.fixture(params=VARIANTS)
def variant(request):
    use_variant(request.param)
    yield request.param
    kvcore.set_disabled_isa("")


@pytest.mark.parametrize("rows", [100, 1000, 4097])
@pytest.mark.parametrize("spread", [1, 4, 20, 30])
@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_residual_is_each_channels_mode(variant, rows, spread, mode):
    x = channel_data(rows, 48, spread, rows * 31 + spread)
    frame = bytes(kvcore.compress(x, mode=mode, threads=1))
    residual = frame_layout.residual(frame)
    assert residual is not None, "channels this distinct must get a residual table"
    assert residual == expected_modes(x.numpy())
    assert torch.equal(kvcore.decompress(frame), x)


@pytest.mark.parametrize("channels", [257, 300, 1000, 4096])
@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_residual_of_many_channels_covers_every_channel(channels, mode):
    """Above 256 channels the residual is decided on every stride-th channel (at most 256), then
    the table takes the mode of every channel, sampled or not."""
    x = channel_data(256, channels, 4, channels)
    frame = bytes(kvcore.compress(x, mode=mode, threads=1))
    assert frame_layout.residual(frame) == expected_modes(x.numpy())
    assert torch.equal(kvcore.decompress(frame), x)


def test_residual_is_decided_on_the_sampled_channels():
    """1024 channels, so every 4th is sampled: channels around their own bases everywhere but in
    the sampled ones, which all sit at one base. The residual would pay on the others, but the
    decision is made on the sample, where it saves nothing: no residual (the same channels with
    the sample's channels spread as well get one)."""
    x = channel_data(256, 1024, 4, 7)
    x[:, ::4] = 17
    assert analysed_residual_of(x, False, 1024) is False
    assert analysed_residual_of(channel_data(256, 1024, 4, 7), False, 1024) is True


def test_residual_of_rotated_bfloat16(variant):
    """bf16 with the rotate layout: the top byte is the whole exponent."""
    g = torch.Generator().manual_seed(5)
    scale = torch.logspace(-6, 6, 96)  # each channel its own exponent range
    x = (torch.randn(2048, 96, generator=g) * scale).to(torch.bfloat16)
    frame = bytes(kvcore.compress(x, mode="fast", threads=1))
    info = kvcore.frame_info(frame)
    assert info["layout"]["rotate"] and info["layout"]["residual"]
    u = x.view(torch.int16).numpy().astype(np.uint16)
    tops = ((((u << 1) | (u >> 15)) & 0xFFFF) >> 8).astype(np.uint8)
    assert frame_layout.residual(frame) == expected_modes(tops)


def test_no_residual_below_the_rows_it_samples():
    x = channel_data(SAMPLED_ROWS - 1, 48, 4, 1)
    frame = bytes(kvcore.compress(x, threads=1))
    assert frame_layout.residual(frame) is None
    assert torch.equal(kvcore.decompress(frame), x)


# ---- plane entropies of each bit layout (the sample the analysis counts) ----

SAMPLE_ELEMS = 1 << 14  # at most; a quarter of the tensor, at least MIN_SAMPLE_ELEMS
MIN_SAMPLE_ELEMS = 1 << 12
# Dense mode takes a float16 or float8 tensor's rotated layout where it estimates at most this many
# bits per element above the plain one, from this many elements, for float16 when its low plane
# stays raw (frame/analysis.cpp: kRotatedAllowance, kRotatedMinElems; frame/analysis.h:
# kIncompressibleBits).
ROTATED_ALLOWANCE = 1 / 64
ROTATED_MIN_ELEMS = 65536
INCOMPRESSIBLE_BITS = 7.9
DTYPE_CODES = {torch.uint8: 1, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4, torch.float16: 5, torch.bfloat16: 6,
               torch.float32: 7}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def sample_rows(n: int, channels: int) -> list[tuple[int, int]]:
    """(start, length) of the rows the analysis samples: whole rows, evenly spread."""
    row_len = channels if channels > 1 else min(n, 4096)
    n_rows = n // row_len
    rows = max(1, min(n_rows, min(SAMPLE_ELEMS, max(MIN_SAMPLE_ELEMS, n // 4)) // row_len))
    stride = max(1, n_rows // rows)
    return [(r * stride * row_len, min(n, r * stride * row_len + row_len) - r * stride * row_len) for r in range(rows)]


def entropy(plane: np.ndarray) -> float:
    p = np.bincount(plane, minlength=256)
    p = p[p > 0] / plane.size
    return float(-(p * np.log2(p)).sum())


def layout_entropies(x: torch.Tensor, channels: int) -> dict[bool, list[float]]:
    """Each plane's order-0 entropy over the sample, plain (False) and rotated left by one bit (True)."""
    e = x.element_size()
    u = x.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[e]).numpy().view(UINT[e])
    s = np.concatenate([u[a : a + n] for a, n in sample_rows(u.size, channels)])
    bits = UINT[e](8 * e - 1)
    out = {}
    for rotate in (False, True):
        v = ((s << UINT[e](1)) | (s >> bits)) if rotate else s
        out[rotate] = [entropy(((v >> UINT[e](8 * p)) & UINT[e](0xFF)).astype(np.uint8)) for p in range(e)]
    return out


def analysis_inputs():
    from kvdata import files, tensors

    g = torch.Generator().manual_seed(3)
    cases = [("randn", torch.randn(48, 8, 128, generator=g).to(torch.bfloat16)),
             ("scaled", (torch.randn(40, 96, generator=g) * torch.logspace(-4, 4, 96)).to(torch.float16)),
             ("odd", torch.randn(3, 1001, generator=g).to(torch.bfloat16)),
             ("flat", torch.randn(70001, generator=g).to(torch.float16))]
    for f in files()[:4]:
        t = tensors(f.name)["layer1.k"]
        cases += [(f"{f.stem}", t[:60]), (f"{f.stem}-flat", t.reshape(-1)[:50000]),
                  (f"{f.stem}-flat-large", t.reshape(-1)[:100000]),
                  (f"{f.stem}-fp8-flat-large", t.reshape(-1)[:100000].to(torch.float8_e4m3fn)),
                  (f"{f.stem}-fp32", t[:40].float()), (f"{f.stem}-fp8", t[:40].to(torch.float8_e4m3fn))]
    return cases


def test_value_counts_kernels_match_a_plain_count(tmp_path):
    """Every variant of frame/value_counts against a plain count, under ASan + UBSan
    (tests/native/value_counts_check.cpp; machines without AVX-512 run its AVX-512 variant
    emulated in test_shuffle_avx512_emulated.py)."""
    import subprocess

    from native_build import ROOT, build_harness

    sources = [str(ROOT / "csrc" / f) for f in ("frame/value_counts.cpp", "frame/value_counts_avx2.cpp",
                                                 "frame/value_counts_avx512.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "value_counts_check", sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.startswith("ok:") and not run.stdout.startswith("ok: 0 ")


def rotated_is_chosen(x: torch.Tensor, want: dict[bool, list[float]], rotated_preferred: bool) -> bool:
    """The analysis's choice between the layouts whose plane entropies are want: the smaller
    (capped) sum, ties to the plain layout; dense mode (rotated_preferred) takes a large float16
    or float8 tensor's rotated layout unless the plain one is smaller by more than
    ROTATED_ALLOWANCE."""
    if x.dtype == torch.uint8:
        return False
    bits = {r: sum(min(8.0, h) for h in want[r]) for r in (False, True)}
    if (rotated_preferred and x.dtype in (torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
            and x.numel() >= ROTATED_MIN_ELEMS and (x.element_size() == 1 or want[True][0] >= INCOMPRESSIBLE_BITS)):
        return bits[True] < bits[False] + ROTATED_ALLOWANCE
    return bits[True] < bits[False] - 1e-9


@pytest.mark.parametrize("rotated_preferred", [False, True], ids=["estimate", "rotated-preferred"])
@pytest.mark.parametrize("name,x", analysis_inputs(), ids=lambda v: v if isinstance(v, str) else "")
def test_plane_entropies_of_the_chosen_layout(name, x, rotated_preferred):
    """With one channel or below 64 rows there is no residual: the analysis reports the plane
    entropies of the chosen layout (rotated_is_chosen), each as numpy counts them over the same
    sample."""
    channels = x.shape[-1] * x.shape[-2] if x.dim() >= 3 else (x.shape[-1] if x.dim() == 2 else 1)
    assert channels == 1 or x.numel() // channels < 64
    got = kvcore._native.analyze_layout(x.reshape(-1).view(torch.uint8).numpy(), DTYPE_CODES[x.dtype], channels,
                                        rotated_preferred=rotated_preferred)
    assert got["residual"] is None
    want = layout_entropies(x, channels)
    best = rotated_is_chosen(x, want, rotated_preferred)
    assert got["rotate"] == best
    assert got["plane_entropy"] == pytest.approx(want[best], abs=1e-9)


def test_dense_prefers_the_rotated_float16_layout():
    """MiniLM's fp16 K/V: the plain layout estimates a little smaller (under ROTATED_ALLOWANCE), so
    the estimate alone keeps it, and dense mode rotates: its frame's blocks split the top byte's
    low bits off (exponent symbols, which decode faster) and decode bit-exact. Below
    ROTATED_MIN_ELEMS elements the estimate decides."""
    from kvdata import stacked

    x = stacked("minilm_l6_kv_fp16.safetensors")
    raw = x.reshape(-1).view(torch.uint8).numpy()
    channels = x.shape[-1] * x.shape[-2]
    by_estimate = kvcore._native.analyze_layout(raw, DTYPE_CODES[x.dtype], channels, True)
    preferred = kvcore._native.analyze_layout(raw, DTYPE_CODES[x.dtype], channels, True, rotated_preferred=True)
    assert by_estimate["rotate"] is False and preferred["rotate"] is True
    assert sum(preferred["plane_entropy"]) < sum(by_estimate["plane_entropy"]) + ROTATED_ALLOWANCE
    frame = kvcore.compress(x, mode="dense")
    info = kvcore.frame_info(frame)
    assert info["layout"]["rotate"] is True
    assert info["methods"]["lowbits"]["planes"] == info["n_blocks"]
    assert torch.equal(kvcore.decompress(frame).view(torch.int16), x.view(torch.int16))
    # Rows spread over the file, just below and just above the minimum size.
    rows = x.reshape(-1, channels)[::288]
    for n, rotates in ((ROTATED_MIN_ELEMS // channels, False), (ROTATED_MIN_ELEMS // channels + 1, True)):
        part = rows[:n].contiguous().view(torch.uint8).numpy()
        assert kvcore._native.analyze_layout(part, DTYPE_CODES[x.dtype], channels, True)["rotate"] is False
        got = kvcore._native.analyze_layout(part, DTYPE_CODES[x.dtype], channels, True, rotated_preferred=True)
        assert got["rotate"] is rotates


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_dense_rotates_float8(dtype):
    """A float8 tensor's one plane estimates the same in both layouts (rotation permutes the byte's
    values), and dense mode takes the rotated one: the low-bits split then takes the sign off
    with the low mantissa bits, leaving exponent symbols."""
    from kvdata import stacked

    x = stacked("minilm_l6_kv_bf16.safetensors")[:, :512].to(dtype)
    raw = x.reshape(-1).view(torch.uint8).numpy()
    channels = x.shape[-1] * x.shape[-2]
    code = DTYPE_CODES[dtype]
    by_estimate = kvcore._native.analyze_layout(raw, code, channels, True)
    preferred = kvcore._native.analyze_layout(raw, code, channels, True, rotated_preferred=True)
    assert by_estimate["rotate"] is False and preferred["rotate"] is True
    assert preferred["plane_entropy"] == pytest.approx(by_estimate["plane_entropy"], abs=1e-12)
    frame = kvcore.compress(x, mode="dense")
    info = kvcore.frame_info(frame)
    assert info["layout"]["rotate"] is True and info["methods"]["lowbits"]["planes"] == info["n_blocks"]
    assert torch.equal(kvcore.decompress(frame).view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("name, rotates", [("stories260k_text_kv_bf16.safetensors", True),
                                           ("minilm_l6_kv_bf16.safetensors", False)])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_max_codes_float8_in_both_layouts(name, rotates, dtype):
    """Max mode codes a large float8 tensor in both layouts (their estimates tie) and keeps the
    smaller: on the whole kvdata files stories260K's comes out rotated, MiniLM's plain, neither
    larger than dense mode's (rotated) frame but for a few bytes (max mode picks its channel
    groups by estimate). Below 65536 elements it codes the plain layout only."""
    from kvdata import stacked

    x = stacked(name).to(dtype)
    raw = x.reshape(-1).view(torch.uint8).numpy()
    channels = x.shape[-1] * x.shape[-2]
    code = DTYPE_CODES[dtype]
    assert kvcore._native.analyze_layout(raw, code, channels, True, True)["try_rotated"] is True
    assert kvcore._native.analyze_layout(raw, code, channels, True, False, rotated_preferred=True)["try_rotated"] is False
    small = raw[: (ROTATED_MIN_ELEMS - 1) // channels * channels]
    assert kvcore._native.analyze_layout(small, code, channels, True, True)["try_rotated"] is False
    best = kvcore.compress(x, mode="max")
    dense = kvcore.compress(x, mode="dense")
    assert kvcore.frame_info(best)["layout"]["rotate"] is rotates
    assert kvcore.frame_info(dense)["layout"]["rotate"] is True
    assert len(best) < 1.0001 * len(dense)
    assert torch.equal(kvcore.decompress(best).view(torch.uint8), x.view(torch.uint8))
    # The same frame into a caller's buffer and in a batch (whose other frame is too small to try).
    buf = bytearray(kvcore.max_frame_size(x.dtype, x.shape))
    assert bytes(kvcore.compress(x, mode="max", out=buf)) == best
    assert kvcore.compress_many([x, x[0, :100]], mode="max")[0] == best


# ---- dense mode weighs the residual against its channel groups ----

def real_channel_frames(name: str, tokens: int = 256) -> list[torch.Tensor]:
    """[tokens, 8, 128] K frames whose 1024 channels are each one real channel over `tokens`
    tokens: three layers' 384 channels side by side (as bench/kvbench.py's qwen_chunk)."""
    from kvdata import tensors

    ts = tensors(name)
    layers = sorted(k for k in ts if k.endswith(".k"))
    out = []
    for i in range(len(layers)):
        parts = [ts[layers[(i + q) % len(layers)]].reshape(ts[layers[0]].shape[0], -1)[37 * i:37 * i + tokens]
                 for q in range(3)]
        out.append(torch.cat(parts, dim=1)[:, :1024].reshape(tokens, 8, 128).contiguous())
    return out


def scaled_channels(rows: int, spread: int, seed: int) -> torch.Tensor:
    """bf16 [rows, 8, 128]: each channel normal with its own scale 2^k, k uniform in [-spread, spread]."""
    g = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-spread, spread + 1, (1024,), generator=g).float()
    return (torch.randn(rows, 1024, generator=g) * scale).to(torch.bfloat16).reshape(rows, 8, 128)


def analysed_residual_of(x: torch.Tensor, channel_coded: bool, channels: int, fixed_width: bool = False) -> bool:
    got = kvcore._native.analyze_layout(x.reshape(-1).view(torch.uint8).numpy(), DTYPE_CODES[x.dtype], channels,
                                        channel_coded, False, fixed_width)
    return got["residual"] is not None


def analysed_residual(x: torch.Tensor, channel_coded: bool, fixed_width: bool = False) -> bool:
    return analysed_residual_of(x, channel_coded, 1024, fixed_width)


def test_dense_and_fast_drop_a_residual_their_coders_do_not_gain_from():
    """Real K frames (and channels whose scales differ by a few times): the order-0 estimate (what
    DEFLATE frames go by) finds a residual worth its table, but dense mode's channel groups already
    capture the channels' shifts, and fast mode's fixed-width code is no narrower for it, so
    neither mode's frames have one (fast frames took it until 2026-12-05, and 37 of the 52 chunk
    frames that did came out larger for it)."""
    frames = real_channel_frames("minilm_l6_kv_bf16.safetensors") + [scaled_channels(256, 1, 7)]
    proposed = [x for x in frames if analysed_residual(x, False)]
    assert len(proposed) >= 3, "the order-0 estimate must propose a residual for some of these frames"
    for x in proposed:
        assert not analysed_residual(x, True)
        assert not analysed_residual(x, False, fixed_width=True)
        for mode in ("dense", "fast"):
            frame = bytes(kvcore.compress(x, mode=mode, threads=1))
            assert frame_layout.residual(frame) is None
            assert torch.equal(kvcore.decompress(frame).view(torch.int16), x.view(torch.int16))


@pytest.mark.parametrize("rows", [256, 2048])
def test_fast_keeps_a_residual_that_narrows_its_code(rows):
    """Channel scales spread over 2^-20..2^20: the top bytes span 41 exponent offsets more than
    each channel's own, so without the residual the fixed-width code would be wider, and fast
    mode keeps it."""
    x = scaled_channels(rows, 20, rows)
    assert analysed_residual(x, False, fixed_width=True)
    frame = bytes(kvcore.compress(x, mode="fast", threads=1))
    assert frame_layout.residual(frame) is not None
    assert torch.equal(kvcore.decompress(frame).view(torch.int16), x.view(torch.int16))


@pytest.mark.parametrize("rows", [256, 2048])
def test_dense_keeps_a_residual_that_channel_groups_cannot_match(variant, rows):
    """Channel scales spread over 2^-20..2^20: eight groups cannot follow 41 exponent offsets, the
    residual aligns them, and dense mode keeps it (in every SIMD variant: the kept channel values
    come from frame/value_counts)."""
    x = scaled_channels(rows, 20, rows)
    assert analysed_residual(x, True)
    frame = bytes(kvcore.compress(x, mode="dense", threads=1))
    u = x.view(torch.int16).numpy().astype(np.uint16).reshape(rows, 1024)
    tops = ((((u << 1) | (u >> 15)) & 0xFFFF) >> 8).astype(np.uint8)
    assert frame_layout.residual(frame) == expected_modes(tops)
    assert torch.equal(kvcore.decompress(frame).view(torch.int16), x.view(torch.int16))


@pytest.mark.parametrize("channels", [2, 8, 257, 1000, 4096])
def test_dense_residual_estimate_at_any_channel_count(channels):
    """The estimate samples every stride-th channel (at most 256 of them): widely spread scales keep
    the residual at any channel count, except where each channel has a group of its own (up to
    eight channels), which then captures every shift; round trips are exact either way."""
    g = torch.Generator().manual_seed(channels)
    scale = 2.0 ** torch.randint(-20, 21, (channels,), generator=g).float()
    x = (torch.randn(128, channels, generator=g) * scale).to(torch.bfloat16)
    x = x.reshape(128, 2, channels // 2) if channels % 2 == 0 else x.reshape(128, 1, channels)
    assert analysed_residual_of(x, False, channels)
    assert analysed_residual_of(x, True, channels) == (channels > 8)
    for mode in ("dense", "fast"):
        frame = bytes(kvcore.compress(x, mode=mode, threads=1))
        assert (frame_layout.residual(frame) is not None) == (mode == "fast" or channels > 8)
        assert torch.equal(kvcore.decompress(frame).view(torch.int16), x.view(torch.int16))


# ---- max mode: the rotated layout's estimate counts the signs method in ----

def sign_runs(rows: int, channels: int, run: int, seed: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """[rows, channels // 128, 128] of dtype (fp16 or fp32) whose sign is a fair coin over the tensor but constant over
    runs of `run` tokens of a channel (run=1: independent), and whose negative values are larger
    (so the plain layout, which codes sign and exponent together, estimates smaller than the
    rotated one)."""
    g = torch.Generator().manual_seed(seed)
    runs = torch.randint(0, 2, (-(-rows // run), channels), generator=g).bool()
    negative = runs.repeat_interleave(run, dim=0)[:rows]
    magnitude = torch.randn(rows, channels, generator=g).abs()
    x = torch.where(negative, -4 * magnitude, magnitude)
    return x.to(dtype).reshape(rows, channels // 128, 128)


def analysis_of(x: torch.Tensor, signs_coded: bool) -> dict:
    channels = x.shape[-1] * x.shape[-2]
    return kvcore._native.analyze_layout(x.reshape(-1).view(torch.uint8).numpy(), DTYPE_CODES[x.dtype], channels,
                                         True, signs_coded)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [64, 256, 2048])
def test_max_rotates_where_the_signs_method_pays(rows, dtype):
    """Signs constant over 8-token runs: the plain layout estimates smaller (sign and exponent
    depend on each other), but coded 8 rows to a byte the signs cost about 1/8 bit instead of 1,
    so max mode rotates, and its frame comes out smaller than the dense (plain) one."""
    x = sign_runs(rows, 1024, 8, seed=rows, dtype=dtype)
    assert analysis_of(x, False)["rotate"] is False
    got = analysis_of(x, True)
    assert got["rotate"] is True
    assert 0.6 < got["sign_saving"] < 0.9  # 1 - 1/8 bits, less the estimate's caution
    dense = kvcore.compress(x, mode="dense", threads=1)
    best = kvcore.compress(x, mode="max", threads=1)
    assert kvcore.frame_info(dense)["layout"]["rotate"] is False
    info = kvcore.frame_info(best)
    assert info["layout"]["rotate"] is True and info["methods"]["signs"]["planes"] >= 1
    assert len(best) < 0.98 * len(dense)
    bits = torch.int16 if dtype == torch.float16 else torch.int32
    assert torch.equal(kvcore.decompress(best).view(bits), x.view(bits))


def test_max_keeps_the_plain_layout_where_signs_are_coin_flips():
    """Independent fair signs: coding them by channel saves nothing, so the estimate stays near 0
    and max mode keeps the plain layout, as dense does."""
    x = sign_runs(2048, 1024, 1, seed=3)
    got = analysis_of(x, True)
    assert got["rotate"] is False
    assert got["sign_saving"] < 0.01
    assert kvcore.frame_info(kvcore.compress(x, mode="max", threads=1))["layout"]["rotate"] is False


def test_no_sign_estimate_below_the_rows_the_signs_method_needs():
    x = sign_runs(63, 1024, 8, seed=4)
    got = analysis_of(x, True)
    assert got["rotate"] is False and got["sign_saving"] == 0


def test_no_sign_estimate_where_rotation_wins_anyway():
    """bf16 KV: the rotated layout wins on its planes alone, so the signs are not sampled."""
    from kvdata import stacked

    x = stacked("minilm_l6_kv_bf16.safetensors")[:2, :512].contiguous()
    got = analysis_of(x, True)
    assert got["rotate"] is True and got["sign_saving"] == 0


def test_max_rotates_real_fp16_kv():
    """MiniLM's fp16 K/V: max rotates, for the signs method (dense rotates for speed and stores
    the signs raw), and comes out at least 0.5% smaller."""
    from kvdata import stacked

    x = stacked("minilm_l6_kv_fp16.safetensors")
    dense = kvcore.compress(x, mode="dense")
    best = kvcore.compress(x, mode="max")
    info = kvcore.frame_info(best)
    assert info["layout"]["rotate"] is True and info["methods"]["signs"]["planes"] >= 1
    assert len(best) < 0.995 * len(dense)
    assert torch.equal(kvcore.decompress(best).view(torch.int16), x.view(torch.int16))

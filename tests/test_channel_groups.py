"""The channel-grouped coder's map (csrc/entropy/channel_groups.cpp, docs/FORMAT.md): channels
ranked by their mean symbol over the rows it samples (every (rows // 512)-th row), ties in
channel order, and cut into G equal fine groups by rank."""

import numpy as np
import pytest
import torch

import kvcore

import frame_layout
import kvdata

GROUPED = 6  # plane method number
RANK_ROWS = 512
FINE_GROUPS = 8
COARSE_MAP_ROWS = 128


def expected_groups(plane: np.ndarray, groups: int) -> list:
    rows, channels = plane.shape
    step = max(1, rows // RANK_ROWS)
    sums = plane[::step].astype(np.int64).sum(axis=0)
    order = np.argsort(sums, kind="stable")
    group = [0] * channels
    for rank, c in enumerate(order):
        group[c] = rank * groups // channels
    return group


# Sums of one, two and three bytes (the encoder's radix sort skips the bytes all sums share),
# and channel counts that do not split into its four equal parts.
@pytest.mark.parametrize("rows,channels,widest", [(600, 40, 64), (2000, 96, 64), (4096, 128, 64), (1000, 38, 256),
                                                  (300, 50, 64)])
def test_channels_are_grouped_by_their_rank(rows, channels, widest):
    """uint8 planes whose channels differ in spread (so grouping pays), with many equal
    channel sums (ties), coded in one block."""
    g = np.random.default_rng(rows + channels)
    spread = g.integers(1, widest, channels)
    spread[::4] = spread[1::4][: len(spread[::4])]  # channels with the same distribution
    x = g.integers(0, 1 << 30, (rows, channels)) % spread
    x[:, ::7] = 3  # constant channels: equal sums
    check_groups(x.astype(np.uint8))


@pytest.mark.parametrize("rows,channels,width,populations",
                         [(16, 200, 4, 4), (16, 203, 4, 4), (20, 256, 3, 4), (16, 203, 4, 2), (24, 64, 4, 2)])
def test_channels_with_sums_below_256_are_grouped_by_their_rank(rows, channels, width, populations):
    """Few rows of small values: every sum fits in one byte (one radix pass). Four populations
    of channels map four groups (2 bits a channel), two map two (1 bit: the decoder's
    eight-channels-a-byte path, and its tail where the channels are not a multiple of 8)."""
    g = np.random.default_rng(rows * channels)
    base = width * (4 // populations) * g.integers(0, populations, channels)  # values below 4 * width
    x = base + g.integers(0, width, (rows, channels))
    x[:, 1] = x[:, 0]  # equal sums
    assert x.sum(axis=0).max() < 256
    assert check_groups(x.astype(np.uint8)) == populations


def check_groups(x: np.ndarray) -> int:
    rows, channels = x.shape
    t = torch.from_numpy(x).reshape(rows, 1, channels)  # channels: the last two dimensions, also for few rows
    # Max mode: grouped wherever it estimates smaller (dense mode also charges each table for its
    # decode time, which these small planes do not repay).
    frame = bytes(kvcore.compress(t, mode="max", threads=1, block_bytes=rows * channels))
    planes = [p for p in frame_layout.block_planes(frame) if p[2] == GROUPED]
    assert len(planes) == 1, kvcore.frame_info(frame)["methods"]
    payload = planes[0][3]
    # The map is packed (G's top bit): the fine groups' ranks, or on planes of under 128
    # rows the coarse groups they make up (G = K), in as few bits a channel as G needs.
    assert payload[0] & 0x80
    groups, k = payload[0] & 0x7F, payload[1]
    assert groups == (k if rows < COARSE_MAP_ROWS else FINE_GROUPS)
    width = (groups - 1).bit_length()
    bits = int.from_bytes(payload[2 : 2 + (channels * width + 7) // 8], "little")
    got = [(bits >> (width * c)) & ((1 << width) - 1) for c in range(channels)]
    assert got == [g * groups // FINE_GROUPS for g in expected_groups(x, FINE_GROUPS)]
    assert torch.equal(kvcore.decompress(frame), t)
    return groups


def grouped_planes(frame: bytes) -> int:
    return sum(p[2] == GROUPED for p in frame_layout.block_planes(bytes(frame)))


@pytest.mark.parametrize("rows", [16, 31])
def test_dense_mode_groups_short_planes_only_where_groups_may_pay(rows):
    """Planes of 16-31 rows: dense mode tries channel groups only where the channels' means
    explain enough of the symbols' variance to pay for the map and the second table's decode
    charge (csrc/entropy/channel_groups.cpp, channel_groups_may_pay), max mode always. Two
    populations of channels 20 binades apart: both modes group, into the same frame. Real KV
    of one layer (rows from the middle of every MiniLM and stories260K tensor, 384 and 64
    channels): dense mode does not group."""
    g = torch.Generator().manual_seed(rows)
    scale = torch.where(torch.arange(256) % 2 == 0, 1e-3, 1e3).reshape(4, 64)
    apart = (torch.randn(rows, 4, 64, generator=g) * scale).to(torch.bfloat16)
    dense, most = kvcore.compress(apart), kvcore.compress(apart, mode="max")
    assert grouped_planes(dense) == 1 and dense == most
    assert torch.equal(kvcore.decompress(dense), apart)
    tensors = [*kvdata.stacked("minilm_l6_kv_bf16.safetensors"), *kvdata.stacked("stories260k_text_kv_bf16.safetensors")]
    for t in tensors:  # [tokens, heads, dim] each
        x = t[1000:1000 + rows].contiguous()
        dense = kvcore.compress(x)
        assert grouped_planes(dense) == 0
        assert torch.equal(kvcore.decompress(dense), x)


def exponent_eta2(page: torch.Tensor) -> float:
    """The share of the rotated bf16 exponents' variance that the channel means explain."""
    v = page.contiguous().view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    top = ((v << 1 | v >> 15) >> 8 & 0xFF).reshape(page.shape[0], -1).astype(np.float64)
    return float(((top.mean(axis=0) - top.mean()) ** 2).mean() / top.var())


def test_dense_mode_groups_pages_where_the_estimate_pays():
    """16-token pages of 1024 channels (three MiniLM layers side by side, as the bench's
    Qwen-shaped chunk): dense mode groups the exponents of some pages and not of others, and
    only of pages where eta2 * N >= 2 ln 2 (C + 2048), the rule's necessary condition. Each
    round trips, and a page it groups is smaller than the same page coded as one channel
    (no grouping possible) less the header bytes that layout adds."""
    ts = kvdata.stacked("minilm_l6_kv_bf16.safetensors")  # [tensors, tokens, heads, dim]
    flat = ts.reshape(ts.shape[0], ts.shape[1], -1)
    grouped_pages = pages = 0
    for start in range(0, 1280, 64):
        for first in range(0, ts.shape[0] - 2, 3):
            pages += 1
            page = torch.cat([flat[first + q, start : start + 16] for q in range(3)], dim=1)[:, :1024]
            page = page.reshape(16, 8, 128).contiguous()
            frame = kvcore.compress(page, threads=1)
            assert torch.equal(kvcore.decompress(frame), page)
            if grouped_planes(frame):
                grouped_pages += 1
                assert exponent_eta2(page) * page.numel() >= 2 * np.log(2) * (1024 + 2048)
                one_channel = kvcore.compress(page.reshape(-1), threads=1)  # 16384 > 4096: one channel
                assert len(frame) < len(one_channel)
    assert 0 < grouped_pages < pages

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


@pytest.mark.parametrize("rows,channels,width", [(16, 200, 4), (16, 203, 4), (20, 256, 3)])
def test_channels_with_sums_below_256_are_grouped_by_their_rank(rows, channels, width):
    """Few rows of small values: every sum fits in one byte (one radix pass)."""
    g = np.random.default_rng(rows * channels)
    base = width * g.integers(0, 4, channels)  # four distinct distributions; values below 4 * width
    x = base + g.integers(0, width, (rows, channels))
    x[:, 1] = x[:, 0]  # equal sums
    assert x.sum(axis=0).max() < 256
    check_groups(x.astype(np.uint8))


def check_groups(x: np.ndarray) -> None:
    rows, channels = x.shape
    t = torch.from_numpy(x).reshape(rows, 1, channels)  # channels: the last two dimensions, also for few rows
    # Max mode: grouped wherever it estimates smaller (dense mode also charges each table for its
    # decode time, which these small planes do not repay).
    frame = bytes(kvcore.compress(t, mode="max", threads=1, block_bytes=rows * channels))
    planes = [p for p in frame_layout.block_planes(frame) if p[2] == GROUPED]
    assert len(planes) == 1, kvcore.frame_info(frame)["methods"]
    payload = planes[0][3]
    groups = payload[0]
    got = [(payload[2 + c // 2] >> (4 * (c & 1))) & 15 for c in range(channels)]
    assert got == expected_groups(x, groups)
    assert torch.equal(kvcore.decompress(frame), t)


def grouped_planes(frame: bytes) -> int:
    return sum(p[2] == GROUPED for p in frame_layout.block_planes(bytes(frame)))


@pytest.mark.parametrize("rows", [16, 31])
def test_dense_mode_groups_short_planes_only_where_groups_may_pay(rows):
    """Planes of 16-31 rows: dense mode tries channel groups only where the channels' means
    explain enough of the symbols' variance to pay for the map (csrc/entropy/channel_groups.cpp,
    channel_groups_may_pay), max mode always. Two populations of channels 20 binades apart:
    both modes group, into the same frame. Real KV (rows from the middle of every MiniLM and
    stories260K tensor): dense mode does not group."""
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

"""The encoder's choice of layout (csrc/frame/analysis.cpp): the RESIDUAL table holds each
channel's most common top byte, over the 64 rows the analysis samples (rows k * (rows // 64)),
the smallest value on ties. Channels whose sampled bytes span a narrow range and those with a
wide one (outliers, integers) are counted two different ways; both are checked here."""

import numpy as np
import pytest
import torch

import kvcore

import frame_layout

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


@pytest.mark.parametrize("rows", [100, 1000, 4097])
@pytest.mark.parametrize("spread", [1, 4, 20, 30])
@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_residual_is_each_channels_mode(rows, spread, mode):
    x = channel_data(rows, 48, spread, rows * 31 + spread)
    frame = bytes(kvcore.compress(x, mode=mode, threads=1))
    residual = frame_layout.residual(frame)
    assert residual is not None, "channels this distinct must get a residual table"
    assert residual == expected_modes(x.numpy())
    assert torch.equal(kvcore.decompress(frame), x)


def test_residual_of_rotated_bfloat16():
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

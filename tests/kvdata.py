"""Loading the real KV tensors of ../shared/kvdata for tests."""

from functools import lru_cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kvcore.bench.data import kvdata_dir

KVDATA = kvdata_dir()


def files() -> list[Path]:
    return sorted(KVDATA.glob("*.safetensors"))


@lru_cache(maxsize=8)
def tensors(name: str) -> dict[str, torch.Tensor]:
    """The tensors of one file; a test that names a file not present is skipped."""
    path = KVDATA / name
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    return load_file(str(path))


def stacked(name: str) -> torch.Tensor:
    """All tensors of a file stacked as [tensors, tokens, heads, dim]."""
    ts = tensors(name)
    return torch.stack([ts[k] for k in sorted(ts)])

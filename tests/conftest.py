"""Shared fixtures: the real KV tensors in ../shared/kvdata and ISA variants."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KVDATA = ROOT.parent / "shared" / "kvdata"
MODELS = ROOT.parent / "shared" / "models"


def kvdata_files() -> list[Path]:
    return sorted(KVDATA.glob("*.safetensors"))


@pytest.fixture(scope="session")
def kvdata_dir() -> Path:
    if not KVDATA.is_dir():
        pytest.skip("../shared/kvdata is not present")
    return KVDATA

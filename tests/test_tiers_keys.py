"""Chunk keys: stable hash chain, namespace isolation, identical across processes."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kvcore.errors import InvalidArgumentError
from kvcore.tiers.keys import Namespace, chunk_keys

ROOT = Path(__file__).resolve().parent.parent


def test_chain_prefix_property():
    toks = list(range(1000))
    a = chunk_keys(toks, "m", 256)
    b = chunk_keys(toks[:512], "m", 256)
    assert [k.digest for k in a[:2]] == [k.digest for k in b]
    assert [(k.start, k.ntokens, k.index) for k in a] == [(0, 256, 0), (256, 256, 1), (512, 256, 2),
                                                          (768, 232, 3)]
    assert len({k.digest for k in a}) == 4
    assert all(len(k.digest) == 16 for k in a)


def test_key_depends_on_whole_prefix():
    a = chunk_keys([1] * 256 + [2] * 256, "m", 256)
    b = chunk_keys([3] * 256 + [2] * 256, "m", 256)
    assert a[1].digest != b[1].digest  # same tokens in chunk 1, different prefix


def test_full_only_and_input_kinds():
    toks = list(range(300))
    assert len(chunk_keys(toks, "m", 256, full_only=True)) == 1
    a = chunk_keys(toks, "m", 100)
    assert [k.digest for k in chunk_keys(np.arange(300, dtype=np.int32), "m", 100)] == [k.digest for k in a]
    assert [k.digest for k in chunk_keys(torch.arange(300), "m", 100)] == [k.digest for k in a]
    assert chunk_keys([], "m", 256) == []
    with pytest.raises(InvalidArgumentError):
        chunk_keys([1.5, 2.0], "m", 256)
    with pytest.raises(InvalidArgumentError):
        chunk_keys([[1, 2]], "m", 256)
    with pytest.raises(InvalidArgumentError):
        chunk_keys([1], "m", 0)


@pytest.mark.parametrize("chunk_tokens", [1.5, "256", True, None, 2**64])
def test_chunk_tokens_must_be_an_int(chunk_tokens):
    """A float or str raised TypeError, True made chunks of 1 token, 2**64 passed."""
    with pytest.raises(InvalidArgumentError):
        chunk_keys([1, 2, 3], "m", chunk_tokens)


@pytest.mark.parametrize("field,value", [("model_id", "other"), ("dtype", "float16"), ("layout", "LTKHD"),
                                         ("tp_rank", 1), ("tp_world", 4), ("salt", "tenant-b")])
def test_namespace_fields_isolate(field, value):
    base = dict(model_id="m", dtype="bfloat16", layout="LKTHD", tp_rank=0, tp_world=2, salt="tenant-a")
    other = dict(base, **{field: value})
    k1 = chunk_keys(range(10), Namespace(**base), 256)[0].digest
    k2 = chunk_keys(range(10), Namespace(**other), 256)[0].digest
    assert k1 != k2


def test_namespace_validation():
    with pytest.raises(InvalidArgumentError):
        Namespace("m", tp_rank=2, tp_world=2)
    assert len(Namespace("m").tag) == 16
    with pytest.raises(InvalidArgumentError):
        chunk_keys([1], 42, 256)


_SCRIPT = """
import sys
from kvcore.tiers.keys import Namespace, chunk_keys
ns = Namespace("Qwen/Qwen3-8B", "bfloat16", tp_rank=1, tp_world=2, salt="s")
toks = [(i * 7919) % 151936 for i in range(1000)]
print(hash("x"), ",".join(k.hex for k in chunk_keys(toks, ns, 256)))
"""


def test_keys_identical_across_processes_and_hash_seeds():
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT)))
             for seed in ("1", "2")]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        outs.append(out.split())
    assert outs[0][0] != outs[1][0]  # Python's hash() really differs between the two
    assert outs[0][1] == outs[1][1]
    ns = Namespace("Qwen/Qwen3-8B", "bfloat16", tp_rank=1, tp_world=2, salt="s")
    toks = [(i * 7919) % 151936 for i in range(1000)]
    assert outs[0][1] == ",".join(k.hex for k in chunk_keys(toks, ns, 256))


def test_known_value():
    # Pins the key format: a change here breaks every stored cache.
    assert chunk_keys([1, 2, 3], Namespace("m"), 256)[0].hex == KNOWN
    assert chunk_keys([1, 2, 3], "m", 256)[0].hex == KNOWN  # a str is the model id


KNOWN = "9cc663abeb716d216d1b8a4758e694f8"

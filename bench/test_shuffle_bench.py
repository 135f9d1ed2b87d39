"""Byte-plane shuffle throughput on a real bf16 KV cache, against memcpy in the same run.

Target (issue 2): split and merge alone at >= 80% of memcpy throughput, single thread,
bf16, 37.7 MB. GB/s = extra_info["bytes"] / time.

    python -m pytest bench/test_shuffle_bench.py --benchmark-columns=min,mean,median
"""

import numpy as np
import pytest

import kvcore
from kvcore import _native
from kvcore.bench.data import kvdata_dir

KVDATA = kvdata_dir()
BF16 = KVDATA / "minilm_l6_kv_bf16.safetensors"
ROUNDS = 8


@pytest.fixture(scope="module")
def kv():
    """All tensors of the MiniLM bf16 file concatenated (37.7 MB), as uint8, plus its channel count."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    if not BF16.exists():
        pytest.skip(f"{BF16} is not present")
    tensors = st.load_file(str(BF16))
    first = next(iter(tensors.values()))
    period = first.shape[-2] * first.shape[-1]  # kv_heads * head_dim = 384
    data = torch.cat([t.reshape(-1) for t in tensors.values()]).view(torch.uint8).numpy().copy()
    # Residual: each channel's most common rotated top byte (what the codec subtracts).
    top = np.frombuffer(_native.shuffle_split(data, 2, True)[1], np.uint8).reshape(-1, period)
    residual = bytes(int(np.bincount(col, minlength=256).argmax()) for col in top.T)
    kvcore.set_disabled_isa("")
    return data, residual


MODES = {"plain": (False, False), "rotate": (True, False), "rotate+residual": (True, True)}


def _run(benchmark, group, name, fn, nbytes):
    benchmark.group = group
    benchmark.name = name
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["variant"] = kvcore.isa_variant()
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("direction", ["split", "merge"])
def test_memcpy_reference(benchmark, kv, direction):
    data, _ = kv
    dst = np.empty_like(data)
    _run(benchmark, f"shuffle bf16 {direction}", "memcpy (numpy.copyto)", lambda: np.copyto(dst, data), data.nbytes)
    assert np.array_equal(dst, data)


@pytest.mark.parametrize("mode", list(MODES))
def test_split(benchmark, kv, mode):
    data, residual = kv
    rotate, use_res = MODES[mode]
    res = residual if use_res else None
    planes = [np.empty(data.size // 2, np.uint8) for _ in range(2)]
    _run(
        benchmark,
        "shuffle bf16 split",
        f"kvcore split {mode}",
        lambda: _native.shuffle_split_into(data, 2, rotate, res, 0, planes),
        data.nbytes,
    )
    expected = _native.shuffle_split(data, 2, rotate, res, 0)
    assert all(np.array_equal(p, np.frombuffer(e, np.uint8)) for p, e in zip(planes, expected))


@pytest.mark.parametrize("mode", list(MODES))
def test_merge(benchmark, kv, mode):
    data, residual = kv
    rotate, use_res = MODES[mode]
    res = residual if use_res else None
    planes = [np.frombuffer(p, np.uint8) for p in _native.shuffle_split(data, 2, rotate, res, 0)]
    dst = np.empty_like(data)
    _run(
        benchmark,
        "shuffle bf16 merge",
        f"kvcore merge {mode}",
        lambda: _native.shuffle_merge_into(planes, 2, rotate, res, 0, dst),
        data.nbytes,
    )
    assert np.array_equal(dst, data)


def test_numpy_split_peer(benchmark, kv):
    data, _ = kv
    planes = np.empty((2, data.size // 2), np.uint8)

    def shuffle():
        planes[0] = data[0::2]
        planes[1] = data[1::2]

    _run(benchmark, "shuffle bf16 split", "numpy byte shuffle", shuffle, data.nbytes)
    assert np.array_equal(planes.T.reshape(-1), data)


def test_numpy_merge_peer(benchmark, kv):
    data, _ = kv
    planes = np.ascontiguousarray(data.reshape(-1, 2).T)
    dst = np.empty_like(data)
    pairs = dst.reshape(-1, 2)

    def unshuffle():
        pairs[:, 0] = planes[0]
        pairs[:, 1] = planes[1]

    _run(benchmark, "shuffle bf16 merge", "numpy byte unshuffle", unshuffle, data.nbytes)
    assert np.array_equal(dst, data)

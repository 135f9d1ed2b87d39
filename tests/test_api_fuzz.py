"""Random arguments to every public call: each either works or raises a kvcore error.

A wrong type or value must come back as a KVCoreError subclass (InvalidArgumentError
and friends), never as a TypeError from a dict lookup, an OverflowError from a
native conversion, an AttributeError from an object array, or a crash. The only
other exception allowed is Python's own call check (a missing or duplicated
argument). Found before this test: unhashable modes, backends and dtypes, sizes of
2**64, object arrays as blocks, bfloat16 tensors as token ids or indices, arrays as
engine names, Namespace fields of any type, PinnedBuffer views of non-dtypes, done
callbacks that are not callable (they failed later, on a kvcore thread).
"""

import math
import random

import numpy as np
import pytest
import torch

import kvcore
from kvcore.tiers import Namespace, RemoteConfig, TierConfig, TierManager

X = torch.randn(64, 4, 8).to(torch.bfloat16)
FRAME = kvcore.compress(X)


def junk() -> list:
    """Values of every kind the API meets: wrong types, edge numbers, real and broken frames."""
    return [
        None, True, -1, 0, 1, 7, 2**31, 2**63, 2**64, -2**63, 1.5, math.nan, math.inf, -0.0,
        "x", "", "dense", "fast", "max", "auto", "cpu", "dsa", "cuda", "software", "qat",
        b"", b"KVCF", FRAME, FRAME[:50], bytearray(FRAME), memoryview(FRAME), bytearray(100),
        [], [1, 2], [-1], [2**70], (1,), {}, {"a": 1}, object(), print,
        torch.float32, torch.bfloat16, np.float16, "bfloat16",
        X, X[:, ::2], X[:0], X.float(), torch.zeros(()), torch.zeros(3, dtype=torch.bool),
        torch.zeros(5, dtype=torch.complex64), torch.zeros(5, dtype=torch.int64), torch.empty_like(X),
        torch.empty(10, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), torch.empty(4097, dtype=torch.uint8)[1:],
        np.zeros(10, dtype=object), np.zeros((3, 3), dtype=np.complex64), np.zeros(4, dtype=bool),
        np.zeros(8, dtype=np.uint8)[::2], np.frombuffer(FRAME, dtype=np.uint8), np.array([2**63], dtype=np.uint64),
        [X, X], [FRAME, FRAME], [torch.empty_like(X)], [(X, X)], [(torch.empty_like(X), X)], [[X]],
        list(range(64)), [True] * 3, list(range(16)), torch.arange(64), np.arange(64), "m", Namespace("m", "bfloat16"),
        torch.randn(2, 2, 64, 2, 8).to(torch.bfloat16), torch.empty(2, 2, 16, 2, 8, dtype=torch.float16),
        torch.empty(2, 3, 64, 2, 8, dtype=torch.bfloat16),
        X.float().to_sparse(), torch.empty(64, 4, 8, device="meta"), torch._neg_view(X.float()),
        kvcore.analyze(X), kvcore.analyze(X.float(), mode="fast"), [kvcore.analyze(X)], [None, kvcore.analyze(X)],
    ]


def is_call_check(exc: TypeError) -> bool:
    text = str(exc)
    return "positional argument" in text or "keyword argument" in text or "multiple values for argument" in text \
        or "missing" in text


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    pool = kvcore.PinnedPool(1 << 20)
    tm = TierManager(ddr_bytes=8 << 20, chunk_tokens=16, ssd_dir=str(tmp_path_factory.mktemp("ssd")),
                     ssd_bytes=64 << 20)
    tm.store(list(range(64)), torch.randn(2, 2, 64, 2, 8).to(torch.bfloat16))
    tm.flush()

    def settle(call):
        return lambda *a, **k: call(*a, **k).result(10)

    def make_manager(*a, **k):
        TierManager(*a, **k).close()

    def on_buffer(method):
        def call(*a, **k):
            buf = pool.alloc(4096)
            try:
                getattr(buf, method)(*a, **k)
            finally:
                try:
                    buf.free()
                except kvcore.KVCoreError:  # a view of it still alive
                    pass
        return call

    def on_future(method):
        return lambda *a, **k: getattr(kvcore.compress_async(torch.randn(16, 16)), method)(*a, **k)

    table = {  # name: (callable, most positional arguments, keyword names)
        "compress": (kvcore.compress, 1, ["mode", "threads", "block_bytes", "backend", "out", "layout"]),
        "compress_many": (kvcore.compress_many, 1, ["mode", "threads", "block_bytes", "backend", "layouts"]),
        "analyze": (kvcore.analyze, 1, ["mode", "backend"]),
        "decompress": (kvcore.decompress, 1, ["out", "threads"]),
        "decompress_many": (kvcore.decompress_many, 2, ["threads", "on_done"]),
        "frame_desc": (kvcore.frame_desc, 1, []),
        "frame_info": (kvcore.frame_info, 1, []),
        "max_frame_size": (kvcore.max_frame_size, 2, ["block_bytes"]),
        "copy_async": (settle(kvcore.copy_async), 2, ["engine", "threads"]),
        "copy_many": (settle(kvcore.copy_many), 1, ["engine", "threads"]),
        "gather": (settle(kvcore.gather), 1, ["indices", "out", "engine", "threads"]),
        "scatter": (settle(kvcore.scatter), 2, ["indices", "engine", "threads"]),
        "compress_async": (settle(kvcore.compress_async), 1, ["mode", "threads", "block_bytes", "backend",
                                                              "layout"]),
        "decompress_async": (settle(kvcore.decompress_async), 1, ["out", "threads"]),
        "PinnedPool": (kvcore.PinnedPool, 1, ["huge_pages", "numa_node", "alignment", "max_segments"]),
        "PinnedPool.alloc": (pool.alloc, 1, ["timeout"]),
        "TierManager": (make_manager, 0, ["ddr_bytes", "chunk_tokens", "ssd_dir", "ssd_bytes", "codec", "policy",
                                          "allocator", "namespace", "ttl_s", "queue_chunks", "read_ahead"]),
    }
    table.update({
        "Namespace": (Namespace, 3, ["model_id", "dtype", "layout", "tp_rank", "tp_world", "salt"]),
        "TierConfig": (lambda *a, **k: TierConfig(*a, **k).validate(), 2,
                       ["ddr_bytes", "ssd_bytes", "chunk_tokens", "codec", "codec_threads", "policy", "allocator",
                        "namespace", "frame_bytes", "remote", "remote_url", "hot_refresh_s"]),
        "RemoteConfig": (lambda *a, **k: RemoteConfig(*a, **k).validate(), 2,
                         ["url", "ttl_s", "part_bytes", "workers", "prefix", "max_parts", "op_timeout_s"]),
        "PinnedBuffer.tensor": (on_buffer("tensor"), 2, ["dtype", "shape"]),
        "PinnedBuffer.numpy": (on_buffer("numpy"), 1, ["dtype"]),
        "Future.wait": (on_future("wait"), 1, ["timeout"]),
        "Future.result": (on_future("result"), 1, ["timeout"]),
        "Future.add_done_callback": (on_future("add_done_callback"), 1, []),
        "TierManager.store": (tm.store, 2, ["copy", "layer_dim", "pin", "priority", "ttl_s", "namespace"]),
        "TierManager.retrieve": (tm.retrieve, 2, ["on_layer", "namespace", "layer_dim"]),
    })
    for name in ["lookup", "evict", "pin", "unpin", "set_priority", "set_ttl", "prefetch", "estimate", "clear", "flush",
                 "persist", "keys"]:
        table["TierManager." + name] = (getattr(tm, name), 2, [])
    yield table
    tm.close()


@pytest.mark.parametrize("seed", range(4))
def test_random_arguments_raise_only_kvcore_errors(calls, seed):
    rng = random.Random(seed)
    values = junk()
    names = sorted(calls)
    for _ in range(1500):
        name = rng.choice(names)
        fn, n_positional, keywords = calls[name]
        args = [rng.choice(values) for _ in range(rng.randint(0, n_positional + 1))]
        kwargs = {k: rng.choice(values) for k in rng.sample(keywords, rng.randint(0, min(3, len(keywords))))}
        try:
            fn(*args, **kwargs)
        except kvcore.KVCoreError:
            pass
        except TypeError as exc:
            if not is_call_check(exc):
                raise AssertionError(f"{name}{tuple(map(type, args))} {list(kwargs)}: TypeError {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"{name}{tuple(map(type, args))} {list(kwargs)}: {type(exc).__name__} {exc}") from exc

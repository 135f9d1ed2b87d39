"""Chunk keys: a hash chain over token ids, stable across processes and machines.

A chunk is ``chunk_tokens`` consecutive token ids (the last chunk of a sequence may
be shorter). Its key is ``key_i = xxh3_128(key_{i-1} || namespace digest || tokens
of chunk i as little-endian int64)``, so a chunk's key names the whole prefix up to
and including it. Python's ``hash()`` is never used: the same tokens give the same
keys under every PYTHONHASHSEED, in every process, on every machine.

>>> from kvcore.tiers.keys import Namespace, chunk_keys
>>> ns = Namespace(model_id="Qwen/Qwen3-8B", dtype="bfloat16")
>>> keys = chunk_keys(list(range(600)), ns, chunk_tokens=256)
>>> [k.ntokens for k in keys]
[256, 256, 88]
>>> keys[0] == chunk_keys(list(range(256)), ns, 256)[0]
True
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import xxhash

from .._args import int_arg
from ..errors import InvalidArgumentError

KEY_VERSION = 1
_SEP = b"\x1f"


@dataclass(frozen=True)
class Namespace:
    """Everything that makes two caches incompatible; part of every key.

    model_id: the model's name or revision; dtype: the KV dtype ("bfloat16");
    layout: the KV layout ("LKTHD" = [layers, K/V, tokens, heads, dim]);
    tp_rank / tp_world: tensor-parallel position (each rank caches its own heads);
    salt: user-supplied isolation string (one per tenant).

    >>> Namespace("m").tag == Namespace("m").tag
    True
    >>> Namespace("m", salt="tenant-a").tag == Namespace("m", salt="tenant-b").tag
    False
    """

    model_id: str = "default"
    dtype: str = ""
    layout: str = "LKTHD"
    tp_rank: int = 0
    tp_world: int = 1
    salt: str = ""

    def __post_init__(self) -> None:
        for name in ("model_id", "dtype", "layout", "salt"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(f"Namespace.{name} must be a str, got {getattr(self, name)!r}")
        int_arg(self.tp_rank, "Namespace.tp_rank")
        int_arg(self.tp_world, "Namespace.tp_world", 1)
        if not (0 <= self.tp_rank < self.tp_world):
            raise InvalidArgumentError(f"tp_rank {self.tp_rank} is outside tp_world {self.tp_world}")

    @property
    def digest(self) -> bytes:
        """16 bytes that identify the namespace (xxh3-128 over a canonical encoding)."""
        fields = (
            f"kvcore-ns-v{KEY_VERSION}",
            self.model_id,
            self.dtype,
            self.layout,
            str(self.tp_rank),
            str(self.tp_world),
            self.salt,
        )
        blob = b"".join(struct.pack("<I", len(f.encode())) + f.encode() for f in fields)
        return xxhash.xxh3_128_digest(blob)

    @property
    def tag(self) -> str:
        """16 hex characters naming the namespace in file names and remote keys."""
        return self.digest[:8].hex()


NamespaceLike = Union[str, Namespace]


def as_namespace(namespace: NamespaceLike) -> Namespace:
    """A Namespace from a Namespace or a plain name (taken as the model id)."""
    if isinstance(namespace, Namespace):
        return namespace
    if isinstance(namespace, str):
        return Namespace(model_id=namespace)
    raise InvalidArgumentError(f"namespace must be a str or Namespace, not {type(namespace).__name__}")


@dataclass(frozen=True)
class ChunkKey:
    """One chunk's key: its 16-byte digest, position in the sequence and length, and
    the digest of the chunk it extends (its parent: None for chunk 0, or when unknown).
    Keys from chunk_keys also hold their parent's key (prev), so a key's whole prefix
    can be walked. Two keys are equal when their digests and places are: the rest is
    implied."""

    digest: bytes
    index: int  # chunk number in the sequence (0 = first)
    start: int  # first token position
    ntokens: int
    parent: Optional[bytes] = field(default=None, compare=False, repr=False)
    prev: Optional["ChunkKey"] = field(default=None, compare=False, repr=False)

    @property
    def hex(self) -> str:
        return self.digest.hex()

    @property
    def end(self) -> int:
        return self.start + self.ntokens


def tokens_array(tokens: Sequence[int]) -> np.ndarray:
    """Token ids as a little-endian int64 array (accepts lists, numpy arrays, tensors)."""
    if hasattr(tokens, "detach"):  # torch tensor
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex:  # .numpy() refuses some of them
            raise InvalidArgumentError(f"token ids must be integers, got {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidArgumentError(f"tokens must be a 1-D sequence of integer ids: {e}") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"tokens must be a 1-D sequence of ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"token ids must be integers, got {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and arr.max() > np.iinfo(np.int64).max:
        raise InvalidArgumentError("token ids must fit in 63 bits")
    return np.ascontiguousarray(arr, dtype="<i8")


def chunk_keys(
    tokens: Sequence[int],
    namespace: NamespaceLike,
    chunk_tokens: int = 256,
    *,
    full_only: bool = False,
) -> list[ChunkKey]:
    """The keys of every chunk of ``tokens`` (the shorter tail chunk included unless full_only).

    >>> ks = chunk_keys([1, 2, 3, 4, 5], "m", chunk_tokens=2)
    >>> [(k.start, k.ntokens) for k in ks]
    [(0, 2), (2, 2), (4, 1)]
    """
    chunk_tokens = int_arg(chunk_tokens, "chunk_tokens", 1)
    ns_digest = as_namespace(namespace).digest
    arr = tokens_array(tokens)
    out: list[ChunkKey] = []
    prev = b"\x00" * 16
    parent: Optional[ChunkKey] = None
    n = arr.size
    stop = (n // chunk_tokens) * chunk_tokens if full_only else n
    for index, start in enumerate(range(0, stop, chunk_tokens)):
        part = arr[start : min(start + chunk_tokens, stop)]
        h = xxhash.xxh3_128()
        h.update(prev)
        h.update(ns_digest)
        h.update(struct.pack("<I", part.size))
        h.update(part.tobytes())
        prev = h.digest()
        out.append(ChunkKey(prev, index, start, int(part.size), parent.digest if parent else None, parent))
        parent = out[-1]
    return out

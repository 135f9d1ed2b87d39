"""Other compressors that kvcore is measured against, behind one small interface.

Each peer is a :class:`Codec`: ``bind(tensor)`` returns a :class:`Bound` whose
``compress()`` and ``decompress(payload)`` are the zero-argument work a benchmark times,
``size(payload)`` the compressed size in bytes and ``equal(result)`` the bit-exact check.
Peers whose Python package is not installed are left out; :func:`missing_peers` says which
and why.

>>> import torch
>>> from kvcore.bench.peers import Memcpy
>>> b = Memcpy().bind(torch.arange(8, dtype=torch.float16))
>>> b.equal(b.decompress(b.compress()))
True
"""

from __future__ import annotations

import importlib
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

__all__ = [
    "Bound",
    "Codec",
    "ByteCodec",
    "Memcpy",
    "byte_shuffle",
    "byte_unshuffle",
    "peer_codecs",
    "missing_peers",
    "PEER_NAMES",
]


@dataclass
class Bound:
    """A codec bound to one input: the callables a benchmark times."""

    codec: "Codec"
    original_bytes: int
    compress: Callable[[], Any]
    decompress: Callable[[Any], Any]
    size: Callable[[Any], int]
    equal: Callable[[Any], bool]


class Codec:
    """A compressor under test. Subclasses set ``name`` and implement ``bind``."""

    name: str = "?"
    description: str = ""
    kind: str = "peer"  # "kvcore", "reference" (memcpy) or "peer"

    def applies(self, dtype: torch.dtype) -> bool:
        """Whether this codec is measured on data of ``dtype``."""
        return self.why_not(dtype) is None

    def why_not(self, dtype: torch.dtype) -> Optional[str]:
        """None when this codec is measured on data of ``dtype``, else why it is not."""
        return None

    def bind(self, data: torch.Tensor) -> Bound:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def as_bytes(data: torch.Tensor) -> np.ndarray:
    """The bytes of a tensor as a flat uint8 numpy array (a view when it is contiguous)."""
    t = data.detach().contiguous().reshape(-1)
    if t.element_size() != 1 or t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    return t.numpy()


def byte_shuffle(src: np.ndarray, itemsize: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Byte planes of ``src`` (uint8, length a multiple of itemsize): plane i holds byte i of
    each element. Written into ``out`` (uint8, same length) when given."""
    if itemsize == 1:
        return src
    if out is None:
        out = np.empty_like(src)
    planes = out.reshape(itemsize, -1)
    elems = src.reshape(-1, itemsize)
    for i in range(itemsize):  # one strided copy per plane: far faster than one transposed copy
        planes[i] = elems[:, i]
    return out


def byte_unshuffle(planes: np.ndarray, itemsize: int, out: np.ndarray) -> np.ndarray:
    """Inverse of :func:`byte_shuffle`, written into ``out`` (uint8, same length)."""
    if itemsize == 1:
        np.copyto(out, planes)
        return out
    p = planes.reshape(itemsize, -1)
    elems = out.reshape(-1, itemsize)
    for i in range(itemsize):
        elems[:, i] = p[i]
    return out


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _frombuffer(b: Any) -> np.ndarray:
    return b if isinstance(b, np.ndarray) else np.frombuffer(b, dtype=np.uint8)


class ByteCodec(Codec):
    """A peer working on the raw bytes of the tensor, with an optional byte shuffle first.

    Subclasses implement ``_compress(buf) -> payload`` and ``_decompress(payload, out) -> bytes-like``.
    """

    shuffle: bool = False
    raw_twin: bool = False  # the same coder is also a peer on the unshuffled bytes

    def why_not(self, dtype: torch.dtype) -> Optional[str]:
        # A byte shuffle of 1-byte elements does nothing: where the same coder also runs on the
        # unshuffled bytes, that run covers fp8. Otherwise the codec runs, without the shuffle.
        if self.shuffle and self.raw_twin and _itemsize(dtype) == 1:
            return f"a byte shuffle does nothing to 1-byte elements: {self.name.removesuffix('+shuffle')} covers it"
        return None

    def _compress(self, buf: np.ndarray, itemsize: int) -> Any:
        raise NotImplementedError

    def _decompress(self, payload: Any, out: np.ndarray, itemsize: int) -> Any:
        raise NotImplementedError

    def _size(self, payload: Any) -> int:
        return len(payload)

    def bind(self, data: torch.Tensor) -> Bound:
        src = as_bytes(data)
        itemsize = data.element_size()
        # The output checked bit-exact starts as the inverse of src: an empty buffer may be
        # memory that held an earlier decode of the same data, where a decoder that wrote
        # nothing would pass.
        out = np.invert(src)
        shuffled = self.shuffle and itemsize > 1
        planes_out = np.empty_like(src) if shuffled else None
        planes_in = np.empty_like(src) if shuffled else None  # reused shuffle buffer

        if shuffled:
            def compress() -> Any:
                return self._compress(byte_shuffle(src, itemsize, planes_in), itemsize)

            def decompress(payload: Any) -> np.ndarray:
                planes = _frombuffer(self._decompress(payload, planes_out, itemsize))
                return byte_unshuffle(planes, itemsize, out)
        else:
            def compress() -> Any:
                return self._compress(src, itemsize)

            def decompress(payload: Any) -> np.ndarray:
                return _frombuffer(self._decompress(payload, out, itemsize))

        def equal(result: Any) -> bool:
            r = _frombuffer(result)
            return r.shape == src.shape and bool(np.array_equal(r, src))

        return Bound(self, src.nbytes, compress, decompress, self._size, equal)


class Memcpy(ByteCodec):
    """numpy.copyto into a preallocated buffer: the speed of light for a decoder."""

    name = "memcpy"
    description = "numpy.copyto into a preallocated buffer"
    kind = "reference"

    def bind(self, data: torch.Tensor) -> Bound:
        src = as_bytes(data)
        dst1 = np.empty_like(src)
        dst2 = np.invert(src)  # checked bit-exact: starts unlike src (see ByteCodec.bind)

        def compress() -> np.ndarray:
            np.copyto(dst1, src)
            return dst1

        def decompress(payload: np.ndarray) -> np.ndarray:
            np.copyto(dst2, payload)
            return dst2

        def equal(result: np.ndarray) -> bool:
            return bool(np.array_equal(result, src))

        return Bound(self, src.nbytes, compress, decompress, lambda p: p.nbytes, equal)


class Zstd(ByteCodec):
    def __init__(self, level: int, shuffle: bool, threads: int = 1):
        import zstandard

        self.level, self.shuffle = level, shuffle
        self.raw_twin = shuffle  # zstd-<level> without the shuffle is a peer too
        self.name = f"zstd-{level}" + ("+shuffle" if shuffle else "")
        self.description = f"zstandard level {level}" + (" after byte shuffle" if shuffle else " on raw bytes")
        # zstandard: threads=0 compresses in the calling thread; n > 1 uses n workers.
        self._c = zstandard.ZstdCompressor(level=level, threads=0 if threads <= 1 else threads)
        self._d = zstandard.ZstdDecompressor()

    def _compress(self, buf: np.ndarray, itemsize: int) -> bytes:
        return self._c.compress(buf)

    def _decompress(self, payload: bytes, out: np.ndarray, itemsize: int) -> bytes:
        return self._d.decompress(payload, max_output_size=out.nbytes)


class Lz4(ByteCodec):
    name = "lz4"
    description = "lz4.block default mode on raw bytes"

    def __init__(self) -> None:
        import lz4.block

        self._lz4 = lz4.block

    def _compress(self, buf: np.ndarray, itemsize: int) -> bytes:
        return self._lz4.compress(buf, mode="default", store_size=True)

    def _decompress(self, payload: bytes, out: np.ndarray, itemsize: int) -> bytes:
        return self._lz4.decompress(payload)


class Blosc2(ByteCodec):
    """blosc2 with its SHUFFLE filter (typesize = element size) and LZ4 or ZSTD."""

    def __init__(self, codec: str, clevel: int, threads: int = 1):
        import blosc2

        self._b = blosc2
        self.codec_name, self.clevel, self.threads = codec, clevel, max(1, threads)
        self.name = f"blosc2-{codec.lower()}"
        self.description = f"blosc2 SHUFFLE + {codec} clevel {clevel}"
        self._codec = getattr(blosc2.Codec, codec)
        self._dparams = blosc2.DParams(nthreads=self.threads)

    def _compress(self, buf: np.ndarray, itemsize: int) -> bytes:
        b = self._b
        cp = b.CParams(
            codec=self._codec,
            clevel=self.clevel,
            typesize=itemsize,
            nthreads=self.threads,
            filters=[b.Filter.SHUFFLE],
            filters_meta=[0],
        )
        return b.compress2(buf, cparams=cp)

    def _decompress(self, payload: bytes, out: np.ndarray, itemsize: int) -> np.ndarray:
        self._b.decompress2(payload, dst=out, dparams=self._dparams)
        return out


class ZipNN(ByteCodec):
    """ZipNN (byte grouping + Huffman/zstd, chosen automatically) on the tensor's bytes."""

    name = "zipnn"
    _DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
               torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}

    def __init__(self, threads: int = 1):
        import zipnn

        self._zipnn = zipnn
        self.threads = max(1, threads)
        self.description = f"zipnn.ZipNN byte input, threads={self.threads}"
        self._by_dtype: dict[str, Any] = {}
        self.codes_fp8 = self._round_trips_fp8()

    def why_not(self, dtype: torch.dtype) -> Optional[str]:
        if dtype not in self._DTYPES:
            return f"zipnn has no {dtype} format"
        if _itemsize(dtype) == 1 and not self.codes_fp8:
            return "the installed zipnn fails a round trip of fp8 bytes (0.5.4 codes them)"
        return None

    def _round_trips_fp8(self) -> bool:
        """Whether the installed zipnn codes fp8 bytes (0.5.4 does: one byte group, Huffman)."""
        probe = bytes(range(256)) * 16
        try:
            z = self._zipnn.ZipNN(input_format="byte", bytearray_dtype="float8_e4m3fn", threads=1)
            return bytes(z.decompress(z.compress(bytearray(probe)))) == probe
        except Exception:  # an older zipnn: an unknown dtype name, or no 1-byte path
            return False

    def _get(self, name: str) -> Any:
        z = self._by_dtype.get(name)
        if z is None:
            z = self._zipnn.ZipNN(input_format="byte", bytearray_dtype=name, threads=self.threads)
            self._by_dtype[name] = z
        return z

    def bind(self, data: torch.Tensor) -> Bound:
        if not self.applies(data.dtype):
            raise ValueError(f"zipnn does not handle {data.dtype}")
        z = self._get(self._DTYPES[data.dtype])
        src = as_bytes(data)
        # ZipNN's byte API takes a bytearray; making it is input preparation, not compression.
        src_ba = bytearray(src.tobytes())

        def compress() -> bytes:
            return z.compress(src_ba)

        def decompress(payload: bytes) -> Any:
            return z.decompress(payload)

        def equal(result: Any) -> bool:
            r = np.frombuffer(result, dtype=np.uint8)
            return r.shape == src.shape and bool(np.array_equal(r, src))

        return Bound(self, src.nbytes, compress, decompress, len, equal)


class IsalIgzip(ByteCodec):
    """ISA-L igzip (raw deflate) level 1 after a byte shuffle."""

    shuffle = True

    def __init__(self, level: int = 1):
        from isal import isal_zlib

        self._iz = isal_zlib
        self.level = level
        self.name = f"isal-{level}+shuffle"
        self.description = f"ISA-L igzip raw deflate level {level} after byte shuffle"

    def _compress(self, buf: np.ndarray, itemsize: int) -> bytes:
        return self._iz.compress(buf, level=self.level, wbits=-15)

    def _decompress(self, payload: bytes, out: np.ndarray, itemsize: int) -> bytes:
        return self._iz.decompress(payload, wbits=-15, bufsize=out.nbytes)


class KvShrinkZlib(ByteCodec):
    """Byte shuffle, then zlib raw deflate at ``level`` in independent 256 KiB chunks.

    This is the CPU path of Intel's KV Shrink. The payload is the list of chunks; its size
    counts 4 bytes of length per chunk.
    """

    shuffle = True
    CHUNK = 256 * 1024

    def __init__(self, level: int = 6):
        self.level = level
        self.name = f"zlib-{level}+shuffle/256K"
        self.description = f"byte shuffle + zlib raw deflate level {level}, 256 KiB chunks (Intel KV Shrink CPU path)"

    def _compress(self, buf: np.ndarray, itemsize: int) -> list[bytes]:
        chunks = []
        mv = memoryview(buf)
        for i in range(0, len(mv), self.CHUNK):
            c = zlib.compressobj(self.level, zlib.DEFLATED, -15)
            chunks.append(c.compress(mv[i : i + self.CHUNK]) + c.flush())
        return chunks

    def _decompress(self, payload: list[bytes], out: np.ndarray, itemsize: int) -> np.ndarray:
        pos = 0
        for chunk in payload:
            d = zlib.decompress(chunk, -15, self.CHUNK)
            out[pos : pos + len(d)] = np.frombuffer(d, dtype=np.uint8)
            pos += len(d)
        if pos != out.nbytes:
            raise ValueError("zlib chunks decoded to the wrong size")
        return out

    def _size(self, payload: list[bytes]) -> int:
        return sum(len(c) + 4 for c in payload)


# name -> (factory(threads), python module it needs)
_PEERS: list[tuple[str, Callable[[int], Codec], str]] = [
    ("memcpy", lambda th: Memcpy(), "numpy"),
    ("zstd-1", lambda th: Zstd(1, False, th), "zstandard"),
    ("zstd-3", lambda th: Zstd(3, False, th), "zstandard"),
    ("zstd-1+shuffle", lambda th: Zstd(1, True, th), "zstandard"),
    ("zstd-3+shuffle", lambda th: Zstd(3, True, th), "zstandard"),
    ("lz4", lambda th: Lz4(), "lz4"),
    ("blosc2-lz4", lambda th: Blosc2("LZ4", 5, th), "blosc2"),
    ("blosc2-zstd", lambda th: Blosc2("ZSTD", 1, th), "blosc2"),
    ("zipnn", lambda th: ZipNN(th), "zipnn"),
    ("isal-1+shuffle", lambda th: IsalIgzip(1), "isal"),
    ("zlib-6+shuffle/256K", lambda th: KvShrinkZlib(6), "zlib"),
]

PEER_NAMES: list[str] = [name for name, _f, _m in _PEERS]


def _importable(module: str) -> Optional[str]:
    """None when ``module`` imports, else the reason it does not."""
    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def peer_codecs(threads: int = 1, names: Optional[list[str]] = None) -> list[Codec]:
    """The installed peers (all of :data:`PEER_NAMES`, or those in ``names``), in table order.

    ``threads`` goes to the peers that have a thread setting (zstd, blosc2, zipnn).
    """
    wanted = set(PEER_NAMES if names is None else names)
    unknown = wanted - set(PEER_NAMES)
    if unknown:
        raise ValueError(f"unknown peer(s) {sorted(unknown)}; known: {', '.join(PEER_NAMES)}")
    out = []
    for name, factory, module in _PEERS:
        if name in wanted and _importable(module) is None:
            out.append(factory(threads))
    return out


def missing_peers(names: Optional[list[str]] = None) -> dict[str, str]:
    """Peers that cannot run here: name -> which package is missing."""
    wanted = set(PEER_NAMES if names is None else names)
    out = {}
    for name, _factory, module in _PEERS:
        if name in wanted:
            why = _importable(module)
            if why is not None:
                out[name] = f"python package {module!r} is not installed ({why})"
    return out

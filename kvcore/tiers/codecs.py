"""How a tier manager turns one [tokens, heads, dim] slice into bytes and back.

``KvcoreCodec`` uses the lossless kvcore codec (kvcore.compress / kvcore.decompress);
``RawCodec`` stores the raw bytes (no compression: the baseline, and the fallback
when the native codec is not built).

>>> import torch
>>> from kvcore.tiers.codecs import RawCodec
>>> t = torch.ones(4, 2, 8, dtype=torch.bfloat16)
>>> out = torch.empty_like(t)
>>> RawCodec().decode_into(RawCodec().encode(t), out)
>>> torch.equal(out, t)
True
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Protocol

import numpy as np
import torch

from .._args import MODES, decoder_arg, mode_arg
from ..errors import CorruptFrameError, InvalidArgumentError
from ..runs import output_runs


class Codec(Protocol):
    code: int  # stored in every blob
    name: str

    def encode(self, t: torch.Tensor) -> bytes: ...

    def decode_into(self, frame, out: torch.Tensor) -> None: ...

    # Optional (streamed writes): encode_into(t, out) -> bytes written into the
    # writable memoryview out, which holds at least max_encoded_size(t) bytes;
    # encode_many(ts, outs) -> encode_into for each pair, in one call.
    # Optional (batched reads): decode_many(frames, outs, on_done=None) -> decode_into
    # for each pair, outs contiguous (or runs at one stride when decodes_into_runs);
    # on_done(i) as kvcore.decompress_many's (frames 0..i complete, called in order).
    # Optional: decodes_into_runs = True when decode_into / decode_many write
    # straight into views of equal contiguous runs at one stride (kvcore.runs),
    # or any CPU view (raw), so the blob decoder needs no staging copy for them.


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class RawCodec:
    """Stores the tensor's bytes as they are."""

    code = 0
    name = "raw"
    decodes_into_runs = True  # decode_into copies into any CPU view

    def encode(self, t: torch.Tensor) -> bytes:
        return _bytes_view(t.contiguous()).numpy().tobytes()

    def max_encoded_size(self, t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def encode_into(self, t: torch.Tensor, out: memoryview) -> int:
        src = _bytes_view(t.contiguous()).numpy()
        np.copyto(np.frombuffer(out, dtype=np.uint8, count=src.size), src)
        return src.size

    def decode_into(self, frame, out: torch.Tensor) -> None:
        n = out.numel() * out.element_size()
        if memoryview(frame).nbytes != n:
            raise CorruptFrameError(f"raw frame has {memoryview(frame).nbytes} bytes, expected {n}")
        src = np.frombuffer(frame, dtype=np.uint8)
        if out.is_contiguous():
            # numpy's copy (memcpy); torch's uint8 copy_ is far slower on some builds
            np.copyto(_bytes_view(out).numpy(), src)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # read-only source: only read from
                src_t = torch.from_numpy(src)
            out.copy_(src_t.view(out.dtype).view(out.shape))


class KvcoreCodec:
    """The kvcore lossless codec; ``mode`` is "fast", "dense" or "max" and ``decoder``
    "any" or "avx512" (kvcore.compress's arguments of those names: "avx512" frames decode
    faster on CPUs with AVX-512 VBMI2 and somewhat slower on others).

    >>> import torch
    >>> t = torch.randn(64, 8, 64).to(torch.bfloat16)
    >>> codec = KvcoreCodec("dense", decoder="avx512")
    >>> out = torch.empty_like(t)
    >>> codec.decode_into(codec.encode(t), out)
    >>> torch.equal(out, t)
    True
    """

    code = 1
    decodes_into_runs = True

    def __init__(self, mode: str = "dense", threads: Optional[int] = None, decoder: str = "any"):
        import kvcore

        if not hasattr(kvcore, "compress"):
            raise InvalidArgumentError("the kvcore codec is not available in this build")
        self._mode_code = mode_arg(mode)
        self._lanes = decoder_arg(decoder)
        self._kvcore = kvcore
        self.mode = mode
        self.decoder = decoder
        self.threads = threads
        self.name = f"kvcore-{mode}" if decoder == "any" else f"kvcore-{mode}-{decoder}"

    def encode(self, t: torch.Tensor) -> bytes:
        return self._kvcore.compress(t.contiguous(), mode=self.mode, threads=self.threads, decoder=self.decoder)

    def max_encoded_size(self, t: torch.Tensor) -> int:
        return self._kvcore.max_frame_size(t.dtype, tuple(t.shape))

    def encode_into(self, t: torch.Tensor, out: memoryview) -> int:
        """Compresses t into the start of out (no allocation); returns the frame size."""
        return self.encode_many([t], [out])[0]

    def encode_many(self, ts: list[torch.Tensor], outs: list[memoryview]) -> list[int]:
        """encode_into for every pair in one native call (the blocks of all the tensors
        spread over the threads); returns the frame sizes."""
        from .. import _native
        from ..codec import tensor_source

        ts = [t.contiguous() for t in ts]  # held for the whole native call
        return _native.compress_batch_into([tensor_source(t) for t in ts], outs, mode=self._mode_code,
                                           lanes=self._lanes, threads=self.threads)

    def decode_into(self, frame, out: torch.Tensor) -> None:
        if output_runs(out) is not None:
            self._kvcore.decompress(frame, out=out, threads=self.threads)
        else:
            out.copy_(self._kvcore.decompress(frame, threads=self.threads))

    def decode_many(self, frames: list, outs: list[torch.Tensor],
                    on_done: Optional[Callable[[int], None]] = None) -> None:
        """A chunk's frames in one native call (their blocks spread over the threads);
        on_done(i) as kvcore.decompress_many's."""
        self._kvcore.decompress_many(frames, outs, threads=self.threads, on_done=on_done)


def native_codec_available() -> bool:
    import kvcore

    return hasattr(kvcore, "compress") and hasattr(kvcore, "decompress")


def make_codec(name: str = "auto", threads: Optional[int] = None, decoder: str = "any") -> Codec:
    """"auto" (kvcore fast when built, else raw), "dense", "fast", "max" or "raw";
    ``decoder`` as KvcoreCodec's (it changes "dense" and "max" frames only).

    "fast" is the default: on real KV it stores ~4% more bytes than "dense" (0.70 vs
    0.68 of the original) and decodes ~1.7x faster, which the DDR tier's restores need;
    "max" stores 1-2% fewer bytes than "dense" and codes about 30% slower both ways.
    """
    if name == "auto":
        return KvcoreCodec("fast", threads) if native_codec_available() else RawCodec()
    if name in MODES:
        return KvcoreCodec(name, threads, decoder)
    if name in ("raw", "none"):
        return RawCodec()
    raise InvalidArgumentError(f"unknown codec {name!r} (auto, {', '.join(MODES)}, raw)")


def can_decode(code: int) -> bool:
    """Whether this build decodes blobs stored with ``code`` (codec_for_code gives a codec)."""
    return code == RawCodec.code or (code == KvcoreCodec.code and native_codec_available())


def codec_for_code(code: int, threads: Optional[int] = None) -> Codec:
    """The codec that decodes blobs stored with ``code``."""
    if code == RawCodec.code:
        return RawCodec()
    if code == KvcoreCodec.code:
        if not native_codec_available():
            raise CorruptFrameError("chunk was stored with the kvcore codec, which this build lacks")
        return KvcoreCodec("dense", threads)
    raise CorruptFrameError(f"chunk was stored with unknown codec {code}")

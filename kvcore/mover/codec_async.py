"""Asynchronous compress / decompress on the mover's threads.

The work runs where async copies run (the mover's dispatch threads, fanning
out over the shared native thread pool), so a pipeline

    D2H copy -> compress -> store      and      load -> decompress -> H2D copy

overlaps its stages: start the copy of piece i+1, compress piece i, and so on.
The frame is written straight into the bytes object the Future returns.

>>> import torch, kvcore
>>> kv = torch.randn(16, 8, 128).to(torch.bfloat16)
>>> frame = kvcore.compress_async(kv).result()
>>> out = torch.empty_like(kv)
>>> kvcore.decompress_async(frame, out=out).result() is out
True
>>> torch.equal(out.view(torch.int16), kv.view(torch.int16))
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .. import _native
from .copy import _threads
from .future import Future
from .regions import region, release_exports_on_error

if TYPE_CHECKING:
    from ..codec import Layout

__all__ = ["compress_async", "decompress_async"]


def compress_async(
    x: Any, *, mode: str = "dense", threads: Optional[int] = None, block_bytes: Optional[int] = None,
    backend: Optional[str] = None, decoder: str = "any", layout: Optional[Layout] = None
) -> Future:
    """kvcore.compress(x, ...) as a Future whose result is the frame (bytes).

    Arguments as for kvcore.compress (backend="qat" codes on QAT from the mover's
    threads, as compress does from the caller's). ``x`` is held (not copied) until the
    frame is done: do not modify it meanwhile. A CUDA tensor is first copied
    to the host (synchronously); copy it into a PinnedBuffer with
    kvcore.copy_async to overlap that step too.
    """
    from .. import codec

    options = codec._encode_options(mode, threads, block_bytes, backend, decoder)
    t = codec._source(x)  # an input too large to copy contiguous is an OutOfMemoryError
    code = codec.code_of(t.dtype)
    shape = [int(d) for d in t.shape]
    out = _native.FrameOut(_native.max_frame_size(code, shape, options["block_bytes"]))
    (native_layout,) = codec._native_layouts([layout], 1)
    native = _native.mover_compress_async(
        *codec.tensor_span(t), code, shape, options["mode"], options["block_bytes"], _threads(threads), out,
        options["lanes"], native_layout, options["backend"], options["deflate"]
    )
    return Future(native=[native], keep=[t], result=lambda: out.take(native.result_size()))


@release_exports_on_error
def decompress_async(frame: Any, *, out: Any = None, threads: Optional[int] = None) -> Future:
    """kvcore.decompress(frame, out=...) as a Future whose result is the tensor.

    ``out`` (optional) is a contiguous CPU tensor of the frame's dtype and
    number of elements; a tensor from ``PinnedBuffer.tensor()`` makes the
    following H2D copy DMA. Errors (kvcore.CorruptFrameError on a damaged
    frame) are raised by ``result()``.
    """
    from .. import codec

    fresh = out is None
    src = region(frame, writable=False, what="frame")  # first: it refuses a freed PinnedBuffer
    out = codec.output_for(frame, out)
    native = _native.mover_decompress_async(
        src.addr, src.nbytes, *codec.tensor_span(out), _threads(threads), fresh=fresh
    )
    return Future(native=[native], keep=[src.keep, out], value=out)

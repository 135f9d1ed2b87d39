"""kvcore's data mover: a pinned host memory pool and asynchronous copies.

>>> import numpy as np, kvcore
>>> pool = kvcore.PinnedPool(16 << 20, huge_pages=False)
>>> buf = pool.alloc(4 << 20)
>>> src = np.arange(4 << 20, dtype=np.uint8)
>>> kvcore.copy_async(buf, src).result() is buf
True
>>> bool((buf.numpy() == src).all())
True
"""

from .codec_async import compress_async, decompress_async
from .copy import copy_async, copy_engines, copy_many, gather, scatter
from .future import Future
from .pool import PinnedBuffer, PinnedPool

__all__ = [
    "PinnedPool",
    "PinnedBuffer",
    "Future",
    "copy_async",
    "copy_many",
    "gather",
    "scatter",
    "copy_engines",
    "compress_async",
    "decompress_async",
]

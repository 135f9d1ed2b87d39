"""kvcore: lossless KV-cache compression, data movement and tiered storage.

>>> import torch, kvcore
>>> kv = torch.randn(16, 8, 128, dtype=torch.bfloat16)
>>> frame = kvcore.compress(kv)
>>> back = kvcore.decompress(frame)
>>> torch.equal(back.view(torch.int16), kv.view(torch.int16))
True
"""

from . import _isa, qat
from ._isa import isa_variant, set_disabled_isa
from .codec import (Layout, analyze, compress, compress_many, decompress, decompress_many, frame_desc, frame_info,
                    max_frame_size)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _error_names
from .features import features
from .mover import (
    Future,
    PinnedBuffer,
    PinnedPool,
    compress_async,
    copy_async,
    copy_many,
    decompress_async,
    gather,
    scatter,
)
from .tiers import Namespace, RemoteConfig, TierConfig, TierManager

_isa._apply_environment()

__version__ = "0.1.0"

__all__ = [
    "analyze",
    "Layout",
    "compress",
    "compress_many",
    "decompress",
    "decompress_many",
    "frame_desc",
    "frame_info",
    "max_frame_size",
    "features", "isa_variant", "set_disabled_isa", *_error_names,
    "TierManager", "TierConfig", "RemoteConfig", "Namespace"]
__all__ += ["PinnedPool", "PinnedBuffer", "Future", "copy_async", "copy_many", "gather", "scatter"]
__all__ += ["compress_async", "decompress_async"]

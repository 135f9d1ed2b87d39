"""kvcore's own codec in the benchmark interface of :mod:`kvcore.bench.peers`.

>>> import torch
>>> from kvcore.bench.codecs import KvcoreCodec
>>> b = KvcoreCodec("dense", threads=1).bind(torch.randn(64, 4, 8).to(torch.bfloat16))
>>> b.equal(b.decompress(b.compress()))
True
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._args import MODES
from .peers import Bound, Codec


def kvcore_codec_available() -> Optional[str]:
    """None when kvcore.compress/decompress exist in this build, else why not."""
    import kvcore

    missing = [f for f in ("compress", "decompress", "frame_info") if not hasattr(kvcore, f)]
    if missing:
        return f"this kvcore build has no {', '.join(missing)}"
    return None


class KvcoreCodec(Codec):
    """``kvcore.compress(x, mode=..., threads=...)``; decompression decodes into a preallocated
    tensor with ``out=`` (how a KV cache restores a block). With ``reuse_output`` compression
    writes into a buffer kept for the input (``out=``, how the tier manager stores a frame)
    instead of returning a new ``bytes``; its name then ends in ``+out``. With ``reuse_layout``
    it codes in the layout ``kvcore.analyze`` chose, when bound, for the tensor ``like`` (the
    same layer in the chunk before; default: the input itself), as a KV store codes chunk
    after chunk; its name then ends in ``+layout``."""

    kind = "kvcore"

    def __init__(self, mode: str = "dense", threads: Optional[int] = 1, reuse_output: bool = False,
                 decoder: str = "any", reuse_layout: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.threads, self.reuse_output, self.decoder = mode, threads, reuse_output, decoder
        self.reuse_layout = reuse_layout
        for_decoder = "" if decoder == "any" else f"-{decoder}"
        self.name = (f"kvcore-{mode}{for_decoder}" + ("+out" if reuse_output else "") +
                     ("+layout" if reuse_layout else ""))
        into = ", compress into a reused buffer" if reuse_output else ""
        laid = ", in a layout analysed beforehand" if reuse_layout else ""
        coded_for = "" if decoder == "any" else f", decoder={decoder!r}"
        self.description = f"kvcore {mode} mode{coded_for}, threads={threads}{into}{laid}, decompress into out="

    def why_not(self, dtype: torch.dtype) -> Optional[str]:
        from kvcore.dtypes import SUPPORTED

        if str(dtype).removeprefix("torch.") not in SUPPORTED:  # int64, bool, float64...
            return f"kvcore codes {', '.join(SUPPORTED)}"
        return None

    def bind(self, data: torch.Tensor, like: Optional[torch.Tensor] = None) -> Bound:
        import kvcore

        src = data.contiguous()
        out = _unlike(src)
        mode, threads, decoder = self.mode, self.threads, self.decoder
        frame_buf = bytearray(kvcore.max_frame_size(src.dtype, tuple(src.shape))) if self.reuse_output else None
        layout = kvcore.analyze(src if like is None else like, mode=mode) if self.reuse_layout else None

        def compress() -> Any:
            if frame_buf is not None:  # a view of the frame in frame_buf, valid until the next call
                return kvcore.compress(src, mode=mode, threads=threads, out=frame_buf, decoder=decoder, layout=layout)
            return kvcore.compress(src, mode=mode, threads=threads, decoder=decoder, layout=layout)

        def decompress(frame: bytes) -> torch.Tensor:
            return kvcore.decompress(frame, out=out, threads=threads)

        return Bound(self, src.numel() * src.element_size(), compress, decompress, len,
                     lambda result: _same_bits(result, src))

    def bind_many(self, data: list[torch.Tensor]) -> Bound:
        """The codec bound to many tensors coded in one call each way (``kvcore.compress_many``,
        ``kvcore.decompress_many`` into preallocated outputs), as an engine stores and restores
        the pages of one step; a payload is the list of frames."""
        import kvcore

        srcs = [x.contiguous() for x in data]
        outs = [_unlike(x) for x in srcs]
        mode, threads, decoder = self.mode, self.threads, self.decoder

        def compress() -> list[bytes]:
            return kvcore.compress_many(srcs, mode=mode, threads=threads, decoder=decoder)

        def decompress(frames: list[bytes]) -> list[torch.Tensor]:
            kvcore.decompress_many(frames, outs, threads=threads)
            return outs

        def equal(results: Any) -> bool:
            return len(results) == len(srcs) and all(_same_bits(r, x) for r, x in zip(results, srcs))

        return Bound(self, sum(x.numel() * x.element_size() for x in srcs), compress, decompress,
                     lambda frames: sum(map(len, frames)), equal)


def _unlike(src: torch.Tensor) -> torch.Tensor:
    """An output for decoding src: its shape and dtype, every byte the inverse of src's. An
    empty tensor may be memory that held an earlier decode of the same data (the allocator hands
    freed blocks back), where a decoder that wrote nothing would pass the bit-exact check."""
    return torch.bitwise_not(src.reshape(-1).view(torch.uint8)).view(src.dtype).reshape(src.shape)


def _same_bits(result: Any, src: torch.Tensor) -> bool:
    """Whether result is a tensor of src's dtype, shape and bits."""
    if not isinstance(result, torch.Tensor):
        return False
    if result.dtype != src.dtype or result.shape != src.shape:
        return False
    return bool(torch.equal(result.contiguous().reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8)))


def frame_summary(frame: bytes) -> dict[str, Any]:
    """The parts of ``kvcore.frame_info`` worth recording next to a benchmark."""
    import kvcore

    info = kvcore.frame_info(frame)
    keep = {k: info[k] for k in ("block_elems", "n_blocks") if k in info}
    methods = info.get("methods")
    if methods is not None:
        keep["methods"] = _count_methods(methods)
    return keep


def _count_methods(methods: Any) -> Any:
    """Tally plane methods (a per-block list of per-plane names, or already a summary)."""
    if isinstance(methods, dict):
        return methods
    counts: dict[str, int] = {}

    def walk(m: Any) -> None:
        if isinstance(m, (list, tuple)):
            for x in m:
                walk(x)
        else:
            counts[str(m)] = counts.get(str(m), 0) + 1

    walk(methods)
    return counts

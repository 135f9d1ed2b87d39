"""Asynchronous copies: one buffer, many pairs, and gather/scatter of KV blocks.

Engines: "cpu" (native thread pool, streaming stores for large copies), "dsa"
(Intel DSA work queues, when present), "cuda" (torch copy streams, whenever a
side is a CUDA tensor). ``engine="auto"`` picks CUDA for device memory, DSA for
host copies above its measured break-even size, the CPU otherwise.

>>> import numpy as np, kvcore
>>> kv = np.random.default_rng(0).integers(0, 255, (64, 16, 8, 128), dtype=np.uint8)  # 64 paged blocks
>>> staging = np.empty((3, 16, 8, 128), np.uint8)
>>> _ = kvcore.gather(kv, [5, 9, 2], out=staging).result()
>>> bool((staging[1] == kv[9]).all())
True
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np

from .. import _native
from .._args import check_plain_buffer, check_tensor_memory, optional_int_arg
from ..errors import BufferTooSmallError, InvalidArgumentError
from . import cuda as _cuda
from .future import Future
from .regions import Region, buffer_address, byte_tensor, is_tensor, region, release_exports_on_error

__all__ = ["copy_async", "copy_many", "gather", "scatter", "copy_engines"]

_ENGINES = {"auto": 0, "cpu": 1, "dsa": 2}


def _check_engine_name(engine: Any) -> None:
    if not isinstance(engine, str) or engine not in ("auto", "cpu", "dsa", "cuda"):
        raise InvalidArgumentError(f"engine must be 'auto', 'cpu', 'dsa' or 'cuda', got {engine!r}")


def _engine_code(engine: str) -> int:
    _check_engine_name(engine)
    if engine == "cuda":
        raise InvalidArgumentError("engine='cuda' needs a CUDA tensor on one side of every copy")
    return _ENGINES[engine]


def _threads(threads: Optional[int]) -> int:
    """The native thread count: 0 (all cores) for None. The native side takes an unsigned
    32-bit count and uses at most the threads its pool has, so a larger one is capped."""
    return min(optional_int_arg(threads, "threads", 1) or 0, 2**32 - 1)


# Host copies smaller than this run inline on the calling thread (a hand-off to
# the mover's threads costs more than the copy); the Future is already done.
INLINE_BYTES = 256 << 10
# The engines copy_async's fast path takes ('dsa' copies never run inline; the general
# path checks what DSA can do), and the verdicts of its native check (mover_copy_small).
_FAST_ENGINES = ("auto", "cpu")
_COPIED, _TOO_LARGE_TO_RUN_INLINE = 1, 2


def _check_independent(dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray) -> None:
    """Refuses copies that write where another one of them reads or writes: they run in
    any order (or at once), so the result would depend on it. A copy that overlaps only
    its own source is fine (it keeps memmove semantics)."""
    live = sizes > 0
    if np.count_nonzero(live) < 2:
        return
    d, s, n = dsts[live], srcs[live], sizes[live]
    order = np.argsort(d, kind="stable")
    starts, ends = d[order], d[order] + n[order]
    if np.any(starts[1:] < ends[:-1]):
        raise InvalidArgumentError("two copies write to overlapping memory: the result would depend on their order")
    # The destinations are now disjoint and sorted: those that a source meets are the run lo..hi.
    lo = np.searchsorted(ends, s, side="right")
    hi = np.searchsorted(starts, s + n, side="left") - 1
    own = (lo == hi) & (order[np.minimum(lo, len(order) - 1)] == np.arange(len(s)))
    if np.any((lo <= hi) & ~own):
        raise InvalidArgumentError(
            "a copy writes to memory another one reads (such as gather's out over the blocks it gathers): "
            "the result would depend on their order"
        )


def _host_future(
    dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, engine: str, threads: Optional[int], keep: list, value: Any
) -> Future:
    return Future(native=_host_copies(dsts, srcs, sizes, engine, threads), keep=keep, value=value)


def _host_copies(dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, engine: str, threads: Optional[int]) -> list:
    """Runs the copies inline (small ones: no native operation) or starts them; returns
    the native operation to wait for, if any."""
    _check_independent(dsts, srcs, sizes)
    code = _engine_code(engine)
    nthreads = _threads(threads)
    args = (
        np.ascontiguousarray(dsts, np.uint64),
        np.ascontiguousarray(srcs, np.uint64),
        np.ascontiguousarray(sizes, np.uint64),
        code,
        nthreads,
        0,
    )
    if code != _ENGINES["dsa"] and int(sizes.sum()) < INLINE_BYTES:
        _native.mover_copy_segments(*args, False)
        return []
    return [_native.mover_copy_segments(*args, True)]


def _check_host_engine(engine: str, has_cuda: bool) -> None:
    _check_engine_name(engine)
    if has_cuda and engine not in ("auto", "cuda"):
        raise InvalidArgumentError(f"engine={engine!r} cannot copy CUDA memory; use 'auto' or 'cuda'")


def copy_async(dst: Any, src: Any, *, engine: str = "auto", threads: Optional[int] = None) -> Future:
    """Copies the bytes of ``src`` into the start of ``dst``; returns a Future whose result is ``dst``.

    Both are PinnedBuffers, contiguous torch tensors (CPU or CUDA) or
    C-contiguous buffer objects; ``dst`` must hold at least ``src``'s bytes.

    >>> import torch, kvcore
    >>> a = torch.arange(1000, dtype=torch.float32); b = torch.empty_like(a)
    >>> torch.equal(kvcore.copy_async(b, a).result(), a)
    True
    """
    fut = _fast_copy(dst, src, engine, threads)
    if fut is not None:
        return fut
    return copy_many([(dst, src)], engine=engine, threads=threads, _result=dst)


def _fast_copy(dst: Any, src: Any, engine: Any, threads: Any) -> Optional[Future]:
    """copy_async's fast path for two host buffers and plain arguments: the native layer
    checks them and runs a small copy at once, or it is started on the mover's threads.
    None where it declines (and copies nothing), bad input included: the general path then
    moves it, or raises."""
    if type(engine) is not str or engine not in _FAST_ENGINES:
        return None
    if threads is None:
        nthreads = 0
    elif type(threads) is int and 1 <= threads < 2**32:
        nthreads = threads
    else:
        return None  # the general path checks it
    verdict = _native.mover_copy_small(dst, src, _ENGINES[engine], nthreads, INLINE_BYTES)
    if verdict == _COPIED:
        return Future._completed(dst)
    if verdict == _TOO_LARGE_TO_RUN_INLINE:
        return _started_copy(dst, src, _ENGINES[engine], nthreads)
    return None


def _started_copy(dst: Any, src: Any, code: int, nthreads: int) -> Optional[Future]:
    """Starts a checked host copy on the mover's threads. Its Future holds exports of both
    buffers (memoryviews) until the copy ends (for good if a device timed out on it): a
    PinnedBuffer cannot be freed, nor a bytearray resized, meanwhile. None where the
    buffers changed since they were checked (another thread freed one): the general path
    reports it."""
    try:
        dst_view = memoryview(dst)
    except (TypeError, ValueError, BufferError):
        return None
    try:
        src_view = memoryview(src)
    except (TypeError, ValueError, BufferError):
        dst_view.release()
        return None
    views = [dst_view, src_view]
    try:
        native = _native.mover_submit_pair(dst_view, src_view, code, nthreads)
    except BaseException:
        _release(views)
        raise
    if native is None:
        _release(views)
        return None
    return Future(native=[native], keep=views, value=dst)


def _release(views: list) -> None:
    for view in views:
        view.release()


@release_exports_on_error
def copy_many(
    pairs: Iterable[tuple[Any, Any]],
    *,
    engine: str = "auto",
    threads: Optional[int] = None,
    _result: Any = None,
) -> Future:
    """Copies many (dst, src) pairs as one operation (small KV blocks at once).

    Host pairs run as one native operation (one DSA batch or one pass over the
    thread pool); pairs with a CUDA side run on the device's copy stream.

    >>> import numpy as np, kvcore
    >>> srcs = [np.full(4096, i, np.uint8) for i in range(8)]
    >>> dsts = [np.empty(4096, np.uint8) for _ in range(8)]
    >>> kvcore.copy_many(list(zip(dsts, srcs))).wait()
    True
    """
    host: list[tuple[Region, Region]] = []
    device: list[tuple[Any, Any, Region, Region]] = []
    keep: list[Any] = []
    try:
        pairs = list(pairs)
    except TypeError:
        raise InvalidArgumentError(f"pairs must be an iterable of (dst, src), got {type(pairs).__name__}") from None
    for i, pair in enumerate(pairs):
        try:
            dst, src = pair
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"pair {i} is not a (dst, src) tuple") from None
        d = region(dst, writable=True, what=f"dst of pair {i}")
        s = region(src, writable=False, what=f"src of pair {i}")
        keep += [d.keep, s.keep]
        if d.nbytes < s.nbytes:
            raise BufferTooSmallError(f"pair {i}: dst holds {d.nbytes} bytes, src has {s.nbytes}")
        if d.cuda is not None or s.cuda is not None:
            device.append((dst, src, d, s))
        else:
            host.append((d, s))
    _check_host_engine(engine, bool(device))
    if host and engine == "cuda":
        raise InvalidArgumentError("engine='cuda' needs a CUDA tensor on one side of every copy")
    if not device:
        if len(host) == 1:
            (d, s), code, nthreads = host[0], _engine_code(engine), _threads(threads)
            if code != _ENGINES["dsa"] and s.nbytes < INLINE_BYTES:
                _native.mover_copy(d.addr, s.addr, s.nbytes, code, nthreads, False)
                return Future(value=_result)
            return Future(native=[_native.mover_copy(d.addr, s.addr, s.nbytes, code, nthreads, True)], keep=keep, value=_result)
        dsts = np.array([d.addr for d, _ in host], np.uint64)
        srcs = np.array([s.addr for _, s in host], np.uint64)
        sizes = np.array([s.nbytes for _, s in host], np.uint64)
        return _host_future(dsts, srcs, sizes, engine, threads, keep, _result)
    dev = _cuda.device_of([r.cuda for *_, d, s in device for r in (d, s)])  # checked before any copy starts
    natives = []
    if host:  # host pairs of a mixed call: one native operation beside the CUDA copies
        dsts = np.fromiter((d.addr for d, _ in host), np.uint64, len(host))
        srcs = np.fromiter((s.addr for _, s in host), np.uint64, len(host))
        sizes = np.fromiter((s.nbytes for _, s in host), np.uint64, len(host))
        natives = _host_copies(dsts, srcs, sizes, engine, threads)

    def work() -> None:
        for dst, src, d, s in device:
            byte_tensor(d, dst)[: s.nbytes].copy_(byte_tensor(s, src), non_blocking=True)

    try:
        event = _cuda.submit(dev, work, [r.cuda for *_, d, s in device for r in (d, s) if r.cuda is not None])
    except BaseException:
        # The error releases the buffers' exports (release_exports_on_error), so a
        # caller could free them: the host copies already running must end first.
        for native in natives:
            native.wait(-1.0)
        raise
    return Future(native=natives, cuda_events=[event], keep=keep, value=_result)


def _indices(indices: Any, n_blocks: int, *, unique: bool) -> np.ndarray:
    if is_tensor(indices):
        check_tensor_memory(indices, "indices")
        indices = indices.detach().cpu()
    try:
        idx = np.asarray(indices)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidArgumentError(f"indices must be a 1-D sequence of block indices: {e}") from None
    if idx.ndim != 1:
        raise InvalidArgumentError("indices must be one-dimensional")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise InvalidArgumentError(f"indices must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n_blocks):
        raise InvalidArgumentError(f"block index out of range [0, {n_blocks})")
    if unique and idx.size != np.unique(idx).size:
        raise InvalidArgumentError("scatter indices must not repeat (the order of writes would be undefined)")
    return idx


class _Blocks:
    """Equally sized blocks: a [N, ...] tensor/array (block i = x[i]) or a list of buffers."""

    def __init__(self, blocks: Any, *, writable: bool, what: str) -> None:
        self.obj = blocks
        self.cuda = None
        if isinstance(blocks, (list, tuple)):
            regs = [region(b, writable=writable, what=f"{what}[{i}]") for i, b in enumerate(blocks)]
            sizes = {r.nbytes for r in regs}
            if len(sizes) > 1:
                raise InvalidArgumentError(f"{what}: blocks differ in size ({sorted(sizes)[:4]}...)")
            if any(r.cuda is not None for r in regs):
                raise InvalidArgumentError(f"{what}: a list of CUDA blocks is not supported; pass one [N, ...] tensor")
            self.n = len(regs)
            self.block_bytes = sizes.pop() if sizes else 0
            self.addrs = np.fromiter((r.addr for r in regs), np.uint64, len(regs))
            self.keep = [r.keep for r in regs]
            return
        if is_tensor(blocks):
            check_tensor_memory(blocks, what)
            if blocks.dim() < 1:
                raise InvalidArgumentError(f"{what}: needs a block dimension (dim 0)")
            if blocks.shape[0] and not blocks[0].is_contiguous():
                raise InvalidArgumentError(f"{what}: each block {what}[i] must be contiguous")
            self.n = blocks.shape[0]
            self.block_bytes = blocks[0].numel() * blocks.element_size() if self.n else 0
            if blocks.is_cuda:
                self.cuda = blocks
                self.keep = [blocks]
                return
            if blocks.device.type != "cpu":
                raise InvalidArgumentError(f"{what}: tensors on {blocks.device.type} are not supported")
            stride = blocks.stride(0) * blocks.element_size()
            base = blocks.data_ptr()
            self.keep = [blocks]
        else:
            try:
                arr = np.asarray(blocks) if not isinstance(blocks, np.ndarray) else blocks
            except (TypeError, ValueError, RuntimeError) as e:
                raise InvalidArgumentError(f"{what}: not an array of blocks: {e}") from None
            check_plain_buffer(arr, what)
            if arr.ndim < 1:
                raise InvalidArgumentError(f"{what}: needs a block dimension (axis 0)")
            if writable and not arr.flags.writeable:
                raise InvalidArgumentError(f"{what}: array is read-only")
            self.n = arr.shape[0]
            if self.n and not arr[0].flags.c_contiguous:
                raise InvalidArgumentError(f"{what}: each block {what}[i] must be C-contiguous")
            self.block_bytes = arr[0].nbytes if self.n else 0
            stride = arr.strides[0]
            base = buffer_address(arr)
            self.keep = [arr]
        self.addrs = np.uint64(base) + np.arange(self.n, dtype=np.uint64) * np.uint64(stride) if stride >= 0 else None
        if self.addrs is None:
            raise InvalidArgumentError(f"{what}: negative block stride")


def _staging(out: Any, count: int, block_bytes: int, *, writable: bool, what: str) -> Region:
    r = region(out, writable=writable, what=what)
    if r.nbytes < count * block_bytes:
        raise BufferTooSmallError(f"{what} holds {r.nbytes} bytes, {count} blocks of {block_bytes} need {count * block_bytes}")
    return r


@release_exports_on_error
def gather(
    blocks: Any,
    indices: Optional[Sequence[int]] = None,
    *,
    out: Any = None,
    engine: str = "auto",
    threads: Optional[int] = None,
) -> Future:
    """Copies blocks ``indices`` of ``blocks`` one after another into ``out``.

    ``blocks`` is a [N, ...] tensor or array (one paged KV layer: block i is
    ``blocks[i]``) or a list of equally sized buffers; ``indices`` defaults to
    all of them. ``out`` is a contiguous staging buffer (PinnedBuffer, tensor,
    array); when omitted a tensor/array of shape [len(indices), ...] is
    allocated (page-locked when the blocks are on a GPU). The Future's result is ``out``.
    """
    src = _Blocks(blocks, writable=False, what="blocks")
    idx = _indices(np.arange(src.n) if indices is None else indices, src.n, unique=False)
    if out is None:
        out = _new_staging(blocks, len(idx))
    r = _staging(out, len(idx), src.block_bytes, writable=True, what="out")
    _check_host_engine(engine, src.cuda is not None or r.cuda is not None)
    if src.cuda is not None or r.cuda is not None:
        return _cuda_blocks(out, r, src, idx, gather=True)
    if engine == "cuda":
        raise InvalidArgumentError("engine='cuda' needs CUDA memory on one side")
    bb = np.uint64(src.block_bytes)
    dsts = np.uint64(r.addr) + np.arange(len(idx), dtype=np.uint64) * bb
    return _host_future(dsts, src.addrs[idx], np.full(len(idx), bb, np.uint64), engine, threads, [r.keep, *src.keep], out)


@release_exports_on_error
def scatter(
    staging: Any,
    blocks: Any,
    indices: Optional[Sequence[int]] = None,
    *,
    engine: str = "auto",
    threads: Optional[int] = None,
) -> Future:
    """The reverse of gather: block i of ``staging`` goes to ``blocks[indices[i]]``.

    Indices must not repeat. The Future's result is ``blocks``.

    >>> import numpy as np, kvcore
    >>> kv = np.zeros((8, 4096), np.uint8); staging = np.ones((2, 4096), np.uint8)
    >>> _ = kvcore.scatter(staging, kv, [3, 6]).result()
    >>> int(kv.sum())
    8192
    """
    dst = _Blocks(blocks, writable=True, what="blocks")
    idx = _indices(np.arange(dst.n) if indices is None else indices, dst.n, unique=True)
    r = _staging(staging, len(idx), dst.block_bytes, writable=False, what="staging")
    _check_host_engine(engine, dst.cuda is not None or r.cuda is not None)
    if dst.cuda is not None or r.cuda is not None:
        return _cuda_blocks(staging, r, dst, idx, gather=False)
    if engine == "cuda":
        raise InvalidArgumentError("engine='cuda' needs CUDA memory on one side")
    bb = np.uint64(dst.block_bytes)
    srcs = np.uint64(r.addr) + np.arange(len(idx), dtype=np.uint64) * bb
    return _host_future(dst.addrs[idx], srcs, np.full(len(idx), bb, np.uint64), engine, threads, [r.keep, *dst.keep], blocks)


def _new_staging(blocks: Any, count: int) -> Any:
    if is_tensor(blocks):
        import torch

        shape = (count, *blocks.shape[1:])
        return torch.empty(shape, dtype=blocks.dtype, pin_memory=bool(blocks.is_cuda))
    if isinstance(blocks, (list, tuple)):
        size = region(blocks[0], writable=False, what="blocks[0]").nbytes if blocks else 0
        return np.empty((count, size), np.uint8)
    arr = np.asarray(blocks)
    return np.empty((count, *arr.shape[1:]), arr.dtype)


def _cuda_blocks(staging_obj: Any, staging: Region, blocks: _Blocks, idx: np.ndarray, *, gather: bool) -> Future:
    """gather/scatter where the paged blocks (or the staging buffer) live on a GPU."""
    import torch

    if blocks.cuda is None:
        raise InvalidArgumentError("with a CUDA staging buffer the blocks must be one CUDA [N, ...] tensor")
    kv = blocks.cuda
    flat = byte_tensor(staging, staging_obj)[: len(idx) * blocks.block_bytes]
    per_block = kv.reshape(kv.shape[0], -1).view(torch.uint8) if kv.is_contiguous() else None
    if per_block is None:
        raise InvalidArgumentError("a CUDA block tensor must be contiguous")
    index = torch.as_tensor(idx, device=kv.device)
    staged = flat.view(len(idx), blocks.block_bytes)

    def work() -> None:
        if gather:
            staged.copy_(per_block.index_select(0, index), non_blocking=True)
        else:
            per_block.index_copy_(0, index, staged.to(kv.device, non_blocking=True))

    tensors = [kv] + ([staged] if staged.is_cuda else [])
    event = _cuda.submit(kv.device, work, tensors)
    return Future(cuda_events=[event], keep=[staging.keep, kv, staged, index], value=staging_obj if gather else blocks.obj)


def copy_engines() -> dict[str, Any]:
    """Which copy engines this machine has, and why DSA is (not) used."""
    dsa = dict(_native.dsa_status())
    engines = ["cpu"]
    if dsa["available"]:
        engines.append("dsa")
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        cuda = False
    if cuda:
        engines.append("cuda")
    return {
        "copy_engines": engines,
        "copy_variant": _native.copy_variant(),
        "dsa": {
            "available": dsa["available"],
            "reason": dsa["reason"],
            "library_loaded": dsa["library_loaded"],
            "work_queues": [q["name"] for q in dsa["queues"]],
            "break_even_bytes": dsa["break_even_bytes"],
            # descriptors that timed out; those the device has not completed yet hold
            # their queue entries, and copies run on the CPU while every entry is held
            "timeouts": dsa["timeouts"],
            "overdue_descriptors": dsa["overdue_descriptors"],
            "wedged_queues": dsa["wedged_queues"],
            "cpu_fallbacks": dsa["cpu_fallbacks"],
        },
    }

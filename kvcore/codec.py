"""Lossless compression of KV tensors into kvcore frames (docs/FORMAT.md).

>>> import torch, kvcore
>>> kv = torch.randn(16, 8, 128).to(torch.bfloat16)
>>> frame = kvcore.compress(kv)
>>> kvcore.decompress(frame).view(torch.int16).equal(kv.view(torch.int16))
True
>>> kvcore.frame_info(frame)["dtype"]
'bfloat16'
"""

import math
from typing import Any, Callable, NoReturn, Optional, Sequence, Union

import numpy as np
import torch

from . import _native
from ._args import (
    DEAD_BUFFER_ERRORS, check_plain_buffer, check_tensor_memory, decoder_arg, int_arg, mode_arg, optional_int_arg)
from .dtypes import code_of, code_or_zero, torch_dtype, torch_dtype_of_numpy
from .errors import CorruptFrameError, InvalidArgumentError, OutOfMemoryError
from .runs import output_runs

_BACKENDS = {"auto": 0, "software": 1, "qat": 2}

FrameLike = Union[bytes, bytearray, memoryview, np.ndarray, torch.Tensor, Any]  # C-contiguous bytes
TensorLike = Union[torch.Tensor, np.ndarray]


def _frame_view(frame: FrameLike) -> Union[bytes, memoryview]:
    """A frame's bytes: any C-contiguous buffer (bytes, bytearray, memoryview, numpy
    array) or a contiguous CPU tensor (such as a pinned buffer's)."""
    if type(frame) is bytes:  # the common case: the native calls take bytes as they are
        return frame
    if isinstance(frame, torch.Tensor):
        check_tensor_memory(frame, "frame")
        if not frame.is_cpu or not frame.is_contiguous():
            raise InvalidArgumentError("a frame held in a tensor must be a contiguous CPU tensor")
        frame = frame.reshape(-1).view(torch.uint8).numpy()
    try:
        return memoryview(frame)
    except TypeError:
        raise InvalidArgumentError(
            f"a frame must be bytes, bytearray, memoryview, a numpy array or a CPU tensor, "
            f"not {type(frame).__name__}") from None
    except DEAD_BUFFER_ERRORS as e:
        raise InvalidArgumentError(f"the frame's buffer gives no memory: {e}") from None


def _sequence(xs: Any, what: str) -> list:
    """xs as a list: any iterable, but not one tensor, array or bytes object (a frame or a
    tensor where a list of them was meant)."""
    if not isinstance(xs, (torch.Tensor, np.ndarray, str, bytes, bytearray, memoryview)):
        try:
            return list(xs)
        except TypeError:
            pass
    raise InvalidArgumentError(f"{what} must be a list (or other iterable) of them, not {type(xs).__name__}")


def _as_cpu_tensor(x: TensorLike) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach() if x.requires_grad else x
        if t.is_neg() or t.is_conj():
            t = t.resolve_neg().resolve_conj()  # materialised, as non-contiguous input is
        check_tensor_memory(t, "x")
        if not t.is_cpu:
            t = t.cpu()
        return t
    if isinstance(x, np.ndarray):
        dtype = torch_dtype_of_numpy(x.dtype)
        try:
            t = torch.empty(x.shape, dtype=dtype)
        except RuntimeError as e:
            raise _copy_refused(x.shape, dtype, e) from None
        # numpy has no bf16/fp8: x is copied into t's bytes seen as x's dtype, in x's shape.
        # (torch.from_numpy of an empty array has stride 0, which no view takes.)
        t.reshape(-1).view(torch.uint8).numpy().view(x.dtype).reshape(x.shape)[...] = x
        return t
    raise InvalidArgumentError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def tensor_span(t: torch.Tensor) -> tuple[int, int]:
    """(address, size in bytes) of a contiguous CPU tensor's data, for the native calls.

    The caller keeps t alive across the call. Cheaper than a numpy byte view (about
    0.5 us against 8 us), which matters when a KV chunk is many small frames.
    """
    return t.data_ptr(), t.nbytes


def tensor_source(t: torch.Tensor) -> tuple[int, int, int, list[int]]:
    """(address, bytes, dtype code, shape) of a contiguous CPU tensor, as the native
    compress calls take each input (the caller keeps t alive across the call)."""
    return (*tensor_span(t), code_of(t.dtype), list(t.shape))


def _threads(threads: Optional[int]) -> Optional[int]:
    return optional_int_arg(threads, "threads", 1)


def compress(
    x: TensorLike,
    *,
    mode: str = "dense",
    threads: Optional[int] = None,
    block_bytes: Optional[int] = None,
    backend: Optional[str] = None,
    out: Optional[Any] = None,
    decoder: str = "any",
    layout: Optional["Layout"] = None,
) -> Union[bytes, memoryview]:
    """Compress a tensor losslessly into a self-describing frame.

    x: a torch tensor (any device; non-CPU tensors are copied to the host first)
    or numpy array of bfloat16, float16, float32, float8_e4m3fn, float8_e5m2,
    uint8 or int8, of any shape; non-contiguous input is accepted.
    mode: "dense" (small frames, fast decompression), "fast" (fastest decompression) or
    "max" (dense plus each value's sign coded by channel: about 1-2% smaller than dense on
    real bfloat16 KV, about 30% slower both ways; docs/FORMAT.md, method 9; zstd on
    planes that repeat rows in part wherever it is smaller, where dense mode takes it
    only when it saves a quarter; as many channel-group tables as make a plane
    smallest, where dense mode charges each table for its decode time; and a float8
    tensor of 64K+ elements coded in both bit layouts, the smaller kept, at about half
    the compress speed).
    threads: native threads to use at most (default: all cores); a call takes one per MiB of
    input, since waking a thread costs more than it saves on less.
    block_bytes: size of the independently coded blocks (default 1 MiB in dense mode,
    256 KiB in fast mode).
    backend: None (default) codes planes with kvcore's own coders. "software",
    "qat" or "auto" code them as raw DEFLATE instead (plane method 4, readable by
    any inflater; docs/QAT.md): with ISA-L, with QAT hardware (UnsupportedError
    without it), or with QAT where present and the piece is large enough.
    out: a writable C-contiguous buffer (bytearray, numpy array, CPU tensor...) of at
    least max_frame_size(x.dtype, x.shape) bytes: the frame is written at its start and
    a memoryview of it is returned (repeated compressions into one buffer skip the
    allocation, its page faults and a copy of the frame).
    decoder: the CPUs that will decompress the frame. "any" (default) codes it to decode
    fast everywhere. "avx512", for stores read by AVX-512 VBMI2 CPUs (Ice Lake, Sapphire
    Rapids, Zen 4 and later), codes dense mode's Huffman streams in 128 lanes that those
    decode side by side: frames decoded 1.17-1.45x as fast, 0.12-0.31% larger (kvdata on a
    Zen 4; docs/FORMAT.md, huffman tag 4). Other CPUs read and write them too: with AVX2 at
    0.86-1.02x the speed of default frames, without it (any non-x86 CPU) at 0.28-0.66x
    (measured with AVX-512 masked off; README).
    layout: code x in a layout that analyze() chose for an earlier tensor of its kind (same
    dtype and channels, same mode and backend; InvalidArgumentError otherwise) instead of
    analysing x: see analyze().

    >>> import torch, kvcore
    >>> x = torch.zeros(64, 8, dtype=torch.float16)  # 1 KiB of one value
    >>> frame = kvcore.compress(x, mode="fast")
    >>> len(frame) < 100
    True
    >>> torch.equal(kvcore.decompress(frame), x)
    True
    >>> buf = bytearray(kvcore.max_frame_size(x.dtype, x.shape))
    >>> kvcore.compress(x, mode="fast", out=buf) == frame
    True
    """
    t = _source(x)
    options = _encode_options(mode, threads, block_bytes, backend, decoder)
    if layout is not None:
        options["layouts"] = _native_layouts([layout], 1)
    if out is None:
        return _native.compress_batch([tensor_source(t)], **options)[0]
    view = _writable_bytes(out)
    (n,) = _native.compress_batch_into([tensor_source(t)], [view], **options)
    return view[:n]


class Layout:
    """How compress() codes one kind of tensor: the bit layout (plain or rotated), the
    per-channel residual if any, and which byte planes are worth entropy coding, as
    analyze() chose them from a sample of one tensor. Passed back to compress(layout=)
    or compress_many(layouts=), it skips that analysis (about a fifth of compressing a
    512 KiB KV frame) for later tensors of the same dtype and channel count.

    Frames coded in any layout decode the same way, bit-exact; a layout that no longer
    fits the data only makes frames larger. Read-only attributes: dtype, channels, mode
    ("dense", "fast", "max" or "DEFLATE" for a backend), rotate, residual (bytes, one per
    channel, or None) and plane_entropy (estimated bits per byte of each plane).
    """

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        if not isinstance(native, _native.Layout):
            raise InvalidArgumentError("a Layout comes from kvcore.analyze()")
        self._native = native

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self._native.dtype)

    @property
    def channels(self) -> int:
        return self._native.channels

    @property
    def mode(self) -> str:
        return self._native.coding

    @property
    def rotate(self) -> bool:
        return self._native.rotate

    @property
    def residual(self) -> Optional[bytes]:
        return self._native.residual

    @property
    def plane_entropy(self) -> list[float]:
        return list(self._native.plane_entropy)

    def __reduce__(self) -> Any:
        # Coded choices are checked only against the tensors they were made for: a layout
        # read back from storage would be one more untrusted input to validate.
        raise TypeError("kvcore.Layout is not picklable: analyze() a tensor in the process that compresses")

    def __repr__(self) -> str:
        return (f"kvcore.Layout(dtype={self.dtype}, channels={self.channels}, mode={self.mode!r}, "
                f"rotate={self.rotate}, residual={self.residual is not None})")


def analyze(x: TensorLike, *, mode: str = "dense", backend: Optional[str] = None) -> Layout:
    """The layout compress(x, mode=mode, backend=backend) would choose for x, to code
    later tensors of the same kind with: compress(y, layout=...) skips the analysis and
    gives the same frame for x itself. A layer's K or V keeps its statistics from one
    chunk of tokens to the next, so a KV store analyses a layer's first chunk (and again
    now and then) and codes the later ones in that layout.

    >>> import torch, kvcore
    >>> k0, k1 = torch.randn(2, 256, 8, 128).to(torch.bfloat16)  # two chunks of one layer's K
    >>> layout = kvcore.analyze(k0)
    >>> kvcore.compress(k0, layout=layout) == kvcore.compress(k0)
    True
    >>> frame = kvcore.compress(k1, layout=layout)
    >>> torch.equal(kvcore.decompress(frame).view(torch.int16), k1.view(torch.int16))
    True
    """
    t = _source(x)
    options = _encode_options(mode, None, None, backend, "any")
    return Layout(_native.analyze(tensor_source(t), mode=options["mode"], deflate=options["deflate"]))


def _native_layouts(layouts: Any, n: int) -> list:
    """The native handles of n layouts (each a Layout or None)."""
    layouts = _sequence(layouts, "layouts")
    if len(layouts) != n:
        raise InvalidArgumentError(f"layouts must hold one Layout (or None) per tensor: {len(layouts)} for {n}")
    for lay in layouts:
        if lay is not None and not isinstance(lay, Layout):
            raise InvalidArgumentError(f"layouts must be kvcore.Layout objects or None, got {type(lay).__name__}")
    return [None if lay is None else lay._native for lay in layouts]


def _writable_bytes(out: Any) -> memoryview:
    """out's bytes as a memoryview: a buffer object, or a contiguous CPU torch tensor."""
    if isinstance(out, torch.Tensor):
        check_tensor_memory(out, "out")
        if not out.is_cpu or not out.is_contiguous():
            raise InvalidArgumentError("out must be a contiguous CPU tensor")
        out = out.reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(out)
    except (TypeError, *DEAD_BUFFER_ERRORS) as e:
        raise InvalidArgumentError(f"out must be a writable C-contiguous buffer: {e}") from None
    check_plain_buffer(view, "out")
    try:
        return view.cast("B")
    except TypeError as e:
        raise InvalidArgumentError(f"out must be a writable C-contiguous buffer: {e}") from None


def compress_many(
    xs: Sequence[TensorLike],
    *,
    mode: str = "dense",
    threads: Optional[int] = None,
    block_bytes: Optional[int] = None,
    backend: Optional[str] = None,
    decoder: str = "any",
    layouts: Optional[Sequence[Optional[Layout]]] = None,
) -> list[bytes]:
    """Compress every tensor of xs, each into its own frame, in one native call.

    The same frames as ``[compress(x, ...) for x in xs]``, but the blocks of all the
    tensors are spread over the threads at once, so many small tensors (the layers of
    a KV chunk) keep every core busy. Arguments as for compress; layouts: one Layout
    (or None: analysed) per tensor.

    >>> import torch, kvcore
    >>> layers = [torch.full((4, 8), float(i), dtype=torch.bfloat16) for i in range(3)]
    >>> frames = kvcore.compress_many(layers, mode="fast")
    >>> frames == [kvcore.compress(x, mode="fast") for x in layers]
    True
    """
    options = _encode_options(mode, threads, block_bytes, backend, decoder)
    ts = [_source(x) for x in _sequence(xs, "xs")]  # held for the whole native call
    if layouts is not None:
        options["layouts"] = _native_layouts(layouts, len(ts))
    return _native.compress_batch([tensor_source(t) for t in ts], **options)


def _source(x: TensorLike) -> torch.Tensor:
    """x as a contiguous CPU tensor of a supported dtype."""
    t = _as_cpu_tensor(x)
    code_of(t.dtype)
    try:
        return t.contiguous()
    except RuntimeError as e:
        raise _copy_refused(t.shape, t.dtype, e) from None


def _copy_refused(shape: Sequence[int], dtype: torch.dtype, e: Exception) -> OutOfMemoryError:
    """The allocator's refusal of a contiguous copy of the input (a view of stride 0, expanded or
    broadcast, stands for far more memory than it holds)."""
    nbytes = math.prod(shape) * dtype.itemsize
    return OutOfMemoryError(f"cannot allocate {nbytes} bytes for a contiguous copy of the input {tuple(shape)}: {e}")


def _encode_options(mode: str, threads: Optional[int], block_bytes: Optional[int],
                    backend: Optional[str], decoder: str) -> dict[str, Any]:
    mode_code = mode_arg(mode)
    if backend is not None and (not isinstance(backend, str) or backend not in _BACKENDS):
        raise InvalidArgumentError(f"backend must be None or one of {sorted(_BACKENDS)}, got {backend!r}")
    return dict(mode=mode_code, backend=_BACKENDS[backend or "auto"], deflate=backend is not None,
                lanes=decoder_arg(decoder), block_bytes=_block_bytes(block_bytes), threads=_threads(threads))


def _block_bytes(block_bytes: Optional[int]) -> int:
    """The native block_bytes argument (0: the mode's default); its range is checked natively."""
    if block_bytes is None:
        return 0
    block_bytes = int_arg(block_bytes, "block_bytes", 1)
    if block_bytes >= 1 << 32:
        raise InvalidArgumentError(f"block_bytes must be below 2**32, got {block_bytes}")
    return block_bytes


def frame_desc(frame: FrameLike) -> tuple[torch.dtype, tuple[int, ...]]:
    """The dtype and shape a frame decodes to (reads the header only)."""
    code, shape = _native.frame_desc(_frame_view(frame))
    return torch_dtype(code), tuple(shape)


def decompress(
    frame: FrameLike,
    *,
    out: Optional[torch.Tensor] = None,
    threads: Optional[int] = None,
) -> torch.Tensor:
    """Decode a frame into a tensor of the original dtype, shape and bits.

    frame: bytes, bytearray, memoryview, a numpy array or a contiguous CPU tensor (a
    pinned buffer's, say) holding exactly the frame.
    out: a preallocated CPU tensor of the frame's dtype and number of elements (any
    shape) to decode into without allocating, in its row-major order; it is
    returned. It is contiguous, or a view made of equal contiguous runs at one
    stride, such as a token range of a larger KV tensor (see output_runs).
    Raises CorruptFrameError on a truncated, corrupted or tampered frame (then
    the contents of out are unspecified: nothing unverified is ever returned).

    >>> import torch, kvcore
    >>> x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    >>> out = torch.empty(3, 4)
    >>> kvcore.decompress(kvcore.compress(x), out=out) is out
    True
    >>> big = torch.zeros(3, 10)
    >>> _ = kvcore.decompress(kvcore.compress(x), out=big[:, 2:6])  # decoded in place, no copy
    >>> torch.equal(big[:, 2:6], x) and big[:, 6:].count_nonzero().item() == 0
    True
    """
    frame = _frame_view(frame)
    n_threads = _threads(threads)
    if out is not None:
        # The native call checks out's dtype and size against the header as it reads it,
        # which saves reading it here first (0.7 us of a 32 KiB frame's 11 us call).
        dest = _destination(_checked_out(out, runs=True))
        if not _native.decompress_into(frame, *dest, n_threads, False, code_or_zero(out.dtype)):
            _raise_mismatch(frame, out)
        return out
    out = _output_for(frame, None, runs=True)
    _native.decompress_into(frame, *_destination(out), n_threads, True)
    return out


def decompress_many(
    frames: Sequence[FrameLike],
    outs: Sequence[torch.Tensor],
    *,
    threads: Optional[int] = None,
    on_done: Optional[Callable[[int], None]] = None,
) -> None:
    """Decode frames[i] into outs[i] for every i in one native call.

    The blocks of all frames are spread over the threads, so many small frames (the
    layers of a KV chunk) keep every core busy. Each out is checked like
    decompress's ``out=`` (contiguous, or runs at one stride); outputs may interleave
    (chunks side by side in one tensor) but share no byte. Raises CorruptFrameError
    if any frame is bad (the contents of every out are then unspecified).

    on_done(i), when given, is called on the calling thread for i = 0, 1, ... in order,
    each as soon as outs[0..i] are complete, while the native threads go on decoding
    the later frames (blocks are taken in frame order): a caller can use layer 0 of a
    KV chunk while the rest is still being decoded. A bad frame ends the calls before
    its own; an exception from on_done ends them too. Either is raised once the whole
    batch has stopped (no native thread touches frames or outs after this returns).

    >>> import torch, kvcore
    >>> xs = [torch.full((4, 8), float(i), dtype=torch.bfloat16) for i in range(3)]
    >>> outs = [torch.empty_like(x) for x in xs]
    >>> kvcore.decompress_many([kvcore.compress(x) for x in xs], outs)
    >>> all(torch.equal(o, x) for o, x in zip(outs, xs))
    True
    >>> ready = []
    >>> kvcore.decompress_many([kvcore.compress(x) for x in xs], outs, on_done=ready.append)
    >>> ready
    [0, 1, 2]
    """
    frames = [_frame_view(f) for f in _sequence(frames, "frames")]
    outs = _sequence(outs, "outs")
    if len(frames) != len(outs):
        raise InvalidArgumentError(f"{len(frames)} frames but {len(outs)} outputs")
    if on_done is not None and not callable(on_done):
        raise InvalidArgumentError(f"on_done must be callable, got {type(on_done).__name__}")
    # The checked outs stay referenced by the list for the whole native call.
    checked = [_checked_out(o, runs=True) for o in outs]
    destinations = [_destination(o) for o in checked]
    # One native call reads every header (a Python-level frame_desc per frame cost more
    # than decoding a small one); what does not match then raises its message.
    bad = _native.first_mismatch(frames, [(code_or_zero(o.dtype), d[1]) for o, d in zip(checked, destinations)])
    if bad >= 0:
        _raise_mismatch(frames[bad], checked[bad])
    if on_done is None:
        _native.decompress_batch(frames, destinations, threads=_threads(threads))
        return
    batch = _native.decompress_batch_async(frames, destinations, threads=_threads(threads))
    batch.outputs = checked  # alive until the batch ends, whatever interrupts the waits below
    try:
        for i in range(len(checked)):
            batch.wait(i)
            batch.check(i)
            on_done(i)
    finally:
        batch.wait_all()


def _destination(out: torch.Tensor) -> tuple[int, int, int, int]:
    """(address, bytes, run_bytes, run_stride) of a checked output, for the native calls."""
    return (out.data_ptr(), out.nbytes, *output_runs(out))


def output_for(frame: FrameLike, out: Optional[torch.Tensor]) -> torch.Tensor:
    """The tensor a frame decodes into: out (contiguous) after checking it fits, or a
    new one."""
    return _output_for(frame, out, runs=False)


def _checked_out(out: Any, *, runs: bool) -> torch.Tensor:
    """out after the checks that need no frame: a CPU tensor of plain memory, contiguous
    (or, with runs, made of equal contiguous runs at one stride)."""
    if not isinstance(out, torch.Tensor):
        raise InvalidArgumentError(f"out must be a torch.Tensor, got {type(out).__name__}")
    check_tensor_memory(out, "out")
    if not out.is_cpu:
        raise InvalidArgumentError("out must be a CPU tensor")
    if not out.is_contiguous() and not (runs and out.numel() and output_runs(out) is not None):
        raise InvalidArgumentError("out must be a contiguous CPU tensor" + (
            ", or a view of equal contiguous runs at one stride (such as out[:, a:b] of a contiguous tensor)"
            if runs else ""))
    return out


def _raise_mismatch(frame: FrameLike, out: torch.Tensor) -> NoReturn:
    """Raises what makes out unfit for frame, where the native check found its dtype or size wrong."""
    _output_for(frame, out, runs=True)
    raise InvalidArgumentError("out does not match the frame")  # (not reached: both checks agree)


def _output_for(frame: FrameLike, out: Optional[torch.Tensor], *, runs: bool) -> torch.Tensor:
    dtype, shape = frame_desc(frame)
    if out is None:
        try:
            return torch.empty(shape, dtype=dtype)
        except (RuntimeError, TypeError) as e:
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes:  # the allocator's refusal (a frame may hold far more than its own size)
                raise OutOfMemoryError(f"cannot allocate {nbytes} bytes for the decoded tensor {shape}: {e}") from None
            # Nothing to allocate: a dimension (TypeError) or stride (RuntimeError) past int64, which
            # no tensor has, beside a dimension of 0 (the header checks the element count only).
            raise CorruptFrameError(f"the frame holds shape {shape}, which no tensor has: {e}") from None
    _checked_out(out, runs=runs)
    if out.dtype != dtype:
        raise InvalidArgumentError(f"out has dtype {out.dtype}, the frame holds {dtype}")
    if out.numel() != math.prod(shape):
        raise InvalidArgumentError(f"out has {out.numel()} elements, the frame holds shape {shape}")
    return out


def frame_info(frame: FrameLike) -> dict[str, Any]:
    """Describe a frame without decoding it.

    Returns dtype, shape, original_bytes, frame_bytes, ratio (frame/original),
    block_elems, n_blocks, layout (rotate, residual, period), mode ("fast" or
    "dense", as the header records it: frames of mode "max" say "dense" and have
    "signs" planes) and per-plane methods ({method: {"planes": count, "bytes":
    payload bytes}}).
    """
    info = _native.frame_info(_frame_view(frame))
    flags = info.pop("flags")
    info["dtype"] = str(torch_dtype(info.pop("dtype_code"))).removeprefix("torch.")
    info["ratio"] = info["frame_bytes"] / info["original_bytes"] if info["original_bytes"] else 0.0
    info["layout"] = {"rotate": bool(flags & 1), "residual": bool(flags & 2), "channels": info.pop("channels")}
    info["mode"] = "fast" if flags & 4 else "dense"
    return info


def max_frame_size(dtype: Any, shape: tuple[int, ...], *, block_bytes: Optional[int] = None) -> int:
    """Upper bound of len(compress(x)) for a tensor of this dtype (torch's, or numpy's for
    an array) and shape.

    >>> import numpy as np, torch, kvcore
    >>> kvcore.max_frame_size(torch.bfloat16, (256, 8, 128)) >= 256 * 8 * 128 * 2
    True
    >>> kvcore.max_frame_size(np.float16, (256, 8, 128)) == kvcore.max_frame_size(torch.float16, (256, 8, 128))
    True
    """
    if not isinstance(shape, (list, tuple, torch.Size)):
        raise InvalidArgumentError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    dims = [int_arg(d, "a dimension of shape") for d in shape]
    if not isinstance(dtype, torch.dtype):
        try:
            np_dtype = None if dtype is None else np.dtype(dtype)  # numpy would take None for float64
        except (TypeError, ValueError):  # numpy's for what is no dtype at all
            np_dtype = None
        if np_dtype is None:
            raise InvalidArgumentError(f"dtype must be a torch or numpy dtype, got {dtype!r}")
        dtype = torch_dtype_of_numpy(np_dtype)
    return _native.max_frame_size(code_of(dtype), dims, _block_bytes(block_bytes))

"""Turning the objects users pass (tensors, arrays, buffers) into memory regions."""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import numpy as np

from .. import _native
from .._args import DEAD_BUFFER_ERRORS, check_plain_buffer, check_tensor_memory
from ..errors import DeviceTimeoutError, InvalidArgumentError
from .pool import PinnedBuffer


@dataclass
class Region:
    """A contiguous byte range: host memory (addr) or a CUDA tensor."""

    addr: int
    nbytes: int
    keep: Any  # what must stay alive while the range is in use
    cuda: Optional[Any] = None  # the torch tensor when the range lives on a GPU


F = TypeVar("F", bound=Callable[..., Any])
# .exports: the PinnedBuffer exports region() took in this call; .keeps: every region's keep
_taken = threading.local()

# The buffers of copies that a device did not finish in time (DeviceTimeoutError): it may
# still write them, so they stay alive (PinnedBuffer exports unreleased: free() is refused)
# for the rest of the process. Only a sick device times out; features()["dsa"] counts it.
_held_for_devices: list = []
_held_lock = threading.Lock()


def hold_for_device(objs: Any) -> None:
    """Keeps objs, the buffers of a copy a device may still be running, alive for good."""
    with _held_lock:
        _held_for_devices.append(list(objs))


def release_exports_on_error(fn: F) -> F:
    """Wraps an operation that takes regions: when it raises, the exports of PinnedBuffers
    that region() took are released at once. The exception's traceback holds the frames
    that hold them, so a caller that kept the exception could not free() those buffers.
    A DeviceTimeoutError instead keeps every region it took alive (hold_for_device)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_taken, "exports", None), getattr(_taken, "keeps", None)
        _taken.exports, _taken.keeps = exports, keeps = [], []
        try:
            return fn(*args, **kwargs)
        except DeviceTimeoutError:
            hold_for_device(keeps)
            raise
        except BaseException:
            for mv in exports:
                mv.release()
            raise
        finally:
            _taken.exports, _taken.keeps = outer

    return wrapper  # type: ignore[return-value]


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def region(obj: Any, *, writable: bool, what: str) -> Region:
    """The bytes of ``obj``: a PinnedBuffer, a contiguous torch tensor (CPU or
    CUDA), or any C-contiguous buffer-protocol object (numpy, bytearray...)."""
    r = _region_of(obj, writable=writable, what=what)
    keeps = getattr(_taken, "keeps", None)
    if keeps is not None:
        keeps.append(r.keep)
    return r


def _region_of(obj: Any, *, writable: bool, what: str) -> Region:
    # Subclasses too (masked arrays, memmaps): numpy exports no buffer for some dtypes
    # (datetime64), which buffer_address then reads from the array interface.
    if isinstance(obj, np.ndarray):
        check_plain_buffer(obj, what)
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(f"{what}: array must be C-contiguous")
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError(f"{what}: buffer is read-only")
        return Region(buffer_address(obj), obj.nbytes, obj)
    if isinstance(obj, PinnedBuffer):
        try:
            mv = memoryview(obj)  # an export: free() is refused while the copy runs
        except BufferError as e:  # freed (maybe by another thread just now)
            raise InvalidArgumentError(f"{what}: {e}") from None
        taken = getattr(_taken, "exports", None)
        if taken is not None:
            taken.append(mv)
        return Region(obj.address, obj.nbytes, mv)
    if is_tensor(obj):
        check_tensor_memory(obj, what)
        if not obj.is_contiguous():
            raise InvalidArgumentError(f"{what}: tensor must be contiguous (call .contiguous())")
        nbytes = obj.numel() * obj.element_size()
        if obj.is_cuda:
            return Region(obj.data_ptr(), nbytes, obj, cuda=obj)
        if obj.device.type != "cpu":
            raise InvalidArgumentError(f"{what}: tensors on {obj.device.type} are not supported")
        return Region(obj.data_ptr(), nbytes, obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgumentError(
            f"{what}: expected a tensor, numpy array, PinnedBuffer or buffer object, got {type(obj).__name__}"
        ) from None
    except DEAD_BUFFER_ERRORS as e:
        raise InvalidArgumentError(f"{what}: the buffer gives no memory: {e}") from None
    check_plain_buffer(mv, what)
    if not mv.c_contiguous:
        mv.release()
        raise InvalidArgumentError(f"{what}: buffer must be C-contiguous")
    if writable and mv.readonly:
        mv.release()
        raise InvalidArgumentError(f"{what}: buffer is read-only")
    nbytes = mv.nbytes
    return Region(buffer_address(mv) if nbytes else 0, nbytes, mv)


def buffer_address(obj: Any) -> int:
    """The address of the memory of a numpy array or memoryview that the caller holds.
    (numpy's __array_interface__ builds a dict per call, 1-2 us: most of what a copy_many
    pair cost. It still serves the dtypes numpy exports no buffer for, datetime64 say.)"""
    addr = _native.buffer_address(obj)
    return obj.__array_interface__["data"][0] if addr is None else addr


def byte_tensor(r: Region, obj: Any) -> Any:
    """A flat torch.uint8 tensor over a region (zero-copy)."""
    import torch

    if r.cuda is not None:
        return r.cuda.reshape(-1).view(torch.uint8)
    if is_tensor(obj):
        return obj.reshape(-1).view(torch.uint8)
    if isinstance(obj, PinnedBuffer):
        return obj.tensor()
    if r.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(r.keep, dtype=torch.uint8, count=r.nbytes)

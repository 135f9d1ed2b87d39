"""CUDA device <-> host copies on dedicated torch streams.

Each device gets one copy stream (created on first use). A copy first makes
that stream wait for the caller's current stream (so it sees the data compute
produced), runs ``copy_`` with ``non_blocking=True`` there, and records an
event the returned Future waits on; ``fut.event`` lets the caller order
later compute after the copy without blocking the host. Host memory from a
PinnedPool is registered with the CUDA runtime, so these copies are DMA.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

_lock = threading.Lock()
_streams: dict[int, Any] = {}


def copy_stream(device: Any) -> Any:
    """The dedicated copy stream of ``device``."""
    import torch

    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    with _lock:
        s = _streams.get(index)
        if s is None:
            s = torch.cuda.Stream(device=index)
            _streams[index] = s
    return s


def device_of(tensors: Sequence[Any]) -> Any:
    devices = {t.device for t in tensors if t is not None and t.is_cuda}
    if len(devices) != 1:
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(f"a CUDA copy must involve exactly one device, got {sorted(map(str, devices))}")
    return devices.pop()


def submit(device: Any, work: Any, cuda_tensors: Sequence[Any]) -> Any:
    """Runs ``work()`` (which enqueues torch copies) on the copy stream of
    ``device`` after the current stream's pending work; returns the event."""
    import torch

    stream = copy_stream(device)
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        work()
        event = torch.cuda.Event()
        event.record(stream)
    for t in cuda_tensors:  # the caching allocator must not reuse them before the copy ends
        t.record_stream(stream)
    return event

"""kvcore.Future: the handle of an asynchronous copy or codec operation.

A Future is made of parts (native operations on the mover's threads, CUDA
events on a copy stream); it is done when all of them are. It keeps the
buffers of its operation alive until they finish, even if the caller drops it.

>>> import numpy as np, kvcore
>>> src = np.arange(1 << 20, dtype=np.uint8); dst = np.empty_like(src)
>>> fut = kvcore.copy_async(dst, src)
>>> fut.result() is dst
True
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import threading
import time
from typing import Any, Callable, Iterable, Optional

from .. import _native
from .._args import optional_seconds_arg
from ..errors import ForkedOperationError, InvalidArgumentError
from .regions import hold_for_device

__all__ = ["Future"]

# Bumped in each forked child: a Future made under another value was started by
# an ancestor process, whose threads (native and CUDA) do not exist here.
_fork_generation = 0
# This process's pid, renewed with the generation (os.getpid() is a system call: it cost a
# fifth of a small copy's Future).
_pid = os.getpid()
# Taken while a Future replaces its lock in a forked child (Future._lock_here).
_lock_renewal = threading.Lock()


def _count_fork_in_child() -> None:
    global _fork_generation, _lock_renewal, _pid
    _fork_generation += 1
    _pid = os.getpid()
    _lock_renewal = threading.Lock()  # a parent's thread may have held it at fork()


class _Notifier:
    """One daemon thread that learns from the native side which operations finished.

    Native threads never call into Python: they queue a token that this thread
    collects (the GIL released while it waits) and turns into done-callbacks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, "Future"] = {}
        self._tokens = itertools.count(1)
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

    def register(self, fut: "Future", native: Any) -> None:
        token = next(self._tokens)
        with self._lock:
            self._pending[token] = fut
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="kvcore-mover-notifier", daemon=True)
                self._thread.start()
        native.notify_with(token)

    def _run(self) -> None:
        while not self._stopping:
            for token in _native.mover_poll_notifications(0.25):
                with self._lock:
                    fut = self._pending.pop(token, None)
                if fut is not None:
                    fut._part_finished()

    def after_fork_in_child(self) -> None:
        """Starts over in a forked child, which has only the thread that forked: no
        notifier thread (a Future's callbacks and ``await`` would wait forever), a lock
        that another thread may have held, and the parent's operations in flight, which
        never finish here (their native tasks stay with the parent), so that shutdown()
        must not wait for them at the child's exit."""
        self._lock = threading.Lock()
        self._pending = {}
        self._thread = None
        self._stopping = False

    def shutdown(self) -> None:
        """Waits for operations still in flight, then stops the thread (at exit)."""
        with self._lock:
            pending = list(self._pending.values())
        for fut in pending:
            fut._wait_parts(None)
        self._stopping = True
        _native.mover_wake_notifications()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _CudaWatcher:
    """One daemon thread that finishes the Futures of CUDA parts when their events complete.
    Until then a Future stays referenced here, with its buffers, even if the caller dropped
    it: the device may still be copying into or out of them.

    Events are polled (``event.query()``), never waited on: waiting for one device's copy
    kept a finished copy of another device unreported. Every pending event is asked on each
    sweep: the events of one device's copy stream finish in the order they were recorded,
    but two threads copying at once can record in one order and make their Futures (watch)
    in the other. A sweep that finds nothing finished is followed by a nap, 100 us doubling
    up to 2 ms, so the thread never spins a core however long a copy takes; a new event
    starts the naps over."""

    _FIRST_NAP_S = 100e-6
    _LONGEST_NAP_S = 2e-3

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._pending: list[tuple["Future", "_CudaPart"]] = []
        self._added = False  # watch() added an event since the thread last napped
        self._thread: Optional[threading.Thread] = None

    def watch(self, fut: "Future", part: "_CudaPart") -> None:
        with self._ready:
            self._pending.append((fut, part))
            self._added = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvcore-cuda-watch", daemon=True)
                self._thread.start()
            self._ready.notify()

    def _run(self) -> None:
        nap = self._FIRST_NAP_S
        while True:
            finished = self._collect_finished()
            for fut in finished:
                fut._part_finished()
            if finished:
                nap = self._FIRST_NAP_S
                del finished, fut  # not kept while later events are polled
                continue
            with self._ready:
                if not self._pending:
                    self._ready.wait()
                elif not self._added:
                    self._ready.wait(nap)  # watch() wakes it early
                added, self._added = self._added, False
            # a new copy may be a short one: it is asked again after the shortest nap
            nap = self._FIRST_NAP_S if added else min(nap * 2, self._LONGEST_NAP_S)

    def _collect_finished(self) -> list["Future"]:
        """Takes the parts that finished off the pending list; returns their Futures."""
        with self._ready:
            pending = list(self._pending)
        done = [(fut, part) for fut, part in pending if _finished_or_failed(part)]
        if done:
            taken = {id(part) for _, part in done}
            with self._ready:  # watch() may have appended meanwhile: keep those
                self._pending = [(f, p) for f, p in self._pending if id(p) not in taken]
        return [fut for fut, _ in done]

    def after_fork_in_child(self) -> None:
        """As the notifier's: no thread in the child, and the parent's copies are not its own."""
        self._ready = threading.Condition(threading.Lock())
        self._pending = []
        self._added = False
        self._thread = None


def _finished_or_failed(part: "_CudaPart") -> bool:
    try:
        return part.done()
    except Exception:  # a CUDA error: result() raises it again
        return True


_notifier = _Notifier()
atexit.register(_notifier.shutdown)
_cuda_watcher = _CudaWatcher()
os.register_at_fork(after_in_child=_count_fork_in_child)
os.register_at_fork(after_in_child=_notifier.after_fork_in_child)
os.register_at_fork(after_in_child=_cuda_watcher.after_fork_in_child)


class _NativePart:
    def __init__(self, native: Any) -> None:
        self.native = native

    def done(self) -> bool:
        return self.native.done()

    def wait(self, timeout: Optional[float]) -> bool:
        return self.native.wait(-1.0 if timeout is None else max(timeout, 0.0))

    def check(self) -> None:
        self.native.check()

    def device_timed_out(self) -> bool:
        """Failed with DeviceTimeoutError: the device may still use the buffers."""
        return self.native.device_timed_out()

    def settled(self) -> bool:
        """Finished; read in a forked child too (a flag in memory, no thread asked)."""
        return self.native.done()


class _CudaPart:
    def __init__(self, event: Any) -> None:
        self.event = event
        self.finished = False  # the event completed without error (known without CUDA)

    def done(self) -> bool:
        if not self.finished:
            self.finished = bool(self.event.query())
        return self.finished

    def wait(self, timeout: Optional[float]) -> bool:
        if self.finished:
            return True
        if timeout is None:
            self.event.synchronize()
            self.finished = True
            return True
        deadline = time.monotonic() + timeout
        delay = 20e-6
        while not self.done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        return True

    def check(self) -> None:
        if not self.finished:
            self.event.synchronize()  # CUDA errors surface here as RuntimeError
            self.finished = True

    def settled(self) -> bool:
        """Known to have finished, without asking CUDA (unusable in a forked child)."""
        return self.finished

    def device_timed_out(self) -> bool:
        return False  # a CUDA copy ends (or fails) with its event: its buffers are free then


class Future:
    """Result of an asynchronous kvcore operation.

    ``done()`` polls, ``wait(timeout)`` blocks up to ``timeout`` seconds (None:
    no limit) and returns whether it finished, ``result(timeout)`` waits and
    returns the value or raises the operation's error (a kvcore exception), and
    ``await fut`` does the same from asyncio without blocking the event loop.
    ``event`` is the CUDA event of a device copy (None otherwise): make a
    stream wait on it to order compute after the copy.

    In a process forked while the operation ran, the operation does not run (its
    threads stayed with the parent): there ``done()`` is True, and ``wait``,
    ``result``, ``exception`` and ``await`` raise kvcore.ForkedOperationError at
    once; a done-callback added there is called at once.

    >>> import asyncio, numpy as np, kvcore
    >>> a = np.ones(4096, np.uint8); b = np.zeros_like(a)
    >>> async def main():
    ...     return await kvcore.copy_async(b, a)
    >>> asyncio.run(main()) is b
    True
    """

    def __init__(
        self,
        *,
        native: Iterable[Any] = (),
        cuda_events: Iterable[Any] = (),
        keep: Iterable[Any] = (),
        result: Callable[[], Any] | None = None,
        value: Any = None,
    ) -> None:
        self._parts: list[Any] = [_NativePart(n) for n in native]
        if cuda_events:
            self._parts += [_CudaPart(e) for e in cuda_events]
        self._keep: Optional[list[Any]] = list(keep)
        self._result_fn = result
        self._value = value
        self._lock = threading.Lock()
        self._lock_generation = _fork_generation
        self._callbacks: list[Callable[["Future"], None]] = []
        self._remaining = len(self._parts)
        self._fired = False
        self._value_ready = False
        self._fork_generation = _fork_generation
        self._pid = _pid
        self.event = None
        if not self._parts:  # finished before it was made (inline work)
            self._fired = True
            self._keep = None
            return
        for part in self._parts:
            if isinstance(part, _NativePart):
                _notifier.register(self, part.native)
            else:
                self.event = part.event
                _cuda_watcher.watch(self, part)

    @classmethod
    def _completed(cls, value: Any) -> "Future":
        """A Future of work that finished before it was made (a small copy run inline): the
        state ``Future(value=value)`` has, set without the general set-up, which costs
        more than such a copy."""
        fut = cls.__new__(cls)
        fut._parts = []
        fut._keep = None
        fut._result_fn = None
        fut._value = value
        fut._lock = threading.Lock()
        fut._lock_generation = fut._fork_generation = _fork_generation
        fut._callbacks = []
        fut._remaining = 0
        fut._fired = True
        fut._value_ready = False
        fut._pid = _pid
        fut.event = None
        return fut

    # -- completion bookkeeping -------------------------------------------------
    def _lock_here(self) -> threading.Lock:
        """The Future's lock, a fresh one the first time it is used in a forked child: a
        thread of the parent (kvcore's notifier finishing it, a caller adding a callback)
        may have held the old one at fork(), and that thread never releases it here."""
        if self._lock_generation != _fork_generation:
            with _lock_renewal:
                if self._lock_generation != _fork_generation:
                    self._lock = threading.Lock()
                    self._lock_generation = _fork_generation
        return self._lock

    def _part_finished(self) -> None:
        with self._lock_here():
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._fire()

    def _fire(self) -> None:
        with self._lock_here():
            if self._fired:
                return
            self._fired = True
            callbacks, self._callbacks = self._callbacks, []
        self._release_buffers()
        for cb in callbacks:
            # On kvcore's thread even a BaseException (SystemExit, asyncio.CancelledError)
            # is only logged: it would end the notifier, and no later Future would complete.
            _call(cb, self, BaseException)

    def _release_buffers(self) -> None:
        keep, self._keep = self._keep, None
        if keep and any(p.device_timed_out() for p in self._parts):
            hold_for_device(keep)  # a device may still write them: never let go
            return
        for obj in keep or ():
            if isinstance(obj, memoryview):
                obj.release()

    def _wait_parts(self, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not part.wait(left):
                return False
        return True

    def _left_in_parent(self) -> bool:
        """True in a forked child for an operation that had not finished at fork(): it
        never finishes here, so waiting for it would never return."""
        if self._fork_generation == _fork_generation:
            return False
        return not all(p.settled() for p in self._parts)

    def _raise_if_left_in_parent(self) -> None:
        if self._left_in_parent():
            self._release_buffers()  # nothing in this process uses them any more
            raise ForkedOperationError(
                f"this operation was started by process {self._pid} and had not finished when it "
                f"forked; it does not run in this process ({os.getpid()}): wait for it in the parent"
            )

    # -- public API --------------------------------------------------------------
    def done(self) -> bool:
        """True when every part of the operation has finished (successfully or not), or, in a
        forked child, when it will not run any more (result() raises ForkedOperationError)."""
        if self._left_in_parent():
            return True
        if not all(p.done() for p in self._parts):
            return False
        # Its buffers are free to use once it says so (a PinnedBuffer to free), not only
        # after wait() or kvcore's notifier let go of them (held for good after a timeout).
        self._release_buffers()
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks up to ``timeout`` seconds (None: until done); True if it finished.

        Raises kvcore.ForkedOperationError in a forked child for an operation of the parent.
        """
        timeout = optional_seconds_arg(timeout, "timeout", allow_zero=True)
        self._raise_if_left_in_parent()
        if not self._wait_parts(timeout):
            return False
        self._release_buffers()
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        """Waits, then returns the value or raises the operation's error.

        Raises kvcore.TimeoutError if it did not finish within ``timeout`` seconds.
        """
        if not self._parts and timeout is None and self._result_fn is None:
            return self._value  # finished before it was made: nothing to wait for or check
        self._finish_within(timeout)
        for part in self._parts:
            part.check()
        if self._result_fn is not None and not self._value_ready:
            with self._lock_here():
                if not self._value_ready:
                    self._value = self._result_fn()
                    self._value_ready = True
        return self._value

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The error the operation raised, or None.

        Raises kvcore.TimeoutError (not the operation's error: it is still running) if it
        did not finish within ``timeout`` seconds.
        """
        self._finish_within(timeout)
        try:
            self.result()
        except Exception as e:  # noqa: BLE001 - reported, not handled
            return e
        return None

    def _finish_within(self, timeout: Optional[float]) -> None:
        if not self.wait(timeout):
            from ..errors import TimeoutError as KVTimeout

            raise KVTimeout(f"operation did not finish within {timeout} s")

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        """Calls ``fn(future)`` once the operation finished (from a kvcore thread,
        or at once if it already has)."""
        if not callable(fn):
            raise InvalidArgumentError(f"add_done_callback needs a callable, got {fn!r}")
        with self._lock_here():
            if not self._fired and not self.done():
                self._callbacks.append(fn)
                fn = None  # type: ignore[assignment]
        if fn is not None:
            _call(fn, self)

    def __await__(self):
        if not self.done():
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_fut: "Future") -> None:
                def settle() -> None:
                    if not waiter.done():
                        waiter.set_result(None)

                try:
                    loop.call_soon_threadsafe(settle)
                except RuntimeError:  # loop closed meanwhile
                    pass

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self.result()

    def __repr__(self) -> str:
        return f"<kvcore.Future {'done' if self.done() else 'pending'} parts={len(self._parts)}>"


def _call(fn: Callable[[Future], None], fut: Future, logged: type[BaseException] = Exception) -> None:
    try:
        fn(fut)
    except logged:  # a failing callback must not kill the notifier thread
        import logging

        logging.getLogger("kvcore").exception("exception in a kvcore.Future done-callback")

"""kvcore in a process forked after it has used its thread pools.

A forked child has only the thread that called fork(), so the pools' workers do
not exist there; before 2026-12-06 a task queued in such a child never ran
(compress_async never completed). The pools now restart their workers in the
child (csrc/parallel/thread_pool.h). The parent and the child run in a fresh
interpreter started for the test, so pytest's own threads are not forked.
"""

import subprocess
import sys
import textwrap

import pytest

CHILD_WORK = textwrap.dedent("""
    import os, sys
    import numpy as np
    import torch
    import kvcore

    def check(x, frame):
        # numpy, not torch, in the child: torch's OpenMP threads are not fork-safe.
        want = x.view(torch.int16).numpy().tobytes()
        assert kvcore.compress(x, threads=2) == frame
        assert kvcore.decompress(frame, threads=2).view(torch.int16).numpy().tobytes() == want
        assert bytes(kvcore.compress_async(x, threads=2).result(timeout=60)) == frame
        out = torch.empty_like(x)
        kvcore.decompress_async(frame, out=out, threads=2).result(timeout=60)
        assert out.view(torch.int16).numpy().tobytes() == want
        src = np.frombuffer(want, dtype=np.uint8)
        dst = np.zeros_like(src)
        kvcore.copy_async(dst, src, engine="cpu", threads=2).result(timeout=60)
        assert dst.tobytes() == want

    x = torch.randn(1 << 21).to(torch.bfloat16)
    frame = kvcore.compress(x, threads=2)
    check(x, frame)  # the parent's pools are now running
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check(x, frame)
            print("child ok", flush=True)
            code = 0
        finally:
            sys.stdout.flush()
            if code:
                os._exit(code)
        sys.exit(0)  # a normal exit: the pools' destructors join the child's own workers
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    check(x, frame)  # and the parent's pools still work
    print("parent ok", flush=True)
""")


@pytest.mark.parametrize("round_", range(3))
def test_pools_work_in_a_forked_child(round_):
    run = subprocess.run([sys.executable, "-c", CHILD_WORK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "child ok" in run.stdout and "parent ok" in run.stdout, run.stdout


NOTIFIER_AFTER_FORK = textwrap.dedent("""
    import os, sys, threading
    import numpy as np
    import kvcore

    class LeftWithTheParent:
        # A native operation in flight at fork(): its task stays with the parent, so in
        # the child it never finishes, and waiting for it there never returns.
        def notify_with(self, token):
            pass

        def done(self):
            return False

        def wait(self, timeout_s):
            if os.getpid() != parent:
                print("the child waited for the parent's operation", flush=True)
                os._exit(3)
            return True

    parent = os.getpid()
    src = np.ones(4 << 20, np.uint8)
    dst = np.empty_like(src)
    kvcore.copy_async(dst, src).result()  # the notifier thread now runs in the parent
    in_flight = kvcore.Future(native=[LeftWithTheParent()])
    pid = os.fork()
    if pid == 0:
        fut = kvcore.copy_async(dst, src)
        fut.done = lambda: False  # still running when the callback is added: the notifier calls it
        called = threading.Event()
        fut.add_done_callback(lambda f: called.set())
        print("child callback", called.wait(10), flush=True)
        sys.exit(0)  # a normal exit: the notifier's shutdown runs at exit
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
""")


def test_futures_complete_in_a_forked_child_and_its_exit_waits_for_none_of_the_parents():
    """The child of a fork() has no notifier thread: a Future's done-callbacks and awaits
    there waited forever; and the child's exit waited, forever, for the operations the
    parent had in flight at fork() (they never finish in the child)."""
    run = subprocess.run([sys.executable, "-c", NOTIFIER_AFTER_FORK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "child callback True" in run.stdout and "child exit 0" in run.stdout, run.stdout + run.stderr[-2000:]


PARENTS_FUTURES_IN_THE_CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    import numpy as np
    import kvcore

    class ParentsCudaCopy:
        # The event of a CUDA copy in flight at fork(): CUDA cannot be used in the child.
        def query(self):
            if os.getpid() != parent:
                print("the child asked CUDA", flush=True)
                os._exit(3)
            return False

        synchronize = query

    parent = os.getpid()
    rng = np.random.default_rng(0)
    data = rng.integers(0, 200, 16 << 20, dtype=np.uint8)
    finished = kvcore.copy_async(np.empty_like(data), data)
    finished.result()
    # More work than the dispatch threads (2..4) take at once: the last ones wait in the queue.
    running = [kvcore.compress_async(data, threads=1) for _ in range(8)]
    cuda = kvcore.Future(cuda_events=[ParentsCudaCopy()])
    in_flight = running[-1]
    print("in flight at fork", not in_flight.done(), flush=True)
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang kills the child (SIGALRM) instead of the test run
        for name, fut in (("native", in_flight), ("cuda", cuda)):
            assert fut.done(), name
            for call in (fut.result, fut.exception, fut.wait, lambda: fut.result(timeout=5)):
                try:
                    call()
                except kvcore.ForkedOperationError as e:
                    assert str(parent) in str(e) and "parent" in str(e), e
                else:
                    raise AssertionError(f"{name}: no ForkedOperationError")
            seen = []
            fut.add_done_callback(lambda f: seen.append(f.done()))
            assert seen == [True], name

            async def wait_for(f):
                return await f

            try:
                asyncio.run(wait_for(fut))
            except kvcore.ForkedOperationError:
                pass
            else:
                raise AssertionError(f"{name}: await raised nothing")
        assert finished.result() is not None and finished.done()  # finished before fork(): as usual
        out = np.empty_like(data)
        assert kvcore.copy_async(out, data).result(timeout=60) is out  # the child's own work
        print("child ok", flush=True)
        sys.stdout.flush()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    frames = [f.result(timeout=120) for f in running]  # the parent's operations finish here
    assert kvcore.decompress(frames[-1]).numpy().tobytes() == data.tobytes()
    print("parent ok", flush=True)
""")


def test_the_parents_futures_raise_in_a_forked_child_instead_of_hanging():
    """In a forked child, waiting (result, exception, wait, await) for an operation that the
    parent had in flight at fork() hung forever: its threads are the parent's. It now raises
    ForkedOperationError at once, done() is True (nothing more happens to it there) and a
    callback added there runs at once; CUDA is not asked. In the parent it completes."""
    run = subprocess.run([sys.executable, "-c", PARENTS_FUTURES_IN_THE_CHILD], capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr[-3000:]
    assert "in flight at fork True" in run.stdout, out  # else the test proves nothing
    assert "child ok" in run.stdout and "child exit 0" in run.stdout, out
    assert run.returncode == 0 and "parent ok" in run.stdout, out


LOCK_HELD_AT_FORK = textwrap.dedent("""
    import os, signal, sys, threading
    import numpy as np
    import kvcore

    data = np.random.default_rng(0).integers(0, 200, 1 << 20, dtype=np.uint8)
    finished = kvcore.compress_async(data, threads=1)
    finished.wait(60)
    # What kvcore's notifier thread does in _part_finished/_fire: hold the Future's lock a
    # moment. fork() by another thread in that moment leaves it held for good in the child.
    held, let_go = threading.Event(), threading.Event()

    def notifier_in_fire():
        with finished._lock:
            held.set()
            let_go.wait()

    threading.Thread(target=notifier_in_fire, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang kills the child (SIGALRM) instead of the test run
        seen = []
        finished.add_done_callback(lambda f: seen.append(f.done()))
        assert seen == [True], seen
        assert kvcore.decompress(finished.result(timeout=5)).numpy().tobytes() == data.tobytes()
        print("child ok", flush=True)
        os._exit(0)
    let_go.set()
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
""")


def test_a_futures_lock_held_by_another_thread_at_fork_does_not_hang_the_child():
    """A Future's lock held by a thread of the parent at fork() (kvcore's notifier finishing
    it, or a caller adding a callback) stayed held for good in the child, where that thread
    does not exist: add_done_callback and result() hung there. A Future takes a fresh lock
    the first time it is used in a forked child."""
    run = subprocess.run([sys.executable, "-c", LOCK_HELD_AT_FORK], capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr[-3000:]
    assert "child ok" in run.stdout and "child exit 0" in run.stdout, out


GRANDCHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import kvcore

    class NeverDone:  # a CUDA event stand-in whose copy never ends
        def query(self):
            return False

        synchronize = query

    src = np.arange(4096, dtype=np.uint8)
    small = kvcore.copy_async(np.zeros_like(src), src)  # finished inline, before any fork
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang kills the child (SIGALRM) instead of the test run
        child = os.getpid()
        assert (small.result() == src).all() and small.done()
        own = kvcore.Future(cuda_events=[NeverDone()])  # started here, in the child
        grandchild = os.fork()
        if grandchild == 0:
            try:
                own.result()
            except kvcore.ForkedOperationError as e:
                print("grandchild names", "the child" if str(child) in str(e) else e, flush=True)
            os._exit(0)
        os.waitpid(grandchild, 0)
        os._exit(0)
    os.waitpid(pid, 0)
""")


def test_an_operation_started_in_a_forked_child_names_that_child_in_its_grandchild():
    """The pid a ForkedOperationError names is read once per process (os.getpid() is a system
    call, a fifth of a small copy's Future): an operation started in a forked child must name
    that child, not the first process, when the child forks in turn. And a small copy finished
    inline before fork() gives its result in the child."""
    run = subprocess.run([sys.executable, "-c", GRANDCHILD], capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr[-3000:]
    assert "grandchild names the child" in run.stdout, out

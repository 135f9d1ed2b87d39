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

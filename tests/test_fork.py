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

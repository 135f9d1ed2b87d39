"""Builds tests/native/mover_threads.cpp with ThreadSanitizer and runs it: asynchronous
copies, gathers and failing tasks submitted from several threads at once, each spread
over the shared pool, with notification tokens asked for before and after the end,
waits with and without timeouts, and a poller woken from another thread. Skipped when
no C++ compiler with ThreadSanitizer is available."""

import subprocess

import pytest

from native_build import ROOT, build_harness

SOURCES = [str(p) for d in ("copy", "parallel", "cpu") for p in sorted((ROOT / "csrc" / d).glob("*.cpp"))]


@pytest.mark.slow
def test_async_operations_under_thread_sanitizer(tmp_path):
    exe = build_harness(tmp_path, "mover_threads", SOURCES, sanitizer="thread")
    run = subprocess.run([str(exe), "11", "40"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert run.stdout.startswith("ok: 1440 operations"), run.stdout

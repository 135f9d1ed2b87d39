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


@pytest.mark.slow
def test_dsa_timeouts_under_thread_sanitizer(tmp_path):
    """Copies from several threads through one DSA engine whose emulated queue runs its first
    descriptors only after the engine gave up on them: parking their slots, reaping them when
    the late completion comes, and falling back to the CPU meanwhile, without a race."""
    sources = SOURCES + [str(p) for p in sorted((ROOT / "csrc" / "dsa").glob("*.cpp"))]
    exe = build_harness(tmp_path, "dsa_overdue_threads", sources, sanitizer="thread")
    run = subprocess.run([str(exe), "5", "30"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert run.stdout.startswith("ok: 90 copies"), run.stdout

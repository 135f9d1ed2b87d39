"""Builds tests/native/batch_threads.cpp with ThreadSanitizer and runs it: compress_many
commits each frame's blocks in order while other frames' blocks are coded, and
decompress_many writes frames side by side into interleaved runs of one buffer, both on
the shared thread pool. A data race there would corrupt frames only now and then; TSan
sees it every time. Skipped when no C++ compiler with ThreadSanitizer is available."""

import subprocess

import pytest

from native_build import build_harness, codec_sources


@pytest.mark.slow
def test_batch_calls_under_thread_sanitizer(tmp_path):
    exe = build_harness(tmp_path, "batch_threads", codec_sources(), sanitizer="thread")
    run = subprocess.run([str(exe), "7", "300"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: 300 batches")

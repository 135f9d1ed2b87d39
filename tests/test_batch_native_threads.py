"""Builds tests/native/batch_threads.cpp with ThreadSanitizer and runs it: compress_many
commits each frame's blocks in order while other frames' blocks are coded, and
decompress_many writes frames side by side into interleaved runs of one buffer, both on
the shared thread pool. A data race there would corrupt frames only now and then; TSan
sees it every time. Skipped when no C++ compiler with ThreadSanitizer is available."""

import re
import subprocess

import pytest

from native_build import LIBRARIES, ROOT, Toolchain, _cxx, build_harness, codec_sources


@pytest.mark.slow
def test_batch_calls_under_thread_sanitizer(tmp_path):
    exe = build_harness(tmp_path, "batch_threads", codec_sources(), sanitizer="thread")
    run = subprocess.run([str(exe), "7", "300"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: 300 batches")
    counts = re.search(r"in their heads: (\d+), heads outgrown: (\d+)", run.stdout)
    assert counts and all(int(c) > 0 for c in counts.groups()), run.stdout  # both outcomes occurred


@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_block_commits_place_every_block_in_order(tmp_path, sanitizer):
    """BlockCommits (how compress_many places blocks coded out of turn) with up to 8 threads
    claiming blocks in order, 1-4 spill buffers among them, random sizes (empty ones too) and
    delays, half the frames starting in a head buffer of random size, half the rounds copying
    spilled blocks with streaming stores: every frame comes out as its blocks back to back (split
    at its head's end), under the sanitizer, with no deadlock (the timeout)."""
    sources = [str(ROOT / "csrc" / p) for p in ("frame/block_commit.cpp", "parallel/thread_pool.cpp",
                                                "copy/copy_engine.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "block_commits_check", sources, sanitizer=sanitizer)
    run = subprocess.run([str(exe), "11", "400"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: 400 rounds")


@pytest.mark.parametrize("sanitizer", ["thread", "address"])
def test_recent_outputs_tell_cold_buffers_from_cached_ones(tmp_path, sanitizer):
    """RecentOutputs (whether a small decode call's output has left the cache, so that it is
    written with streaming stores): scripted cases of each rule, random histories against a
    model that keeps every call (the bounded history must answer as it does), and four
    threads asking and recording at once, under the sanitizer."""
    sources = [str(ROOT / "csrc" / p) for p in ("frame/recent_outputs.cpp", "cpu/cpu_features.cpp")]
    exe = build_harness(tmp_path, "recent_outputs_check", sources, sanitizer=sanitizer)
    run = subprocess.run([str(exe), "5", "300"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.rstrip().endswith("ok: 300 rounds"), run.stdout


def test_allocation_failures_end_in_an_error_not_an_abort_or_a_hang(tmp_path):
    """Allocations (operator new, aligned_alloc) fail after a random count while compress_many
    and decompress_many run on up to 4 pool threads: each call ends ok, with kOutOfMemory or
    with std::bad_alloc in the caller (which the binding turns into MemoryError), and what
    succeeds is bit-exact. Before 2026-12-03 an allocation failing on a pool thread aborted
    the process, and a compress block that threw left the blocks after it waiting forever."""
    exe = build_harness(tmp_path, "alloc_failure_check", codec_sources(), sanitizer="none", opt="-O2")
    run = subprocess.run([str(exe), "5", "300"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: 300 rounds")
    counts = [int(w) for w in run.stdout.replace("(", " ").split() if w.isdigit()]
    assert all(c > 0 for c in counts[1:]), run.stdout  # every outcome occurred


def test_isa_masked_or_unmasked_mid_call_changes_no_frame(tmp_path):
    """kvcore.set_disabled_isa() while another thread codes or decodes: the harness switches
    the ISA (SIMD masked, or unmasked) at each read of it in turn, in compress and in
    decompress of dense, fast, max and DEFLATE frames (of noise, and of repeated rows): every
    frame must decode bit-exact, every decode succeed. Fast mode's 2-byte blocks checked for
    SIMD once, then merged with a kernel that checks again and writes nothing when masked: the
    valid frame failed its checksum (found 2026-12-07)."""
    wrap = "-Wl,--wrap=_ZN6kvcore3cpu10active_isaEv"  # kvcore::cpu::active_isa()
    toolchain = Toolchain(_cxx(), libraries=(*LIBRARIES, wrap))
    exe = build_harness(tmp_path, "isa_switch_check", codec_sources(), sanitizer="none", opt="-O2",
                        toolchain=toolchain)
    run = subprocess.run([str(exe), "3"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok: "), run.stdout

"""The Python tests of the codec, the copy engine and the pool, run against an
extension built with AddressSanitizer and UBSan.

The native harnesses check one unit at a time; this runs the whole binding layer
and every call path the Python tests reach with out-of-bounds accesses and
undefined behaviour turned into failures. Allocations and the stack also hold
other bytes than in a plain build, which can expose results that depend on memory
never written: the whole suite against an -O3 ASan build is how the deflate
planes' match window read from stack garbage was found (deflate_window_check.cpp
now checks that one directly).
"""

import os
import subprocess
import sys

import pytest

from native_build import ROOT, build_sanitized_package, sanitizer_preload

# Test files whose code paths are native; none of them starts a Python subprocess
# (a child would lose the preloaded runtimes' order).
SUITES = ["test_codec.py", "test_corruption.py", "test_api_arguments.py", "test_deflate_frame.py",
          "test_codec_async.py", "test_copy.py", "test_fuzz.py", "test_layout_analysis.py",
          "test_layout_reuse.py"]


@pytest.mark.slow
def test_python_suites_under_asan_and_ubsan(tmp_path):
    path = build_sanitized_package(tmp_path)
    # allocator_may_return_null: the suites ask for allocations no memory holds (2**61 bytes)
    # and expect the refusal torch turns into an error; ASan aborts on them by default.
    env = dict(os.environ, PYTHONPATH=str(path), LD_PRELOAD=sanitizer_preload(),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    probe = subprocess.run([sys.executable, "-c", "import kvcore._native as n; print(n.__file__)"],
                           capture_output=True, text=True, env=env, cwd=ROOT / "tests")
    assert probe.stdout.startswith(str(path)), probe.stdout + probe.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                         capture_output=True, text=True, env=env, cwd=ROOT / "tests", timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

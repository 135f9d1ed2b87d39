"""Builds a harness of tests/native/ against sources of csrc/ with a sanitizer, for the
tests that run one (skipped where no C++ compiler with that sanitizer is found)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The csrc/ folders the frame codec needs (no bindings, no pool or DSA).
CODEC_DIRS = ["frame", "entropy", "shuffle", "lz", "checksum", "parallel", "cpu", "deflate", "qat", "copy"]
SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "thread": ["-fsanitize=thread"],
}


def codec_sources() -> list[str]:
    return [str(p) for d in CODEC_DIRS for p in sorted((ROOT / "csrc" / d).glob("*.cpp"))]


_compiled: dict[tuple[str, str, str], Path] = {}  # (source, sanitizer, opt) -> object, for the session
_objects: list[Path] = []  # the session's object folder, once made


def _object_dir() -> Path:
    if not _objects:
        _objects.append(Path(tempfile.mkdtemp(prefix="kvcore-native-")))
        atexit.register(shutil.rmtree, _objects[0], ignore_errors=True)
    return _objects[0]


def _compile(cxx: str, flags: list[str], source: str, obj: Path) -> subprocess.CompletedProcess:
    return subprocess.run([cxx, *flags, "-c", source, "-o", str(obj)], capture_output=True, text=True)


def build_harness(tmp_path: Path, harness: str, sources: list[str], *, sanitizer: str = "address",
                  opt: str = "-O1") -> Path:
    """Compiles tests/native/<harness>.cpp with sources into tmp_path; returns the program.
    The sources are compiled once per (sanitizer, optimization) in a session, on every core,
    and the objects reused by later harnesses."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    flags = ["-std=c++17", opt, "-g", *SANITIZERS[sanitizer], f"-I{ROOT / 'csrc'}"]
    todo = {s: _object_dir() / f"{len(_compiled) + i}-{Path(s).stem}.o"
            for i, s in enumerate(s for s in sources if (s, sanitizer, opt) not in _compiled)}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = list(pool.map(lambda item: _compile(cxx, flags, *item), todo.items()))
    failed = [r for r in runs if r.returncode != 0]
    if not failed:
        _compiled.update({(s, sanitizer, opt): obj for s, obj in todo.items()})
    exe = tmp_path / harness
    build = failed[0] if failed else subprocess.run(
        [cxx, *flags, str(ROOT / "tests" / "native" / f"{harness}.cpp"),
         *(str(_compiled[(s, sanitizer, opt)]) for s in sources),
         "-lzstd", "-lxxhash", "-lisal", "-ldl", "-lpthread", "-o", str(exe)],
        capture_output=True, text=True)
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"compiler lacks {sanitizer} sanitizer support: " + build.stderr[-300:])
    assert build.returncode == 0, build.stderr[-3000:]
    return exe

"""Builds a harness of tests/native/ against sources of csrc/ with a sanitizer, or the
whole extension with ASan and UBSan, for the tests that run one (skipped where no C++
compiler with that sanitizer is found)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The csrc/ folders the frame codec needs (no bindings, no pool or DSA).
CODEC_DIRS = ["frame", "entropy", "shuffle", "lz", "checksum", "parallel", "cpu", "deflate", "qat", "copy"]
LIBRARIES = ["-lzstd", "-lxxhash", "-lisal", "-ldl", "-lpthread"]
SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "thread": ["-fsanitize=thread"],
    "none": [],  # for valgrind
}


@dataclass(frozen=True)
class Toolchain:
    """A C++ compiler other than the host's (a cross compiler), the flags it needs on top of
    the usual ones, and the libraries a harness links with it."""

    cxx: str
    flags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = tuple(LIBRARIES)


def codec_sources() -> list[str]:
    return [str(p) for d in CODEC_DIRS for p in sorted((ROOT / "csrc" / d).glob("*.cpp"))]


_compiled: dict[tuple[str, ...], Path] = {}  # (source, sanitizer, opt, compiler) -> object, for the session
_object_dirs: list[Path] = []  # the session's object folder, once made


def _object_dir() -> Path:
    if not _object_dirs:
        _object_dirs.append(Path(tempfile.mkdtemp(prefix="kvcore-native-")))
        atexit.register(shutil.rmtree, _object_dirs[0], ignore_errors=True)
    return _object_dirs[0]


def _compile(cxx: str, flags: list[str], source: str, obj: Path) -> subprocess.CompletedProcess:
    return subprocess.run([cxx, *flags, "-c", source, "-o", str(obj)], capture_output=True, text=True)


def _objects(cxx: str, flags: list[str], sources: list[str], key: tuple[str, ...]) -> list[Path]:
    """The objects of sources compiled with flags, compiled once per key (sanitizer,
    optimization, compiler) in a session, on every core; skips the test when the compiler
    lacks the sanitizer."""
    todo = {s: _object_dir() / f"{len(_compiled) + i}-{Path(s).stem}.o"
            for i, s in enumerate(s for s in sources if (s, *key) not in _compiled)}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = list(pool.map(lambda item: _compile(cxx, flags, *item), todo.items()))
    failed = [r for r in runs if r.returncode != 0]
    if failed and key[0] != "none" and "sanitize" in failed[0].stderr:
        pytest.skip(f"compiler lacks {key[0]} sanitizer support: " + failed[0].stderr[-300:])
    assert not failed, failed[0].stderr[-3000:]
    _compiled.update({(s, *key): obj for s, obj in todo.items()})
    return [_compiled[(s, *key)] for s in sources]


def _flags(sanitizer: str, opt: str) -> list[str]:
    # Position-independent, so that the same objects also link into the extension.
    return ["-std=c++17", opt, "-g", "-fPIC", *SANITIZERS[sanitizer], f"-I{ROOT / 'csrc'}"]


def _cxx() -> str:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    return cxx


def build_harness(tmp_path: Path, harness: str, sources: list[str], *, sanitizer: str = "address",
                  opt: str = "-O1", toolchain: Optional[Toolchain] = None) -> Path:
    """Compiles tests/native/<harness>.cpp with sources into tmp_path (with the host's
    compiler, or toolchain's); returns the program. The sources are compiled once per
    (sanitizer, optimization, compiler) in a session, on every core, and the objects
    reused by later harnesses."""
    if toolchain is None:
        toolchain = Toolchain(_cxx())
    cxx, flags = toolchain.cxx, [*_flags(sanitizer, opt), *toolchain.flags]
    objects = _objects(cxx, flags, sources, (sanitizer, opt, cxx))
    exe = tmp_path / harness
    build = subprocess.run(
        [cxx, *flags, str(ROOT / "tests" / "native" / f"{harness}.cpp"), *map(str, objects),
         *toolchain.libraries, "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    return exe


def build_sanitized_package(tmp_path: Path) -> Path:
    """A copy of the kvcore package whose kvcore._native is built from every csrc/ source
    with ASan and UBSan (at -O1), in tmp_path; returns the folder to put on PYTHONPATH.
    Python must run with the sanitizer runtimes preloaded (sanitizer_preload())."""
    import pybind11

    cxx = _cxx()
    if "g++" not in Path(cxx).name:
        pytest.skip("the sanitizer runtimes are preloaded from g++'s")
    flags = _flags("address", "-O1") + [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    sources = [str(p) for p in sorted((ROOT / "csrc").rglob("*.cpp"))]
    objects = _objects(cxx, flags, sources, ("address", "-O1", cxx))
    package = tmp_path / "kvcore"
    shutil.copytree(ROOT / "kvcore", package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    library = package / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    link = subprocess.run([cxx, "-shared", *flags, *map(str, objects), *LIBRARIES, "-o", str(library)],
                          capture_output=True, text=True)
    assert link.returncode == 0, link.stderr[-3000:]
    return tmp_path


def sanitizer_preload() -> str:
    """LD_PRELOAD value for a Python that loads build_sanitized_package's extension."""
    runtimes = [subprocess.run([_cxx(), f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]
    if not all(Path(r).is_absolute() and Path(r).exists() for r in runtimes):
        pytest.skip("the compiler's sanitizer runtimes were not found")
    return " ".join(runtimes)

"""kvcore's native core on a CPU that is not x86-64: built for aarch64 (a Grace or Graviton
host) with the cross compiler and run under qemu-user. There the codec has only its portable
C++ paths (csrc/common/arch.h), and frames must cross between the two architectures both
ways: an aarch64 reader decodes what the x86-64 extension wrote, and writes the same bytes.

Needs g++-aarch64-linux-gnu, qemu-user and the arm64 builds of libzstd, libxxhash and
libisal unpacked in build/aarch64-sysroot: `.ci/aarch64-tools.sh` installs all three (CI
runs it); skipped where they are absent. qemu's speed says nothing about an aarch64 CPU's,
so nothing here is timed.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

import kvcore
import kvdata
from native_build import ROOT, Toolchain, build_harness, codec_sources
from test_channel_transpose import SOURCES as TRANSPOSE_SOURCES
from test_frame_native_fuzz import seed_frames
from test_valgrind import DTYPE_CODES, raw_inputs

SYSROOT = ROOT / "build" / "aarch64-sysroot"
LIBDIR = SYSROOT / "usr" / "lib" / "aarch64-linux-gnu"
CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
GUEST_ROOT = Path("/usr/aarch64-linux-gnu")  # the cross toolchain's libc, for qemu

pytestmark = [
    pytest.mark.skipif(shutil.which(CXX) is None or shutil.which(QEMU) is None,
                       reason=f"{CXX} or {QEMU} is not installed (.ci/aarch64-tools.sh)"),
    pytest.mark.skipif(not (LIBDIR / "libisal.so").exists(),
                       reason=f"no arm64 libraries in {SYSROOT} (.ci/aarch64-tools.sh)"),
    pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present"),
]

TOOLCHAIN = Toolchain(CXX, flags=(f"-isystem{SYSROOT / 'usr' / 'include'}",),
                      libraries=(f"-L{LIBDIR}", "-lzstd", "-lxxhash", "-lisal", "-lpthread", "-ldl"))


def build(tmp_path: Path, harness: str) -> Path:
    return build_harness(tmp_path, harness, codec_sources(), sanitizer="none", opt="-O2", toolchain=TOOLCHAIN)


def run_aarch64(args: list, timeout: int = 900) -> subprocess.CompletedProcess:
    # The cross toolchain's libc first: where arm64 packages are installed too (multiarch), the
    # loader would otherwise take /lib/aarch64-linux-gnu's libc, of another build than its own.
    libs = f"LD_LIBRARY_PATH={GUEST_ROOT / 'lib'}:{LIBDIR}"
    return subprocess.run([QEMU, "-L", str(GUEST_ROOT), "-E", libs, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_the_build_has_no_x86_code(tmp_path):
    exe = build(tmp_path, "modes_round_trip")
    header = subprocess.run(["readelf", "-h", str(exe)], capture_output=True, text=True).stdout
    assert "AArch64" in header
    # No x86 kernel is left for the dispatch to reach: every one is compiled out.
    symbols = subprocess.run(["readelf", "-Ws", "-C", str(exe)], capture_output=True, text=True).stdout
    code = [line for line in symbols.splitlines() if " FUNC " in line or " OBJECT " in line]
    assert len(code) > 500
    assert not [line for line in code if "avx" in line.lower() or "bmi2" in line.lower()]


def test_the_extension_sources_compile_for_aarch64():
    """What the codec harnesses leave out: the binding layer, the pinned pool and the DSA engine
    (checked for errors, not linked: there is no arm64 Python here, so the binding sees this
    Python's headers)."""
    import pybind11

    rest = [p for p in sorted((ROOT / "csrc").rglob("*.cpp")) if str(p) not in codec_sources()]
    assert any(p.name == "bindings.cpp" for p in rest)
    for source in rest:
        run = subprocess.run([CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", f"-I{ROOT / 'csrc'}",
                              f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
                              *TOOLCHAIN.flags, str(source)], capture_output=True, text=True)
        assert run.returncode == 0 and "warning" not in run.stderr, f"{source.name}: {run.stderr[-3000:]}"


def test_channel_transposes_on_aarch64(tmp_path):
    """The portable tiles that aarch64 dispatches to, against the scalar reference, on shapes
    around the tile edges."""
    exe = build_harness(tmp_path, "channel_transpose_check", TRANSPOSE_SOURCES, sanitizer="none", opt="-O2",
                        toolchain=TOOLCHAIN)
    run = run_aarch64([exe])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok: 800 cases"), run.stdout


def test_every_encoder_configuration_round_trips_on_aarch64(tmp_path):
    """dense, dense with lanes, fast, max, DEFLATE, 4 KiB blocks, two threads: each frame
    decodes to its tensor and is coded twice to the same bytes."""
    exe = build(tmp_path, "modes_round_trip")
    run = run_aarch64([exe, *raw_inputs(tmp_path)])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok: 35 frames"), run.stdout


def interchange_cases() -> list[tuple[str, torch.Tensor, str, int]]:
    """(name, tensor, mode, block bytes): slices of every kvdata file and dtype the codec
    takes, in every mode, small and default blocks."""
    cases = []
    for file in ("stories260k_text_kv_bf16.safetensors", "minilm_l6_kv_fp16.safetensors"):
        ts = kvdata.tensors(file)
        keys = sorted(ts)
        t = torch.cat([ts[keys[0]][:1500], ts[keys[-1]][:1500]])  # [tokens, heads, dim]
        stem = file.split("_")[0]
        tensors = {"native": t, "fp32": t.float(), "e4m3": t.float().to(torch.float8_e4m3fn)}
        for kind, x in tensors.items():
            for mode in ("dense", "fast", "max", "lanes", "deflate"):
                cases.append((f"{stem}-{kind}-{mode}", x, mode, 0))
        cases.append((f"{stem}-small-blocks", t, "dense", 16384))
    v0 = kvdata.tensors("stories260k_text_kv_bf16.safetensors")["layer0.v"][:2048]  # repeated rows
    cases += [("rows-dense", v0, "dense", 0), ("rows-fast", v0, "fast", 0)]
    return cases


def x86_frame(x: torch.Tensor, mode: str, block_bytes: int) -> bytes:
    options = {"block_bytes": block_bytes or None, "threads": 1}
    if mode == "lanes":
        return kvcore.compress(x, decoder="avx512", **options)
    if mode == "deflate":
        return kvcore.compress(x, backend="software", **options)
    return kvcore.compress(x, mode=mode, **options)


def test_frames_cross_between_x86_64_and_aarch64(tmp_path):
    exe = build(tmp_path, "frame_interchange")
    cases = interchange_cases()
    lines = []
    for name, x, mode, block_bytes in cases:
        x = x.contiguous()
        (tmp_path / f"{name}.raw").write_bytes(x.view(torch.uint8).numpy().tobytes())
        (tmp_path / f"{name}.frame").write_bytes(x86_frame(x, mode, block_bytes))
        dims = " ".join(map(str, x.shape))
        lines.append(f"{name} {DTYPE_CODES[x.dtype]} {mode} {block_bytes} {dims}")
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    run = run_aarch64([exe, tmp_path / "cases.txt"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.startswith(f"ok: {len(cases)} frames"), run.stdout
    for name, x, mode, _ in cases:
        theirs = (tmp_path / f"{name}.here").read_bytes()
        back = kvcore.decompress(theirs)  # an aarch64 frame, read here
        assert torch.equal(back.contiguous().view(torch.uint8), x.contiguous().view(torch.uint8)), name
        if mode != "deflate":  # ISA-L's aarch64 and x86 deflate may pick other matches
            assert theirs == (tmp_path / f"{name}.frame").read_bytes(), f"{name}: aarch64 wrote other bytes"


def test_frame_decoder_on_mutants_on_aarch64(tmp_path):
    """Bit flips, overwrites, truncations and edited headers of real frames: every mutant
    decodes to its seed's bytes or fails with a status (the x86 build's fuzz target)."""
    exe = build(tmp_path, "frame_fuzz")
    run = run_aarch64([exe, "2027", "600", *seed_frames(tmp_path)])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok:"), run.stdout

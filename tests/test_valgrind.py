"""Native harnesses built without sanitizers and run under valgrind's memcheck:
every encoder configuration on real KV tensors (tests/native/modes_round_trip.cpp)
and the frame decoder on mutants (tests/native/frame_fuzz.cpp).

ASan cannot see a read of memory that was allocated but never written; memcheck
can, also inside the system libraries kvcore calls. Valgrind has no AVX-512, so
kvcore dispatches its AVX2 variant here; the portable one runs with the ISA mask.
Skipped where valgrind is not installed (.ci/apt-packages.txt installs it).
"""

import os
import shutil
import subprocess

import pytest
import torch

import kvdata
from native_build import build_harness, codec_sources
from test_frame_native_fuzz import seed_frames

pytestmark = [
    pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed"),
    pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present"),
]

# dtype codes of docs/FORMAT.md
DTYPE_CODES = {torch.float8_e4m3fn: 3, torch.float16: 5, torch.bfloat16: 6, torch.float32: 7}


def memcheck(args: list, isa_mask: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, KVCORE_DISABLE_ISA=isa_mask)
    return subprocess.run(["valgrind", "-q", "--error-exitcode=99", "--track-origins=yes", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=900)


def raw_inputs(tmp_path) -> list:
    """(file, dtype code, columns) for 2-D token x channel slices of the kvdata files."""
    args = []
    for name in ("stories260k_text_kv_bf16.safetensors", "minilm_l6_kv_bf16.safetensors",
                 "stories260k_text_kv_fp16.safetensors"):
        ts = kvdata.tensors(name)
        keys = sorted(ts)
        t = torch.cat([ts[keys[0]][:3000], ts[keys[-1]][:3000]]).flatten(1)
        variants = [t] if t.dtype != torch.bfloat16 or "stories" not in name else \
            [t, t.float(), t.float().to(torch.float8_e4m3fn)]
        for i, v in enumerate(variants):
            path = tmp_path / f"{name.split('.')[0]}-{i}.raw"
            path.write_bytes(v.contiguous().view(torch.uint8).numpy().tobytes())
            args += [path, DTYPE_CODES[v.dtype], v.shape[1]]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("isa_mask", ["", "avx512,avx2"])
def test_every_encoder_configuration_under_memcheck(tmp_path, isa_mask):
    exe = build_harness(tmp_path, "modes_round_trip", codec_sources(), sanitizer="none", opt="-O2")
    run = memcheck([exe, *raw_inputs(tmp_path)], isa_mask)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert run.stdout.startswith("ok: 35 frames"), run.stdout  # 5 inputs x 7 configurations


@pytest.mark.slow
def test_frame_decoder_on_mutants_under_memcheck(tmp_path):
    exe = build_harness(tmp_path, "frame_fuzz", codec_sources(), sanitizer="none", opt="-O2")
    run = memcheck([exe, "2027", "3000", *seed_frames(tmp_path)])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert run.stdout.startswith("ok:")

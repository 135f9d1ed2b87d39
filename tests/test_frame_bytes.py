"""Frames compressed into new bytes objects (bindings.cpp, trim_frame), in a fresh process.

Not in test_codec.py: the ASan run of the codec suites (test_sanitized_extension.py) takes
only files that start no Python subprocess."""

import subprocess
import sys
from pathlib import Path

import pytest

import kvdata

pytestmark = pytest.mark.skipif(not kvdata.files(), reason="../shared/kvdata is not present")

NEW_BYTES_SCRIPT = """
import sys, torch, kvcore
sys.path.insert(0, sys.argv[1])
import kvdata
kv = kvdata.stacked("stories260k_text_kv_fp16.safetensors")
xs = [kv[i] for i in range(kv.shape[0])] + [kv[0, :1000], kv[1].float()]
frames = [kvcore.compress(x, mode=mode) for mode in ("dense", "fast") for x in xs]
frames += kvcore.compress_many(xs[:3])
frames += [kvcore.compress_async(x).result() for x in xs[:3]]
buf = bytearray(kvcore.max_frame_size(xs[-1].dtype, tuple(xs[-1].shape)))
expected = [bytes(kvcore.compress(x, mode=mode, out=buf)) for mode in ("dense", "fast") for x in xs]
expected += expected[:3] + expected[:3]
assert [type(f) for f in frames] == [bytes] * len(expected)
assert frames == expected
for f, x in zip(frames, (xs + xs + xs[:3] + xs[:3])):
    assert torch.equal(kvcore.decompress(f).view(torch.uint8), x.contiguous().view(torch.uint8))
print("ok", len(frames))
"""


def test_new_bytes_frames_of_one_capacity_kept_side_by_side():
    """A frame into a new bytes object is written into one of its bound's size; a frame whose
    bound exceeds every earlier one's is then copied into an exact-size object, and the others
    are shrunk in place (bindings.cpp, trim_frame). In a fresh process, so that both ways run:
    the ten stories260K tensors (1.5 MiB each), a smaller and a larger one, through compress,
    compress_many and compress_async, all kept alive, give the frames compress writes into a
    reused buffer and decode bit-exact."""
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", NEW_BYTES_SCRIPT, tests], capture_output=True, text=True,
                          timeout=300, cwd=tests)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


LARGE_SCRIPT = """
import sys, torch, kvcore
sys.path.insert(0, sys.argv[1])
import kvdata
fp16 = kvdata.stacked("minilm_l6_kv_fp16.safetensors")  # 37.7 MB: a 32.0 MB dense frame
bf16 = kvdata.stacked("minilm_l6_kv_bf16.safetensors")  # a 25 MB dense frame
noise = torch.randint(-2**15, 2**15, (20 * 2**20,), dtype=torch.int16, generator=torch.Generator().manual_seed(5))
cases = [(fp16, "dense"), (fp16, "max"), (fp16, "fast"), (bf16, "dense"), (noise.view(torch.bfloat16), "dense")]
buf = bytearray(max(kvcore.max_frame_size(x.dtype, tuple(x.shape)) for x, _ in cases))
kept = []
for round in range(3):
    for x, mode in cases:
        frame = kvcore.compress(x, mode=mode)
        assert type(frame) is bytes
        assert frame == bytes(kvcore.compress(x, mode=mode, out=buf)), (round, mode)
        pending = kvcore.compress_async(x, mode=mode)
        assert pending.result() == frame and pending.result() is pending.result()
        assert torch.equal(kvcore.decompress(frame).view(torch.uint8), x.view(torch.uint8))
        if round == 1:
            kept.append((frame, x))
for frame, x in kept:
    assert torch.equal(kvcore.decompress(frame).view(torch.uint8), x.view(torch.uint8))
print("ok", len(kept))
"""


def test_new_bytes_frames_of_tensors_past_32_mib():
    """A tensor whose frame bound passes 32 MiB is coded into a head just under it where its
    sampled entropy says the frame fits (dense and max modes; bindings.cpp, kHeadBytes), else
    into a bytes object of the bound; compress_async likewise. In a fresh process: MiniLM's fp16
    KV (37.7 MB, a 32.0 MB frame) in dense, max and fast mode, its bf16 KV and 40 MB of noise (raw
    planes, a frame past the head), three times over, some frames kept alive: the frames compress
    writes into a reused buffer, decoded bit-exact."""
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", LARGE_SCRIPT, tests], capture_output=True, text=True,
                          timeout=300, cwd=tests)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok 5")

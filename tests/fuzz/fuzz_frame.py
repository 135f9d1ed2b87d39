"""atheris fuzz targets for the frame decoder and the round trip.

Run longer by hand:  python tests/fuzz/fuzz_frame.py decode -max_total_time=600 CORPUS_DIR
                     python tests/fuzz/fuzz_frame.py roundtrip -max_total_time=600
                     python tests/fuzz/fuzz_frame.py kvslices -max_total_time=600
tests/test_fuzz.py runs them briefly in CI, the decoder seeded with valid frames.

Only kvcore's Python is instrumented, not the native coder, so the fuzzer's coverage does
not see which coding methods an input reaches and keeps a seed corpus of real tensors down
to a few bytes. kvslices therefore takes its data from real KV (../shared/kvdata): the
input only picks a slice, its shape and the coding options, and edits some values.
"""

import sys
from functools import lru_cache
from pathlib import Path

import atheris

import torch  # not instrumented: coverage is wanted in kvcore, and torch is large

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for kvdata
from kvdata import KVDATA  # noqa: E402

with atheris.instrument_imports(include=["kvcore"]):
    import kvcore

DTYPES = [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]


def fuzz_decode(data: bytes) -> None:
    """Any byte string decodes or raises CorruptFrameError; nothing else."""
    try:
        kvcore.frame_info(data)
    except kvcore.CorruptFrameError:
        pass
    try:
        kvcore.decompress(data)
    except kvcore.CorruptFrameError:
        pass


def fuzz_roundtrip(data: bytes) -> None:
    """Any tensor round-trips bit-exactly in every mode, also with its rows repeated
    (the rows and zstd methods)."""
    if len(data) < 3:
        return
    dtype = DTYPES[data[0] % len(DTYPES)]
    mode = ("dense", "fast", "max")[data[1] % 3]
    reps = 1 + data[2] % 8
    payload = data[3:]
    size = torch.empty(0, dtype=dtype).element_size()
    payload = payload[: len(payload) - len(payload) % size]
    x = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype) if payload else torch.empty(0, dtype=dtype)
    rows = max(1, len(x) // 8) if len(x) % 8 == 0 and len(x) else 1
    x = x.reshape(rows, -1) if len(x) else x
    if reps > 1 and len(x):
        order = torch.arange(rows * reps) * (1 + 2 * (data[2] >> 3)) % rows  # rows repeated, reordered
        x = x[order].contiguous()
    frame = kvcore.compress(x, mode=mode, block_bytes=64 + (data[1] // 3) * 16)
    back = kvcore.decompress(frame)
    assert torch.equal(back.reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8))


@lru_cache(maxsize=None)
def real_kv(dtype: torch.dtype) -> torch.Tensor:
    """The values of every real KV file's tensors, flat, in dtype (fp16 files for fp16,
    bf16 files cast for the rest)."""
    from safetensors.torch import load_file

    source = "fp16" if dtype == torch.float16 else "bf16"
    parts = [t.reshape(-1) for f in sorted(KVDATA.glob(f"*_{source}.safetensors")) for t in load_file(str(f)).values()]
    if not parts:
        raise SystemExit(f"kvslices needs the real KV files of {KVDATA}")
    flat = torch.cat(parts)
    return flat.view(torch.uint8) if dtype == torch.uint8 else flat.to(dtype)


def fuzz_kv_slices(data: bytes) -> None:
    """A slice of real KV, edited by the input, round-trips bit-exactly in every dtype and
    mode: the input picks the slice, its channel count, repeated rows, the mode and block
    size, then overwrites bytes at the positions it names."""
    fdp = atheris.FuzzedDataProvider(data)
    dtype = DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)]
    mode = ("dense", "fast", "max")[fdp.ConsumeIntInRange(0, 2)]
    block_bytes = 64 * fdp.ConsumeIntInRange(1, 1024)
    channels = (1, 8, 32, 384, 1000)[fdp.ConsumeIntInRange(0, 4)]
    rows = 1 + fdp.ConsumeIntInRange(0, 8192 // channels)
    reps = fdp.ConsumeIntInRange(1, 4)
    base = real_kv(dtype)
    start = channels * fdp.ConsumeIntInRange(0, (len(base) - rows * channels) // channels)  # as a tensor's rows
    x = base[start:start + rows * channels].reshape(rows, channels).clone()
    if reps > 1:
        x = x[torch.arange(rows * reps) * fdp.ConsumeIntInRange(1, 7) % rows].contiguous()
    raw = x.view(-1).view(torch.uint8)
    while fdp.remaining_bytes() >= 4:
        raw[fdp.ConsumeIntInRange(0, raw.numel() - 1)] = fdp.ConsumeInt(1) & 0xFF
    frame = kvcore.compress(x, mode=mode, block_bytes=block_bytes)
    back = kvcore.decompress(frame)
    assert torch.equal(back.reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8))


TARGETS = {"decode": fuzz_decode, "roundtrip": fuzz_roundtrip, "kvslices": fuzz_kv_slices}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()

"""atheris fuzz targets for the frame decoder and the round trip.

Run longer by hand:  python tests/fuzz/fuzz_frame.py decode -max_total_time=600 CORPUS_DIR
                     python tests/fuzz/fuzz_frame.py roundtrip -max_total_time=600
tests/test_fuzz.py runs both briefly in CI, the decoder seeded with valid frames.
"""

import sys

import atheris

import torch  # not instrumented: coverage is wanted in kvcore, and torch is large

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


TARGETS = {"decode": fuzz_decode, "roundtrip": fuzz_roundtrip}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()

"""Byte-plane shuffle (kvcore._native.shuffle_*) against a numpy reference, on every SIMD variant."""

import itertools

import numpy as np
import pytest

import kvcore
from kvcore import _native

from isa_variants import VARIANTS, use_variant

DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}
SIZES = [0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000]
# (period, phase) of the residual; None: no residual.
RESIDUALS = [None, (1, 0), (3, 2), (32, 31), (384, 100), (65536, 40000)]


@pytest.fixture(params=VARIANTS)
def variant(request):
    use_variant(request.param)
    yield request.param
    kvcore.set_disabled_isa("")


def ref_split(data: bytes, elem_size: int, rotate: bool, residual: bytes | None, phase: int) -> list[bytes]:
    """The definition: little-endian elements, rotate left by 1, byte p -> plane p, top plane -= residual."""
    a = np.frombuffer(data, dtype=DTYPES[elem_size]).copy()
    one, bits = a.dtype.type(1), a.dtype.type(8 * elem_size - 1)
    if rotate:
        a = (a << one) | (a >> bits)
    planes = [((a >> a.dtype.type(8 * p)) & a.dtype.type(0xFF)).astype(np.uint8) for p in range(elem_size)]
    if residual is not None:
        r = np.frombuffer(residual, np.uint8)
        planes[-1] = planes[-1] - r[(phase + np.arange(a.size)) % r.size]
    return [p.tobytes() for p in planes]


def make_residual(rng, spec):
    if spec is None:
        return None, 0
    period, phase = spec
    return rng.integers(0, 256, period, dtype=np.uint8).tobytes(), phase


@pytest.mark.parametrize("residual_spec", RESIDUALS, ids=lambda s: "nores" if s is None else f"p{s[0]}ph{s[1]}")
@pytest.mark.parametrize("rotate", [False, True], ids=["plain", "rot"])
@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_split_and_merge_match_reference(variant, elem_size, rotate, residual_spec):
    rng = np.random.default_rng(elem_size * 100 + rotate)
    residual, phase = make_residual(rng, residual_spec)
    for n in SIZES:
        data = rng.integers(0, 256, n * elem_size, dtype=np.uint8).tobytes()
        expected = ref_split(data, elem_size, rotate, residual, phase)
        planes = _native.shuffle_split(data, elem_size, rotate, residual, phase)
        assert planes == expected, f"split n={n}"
        assert _native.shuffle_merge(expected, elem_size, rotate, residual, phase) == data, f"merge n={n}"


@pytest.mark.parametrize("residual_spec", [None, (1, 0), (384, 383), (65536, 7)], ids=str)
@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_large_odd_size(variant, elem_size, residual_spec):
    n = 1000003
    rng = np.random.default_rng(n + elem_size)
    residual, phase = make_residual(rng, residual_spec)
    data = rng.integers(0, 256, n * elem_size, dtype=np.uint8).tobytes()
    for rotate in (False, True):
        expected = ref_split(data, elem_size, rotate, residual, phase)
        assert _native.shuffle_split(data, elem_size, rotate, residual, phase) == expected
        assert _native.shuffle_merge(expected, elem_size, rotate, residual, phase) == data


def _unaligned(data: bytes, offset: int) -> memoryview:
    """A writable view of a copy of data that starts `offset` bytes into its allocation."""
    buf = bytearray(len(data) + 8)
    view = memoryview(buf)[offset : offset + len(data)]
    view[:] = data
    return view


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_unaligned_buffers(variant, elem_size, offset):
    rng = np.random.default_rng(offset)
    residual, phase = make_residual(rng, (384, 5))
    for n in (33, 129, 4099):
        data = rng.integers(0, 256, n * elem_size, dtype=np.uint8).tobytes()
        expected = ref_split(data, elem_size, True, residual, phase)
        src = _unaligned(data, offset)
        outs = [_unaligned(bytes(n), (offset + p) % 4) for p in range(elem_size)]
        _native.shuffle_split_into(src, elem_size, True, residual, phase, outs)
        assert [bytes(o) for o in outs] == expected
        assert _native.shuffle_split(src, elem_size, True, residual, phase) == expected
        planes_in = [_unaligned(p, (offset + 2 * k) % 4) for k, p in enumerate(expected)]
        dst = _unaligned(bytes(n * elem_size), 4 - offset)
        _native.shuffle_merge_into(planes_in, elem_size, True, residual, phase, dst)
        assert bytes(dst) == data
        assert _native.shuffle_merge(planes_in, elem_size, True, residual, phase) == data


def _at_line_offset(n: int, offset: int) -> tuple[np.ndarray, int]:
    """A buffer of 0xA5 bytes, and where in it an n-byte plane starts `offset` bytes into a 64-byte line."""
    buf = np.full(n + 192, 0xA5, np.uint8)
    return buf, (-buf.ctypes.data) % 64 + 64 + offset


@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_split_peels_to_cache_lines_at_every_offset(variant, elem_size):
    """Planes that share an offset in their cache line are split with a scalar head up to the
    next line (runs of 4096+ elements); planes at different offsets are split as they are.
    Either way the bytes equal the reference, and nothing outside the planes is written."""
    rng = np.random.default_rng(elem_size)
    residual, phase = make_residual(rng, (384, 5))
    for n in (4095, 4096, 4159, 5001):
        data = rng.integers(0, 256, n * elem_size, dtype=np.uint8).tobytes()
        expected = ref_split(data, elem_size, True, residual, phase)
        for offsets in [[o] * elem_size for o in range(64)] + [[(7 * p + 1) % 64 for p in range(elem_size)]]:
            placed = [_at_line_offset(n, o) for o in offsets]
            _native.shuffle_split_into(data, elem_size, True, residual, phase, [b[at : at + n] for b, at in placed])
            assert [b[at : at + n].tobytes() for b, at in placed] == expected, f"n={n} offsets={offsets}"
            for b, at in placed:
                assert (b[:at] == 0xA5).all() and (b[at + n :] == 0xA5).all()


_STREAMED: dict[int, tuple[bytes, bytes, list[bytes]]] = {}


def _streamed_input(elem_size: int) -> tuple[bytes, bytes, list[bytes]]:
    """32 MiB and a few elements (at least kvcore's streaming threshold on any machine), a
    residual, and the reference planes (rotated, residual from phase 5)."""
    if elem_size not in _STREAMED:
        rng = np.random.default_rng(100 + elem_size)
        n = (32 << 20) // elem_size + 4099
        data = rng.integers(0, 256, n * elem_size, dtype=np.uint8).tobytes()
        residual, _ = make_residual(rng, (384, 5))
        _STREAMED[elem_size] = (data, residual, ref_split(data, elem_size, True, residual, 5))
    return _STREAMED[elem_size]


@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_large_splits_stream_whole_lines_at_any_plane_offsets(variant, elem_size):
    """Outputs of 32 MiB or more (half the last-level cache, where that is less) are split with
    streaming stores where AVX-512 runs: whole cache lines, a plane that starts inside a line
    from two vectors. Planes at one offset and at different ones must equal the reference, and
    nothing outside them may be written."""
    data, residual, expected = _streamed_input(elem_size)
    n = len(expected[0])
    for offsets in ([0] * elem_size, [(23 * p + 5) % 64 for p in range(elem_size)]):
        placed = [_at_line_offset(n, o) for o in offsets]
        _native.shuffle_split_into(data, elem_size, True, residual, 5, [b[at : at + n] for b, at in placed])
        assert [b[at : at + n].tobytes() for b, at in placed] == expected, f"offsets={offsets}"
        for b, at in placed:
            assert (b[:at] == 0xA5).all() and (b[at + n :] == 0xA5).all()


def test_into_variants_write_only_their_range(variant):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 2 * 1001, dtype=np.uint8).tobytes()
    big = bytearray(b"\xaa" * (1001 + 2))
    big2 = bytearray(b"\xbb" * (1001 + 2))
    _native.shuffle_split_into(data, 2, True, None, 0, [memoryview(big)[1:-1], memoryview(big2)[1:-1]])
    assert big[0] == 0xAA and big[-1] == 0xAA and big2[0] == 0xBB and big2[-1] == 0xBB
    dst = bytearray(b"\xcc" * (2 * 1001 + 2))
    _native.shuffle_merge_into([bytes(big[1:-1]), bytes(big2[1:-1])], 2, True, None, 0, memoryview(dst)[1:-1])
    assert dst[0] == 0xCC and dst[-1] == 0xCC and bytes(dst[1:-1]) == data


@pytest.mark.parametrize("split_with,merge_with", list(itertools.product(VARIANTS, VARIANTS)))
@pytest.mark.parametrize("elem_size", [1, 2, 4])
def test_cross_variant_round_trip(split_with, merge_with, elem_size):
    rng = np.random.default_rng(elem_size)
    residual, phase = make_residual(rng, (96, 17))
    data = rng.integers(0, 256, 5003 * elem_size, dtype=np.uint8).tobytes()
    try:
        for rotate, res in ((False, None), (True, None), (True, residual)):
            ph = phase if res is not None else 0
            use_variant(split_with)
            planes = _native.shuffle_split(data, elem_size, rotate, res, ph)
            use_variant(merge_with)
            assert _native.shuffle_merge(planes, elem_size, rotate, res, ph) == data
            assert planes == ref_split(data, elem_size, rotate, res, ph)
    finally:
        kvcore.set_disabled_isa("")


def _kv_tensors(kvdata_dir, name: str):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    path = kvdata_dir / name
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return torch, st.load_file(str(path))


@pytest.mark.parametrize(
    "name",
    [
        "minilm_l6_kv_bf16.safetensors",
        "minilm_l6_kv_fp16.safetensors",
        "stories260k_text_kv_bf16.safetensors",
        "stories260k_text_kv_fp16.safetensors",
    ],
)
def test_real_kv_tensors(variant, kvdata_dir, name):
    torch, tensors = _kv_tensors(kvdata_dir, name)
    for key in sorted(tensors)[:4]:
        t = tensors[key]
        period = t.shape[-2] * t.shape[-1]  # channels = kv_heads * head_dim
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        # Residual: each channel's most common (rotated) top byte, as the codec would pick it.
        top = np.frombuffer(ref_split(data, 2, True, None, 0)[1], np.uint8).reshape(-1, period)
        residual = bytes(int(np.bincount(col, minlength=256).argmax()) for col in top.T)
        for rotate, res in ((False, None), (True, None), (True, residual)):
            expected = ref_split(data, 2, rotate, res, 0)
            planes = _native.shuffle_split(data, 2, rotate, res, 0)
            assert planes == expected, key
            assert _native.shuffle_merge(planes, 2, rotate, res, 0) == data, key
        # A chunk starting mid-row: phase = channel of its first element.
        start = 3 * period + 77
        chunk = data[2 * start : 2 * (start + 10007)]
        phase = start % period
        planes = _native.shuffle_split(chunk, 2, True, residual, phase)
        assert planes == ref_split(chunk, 2, True, residual, phase)
        assert _native.shuffle_merge(planes, 2, True, residual, phase) == chunk


# ---- argument validation ----


def test_rejects_bad_elem_size():
    for es in (0, 3, 8, -1):
        with pytest.raises(kvcore.InvalidArgumentError, match="elem_size"):
            _native.shuffle_split(b"\0" * 24, es)
        with pytest.raises(kvcore.InvalidArgumentError, match="elem_size"):
            _native.shuffle_merge([b"\0" * 8] * 3, es)


def test_rejects_partial_element():
    with pytest.raises(kvcore.InvalidArgumentError, match="whole number"):
        _native.shuffle_split(b"\0" * 7, 2)
    with pytest.raises(kvcore.InvalidArgumentError, match="whole number"):
        _native.shuffle_split(b"\0" * 6, 4)


def test_rejects_bad_planes():
    with pytest.raises(kvcore.InvalidArgumentError, match="differ in length"):
        _native.shuffle_merge([b"\0" * 8, b"\0" * 9], 2)
    with pytest.raises(kvcore.InvalidArgumentError, match="expected 2 planes"):
        _native.shuffle_merge([b"\0" * 8], 2)
    with pytest.raises(kvcore.InvalidArgumentError, match="bytes-like"):
        _native.shuffle_merge([b"\0" * 8, 5], 2)
    for not_a_list in (b"\0\0", 5, None):
        with pytest.raises(kvcore.InvalidArgumentError, match="list"):
            _native.shuffle_merge(not_a_list, 2)
        with pytest.raises(kvcore.InvalidArgumentError, match="list"):
            _native.shuffle_split_into(b"\0" * 4, 2, False, None, 0, not_a_list)


def test_rejects_bad_residual_and_phase():
    with pytest.raises(kvcore.InvalidArgumentError, match="empty"):
        _native.shuffle_split(b"\0" * 8, 2, False, b"", 0)
    with pytest.raises(kvcore.InvalidArgumentError, match="phase"):
        _native.shuffle_split(b"\0" * 8, 2, False, b"\1\2\3", 3)
    with pytest.raises(kvcore.InvalidArgumentError, match="phase"):
        _native.shuffle_merge([b"\0" * 4, b"\0" * 4], 2, False, b"\1\2\3", 7)
    with pytest.raises(kvcore.InvalidArgumentError, match="phase"):
        _native.shuffle_split(b"\0" * 8, 2, False, None, 1)
    with pytest.raises(kvcore.InvalidArgumentError, match="phase"):
        _native.shuffle_split(b"\0" * 8, 2, False, b"\1", -1)
    with pytest.raises(kvcore.InvalidArgumentError, match="residual"):
        _native.shuffle_split(b"\0" * 8, 2, False, 17, 0)


def test_rejects_bad_buffers():
    with pytest.raises(kvcore.InvalidArgumentError, match="src"):
        _native.shuffle_split("not bytes", 2)
    with pytest.raises(kvcore.InvalidArgumentError, match="C-contiguous"):
        _native.shuffle_split(memoryview(bytearray(16))[::2], 1)
    with pytest.raises(kvcore.InvalidArgumentError, match="read-only"):
        _native.shuffle_split_into(b"\0" * 8, 2, False, None, 0, [bytearray(4), b"\0" * 4])
    with pytest.raises(kvcore.InvalidArgumentError, match="needs 4"):
        _native.shuffle_split_into(b"\0" * 8, 2, False, None, 0, [bytearray(4), bytearray(5)])
    with pytest.raises(kvcore.InvalidArgumentError, match="output planes"):
        _native.shuffle_split_into(b"\0" * 8, 2, False, None, 0, [bytearray(4)])
    with pytest.raises(kvcore.InvalidArgumentError, match="needs 8"):
        _native.shuffle_merge_into([b"\0" * 4, b"\0" * 4], 2, False, None, 0, bytearray(9))
    with pytest.raises(kvcore.InvalidArgumentError, match="read-only"):
        _native.shuffle_merge_into([b"\0" * 4, b"\0" * 4], 2, False, None, 0, b"\0" * 8)


def test_accepts_numpy_and_torch_buffers():
    torch = pytest.importorskip("torch")
    t = torch.arange(1000, dtype=torch.float32).to(torch.bfloat16)
    arr = t.view(torch.uint8).numpy()
    planes = _native.shuffle_split(arr, 2, True)
    assert planes == ref_split(arr.tobytes(), 2, True, None, 0)
    assert _native.shuffle_merge([np.frombuffer(p, np.uint8) for p in planes], 2, True) == arr.tobytes()

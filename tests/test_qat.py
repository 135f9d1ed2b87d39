"""kvcore's QATzip binding (csrc/qat/) against a test double, and against the
real libqatzip.so.3 where it is installed.

The test double tests/native/qatzip_double.c implements QATzip's entry points
over zlib; the fixture compiles it (cc -shared -fPIC -lz) and loads it through
QatConfig(library_path=...). Its qzdouble_* functions (ctypes) simulate a
machine without QAT and inject QATzip's error codes.
"""

import ctypes
import ctypes.util
import os
import struct
import threading
import time
import zlib

import numpy as np
import pytest
from isal import isal_zlib

import kvcore
from kvcore import _native
from kvcore.qat import QatConfig

from frame_layout import deflate_pieces
from qat_double import (  # noqa: F401  (fixtures)
    OP_COMPRESS, OP_DECOMPRESS, OP_INIT, OP_SETUP, QZ_BUF_ERROR, QZ_DATA_ERROR, QZ_DEFLATE_RAW, QZ_FAIL,
    QZ_NOSW_NO_HW, QZ_NOSW_UNSUPPORTED_FMT, QZ_TIMEOUT, double, double_path,
)

PIECE = 64 * 1024


def counters() -> dict:
    return kvcore.qat.status()["counters"]


def sample(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.choice(np.arange(118, 127, dtype=np.uint8), size=n).tobytes()


# ---- loading and probing ----


def test_load_probes_with_software_backup_off(double):
    st = kvcore.qat.status()
    assert st["loaded"] and st["hardware"] and st["has_ext_api"]
    assert st["library"] == str(double.path)
    assert double.stat("last_init_sw_backup") == 0
    assert double.stat("last_sw_backup") == 0
    assert double.stat("last_data_fmt") == QZ_DEFLATE_RAW
    assert double.stat("last_hw_buff_sz") == PIECE
    assert double.stat("last_input_sz_thrshold") == 128
    # the probe's session is torn down again
    assert double.stat("setup_calls") == 1 and double.stat("teardown_calls") == 1
    assert double.stat("live_sessions") == 0
    f = kvcore.features()["qat"]
    assert f["present"] and f["hardware"]


def test_no_hardware_is_certain_and_reported(double):
    double.hardware(False)
    st = QatConfig(library_path=double.path).apply()
    assert st["loaded"] and not st["hardware"]
    assert st["probe_code"] == QZ_NOSW_NO_HW
    assert "QZ_NOSW_NO_HW" in st["message"]
    assert not kvcore.features()["qat"]["hardware"]


@pytest.mark.parametrize("op,rc,name", [(OP_INIT, QZ_NOSW_NO_HW, "QZ_NOSW_NO_HW"),
                                        (OP_SETUP, QZ_NOSW_UNSUPPORTED_FMT, "QZ_NOSW_UNSUPPORTED_FMT")])
def test_probe_failures_mean_no_hardware(double, op, rc, name):
    double.fail(op, rc, 1)
    st = QatConfig(library_path=double.path).apply()
    assert not st["hardware"] and st["probe_code"] == rc and name in st["message"]


def test_load_errors(tmp_path):
    with pytest.raises(kvcore.UnsupportedError, match="cannot load"):
        QatConfig(library_path=tmp_path / "missing.so").apply()
    assert not kvcore.qat.status()["loaded"]
    libz = ctypes.util.find_library("z")
    with pytest.raises(kvcore.UnsupportedError, match="entry point"):
        QatConfig(library_path=libz).apply()
    assert not kvcore.qat.status()["loaded"]
    kvcore.qat.unload()



@pytest.mark.parametrize("options", [
    dict(library_path=5), dict(library_path=["libqatzip.so.3"]), dict(min_bytes=4096.5), dict(min_bytes="4096"),
    dict(min_bytes=True), dict(min_bytes=-1), dict(min_bytes=1 << 32), dict(min_bytes=1 << 70),
])
def test_bad_configurations_are_invalid_arguments(options):
    # A path of the wrong type or a min_bytes that is no int of 32 bits raised TypeError
    # (os.fspath's, or pybind11's "incompatible function arguments").
    with pytest.raises(kvcore.InvalidArgumentError):
        QatConfig(**options).apply()


def test_a_library_path_with_a_nul_byte_is_refused(double_path):
    # dlopen read the path up to the NUL: a path naming a missing file loaded the library before it.
    for path in (f"{double_path}\0.missing", os.fsencode(double_path) + b"\0.missing"):
        with pytest.raises(kvcore.InvalidArgumentError, match="NUL"):
            QatConfig(library_path=path).apply()
        assert not kvcore.qat.status()["loaded"]


# ---- compression through QAT, read by software and the other way round ----


def test_qat_written_is_software_readable(double):
    n = 5 * PIECE + 1000
    data = sample(n, seed=1)
    payload, rep = _native.deflate_plane_encode_report(data, backend="qat", level=1)
    assert rep == {"pieces": 6, "qat_pieces": 6, "software_pieces": 0, "stored_pieces": 0, "fallback_pieces": 0}
    c = counters()
    assert c["hw_compress_calls"] == 6 and c["hw_bytes_in"] == n
    assert double.stat("compress_calls") == 6
    assert double.stat("max_src_len") == PIECE  # split at the hardware buffer size
    pieces = deflate_pieces(payload)
    assert [o for o, _ in pieces] == [PIECE] * 5 + [1000]
    assert b"".join(isal_zlib.decompress(p, wbits=-15) for _o, p in pieces) == data
    assert b"".join(zlib.decompress(p, -15) for _o, p in pieces) == data
    kvcore.qat.unload()  # a machine without QAT
    assert _native.deflate_plane_decode(payload, n) == data


def test_software_written_is_qat_readable(double):
    n = 3 * PIECE + 4000
    data = sample(n, seed=2)
    payload = _native.deflate_plane_encode(data, backend="software")
    assert double.stat("compress_calls") == 0
    assert _native.deflate_plane_decode(payload, n, backend="qat") == data
    assert double.stat("decompress_calls") == 4
    assert counters()["hw_decompress_calls"] == 4


def test_auto_uses_qat_for_large_pieces_only(double):
    QatConfig(library_path=double.path, min_bytes=8192).apply()
    data = sample(PIECE + 5000, seed=3)  # pieces of 65536 and 5000 bytes
    payload, rep = _native.deflate_plane_encode_report(data, backend="auto")
    assert rep["qat_pieces"] == 1 and rep["software_pieces"] == 1
    assert rep["fallback_pieces"] == 0  # policy, not a failure
    assert _native.deflate_plane_decode(payload, len(data)) == data


def test_pieces_under_qatzip_threshold_go_to_software_even_for_qat(double):
    data = sample(100, seed=4)
    payload, rep = _native.deflate_plane_encode_report(data, backend="qat")
    assert rep["software_pieces"] == 1 and rep["qat_pieces"] == 0
    assert double.stat("compress_calls") == 0
    assert _native.deflate_plane_decode(payload, 100) == data


def test_fallback_to_software_without_hardware(double):
    double.hardware(False)
    QatConfig(library_path=double.path).apply()
    data = sample(4 * PIECE, seed=5)
    payload, rep = _native.deflate_plane_encode_report(data, backend="auto")
    assert rep["software_pieces"] == 4 and rep["qat_pieces"] == 0
    assert double.stat("compress_calls") == 0  # QATzip's own zlib fallback is never used
    assert counters()["hw_compress_calls"] == 0
    assert _native.deflate_plane_decode(payload, len(data), backend="auto") == data
    assert double.stat("decompress_calls") == 0
    with pytest.raises(kvcore.UnsupportedError, match="QZ_NOSW_NO_HW"):
        _native.deflate_plane_encode(data, backend="qat")


def test_software_execution_reported_by_ext_rc_is_not_counted_as_hardware(double):
    double.sw_execution(True)
    data = sample(2 * PIECE, seed=6)
    payload = _native.deflate_plane_encode(data, backend="qat")
    c = counters()
    assert c["sw_execution_calls"] == 2 and c["hw_compress_calls"] == 0
    assert _native.deflate_plane_decode(payload, len(data)) == data


# ---- error codes ----


def test_buf_error_stores_the_piece(double):
    data = sample(3 * PIECE, seed=7)
    double.fail(OP_COMPRESS, QZ_BUF_ERROR, 1)
    payload, rep = _native.deflate_plane_encode_report(data, backend="qat", threads=1)
    assert rep["stored_pieces"] == 1 and rep["qat_pieces"] == 2
    assert counters()["buf_errors"] == 1
    assert kvcore.qat.status()["last_error_code"] == QZ_BUF_ERROR
    assert _native.deflate_plane_decode(payload, len(data)) == data


@pytest.mark.parametrize("rc", [QZ_FAIL, QZ_TIMEOUT, QZ_DATA_ERROR])
def test_compress_failure_falls_back_in_auto_and_raises_in_qat(double, rc):
    data = sample(3 * PIECE, seed=8)
    double.fail(OP_COMPRESS, rc, 2)
    payload, rep = _native.deflate_plane_encode_report(data, backend="auto", threads=1)
    assert rep["qat_pieces"] == 1 and rep["software_pieces"] == 2 and rep["fallback_pieces"] == 2
    c = counters()
    assert c["fallback_pieces"] == 2
    assert c["other_errors"] + c["data_errors"] == 2
    assert _native.deflate_plane_decode(payload, len(data)) == data
    double.fail(OP_COMPRESS, rc, 1)
    with pytest.raises(kvcore.BackendError, match="qzCompress failed"):
        _native.deflate_plane_encode(data, backend="qat", threads=1)


def test_decompress_errors_are_judged_by_isal(double):
    data = sample(2 * PIECE, seed=9)
    payload = _native.deflate_plane_encode(data, backend="software")
    double.fail(OP_DECOMPRESS, QZ_DATA_ERROR, 1)  # QAT rejects a valid piece: ISA-L decodes it
    assert _native.deflate_plane_decode(payload, len(data), backend="qat", threads=1) == data
    c = counters()
    assert c["data_errors"] == 1 and c["fallback_pieces"] == 1 and c["hw_decompress_calls"] == 1
    double.fail(OP_DECOMPRESS, QZ_BUF_ERROR, 1)
    assert _native.deflate_plane_decode(payload, len(data), backend="qat", threads=1) == data
    # corrupt data: both QAT and ISA-L reject it
    bad = bytearray(payload)
    pieces_start = 4 + 8 * 2
    bad[pieces_start + 1 : pieces_start + 40] = b"\xff" * 39
    with pytest.raises(kvcore.CorruptFrameError):
        _native.deflate_plane_decode(bytes(bad), len(data), backend="qat")


# ---- session life-cycle ----


def test_one_session_per_thread_reused_and_closed_at_thread_exit(double):
    # Sessions of earlier tests (other threads, other loads) may still be open in
    # the double, so everything here is measured as a difference.
    data = sample(2 * PIECE, seed=10)
    _native.deflate_plane_encode(data, backend="qat", threads=1)
    live, setups, teardowns = (double.stat(k) for k in ("live_sessions", "setup_calls", "teardown_calls"))
    _native.deflate_plane_encode(data, backend="qat", threads=1)
    assert double.stat("setup_calls") == setups  # this thread's session is reused
    assert double.stat("live_sessions") == live

    _native.deflate_plane_encode(data, backend="qat", level=6, threads=1)  # new level: new session
    assert double.stat("last_comp_lvl") == 6
    assert double.stat("setup_calls") == setups + 1 and double.stat("teardown_calls") == teardowns + 1
    assert double.stat("live_sessions") == live

    def worker():
        _native.deflate_plane_encode(data, backend="qat", threads=1)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert double.stat("setup_calls") == setups + 2
    # Closed by the thread's exit, which finishes a moment after join() returns.
    deadline = time.monotonic() + 5
    while double.stat("teardown_calls") < teardowns + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert double.stat("teardown_calls") == teardowns + 2
    assert double.stat("live_sessions") == live


def test_pool_threads_get_their_own_sessions(double):
    data = sample(16 * PIECE, seed=11)
    setups = double.stat("setup_calls")
    payload, rep = _native.deflate_plane_encode_report(data, backend="qat", threads=None)
    assert rep["qat_pieces"] == 16
    assert 1 <= double.stat("setup_calls") - setups <= _native.hardware_threads()
    assert _native.deflate_plane_decode(payload, len(data)) == data


def test_reload_replaces_sessions(double):
    data = sample(PIECE, seed=12)
    _native.deflate_plane_encode(data, backend="qat", threads=1)
    live, teardowns = double.stat("live_sessions"), double.stat("teardown_calls")
    QatConfig(library_path=double.path).apply()  # the probe opens and closes one session
    assert double.stat("teardown_calls") == teardowns + 1
    _native.deflate_plane_encode(data, backend="qat", threads=1)
    assert double.stat("teardown_calls") == teardowns + 2  # the stale session is torn down first
    assert double.stat("live_sessions") == live


# ---- allocator hook for the pinned pool ----


def test_pinned_allocation_through_qzmalloc(double):
    assert _native.qat_pinned_alloc_check(1 << 20) == (True, True)
    assert double.stat("mallocs") == 1 and double.stat("frees") == 1
    double.hardware(False)
    QatConfig(library_path=double.path).apply()
    assert _native.qat_pinned_alloc_check(1 << 20) == (False, False)


# ---- the real QATzip, where the machine has it ----


def _system_qatzip_present() -> bool:
    try:
        ctypes.CDLL("libqatzip.so.3")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _system_qatzip_present(),
                    reason="libqatzip.so.3 not installed (package libqatzip3: Debian 13, Ubuntu 24.04+)")
def test_system_qatzip_round_trip():
    st = QatConfig().apply()
    assert st["loaded"]
    data = sample(4 * PIECE + 77, seed=13)
    try:
        backend = "qat" if st["hardware"] else "auto"
        payload, rep = _native.deflate_plane_encode_report(data, backend=backend)
        if st["hardware"]:
            assert rep["qat_pieces"] >= 4
        assert b"".join(zlib.decompress(p, -15) for _o, p in deflate_pieces(payload)) == data
        kvcore.qat.unload()
        assert _native.deflate_plane_decode(payload, len(data)) == data
    finally:
        kvcore.qat.unload()

"""The QATzip test double (tests/native/qatzip_double.c): build, load, knobs.

The fixture compiles the double (cc -shared -fPIC -lz) and loads it through
QatConfig(library_path=...); its qzdouble_* functions (ctypes) simulate a machine
without QAT and inject QATzip's error codes. Import the fixtures into a test
module with ``from qat_double import double, double_path  # noqa: F401``.
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

import kvcore
from kvcore.qat import QatConfig

HERE = Path(__file__).resolve().parent

QZ_FAIL = -2
QZ_BUF_ERROR = -3
QZ_DATA_ERROR = -4
QZ_TIMEOUT = -5
QZ_NO_HW = 11
QZ_NOSW_NO_HW = -101
QZ_NOSW_UNSUPPORTED_FMT = -116
QZ_DEFLATE_RAW = 3
OP_ANY, OP_COMPRESS, OP_DECOMPRESS, OP_INIT, OP_SETUP = 0, 1, 2, 3, 4


class Double:
    """Handle on the compiled test double: knobs and call counters."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))  # same file as kvcore's dlopen: one shared state
        self.lib.qzdouble_stat.restype = ctypes.c_long
        self.lib.qzdouble_stat.argtypes = [ctypes.c_char_p]
        self.lib.qzdouble_fail.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]

    def stat(self, name: str) -> int:
        v = self.lib.qzdouble_stat(name.encode())
        assert v != -1 or name.startswith("last_"), name
        return v

    def reset(self) -> None:
        self.lib.qzdouble_reset()

    def hardware(self, present: bool) -> None:
        self.lib.qzdouble_set_hardware(int(present))

    def sw_execution(self, on: bool) -> None:
        self.lib.qzdouble_set_sw_execution(int(on))

    def fail(self, op: int, rc: int, count: int = 1) -> None:
        self.lib.qzdouble_fail(op, rc, count)


@pytest.fixture(scope="session")
def double_path(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the QATzip test double")
    out = tmp_path_factory.mktemp("qatzip_double") / "libqatzip_double.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(HERE / "native" / "qatzip_double.c"), "-lz"],
        check=True,
    )
    return out


@pytest.fixture
def double(double_path):
    d = Double(double_path)
    d.reset()
    QatConfig(library_path=double_path, min_bytes=4096).apply()
    kvcore.qat.reset_counters()
    yield d
    kvcore.qat.unload()
    d.reset()

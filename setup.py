"""Build of kvcore's native core (`kvcore._native`).

Every ``.cpp`` file under ``csrc/`` is compiled into one extension. The system
libraries it links come from Debian packages; a missing one stops the build with
the name of the package to install. QATzip and libaccel-config are *not* linked:
the core loads them with dlopen at run time when they are present.
"""

import os
import sys
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# header -> (library to link, Debian package that provides both)
SYSTEM_LIBRARIES = [
    ("zstd.h", "zstd", "libzstd-dev"),
    ("xxhash.h", "xxhash", "libxxhash-dev"),
    ("isa-l/igzip_lib.h", "isal", "libisal-dev"),
]

HEADER_DIRS = ["/usr/include", "/usr/local/include", "/usr/include/x86_64-linux-gnu"]


def _header_dirs() -> list[str]:
    """The system header folders plus those the compiler takes from the environment
    (CPATH and friends), so a library unpacked under another prefix is found too."""
    extra = [
        d
        for var in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")
        for d in os.environ.get(var, "").split(os.pathsep)
        if d
    ]
    return extra + HEADER_DIRS


def _check_system_libraries() -> None:
    missing = [
        (header, package)
        for header, _lib, package in SYSTEM_LIBRARIES
        if not any(os.path.exists(os.path.join(d, header)) for d in _header_dirs())
    ]
    if missing:
        lines = "\n".join(f"  {h}: apt-get install {p}" for h, p in missing)
        packages = " ".join(p for _h, p in missing)
        sys.exit(
            "kvcore: system libraries missing, the build needs these headers:\n"
            f"{lines}\nInstall them with: apt-get install -y {packages}"
        )


if not any(arg in sys.argv for arg in ("egg_info", "sdist", "--help", "clean")):
    _check_system_libraries()

ParallelCompile("NPY_NUM_BUILD_JOBS", default=0).install()  # compile files in parallel

sources = sorted(glob("csrc/**/*.cpp", recursive=True))
# Without the headers here, an edit to a header alone leaves the extension "up to date".
headers = sorted(glob("csrc/**/*.h", recursive=True))

native = Pybind11Extension(
    "kvcore._native",
    sources,
    depends=headers,
    include_dirs=["csrc"],
    libraries=[lib for _h, lib, _p in SYSTEM_LIBRARIES] + ["dl", "pthread"],
    cxx_std=17,
    extra_compile_args=["-O3", "-fno-strict-aliasing", "-fvisibility=hidden", "-Wall", "-Wextra"],
)

setup(
    name="kvcore",
    version="0.1.0",
    description="Lossless KV-cache compression and tiered storage for LLM inference",
    packages=find_packages(include=["kvcore", "kvcore.*"]),
    ext_modules=[native],
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "torch>=2.1", "safetensors>=0.4", "xxhash>=3.0"],
    entry_points={"console_scripts": ["kvcore=kvcore.cli:main"]},
    zip_safe=False,
)

"""Helpers for the data mover tests: pinned pools that work under any RLIMIT_MEMLOCK.

A locked pool needs CAP_IPC_LOCK or a memlock limit above what the process
already has locked plus the pool's size; Debian's default for users is 8 MiB.
Tests that are not about locking create pools with lock=True only when that fits.
"""

import resource
from pathlib import Path

import kvcore


def _status_field(name: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def has_ipc_lock() -> bool:
    cap = _status_field("CapEff")
    return bool(cap) and bool(int(cap, 16) & (1 << 14))


def can_lock(nbytes: int) -> bool:
    if has_ipc_lock():
        return True
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if soft == resource.RLIM_INFINITY:
        return True
    locked_kib = int((_status_field("VmLck") or "0 kB").split()[0])
    return soft - locked_kib * 1024 >= nbytes + (4 << 20)


def make_pool(capacity: int, **kwargs) -> kvcore.PinnedPool:
    kwargs.setdefault("lock", can_lock(capacity))
    return kvcore.PinnedPool(capacity, **kwargs)

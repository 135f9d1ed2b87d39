"""Helpers for the tier tests: real KV tensors, a real redis-server and a small filesystem."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

from kvcore.tiers import RemoteConfig
from kvdata import KVDATA


def errors_of_threads(target, count: int, timeout: Optional[float] = None) -> list[BaseException]:
    """Runs target(0) .. target(count - 1) on as many threads at once; returns what they raised.
    With a timeout, a thread still running after it (a call left waiting) is reported too, as a
    TimeoutError, and left behind as a daemon."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=timeout is not None) for i in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    errors += [TimeoutError(f"thread {i} still running after {timeout} s")
               for i, th in enumerate(threads) if th.is_alive()]
    return errors


def wait_until(condition, timeout: float = 10.0) -> None:
    """Polls condition() until it holds or timeout seconds pass (the caller asserts after)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def load_kv(name: str = "minilm_l6_kv_bf16.safetensors") -> torch.Tensor:
    """[layers, 2, tokens, kv_heads, head_dim] from a ../shared/kvdata file."""
    from safetensors.torch import load_file

    path = KVDATA / name
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    d = load_file(str(path))
    layers = sorted({int(k[5:].split(".")[0]) for k in d})
    return torch.stack([torch.stack([d[f"layer{i}.k"], d[f"layer{i}.v"]]) for i in layers])


def qwen_shaped_chunk(tokens: int = 256, layers: int = 36, heads: int = 8, dim: int = 128,
                      name: str = "minilm_l6_kv_bf16.safetensors") -> torch.Tensor:
    """A Qwen3-8B-shaped chunk [36, 2, tokens, 8, 128] of real bf16 values from kvdata
    (rows of the source tensors, regrouped into 1024-value rows)."""
    src = load_kv(name)  # [L, 2, T, H, D]
    L = src.shape[0]
    per = heads * dim
    out = torch.empty(layers, 2, tokens, heads, dim, dtype=src.dtype)
    for l in range(layers):
        for j in range(2):
            flat = src[l % L, j].reshape(-1)
            rows = flat[: flat.numel() // per * per].reshape(-1, per)
            off = (l // L * tokens * 3 + 17 * l) % (rows.shape[0] - tokens)
            out[l, j] = rows[off:off + tokens].reshape(tokens, heads, dim)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_redis(**kw) -> RemoteConfig:
    """A RemoteConfig for the local test server. A call that times out opens the breaker (a
    timeout trips it at once): every remote call is then skipped for reset_after_s, and on a
    loaded machine the default lookup_timeout_s of 0.25 s (less likely op_timeout_s, 2 s)
    could run out against a healthy server. Tests about timeouts set theirs."""
    kw.setdefault("lookup_timeout_s", 10.0)
    kw.setdefault("op_timeout_s", 10.0)
    return RemoteConfig(**kw)


class PortTaken(OSError):
    """Another process took the port chosen for a server before the server could bind it."""


def start_on_a_free_port(make):
    """make(port) -> a server with start(); started on a free port. A port is free when
    chosen, but another process may bind it before the server does: then another one."""
    for _ in range(4):
        server = make(free_port())
        try:
            server.start()
            return server
        except PortTaken:
            continue
    raise RuntimeError("no free port could be bound")


class RedisServer:
    """A real redis-server on a loopback port: start, kill (-9), pause (SIGSTOP), resume."""

    def __init__(self, port: int, workdir: Path, extra: tuple = ()):
        self.port = port
        self.workdir = workdir
        self.extra = list(extra)
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Starts the server on self.port; PortTaken when another process has it."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # it could not listen: the port was taken meanwhile
                self.proc = None
                raise PortTaken(self.port)
            try:
                if self._answers():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("redis-server did not start")

    def _answers(self) -> bool:
        """Whether our redis-server answers on the port (not another process that took it)."""
        password = self.extra[self.extra.index("--requirepass") + 1] if "--requirepass" in self.extra else None
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            auth = f"AUTH {password}\r\n".encode() if password else b""
            s.sendall(auth + b"INFO server\r\n")
            reply = b""
            while b"process_id:" not in reply or not reply.split(b"process_id:", 1)[1].count(b"\r\n"):
                data = s.recv(1 << 16)
                if not data:
                    return False
                reply += data
        return int(reply.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0]) == self.proc.pid

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; .ci/run installs it)")
    server = start_on_a_free_port(lambda port: RedisServer(port, tmp_path))
    yield server
    if server.proc is not None:
        try:
            server.resume()
        except OSError:
            pass
    server.kill()


def _cluster_ports(n: int) -> list:
    """n distinct free ports p whose cluster bus ports p + 10000 are free too."""
    import random

    rng = random.Random()
    ports: list = []
    while len(ports) < n:
        p = rng.randrange(20000, 45000)
        if p in ports:
            continue
        try:
            for q in (p, p + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        ports.append(p)
    return ports


@pytest.fixture
def redis_cluster(tmp_path):
    """Three redis-server nodes in cluster mode (no replicas) on loopback ports."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server / redis-cli are not installed")
    ports = _cluster_ports(3)
    procs = []
    for p in ports:
        d = tmp_path / str(p)
        d.mkdir()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no", "--dir", str(d)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for p in ports:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", p), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        r = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                            "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, timeout=60)
        if r.returncode != 0:
            pytest.skip(f"could not create a redis cluster: {r.stderr.decode()[-200:]}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = subprocess.run(["redis-cli", "-p", str(ports[0]), "cluster", "info"], capture_output=True)
            if b"cluster_state:ok" in info.stdout:
                break
            time.sleep(0.2)
        yield f"redis+cluster://127.0.0.1:{ports[0]}/0"
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (a disk that fills up), or a skip where mounting is not allowed."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def leftover_temporaries(directory) -> list:
    """Every temporary file under an SSD tier directory, of any owner (each has a folder)."""
    return [p for p in (Path(directory) / "kvcore-v1" / "tmp").rglob("*") if p.is_file()]


def with_codec(blob: bytes, code: int) -> bytes:
    """blob as a kvcore that stores frames with codec code would write it (checksum included)."""
    return with_bytes(blob, 5, bytes([code]))


def with_version(blob: bytes, version: int) -> bytes:
    """blob with another format version in its header (checksum included), as a later kvcore
    whose format kept the same header start would write it."""
    return with_bytes(blob, 4, bytes([version]))


def with_bytes(blob: bytes, offset: int, data: bytes) -> bytes:
    """blob with data written at offset and its checksum recomputed (a forged blob)."""
    from kvcore.tiers.blob import checksum

    b = bytearray(blob)
    b[offset:offset + len(data)] = data
    b[-8:] = checksum(bytes(b[:-8])).to_bytes(8, "little")
    return bytes(b)

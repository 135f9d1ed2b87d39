"""`kvcore serve`: the tier manager behind a small HTTP API (loopback-only by default).

Endpoints (JSON in and out unless noted; a superset of Intel KV Shrink's
/v1/cache/status|persist|evict|metrics):

    GET  /v1/cache/status              status()
    GET  /v1/cache/metrics, /metrics   Prometheus text
    GET  /healthz                      "ok"
    POST /v1/cache/lookup   {"tokens": [...]}                       -> {"tokens": n, "tiers": [...]}
    POST /v1/cache/persist  {"tokens": [...]}                       -> {"persisted": chunks}
    POST /v1/cache/evict    {"tokens": [...]} | {"count": n} | {"bytes": b}  -> {"evicted": chunks}
    POST /v1/cache/pin | /v1/cache/unpin      {"tokens": [...]}
    POST /v1/cache/priority {"tokens": [...], "level": 3}
    POST /v1/cache/ttl      {"tokens": [...], "seconds": 60}
    POST /v1/cache/prefetch {"tokens": [...]}
    POST /v1/cache/estimate {"tokens": [...], "prefill_s_per_token": 2e-4}
    POST /v1/cache/clear    {} | {"namespace": "model-id"}
    POST /v1/cache/flush    {}
    POST /v1/cache/store    body: safetensors with "tokens" (int64 [n]) and "kv" ([layers, 2, n, heads, dim])
    POST /v1/cache/retrieve {"tokens": [...], "layers": L, "kv_heads": H, "head_dim": D, "dtype": "bfloat16"}
                            -> safetensors with "kv" [L, 2, restored, H, D]; header X-KVCore-Tokens

Usage::

    kvcore serve --ddr-bytes 8G --ssd-dir /nvme/kvcache --ssd-bytes 200G --port 8411
    curl -s localhost:8411/v1/cache/status
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from .._args import DECODERS, MODES

HELP = "serve the tier manager over HTTP (status, lookup, persist, evict, metrics, ...)"

MAX_BODY = 1 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """'8G' -> 8589934592; plain numbers are bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)] if unit else t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"byte sizes must be finite and >= 0, got {text!r}")
    return int(value * _UNITS[unit])


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"ports are 0 to 65535, got {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8411, help="port (default 8411; 0 = any free port)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host (the API has no authentication)")
    parser.add_argument("--ddr-bytes", type=parse_bytes, default=parse_bytes("1G"), help="DDR capacity (1G)")
    parser.add_argument("--ssd-dir", default=None, help="SSD tier directory (off when absent)")
    parser.add_argument("--ssd-bytes", type=parse_bytes, default=0, help="SSD tier capacity")
    parser.add_argument("--remote-url", default=None, help="redis://host:port/db (redis+cluster:// for cluster)")
    parser.add_argument("--remote-ttl", type=float, default=None, help="default TTL of remote entries (s)")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--model", default="default", help="model id (part of the key namespace)")
    parser.add_argument("--dtype", default="", help="KV dtype (part of the key namespace)")
    parser.add_argument("--tp-rank", type=int, default=0)
    parser.add_argument("--tp-world", type=int, default=1)
    parser.add_argument("--salt", default="", help="tenant salt (part of the key namespace)")
    parser.add_argument("--policy", choices=("lru", "cost"), default="lru")
    parser.add_argument("--codec", choices=("auto", *MODES, "raw"), default="auto")
    parser.add_argument("--codec-decoder", choices=DECODERS, default="any",
                        help="avx512: dense/max frames that decode faster on CPUs with AVX-512 VBMI2 "
                             "(every reader of the store should have it)")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tokens(body: dict) -> list:
    toks = body.get("tokens")
    if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
        raise ValueError('"tokens" must be a list of integers')
    return toks


def _dim(body: dict, name: str) -> int:
    """A shape field of a retrieve request: an integer >= 1 (2.5 or "2" were taken as 2, -1 was a 500)."""
    v = body.get(name)
    if type(v) is not int or v < 1:
        raise ValueError(f'"{name}" must be an integer >= 1, got {v!r}')
    return v


class _Handler(BaseHTTPRequestHandler):
    server_version = "kvcore"
    protocol_version = "HTTP/1.1"

    @property
    def tm(self):
        return self.server.manager

    def log_message(self, fmt, *args):  # quiet unless asked
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _send(self, code: int, body: bytes, ctype: str, headers: Optional[dict] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj, default=str).encode(), "application/json")

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(n)

    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/cache/status", "/status"):
            return self._json(200, self.tm.status())
        if path in ("/v1/cache/metrics", "/metrics"):
            return self._send(200, self.tm.prometheus().encode(), "text/plain; version=0.0.4")
        if path == "/healthz":
            return self._send(200, b"ok\n", "text/plain")
        self._json(404, {"error": f"no such endpoint: GET {path}"})

    def do_POST(self):
        from ..errors import KVCoreError

        path = self.path.split("?", 1)[0].rstrip("/")
        op = path.removeprefix("/v1/cache/")
        try:
            raw = self._body()
            if op == "store":
                return self._store(raw)
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            handler = getattr(self, "_op_" + op, None) if "/" not in op else None
            if handler is None:
                return self._json(404, {"error": f"no such endpoint: POST {path}"})
            result = handler(body)
            if result is not None:
                self._json(200, result)
        except (ValueError, TypeError, KeyError, KVCoreError) as exc:
            self._json(400, {"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # never kill the server thread
            self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

    # ---- operations ----
    def _op_lookup(self, b):
        hit = self.tm.lookup(_tokens(b))
        return {"tokens": hit.tokens, "tiers": hit.tiers}

    def _op_persist(self, b):
        return {"persisted": self.tm.persist(_tokens(b))}

    def _op_evict(self, b):
        if "tokens" in b:
            return {"evicted": self.tm.evict(_tokens(b))}
        return {"evicted": self.tm.evict(count=b.get("count"), nbytes=b.get("bytes"))}

    def _op_pin(self, b):
        return {"pinned": self.tm.pin(_tokens(b))}

    def _op_unpin(self, b):
        return {"unpinned": self.tm.unpin(_tokens(b))}

    def _op_priority(self, b):
        return {"chunks": self.tm.set_priority(_tokens(b), b["level"])}

    def _op_ttl(self, b):
        return {"chunks": self.tm.set_ttl(_tokens(b), b.get("seconds"))}

    def _op_prefetch(self, b):
        return {"scheduled": self.tm.prefetch(_tokens(b))}

    def _op_estimate(self, b):
        plan = self.tm.estimate(_tokens(b), float(b["prefill_s_per_token"]))
        return {"tokens": plan.tokens, "chunks": plan.chunks}

    def _op_clear(self, b):
        from ..tiers import Namespace

        ns = b.get("namespace")
        if isinstance(ns, dict):
            ns = Namespace(**ns)
        return {"cleared": self.tm.clear(ns)}

    def _op_flush(self, b):
        return {"flushed": self.tm.flush(b.get("timeout"))}

    def _store(self, raw: bytes):
        from safetensors.torch import load

        try:
            tensors = load(raw)
        except Exception as exc:
            raise ValueError(f"the store body is not a safetensors file: {exc}") from None
        if "tokens" not in tensors or "kv" not in tensors:
            raise ValueError('store needs a safetensors body with "tokens" and "kv"')
        queued = self.tm.store(tensors["tokens"].tolist(), tensors["kv"], copy=False)
        self._json(200, {"queued": queued})

    def _op_retrieve(self, b):
        import torch
        from safetensors.torch import save

        toks = _tokens(b)
        dtype = getattr(torch, str(b.get("dtype", "bfloat16")), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {b.get('dtype')!r}")
        shape = (_dim(b, "layers"), 2, len(toks), _dim(b, "kv_heads"), _dim(b, "head_dim"))
        try:
            out = torch.empty(shape, dtype=dtype)
        except RuntimeError as exc:  # torch's allocator refuses a shape too large for memory
            raise ValueError(f"cannot allocate a {list(shape)} {dtype} output: {exc}") from None
        n = self.tm.retrieve(toks, out)
        body = save({"kv": out[:, :, :n].contiguous()}, metadata={"tokens": str(n)})
        self._send(200, body, "application/octet-stream", {"X-KVCore-Tokens": str(n)})
        return None


class CacheServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, manager, host: str = "127.0.0.1", port: int = 0, *, allow_remote: bool = False,
                 verbose: bool = False):
        if not allow_remote and not _is_loopback(host):
            raise ValueError(f"refusing to listen on {host}: not a loopback address (use --allow-remote)")
        self.manager = manager
        self.verbose = verbose
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def run(args: argparse.Namespace) -> int:
    from ..tiers import Namespace, RemoteConfig, TierManager

    if not args.allow_remote and not _is_loopback(args.host):
        print(f"kvcore serve: {args.host} is not a loopback address; pass --allow-remote to expose the "
              "cache (the API has no authentication)", file=sys.stderr)
        return 2
    from ..errors import KVCoreError

    try:
        ns = Namespace(args.model, args.dtype, tp_rank=args.tp_rank, tp_world=args.tp_world, salt=args.salt)
        remote = RemoteConfig(url=args.remote_url, ttl_s=args.remote_ttl) if args.remote_url else None
        tm = TierManager(ddr_bytes=args.ddr_bytes, ssd_dir=args.ssd_dir, ssd_bytes=args.ssd_bytes,
                         remote=remote, chunk_tokens=args.chunk_tokens, namespace=ns, policy=args.policy,
                         codec=args.codec, codec_decoder=args.codec_decoder)
    except (KVCoreError, OSError) as e:
        print(f"kvcore serve: error: {e}", file=sys.stderr)
        return 2
    try:
        server = CacheServer(tm, args.host, args.port, allow_remote=args.allow_remote)
    except OSError as e:  # the address is taken or not ours
        tm.close()
        print(f"kvcore serve: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _stop(*_):
        if not stop.is_set():
            stop.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"kvcore serve: listening on {server.url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        tm.close()
    return 0

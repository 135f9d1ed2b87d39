"""Real KV tensors from MiniLM run over real English text.

The text is cut into windows of up to the model's 512 positions ([CLS] + text + [SEP]); each
window's per-layer K and V are computed in fp32 and the windows are joined along the token
axis. The default text is the licence texts every Debian machine has
(``/usr/share/common-licenses``), plus Python's own LICENSE.

>>> from kvcore.bench.kvgen import minilm_kv              # doctest: +SKIP
>>> kv = minilm_kv(tokens=1024)                          # doctest: +SKIP
>>> sorted(kv)[:2], kv["layer0.k"].shape                 # doctest: +SKIP
(['layer0.k', 'layer0.v'], torch.Size([1024, 12, 32]))
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import torch

from .minilm import MiniLM
from .wordpiece import WordPieceTokenizer

LICENSE_DIR = Path("/usr/share/common-licenses")
# Read first, in this order, when present; then the rest of the folder.
PREFERRED_LICENSES = ("GPL-3", "Apache-2.0", "Artistic", "MPL-2.0")


def default_text_files() -> list[Path]:
    """Licence texts found on this machine (Debian's common-licenses, Python's LICENSE)."""
    files: list[Path] = []
    if LICENSE_DIR.is_dir():
        present = {p.name: p for p in LICENSE_DIR.iterdir() if p.is_file()}
        files += [present.pop(n) for n in PREFERRED_LICENSES if n in present]
        files += [present[n] for n in sorted(present)]
    for d in {sysconfig.get_paths().get("stdlib", ""), str(Path(sys.base_prefix) / "lib")}:
        for name in ("LICENSE.txt", "LICENSE"):
            p = Path(d) / name
            if d and p.is_file() and p not in files:
                files.append(p)
    return files


def iter_texts(paths: Optional[Sequence[Union[str, Path]]] = None) -> Iterator[tuple[Path, str]]:
    """(path, text) of ``paths`` (default: :func:`default_text_files`), one file at a time."""
    files = [Path(p) for p in paths] if paths else default_text_files()
    if not files:
        raise FileNotFoundError("no text found on this machine (no /usr/share/common-licenses); name a text file")
    for p in files:
        yield p, p.read_text(encoding="utf-8", errors="replace")


def token_ids(
    tok: WordPieceTokenizer,
    n: int,
    paths: Optional[Sequence[Union[str, Path]]] = None,
    used: Optional[list[Path]] = None,
) -> list[int]:
    """``n`` token ids of the texts, read only as far as needed; repeated when they are short.
    The files read are appended to ``used``."""
    ids: list[int] = []
    for path, text in iter_texts(paths):
        if used is not None:
            used.append(path)
        ids += tok.encode(text)
        if len(ids) >= n:
            break
    if not ids:
        raise ValueError("the text gave no tokens")
    if len(ids) < n:
        ids = ids * (-(-n // len(ids)))
    return ids[:n]


def minilm_kv(
    tokens: int = 4096,
    texts: Optional[Sequence[Union[str, Path]]] = None,
    model: Optional[MiniLM] = None,
    window: int = 512,
    progress: Optional[Callable[[int, int], None]] = None,
    used: Optional[list[Path]] = None,
) -> dict[str, torch.Tensor]:
    """K and V of every MiniLM layer over ``tokens`` tokens of text, fp32.

    Returns ``{"layer{i}.k": [tokens, heads, head_dim], "layer{i}.v": ...}``, the layout of the
    files in the project's shared KV data. The text is repeated when it has fewer tokens than
    asked for. ``progress(done_windows, total_windows)`` is called as windows finish; the text
    files read are appended to ``used``.
    """
    if tokens < 3:
        raise ValueError("tokens must be at least 3 ([CLS], one token, [SEP])")
    model = model or MiniLM.load()
    window = min(window, model.max_tokens)
    if window < 3:
        raise ValueError("window must be at least 3")
    tok = model.tokenizer
    body = window - 2
    n_windows = -(-tokens // window)
    ids = token_ids(tok, n_windows * body, texts, used)
    cls_id, sep_id = tok.id("[CLS]"), tok.id("[SEP]")
    per_layer: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    left = tokens
    for w in range(n_windows):
        n = min(window, left)
        chunk = [cls_id, *ids[w * body : w * body + n - 2], sep_id] if n >= 3 else [cls_id] * n
        kv = model.kv(chunk)
        if not per_layer:
            per_layer = [([], []) for _ in kv]
        for (ks, vs), (k, v) in zip(per_layer, kv):
            ks.append(k)
            vs.append(v)
        left -= n
        if progress:
            progress(w + 1, n_windows)
    out: dict[str, torch.Tensor] = {}
    for i, (ks, vs) in enumerate(per_layer):
        out[f"layer{i}.k"] = torch.cat(ks).contiguous()
        out[f"layer{i}.v"] = torch.cat(vs).contiguous()
    return out

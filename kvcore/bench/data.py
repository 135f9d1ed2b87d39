"""Benchmark inputs: KV tensors from safetensors files, joined and cast.

A KV file maps names (``layer{i}.k`` ...) to tensors shaped ``[tokens, heads, head_dim]``.
Benchmarks want one contiguous tensor per file; tensors whose trailing axes agree are
concatenated along the first axis, so the (head, dim) channel structure that a codec can
model is kept. Otherwise they are flattened and joined end to end.

>>> import torch
>>> from kvcore.bench.data import concat_kv, cast_kv
>>> kv = concat_kv([torch.ones(4, 2, 8), torch.zeros(3, 2, 8)])
>>> tuple(kv.shape)
(7, 2, 8)
>>> cast_kv(kv, "fp8").dtype
torch.float8_e4m3fn
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Union

import torch

KVDATA_ENV = "KVCORE_KVDATA"


def kvdata_dir() -> Path:
    """The folder of real KV files (``shared/kvdata``): ``$KVCORE_KVDATA`` when set, else
    ``../shared/kvdata`` beside this checkout. A git worktree that lives elsewhere (e.g. under
    ``/work/wt``) has no such sibling and names the folder with the variable."""
    named = os.environ.get(KVDATA_ENV)
    if named:
        return Path(named)
    return Path(__file__).resolve().parents[2].parent / "shared" / "kvdata"


# CLI / file names of the dtypes a benchmark can use.
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

_SHORT_NAMES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
    torch.int8: "int8",
    torch.uint8: "uint8",
}


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype ("bf16", "fp8_e4m3", ...)."""
    return _SHORT_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def parse_dtype(name: Union[str, torch.dtype]) -> torch.dtype:
    """Turn "bf16" / "fp16" / "fp32" / "fp8" (e4m3) / "fp8_e5m2" into a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = name.lower().replace("-", "_")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[key]


def cast_kv(t: torch.Tensor, dtype: Union[str, torch.dtype]) -> torch.Tensor:
    """Cast a KV tensor to ``dtype`` the way an inference engine stores it.

    fp8 casts scale the tensor first so that its largest magnitude maps to the fp8 format's
    largest finite value (an engine's per-tensor KV scale); other casts are plain ``.to``.
    """
    dtype = parse_dtype(dtype)
    if t.dtype == dtype:
        return t
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = t.float()
        amax = float(x.abs().max()) if x.numel() else 0.0
        fmax = float(torch.finfo(dtype).max)
        scale = fmax / amax if amax > 0 and torch.isfinite(torch.tensor(amax)) else 1.0
        return (x * scale).clamp(-fmax, fmax).to(dtype)
    return t.to(dtype)


def concat_kv(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Join tensors into one contiguous tensor (see module docstring)."""
    tensors = [t for t in tensors]
    if not tensors:
        raise ValueError("no tensors to join")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"tensors of several dtypes cannot be joined: {sorted(map(str, dtypes))}")
    tails = {tuple(t.shape[1:]) for t in tensors}
    if len(tails) == 1 and all(t.dim() >= 2 for t in tensors):
        return torch.cat([t.contiguous() for t in tensors], dim=0).contiguous()
    return torch.cat([t.reshape(-1) for t in tensors]).contiguous()


def load_safetensors_groups(
    path: Union[str, Path], dtype: Optional[Union[str, torch.dtype]] = None
) -> dict[torch.dtype, torch.Tensor]:
    """Load a safetensors file as one joined tensor per dtype.

    With ``dtype`` every tensor is cast (see :func:`cast_kv`) first, giving a single group.
    Tensors of integer or bool dtypes are kept only when no ``dtype`` is given.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if not tensors:
        raise ValueError(f"{path}: the file holds no tensors")
    target = parse_dtype(dtype) if dtype is not None else None
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for name in tensors:  # file order
        t = tensors[name]
        if target is not None:
            if not t.is_floating_point():
                continue
            t = cast_kv(t, target)
        groups.setdefault(t.dtype, []).append(t)
    if not groups:
        raise ValueError(f"{path}: no floating-point tensors to cast to {dtype_name(target)}")
    return {dt: concat_kv(ts) for dt, ts in groups.items()}


def load_kv_file(path: Union[str, Path], dtype: Optional[Union[str, torch.dtype]] = None) -> torch.Tensor:
    """All tensors of a KV safetensors file as one contiguous tensor (cast to ``dtype`` if given)."""
    groups = load_safetensors_groups(path, dtype)
    if len(groups) != 1:
        names = ", ".join(dtype_name(d) for d in groups)
        raise ValueError(f"{path}: tensors of several dtypes ({names}); name a dtype to cast to")
    return next(iter(groups.values()))


def repeat_to_size(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A contiguous tensor of about ``nbytes`` made by repeating ``t`` along its first axis."""
    if t.numel() == 0:
        raise ValueError("cannot repeat an empty tensor")
    row_bytes = t[0].numel() * t.element_size() if t.dim() >= 2 else t.element_size()
    rows = max(1, nbytes // row_bytes)
    reps = -(-rows // t.shape[0])
    out = torch.cat([t] * reps, dim=0)[:rows]
    return out.contiguous()

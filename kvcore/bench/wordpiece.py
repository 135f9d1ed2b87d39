"""BERT's uncased WordPiece tokenizer from a ``vocab.txt``, in plain Python.

Basic tokenization (clean control characters, split CJK characters, lower-case, strip
accents, split on whitespace and punctuation), then greedy longest-match-first WordPiece
with ``##`` continuation pieces; a word with no match, or longer than 100 characters,
becomes ``[UNK]``.

>>> tok = WordPieceTokenizer({"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, ",": 4, "hi": 5})
>>> tok.tokenize("Hi, unaffable")
['hi', ',', 'un', '##aff', '##able']
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Union


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # All non-letter/number ASCII is punctuation for BERT ("$", "^", "`" included).
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class WordPieceTokenizer:
    """Uncased BERT tokenizer over a vocabulary (token -> id)."""

    def __init__(self, vocab: dict[str, int], lowercase: bool = True, unk: str = "[UNK]", max_chars: int = 100):
        self.vocab = vocab
        self.lowercase = lowercase
        self.unk = unk
        self.max_chars = max_chars
        if unk not in vocab:
            raise ValueError(f"the vocabulary has no {unk!r} token")

    @classmethod
    def from_file(cls, path: Union[str, Path], lowercase: bool = True) -> "WordPieceTokenizer":
        """Load a one-token-per-line ``vocab.txt`` (line number = id)."""
        vocab: dict[str, int] = {}
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                vocab.setdefault(line.rstrip("\n"), i)
        return cls(vocab, lowercase=lowercase)

    def id(self, token: str) -> int:
        return self.vocab[token]

    # -- basic tokenization --------------------------------------------------------------
    def _clean(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_cjk(cp):
                out.append(f" {ch} ")
            elif _is_whitespace(ch):
                out.append(" ")
            else:
                out.append(ch)
        return "".join(out)

    @staticmethod
    def _strip_accents(word: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")

    @staticmethod
    def _split_punctuation(word: str) -> list[str]:
        pieces: list[str] = []
        current: list[str] = []
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(ch)
            else:
                current.append(ch)
        if current:
            pieces.append("".join(current))
        return pieces

    def basic_tokenize(self, text: str) -> list[str]:
        words = []
        for word in self._clean(unicodedata.normalize("NFC", text)).split():
            if self.lowercase:
                word = self._strip_accents(word.lower())
            words.extend(self._split_punctuation(word))
        return words

    # -- wordpiece -----------------------------------------------------------------------
    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_chars:
            return [self.unk]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                sub = word[start:end]
                if start > 0:
                    sub = "##" + sub
                if sub in self.vocab:
                    piece = sub
                    break
                end -= 1
            if piece is None:
                return [self.unk]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """Text -> WordPiece tokens (no [CLS]/[SEP])."""
        out: list[str] = []
        for word in self.basic_tokenize(text):
            out.extend(self._wordpiece(word))
        return out

    def encode(self, text: str) -> list[int]:
        """Text -> token ids (no [CLS]/[SEP])."""
        return [self.vocab[t] for t in self.tokenize(text)]

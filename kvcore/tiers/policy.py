"""Eviction policies: which chunks leave a tier first.

Both policies take a chunk's priority level first (lower levels leave first; pinned
chunks never leave), then their own order:

- ``LRUPolicy``: least recently used first.
- ``CostAwarePolicy``: lowest value first, where value = the cost of recomputing the
  chunk (its token count, weighted by its position: attention over a longer prefix
  costs more) x how often it was used, per byte it occupies, decayed with its age.

>>> from kvcore.tiers.policy import LRUPolicy
>>> p = LRUPolicy()
>>> for k in "abc": p.add(k, size=10, start=0, ntokens=256)
>>> p.touch("a")
>>> list(p.victims())
['b', 'c', 'a']
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from ..errors import InvalidArgumentError


@dataclass
class PolicyEntry:
    size: int
    start: int
    ntokens: int
    created: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    hits: int = 0


class Policy:
    """Base: tracks entries; subclasses order victims."""

    name = "base"

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._entries: "OrderedDict[object, PolicyEntry]" = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def add(self, key, *, size: int, start: int = 0, ntokens: int = 0) -> None:
        now = self._clock()
        with self._lock:
            self._entries[key] = PolicyEntry(size, start, ntokens, now, now)
            self._entries.move_to_end(key)

    def touch(self, key) -> None:
        with self._lock:
            e = self._entries.get(key)
            if e is not None:
                e.last = self._clock()
                e.hits += 1
                self._entries.move_to_end(key)

    def arrange(self, keys) -> None:
        """Moves keys, in this order, to the most recent end, counting no use (the cost
        policy's order is its values: there this only breaks their ties)."""
        with self._lock:
            for key in keys:
                if key in self._entries:
                    self._entries.move_to_end(key)

    def remove(self, key) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _order(self, items: list) -> list:
        raise NotImplementedError

    def victims(self, *, evictable: Optional[Callable[[object], bool]] = None,
                priority: Optional[Callable[[object], int]] = None) -> Iterator:
        """Keys in eviction order (a snapshot), skipping keys for which evictable() is False."""
        with self._lock:
            items = list(self._entries.items())
        ordered = self._order(items)
        if priority is not None:
            ordered.sort(key=lambda k: priority(k))  # stable: policy order within a level
        for key in ordered:
            if evictable is None or evictable(key):
                yield key


class LRUPolicy(Policy):
    """Least recently used first."""

    name = "lru"

    def _order(self, items: list) -> list:
        return [k for k, _ in items]  # the OrderedDict is kept in recency order


class CostAwarePolicy(Policy):
    """Evicts the chunks that are cheapest to recompute per byte, least used, oldest first.

    context_scale: tokens at which attention doubles a token's prefill cost;
    half_life_s: age at which a chunk's value halves.

    >>> p = CostAwarePolicy(context_scale=1024)
    >>> p.add("early", size=100, start=0, ntokens=256)
    >>> p.add("deep", size=100, start=8192, ntokens=256)
    >>> next(p.victims())
    'early'
    """

    name = "cost"

    def __init__(self, *, context_scale: float = 4096.0, half_life_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(clock)
        for name, v in (("context_scale", context_scale), ("half_life_s", half_life_s)):
            # not "v <= 0": NaN passes that, and then orders the victims at random (inf is fine)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0:
                raise InvalidArgumentError(f"{name} must be a number > 0, got {v!r}")
        self.context_scale = context_scale
        self.half_life_s = half_life_s

    def recompute_cost(self, start: int, ntokens: int) -> float:
        """Relative prefill cost of ntokens tokens that follow start tokens of context."""
        return ntokens * (1.0 + (start + ntokens / 2.0) / self.context_scale)

    def value(self, e: PolicyEntry, now: float) -> float:
        age = max(0.0, now - e.last)
        return (self.recompute_cost(e.start, e.ntokens) * (1.0 + math.log1p(e.hits))
                / max(1, e.size) * 0.5 ** (age / self.half_life_s))

    def _order(self, items: list) -> list:
        now = self._clock()
        return [k for k, _ in sorted(items, key=lambda kv: self.value(kv[1], now))]


def make_policy(name: str) -> Policy:
    """"lru" or "cost"."""
    if name == "lru":
        return LRUPolicy()
    if name in ("cost", "cost-aware", "cost_aware"):
        return CostAwarePolicy()
    raise InvalidArgumentError(f"unknown eviction policy {name!r} (lru, cost)")

"""Eviction policies: which chunks leave a tier first.

Lookups and retrieves go by token prefix: a chunk whose predecessor has left a tier
(and is nowhere below) cannot be reached. So a chunk leaves only once no chunk held
in the same tier extends it (its children: the next chunks of every sequence that
shares its prefix): the victims are the tier's *leaves*. Among them, a chunk's level
comes first (lower levels leave first; pinned chunks never leave, expired ones, at
``EXPIRED_LEVEL``, leave before anything and whatever extends them), then the
policy's own order:

- ``LRUPolicy``: least recently used first.
- ``CostAwarePolicy``: lowest value first, where value = the cost of recomputing the
  chunk (its token count, weighted by its position: attention over a longer prefix
  costs more) x how often it was used, per byte it occupies, decayed with its age.

A chunk that stays (pinned, being read, or of a higher level) keeps its whole prefix
in the tier. The leaves are kept in order as chunks come, go and are used, so picking
a victim costs O(log n), not a sort of every chunk.

>>> from kvcore.tiers.policy import LRUPolicy
>>> p = LRUPolicy()
>>> for k in "abc": p.add(k, size=10, start=0, ntokens=256)
>>> p.touch("a")
>>> list(p.victims())
['b', 'c', 'a']
>>> p.add("c2", size=10, start=256, ntokens=256, parent="c")  # extends c: c is no leaf now
>>> list(p.victims())
['b', 'a', 'c2', 'c']
"""

from __future__ import annotations

import bisect
import heapq
import math
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Mapping, Optional

from ..errors import InvalidArgumentError

# The level of an expired chunk: below every priority a caller can set.
EXPIRED_LEVEL = -(1 << 30)
MAX_PRIORITY = -EXPIRED_LEVEL - 1  # priorities are -MAX_PRIORITY..MAX_PRIORITY


def is_priority(level: object) -> bool:
    """Whether level is a priority a caller may set (an int, not a bool, within
    +-MAX_PRIORITY: EXPIRED_LEVEL stays below every one)."""
    return isinstance(level, int) and not isinstance(level, bool) and -MAX_PRIORITY <= level <= MAX_PRIORITY


@dataclass
class PolicyEntry:
    size: int
    start: int
    ntokens: int
    created: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    hits: int = 0
    parent: Optional[Hashable] = None  # the chunk this one extends (None: unknown, or chunk 0)
    rank: tuple = ()  # (policy score, stamp): the entry's place in the policy's order


class Policy:
    """Base: tracks entries, their prefix links and the ordered leaves; subclasses give
    the score that orders them (``_score``)."""

    name = "base"

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._entries: dict = {}  # key -> PolicyEntry
        self._children: dict = {}  # key -> how many held entries extend it
        self._leaves: list = []  # (score, stamp, key) of the entries no held entry extends, sorted
        self._stamp = 0  # bumped on every add / use / arrange: the order among equal scores
        self._lock = threading.Lock()
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def _score(self, e: PolicyEntry) -> float:
        raise NotImplementedError

    # ---- the ordered leaves (lock held) ----
    def _is_leaf(self, key) -> bool:
        return not self._children.get(key)

    def _rerank(self, key, e: PolicyEntry) -> None:
        """Gives e a new place in the order (after a use or an arrange): the most recent
        among entries of its score."""
        leaf = self._is_leaf(key)
        if leaf and e.rank:
            self._unlist(key, e)
        self._stamp += 1
        e.rank = (self._score(e), self._stamp)
        if leaf:
            bisect.insort(self._leaves, (*e.rank, key))

    def _unlist(self, key, e: PolicyEntry) -> None:
        i = bisect.bisect_left(self._leaves, e.rank)
        if i < len(self._leaves) and self._leaves[i][2] == key:
            del self._leaves[i]

    def _link(self, parent, delta: int) -> None:
        """One child more (+1) or less (-1) extends parent: it stops or starts being a leaf."""
        n = self._children.get(parent, 0) + delta
        p = self._entries.get(parent)
        if n <= 0:
            self._children.pop(parent, None)
            if p is not None:
                bisect.insort(self._leaves, (*p.rank, parent))
        else:
            self._children[parent] = n
            if n == 1 and delta > 0 and p is not None:
                self._unlist(parent, p)

    def _drop(self, key) -> None:
        e = self._entries.pop(key, None)
        if e is None:
            return
        if self._is_leaf(key):
            self._unlist(key, e)
        if e.parent is not None:
            self._link(e.parent, -1)

    # ---- changes ----
    def add(self, key, *, size: int, start: int = 0, ntokens: int = 0, parent: Optional[Hashable] = None) -> None:
        """Adds (or replaces) key; parent: the key of the chunk it extends, when known."""
        now = self._clock()
        with self._lock:
            self._drop(key)
            e = PolicyEntry(size, start, ntokens, now, now, parent=parent)
            self._entries[key] = e
            self._rerank(key, e)
            if parent is not None:
                self._link(parent, +1)

    def touch(self, key) -> None:
        with self._lock:
            e = self._entries.get(key)
            if e is not None:
                e.last = self._clock()
                e.hits += 1
                self._rerank(key, e)

    def arrange(self, keys) -> None:
        """Moves keys, in this order, to the most recent end, counting no use (the cost
        policy's order is its values: there this only breaks their ties)."""
        with self._lock:
            for key in keys:
                e = self._entries.get(key)
                if e is not None:
                    self._rerank(key, e)

    def parent_of(self, key) -> Optional[Hashable]:
        """The key of the chunk key extends, when known."""
        e = self._entries.get(key)
        return e.parent if e is not None else None

    def remove(self, key) -> None:
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._children.clear()
            self._leaves.clear()

    # ---- victims ----
    def victims(self, *, evictable: Optional[Callable[[object], bool]] = None,
                levels: Optional[Mapping[object, int]] = None) -> Iterator:
        """Keys in eviction order, each as if the ones before it had left (so a chunk
        comes after every held chunk that extends it), skipping keys for which
        evictable() is False (which keeps their prefixes too).

        levels: the keys whose level is not 0 (lower leaves first; EXPIRED_LEVEL ones
        regardless of what extends them). The caller may remove each key it is given
        before asking for the next; entries that change meanwhile are seen as they are
        then, and no key comes twice. Costs O(len(levels) + k log n) for k keys taken.
        """
        levels = levels or {}
        ready: list = []  # (level, score, stamp, key): candidates outside the level-0 leaves
        with self._lock:
            for key, level in levels.items():
                e = self._entries.get(key)
                if e is not None and (level == EXPIRED_LEVEL or self._is_leaf(key)):
                    ready.append((level, *e.rank, key))
        heapq.heapify(ready)
        settled: set = set()  # keys given or skipped
        left: dict = {}  # parent -> its children not given yet
        after: Optional[tuple] = None  # the last level-0 leaf looked at
        while True:
            with self._lock:
                head = self._next_leaf(after, levels)
            if head is not None and (not ready or (0, *head[:2]) < ready[0][:3]):
                after = head
                key = head[2]
            elif ready:
                key = heapq.heappop(ready)[3]
            else:
                return
            if key in settled or key not in self._entries:  # (removed meanwhile by another thread)
                continue
            settled.add(key)
            if evictable is not None and not evictable(key):
                continue
            with self._lock:
                released = self._release_parent(key, left, levels)
            if released is not None:
                heapq.heappush(ready, released)
            yield key

    def _next_leaf(self, after: Optional[tuple], levels: Mapping) -> Optional[tuple]:
        """The first level-0 leaf after the one at after (lock held)."""
        i = 0 if after is None else bisect.bisect_right(self._leaves, after)
        while i < len(self._leaves):
            item = self._leaves[i]
            if item[2] not in levels:
                return item
            i += 1
        return None

    def _release_parent(self, key, left: dict, levels: Mapping) -> Optional[tuple]:
        """key is given: its parent's count of children not given yet goes down; the
        parent's heap item once none is left (lock held)."""
        e = self._entries.get(key)
        parent = e.parent if e is not None else None
        p = self._entries.get(parent) if parent is not None else None
        if p is None:
            return None
        left[parent] = left.get(parent, self._children.get(parent, 0)) - 1
        if left[parent] > 0:
            return None
        return (levels.get(parent, 0), *p.rank, parent)


class LevelIndex:
    """The keys whose eviction level is not 0 (``Policy.victims(levels=)``), found without
    a look at every chunk's settings: the keys given a priority, and a heap of expiry
    times for the expired ones (EXPIRED_LEVEL). Thread-safe.

    settings(key): the key's (priority, expires) now (expires: a clock() time, 0 for
    never), or None. note(keys) must follow every change of them; what it was told is
    checked against settings() when read, so a key that went or changed is never stale.

    >>> s = {"a": (2, 0.0), "b": (0, 5.0)}
    >>> idx = LevelIndex(s.get, clock=lambda: 10.0)
    >>> idx.note(["a", "b"])
    >>> idx.current() == {"a": 2, "b": EXPIRED_LEVEL}
    True
    """

    def __init__(self, settings: Callable[[Hashable], Optional[tuple[int, float]]],
                 clock: Callable[[], float] = time.time):
        self._settings = settings
        self._clock = clock
        self._prioritized: set = set()
        self._expiring: list = []  # heap of (expires, key); one entry per note: compacted
        self._compact_at = 1024
        self._expired: set = set()
        self._lock = threading.Lock()

    def note(self, keys) -> None:
        """keys' settings may have changed (a priority or an expiry set, moved or dropped)."""
        with self._lock:
            for key in keys:
                s = self._settings(key)
                if s is None:
                    continue
                if s[0]:
                    self._prioritized.add(key)
                if s[1]:
                    heapq.heappush(self._expiring, (s[1], key))
            if len(self._expiring) > self._compact_at:
                self._compact()

    def _compact(self) -> None:
        """Keeps one heap entry per key, at its current expiry (lock held)."""
        live = {}
        for _, key in self._expiring:
            s = self._settings(key)
            if s is not None and s[1]:
                live[key] = s[1]
        self._expiring = [(expires, key) for key, expires in live.items()]
        heapq.heapify(self._expiring)
        self._compact_at = 2 * len(self._expiring) + 1024

    def current(self) -> dict:
        """{key: level} of the keys whose level is not 0 now."""
        now = self._clock()
        levels: dict = {}
        with self._lock:
            for key in list(self._prioritized):
                s = self._settings(key)
                if s is None or not s[0]:
                    self._prioritized.discard(key)
                else:
                    levels[key] = s[0]
            while self._expiring and self._expiring[0][0] <= now:
                _, key = heapq.heappop(self._expiring)
                s = self._settings(key)
                if s is not None and s[1]:
                    if s[1] <= now:
                        self._expired.add(key)
                    else:  # given a later expiry since
                        heapq.heappush(self._expiring, (s[1], key))
            for key in list(self._expired):
                s = self._settings(key)
                if s is not None and s[1] and s[1] <= now:
                    levels[key] = EXPIRED_LEVEL
                    continue
                self._expired.discard(key)
                if s is not None and s[1]:  # given a later expiry since
                    heapq.heappush(self._expiring, (s[1], key))
        return levels


class LRUPolicy(Policy):
    """Least recently used first."""

    name = "lru"

    def _score(self, e: PolicyEntry) -> float:
        return 0.0  # the stamp alone orders: recency


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
        self._decay = math.log(2.0) / half_life_s  # per second of age, in log(value)

    def recompute_cost(self, start: int, ntokens: int) -> float:
        """Relative prefill cost of ntokens tokens that follow start tokens of context."""
        return ntokens * (1.0 + (start + ntokens / 2.0) / self.context_scale)

    def _base(self, e: PolicyEntry) -> float:
        return self.recompute_cost(e.start, e.ntokens) * (1.0 + math.log1p(e.hits)) / max(1, e.size)

    def value(self, e: PolicyEntry, now: float) -> float:
        age = max(0.0, now - e.last)
        return self._base(e) * 0.5 ** (age / self.half_life_s)

    def _score(self, e: PolicyEntry) -> float:
        # log(value(e, now)) = log(base) - (now - last) * decay: now shifts every entry
        # alike, so log(base) + last * decay orders them as value does at any time, and
        # an entry's place changes only when it is used.
        base = self._base(e)
        return (math.log(base) if base > 0 else -math.inf) + e.last * self._decay


def make_policy(name: str) -> Policy:
    """"lru" or "cost"."""
    if name == "lru":
        return LRUPolicy()
    if name in ("cost", "cost-aware", "cost_aware"):
        return CostAwarePolicy()
    raise InvalidArgumentError(f"unknown eviction policy {name!r} (lru, cost)")

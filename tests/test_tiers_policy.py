"""Eviction policies and metrics."""

import random

import pytest

from kvcore.errors import InvalidArgumentError
from kvcore.tiers.metrics import Histogram, Metrics
from kvcore.tiers.policy import EXPIRED_LEVEL, CostAwarePolicy, LevelIndex, LRUPolicy, make_policy


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_lru_order_touch_remove():
    p = LRUPolicy()
    for k in "abcd":
        p.add(k, size=1)
    p.touch("a")
    p.remove("c")
    assert list(p.victims()) == ["b", "d", "a"]
    assert "c" not in p and len(p) == 3


def test_pinned_skipped_and_priority_first():
    p = LRUPolicy()
    for k in "abcd":
        p.add(k, size=1)
    levels = {"a": 1, "c": -1}
    order = list(p.victims(evictable=lambda k: k != "d", levels=levels))
    assert order == ["c", "b", "a"]


def test_cost_aware_prefers_cheap_old_big():
    clock = Clock()
    p = CostAwarePolicy(context_scale=1024, half_life_s=10, clock=clock)
    p.add("deep", size=100, start=8192, ntokens=256)
    p.add("early", size=100, start=0, ntokens=256)
    p.add("big", size=10_000, start=8192, ntokens=256)
    assert list(p.victims()) == ["big", "early", "deep"]
    clock.t = 100.0  # deep ages a lot, early is used again now
    p.touch("early")
    p.touch("big")
    assert list(p.victims())[0] == "deep"
    assert p.recompute_cost(1024, 256) > p.recompute_cost(0, 256)


def test_cost_aware_frequency():
    clock = Clock()
    p = CostAwarePolicy(clock=clock)
    p.add("x", size=100, start=0, ntokens=256)
    p.add("y", size=100, start=0, ntokens=256)
    for _ in range(5):
        p.touch("x")
    p.touch("y")  # y is most recent but x was used far more; same age now
    assert list(p.victims()) == ["y", "x"]


def test_make_policy():
    assert make_policy("lru").name == "lru"
    assert make_policy("cost").name == "cost"
    with pytest.raises(InvalidArgumentError):
        make_policy("fifo")
    with pytest.raises(InvalidArgumentError):
        CostAwarePolicy(context_scale=0)


@pytest.mark.parametrize("kw", [dict(context_scale=float("nan")), dict(half_life_s=float("nan")),
                                dict(context_scale="4096"), dict(half_life_s=True), dict(half_life_s=0)])
def test_cost_aware_refuses_what_is_not_a_positive_number(kw):
    """NaN passed the "<= 0" check and then every value was NaN (victims in no order); a str
    raised TypeError."""
    with pytest.raises(InvalidArgumentError):
        CostAwarePolicy(**kw)


def test_cost_aware_takes_infinite_scales():
    """inf is meaningful: position never matters / value never decays."""
    clock = Clock()
    p = CostAwarePolicy(context_scale=float("inf"), half_life_s=float("inf"), clock=clock)
    p.add("small", size=100, start=8192, ntokens=64)
    p.add("big", size=100, start=0, ntokens=256)
    clock.t = 1e9
    assert list(p.victims()) == ["small", "big"]


def test_histogram_and_prometheus():
    h = Histogram()
    for s in (0.0001, 0.001, 0.001, 0.5):
        h.observe(s)
    assert h.count == 4 and h.quantile(0.5) == 0.001 and h.quantile(1.0) == 0.5
    m = Metrics()
    m.inc("ddr", "hits", 3)
    m.inc("ssd", "misses")
    m.observe("retrieve", 0.003)
    m.add_encoded(1000, 680)
    m.set_gauges(lambda: {"ddr": {"entries": 2, "bytes_used": 10, "capacity_bytes": 100}})
    text = m.prometheus()
    assert 'kvcore_tier_hits_total{tier="ddr"} 3' in text
    assert 'kvcore_tier_misses_total{tier="ssd"} 1' in text
    assert 'kvcore_tier_bytes_used{tier="ddr"} 10' in text
    assert "kvcore_compression_ratio 0.680000" in text
    assert 'kvcore_retrieve_seconds_bucket{le="0.005"} 1' in text
    assert 'kvcore_retrieve_seconds_bucket{le="0.0025"} 0' in text
    assert "kvcore_retrieve_seconds_count 1" in text
    for line in text.splitlines():  # every sample line: name{labels} value
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])
    snap = m.snapshot()
    assert snap["tiers"]["ddr"]["entries"] == 2 and snap["compression_ratio"] == 0.68


def chain(p, prefix, n, *, size=100, ntokens=256, parent=None):
    """Adds a sequence's n chunks, each extending the one before, the way a store leaves
    them (chunk 0 the most recent: Policy.arrange); returns their keys."""
    keys = [f"{prefix}{i}" for i in range(n)]
    for i, k in enumerate(keys):
        p.add(k, size=size, start=i * ntokens, ntokens=ntokens, parent=keys[i - 1] if i else parent)
    p.arrange(reversed(keys))
    return keys


def test_cost_policy_takes_a_sequence_tail_first():
    """Early chunks are the cheapest to recompute, so the cost order put chunk 0 first: its
    leaving left the sequence's other chunks unreachable by a prefix lookup. A chunk now
    leaves only after the chunks that extend it."""
    p = CostAwarePolicy(context_scale=1024, clock=Clock())
    a = chain(p, "a", 4)
    assert list(p.victims()) == ["a3", "a2", "a1", "a0"]
    p.add("deep", size=100, start=8192, ntokens=256)  # more value than any of a's: after them
    assert list(p.victims())[:4] == ["a3", "a2", "a1", "a0"]
    p.remove("a3")
    assert next(p.victims()) == "a2"
    assert a[0] in p


@pytest.mark.parametrize("make", [LRUPolicy, lambda: CostAwarePolicy(clock=Clock())])
def test_a_shared_prefix_leaves_after_every_sequence_that_extends_it(make):
    p = make()
    p.add("p", size=100, start=0, ntokens=256)
    p.add("b1", size=100, start=256, ntokens=256, parent="p")
    p.add("c1", size=100, start=256, ntokens=256, parent="p")
    p.add("x", size=100, start=0, ntokens=256)
    order = list(p.victims())
    assert order.index("p") > order.index("b1") and order.index("p") > order.index("c1")
    assert "p" not in p.victims(evictable=lambda k: k != "c1")  # a chunk kept keeps its prefix
    p.remove("b1")
    p.remove("c1")
    assert set(p.victims()) == {"p", "x"}  # a leaf again once nothing held extends it


def test_lru_after_a_touch_of_a_middle_chunk():
    """A use of chunk 1 alone made it more recent than chunk 0: LRU then took chunk 0 first."""
    p = LRUPolicy()
    chain(p, "a", 3)
    p.touch("a1")
    assert list(p.victims()) == ["a2", "a1", "a0"]


def test_a_higher_level_chunk_keeps_its_lower_level_prefix():
    """A prefix set to a low level (set_priority of another sequence that shares it) left
    first, and took with it the sequence of the higher level that extends it."""
    p = LRUPolicy()
    p.add("p", size=100, start=0, ntokens=256)
    p.add("c", size=100, start=256, ntokens=256, parent="p")
    p.add("x", size=100, start=0, ntokens=256)
    assert list(p.victims(levels={"p": -1, "c": 5})) == ["x", "c", "p"]
    assert list(p.victims(levels={"p": -1, "c": 5}, evictable=lambda k: k != "c")) == ["x"]


def test_an_expired_chunk_leaves_first_whatever_extends_it():
    """An expired chunk is never a hit: what extends it is unreachable anyway."""
    p = LRUPolicy()
    chain(p, "a", 3)
    p.add("x", size=100)
    assert list(p.victims(levels={"a1": EXPIRED_LEVEL})) == ["a1", "a2", "a0", "x"]


def random_forest(p, rng, n, clock=None):
    """n chunks in sequences that share prefixes, then random uses and arranges."""
    keys = []
    for i in range(n):
        parent = rng.choice(keys) if keys and rng.random() < 0.7 else None
        depth = 0 if parent is None else p._entries[parent].start // 256 + 1
        if clock is not None:
            clock.t += rng.random()
        p.add(i, size=rng.randrange(50, 150), start=depth * 256, ntokens=256, parent=parent)
        keys.append(i)
    for _ in range(n):
        if clock is not None:
            clock.t += rng.random()
        if rng.random() < 0.5:
            p.touch(rng.choice(keys))
        else:
            p.arrange(rng.sample(keys, 3))
    return keys


@pytest.mark.parametrize("make", [LRUPolicy, lambda: CostAwarePolicy(clock=Clock())])
@pytest.mark.parametrize("seed", range(4))
def test_victims_are_the_order_of_removing_one_at_a_time(make, seed):
    """One pass of victims() (a plan of several victims) gives what asking for the first
    victim, removing it and asking again gives; no chunk comes before one that extends it."""
    rng = random.Random(seed)
    p = make()
    keys = random_forest(p, rng, 300, getattr(p, "_clock", None) if isinstance(p, CostAwarePolicy) else None)
    levels = {k: rng.choice([-2, -1, 1, 2, EXPIRED_LEVEL]) for k in rng.sample(keys, 40)}
    kept = set(rng.sample(keys, 10))
    evictable = lambda k: k not in kept  # noqa: E731
    planned = list(p.victims(evictable=evictable, levels=levels))
    assert len(planned) == len(set(planned))
    parents = {k: p.parent_of(k) for k in keys}
    for i, k in enumerate(planned):  # a parent after all its held children, unless expired
        if levels.get(k) != EXPIRED_LEVEL:
            assert all(c in planned[:i] for c, par in parents.items() if par == k)
    one_by_one = []
    while True:
        k = next(p.victims(evictable=evictable, levels=levels), None)
        if k is None:
            break
        one_by_one.append(k)
        p.remove(k)
    assert one_by_one == planned


@pytest.mark.parametrize("seed", range(3))
def test_the_cost_order_is_the_order_of_values(seed):
    """Entries keep their place between uses: the order of value() now, whatever now is."""
    rng = random.Random(seed)
    clock = Clock()
    p = CostAwarePolicy(context_scale=2048, half_life_s=50, clock=clock)
    for i in range(200):
        clock.t += rng.random()
        p.add(i, size=rng.randrange(50, 5000), start=rng.randrange(0, 64) * 256, ntokens=rng.choice([64, 256]))
    for _ in range(300):
        clock.t += rng.random()
        p.touch(rng.randrange(200))
    for later in (0.0, 10.0, 1000.0):
        now = clock.t + later
        by_value = sorted(range(200), key=lambda k: p.value(p._entries[k], now))
        assert list(p.victims()) == by_value


def test_level_index_follows_the_settings():
    """The keys whose level is not 0, from what note() was told, checked against the
    settings when read (a key whose priority went, that was dropped or given a later
    expiry is never stale), with one heap entry per key after compaction."""
    now = [100.0]
    settings = {"a": (3, 0.0), "b": (0, 150.0), "c": (0, 120.0), "d": (0, 0.0)}
    idx = LevelIndex(settings.get, clock=lambda: now[0])
    idx.note("abcd")
    assert idx.current() == {"a": 3}
    now[0] = 130.0
    assert idx.current() == {"a": 3, "c": EXPIRED_LEVEL}
    settings["c"] = (0, 200.0)  # a later expiry, not noted (yet): read as it is now
    settings["b"] = (0, 110.0)  # a shorter one: noted
    settings["a"] = (0, 0.0)
    idx.note(["b"])
    assert idx.current() == {"b": EXPIRED_LEVEL}
    del settings["b"]
    now[0] = 250.0
    assert idx.current() == {"c": EXPIRED_LEVEL}
    for i in range(5000):
        settings[i] = (0, 1e9)
        idx.note([i, i])
    assert len(idx._expiring) <= 2 * 5001 + 1024
    assert idx.current() == {"c": EXPIRED_LEVEL}

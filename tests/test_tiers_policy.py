"""Eviction policies and metrics."""

import pytest

from kvcore.errors import InvalidArgumentError
from kvcore.tiers.metrics import Histogram, Metrics
from kvcore.tiers.policy import CostAwarePolicy, LRUPolicy, make_policy


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
    prio = {"a": 1, "b": 0, "c": -1, "d": 0}
    order = list(p.victims(evictable=lambda k: k != "d", priority=prio.get))
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

"""Acceptance per context bucket: the pooling rule, worked by hand (core/context_acceptance.py)."""

from __future__ import annotations

import pytest

from tabletune_pipelines.core.context_acceptance import (
    PoolingRule,
    bucket_acceptance,
    bucket_of,
    check_breakdown,
    rates_by_context,
)
from tabletune_pipelines.core.table import context_buckets
from tabletune_pipelines.errors import InvalidTableError, InvalidValueError


def test_a_bucket_keeps_its_rates_when_every_interval_is_narrow_enough():
    # Wilson 95 % of 200 / 400: [0.4512, 0.5488], 0.0975 wide <= 0.10; of 80 / 400: 0.0782.
    assert PoolingRule().pooled_because(20, (400, 400), (200, 80)) == ""
    # 150 / 300: [0.4438, 0.5562], 0.1124 wide: the widest position decides, and is named.
    assert PoolingRule().pooled_because(20, (300, 300), (150, 150)) == "a_1 interval 0.112 wide > 0.1 (300 drafts)"
    assert PoolingRule().pooled_because(20, (400, 400, 400), (240, 200, 80)) == ""
    assert PoolingRule().pooled_because(20, (400, 300), (200, 150)) == "a_2 interval 0.112 wide > 0.1 (300 drafts)"


def test_too_few_prompts_or_no_drafts_pool_whatever_the_interval():
    assert PoolingRule().pooled_because(19, (10 ** 6,), (5 * 10 ** 5,)) == "19 prompts < 20"
    assert PoolingRule().pooled_because(25, (0, 0), (0, 0)) == "no drafts"
    assert PoolingRule(min_prompts=5, max_width=0.2).pooled_because(5, (300,), (150,)) == ""
    for bad in ({"min_prompts": 0}, {"min_prompts": True}, {"max_width": 0.0}, {"confidence": 1.0}):
        with pytest.raises(InvalidValueError, match=next(iter(bad))):
            PoolingRule(**bad)


def test_buckets_rates_and_the_pooled_rates_by_context_level():
    levels = (256, 1024, 4096)
    buckets = context_buckets(levels, 8192)  # (1, 512), (513, 2048), (2049, 8192)
    assert bucket_of([1, 512, 513, 2048, 2049, 9000], buckets) == [0, 0, 1, 1, 2, 2]
    counts = [(30, 400, (400, 400), (320, 200)),   # own: 0.0782 and 0.0975 wide
              (12, 400, (400, 400), (200, 80)),    # 12 prompts: pooled
              (40, 300, (300, 300), (150, 90))]    # a_1 0.1124 wide: pooled
    got = bucket_acceptance(levels, buckets, counts)
    assert [(b.level, b.lo, b.hi, b.prompt_count, b.pooled, b.reason) for b in got] == [
        (256, 1, 512, 30, False, ""), (1024, 513, 2048, 12, True, "12 prompts < 20"),
        (4096, 2049, 8192, 40, True, "a_1 interval 0.112 wide > 0.1 (300 drafts)")]
    assert [b.rates for b in got] == [(0.8, 0.5), (0.5, 0.2), (0.5, 0.3)]
    # The pooled rates: every bucket's counts summed, 620 / 1100 and 370 / 1100.
    pooled = (620 / 1100, 370 / 1100)
    assert rates_by_context(got, pooled) == {256: (0.8, 0.5), 1024: pooled, 4096: pooled}
    check_breakdown(got, 2, 82, 1100)
    with pytest.raises(InvalidValueError, match="num_drafts sum to 1100, not the prior's 1000"):
        check_breakdown(got, 2, 82, 1000)
    with pytest.raises(InvalidValueError, match=r"not those the acceptance was measured at \[256, 1024, 4096\]"):
        rates_by_context(got, pooled, (256, 2048))


def test_one_level_is_one_bucket_and_serves_the_prior_everywhere():
    assert context_buckets((32,), 512) == ((1, 512),)
    assert rates_by_context(None, (0.7, 0.5), (32,)) == {32: (0.7, 0.5)}
    with pytest.raises(InvalidValueError, match="at least two buckets"):
        check_breakdown((), 2, 0, 0)
    with pytest.raises(InvalidTableError, match="strictly ascending"):
        context_buckets((64, 64), 512)

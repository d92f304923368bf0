"""The paired ratio of two series (``core.stats``), with worked numbers."""

from __future__ import annotations

import math

import pytest

from tabletune_pipelines.core.stats import paired_ratio, paired_ratios


def test_paired_ratios_pair_by_round_and_skip_rounds_one_series_lacks():
    # rounds 0, 1, 3 measured both; round 2 only a; round 3's b is 0 (no ratio); round 4 only b
    a = {0: 110.0, 1: 90.0, 2: 50.0, 3: 10.0, 5: 120.0}
    b = {0: 100.0, 1: 100.0, 3: 0.0, 4: 80.0, 5: 100.0}
    assert paired_ratios(a, b) == pytest.approx([1.1, 0.9, 1.2])
    # mean 1.0667, sample sd 0.1528, s.e. 0.1528 / sqrt(3) = 0.0882
    m, se, n = paired_ratio(a, b)
    assert n == 3 and m == pytest.approx(3.2 / 3) and se == pytest.approx(0.0881917, abs=1e-6)


def test_one_paired_round_has_no_standard_error_and_none_has_no_mean():
    m, se, n = paired_ratio({0: 3.0}, {0: 2.0})
    assert (m, n) == (1.5, 1) and math.isnan(se)
    m, se, n = paired_ratio({0: 3.0}, {1: 2.0})
    assert n == 0 and math.isnan(m) and math.isnan(se)

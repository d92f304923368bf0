"""Live step-time correction: worked numbers."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune_pipelines.controller.steptime import StepTimeModel


def model(**kw):
    prof = np.array([[5.0] * 8, [10.0] * 8])  # k = 1: 5 ms, k = 3: 10 ms at every B
    args = dict(prior_weight=50.0, min_prior_weight=2.0, max_count=1000.0)
    args.update(kw)
    return StepTimeModel((1, 3), prof, **args)


def obs(shape, cells):
    s, c = np.zeros(shape), np.zeros(shape)
    for (row, b), (ms, n) in cells.items():
        s[row, b - 1] += ms * n
        c[row, b - 1] += n
    return s, c


def test_blend_is_count_weighted():
    m = model()
    m.add(*obs(m.profile.shape, {(1, 4): (13.0, 50)}))  # 50 steps of 13 ms at B = 4, k = 3
    # (50 · 10 + 50 · 13) / (50 + 50) = 11.5 ms
    assert m.blended()[1, 3] == pytest.approx(11.5)
    assert m.blended()[0, 3] == 5.0  # k = 1 untouched


def test_correction_spreads_over_b_and_holds_beyond():
    m = model()
    m.add(*obs(m.profile.shape, {(1, 2): (15.0, 950), (1, 6): (10.0, 950)}))  # ratios 1.475, 1.0
    r = m.ratios()[1]
    w = 50.0 / 1000.0
    at2 = (w * 10 + (1 - w) * 15) / 10
    assert r[0] == pytest.approx(at2) and r[1] == pytest.approx(at2)          # held below B = 2
    assert r[3] == pytest.approx((at2 + 1.0) / 2)                           # linear between 2 and 6
    assert r[7] == pytest.approx(1.0)                                         # held above B = 6
    assert np.all(m.ratios()[0] == 1.0)                                       # k = 1 never observed
    assert m.corrected()[1, 0] == pytest.approx(10 * at2)


def test_decay_and_cap():
    m = model(max_count=100.0)
    m.add(*obs(m.profile.shape, {(0, 1): (7.0, 400)}))
    assert m.count[0, 0] == pytest.approx(100.0) and m.sum_ms[0, 0] == pytest.approx(700.0)  # mean kept
    for _ in range(10):
        m.decay()
    assert m.weight == 2.0  # floor
    # An unvisited cell keeps its estimate while the prior decays.
    assert m.blended()[0, 0] == pytest.approx((2 * 5 + 700) / 102)


def test_summary_lists_observed_cells():
    m = model()
    m.add(*obs(m.profile.shape, {(1, 4): (13.0, 50)}))
    assert m.summary() == {"3": [[4, 13.0, 50.0, 1.15]]}


def test_variance_carries_the_profile_error_and_the_live_spread():
    m = model()
    assert m.profile_error().tolist() == [0.05, 0.05]  # nothing observed: the floor
    # Nothing observed: every cell has the profile's error, 5 % relative.
    assert np.allclose(m.variance(), (0.05 * m.profile) ** 2)
    # k = 3 at B = 4: 50 steps, half 12 ms and half 14 ms (mean 13, sample variance 50/49 ms²).
    s, c = obs(m.profile.shape, {(1, 4): (12.0, 25)})
    s2, c2 = obs(m.profile.shape, {(1, 4): (14.0, 25)})
    m.add(s + s2, c + c2, sq_ms=np.where(c > 0, 25 * 144.0 + 25 * 196.0, 0.0))
    # k = 3's profile was 30 % off there: σ_p = 0.3 for k = 3, and for k = 1, never observed, too.
    assert m.profile_error() == pytest.approx([0.3, 0.3])
    # var T̂ = (50² (0.3 · 10)² + 50 · 50/49) / 100² = 2.2551 ms² at T̂ = 11.5 ms.
    want = (50 ** 2 * 3.0 ** 2 + 50 * 50 / 49) / 100 ** 2
    assert m.variance()[1, 3] == pytest.approx(want)
    # Spread over B as a relative variance (held beyond the observed cell); k = 1, never observed: σ_p.
    assert m.variance()[1, 7] == pytest.approx(want / 11.5 ** 2 * m.corrected()[1, 7] ** 2)
    assert m.variance()[0, 0] == pytest.approx((0.3 * 5.0) ** 2)
    # k = 1 observed right on its profile (20 steps of 5 ms at B = 2): its own error, the floor.
    m.add(*obs(m.profile.shape, {(0, 2): (5.0, 20)}))
    assert m.profile_error() == pytest.approx([0.05, 0.3])
    # More live steps shrink the profile's share: 950 more at 13 ms.
    m.add(*obs(m.profile.shape, {(1, 4): (13.0, 950)}))
    assert m.variance()[1, 3] < want / 10

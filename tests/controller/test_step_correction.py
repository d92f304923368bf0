"""Live step-time correction: worked numbers."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune_pipelines.controller.step_correction import StepTimeModel


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
    # Spread over B as a relative variance, plus the shape error (one well-observed cell: the 5 % floor)
    # growing over the evidence reach, 2 batch sizes here (twice the pool's half-width of 1): half of
    # it at B = 3 and 5, all of it from B = 6 on and at B = 1; k = 1, never observed: σ_p.
    assert m.evidence_reach() == 2
    assert m.shape_error().tolist() == [0.05, 0.05]
    rel = want / 11.5 ** 2
    assert m.variance()[1, 4] == pytest.approx((rel + 0.5 * 0.0025) * m.corrected()[1, 4] ** 2)
    assert m.variance()[1, 2] == pytest.approx((rel + 0.5 * 0.0025) * m.corrected()[1, 2] ** 2)
    assert m.variance()[1, 7] == pytest.approx((rel + 0.0025) * m.corrected()[1, 7] ** 2)
    assert m.variance()[1, 0] == pytest.approx((rel + 0.0025) * m.corrected()[1, 0] ** 2)
    assert m.variance()[0, 0] == pytest.approx((0.3 * 5.0) ** 2)
    # k = 1 observed right on its profile (20 steps of 5 ms at B = 2): its own error, the floor.
    m.add(*obs(m.profile.shape, {(0, 2): (5.0, 20)}))
    assert m.profile_error() == pytest.approx([0.05, 0.3])
    # More live steps shrink the profile's share: 950 more at 13 ms.
    m.add(*obs(m.profile.shape, {(1, 4): (13.0, 950)}))
    assert m.variance()[1, 3] < want / 10


def test_served_extra_pools_neighbouring_batch_sizes_and_keeps_the_prior_elsewhere():
    m = model()  # 8 batch sizes, hysteresis 0: the pool is B ± 1 (5 % of 8 rounds to 0, at least 1)
    assert m.pool_halfwidth() == 1 and m.pool_width() == 3  # B - 1 .. B + 1
    # k = 3's served steps (no clean step, so T̂ is the profile, 10 ms): 10 of 14 ms at B = 4, 10 of 16 at B = 5.
    s, c = obs(m.profile.shape, {(1, 4): (14.0, 10), (1, 5): (16.0, 10)})
    m.add_served(s, c, np.where(c > 0, s * s / np.maximum(c, 1), 0.0))
    e, v = m.served_extra()
    # The prior's error: half the largest extra observed (6 ms at B = 5), squared: 9 ms².
    v0 = 9.0
    # B = 4 pools B = 3..5: 20 steps, residuals 4 and 6 ms: mean 5, sample variance 20/19; w_T = 50.
    assert e[1, 3] == pytest.approx(20 * 5.0 / 70)
    assert v[1, 3] == pytest.approx((50 ** 2 * v0 + 20 * 20 / 19) / 70 ** 2)
    # B = 6 pools B = 5..7: the 10 steps at B = 5 alone.
    assert e[1, 5] == pytest.approx(10 * 6.0 / 60) and v[1, 5] == pytest.approx(50 ** 2 * v0 / 60 ** 2)
    # B = 2 saw no served step within its pool: the prior (0 ms) with its error, not the extra of B = 4.
    assert e[1, 1] == 0.0 and v[1, 1] == pytest.approx(v0)
    # k = 1, never served: the prior everywhere.
    assert np.all(e[0] == 0.0) and np.allclose(v[0], v0)
    # The pool is wider than the table's hysteresis (2 here: B ± 3), so the range it opens can apply.
    wide = model(hysteresis=2)
    wide.add_served(s, c, np.where(c > 0, s * s / np.maximum(c, 1), 0.0))
    assert wide.pool_halfwidth() == 3 and wide.served_extra()[0][1, 0] > 0.0  # B = 1 pools B = 1..4
    assert wide.pool_width() == 7


def test_the_unknown_served_extra_is_shared_where_neither_k_was_served():
    """Worked numbers on the case above: the prior's wide error (3 ms sd: half the 6 ms seen) is one
    unknown at a B where neither k was served near (covariance 9 ms² between them), and each k's own
    where either was (covariance 0)."""
    m = model()
    s, c = obs(m.profile.shape, {(1, 4): (14.0, 10), (1, 5): (16.0, 10)})
    m.add_served(s, c, np.where(c > 0, s * s / np.maximum(c, 1), 0.0))
    e, v = m.served_extra()
    e2, cov = m.served_extra_cov()
    assert np.array_equal(e, e2) and cov.shape == (v.shape[0], v.shape[0], v.shape[1])
    assert all(np.array_equal(cov[i, i], v[i]) for i in range(v.shape[0]))
    # B = 2: k = 1 and k = 3 unserved near it: one unknown, sd 3 ms each, correlation 1.
    assert cov[0, 1, 1] == pytest.approx(9.0) and cov[1, 0, 1] == pytest.approx(9.0)
    # B = 4: k = 3 served there (pooled), so its prior error is not shared with k = 1's.
    assert cov[0, 1, 3] == 0.0 and cov[1, 0, 3] == 0.0
    # Equal shared errors cancel in the log-ratio of goodput where the step times are equal.
    from tabletune_pipelines.core.evidence import log_ratio_sd
    t = np.full_like(v, 10.0)
    sd = log_ratio_sd(t, cov, ks=(1, 3), rates=(0.7, 0.5, 0.3))
    assert sd[0, 1, 1] == pytest.approx(0.0, abs=1e-9) and sd[0, 1, 3] > 0.3


def test_the_k_a_batch_size_left_loses_its_observations_there():
    m = model()
    s, c = obs(m.profile.shape, {(0, 3): (6.0, 40), (1, 3): (12.0, 40), (1, 4): (12.0, 40)})
    m.add(s, c)
    m.add_served(s, c, np.where(c > 0, s * s / np.maximum(c, 1), 0.0))
    # The table in force goes from k = 3 to k = 1 at B = 3 only (dense k per B, index B - 1).
    m.forget_left(np.array([3, 3, 3, 3, 3, 3, 3, 3]), np.array([3, 3, 1, 3, 3, 3, 3, 3]))
    assert m.count[1, 2] == 0 and m.all_count[1, 2] == 0 and m.sum_ms[1, 2] == 0 and m.sq_ms[1, 2] == 0
    assert m.count[1, 3] == 40 and m.count[0, 2] == 40  # B = 4 kept k = 3; k = 1 (the new k) keeps its own
    assert m.blended()[1, 2] == 10.0  # back to the profile there, with the profile's error


def test_a_served_step_is_judged_against_the_prefill_it_carried():
    """Worked numbers: the served extra is the prior's (the steady workload's priced prefill) plus the
    pooled mean of x − T̂ − m, m the extra each step's own prefill is priced at. Ramp-up steps that
    admitted far more prompts than steady serving will (on the H200: 63 ms over a 10-ms decode step,
    off the graphs) cost what they were priced at, so they leave the extra at the prior; judged
    against the decode surface alone they priced k = 3 at +63 ms there for good."""
    m = model()  # k = 3: 10 ms at every B; w_T = 50; pool B ± 1
    # 20 ramp-up steps at B = 4, k = 3: 73 ms each, priced at m = 60 (their prompts) → residual 3 ms.
    s, c = obs(m.profile.shape, {(1, 4): (73.0, 20)})
    ms = np.where(c > 0, s / np.maximum(c, 1), 0.0)
    m.add_served(s, c, s * ms, 60.0 * c, 3600.0 * c, 60.0 * s)
    e0 = np.full(m.profile.shape, 2.0)  # the steady workload's priced extra: 2 ms
    e, v = m.served_extra(e0, np.zeros_like(e0))
    assert e[1, 3] == pytest.approx(2.0 + 20 * 3.0 / 70)  # 2.857 ms, not 63
    # residuals all 3 ms: no spread; the prior's wide error is half the largest re-priced extra (5 ms)
    assert v[1, 3] == pytest.approx(50 ** 2 * (2.5 ** 2) / 70 ** 2)
    assert e[0, 3] == 2.0  # k = 1 was not served near B = 4: the prior
    # The same steps with their prefill unpriced (m = 0, a table priced on decode steps): 63 ms residuals.
    bare = model()
    bare.add_served(s, c, s * ms)
    eb, _ = bare.served_extra(e0, np.zeros_like(e0))
    assert eb[1, 3] == pytest.approx(2.0 + 20 * 63.0 / 70)
    # Without a prior either, the pooled mean of x − T̂ shrunk by w_T, as before.
    assert bare.served_extra()[0][1, 3] == pytest.approx(20 * 63.0 / 70)


def test_the_priced_extra_fades_and_is_forgotten_with_its_steps():
    m = model(max_count=10.0)
    s, c = obs(m.profile.shape, {(1, 4): (73.0, 20)})
    m.add_served(s, c, s * 73.0, 60.0 * c, 3600.0 * c, 60.0 * s)
    # capped at 10 steps: every sum scaled alike, so the residual (3 ms) stays
    assert m.all_count[1, 3] == 10 and m.all_m[1, 3] == pytest.approx(600.0)
    assert m.all_xm[1, 3] == pytest.approx(10 * 73.0 * 60.0) and m.all_m2[1, 3] == pytest.approx(36000.0)
    m.forget_left(np.full(8, 3), np.array([3, 3, 3, 1, 3, 3, 3, 3]))
    assert m.all_m[1, 3] == 0 and m.all_m2[1, 3] == 0 and m.all_xm[1, 3] == 0

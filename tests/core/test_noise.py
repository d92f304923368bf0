"""The noise model of a profile (``core.noise``): cell errors, pooling, interpolation, the prior's
count-based error and the two-parameter accepted-work fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.noise import (
    CellEstimate,
    NoisySurface,
    corrected_dense,
    fit_accepted_work,
    median_variances,
    pooled_correlation,
    rates_covariance,
)
from tabletune_pipelines.core.steptime import median_standard_error, weighted_non_decreasing_fit


def est(reps):
    reps = tuple(float(r) for r in reps)
    return CellEstimate(float(np.median(reps)), len(reps), median_standard_error(reps), reps)


def test_median_standard_error_from_repetitions():
    assert median_standard_error([5.0]) is None
    assert median_standard_error([4.0, 6.0]) == pytest.approx(np.std([4.0, 6.0], ddof=1) / math.sqrt(2))
    three = [4.0, 5.0, 6.0]
    assert median_standard_error(three) == pytest.approx(math.sqrt(math.pi / 2) * 1.0 / math.sqrt(3))


def test_shrinkage_pulls_a_lucky_cell_towards_the_pool():
    rng = np.random.default_rng(0)
    noisy = [est(10 * (1 + 0.1 * rng.standard_normal(3))) for _ in range(40)]
    lucky = est([10.0, 10.0001, 9.9999])  # three nearly equal repetitions by chance
    v = median_variances([*noisy, lucky])
    own = lucky.stderr_ms ** 2
    assert v[-1] > 100 * own  # the pool (about 10 % per repetition) dominates two degrees of freedom
    assert math.sqrt(v[-1]) / 10 == pytest.approx(math.sqrt(math.pi / 2) * 0.1 / math.sqrt(3) * math.sqrt(4 / 6),
                                                  rel=0.3)
    assert median_variances([CellEstimate(5.0, 1), CellEstimate(6.0, 1)]) == [None, None]


def test_no_repetitions_means_no_error_estimates():
    s = NoisySurface.from_cells({0: {1: CellEstimate(5.0, 1), 2: CellEstimate(6.0, 1)},
                                 1: {1: CellEstimate(7.0, 1), 2: CellEstimate(8.0, 1)}})
    assert not s.has_errors and np.all(s.var == 0)
    ms, cov = s.dense_cov(2)
    assert np.all(cov == 0) and ms[1, 1] == 8.0


def test_shared_drift_shows_as_correlation_and_independent_noise_does_not():
    rng = np.random.default_rng(1)
    drift = {b: 1 + 0.2 * rng.standard_normal(3) for b in range(1, 9)}
    shared = {k: {b: est(base * drift[b] * (1 + 0.02 * rng.standard_normal(3))) for b in range(1, 9)}
              for k, base in ((1, 10.0), (3, 14.0))}
    rho, pairs = pooled_correlation(shared)
    assert rho > 0.8 and pairs == 8 * 2
    indep = {k: {b: est(base * (1 + 0.2 * rng.standard_normal(3))) for b in range(1, 9)}
             for k, base in ((1, 10.0), (3, 14.0))}
    assert pooled_correlation(indep)[0] < 0.5
    ms, cov = NoisySurface.from_cells(shared).dense_cov(8)
    assert cov[0, 1, 3] == pytest.approx(NoisySurface.from_cells(shared).correlation
                                         * math.sqrt(cov[0, 0, 3] * cov[1, 1, 3]))


def test_weighted_fit_pulls_the_noisy_cell_more():
    fit, w = weighted_non_decreasing_fit([10.0, 8.0], [100.0, 1.0])
    assert fit[0] == fit[1] == pytest.approx((10 * 100 + 8) / 101) and np.all(w == 101.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100.0), st.floats(0.01, 100.0)), min_size=1, max_size=30))
def test_weighted_fit_properties(pairs):
    values, weights = zip(*pairs)
    fit, total = weighted_non_decreasing_fit(values, weights)
    assert np.all(np.diff(fit) >= -1e-9)
    assert float(np.dot(fit, weights)) == pytest.approx(float(np.dot(values, weights)), rel=1e-9)
    assert np.all(total >= np.asarray(weights) - 1e-12)


def test_interpolation_adds_error_where_t_is_curved():
    cells = {1: {1: est([1.0, 1.1, 0.9]), 9: est([5.0, 5.1, 4.9]), 17: est([25.0, 25.5, 24.5])}}
    s = NoisySurface.from_cells(cells)
    ms, var = s.dense(17)
    assert var[0, 0] == pytest.approx(s.var[0, 0]) and var[0, 8] == pytest.approx(s.var[0, 1])
    # Midway between 9 and 17 the linear interpolation misses a curved T: more than the neighbours'.
    neighbours = 0.25 * s.var[0, 1] + 0.25 * s.var[0, 2]
    assert var[0, 12] > neighbours + 1.0


def test_rates_covariance_is_binomial_and_nested():
    cov = rates_covariance((0.8, 0.5), (1000, 1000))
    assert cov[0, 0] == pytest.approx(0.8 * 0.2 / 1000) and cov[1, 1] == pytest.approx(0.5 * 0.5 / 1000)
    assert cov[0, 1] == cov[1, 0] == pytest.approx(0.5 * 0.2 / 1000)
    assert np.all(rates_covariance((0.8, 0.5)) == 0)  # no counts: taken as exact


def _profile(alpha, beta, noise, rng, ks=(1, 2, 3), bs=(1, 8, 16)):
    reject = {k: {b: est((4 + k + 0.3 * b) * (1 + noise * rng.standard_normal(3))) for b in range(1, 17)} for k in ks}
    accept = {k: {b: est((4 + k + 0.3 * b + k * (alpha + beta * b)) * (1 + noise * rng.standard_normal(3)))
                  for b in bs} for k in ks}
    surface = NoisySurface.from_cells(reject)
    var = {k: {b: v for b, v in zip(bs, median_variances(list(row.values())))} for k, row in accept.items()}
    return surface, accept, var


def test_accepted_work_fit_recovers_a_real_effect_and_finds_no_effect_in_noise():
    rng = np.random.default_rng(4)
    surface, accept, var = _profile(0.2, 0.05, 0.01, rng)
    fit = fit_accepted_work(surface, accept, var)
    assert fit.significant and fit.alpha_ms == pytest.approx(0.2, abs=0.1) and fit.beta_ms == pytest.approx(0.05,
                                                                                                           abs=0.02)
    assert fit.summary()["significant"] is True and fit.summary()["cells"] == 9
    surface, accept, var = _profile(0.0, 0.0, 0.15, np.random.default_rng(5))
    null = fit_accepted_work(surface, accept, var)
    assert not null.significant and "no correction is applied" in null.notes[-1]
    ms, cov = corrected_dense(*surface.dense(16), surface.ks, (0.7, 0.5, 0.3), null)
    np.testing.assert_allclose(ms, surface.dense(16)[0])  # not significant: nothing added


def test_corrected_dense_scales_by_the_kept_fraction_and_shares_the_error():
    rng = np.random.default_rng(6)
    surface, accept, var = _profile(0.2, 0.05, 0.005, rng, ks=(1, 3))
    fit = fit_accepted_work(surface, accept, var)
    ms0, v0 = surface.dense(16)
    ms, cov = corrected_dense(ms0, v0, surface.ks, (0.7, 0.5, 0.3), fit)
    per_tok = fit.alpha_ms + fit.beta_ms * 8
    assert ms[1, 7] - ms0[1, 7] == pytest.approx((0.7 + 0.5 + 0.3) * per_tok)  # k = 3: tau - 1 kept drafts
    assert ms[0, 7] - ms0[0, 7] == pytest.approx(0.7 * per_tok)
    assert cov[0, 1, 7] > 0  # one fit: its error is shared between k


def test_a_single_accept_batch_size_fits_one_parameter():
    rng = np.random.default_rng(8)
    surface, accept, var = _profile(0.5, 0.0, 0.01, rng, bs=(8,))
    fit = fit_accepted_work(surface, accept, var)
    assert fit.params == 1 and fit.beta_ms == 0.0 and fit.cov[1, 1] == 0.0 and fit.significant


# -- units_to_detect: the sample size of a test sized by power ------------------------------------------

def test_units_to_detect_worked_numbers():
    from tabletune_pipelines.core.noise import units_to_detect

    # sd 0.10, effect 0.05: (1.96 · 0.10 / 0.05)² = 15.37 -> 16 at the mean; with 99 % power
    # (z 2.326) (4.286 · 2)² = 73.5 -> 74
    assert units_to_detect(0.10, 0.05) == 16
    assert units_to_detect(0.10, 0.05, z_power=2.326) == 74
    assert units_to_detect(0.10, -0.05) == 16  # the side does not matter
    assert units_to_detect(0.0, 0.05) == 2 and units_to_detect(0.0, 0.05, minimum=5) == 5
    assert units_to_detect(0.1, 0.0) is None and units_to_detect(float("nan"), 0.1) is None


@settings(max_examples=200, deadline=None)
@given(sd=st.floats(1e-3, 10.0), effect=st.floats(1e-3, 10.0), z=st.floats(0.0, 4.0))
def test_units_to_detect_is_the_least_n_whose_interval_clears_the_effect(sd, effect, z):
    from tabletune_pipelines.core.noise import units_to_detect

    n = units_to_detect(sd, effect, z_power=z, minimum=1)
    margin = (1.96 + z) * sd
    assert margin / math.sqrt(n) <= effect * (1 + 1e-9)  # n units clear it ...
    assert n == 1 or margin / math.sqrt(n - 1) > effect * (1 - 1e-9)  # ... and n - 1 do not

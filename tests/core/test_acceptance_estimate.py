import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.acceptance_estimate import (
    AcceptanceEstimator,
    BoundaryHysteresis,
    EstimatorConfig,
    monotone_rates,
    rates_from_counts,
)
from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidValueError


def test_blend_worked_example():
    # prior a_2 = 0.5, live drafted_2 = 2000, accepted_2 = 1200 → (1000 + 1200) / 4000 = 0.55
    est = AcceptanceEstimator((0.7, 0.5, 0.3))
    est.observe_counts([2000, 2000, 2000], [1500, 1200, 700])
    a = est.estimate()
    assert a[1] == pytest.approx(0.55)
    assert a[0] == pytest.approx((1400 + 1500) / 4000)
    assert a[2] == pytest.approx((600 + 700) / 4000)


def test_per_request_observation_counts_leading_positions():
    est = AcceptanceEstimator((0.5, 0.5, 0.5))
    est.observe(3, 2)  # drafted 3, kept 2
    np.testing.assert_array_equal(est.drafted, [1, 1, 1])
    np.testing.assert_array_equal(est.accepted, [1, 1, 0])
    est.observe(1, 0)
    np.testing.assert_array_equal(est.drafted, [2, 1, 1])
    with pytest.raises(InvalidAcceptanceError, match="kept=2"):
        est.observe(1, 2)
    with pytest.raises(InvalidAcceptanceError, match="drafted=4"):
        est.observe(4, 0)


def test_rebuild_halves_counters_and_optionally_the_prior():
    est = AcceptanceEstimator((0.5,), EstimatorConfig(prior_decay=True))
    est.observe_counts([400], [100])
    est.rebuild()
    assert est.drafted[0] == 200 and est.accepted[0] == 50 and est.prior_weight == 1000
    plain = AcceptanceEstimator((0.5,))
    plain.rebuild()
    assert plain.prior_weight == 2000


def test_prior_decay_lets_live_traffic_take_over():
    stale, fresh = AcceptanceEstimator((0.9,), EstimatorConfig(prior_decay=True)), AcceptanceEstimator((0.9,))
    for _ in range(12):
        for e in (stale, fresh):
            e.observe_counts([500], [100])  # live rate 0.2
            e.rebuild()
    assert abs(stale.estimate()[0] - 0.2) < 0.02
    assert fresh.estimate()[0] > 0.4  # without decay the prior still dominates


def test_unobserved_positions_keep_prior_but_stay_monotone():
    est = AcceptanceEstimator((0.6, 0.5, 0.4))
    est.observe_counts([5000, 0, 0], [500, 0, 0])  # table ran k=1 only
    a = est.estimate()
    assert a[0] == pytest.approx((1200 + 500) / 7000)
    assert a[1] <= a[0] and a[2] <= a[1]


def test_bad_prior_is_rejected():
    with pytest.raises(InvalidAcceptanceError, match="a_2"):
        AcceptanceEstimator((0.2, 0.6))
    with pytest.raises(InvalidValueError, match="prior_weight"):
        EstimatorConfig(prior_weight=0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=200),
    st.integers(0, 5),
    st.booleans(),
)
def test_estimate_in_unit_interval_and_non_increasing(raw_prior, obs, rebuilds, decay):
    prior = tuple(np.minimum.accumulate(sorted(raw_prior, reverse=True)))
    est = AcceptanceEstimator(prior, EstimatorConfig(prior_decay=decay))
    K = len(prior)
    for i, (n, m) in enumerate(obs):
        n = min(n, K)
        est.observe(n, min(m, n))
        if rebuilds and i % (1 + len(obs) // (rebuilds + 1)) == 0:
            est.rebuild()
    a = est.estimate()
    assert np.all(a >= 0) and np.all(a <= 1)
    assert np.all(np.diff(a) <= 1e-12)


def test_hysteresis_holds_k_near_boundary():
    lookup = [3] * 16 + [1] * 16  # boundary between B = 16 and 17
    h = BoundaryHysteresis(h=2)
    assert h.select(lookup, 17, current_k=3) == 3  # 1 away from a k=3 batch size
    assert h.select(lookup, 18, current_k=3) == 3  # 2 away
    assert h.select(lookup, 19, current_k=3) == 1  # 3 away: switch
    assert h.select(lookup, 15, current_k=1) == 1
    assert h.select(lookup, 13, current_k=1) == 3
    assert BoundaryHysteresis(0).select(lookup, 17, current_k=3) == 1
    assert h.select(lookup, 40, current_k=None) == 1  # clamps to the table's end


def test_counts_become_rates_one_way():
    """``rates_from_counts``: a_i = accepted_i / drafted_i, clipped and non-increasing; a position never
    drafted gets 0 or, with ``undrafted="previous"``, the rate before it."""
    assert rates_from_counts([70, 50, 30], [100, 100, 100]).tolist() == [0.7, 0.5, 0.3]
    assert rates_from_counts([80, 45, 30], [100, 50, 20]).tolist() == [0.8, 0.8, 0.8]  # 0.9 and 1.5 capped
    assert rates_from_counts([80, 0, 0], [100, 0, 0]).tolist() == [0.8, 0.0, 0.0]
    assert rates_from_counts([80, 0, 0], [100, 0, 0], undrafted="previous").tolist() == [0.8, 0.8, 0.8]
    assert rates_from_counts([0, 0], [0, 0], undrafted="previous").tolist() == [0.0, 0.0]
    assert rates_from_counts([60, 9], [100, 10, 10]).tolist() == [0.6, 0.6]  # the shorter sequence decides
    assert rates_from_counts([], []).size == 0
    assert monotone_rates([1.2, 0.5, 0.7, -0.1]).tolist() == [1.0, 0.5, 0.5, 0.0]
    with pytest.raises(InvalidValueError, match="undrafted"):
        rates_from_counts([1], [1], undrafted="carry")  # type: ignore[arg-type]

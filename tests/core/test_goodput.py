"""The worked numbers of docs/method.md, "Goodput", and input validation for goodput and tau."""

import math

import numpy as np
import pytest

from tabletune_pipelines.core.goodput import goodput, tau, tau_curve, validate_acceptance
from tabletune_pipelines.core.table import choose_draft_lengths
from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidStepTimeError

A = (0.7, 0.5, 0.3)


def test_tau_worked_example():
    assert tau(A, 1) == pytest.approx(1.7)
    assert tau(A, 3) == pytest.approx(2.5)
    assert tau(A, 0) == 1.0
    np.testing.assert_allclose(tau_curve(A), [1.0, 1.7, 2.2, 2.5])


def test_tokens_per_request_per_ms_worked_example():
    # tokens per request per ms = tau / T
    assert tau(A, 1) / 5.0 == pytest.approx(0.34)
    assert tau(A, 3) / 8.0 == pytest.approx(0.3125)


@pytest.mark.parametrize(
    "t1,t3,expected",
    [(5.0, 8.0, 1), (4.5, 6.0, 3)],
)
def test_choice_between_k1_and_k3(t1, t3, expected):
    # One batch size column; k in {1, 3}; no stickiness at the first column.
    step = np.array([[t1], [t3]])
    choice = choose_draft_lengths(step, (1, 3), A)
    assert choice.chosen == (expected,)
    g1 = goodput(1, 1, t1, A)
    g3 = goodput(1, 3, t3, A)
    assert (g3 > g1) == (expected == 3)


def test_goodput_scales_with_batch_size():
    assert goodput(4, 1, 5.0, A) == pytest.approx(4 * 1.7 / 0.005)


@pytest.mark.parametrize(
    "rates,needle",
    [((0.7, 1.2), "a_2 = 1.2"), ((-0.1,), "a_1 = -0.1"), ((0.3, 0.5), "a_2 = 0.5 is larger than a_1 = 0.3"),
     ((float("nan"),), "a_1 = nan")],
)
def test_bad_acceptance_rates_are_named(rates, needle):
    with pytest.raises(InvalidAcceptanceError, match=needle.replace("(", r"\(")):
        validate_acceptance(rates)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), None, "fast"])
def test_bad_step_times_are_named(bad):
    with pytest.raises(InvalidStepTimeError) as err:
        goodput(2, 1, bad, A)
    assert repr(bad) in str(err.value) or str(bad) in str(err.value)
    assert "B=2, k=1" in str(err.value) or "not a number" in str(err.value)


def test_tau_rejects_k_beyond_rates():
    with pytest.raises(InvalidAcceptanceError, match="k = 4"):
        tau(A, 4)
    assert math.isclose(tau((), 0), 1.0)


def test_one_student_t_never_below_the_exact_quantile():
    from tabletune_pipelines.core.stats import t_quantile

    # exact two-sided 95 % quantiles (3 decimals) at dof that the table does not list
    exact = {21: 2.080, 22: 2.074, 25: 2.060, 35: 2.030, 50: 2.009, 100: 1.984, 200: 1.972, 10_000: 1.960}
    for dof, t in exact.items():
        assert t <= t_quantile(dof) <= t + 0.02, dof
    assert [t_quantile(d) for d in (1, 2, 3, 10, 30)] == [12.706, 4.303, 3.182, 2.228, 2.042]
    assert all(t_quantile(d) >= t_quantile(d + 1) for d in range(1, 500))


def test_theil_sen_worked_numbers_and_its_refusals():
    from tabletune_pipelines.core.stats import theil_sen
    from tabletune_pipelines.errors import InvalidValueError

    # y = 2 + 3x with one pause: the pairwise slopes' median and the intercepts' median ignore it
    pts = [(0, 2.0), (1, 5.0), (2, 8.0), (3, 11.0), (4, 500.0)]
    assert theil_sen(pts) == (2.0, 3.0)
    # a falling line, and the same points with the slope held at 0 or above
    assert theil_sen([(0, 4.0), (2, 0.0), (4, -4.0)]) == (4.0, -2.0)
    assert theil_sen([(0, 4.0), (2, 0.0), (4, -4.0)], min_slope=0.0) == (0.0, 0.0)
    with pytest.raises(InvalidValueError, match=r"two different x; got \[3.0\]"):
        theil_sen([(3, 1.0), (3, 2.0)])

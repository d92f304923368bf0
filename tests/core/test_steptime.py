import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.steptime import (
    StepTimes,
    StepTimeSurface,
    accepted_work_correction,
    batch_size_grid,
    median_step_time,
    relative_spread,
    step_time_from_pair,
)
from tabletune_pipelines.errors import EmptyProfileError, InvalidStepTimeError, InvalidValueError


def test_step_time_protocol():
    # 64 decode steps between the 1-token and the 65-token batch.
    assert step_time_from_pair(0.100, 0.420) == pytest.approx(5.0)


def test_step_time_rejects_inverted_pair():
    with pytest.raises(InvalidStepTimeError, match="not longer than t1"):
        step_time_from_pair(0.5, 0.4)
    with pytest.raises(InvalidStepTimeError, match="t1 = 0"):
        step_time_from_pair(0, 0.4)


def test_median_and_spread():
    assert median_step_time([5.0, 4.0, 6.5]) == 5.0
    assert relative_spread([5.0, 4.0, 6.5]) == pytest.approx(0.5)
    with pytest.raises(EmptyProfileError):
        median_step_time([])
    with pytest.raises(InvalidStepTimeError):
        median_step_time([1.0, -2.0])


def test_grid_dense_then_strided():
    assert batch_size_grid(16) == list(range(1, 17))
    g = batch_size_grid(64, stride=8)
    assert g[:16] == list(range(1, 17)) and g[16:] == [24, 32, 40, 48, 56, 64]
    assert batch_size_grid(50, stride=8)[-2:] == [48, 50]
    assert batch_size_grid(4) == [1, 2, 3, 4]
    with pytest.raises(InvalidValueError, match="stride = 2"):
        batch_size_grid(64, stride=2)


def test_surface_interpolates_between_measured_batch_sizes():
    s = StepTimeSurface.from_cells({0: {1: 3.0, 16: 4.5, 32: 6.0}, 1: {1: 4.0, 16: 8.0, 32: 12.0}})
    dense = s.dense(32)
    assert dense.shape == (2, 32)
    assert dense[1, 23] == pytest.approx(8.0 + (24 - 16) / 16 * 4.0)
    assert s.at(0, 16) == 4.5


def test_surface_errors_are_actionable():
    with pytest.raises(EmptyProfileError, match="no measured cells"):
        StepTimeSurface.from_cells({})
    with pytest.raises(EmptyProfileError, match="differ at batch sizes \\[4\\]"):
        StepTimeSurface.from_cells({0: {1: 3.0, 4: 3.5}, 1: {1: 4.0}})
    with pytest.raises(EmptyProfileError, match="must include B = 1"):
        StepTimeSurface.from_cells({0: {2: 3.0}})
    with pytest.raises(InvalidStepTimeError, match="B=4, k=1"):
        StepTimeSurface.from_cells({0: {1: 3.0, 4: 3.5}, 1: {1: 4.0, 4: 0.0}})
    s = StepTimeSurface.from_cells({0: {1: 3.0, 8: 3.5}})
    with pytest.raises(EmptyProfileError, match="only reaches batch size 8"):
        s.dense(16)


def test_accepted_work_correction_scales_with_kept_fraction():
    s = StepTimeSurface.from_cells({0: {1: 3.0, 8: 4.0}, 2: {1: 5.0, 8: 7.0}})
    # Accepting everything at k=2 costs +2 ms at B=1 and +4 ms at B=8.
    out = accepted_work_correction(s, {2: {1: 7.0, 8: 11.0}}, (0.5, 0.25), 8)
    frac = (0.5 + 0.25) / 2
    assert out[1, 0] == pytest.approx(5.0 + 2.0 * frac)
    assert out[1, 7] == pytest.approx(7.0 + 4.0 * frac)
    np.testing.assert_allclose(out[0], s.dense(8)[0])  # k = 0 keeps no drafts


def test_non_decreasing_fit_pools_dips():
    from tabletune_pipelines.core.steptime import non_decreasing_fit

    np.testing.assert_allclose(non_decreasing_fit([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(non_decreasing_fit([10.0, 15.83, 14.49]), [10.0, 15.16, 15.16])
    np.testing.assert_allclose(non_decreasing_fit([3.0, 1.0, 2.0, 5.0]), [2.0, 2.0, 2.0, 5.0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=40))
def test_non_decreasing_fit_properties(values):
    from tabletune_pipelines.core.steptime import non_decreasing_fit

    fit = non_decreasing_fit(values)
    assert len(fit) == len(values)
    assert np.all(np.diff(fit) >= -1e-9)
    assert fit.sum() == pytest.approx(sum(values))  # PAV preserves the total
    if all(b >= a for a, b in zip(values, values[1:])):
        np.testing.assert_allclose(fit, values)


def test_noisy_dip_does_not_carve_a_one_batch_size_range():
    # k = 3 cells from an embedded-default profile (n-gram, a = 0.836/0.708/0.632) measured
    # 15.83 ms at B = 15 but 14.49 ms at B = 16; with a low k = 1 cell at B = 15 the raw search
    # carves a lone [15, 15, 1] range out of a k = 3 table.
    from tabletune_pipelines.core.table import build_table

    cells = {1: {1: 6.0, 14: 10.9, 15: 9.0, 16: 12.93}, 3: {1: 7.0, 14: 13.67, 15: 15.83, 16: 14.49}}
    rates = (0.836, 0.708, 0.632)
    raw = build_table(StepTimeSurface.from_cells(cells), rates, 16)
    assert [15, 15, 1] in raw.ranges
    smooth = build_table(StepTimeSurface.from_cells(cells).non_decreasing(), rates, 16)
    assert smooth.ranges == [[1, 16, 3]]


# -- StepTimes: T at every batch size with its uncertainty ------------------------------------------

def test_step_times_hold_t_and_its_variance_per_k_and_batch_size():
    ms = np.array([[10.0, 12.0, 14.0], [11.0, 14.0, 18.0]])
    var = np.array([[0.25, 0.36, 0.49], [1.0, 0.0, 4.0]])
    t = StepTimes((0, 3), ms, var)
    assert t.max_batch_size == 3 and t.has_errors
    assert t.at(3, 3) == (18.0, 4.0) and t.at(0, 2) == (12.0, 0.36)
    cov = t.covariance()
    assert cov.shape == (2, 2, 3) and cov[1, 1, 2] == 4.0 and cov[0, 1, 2] == 0.0
    assert t.variance().tolist() == var.tolist()
    bare = StepTimes([0, 3], ms)
    assert bare.ks == (0, 3) and not bare.has_errors and bare.variance().tolist() == [[0.0] * 3] * 2
    assert not StepTimes((0, 3), ms, np.zeros((2, 3))).has_errors
    full = np.zeros((2, 2, 3))
    full[0, 1] = full[1, 0] = 0.1
    full[0, 0], full[1, 1] = var[0], var[1]
    assert StepTimes((0, 3), ms, full).covariance()[0, 1, 0] == 0.1


@pytest.mark.parametrize("args,needle", [
    (((0, 1, 3), np.ones((2, 3))), "shape \\(2, 3\\); expected \\(3, N\\)"),
    (((0, 3), np.ones((2, 3)), np.ones((2, 4))), "covariance has shape \\(2, 4\\)"),
])
def test_step_times_of_the_wrong_shape_name_it(args, needle):
    with pytest.raises(InvalidStepTimeError, match=needle):
        StepTimes(*args)


def test_step_times_lookups_outside_the_surface_are_refused():
    t = StepTimes((0, 3), np.ones((2, 4)))
    with pytest.raises(InvalidValueError, match="k = 2 is not one of"):
        t.at(2, 1)
    with pytest.raises(InvalidValueError, match="batch size 5 is outside 1..4"):
        t.at(0, 5)

"""Small-sample statistics every judgement shares: the mean with its standard error, the paired ratio,
and Student's t.

``t_quantile`` is the one Student-t of the project: the served verification's verdicts, the
acceptance intervals of grouped counts and the benchmarks' comparisons all take their t from it.
``paired_ratios`` and ``paired_ratio`` pair two series by round (the served verification's verdicts
and the benchmarks' comparisons of two policies).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from statistics import NormalDist

from tabletune_pipelines.errors import InvalidValueError

#: Student's t, one-sided 97.5 % (two-sided 95 %), by degrees of freedom (exact to 3 decimals).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 24: 2.064, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile(dof: int, confidence: float = 0.95) -> float:
    """Student's two-sided ``confidence`` quantile (one-sided 97.5 % at 0.95) for ``dof`` degrees of
    freedom. Between tabulated dof, the next tabulated dof below, so never smaller than the exact
    value; above 120, 1.96 + 2.4 / dof (within 0.001 above the exact value). Other confidences: the
    normal quantile times (1 + 1 / dof), a rough but conservative stand-in."""
    if not isinstance(dof, int) or isinstance(dof, bool) or dof < 1:
        raise InvalidValueError(f"dof = {dof!r} must be an integer >= 1")
    if not 0.0 < confidence < 1.0:
        raise InvalidValueError(f"confidence = {confidence!r} must be in (0, 1)")
    if abs(confidence - 0.95) > 1e-9:
        return NormalDist().inv_cdf(0.5 + confidence / 2) * (1 + 1 / dof)
    if dof > 120:
        return 1.96 + 2.4 / dof
    return _T975[max(d for d in _T975 if d <= dof)]


def mean_se(xs: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error of the non-NaN values (NaN, NaN when none; s.e. NaN for one)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def paired_ratios(a: Mapping[int, float], b: Mapping[int, float]) -> list[float]:
    """``a[r] / b[r]`` for every round ``r`` both series measured, in round order; a round where ``b``
    is not positive is left out (no ratio)."""
    return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r] > 0]


def paired_ratio(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, int]:
    """Mean of the paired ratios ``a / b`` (``paired_ratios``), its standard error (``mean_se``) and
    the number of paired rounds."""
    ratios = paired_ratios(a, b)
    m, se = mean_se(ratios)
    return m, se, len(ratios)


def theil_sen(points: Iterable[tuple[float, float]], *, min_slope: float | None = None) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through ``points`` (x, y): the median of the slopes
    of every pair with different x, raised to ``min_slope`` where one is given, and the median of
    y − slope·x. Robust to the odd pause a step log holds. Raises ``InvalidValueError`` without two
    different x."""
    pts = [(float(x), float(y)) for x, y in points]
    slopes = [(by - ay) / (bx - ax) for i, (ax, ay) in enumerate(pts) for bx, by in pts[i + 1:] if bx != ax]
    if not slopes:
        raise InvalidValueError(f"a line needs two different x; got {sorted({x for x, _ in pts})}")
    slope = float(statistics.median(slopes))
    if min_slope is not None:
        slope = max(float(min_slope), slope)
    return float(statistics.median(y - slope * x for x, y in pts)), slope

"""Confidence intervals of measured acceptance a_1..a_K, and whether two priors differ.

Two kinds of interval:

* ``prior_intervals(prior)``: Wilson score intervals of kept_i / drafted_i from the counts a prior
  stores (the binomial model ``core.noise.rates_covariance`` uses for the table search). It
  counts every draft as an independent trial. Drafts of one request are not independent (a
  prompt whose answer copies its own text is accepted again and again), so this interval is
  too narrow when a sample holds few prompts of very different kinds.
* ``group_intervals(groups)``: the prompt sample measured in G groups of different prompts (each a
  prior of its own, same server, one after another); the interval of the pooled a_i is
  Student-t on the spread of the G per-group rates weighted by their drafts (batch means). It
  counts prompts, not drafts, as the units, so within-prompt correlation is inside its width.
  The acceptance engine test reports both and the ratio of their widths.

``differ(a, b)``: positions where two intervals do not overlap; ``difference_intervals(a, b)``:
the interval of a_i - b_i, whose excluding 0 is the significance test of a drift. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from tabletune_pipelines.core.stats import t_quantile
from tabletune_pipelines.errors import InvalidValueError

DEFAULT_CONFIDENCE = 0.95

@dataclass(frozen=True)
class Interval:
    value: float
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def wilson(kept: float, drafted: float, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Wilson score interval of kept / drafted (the whole [0, 1] when nothing was drafted)."""
    if drafted <= 0:
        return Interval(0.0, 0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = min(max(kept / drafted, 0.0), 1.0)
    den = 1 + z * z / drafted
    centre = (p + z * z / (2 * drafted)) / den
    half = z * math.sqrt(p * (1 - p) / drafted + z * z / (4 * drafted * drafted)) / den
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def prior_intervals(prior, confidence: float = DEFAULT_CONFIDENCE) -> list[Interval]:
    """Wilson interval of every position of a prior (``documents.AcceptancePrior``), around its rate."""
    out = []
    for i, rate in enumerate(prior.rates):
        d = prior.drafted_per_pos[i] if i < len(prior.drafted_per_pos) else 0
        a = prior.accepted_per_pos[i] if i < len(prior.accepted_per_pos) else 0
        w = wilson(a, d, confidence)
        out.append(Interval(float(rate), min(w.lo, float(rate)), max(w.hi, float(rate))))
    return out


def group_standard_errors(groups: Sequence) -> list[tuple[float, float]]:
    """Per position, the pooled a_i of G >= 2 groups (anything with ``drafted_per_pos`` and
    ``accepted_per_pos``: priors, the controller's counter windows) and its batch-means standard
    error (the ratio estimator over the groups as clusters); (0, inf) where nothing was drafted."""
    if len(groups) < 2:
        raise InvalidValueError("batch means need at least two groups")
    k = min(len(g.drafted_per_pos) for g in groups)
    out = []
    for i in range(k):
        d = [float(g.drafted_per_pos[i]) for g in groups]
        a = [float(g.accepted_per_pos[i]) for g in groups]
        n = sum(d)
        if n <= 0:
            out.append((0.0, math.inf))
            continue
        pooled = sum(a) / n
        G = len(groups)
        dbar = n / G
        # ratio-estimator variance of sum(a)/sum(d) over G clusters
        var = sum((ai - pooled * di) ** 2 for ai, di in zip(a, d, strict=True)) / (G - 1) / G / dbar ** 2
        out.append((pooled, math.sqrt(var)))
    return out


def group_intervals(groups: Sequence, confidence: float = DEFAULT_CONFIDENCE) -> list[Interval]:
    """Batch-means interval of the pooled a_i from G >= 2 per-group priors (module docstring)."""
    errors = group_standard_errors(groups)  # raises below two groups
    t = t_quantile(len(groups) - 1, confidence)
    out = []
    for pooled, se in errors:
        if math.isinf(se):
            out.append(Interval(0.0, 0.0, 1.0))
            continue
        half = t * se
        out.append(Interval(pooled, max(0.0, pooled - half), min(1.0, pooled + half)))
    return out


def difference_intervals(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Interval of a_i - b_i from two independent intervals (each half-width read as z·se; the
    difference's half-width is the root of the sum of squares): the test that two priors differ.
    Stricter than not overlapping would be looser: two 95 % intervals that just touch already
    differ at about 99.4 %."""
    out = []
    for x, y in zip(a, b, strict=False):
        hx, hy = (x.hi - x.lo) / 2, (y.hi - y.lo) / 2
        d, h = x.value - y.value, math.hypot(hx, hy)
        out.append(Interval(d, d - h, d + h))
    return out


def differ(a: Sequence[Interval], b: Sequence[Interval]) -> list[int]:
    """Positions (0-based) whose intervals do not overlap."""
    return [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.hi < y.lo or y.hi < x.lo]


def format_intervals(ivs: Sequence[Interval]) -> str:
    return ", ".join(f"a_{i + 1} = {iv}" for i, iv in enumerate(ivs))

"""Online acceptance estimation (docs/method.md, "Online controller").

Per draft position i the estimator keeps ``drafted_i`` (how often position i was drafted) and
``accepted_i`` (how often it was kept), fed by (drafted n, kept m) per request per step. Every
rebuild blends them with the measured prior, treating the prior as ``w`` observations:

    â_i = (w · a_i_prior + accepted_i) / (w + drafted_i)

then halves the live counters (recent traffic dominates) and, with prior decay on, halves ``w``
too (stale priors fade). Pure numpy, no I/O: the controller plugin runs this inside vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from tabletune_pipelines.core.goodput import validate_acceptance
from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidValueError
from tabletune_pipelines.options import Bound, check_bounds

#: The prior counts as this many observations (docs/method.md, "Online controller").
DEFAULT_PRIOR_WEIGHT = 2000.0

Undrafted = Literal["zero", "previous"]
"""What ``rates_from_counts`` gives a draft position that was never drafted (see there)."""


def monotone_rates(rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """Survival rates as they are by definition: clipped to [0, 1] and non-increasing with position
    (a position never gets more survival than the one before it). The one place this is done."""
    return np.minimum.accumulate(np.clip(np.asarray(rates, dtype=float).reshape(-1), 0.0, 1.0))


def rates_from_counts(accepted_per_pos: Sequence[float] | np.ndarray, drafted_per_pos: Sequence[float] | np.ndarray, *,
                      undrafted: Undrafted = "zero") -> np.ndarray:
    """Per-position counts → acceptance rates a_i = accepted_i / drafted_i, made monotone
    (``monotone_rates``): the one way counts become rates (an acceptance measurement, the live
    counters' prior, a benchmark's profiling pass).

    A position with no drafts has no evidence: ``undrafted="zero"`` gives it 0 (the live counters:
    a k the controller never drafted is not credited), ``"previous"`` the rate of the position
    before it (0 for the first; an acceptance measurement at a fixed K). Counts beyond the shorter
    of the two sequences are ignored.
    """
    if undrafted not in ("zero", "previous"):
        raise InvalidValueError(f"undrafted = {undrafted!r} must be 'zero' or 'previous'")
    a = np.asarray(accepted_per_pos, dtype=float).reshape(-1)
    d = np.asarray(drafted_per_pos, dtype=float).reshape(-1)
    n = min(a.size, d.size)
    a, d = a[:n], d[:n]
    drafted = d > 0
    raw = np.divide(a, d, out=np.zeros(n), where=drafted)
    if undrafted == "previous":
        last = np.maximum.accumulate(np.where(drafted, np.arange(n), -1))  # the last drafted position so far
        raw = np.where(last >= 0, raw[np.maximum(last, 0)], 0.0)
    return monotone_rates(raw)


@dataclass(frozen=True)
class EstimatorConfig:
    """How live acceptance counts are blended with the measured prior."""

    prior_weight: float = DEFAULT_PRIOR_WEIGHT
    """w: how many observations the prior is worth (2000 in the method)."""
    halve_after_rebuild: bool = True
    """Halve the live counters after each rebuild so recent traffic dominates."""
    prior_decay: bool = False
    """Also halve the prior's weight at each rebuild, so a stale prior fades away."""
    min_prior_weight: float = 1.0
    """Floor for the decayed prior weight (keeps never-drafted positions defined)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # ``options.check_bounds``: NaN, infinity and a bool are refused
        "prior_weight": Bound(1e-3, 1e12, why="drafts the prior counts as; a week of serving drafts ~6e11 times"),
        "min_prior_weight": Bound(1e-3, 1e12, why="drafts; the floor of the decayed prior weight"),
    }

    def __post_init__(self) -> None:
        check_bounds(self, where="acceptance estimator", error=InvalidValueError)
        if not 0 < self.min_prior_weight <= self.prior_weight:
            raise InvalidValueError(
                f"min_prior_weight = {self.min_prior_weight!r} must be in (0, prior_weight={self.prior_weight}]"
            )


class AcceptanceEstimator:
    """Blends live per-position acceptance counters with a prior a_1..a_K."""

    def __init__(self, prior: Sequence[float], config: EstimatorConfig | None = None) -> None:
        self.prior = validate_acceptance(prior, name="prior acceptance rates")
        if self.prior.size == 0:
            raise InvalidAcceptanceError("the prior needs at least one acceptance rate (max k >= 1)")
        self.config = config or EstimatorConfig()
        self.prior_weight = float(self.config.prior_weight)
        self.drafted = np.zeros(self.prior.size)
        self.accepted = np.zeros(self.prior.size)

    @property
    def max_k(self) -> int:
        return int(self.prior.size)

    def observe(self, drafted: int, kept: int) -> None:
        """Count one request-step that drafted ``drafted`` tokens and kept the first ``kept``."""
        if not 0 <= kept <= drafted <= self.max_k:
            raise InvalidAcceptanceError(
                f"observation (drafted={drafted!r}, kept={kept!r}) must satisfy 0 <= kept <= drafted <= {self.max_k}"
            )
        self.drafted[:drafted] += 1
        self.accepted[:kept] += 1

    def observe_counts(self, drafted_per_pos: Sequence[float] | np.ndarray,
                       accepted_per_pos: Sequence[float] | np.ndarray) -> None:
        """Add per-position totals at once (e.g. from vLLM's SpecDecodingStats)."""
        d = np.asarray(drafted_per_pos, dtype=float)[: self.max_k]
        a = np.asarray(accepted_per_pos, dtype=float)[: self.max_k]
        if d.shape != a.shape:
            raise InvalidAcceptanceError(f"drafted ({d.shape}) and accepted ({a.shape}) counts differ in length")
        if np.any(d < 0) or np.any(a < 0) or np.any(a > d):
            raise InvalidAcceptanceError(
                f"counts must satisfy 0 <= accepted_i <= drafted_i; got drafted={d.tolist()}, accepted={a.tolist()}"
            )
        self.drafted[: d.size] += d
        self.accepted[: a.size] += a

    def estimate(self) -> np.ndarray:
        """Current â_1..â_K without changing any counter."""
        w = self.prior_weight
        est = (w * self.prior + self.accepted) / (w + self.drafted)
        # Survival is non-increasing by definition. Under a variable k later positions are
        # drafted less often, so their blend can lag the prior; never credit position i+1 with
        # more survival than position i.
        return monotone_rates(est)

    def rebuild(self) -> np.ndarray:
        """Return â, then halve live counters (and the prior weight with decay on)."""
        est = self.estimate()
        if self.config.halve_after_rebuild:
            self.drafted *= 0.5
            self.accepted *= 0.5
        if self.config.prior_decay:
            self.prior_weight = max(self.config.min_prior_weight, self.prior_weight * 0.5)
        return est


@dataclass(frozen=True)
class BoundaryHysteresis:
    """Keep the current k while the batch size is within ``h`` of a batch size that uses it.

    When B hovers at a range boundary, switching k every step costs throughput (users reported
    collapses from flapping); with h > 0 the k changes only once B is clearly inside another range.
    """

    h: int = 0

    def __post_init__(self) -> None:
        if self.h < 0:
            raise InvalidValueError(f"hysteresis h = {self.h!r} must be >= 0")

    def select(self, lookup: Sequence[int], batch_size: int, current_k: int | None) -> int:
        """k for ``batch_size`` given the dense table ``lookup`` (index B - 1) and the current k."""
        n = len(lookup)
        b = min(max(batch_size, 1), n)
        target = int(lookup[b - 1])
        if current_k is None or self.h == 0 or current_k == target:
            return target
        lo, hi = max(0, b - 1 - self.h), min(n, b + self.h)
        if current_k in lookup[lo:hi]:
            return int(current_k)
        return target

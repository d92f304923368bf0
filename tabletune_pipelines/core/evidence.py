"""A table search whose every boundary is backed by evidence (docs/method.md, "Table search").

The method's rule keeps the previous batch size's k unless another k is better by more than
0.5 %. That threshold assumes repeatable measurements; on a noisy machine a 2 % goodput gain can
be pure noise and the table flips k at every other batch size. The evidence rule keeps the
rule's shape but moves away from the previous k only when the gain's **lower confidence bound**
exceeds the threshold:

    delta(B; k', k) = log G(B, k') - log G(B, k)
    var(delta) = var T(B,k')/T'^2 + var T(B,k)/T^2 - 2 cov(T', T)/(T' T)   (cells, interpolation,
                                                                              shared correction)
               + g' Sigma_a g                                              (the prior's counts)
    switch to k'  iff  exp(delta - z sd(delta)) - 1 > threshold

``z`` is the one-sided normal quantile of the confidence, Bonferroni-corrected over the other
candidate k values, so at one batch size the chance of switching to a k that is really not better
by the threshold is at most ``1 - confidence``. Among the supported k the best point estimate
wins. At B = 1 there is no previous k and the best point estimate is taken.

For every boundary the search reports the gain, its lower bound and the probability that it
exceeds the threshold; for every B, the k values within noise of the chosen one (those that could
be at least as good); and the predicted worst loss with an upper confidence bound. A B is
*ambiguous* when another k could still beat the chosen one by more than ``tolerance``: those are
the decisions that more repetitions could change (``core.remeasure``).

Numpy and the stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.noise import z_value
from tabletune_pipelines.core.steptime import StepTimes, as_covariance
from tabletune_pipelines.core.table import (
    DEFAULT_STICKINESS,
    TableChoice,
    choose_draft_lengths,
    goodput_matrix,
    range_bounds,
)
from tabletune_pipelines.errors import EmptyProfileError, InvalidStepTimeError, InvalidValueError
from tabletune_pipelines.vocab import SEARCH_RULES, SearchRule

#: Confidence of the evidence rule (per batch size, over all candidate k together).
DEFAULT_CONFIDENCE = 0.95
#: A decision is settled once no other k can be better than the chosen one by more than this.
DEFAULT_TOLERANCE = 0.02
#: The loss a profile's decision may leave: candidate k whose gain over the chosen one is
#: bounded by this at the search's confidence are tied, and a tie keeps the incumbent. The adaptive
#: profile stops measuring a batch size's cells there (``core.remeasure``), and the run's summary
#: names the ties (``EvidenceTable.ties``).
ACCEPTED_LOSS = 0.01
#: Default rule of the search (``vocab.SearchRule``).
DEFAULT_SEARCH_RULE: SearchRule = "evidence"


@dataclass(frozen=True)
class Boundary:
    """Where the table changes k, and the evidence for it."""

    batch_size: int
    """First batch size of the new range."""
    from_k: int
    """k of the range below."""
    to_k: int
    """k of the new range."""
    gain: float
    """Predicted goodput gain of ``to_k`` over ``from_k`` at ``batch_size`` (0.02 = 2 %)."""
    gain_lcb: float
    """Lower confidence bound of the gain at the search's confidence."""
    confidence: float
    """Probability (normal approximation) that the true gain exceeds the threshold."""
    supported: bool
    """Whether ``gain_lcb`` exceeds the threshold (the evidence rule's condition)."""


@dataclass(frozen=True)
class Ambiguity:
    """A batch size whose decision more measurements could change."""

    batch_size: int
    """The batch size B."""
    chosen_k: int
    """The k the table runs there."""
    rivals: tuple[int, ...]
    """Other k that could beat ``chosen_k`` by more than the tolerance."""
    priority: float
    """The largest upper bound of a rival's gain (how much could be lost)."""


@dataclass(frozen=True)
class EvidenceTable:
    """The outcome of a search with the evidence behind it."""

    choice: TableChoice
    """Chosen k per batch size and the predicted goodput of every k."""
    policy: SearchRule
    """The rule that chose: ``evidence`` or ``stickiness``."""
    threshold: float
    """Stickiness threshold (relative gain)."""
    confidence: float
    """Confidence level of the bounds."""
    z: float
    """Normal quantile the bounds use (Bonferroni over the other candidate k)."""
    log_ratio: np.ndarray
    """log G(B, k_i) - log G(B, k_j), shape (K, K, N)."""
    log_sd: np.ndarray
    """Standard deviation of ``log_ratio`` (0 without error estimates)."""
    allowed: tuple[int, ...]
    """k values the table may use."""
    has_errors: bool
    """Whether the bounds rest on error estimates (False: point estimates only)."""
    boundaries: tuple[Boundary, ...]
    """Every boundary of the chosen table, in B order."""

    @property
    def ranges(self) -> list[list[int]]:
        return self.choice.ranges

    @property
    def one_batch_size_ranges(self) -> int:
        """Ranges one batch size wide."""
        return sum(1 for s, e, _ in self.ranges if s == e)

    @property
    def supported(self) -> bool:
        """Every boundary is backed by evidence."""
        return all(b.supported for b in self.boundaries)

    def _idx(self, k: int) -> int:
        return self.choice.ks.index(k)

    def gain_bounds(self, k: int, over: int, batch_size: int) -> tuple[float, float, float]:
        """(point, lower bound, upper bound) of the gain of ``k`` over ``over`` at B."""
        i, j, c = self._idx(k), self._idx(over), batch_size - 1
        d, s = self.log_ratio[i, j, c], self.log_sd[i, j, c]
        return math.expm1(d), math.expm1(d - self.z * s), math.expm1(d + self.z * s)

    def within_noise(self) -> list[tuple[int, ...]]:
        """Per B (index B - 1): the allowed k that could be at least as good as the chosen one."""
        out = []
        for c, k in enumerate(self.choice.chosen):
            j = self._idx(k)
            out.append(tuple(kk for kk in self.allowed
                             if self.log_ratio[self._idx(kk), j, c] + self.z * self.log_sd[self._idx(kk), j, c] >= 0))
        return out

    def loss_ucb(self) -> np.ndarray:
        """Per B, an upper confidence bound of the loss against the best k there."""
        cols = np.arange(len(self.choice.chosen))
        idx = [self._idx(k) for k in self.choice.chosen]
        up = self.log_ratio[:, idx, cols] + self.z * self.log_sd[:, idx, cols]  # (K, N): every k over chosen
        return np.maximum(0.0, -np.expm1(-up.max(axis=0)))

    def loss_lcb(self) -> np.ndarray:
        """Per B, a lower confidence bound of the loss against the best k there."""
        cols = np.arange(len(self.choice.chosen))
        idx = [self._idx(k) for k in self.choice.chosen]
        low = self.log_ratio[:, idx, cols] - self.z * self.log_sd[:, idx, cols]
        return np.maximum(0.0, -np.expm1(-low.max(axis=0)))

    @property
    def worst_loss_lcb(self) -> float:
        """Lower confidence bound of the worst loss (above the threshold: the loss is real)."""
        return float(self.loss_lcb().max())

    @property
    def worst_loss(self) -> float:
        """Predicted worst loss against the best fixed k at any B (point estimate)."""
        return self.choice.worst_loss_vs_fixed()

    @property
    def worst_loss_ucb(self) -> float:
        """Upper confidence bound of the worst loss."""
        return float(self.loss_ucb().max())

    def ambiguous(self, tolerance: float = DEFAULT_TOLERANCE) -> list[Ambiguity]:
        """Batch sizes where an allowed k could beat the chosen one by more than ``tolerance``."""
        out = []
        lim = math.log1p(tolerance)
        for c, k in enumerate(self.choice.chosen):
            j = self._idx(k)
            rivals, worst = [], -math.inf
            for kk in self.allowed:
                if kk == k:
                    continue
                i = self._idx(kk)
                up = self.log_ratio[i, j, c] + self.z * self.log_sd[i, j, c]
                if up > lim:
                    rivals.append(kk)
                    worst = max(worst, up)
            if rivals:
                out.append(Ambiguity(c + 1, k, tuple(rivals), math.expm1(worst)))
        return out

    def ties(self, tolerance: float = ACCEPTED_LOSS) -> list[tuple[int, ...]]:
        """Per B (index B - 1): the allowed k tied with the chosen one within ``tolerance``, the chosen
        k first: those that could be at least as good as it (``within_noise``) where none could beat
        it by more than ``tolerance`` (the B is not ``ambiguous``); () where the chosen k stands alone
        or the decision is still open."""
        open_b = {a.batch_size for a in self.ambiguous(tolerance)}
        out: list[tuple[int, ...]] = []
        for b, (k, ok) in enumerate(zip(self.choice.chosen, self.within_noise(), strict=True), start=1):
            others = tuple(kk for kk in ok if kk != k)
            out.append((int(k), *others) if others and b not in open_b else ())
        return out

    def summary(self, tolerance: float = DEFAULT_TOLERANCE) -> dict[str, object]:
        """Plain JSON figures: policy, confidence, loss and its bound, ranges, boundaries, k within noise."""
        within = self.within_noise()
        return {
            "policy": self.policy, "confidence": self.confidence, "threshold": self.threshold,
            "has_error_estimates": self.has_errors,
            "predicted_worst_loss": self.worst_loss, "predicted_worst_loss_lcb": self.worst_loss_lcb,
            "predicted_worst_loss_ucb": self.worst_loss_ucb,
            "ranges": len(self.ranges), "one_batch_size_ranges": self.one_batch_size_ranges,
            "supported": self.supported,
            "boundaries": [dataclasses.asdict(b) for b in self.boundaries],
            "within_noise": {str(b): list(ks) for b, ks in enumerate(within, start=1)},
            "ambiguous_batch_sizes": [a.batch_size for a in self.ambiguous(tolerance)],
        }


def log_ratio_sd(step_ms: np.ndarray, step_cov: np.ndarray, ks: Sequence[int], rates: Sequence[float] | np.ndarray,
                 rates_cov: np.ndarray | None = None) -> np.ndarray:
    """Standard deviation of log G(B, k_i) - log G(B, k_j), shape (K, K, N).

    ``step_cov``: variances (K, N) or covariances between k at each B (K, K, N).
    ``rates_cov``: covariance of the survival rates (``core.noise.rates_covariance``) or None.
    """
    t = np.asarray(step_ms, dtype=float)
    K, n = t.shape
    cov = as_covariance(step_cov)
    if cov.shape != (K, K, n):
        raise InvalidStepTimeError(f"step-time covariance has shape {cov.shape}; expected {(K, n)} or {(K, K, n)}")
    diag = np.stack([cov[i, i] for i in range(K)]) / t ** 2  # (K, N) relative variances
    var = diag[:, None, :] + diag[None, :, :] - 2.0 * cov / (t[:, None, :] * t[None, :, :])
    if rates_cov is not None and np.any(rates_cov):
        taus = tau_curve(rates)
        P = rates_cov.shape[0]
        grads = np.zeros((K, P))
        for i, k in enumerate(ks):
            grads[i, :k] = 1.0 / taus[k]
        for i in range(K):
            for j in range(K):
                g = grads[i] - grads[j]
                var[i, j] += float(g @ rates_cov @ g)
    return np.sqrt(np.clip(var, 0.0, None))


def _boundaries(chosen: Sequence[int], ks: Sequence[int], log_ratio: np.ndarray, log_sd: np.ndarray, z: float,
                threshold: float) -> tuple[Boundary, ...]:
    lim = math.log1p(threshold)
    out = []
    for c in range(1, len(chosen)):
        a, b = chosen[c - 1], chosen[c]
        if a == b:
            continue
        i, j = ks.index(b), ks.index(a)
        d, s = float(log_ratio[i, j, c]), float(log_sd[i, j, c])
        lcb = d - z * s
        conf = (NormalDist().cdf((d - lim) / s) if s > 0 else (1.0 if d > lim else 0.0))
        out.append(Boundary(batch_size=c + 1, from_k=int(a), to_k=int(b), gain=math.expm1(d), gain_lcb=math.expm1(lcb),
                            confidence=float(conf), supported=bool(lcb > lim)))
    return tuple(out)


def _revise(incumbent: Sequence[int] | np.ndarray, g: np.ndarray, log_ratio: np.ndarray, sd: np.ndarray, z: float,
            lim: float, ks: tuple[int, ...], rows: list[int]) -> tuple[int, ...]:
    """The evidence rule with the incumbent's k at each B as the k kept (vectorised over B: each
    batch size's decision depends on its own column only)."""
    n = g.shape[1]
    inc = np.asarray(incumbent, dtype=np.int64)
    if inc.shape != (n,):
        raise InvalidValueError(f"incumbent has {inc.size} batch sizes; the step times have {n}")
    row_of = {k: i for i, k in enumerate(ks) if i in rows}
    cur = np.array([row_of.get(int(k), -1) for k in inc], dtype=np.int64)
    cols = np.arange(n)
    allowed = np.zeros(len(ks), dtype=bool)
    allowed[rows] = True
    have = cur >= 0
    c_row = np.where(have, cur, 0)
    lcb = log_ratio[:, c_row, cols] - z * sd[:, c_row, cols]  # (K, N): each k over the incumbent
    ok = (lcb > lim) & allowed[:, None] & (np.arange(len(ks))[:, None] != c_row[None, :])
    # No allowed incumbent: every allowed k is a candidate, the best point estimate wins.
    ok[:, ~have] = allowed[:, None]
    masked = np.where(ok, g, -np.inf)
    best = masked.argmax(axis=0)  # first maximum, like max() over the rows in order
    moving = ok.any(axis=0)
    pick = np.where(moving, best, c_row)
    # Where the evidence moves a batch size, it moves to the k of the batch size below when that k is
    # one of the supported ones and the best of them does not beat it beyond the evidence threshold
    # (the walk over B's rule: on point estimates, within the stickiness of the best), so a revision
    # does not cut a range the evidence treats alike into pieces, in one rebuild or over several.
    for c in np.flatnonzero(moving[1:]) + 1:
        r, b = pick[c - 1], best[c]
        if ok[r, c] and (r == b or log_ratio[b, r, c] - z * sd[b, r, c] <= lim):
            pick[c] = r
    return tuple(int(ks[i]) for i in pick)


def _merge_target(pick: np.ndarray, s: int, e: int, g: np.ndarray, log_ratio: np.ndarray, lcb: np.ndarray,
                  lim: float, visits: np.ndarray | None) -> int | None:
    """The row that the range ``pick[s:e]`` merges into: of its neighbouring ranges' rows, those its
    own row does not beat by more than ``lim`` at any of its batch sizes, the one with the higher mean
    log goodput over the range (the lower one on a tie); None if neither. "Beat" is on point
    estimates (``log_ratio``).

    An island (both neighbours share one k: the table goes a, b, a up the batch sizes) first gets a
    second test when the traffic is known (``visits``, steps served per batch size): it takes the
    neighbours' k where both (1) no allowed k, its own or another, beats that k beyond the evidence
    threshold at any of its batch sizes (``lcb``, each row over each row; minus infinity for a row
    not allowed), so the evidence rule, revising, would keep the neighbours' k there; and (2) what
    the island's k gains over it, weighted by the steps served at each of its batch sizes, is within
    the stickiness of the goodput over all the steps served: a range that the served traffic does
    not pay for. Otherwise the point test decides, and it too takes a neighbour's k only where no
    allowed k beats that k beyond the evidence threshold at the range's batch sizes (``lcb``): a
    merge into a k that a revision would move away from again is no merge."""
    own = int(pick[s])
    around = ([int(pick[s - 1])] if s > 0 else []) + ([int(pick[e])] if e < pick.size else [])
    if visits is not None and len(around) == 2 and around[0] == around[1]:
        nb = around[0]
        gain = float(np.dot(visits[s:e], np.clip(log_ratio[own, nb, s:e], 0.0, None)))
        if not np.any(lcb[:, nb, s:e] > lim) and gain <= lim * float(visits.sum()):
            return nb
    fits = [nb for nb in around if not np.any(log_ratio[own, nb, s:e] > lim) and not np.any(lcb[:, nb, s:e] > lim)]
    return max(fits, key=lambda nb: float(np.log(g[nb, s:e]).mean()), default=None)


def _merge_narrow(pick: np.ndarray, g: np.ndarray, log_ratio: np.ndarray, lcb: np.ndarray, lim: float,
                  min_range: int, visits: np.ndarray | None = None) -> np.ndarray:
    """Rows per batch size with every range narrower than ``min_range`` batch sizes merged into a
    neighbouring range wherever its own k does not beat the neighbour's by more than the
    stickiness threshold, on point estimates, at any of its batch sizes (so not on the evidence
    either: the merge never undoes what the evidence rule would do again; ``_merge_target``). An
    island the served traffic does not pay for and the evidence does not hold is merged too
    (``_merge_target``). Narrowest ranges first, one merge at a time, until none qualifies: each
    merge removes a range, so this ends within the number of ranges. A narrow range stays where its
    k is better than a neighbour's, or where the evidence moves away from that neighbour's k."""
    pick = pick.copy()
    while True:
        starts, ends = range_bounds(pick)
        widths = ends - starts
        for r in np.argsort(widths, kind="stable")[:int(np.count_nonzero(widths < min_range))]:
            s, e = int(starts[r]), int(ends[r])
            nb = _merge_target(pick, s, e, g, log_ratio, lcb, lim, visits)
            if nb is not None:
                pick[s:e] = nb
                break
        else:
            return pick


def _evidence_rule(incumbent: Sequence[int] | np.ndarray | None, g: np.ndarray, log_ratio: np.ndarray,
                   sd: np.ndarray, z: float, lim: float, ks: tuple[int, ...], rows: list[int], min_range: int,
                   visits: np.ndarray | None = None) -> tuple[int, ...]:
    """k per batch size under the evidence rule: the incumbent revised (or a walk up the batch sizes
    without one), then ranges narrower than ``min_range`` merged (``_merge_narrow``)."""
    if incumbent is not None:
        chosen = _revise(incumbent, g, log_ratio, sd, z, lim, ks, rows)
    else:
        chosen = _walk_up(g, log_ratio, sd, z, lim, ks, rows)
    if min_range <= 1:
        return chosen
    row_of = {k: i for i, k in enumerate(ks)}
    lcb = log_ratio - z * sd
    lcb[[i for i in range(len(ks)) if i not in rows]] = -np.inf
    merged = _merge_narrow(np.array([row_of[k] for k in chosen]), g, log_ratio, lcb, lim, min_range, visits)
    return tuple(int(ks[i]) for i in merged)


def _visits(visits: np.ndarray | Sequence[float] | None, n: int) -> np.ndarray | None:
    """``search_with_evidence``'s ``visits`` checked: n finite counts >= 0, or None."""
    if visits is None:
        return None
    v = np.asarray(visits, dtype=float)
    if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v < 0):
        raise InvalidValueError(f"visits must be {n} finite counts >= 0 (one per batch size); got shape {v.shape}")
    return v


def _walk_up(g: np.ndarray, log_ratio: np.ndarray, sd: np.ndarray, z: float, lim: float,
             ks: tuple[int, ...], rows: list[int]) -> tuple[int, ...]:
    """The evidence rule from scratch: up the batch sizes, the previous batch size's k is kept
    unless another allowed k beats it beyond the evidence threshold (the best point estimate at B = 1)."""
    picks: list[int] = []
    prev: int | None = None
    for c in range(g.shape[1]):
        if prev is None:
            pick = max(rows, key=lambda i: g[i, c])
        else:
            ok = [i for i in rows if i != prev and log_ratio[i, prev, c] - z * sd[i, prev, c] > lim]
            pick = max(ok, key=lambda i: g[i, c]) if ok else prev
        picks.append(ks[pick])
        prev = pick
    return tuple(picks)


@dataclass(frozen=True)
class SearchSettings:
    """How ``search_with_evidence`` decides (the defaults are the method's). Built once by whoever
    searches repeatedly (the controller: once per published version, not per rebuild)."""

    allowed_ks: tuple[int, ...] | None = None
    """k values the table may use; None: every profiled k."""
    threshold: float = DEFAULT_STICKINESS
    """The gain (its lower bound, under the evidence rule) another k must show for the table to change k."""
    confidence: float = DEFAULT_CONFIDENCE
    """Level of every bound (Bonferroni-corrected over the other candidate k)."""
    policy: SearchRule = DEFAULT_SEARCH_RULE
    """``evidence``: k changes only on evidence; ``stickiness``: the method's 0.5 % rule on point estimates."""
    min_range: int = 1
    """Under the evidence rule, a range narrower than this many batch sizes keeps its k only where
    that k beats a neighbouring range's k by more than ``threshold`` (point estimates) at one of its
    batch sizes at least; otherwise it takes the neighbour's k (1: no such pass). The online
    controller sets it to the width its served evidence pools (``StepTimeModel.pool_width()``)."""

    def __post_init__(self) -> None:
        if self.policy not in SEARCH_RULES:
            raise InvalidValueError(f"policy = {self.policy!r} must be one of {SEARCH_RULES}")
        if self.threshold < 0:
            raise InvalidValueError(f"stickiness threshold = {self.threshold!r} must be >= 0")
        if isinstance(self.min_range, bool) or not isinstance(self.min_range, int) or self.min_range < 1:
            raise InvalidValueError(f"min_range = {self.min_range!r} must be an integer >= 1 (batch sizes)")
        if self.allowed_ks is not None:
            object.__setattr__(self, "allowed_ks", tuple(self.allowed_ks))


DEFAULT_SEARCH_SETTINGS = SearchSettings()
"""The method's search: every profiled k, the default stickiness, confidence and rule."""


def search_with_evidence(
    times: StepTimes,
    rates: Sequence[float] | np.ndarray,
    *,
    rates_cov: np.ndarray | None = None,
    settings: SearchSettings = DEFAULT_SEARCH_SETTINGS,
    incumbent: Sequence[int] | np.ndarray | None = None,
    visits: np.ndarray | Sequence[float] | None = None,
) -> EvidenceTable:
    """The table search of the module docstring on ``times`` (T at every batch size and its
    (co)variances), decided by ``settings`` (the allowed k, the threshold, the confidence and the rule).

    ``times.cov`` None (or all zero) means no error estimates: the evidence rule then
    decides on point estimates, which is the stickiness rule. ``policy="stickiness"`` runs the
    method's rule (``core.table.choose_draft_lengths``) and reports the same evidence for its
    boundaries.

    ``incumbent`` (k per batch size, index B - 1): the table in force, for a search that revises it
    (the online controller's rebuild). The k kept unless another is better beyond the evidence
    threshold is then the incumbent's k at the same B instead of the previous batch size's pick, so a
    k changes at a batch size only on evidence and a range is never narrower than the evidence that
    moved it. Where the evidence moves a batch size, it moves to the best supported k, or to the k
    of the batch size below when that one is supported too and the best does not beat it beyond the
    evidence threshold (on point estimates: within the stickiness of the best).
    An incumbent k that is not allowed has no claim: the best point estimate is taken there.
    Then, with ``settings.min_range`` > 1, a range narrower than that takes a neighbouring range's k
    unless its own k beats the neighbour's by more than the threshold somewhere in it; with
    ``visits`` (steps served per batch size, index B - 1: the controller's traffic), a narrow island
    also takes it where the evidence holds the neighbours' k and the traffic does not pay for the
    island (``_merge_narrow``, ``_merge_target``). So a revision at batch sizes the load wanders over
    does not leave the table cut into short ranges of ks the evidence cannot tell apart.
    Only the evidence policy takes an incumbent.
    """
    ks, t = times.ks, times.ms
    threshold, confidence, policy = settings.threshold, settings.confidence, settings.policy
    allowed = tuple(sorted(set(ks) if settings.allowed_ks is None else {int(k) for k in settings.allowed_ks}))
    rows = [i for i, k in enumerate(ks) if k in allowed]
    if not rows:
        raise EmptyProfileError(f"none of the allowed k values {list(allowed)} was profiled (profiled: {list(ks)})")
    allowed = tuple(ks[i] for i in rows)
    g = goodput_matrix(t, ks, rates)
    cov = np.zeros(t.shape) if times.cov is None else times.cov
    has_errors = times.has_errors or bool(rates_cov is not None and np.any(rates_cov))
    sd = log_ratio_sd(t, cov, ks, rates, rates_cov)
    logg = np.log(g)
    log_ratio = logg[:, None, :] - logg[None, :, :]
    z = z_value(confidence, len(rows) - 1)
    if policy == "stickiness":
        if incumbent is not None:
            raise InvalidValueError("an incumbent table is revised by the evidence policy only, not by 'stickiness'")
        chosen = choose_draft_lengths(t, ks, rates, allowed_ks=allowed, stickiness=threshold).chosen
    else:
        chosen = _evidence_rule(incumbent, g, log_ratio, sd, z, math.log1p(threshold), ks, rows, settings.min_range,
                                _visits(visits, t.shape[1]))
    choice = TableChoice(ks=ks, chosen=tuple(chosen), goodput=g)
    return EvidenceTable(choice=choice, policy=policy, threshold=float(threshold), confidence=float(confidence),
                         z=float(z), log_ratio=log_ratio, log_sd=sd, allowed=allowed, has_errors=has_errors,
                         boundaries=_boundaries(choice.chosen, ks, log_ratio, sd, z, threshold))

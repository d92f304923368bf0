"""How sure a profile is: the error of every T(B, k), of the acceptance prior and of the
accepted-work correction (docs/method.md, "Step time T(B, k)" and "Limitations" 2).

Noise model. The repetitions of one cell scatter by a relative amount that differs from cell to
cell (5-80 % on 2 cores: docs/engine-facts.md, "Noise on 2 cores"), and three repetitions
estimate that scatter poorly (two degrees of freedom: one unlucky cell looks precise). So each
cell's relative variance is shrunk towards the profile's pooled relative variance, the pool
counting as ``PRIOR_DOF`` repetitions' worth of evidence:

    v_cell = (PRIOR_DOF * v_pool + (n - 1) * v_own) / (PRIOR_DOF + n - 1)
    var(median) = f(n)^2 * v_cell * median^2 / n          (f: ``median_se_factor``)

A profile whose cells have no repetitions to compare has no error estimates: every variance is
0 and ``has_errors`` is False (the search then decides on point estimates and says so).

The k values of one batch size are measured in the same rounds (repetition r of every k in round
r, in rotated order), so slow drift of the machine moves them together. That shared part cancels
when two k are compared: the profile's pooled correlation of the log repetitions between k at one
batch size (first-pass repetitions, centred per cell) gives the covariance
``rho * sd_i * sd_j`` of two medians at the same B (clamped to [0, ``MAX_CORRELATION``]).

Between measured batch sizes T is interpolated linearly; its variance is the interpolation of
the neighbours' variances plus the squared error linear interpolation makes on a curved T,
``(|T''| / 2 * (B - B_lo) * (B_hi - B))^2`` with T'' from the neighbouring second differences.

Numpy and the stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from tabletune_pipelines.core.goodput import validate_acceptance
from tabletune_pipelines.core.steptime import (
    StepTimes,
    StepTimeSurface,
    median_se_factor,
    weighted_non_decreasing_fit,
)
from tabletune_pipelines.errors import InvalidValueError

#: Repetitions' worth of weight the pooled relative variance gets in every cell's estimate.
PRIOR_DOF = 4.0
#: Largest correlation between the k values of one batch size the noise model believes.
MAX_CORRELATION = 0.9


@dataclass(frozen=True)
class CellEstimate:
    """One measured cell as the noise model sees it."""

    median_ms: float
    """The cell's value (median of its repetitions), ms."""
    n: int
    """Repetitions behind the median."""
    stderr_ms: float | None = None
    """Standard error of the median from the cell's own repetitions, ms (None: n < 2)."""
    repetitions: tuple[float, ...] = ()
    """The repetitions in measuring order (empty: not known); they pair the k values of one batch
    size, whose repetition r was measured in the same round."""

    @property
    def relative_variance(self) -> float | None:
        """The cell's own variance of one repetition relative to the median squared (None: n < 2)."""
        if self.stderr_ms is None or self.n < 2:
            return None
        sd = self.stderr_ms * math.sqrt(self.n) / median_se_factor(self.n)
        return (sd / self.median_ms) ** 2


def z_value(confidence: float, comparisons: int = 1) -> float:
    """One-sided normal quantile for ``confidence``, Bonferroni-corrected over ``comparisons``."""
    if not 0.5 <= confidence < 1.0:
        raise InvalidValueError(f"confidence = {confidence!r} must be in [0.5, 1)")
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / max(1, int(comparisons)))


def units_to_detect(sd: float, effect: float, *, z_alpha: float = 1.96, z_power: float = 0.0,
                    minimum: int = 2) -> int | None:
    """How many independent units (rounds, groups, windows) a mean needs for an interval of half-width
    ``z_alpha`` standard errors to clear ``effect``, the distance from the mean to the line it must be
    told from, with probability ``NormalDist().cdf(z_power)`` (``z_power`` 0: half the time, at the
    mean; 2.33: 99 %): ``ceil(((z_alpha + z_power) · sd / effect)²)``, at least ``minimum``. ``sd``:
    one unit's standard deviation. None where ``effect`` is 0 or either is not finite (no n decides)."""
    if not (math.isfinite(sd) and math.isfinite(effect)) or effect == 0:
        return None
    if sd < 0:
        raise InvalidValueError(f"sd = {sd!r} must be >= 0")
    return max(int(minimum), math.ceil(((z_alpha + z_power) * sd / abs(effect)) ** 2))


def pooled_relative_variance(cells: Sequence[CellEstimate]) -> tuple[float | None, int]:
    """Pooled variance of one repetition relative to its median, and its degrees of freedom."""
    num = dof = 0.0
    for c in cells:
        v = c.relative_variance
        if v is not None:
            num += (c.n - 1) * v
            dof += c.n - 1
    return (num / dof if dof else None), int(dof)


def median_variances(cells: Sequence[CellEstimate], prior_dof: float = PRIOR_DOF) -> list[float | None]:
    """Variance (ms^2) of every cell's median, shrunk towards the pool (None: no estimate anywhere)."""
    pool, _ = pooled_relative_variance(cells)
    out: list[float | None] = []
    for c in cells:
        own = c.relative_variance
        if pool is None:
            out.append(None)
            continue
        v = pool if own is None else (prior_dof * pool + (c.n - 1) * own) / (prior_dof + c.n - 1)
        out.append(median_se_factor(c.n) ** 2 * v * c.median_ms ** 2 / max(1, c.n))
    return out


def _second_differences(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """|T''| at each interior measured batch size (0 at the ends)."""
    curv = np.zeros(len(xs))
    for i in range(1, len(xs) - 1):
        left = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
        right = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        curv[i] = abs(2.0 * (right - left) / (xs[i + 1] - xs[i - 1]))
    return curv


def pooled_correlation(cells: Mapping[int, Mapping[int, CellEstimate]]) -> tuple[float, int]:
    """Pooled correlation of the log repetitions of two k at one batch size, and the number of
    repetition pairs behind it (0 when no batch size has two k with paired repetitions)."""
    ks = sorted(cells)
    bs = sorted({b for row in cells.values() for b in row})
    cross = square = 0.0
    pairs = 0
    for b in bs:
        rows = [cells[k][b].repetitions for k in ks if b in cells[k] and len(cells[k][b].repetitions) >= 2]
        if len(rows) < 2:
            continue
        n = min(len(r) for r in rows)  # the first pass: repetition r of every k in round r
        logs = np.log(np.array([r[:n] for r in rows], dtype=float))
        resid = logs - logs.mean(axis=1, keepdims=True)
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                cross += float(resid[i] @ resid[j])
                square += 0.5 * float(resid[i] @ resid[i] + resid[j] @ resid[j])
                pairs += n - 1
    if pairs == 0 or square <= 0:
        return 0.0, 0
    return float(min(MAX_CORRELATION, max(0.0, cross / square))), pairs


@dataclass(frozen=True)
class NoisySurface:
    """Measured T(B, k) with the variance of every point."""

    ks: tuple[int, ...]
    """Draft lengths, ascending."""
    batch_sizes: tuple[int, ...]
    """Measured batch sizes, ascending, starting at 1."""
    ms: np.ndarray
    """Step time, ms, shape (len(ks), len(batch_sizes))."""
    var: np.ndarray
    """Variance of each point, ms^2 (all 0 when the profile has no error estimates)."""
    has_errors: bool
    """Whether the variances are estimates (False: no cell had two repetitions to compare)."""
    pooled_relative_sd: float | None = None
    """Pooled relative standard deviation of one repetition (None without error estimates)."""
    pooled_dof: int = 0
    """Degrees of freedom behind ``pooled_relative_sd``."""
    correlation: float = 0.0
    """Pooled correlation of two k's medians at one batch size (``pooled_correlation``)."""

    @classmethod
    def from_cells(cls, cells: Mapping[int, Mapping[int, CellEstimate]],
                   prior_dof: float = PRIOR_DOF) -> NoisySurface:
        """Build from ``{k: {B: CellEstimate}}``; same completeness rules as ``StepTimeSurface``."""
        base = StepTimeSurface.from_cells({k: {b: c.median_ms for b, c in row.items()} for k, row in cells.items()})
        flat = [cells[k][b] for k in base.ks for b in base.batch_sizes]
        variances = median_variances(flat, prior_dof)
        has = all(v is not None for v in variances)
        var = np.array([0.0 if v is None else v for v in variances]).reshape(base.ms.shape)
        pool, dof = pooled_relative_variance(flat)
        rho, _ = pooled_correlation(cells) if has else (0.0, 0)
        return cls(ks=base.ks, batch_sizes=base.batch_sizes, ms=base.ms, var=var if has else np.zeros_like(var),
                   has_errors=has, pooled_relative_sd=None if pool is None else math.sqrt(pool), pooled_dof=dof,
                   correlation=rho)

    def surface(self) -> StepTimeSurface:
        """The medians alone."""
        return StepTimeSurface(ks=self.ks, batch_sizes=self.batch_sizes, ms=self.ms)

    def non_decreasing(self) -> NoisySurface:
        """Each k's T made non-decreasing in B by a fit weighted with 1 / variance (a step cannot
        get cheaper when more requests share it: a measured dip is noise); pooled points get the
        pooled value's variance."""
        rows, vrows = [], []
        for row, var in zip(self.ms, self.var, strict=True):
            w = 1.0 / var if self.has_errors and np.all(var > 0) else np.ones_like(row)
            fit, total = weighted_non_decreasing_fit(row, w)
            rows.append(fit)
            vrows.append(1.0 / total if self.has_errors and np.all(var > 0) else np.zeros_like(row))
        return dataclasses.replace(self, ms=np.vstack(rows), var=np.vstack(vrows))

    def dense(self, max_num_seqs: int) -> tuple[np.ndarray, np.ndarray]:
        """T and its variance for every B in 1..max_num_seqs, each shaped (len(ks), max_num_seqs)."""
        ms_dense = self.surface().dense(max_num_seqs)  # the coverage check and its message, and T
        xs = np.asarray(self.batch_sizes, dtype=float)
        b = np.arange(1, max_num_seqs + 1, dtype=float)
        hi = np.clip(np.searchsorted(xs, b, side="left"), 1, len(xs) - 1) if len(xs) > 1 else np.zeros(len(b), int)
        lo = hi - 1 if len(xs) > 1 else hi
        var_rows = []
        for row, var in zip(self.ms, self.var, strict=True):
            if len(xs) == 1:
                var_rows.append(np.full(len(b), var[0]))
                continue
            gap = xs[hi] - xs[lo]
            w = np.clip((b - xs[lo]) / gap, 0.0, 1.0)
            v = (1.0 - w) ** 2 * var[lo] + w ** 2 * var[hi]
            if self.has_errors:
                curv = _second_differences(xs, row)
                c = np.maximum(curv[lo], curv[hi])
                v = v + (0.5 * c * (b - xs[lo]) * (xs[hi] - b)).clip(min=0.0) ** 2
            var_rows.append(v)
        return ms_dense, np.vstack(var_rows)

    def step_times(self, max_num_seqs: int) -> StepTimes:
        """T for every B in 1..max_num_seqs with its covariances between k (``dense_cov``)."""
        ms, cov = self.dense_cov(max_num_seqs)
        return StepTimes(self.ks, ms, cov)

    def dense_cov(self, max_num_seqs: int) -> tuple[np.ndarray, np.ndarray]:
        """T for every B and the covariance of T between k values at each B, shape (K, K, N):
        the variances on the diagonal, ``correlation * sd_i * sd_j`` off it."""
        ms, var = self.dense(max_num_seqs)
        sd = np.sqrt(var)
        cov = self.correlation * sd[:, None, :] * sd[None, :, :]
        for i in range(len(self.ks)):
            cov[i, i] = var[i]
        return ms, cov


def rates_covariance(rates: Sequence[float] | np.ndarray, drafted_per_pos: Sequence[int] = (),
                     num_drafts: int = 0) -> np.ndarray:
    """Covariance of the measured survival rates a_1..a_K from their counts (binomial).

    Position j's survivors are a subset of position i's (i < j), so
    ``cov(a_i, a_j) = a_j (1 - a_i) / n`` with ``n`` the drafts behind the larger sample. A rate
    without counts (a synthetic or given prior) is taken as exact.
    """
    a = validate_acceptance(rates)
    k = len(a)
    n = np.array([float(drafted_per_pos[i]) if i < len(drafted_per_pos) and drafted_per_pos[i] > 0
                  else float(num_drafts) for i in range(k)])
    cov = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            lo, hi = min(i, j), max(i, j)
            m = max(n[i], n[j])
            if n[i] > 0 and n[j] > 0 and m > 0:
                cov[i, j] = a[hi] * (1.0 - a[lo]) / m
    return cov


# -- the accepted-work correction, fitted with two parameters ----------------------------------

@dataclass(frozen=True)
class AcceptedWorkFit:
    """Extra step time when every draft is accepted, fitted across B and k as

        extra(B, k) = k * (alpha + beta * B)     ms

    i.e. a time per accepted draft position (alpha) plus a time per accepted token (beta per
    request), from the all-accepted cells minus the all-rejected ones at the same (B, k). The
    correction of T(B, k) under acceptance a is ``extra(B, k) * (tau(k) - 1) / k`` (the expected
    fraction of drafts kept), applied only when the fit is significant (docs/method.md,
    "Limitations" 2)."""

    alpha_ms: float
    """Fitted ms per accepted draft position per step."""
    beta_ms: float
    """Fitted ms per accepted draft token (per request, per step)."""
    cov: np.ndarray
    """Covariance of (alpha, beta), ms^2 (beta's row and column are 0 when B was not varied)."""
    observations: tuple[tuple[int, int, float, float], ...]
    """(k, B, measured extra ms, its standard error) per all-accepted cell."""
    chi2: float
    """Wald statistic of (alpha, beta) against no extra work."""
    threshold: float
    """The chi-square quantile ``chi2`` must exceed at the fit's confidence."""
    confidence: float
    """Confidence level of the significance test."""
    has_errors: bool
    """Whether the cells' errors were known (False: the fit's scatter alone gave the covariance)."""
    params: int = 2
    """Parameters fitted (1 when only one batch size was measured: beta is 0)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Why the fit is or is not applied, in words."""

    @property
    def significant(self) -> bool:
        """Whether the extra work is distinguishable from none at ``confidence``."""
        return self.chi2 > self.threshold

    def extra(self, k: int, batch_size: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Fitted extra ms and its variance at (B, k), every draft accepted."""
        b = np.asarray(batch_size, dtype=float)
        x = np.stack([np.ones_like(b), b], axis=-1) * k
        val = x @ np.array([self.alpha_ms, self.beta_ms])
        var = np.einsum("...i,ij,...j->...", x, self.cov, x)
        return val, var

    def per_token_ms(self, batch_size: float) -> tuple[float, float]:
        """Fitted extra ms per accepted draft per step at B (alpha + beta * B) and its standard error."""
        x = np.array([1.0, float(batch_size)])
        return float(x @ np.array([self.alpha_ms, self.beta_ms])), float(math.sqrt(max(0.0, x @ self.cov @ x)))

    def applied_at(self, max_num_seqs: int) -> np.ndarray:
        """Per B in 1..max_num_seqs, whether the correction applies there (``corrected_dense``)."""
        if not self.significant:
            return np.zeros(max_num_seqs, dtype=bool)
        b = np.arange(1, max_num_seqs + 1, dtype=float)
        x = np.stack([np.ones_like(b), b], axis=-1)
        val = x @ np.array([self.alpha_ms, self.beta_ms])
        var = np.einsum("ni,ij,nj->n", x, self.cov, x)
        return val - z_value(self.confidence) * np.sqrt(np.clip(var, 0.0, None)) > 0

    def summary(self) -> dict[str, object]:
        """Plain JSON figures of the fit (for reports, metadata and the published document)."""
        return {"alpha_ms": self.alpha_ms, "alpha_se_ms": float(math.sqrt(max(0.0, self.cov[0, 0]))),
                "beta_ms": self.beta_ms, "beta_se_ms": float(math.sqrt(max(0.0, self.cov[1, 1]))),
                "chi2": self.chi2 if math.isfinite(self.chi2) else None, "chi2_threshold": self.threshold,
                "significant": self.significant,
                "confidence": self.confidence, "cells": len(self.observations), "has_errors": self.has_errors}


def _chi2_quantile(p: float, dof: int) -> float:
    if dof == 1:
        return NormalDist().inv_cdf(0.5 + p / 2.0) ** 2
    if dof == 2:
        return -2.0 * math.log(1.0 - p)
    raise InvalidValueError(f"chi-square quantile for {dof} degrees of freedom is not needed here")


def fit_accepted_work(reject: NoisySurface, accept: Mapping[int, Mapping[int, CellEstimate]],
                      accept_var: Mapping[int, Mapping[int, float | None]] | None = None, *,
                      confidence: float = 0.95) -> AcceptedWorkFit | None:
    """Fit ``AcceptedWorkFit`` from all-accepted cells ``{k: {B: CellEstimate}}`` (k >= 1).

    ``reject`` gives T with every draft rejected at the same (B, k) (interpolated if B was not
    measured there) and its variance; ``accept_var`` the variance of each all-accepted median
    (None = unknown). Weighted least squares with weights 1 / (var_accept + var_reject); when the
    scatter about the fit is larger than those errors explain, the covariance is scaled up by it.
    None when there is no all-accepted cell of a k >= 1 that was profiled.
    """
    rows, ys, vs = [], [], []
    obs = []
    known = True
    max_b = reject.batch_sizes[-1]
    for k in sorted(accept):
        if k < 1 or k not in reject.ks:
            continue
        i = reject.ks.index(k)
        xs = np.asarray(reject.batch_sizes, dtype=float)
        for b in sorted(accept[k]):
            if b > max_b:
                continue
            cell = accept[k][b]
            t_rej = float(np.interp(b, xs, reject.ms[i]))
            v_rej = float(np.interp(b, xs, reject.var[i]))
            v_acc = (accept_var or {}).get(k, {}).get(b)
            if v_acc is None or not reject.has_errors:
                known = False
                v_acc = 0.0
            rows.append([k, k * b])
            ys.append(cell.median_ms - t_rej)
            vs.append(v_acc + v_rej)
            obs.append((int(k), int(b), cell.median_ms - t_rej, math.sqrt(max(0.0, v_acc + v_rej))))
    if not rows:
        return None
    X = np.asarray(rows, dtype=float)
    y = np.asarray(ys)
    params = 2 if len({r[1] / r[0] for r in rows}) > 1 else 1
    if params == 1:
        X = X[:, :1]
    w = 1.0 / np.asarray(vs) if known and all(v > 0 for v in vs) else np.ones(len(y))
    known = known and bool(np.all(np.asarray(vs) > 0))
    XtW = X.T * w
    info = XtW @ X
    theta = np.linalg.solve(info, XtW @ y)
    resid = y - X @ theta
    dof = len(y) - params
    notes = []
    if known:
        cov = np.linalg.inv(info)
        chi2_resid = float(resid @ (w * resid))
        if dof > 0 and chi2_resid / dof > 1.0:
            cov = cov * (chi2_resid / dof)
            notes.append(f"scatter about the fit is {chi2_resid / dof:.1f}x what the cells' errors explain; "
                         "the fit's errors are scaled up by it")
    elif dof > 0:
        cov = np.linalg.inv(info) * float(resid @ resid) / dof
        notes.append("the cells have no error estimates; the fit's errors come from its scatter alone")
    else:
        cov = np.zeros((params, params))
        notes.append("no error estimate (as many cells as parameters): the fit is taken at face value")
    full_cov = np.zeros((2, 2))
    full_cov[:params, :params] = cov
    theta2 = np.zeros(2)
    theta2[:params] = theta
    if np.any(np.diag(cov) > 0):
        wald = float(theta @ np.linalg.pinv(cov) @ theta)
    else:
        wald = math.inf if np.any(theta != 0) else 0.0
    thr = _chi2_quantile(confidence, params)
    fit = AcceptedWorkFit(alpha_ms=float(theta2[0]), beta_ms=float(theta2[1]), cov=full_cov,
                          observations=tuple(obs), chi2=wald, threshold=thr, confidence=confidence,
                          has_errors=known, params=params)
    verdict = ("significant: applied" if fit.significant
               else "not significant: the all-accepted cells show no extra work beyond their noise, so no correction "
                    "is applied")
    return dataclasses.replace(fit, notes=(*notes, verdict))


def corrected_dense(ms: np.ndarray, var: np.ndarray, ks: Sequence[int], rates: Sequence[float],
                    fit: AcceptedWorkFit | None) -> tuple[np.ndarray, np.ndarray]:
    """Dense T, and the covariance of T between k values at each B (shape (K, K, N)), with the
    accepted-work correction added where ``fit`` is significant as a whole and its fitted extra at
    that B has a lower confidence bound above 0.
    ``var``: the variances (K, N) or covariances (K, K, N) of ``ms`` before the correction.

    The correction's error is shared by every k at a B (one fit), so it enters the covariance,
    not only the diagonal: comparing two k then cancels part of it.
    """
    from tabletune_pipelines.core.goodput import tau_curve

    kk = list(ks)
    n = ms.shape[1]
    var = np.asarray(var, dtype=float)
    if var.ndim == 3:
        cov = var.copy()
    else:
        cov = np.zeros((len(kk), len(kk), n))
        for i in range(len(kk)):
            cov[i, i] = var[i]
    out = np.array(ms, dtype=float, copy=True)
    if fit is None or not fit.significant:
        return out, cov
    taus = tau_curve(rates)
    b = np.arange(1, n + 1, dtype=float)
    x = np.stack([np.ones_like(b), b], axis=-1)
    per_tok = x @ np.array([fit.alpha_ms, fit.beta_ms])
    per_tok_var = np.einsum("ni,ij,nj->n", x, fit.cov, x)
    # Only where the fitted extra work is significantly positive (its lower bound above 0): a fit
    # that is significant as a whole can still be indistinguishable from none at some B.
    on = fit.applied_at(n)
    scale = np.array([taus[k] - 1.0 if k >= 1 and k < len(taus) else 0.0 for k in kk])
    for i in range(len(kk)):
        out[i] += np.where(on, per_tok, 0.0) * scale[i]
    for i in range(len(kk)):
        for j in range(len(kk)):
            cov[i, j] += np.where(on, per_tok_var, 0.0) * scale[i] * scale[j]
    return out, cov


"""Step-time math (docs/method.md, "Step time T(B, k)"): the (t65 - t1)/64 protocol, medians, the
batch-size grid, interpolation of T(B, k) between measured batch sizes, the accepted-work
correction, and ``StepTimes``, T(cell, k) at every batch size with its uncertainty (what the table
search judges).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune_pipelines.core.goodput import validate_step_time
from tabletune_pipelines.errors import (
    EmptyProfileError,
    InvalidAcceptanceError,
    InvalidStepTimeError,
    InvalidValueError,
)

#: Output tokens of the long request in the timing protocol (max_tokens = 65 → 64 decode steps).
LONG_MAX_TOKENS = 65
#: Output tokens of the short request (prefill + first token only).
SHORT_MAX_TOKENS = 1
#: Decode steps a repetition times by default (``engine.plan.PlanFields.decode_steps``).
DEFAULT_DECODE_STEPS = LONG_MAX_TOKENS - SHORT_MAX_TOKENS


def step_time_from_pair(t1_s: float, t65_s: float, decode_steps: int = DEFAULT_DECODE_STEPS) -> float:
    """Milliseconds per decode step from the wall times of a 1-token and a 65-token batch.

    Both batches pay the same prefill, so the difference is pure decode: (t65 - t1) / 64.
    """
    if decode_steps <= 0:
        raise InvalidValueError(f"decode_steps = {decode_steps!r} must be positive")
    for name, value in (("t1", t1_s), ("t65", t65_s)):
        if value is None or not math.isfinite(value) or value <= 0:
            raise InvalidStepTimeError(f"{name} = {value!r} s is not a positive wall time")
    if t65_s <= t1_s:
        raise InvalidStepTimeError(
            f"t65 = {t65_s:.4f} s is not longer than t1 = {t1_s:.4f} s: the long batch cannot be "
            "faster than the short one; the engine was probably disturbed, re-measure this cell"
        )
    return (t65_s - t1_s) * 1000.0 / decode_steps


def median_step_time(repetitions_ms: Sequence[float]) -> float:
    """Median of repeated step-time measurements (three repetitions, median: docs/method.md, "Step time T(B, k)")."""
    reps = [validate_step_time(r) for r in repetitions_ms]
    if not reps:
        raise EmptyProfileError("no repetitions were measured for this cell")
    return float(np.median(reps))


#: Standard error of a median over that of a mean of normal repetitions, for n large (sqrt(pi/2));
#: for n <= 2 the median is the mean.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)


def median_se_factor(n: int) -> float:
    """How much larger the standard error of the median of ``n`` repetitions is than that of their mean."""
    return 1.0 if n <= 2 else MEDIAN_SE_FACTOR


def median_standard_error(repetitions_ms: Sequence[float]) -> float | None:
    """Standard error of the cell's median from its repetitions: ``f(n) * sd / sqrt(n)``.

    ``sd`` is the sample standard deviation and ``f(n)`` the median's efficiency factor
    (``median_se_factor``). None when fewer than two repetitions were measured: one measurement
    carries no estimate of its own noise.
    """
    reps = np.asarray([validate_step_time(r) for r in repetitions_ms], dtype=float)
    n = int(reps.size)
    if n < 2:
        return None
    return float(median_se_factor(n) * reps.std(ddof=1) / math.sqrt(n))


def relative_spread(repetitions_ms: Sequence[float]) -> float:
    """(max - min) / median of the repetitions: the figure reported next to every cell."""
    reps = np.asarray([validate_step_time(r) for r in repetitions_ms], dtype=float)
    if reps.size == 0:
        raise EmptyProfileError("no repetitions were measured for this cell")
    return float((reps.max() - reps.min()) / np.median(reps))


def batch_size_grid(max_num_seqs: int, dense_until: int = 16, stride: int = 8) -> list[int]:
    """Batch sizes to measure: every B from 1 to ``dense_until``, then every ``stride``, always
    ending at ``max_num_seqs`` so the table's last range is measured, not extrapolated."""
    if max_num_seqs < 1:
        raise InvalidValueError(f"max_num_seqs = {max_num_seqs!r} must be >= 1")
    if not 4 <= stride <= 8:
        raise InvalidValueError(f"stride = {stride!r}: the method measures every 4-8 batch sizes past the dense part")
    grid = list(range(1, min(dense_until, max_num_seqs) + 1))
    b = dense_until + stride
    while b < max_num_seqs:
        grid.append(b)
        b += stride
    if grid[-1] != max_num_seqs:
        grid.append(max_num_seqs)
    return grid


def non_decreasing_fit(values: Sequence[float]) -> np.ndarray:
    """Least-squares non-decreasing fit (pool-adjacent-violators).

    A decode step cannot get cheaper when more requests share it, so a measured dip in T over B is
    noise (cells vary 5–25% on our machines: docs/engine-facts.md, "Noise on 2 cores"). Pooling a dip
    with its neighbours keeps a single noisy cell from carving a one-batch-size range into the table.
    The unweighted case of ``weighted_non_decreasing_fit``.
    """
    vals = [float(v) for v in values]
    return weighted_non_decreasing_fit(vals, [1.0] * len(vals))[0]


def weighted_non_decreasing_fit(values: Sequence[float], weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares non-decreasing fit (pool-adjacent-violators with weights).

    With weights 1 / variance, a noisy cell that dips below its neighbours is pulled up to them
    more than a precise one is. Returns the fit and, per point, the total weight of the block it
    was pooled into (1 / that is the variance of the pooled value).
    """
    vals = [float(v) for v in values]
    ws = [float(w) for w in weights]
    if len(vals) != len(ws):
        raise InvalidValueError(f"{len(vals)} values but {len(ws)} weights")
    if any(not math.isfinite(w) or w <= 0 for w in ws):
        raise InvalidValueError(f"weights must be finite and positive, got {ws!r}")
    blocks: list[list[float]] = []  # [weighted mean, total weight, count]
    for v, w in zip(vals, ws, strict=True):
        blocks.append([v, w, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    if not blocks:
        return np.empty(0), np.empty(0)
    fit = np.concatenate([np.full(int(n), m) for m, _, n in blocks])
    total = np.concatenate([np.full(int(n), w) for _, w, n in blocks])
    return fit, total


def every_batch_size(batch_sizes: Sequence[float], rows: Sequence[Sequence[float] | np.ndarray] | np.ndarray,
                     max_num_seqs: int) -> np.ndarray:
    """Step times for every batch size 1..max_num_seqs from step times measured at ``batch_sizes``
    (ascending), one row per k: linear interpolation between measured batch sizes, held flat past
    the last one. Shape (len(rows), max_num_seqs). The one place a profile becomes step times for
    every batch size (the table search, the noise model, the simulator's surfaces, the controller)."""
    b = np.arange(1, max_num_seqs + 1, dtype=float)
    xs = np.asarray(batch_sizes, dtype=float)
    return np.vstack([np.interp(b, xs, np.asarray(row, dtype=float)) for row in rows])


@dataclass(frozen=True)
class StepTimeSurface:
    """Measured step times T(B, k) in milliseconds on a grid of batch sizes.

    Pure data: built from a profile's cells, interpolated linearly between measured batch sizes.
    """

    ks: tuple[int, ...]
    """Draft lengths measured, ascending (0 = table says 0; the drafter still runs)."""
    batch_sizes: tuple[int, ...]
    """Measured batch sizes, ascending, starting at 1."""
    ms: np.ndarray
    """Step time in ms, shape (len(ks), len(batch_sizes))."""

    @classmethod
    def from_cells(cls, cells: Mapping[int, Mapping[int, float]]) -> StepTimeSurface:
        """Build from ``{k: {batch_size: ms}}``; every k must be measured at the same batch sizes."""
        if not cells or not any(cells.values()):
            raise EmptyProfileError("the step-time profile has no measured cells; run the profiler first")
        ks = tuple(sorted(int(k) for k in cells))
        if ks[0] < 0:
            raise EmptyProfileError(f"k = {ks[0]!r} is negative; profiled k values are 0..K")
        bs_sets = {k: sorted(int(b) for b in cells[k]) for k in ks}
        ref = bs_sets[ks[0]]
        for k in ks:
            if bs_sets[k] != ref:
                missing = sorted(set(ref) ^ set(bs_sets[k]))
                raise EmptyProfileError(
                    f"profile is incomplete: k = {k} and k = {ks[0]} differ at batch sizes {missing}; "
                    "re-run the profiler to fill the missing cells"
                )
        if ref[0] != 1:
            raise EmptyProfileError(f"profile starts at batch size {ref[0]}, it must include B = 1")
        ms = np.empty((len(ks), len(ref)))
        for i, k in enumerate(ks):
            for j, b in enumerate(ref):
                ms[i, j] = validate_step_time(cells[k][b], where=f" at B={b}, k={k}")
        return cls(ks=ks, batch_sizes=tuple(ref), ms=ms)

    def non_decreasing(self) -> StepTimeSurface:
        """The same surface with each k's T made non-decreasing in B (see ``non_decreasing_fit``)."""
        ms = np.vstack([non_decreasing_fit(row) for row in self.ms])
        return StepTimeSurface(ks=self.ks, batch_sizes=self.batch_sizes, ms=ms)

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def dense(self, max_num_seqs: int) -> np.ndarray:
        """T for every B in 1..max_num_seqs, shape (len(ks), max_num_seqs)."""
        if max_num_seqs > self.max_batch_size:
            raise EmptyProfileError(
                f"profile only reaches batch size {self.max_batch_size} but the table must cover "
                f"1..{max_num_seqs}; profile up to max_num_seqs"
            )
        return every_batch_size(self.batch_sizes, self.ms, max_num_seqs)

    def at(self, k: int, batch_size: int) -> float:
        if k not in self.ks:
            raise EmptyProfileError(f"k = {k} was not profiled (profiled: {list(self.ks)})")
        xs = np.asarray(self.batch_sizes, dtype=float)
        return float(np.interp(batch_size, xs, self.ms[self.ks.index(k)]))


def accepted_work_correction(
    reject_ms: StepTimeSurface,
    accept_cells: Mapping[int, Mapping[int, float]],
    rates: Sequence[float],
    max_num_seqs: int,
) -> np.ndarray:
    """Predicted T(B, k) including work that grows with accepted tokens (docs/method.md, "Limitations" 2).

    ``accept_cells`` holds steps where every draft was accepted, ``{k: {B: ms}}``, at a few batch
    sizes. The extra cost of accepting all k drafts, T_acc - T_rej, is interpolated over B
    (held constant outside the measured range) and scaled by the expected fraction of drafts
    kept, (tau(k) - 1) / k. Returns dense step times shaped like ``reject_ms.dense``.
    """
    from tabletune_pipelines.core.goodput import tau_curve

    dense = reject_ms.dense(max_num_seqs).copy()
    taus = tau_curve(rates)
    b = np.arange(1, max_num_seqs + 1, dtype=float)
    for i, k in enumerate(reject_ms.ks):
        if k == 0 or k not in accept_cells or not accept_cells[k]:
            continue
        if k >= len(taus):
            raise InvalidAcceptanceError(f"k = {k} exceeds the {len(taus) - 1} known acceptance rates")
        pts = sorted((int(bb), validate_step_time(v, where=f" (all-accepted) at B={bb}, k={k}"))
                     for bb, v in accept_cells[k].items())
        xs = np.array([p[0] for p in pts], dtype=float)
        extra = np.array([p[1] - reject_ms.at(k, p[0]) for p in pts])
        # The extra work cannot be negative in expectation; measurement noise can make it so.
        extra = np.maximum(extra, 0.0)
        frac_kept = (taus[k] - 1.0) / k
        dense[i] += np.interp(b, xs, extra) * frac_kept
    return dense



def as_covariance(step_cov: np.ndarray) -> np.ndarray:
    """Step-time (co)variances as covariances between k at each B, shape (K, K, N): variances
    (K, N) go on the diagonal; a (K, K, N) array is returned as it is."""
    cov = np.asarray(step_cov, dtype=float)
    if cov.ndim != 2:
        return cov
    K, n = cov.shape
    full = np.zeros((K, K, n))
    full[np.arange(K), np.arange(K)] = cov
    return full


def lowest_context(cells: Sequence[Any]) -> tuple[Any, ...]:
    """The cells (each with a ``context_tokens`` level) at the lowest context level among them: what
    a profile's per-(k, B) views read when it holds several levels (``formats.profile_levels`` splits
    a profile by level)."""
    low = min((c.context_tokens for c in cells), default=0)
    return tuple(c for c in cells if c.context_tokens == low)


@dataclass(frozen=True)
class StepTimes:
    """T(cell, k) for every batch size B = 1..N with its uncertainty: the surface the table search
    judges (``core.evidence.search_with_evidence``). One column per batch size; the values are
    checked where goodput is computed (``core.table.goodput_matrix``)."""

    ks: tuple[int, ...]
    """Draft lengths, one per row of ``ms``."""
    ms: np.ndarray
    """Step time in ms, shape (len(ks), N); column B - 1 is batch size B."""
    cov: np.ndarray | None = None
    """Variances (len(ks), N) or covariances between k at each B (len(ks), len(ks), N), ms²; None:
    no error estimates (the search then decides on point estimates)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(int(k) for k in self.ks))
        ms = np.asarray(self.ms, dtype=float)
        if ms.ndim != 2 or ms.shape[0] != len(self.ks):
            raise InvalidStepTimeError(f"step times have shape {ms.shape}; expected ({len(self.ks)}, N), one row "
                                       f"per k of {list(self.ks)}")
        object.__setattr__(self, "ms", ms)
        if self.cov is not None:
            K, n = ms.shape
            cov = np.asarray(self.cov, dtype=float)
            if cov.shape not in ((K, n), (K, K, n)):
                raise InvalidStepTimeError(f"step-time covariance has shape {cov.shape}; expected {(K, n)} or "
                                           f"{(K, K, n)}")
            object.__setattr__(self, "cov", cov)

    @property
    def max_batch_size(self) -> int:
        """N: the largest batch size the surface covers."""
        return int(self.ms.shape[1])

    @property
    def has_errors(self) -> bool:
        """Whether some step time has a positive variance."""
        return self.cov is not None and bool(np.any(self.cov > 0))

    def covariance(self) -> np.ndarray:
        """Covariances between k at each B, shape (K, K, N) (zeros without error estimates)."""
        K, n = self.ms.shape
        return np.zeros((K, K, n)) if self.cov is None else as_covariance(self.cov)

    def variance(self) -> np.ndarray:
        """The variance of every step time, shape (K, N) (zeros without error estimates)."""
        cov = self.covariance()
        return np.stack([cov[i, i] for i in range(len(self.ks))])

    def at(self, k: int, batch_size: int) -> tuple[float, float]:
        """T(batch_size, k) in ms and its variance."""
        if k not in self.ks:
            raise InvalidValueError(f"k = {k!r} is not one of the surface's {list(self.ks)}")
        if not 1 <= int(batch_size) <= self.max_batch_size:
            raise InvalidValueError(f"batch size {batch_size!r} is outside 1..{self.max_batch_size}")
        i, j = self.ks.index(k), int(batch_size) - 1
        return float(self.ms[i, j]), float(self.variance()[i, j])

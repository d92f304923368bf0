"""Served calibration: what serving measured per step corrects the served price (docs/method.md,
"What a served step costs", served calibration).

The price of ``core.stepcost`` sees what a step carries (decode tokens, prefill, graph mode), not
what serving adds between steps (stalls, requests finishing, arrivals that bunch unlike Poisson).
A closed loop that runs each fixed k at a few loads measures the wall time per step with every
step counted (``tuning.served_windows.served_points``); ``ServedCalibration.offsets`` turns those points
into a correction of the priced E[T(B, k, P)], with its variance and the covariance between ks
measured in the same rounds. ``StepCost.served(..., calibration=...)`` applies it.

Pure numpy, no I/O. Every number of a point has its bounds in ``ServedPoint.BOUNDS``
(``options.Bound``, the one rule of numbers read from outside: a calibration is read back from the
store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.options import BATCH_SIZE, DRAFT_LENGTH, STEP_MS, Bound, check_bounds, check_value
from tabletune_pipelines.vocab import MAX_STEP_MS


@dataclass(frozen=True)
class ServedPoint:
    """What serving measured for one fixed k at one load: the wall time per step, every step counted."""

    k: int
    """The draft length every step ran."""
    batch: float
    """Mean requests per step over the windows (arrivals included)."""
    ms: float
    """Mean wall milliseconds per step (window seconds / steps), averaged over rounds."""
    se_ms: float
    """Standard error of ``ms`` across rounds."""
    rounds: int
    """Windows (rounds) behind the figure."""
    load: int = 0
    """The closed loop's concurrency (0: not recorded); points of one load share their rounds."""
    per_round: tuple[tuple[str, float], ...] = ()
    """``(round key, ms)`` per window: the key names the launch and round, so that two ks measured
    in the same rounds are compared paired (``ServedCalibration.offsets``)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "k": DRAFT_LENGTH,
        "batch": Bound(1.0, BATCH_SIZE.high, why="mean requests per step"),
        "ms": STEP_MS,
        "se_ms": Bound(0.0, MAX_STEP_MS, why="milliseconds"),
        "rounds": Bound(2, 1_000_000, integer=True, why="a standard error across rounds needs at least 2"),
        "load": Bound(0, BATCH_SIZE.high, integer=True, why="concurrent requests; 0: not recorded"),
    }

    def __post_init__(self) -> None:
        check_bounds(self, where="served point", error=InvalidValueError)
        rows = self.per_round
        if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__iter__"):
            raise InvalidValueError(f"served point k = {self.k}: per_round must be a list of [round key, ms]")
        out = []
        for i, row in enumerate(rows):
            if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != 2:
                raise InvalidValueError(f"served point k = {self.k}: per_round[{i}] = {row!r:.60} must be "
                                        "[round key, ms]")
            check_value(STEP_MS, f"per_round[{i}] ms", row[1], where=f"served point k = {self.k}",
                        error=InvalidValueError)
            out.append((str(row[0]), float(row[1])))
        object.__setattr__(self, "per_round", tuple(out))

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "batch": round(float(self.batch), 3), "ms": round(float(self.ms), 4),
                "se_ms": round(float(self.se_ms), 4), "rounds": self.rounds, "load": self.load,
                "per_round": [[key, round(v, 4)] for key, v in self.per_round]}


def _paired_cov(a: ServedPoint, b: ServedPoint) -> float:
    """Covariance of two points' means from the rounds they share (0 with fewer than 2)."""
    ra, rb = dict(a.per_round), dict(b.per_round)
    common = sorted(set(ra) & set(rb))
    if len(common) < 2:
        return 0.0
    x = np.array([ra[c] for c in common])
    y = np.array([rb[c] for c in common])
    c = float(np.cov(x, y)[0, 1])  # per-window covariance; the means average len(ra) and len(rb) windows
    return c * len(common) / (len(ra) * len(rb))


@dataclass(frozen=True)
class ServedCalibration:
    """Served step times measured at a few loads, which correct the priced E[T(B, k, P)].

    What the mixed-step fits cannot see (stalls between steps, requests finishing, arrivals that
    bunch or spread unlike Poisson) shows in the wall time per step that serving measures. For
    each k with points, the offset ``measured − priced`` at each point's batch size is linear in B
    between points, flat above the highest and proportional to B below the lowest (what serving
    adds comes with the requests admitted per step, B·τ(k)/L_out); its variance: ``offsets``. A k
    with no point takes, at each B, the mean offset of the ks that have one, its variance
    widened by their spread: it borrows what serving adds to every step, not a figure of its own.
    """

    points: tuple[ServedPoint, ...]
    """Fixed-k measurements (``tuning.served_windows.served_points``)."""
    source: str = ""
    """Where the points come from, in words (shown in the table's provenance)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(self.points))
        if not self.points:
            raise InvalidValueError("a served calibration needs at least one point")
        seen = set()
        for p in self.points:
            key = (p.k, round(float(p.batch), 6))
            if key in seen:
                raise InvalidValueError(f"served calibration: two points for k = {p.k} at batch {p.batch:g}; "
                                        "pool their rounds into one")
            seen.add(key)

    def offsets(self, priced_ms: np.ndarray, priced_var: np.ndarray,
                ks: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offset, variance of the corrected price, covariance between ks), the first two shaped
        like ``priced_ms`` (len(ks), N) for B = 1..N, the last (len(ks), len(ks), N) with a zero
        diagonal. At a point the corrected price is the measurement, so its variance is the point's
        s.e.²; away from the points the price's own variance counts by how far it differs from its
        value at the points (linear between them, flat beyond), which the measurement replaced.
        Two ks measured in the same rounds at one load covary (the round's conditions are shared):
        that covariance, interpolated the same way and bounded by the variances, lets a paired
        comparison count as paired."""
        priced = np.asarray(priced_ms, float)
        pvar = np.asarray(priced_var, float)
        unknown = sorted({p.k for p in self.points if p.k not in ks})
        if unknown:
            raise InvalidValueError(f"served calibration has points at k = {unknown}, which this cost model does "
                                    f"not price (ks: {list(ks)})")
        n = priced.shape[1]
        b = np.arange(1, n + 1, dtype=float)
        off = np.zeros(priced.shape)
        var = pvar.copy()
        have = np.zeros(len(ks), bool)
        for i, k in enumerate(ks):
            pts = sorted((p for p in self.points if p.k == k), key=lambda p: p.batch)
            if not pts:
                continue
            have[i] = True
            xb = np.array([min(float(p.batch), n) for p in pts])
            o = np.array([p.ms - float(np.interp(x, b, priced[i])) for p, x in zip(pts, xb, strict=True)])
            at = np.array([float(np.interp(x, b, pvar[i])) for x in xb])
            off[i] = np.interp(b, xb, o)
            below = b < xb[0]  # what serving adds grows with the requests admitted per step, B·τ/L_out
            off[i, below] = o[0] * b[below] / xb[0]
            var[i] = np.interp(b, xb, [p.se_ms ** 2 for p in pts]) + np.abs(pvar[i] - np.interp(b, xb, at))
        if have.any() and not have.all():
            mean = off[have].mean(axis=0)
            spread = off[have].var(axis=0)
            extra = (var[have] - pvar[have]).mean(axis=0)
            for i in np.flatnonzero(~have):
                off[i] = mean
                var[i] = pvar[i] + np.maximum(extra, 0.0) + spread
        return off, var, self._cross(ks, b, var)

    def _cross(self, ks: Sequence[int], b: np.ndarray, var: np.ndarray) -> np.ndarray:
        n = len(b)
        cross = np.zeros((len(ks), len(ks), n))
        for i, ki in enumerate(ks):
            for j, kj in enumerate(ks):
                if j <= i:
                    continue
                pairs = sorted(((0.5 * (p.batch + q.batch), _paired_cov(p, q))
                                for p in self.points if p.k == ki and p.load
                                for q in self.points if q.k == kj and q.load == p.load), key=lambda t: t[0])
                if not pairs:
                    continue
                c = np.interp(b, [min(x, n) for x, _ in pairs], [v for _, v in pairs])
                c = np.clip(c, -np.sqrt(var[i] * var[j]), np.sqrt(var[i] * var[j]))
                cross[i, j] = cross[j, i] = c
        return cross

    def to_dict(self) -> dict[str, Any]:
        return {"points": [p.to_dict() for p in self.points], "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServedCalibration:
        try:
            pts = tuple(ServedPoint(k=p["k"], batch=p["batch"], ms=p["ms"], se_ms=p["se_ms"], rounds=p["rounds"],
                                    load=p.get("load", 0), per_round=tuple(tuple(x) for x in p.get("per_round", ())))
                        for p in d["points"])
        except (KeyError, TypeError, AttributeError) as e:
            raise InvalidValueError(f"served calibration: malformed point ({e!r}); each needs k, batch, ms, "
                                    "se_ms and rounds") from None
        return cls(points=pts, source=str(d.get("source", "")))

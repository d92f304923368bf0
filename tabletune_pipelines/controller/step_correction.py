"""Live step-time correction: observed step durations blended into the profiled T(B, k).

Per cell (B, k) the profiled time counts as ``w_T`` observed steps::

    T̂(B, k) = (w_T · T_prof(B, k) + Σ observed ms) / (w_T + n_observed)

``w_T`` halves at every rebuild down to a floor (the profile fades like the acceptance prior);
the live sum and count of a cell are scaled down once the count passes a cap (recent steps
dominate, and a cell no longer visited keeps its last estimate instead of drifting back). Live
traffic visits few batch sizes, so the correction is spread over B per k: the ratio T̂ / T_prof of
the observed cells is interpolated linearly between them and held constant beyond them; a k never
observed keeps its profile. Pure numpy, no I/O (a simulator can drive it).

Each cell also keeps the sum of squares of its observations, so the correction comes with its
error. The profile is a prior that can be wrong (that is why it is corrected), so its w_T weight
carries the profile's own error, σ_p relative per k, measured as the RMS of (live mean / profile
− 1) over that k's cells observed at least ``PROFILE_ERROR_MIN_COUNT`` times (a k without such
cells: the largest other k's), never below ``PROFILE_ERROR_FLOOR``::

    var T̂ = (w_T² (σ_p T_prof)² + n s²) / (w_T + n)²        (s²: the cell's sample variance)

spread over B as a relative variance the same way as the ratio; a k never observed has the
profile's error, σ_p relative. So a k with few live steps cannot win on its profile alone when the
profile has been seen to be off elsewhere. The table search's evidence rule (``core.evidence``)
reads it: a k changes at a batch size only where the gain's lower confidence bound clears the
stickiness. Consecutive steps share noise, so the live part is a lower bound of the truth; the
Bonferroni-corrected 95 % bound and the backoff on repeated flips (``logic``) cover the rest.

**Reach.** Spreading the ratio over B is a guess where nothing was observed: a correction seen at
B = 112-128 says little about B = 46 unless the profile is off by the same factor everywhere. So the
relative variance spread over B grows, away from the observed cells, by the square of the ratio's
own spread over B (``shape_error``: its relative sd over the well-observed cells of that k, never
below the 5 % floor), linearly over ``evidence_reach()`` batch sizes (twice the served pool's
half-width: 12 at max_num_seqs 128) and then held. A profile uniformly 30 % low is still corrected
everywhere; a difference between two ks seen at one load no longer moves k, on its own, at batch
sizes the load never visited. Spread without that error, it did: in the simulator, from the
quartered table at load 128 on the H200 profile, the controller cut B = 1-84 into five ranges that
the offline search, on the same profile, keeps as one.

**Stale evidence.** When the table in force changes k at a batch size, the observations of the k
it left are dropped there: the machine's speed drifts (other processes, clocks, the load itself),
and a cell measured before the switch compared with one measured after it can favour going back on
the drift alone. Going back needs evidence gathered since the switch, which exploration brings
(the k just left is an open decision, so it is explored there).

**Served.** A clean decode step is what the profile timed; serving also runs steps that carry
prefill and, on a GPU, steps that cross the CUDA-graph capture ceiling (docs/method.md, "What a
served step costs"). Every served step's interval is therefore also kept per cell (k, B) (intervals
over ``outlier_ratio²`` times the profile are pauses, not steps), with the extra m its own prefill
is priced at (``core.stepcost.StepExtra`` on the published fits; 0 without them). What a served
step costs over the decode surface, per cell::

    Ê(B, k) = E_prior(B, k) + N · (mean of x − T̂ − m over the pooled steps) / (w_T + N)

that is, the steady workload's priced extra plus how far the steps seen cost beyond their own
priced content, the prior counting as w_T steps. A step is judged against the prefill it carried,
not the prefill serving will bring: the ramp-up to a new load admits dozens of prompts per step at
batch sizes the load then leaves, and priced as if they were steady (the mean of x − T̂ alone, as
before), those steps made the k they ran at look dear there for good. On the H200 the MoE from the
cliff table kept k = 2 at B = 26-38 and 63-75, ranges the load passed only while ramping up. Without
a published served model, m = 0 and E_prior = 0: Ê is the pooled mean of x − T̂, shrunk by w_T.

The N steps are every served step at k within ± 5 % of max_num_seqs of B (at least one more
than the table's hysteresis, so the range it opens is wide enough to apply): under
load the batch size wanders over a range, and an explored k's few served steps would otherwise sit
one or two per cell, each too uncertain to move the evidence (on the H200 at load 128 the controller
kept k = 3 on the cliff for 46 s while its explored k = 2 spread over B = 115-128). Where no served
step at k fell within the pool, Ê is the prior with the prior's error: an extra is not carried to
batch sizes it was not seen near (a cliff at B = 128 says nothing about B = 10).

with E_prior the tuner's own served pricing (``core.stepcost.StepCost.served`` on the published
fits, envelope and a live workload estimate; 0 when the table was priced on decode steps alone).
The prior's error is its fits'
variance plus half the larger of E_prior and the largest extra observed anywhere, so a k never
observed borrows no saving it was not shown. The search then prices T̂ + Ê: the cost serving pays,
with its variance.

**Unvisited batch sizes.** Where no served step of either of two ks fell near B, the wide part of
their priors is one unknown (what serving adds at that B), not two: it is counted as perfectly
correlated between them, so it cannot hold a k in place there and the decode surface, with its
own error, and the published served model decide, as they do offline. Counted as two independent
unknowns (before), it held every k the start table had at batch sizes the load never visited: on
the H200 the controller started from the quartered table at load 128 kept k = 0 at B = 33-82 and
ended on 16 ranges. Where either k was served near B the prior's error stays its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune_pipelines.core.stepcost import GraphEnvelope, PrefillFit, Workload
from tabletune_pipelines.errors import InvalidValueError

#: A profile is not known better than this on the serving path (relative error of a profiled cell).
PROFILE_ERROR_FLOOR = 0.05
#: Live steps a cell needs before its deviation from the profile counts in the profile's error.
PROFILE_ERROR_MIN_COUNT = 10.0
#: The served extra at B pools the served steps at B ± this fraction of max_num_seqs (module docstring).
SERVED_POOL_FRACTION = 0.05


class StepTimeModel:
    """Profiled T(B, k) for the candidate ks plus live observations (see the module docstring)."""

    def __init__(self, ks: Sequence[int], profile_ms: np.ndarray, *, prior_weight: float, min_prior_weight: float,
                 max_count: float, hysteresis: int = 0) -> None:
        self.ks = tuple(int(k) for k in ks)
        self.profile = np.asarray(profile_ms, dtype=float)
        if self.profile.shape[0] != len(self.ks):
            raise InvalidValueError(f"profile has {self.profile.shape[0]} rows for {len(self.ks)} k values")
        self.n = self.profile.shape[1]
        self.weight = float(prior_weight)
        self.min_weight = float(min_prior_weight)
        self.max_count = float(max_count)
        self.hysteresis = int(hysteresis)
        self.sum_ms = np.zeros_like(self.profile)
        self.sq_ms = np.zeros_like(self.profile)
        self.count = np.zeros_like(self.profile)
        # Every served step (clean or not) per cell: what serving pays there (module docstring, "Served").
        self.all_sum = np.zeros_like(self.profile)
        self.all_sq = np.zeros_like(self.profile)
        self.all_count = np.zeros_like(self.profile)
        # ... and the extra each of those steps' own prefill is priced at (m): sums of m, m², x·m.
        self.all_m = np.zeros_like(self.profile)
        self.all_m2 = np.zeros_like(self.profile)
        self.all_xm = np.zeros_like(self.profile)
        self._b = np.arange(1, self.n + 1, dtype=float)

    def add(self, sum_ms: np.ndarray, count: np.ndarray, sq_ms: np.ndarray | None = None) -> None:
        """Add a batch of observations (same shape as the profile): their sums, counts and, for
        the error of the correction, sums of squares (None: no spread, as if every step took the mean)."""
        self.sum_ms += sum_ms
        self.count += count
        if sq_ms is None:
            sq_ms = np.where(count > 0, sum_ms * sum_ms / np.maximum(count, 1e-12), 0.0)
        self.sq_ms += sq_ms
        _cap(self.sum_ms, self.sq_ms, self.count, self.max_count)

    def add_served(self, sum_ms: np.ndarray, count: np.ndarray, sq_ms: np.ndarray, m_sum: np.ndarray | None = None,
                   m_sq: np.ndarray | None = None, xm_sum: np.ndarray | None = None) -> None:
        """Add every served step's interval per cell (prefill and graph changes included), capped
        like the clean steps; ``m_sum``, ``m_sq``, ``xm_sum``: the sums of m, m² and interval·m, m
        the extra each step's own prefill is priced at (None: 0, a table priced on decode steps)."""
        self.all_sum += sum_ms
        self.all_count += count
        self.all_sq += sq_ms
        for arr, add in ((self.all_m, m_sum), (self.all_m2, m_sq), (self.all_xm, xm_sum)):
            if add is not None:
                arr += add
        _cap(self.all_sum, self.all_sq, self.all_count, self.max_count, self.all_m, self.all_m2, self.all_xm)

    def served_extra(self, prior_extra: np.ndarray | None = None,
                     prior_var: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(extra ms, its variance) a served step costs over the decode surface per (k, B): the
        prior's (``core.stepcost`` from the published fits, or 0) blended with the observed mean of
        every served step minus the corrected decode time, the prior counting as w_T steps (module
        docstring, "Served"). The prior's error: its fits' variance plus half the larger of its
        value and the largest extra observed anywhere (a k never observed may pay as much)."""
        extra, var, _ = self._served(prior_extra, prior_var)
        return extra, var

    def served_extra_cov(self, prior_extra: np.ndarray | None = None,
                         prior_var: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(extra ms (K, N), covariance (K, K, N)) of the served extra: ``served_extra`` with the
        unknown part shared. Where no served step of either k fell near B, the wide part of both
        priors (half the largest extra seen anywhere) is one unknown, the extra that serving adds at
        that B, so it is counted as perfectly correlated between those ks: it cannot favour one of
        them, and the decode surface (and the published served model) decide there (module
        docstring, "Unvisited batch sizes")."""
        extra, var, shared = self._served(prior_extra, prior_var)
        cov = shared[:, None, :] * shared[None, :, :]
        k = np.arange(var.shape[0])
        cov[k, k] = var
        return extra, cov

    def _served(self, prior_extra: np.ndarray | None,
                prior_var: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(extra, variance, the shared part's sd: the wide prior error where no step fell, else 0)."""
        shape = self.profile.shape
        e0 = np.zeros(shape) if prior_extra is None else np.asarray(prior_extra, float)
        v0 = np.zeros(shape) if prior_var is None else np.asarray(prior_var, float)
        n, w, t = self.all_count, self.weight, self.corrected()
        m1, m2, xm = self.all_m, self.all_m2, self.all_xm
        # A served step's residual: x − T̂ − m, what it cost beyond the decode surface and beyond the
        # extra its own prefill is priced at (m = 0 without a published served model). The extra a
        # step will cost in steady serving is the prior's (the workload's expected prefill, priced)
        # plus the mean residual (module docstring, "Served").
        e_obs = (self.all_sum - m1) / np.maximum(n, 1e-12) - t + e0
        well = n >= PROFILE_ERROR_MIN_COUNT
        e_ref = max(0.0, float(e_obs[well].max())) if well.any() else 0.0
        wide = 0.5 * np.maximum(e0, e_ref)
        v0 = v0 + wide ** 2
        # Residuals pooled over the batch sizes within ``pool_halfwidth()`` of each B: under load B
        # wanders over a range, and an explored k's few served steps there would otherwise sit one or
        # two per cell, each too uncertain to count.
        r1 = self._pool(self.all_sum - n * t - m1)
        r2 = self._pool(self.all_sq + n * t * t + m2 - 2.0 * t * self.all_sum - 2.0 * xm + 2.0 * t * m1)
        N = self._pool(n)
        e_p = r1 / np.maximum(N, 1e-12)
        s2 = np.where(N > 1, np.maximum(r2 - N * e_p * e_p, 0.0) / np.maximum(N - 1.0, 1e-12), 0.0)
        # Where no served step at k fell within the pool, the prior stands with its wide error: a cliff
        # seen at B = 112-128 says nothing about B = 10, and a k never served there borrows no saving.
        seen = N > 0
        out_e = np.where(seen, e0 + N * e_p / np.maximum(w + N, 1e-12), e0)
        out_v = np.where(seen, (w * w * v0 + N * s2) / np.maximum(w + N, 1e-12) ** 2, v0)
        return out_e, out_v, np.where(seen, 0.0, wide)

    def pool_halfwidth(self) -> int:
        """Batch sizes on each side that the served extra pools: ``SERVED_POOL_FRACTION`` of
        max_num_seqs, and wider than the table's hysteresis (a range the evidence opens must be wider
        than the band in which the k in force stays, or it never applies): 6 at 128, 3 at 16 with
        the default hysteresis of 2."""
        return max(self.hysteresis + 1, int(round(SERVED_POOL_FRACTION * self.n)))

    def pool_width(self) -> int:
        """Batch sizes one pooled cell of the served extra spans: ``2 · pool_halfwidth() + 1`` (13 at
        max_num_seqs 128, 7 at 16). No range narrower than this is told apart by the served evidence:
        the controller's search merges narrower ones (``core.evidence.SearchSettings.min_range``)."""
        return 2 * self.pool_halfwidth() + 1

    def _pool(self, x: np.ndarray) -> np.ndarray:
        """Per k, the sum of ``x`` over the batch sizes within ``pool_halfwidth()`` of each B."""
        h = self.pool_halfwidth()
        c = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1)], axis=1)
        idx = np.arange(self.n)
        hi, lo = np.minimum(idx + h + 1, self.n), np.maximum(idx - h, 0)
        return c[:, hi] - c[:, lo]

    def blended(self) -> np.ndarray:
        """T̂ at every cell (the profile where nothing was observed)."""
        w = self.weight
        return (w * self.profile + self.sum_ms) / (w + self.count)

    def ratios(self) -> np.ndarray:
        """Correction factor T̂ / T_prof per (k, B), spread over B from the observed cells."""
        r = self.blended() / self.profile
        out = np.ones_like(self.profile)
        for i in range(len(self.ks)):
            seen = np.flatnonzero(self.count[i] > 0)
            if seen.size:
                out[i] = np.interp(self._b, self._b[seen], r[i, seen])
        return out

    def profile_error(self) -> np.ndarray:
        """σ_p per k: RMS relative deviation of that k's profile from the live mean over its
        well-observed cells; a k without any has the largest of the others' (the profile has been
        seen that far off); never below ``PROFILE_ERROR_FLOOR``."""
        seen = self.count >= PROFILE_ERROR_MIN_COUNT
        dev = np.where(seen, self.sum_ms / np.maximum(self.count, 1e-12) / self.profile - 1.0, 0.0)
        rows = seen.any(axis=1)
        rms = np.sqrt((dev * dev).sum(axis=1) / np.maximum(seen.sum(axis=1), 1))
        fallback = float(rms[rows].max()) if rows.any() else 0.0
        return np.maximum(PROFILE_ERROR_FLOOR, np.where(rows, rms, fallback))

    def variance(self) -> np.ndarray:
        """Variance (ms²) of ``corrected()`` per (k, B) (module docstring): the profile's error weighted
        by w_T plus the live spread, as a relative variance spread over B like the ratio; a k never
        observed has the profile's error."""
        n, w = self.count, self.weight
        sp = self.profile_error()
        mean = self.sum_ms / np.maximum(n, 1e-12)
        s2 = np.where(n > 1, np.maximum(self.sq_ms - n * mean * mean, 0.0) / np.maximum(n - 1.0, 1e-12), 0.0)
        var = (w * w * (sp[:, None] * self.profile) ** 2 + n * s2) / (w + n) ** 2
        rel = var / self.blended() ** 2
        out = np.repeat((sp * sp)[:, None], self.n, axis=1)
        reach, shape = self.evidence_reach(), self.shape_error()
        for i in range(len(self.ks)):
            seen = np.flatnonzero(n[i] > 0)
            if seen.size:
                # Away from the observed cells the spread correction is a guess: its error grows by the
                # ratio's own spread over B within ``evidence_reach()`` batch sizes (module docstring, "Reach").
                far = np.minimum(1.0, _distance(seen, self.n) / reach)
                out[i] = np.interp(self._b, self._b[seen], rel[i, seen]) + far * shape[i] ** 2
        return out * self.corrected() ** 2

    def shape_error(self) -> np.ndarray:
        """Per k, how much the correction ratio T̂ / T_prof varies over B: the relative spread (sd over
        mean) of the live mean / profile over that k's cells observed at least
        ``PROFILE_ERROR_MIN_COUNT`` times, never below ``PROFILE_ERROR_FLOOR`` (the floor with fewer
        than two such cells: the profile's shape is not known better than that)."""
        seen = self.count >= PROFILE_ERROR_MIN_COUNT
        out = np.full(len(self.ks), PROFILE_ERROR_FLOOR)
        for i in range(len(self.ks)):
            if int(seen[i].sum()) >= 2:
                r = self.sum_ms[i, seen[i]] / self.count[i, seen[i]] / self.profile[i, seen[i]]
                out[i] = max(PROFILE_ERROR_FLOOR, float(r.std(ddof=1) / r.mean()))
        return out

    def evidence_reach(self) -> int:
        """Batch sizes over which a cell's observations stop counting as evidence about its
        neighbours' step times (module docstring, "Reach"): twice ``pool_halfwidth()``, 12 at
        max_num_seqs 128, and at least 1."""
        return max(1, 2 * self.pool_halfwidth())

    def corrected(self) -> np.ndarray:
        """Step times for the table search: the profile times the spread correction."""
        return self.profile * self.ratios()

    def forget_left(self, old_k: np.ndarray, new_k: np.ndarray) -> None:
        """After the table in force changed k at some batch sizes (dense k per B): the observations of
        the k each of them left are dropped there, clean and served. Going back needs evidence gathered
        since the switch (exploration brings it): on 2 busy cores the machine slowed by a third while
        k = 1 was in force, and k = 2's cell, measured before the switch, looked 10 % cheaper and took
        the batch size back (module docstring, "Stale evidence")."""
        rows = {k: i for i, k in enumerate(self.ks)}
        for b in np.flatnonzero(np.asarray(old_k) != np.asarray(new_k)):
            i = rows.get(int(old_k[b]))
            if i is None or b >= self.n:
                continue
            for arr in (self.sum_ms, self.sq_ms, self.count, self.all_sum, self.all_sq, self.all_count, self.all_m,
                        self.all_m2, self.all_xm):
                arr[i, b] = 0.0

    def decay(self) -> None:
        """After a rebuild: the profile's weight halves (down to its floor)."""
        self.weight = max(self.min_weight, self.weight * 0.5)

    def _top_cells(self, count: np.ndarray, sums: np.ndarray, last: np.ndarray,
                   max_cells: int) -> dict[str, list[list[float]]]:
        """Per k, the most observed cells: ``[[B, mean ms, count, last[k, B]], ...]``."""
        out: dict[str, list[list[float]]] = {}
        for i, k in enumerate(self.ks):
            seen = np.flatnonzero(count[i] > 0)
            if not seen.size:
                continue
            top = seen[np.argsort(-count[i, seen], kind="stable")[:max_cells]]
            out[str(k)] = [[int(j + 1), round(float(sums[i, j] / count[i, j]), 4), round(float(count[i, j]), 1),
                            round(float(last[i, j]), 4)] for j in sorted(top)]
        return out

    def served_summary(self, max_cells: int = 8) -> dict[str, list[list[float]]]:
        """Cells with served steps per k, most observed first: ``{k: [[B, mean ms of every step, count,
        mean − corrected decode ms], ...]}``."""
        mean = self.all_sum / np.maximum(self.all_count, 1e-12)
        return self._top_cells(self.all_count, self.all_sum, mean - self.corrected(), max_cells)

    def summary(self, max_cells: int = 16) -> dict[str, list[list[float]]]:
        """Observed cells per k, most observed first: ``{k: [[B, live mean ms, count, T̂/T_prof], ...]}``."""
        return self._top_cells(self.count, self.sum_ms, self.blended() / self.profile, max_cells)

@dataclass(frozen=True)
class ServedPrior:
    """The tuner's served-step pricing, read from the published table's ``served_cost``: the graph
    envelope, the mixed-step fits per transition and the workload it priced (``core.stepcost``)."""

    envelope: GraphEnvelope
    """Which steps get CUDA graphs on the engine the table was tuned for."""
    fits: Mapping[str, PrefillFit]
    """Mixed-step extra cost per graph transition."""
    workload: Workload
    """Prompt and output lengths the table was priced for (the live estimate starts here)."""


def served_prior(document: Mapping[str, Any]) -> ServedPrior | str | None:
    """The published document's served-cost model; None when the table was priced on decode steps
    alone; one sentence when it is there but unreadable (the controller then prices decode steps)."""
    table = document.get("table") if isinstance(document, Mapping) else None
    sc = table.get("served_cost") if isinstance(table, Mapping) else None
    if not sc:
        return None
    try:
        env = sc["envelope"]
        envelope = GraphEnvelope(cudagraph_mode=str(env["cudagraph_mode"]), capture_ceiling=env["capture_ceiling"],
                                 max_num_batched_tokens=env["max_num_batched_tokens"])
        fits = {str(t): PrefillFit.from_dict(f) for t, f in dict(sc.get("fits") or {}).items()}
        return ServedPrior(envelope=envelope, fits=fits, workload=Workload.from_dict(sc["workload"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return (f"its served-cost model is unreadable ({type(exc).__name__}: {str(exc)[:120]}); served steps are "
                "priced from live observations only")


def _distance(seen: np.ndarray, n: int) -> np.ndarray:
    """Per batch size (index B - 1, n of them): how many batch sizes away the nearest index in
    ``seen`` (sorted, not empty) is."""
    idx = np.arange(n)
    j = np.clip(np.searchsorted(seen, idx), 1, max(seen.size - 1, 1))
    lo, hi = seen[np.clip(j - 1, 0, seen.size - 1)], seen[np.clip(j, 0, seen.size - 1)]
    return np.minimum(np.abs(idx - lo), np.abs(idx - hi)).astype(float)


def _cap(sums: np.ndarray, squares: np.ndarray, counts: np.ndarray, max_count: float, *more: np.ndarray) -> None:
    """Scale, in place, every cell whose count passed ``max_count`` back to it (sums, squares, count
    and ``more`` sums alike, so its mean and spread stay): old observations fade instead of growing
    without bound."""
    over = counts > max_count
    if over.any():
        scale = np.where(over, max_count / np.maximum(counts, 1e-12), 1.0)
        for arr in (sums, squares, *more):
            arr *= scale
        counts *= scale

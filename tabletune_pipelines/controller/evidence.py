"""The evidence the controller keeps for one published version, and the table search over it.

* acceptance: the step histograms of drafted and kept tokens (``step.count_drafts`` fills them per
  step, nothing allocated), folded into per-position counts at rebuilds and exports, and the
  estimator that blends them with the prior (``core.acceptance_estimate.AcceptanceEstimator``);
* step times: the step intervals observed since the last rebuild (``observations.CostObserver``),
  the corrected profile they are handed to (``step_correction.StepTimeModel``), and the published
  served model with the live workload it is priced under (docs/controller.md, "Served steps");
* the search: the offline tuner's evidence rule (``core.evidence.search_with_evidence``) over the
  corrected step times with their spread and the acceptance estimate with its counts.

Owned by ``logic.Controller``: one per published version (``version.prepare`` builds it), and an
empty one while the controller falls back (counts only). numpy only at rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tabletune_pipelines.controller.loader import ColumnStart, StartPoint
from tabletune_pipelines.controller.observations import CostObserver
from tabletune_pipelines.controller.step import count_drafts, fold, longest
from tabletune_pipelines.controller.step_correction import ServedPrior, StepTimeModel, served_prior
from tabletune_pipelines.core.acceptance_estimate import AcceptanceEstimator, EstimatorConfig
from tabletune_pipelines.core.evidence import SearchSettings, search_with_evidence
from tabletune_pipelines.core.noise import rates_covariance
from tabletune_pipelines.core.stepcost import StepCost, Workload
from tabletune_pipelines.core.steptime import StepTimes, as_covariance
from tabletune_pipelines.formats.controller_settings import ControllerSettings

#: Requests the published workload counts as, against the live ones.
WORKLOAD_PRIOR_REQUESTS = 100.0


class Evidence:
    """What one version has observed. ``max_k``: the engine's K (the histograms' length is K + 1);
    ``estimator``: None without a prior; ``model`` and ``costs``: None without a step-time profile;
    ``served``: the published served model (None without one)."""

    def __init__(self, max_k: int, *, estimator: AcceptanceEstimator | None = None, model: StepTimeModel | None = None,
                 costs: CostObserver | None = None, served: ServedPrior | None = None) -> None:
        self.K = int(max_k)
        self.hist_d = [0] * (self.K + 1)
        """Request-steps by drafts verified (index n), since the last fold."""
        self.hist_a = [0] * (self.K + 1)
        """Request-steps by drafts kept (index m), since the last fold."""
        self.estimator = estimator
        self.model = model
        self.costs = costs
        self.served = served
        self.wl = [0.0, 0.0, 0.0]
        """The live workload: requests admitted, prefill tokens, tokens produced (halved at rebuilds;
        counted only with a published served model, the only thing it prices)."""
        self.on_fold: Callable[[list[int], list[int]], None] | None = None
        """Called with the histograms just before ``take_counts`` empties them (a grid's columns take
        their share: ``columns.Columns.before_fold``)."""
        self._served_cache: tuple[Any, np.ndarray, np.ndarray] | None = None
        self.last_estimate: tuple[float, ...] = ()
        """â at the last rebuild (the table in force was built from it); () before the first."""

    @classmethod
    def build(cls, start: StartPoint, max_k: int, n: int, note: Callable[..., None], *,
              column: ColumnStart | None = None) -> Evidence:
        """The evidence of a validated published file, empty: its prior, its profile, its served model
        (one that cannot be read is told to ``note(key, msg, *args)`` and left out). ``column``: one
        context bucket's evidence instead, started from the bucket's prior and profile (its level's
        decode steps; the served model prices the file's base level and is left out)."""
        s = start.settings
        prior = start.prior if column is None else column.prior
        estimator: AcceptanceEstimator | None = None
        if prior:
            w = float(s.prior_weight)
            if start.prior_count > 0:
                w = min(w, float(start.prior_count))  # a prior is worth no more drafts than it saw
            estimator = AcceptanceEstimator(prior, EstimatorConfig(
                prior_weight=w, halve_after_rebuild=s.halve_after_rebuild, prior_decay=s.prior_decay,
                min_prior_weight=min(float(s.min_prior_weight), w)))
        ks = start.allowed_k
        profile_ms = start.profile_ms if column is None else column.profile_ms
        if profile_ms is None:
            return cls(max_k, estimator=estimator)
        model = StepTimeModel(ks, profile_ms, prior_weight=s.step_time_prior_weight,
                              min_prior_weight=s.step_time_min_prior_weight, max_count=s.step_time_max_count,
                              hysteresis=int(s.hysteresis))
        if column is not None:
            return cls(max_k, estimator=estimator, model=model,
                       costs=CostObserver(ks, profile_ms, float(s.step_time_outlier_ratio), max_k, n, None))
        served = served_prior(start.published.document)
        if isinstance(served, str):
            note("served:" + served, "TableTune controller: published v%d: %s", start.published.version, served)
            served = None
        # Each served step's own prefill priced by the published served model (the one step-cost model).
        extra = (None if served is None else
                 StepCost(ks=tuple(ks), decode_ms=profile_ms, envelope=served.envelope,
                          fits=served.fits).step_extra())
        costs = CostObserver(ks, profile_ms, float(s.step_time_outlier_ratio), max_k, n, extra)
        return cls(max_k, estimator=estimator, model=model, costs=costs, served=served)

    # ------------------------------------------------------------------ counting
    def count_unknown_k(self, step: Any, on_anomaly: Callable[[int, int], None]) -> tuple[int, int, int]:
        """``count_drafts`` for an engine whose output does not say the step's k: (drafted, kept, k),
        k the step's longest draft. A rare path (vLLM versions without ``num_spec_tokens_to_schedule``)."""
        hd, ha = [0] * (self.K + 1), [0] * (self.K + 1)
        drafted, kept, _ = count_drafts(step.spec_tokens, step.req_id_to_index, step.sampled, self.K, hd, ha,
                                        on_anomaly)
        for i, (d, a) in enumerate(zip(hd, ha, strict=True)):
            self.hist_d[i] += d
            self.hist_a[i] += a
        return drafted, kept, longest(hd)

    def take_counts(self, *, always: bool = True) -> tuple[list[int], list[int]]:
        """Fold the histograms into per-position counts (``step.fold``, which empties them), add
        them to the estimator (with ``always`` False only when something was drafted) and return them."""
        if self.on_fold is not None:
            self.on_fold(self.hist_d, self.hist_a)
        d, a = fold(self.hist_d, self.hist_a)
        if self.estimator is not None and (always or any(d)):
            self.estimator.observe_counts(d, a)
        return d, a

    def hand_over_costs(self) -> None:
        """The step intervals observed since the last rebuild go to the step-time model."""
        if self.model is not None and self.costs is not None:
            self.costs.hand_over(self.model)

    # ------------------------------------------------------------------ estimates
    def estimate(self, live_rates: Callable[[], Sequence[float] | np.ndarray]) -> tuple[float, ...]:
        """â_i in force: the last rebuild's (the table was built from it), else the current blend;
        without a prior, ``live_rates()`` (the live counts alone)."""
        if self.last_estimate:
            return self.last_estimate
        rates = self.estimator.estimate() if self.estimator is not None else live_rates()
        return tuple(float(x) for x in rates)

    def workload(self) -> Workload | None:
        """L_in and L_out in force: the published workload blended with the live one (prefill tokens
        and tokens produced per admitted request), the published one counting as
        ``WORKLOAD_PRIOR_REQUESTS`` requests. None without a published workload."""
        if self.served is None:
            return None
        w0, (new, prefill, made) = self.served.workload, self.wl
        W = WORKLOAD_PRIOR_REQUESTS
        return Workload(prompt_tokens=max(1.0, (W * w0.prompt_tokens + prefill) / (W + new)),
                        output_tokens=max(1.0, (W * w0.output_tokens + made) / (W + new)), source="live")

    def _served_extra_prior(self, times: np.ndarray, rates: np.ndarray,
                            allowed_k: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The tuner's served extra (``StepCost.served``) under the live workload. It depends on the
        rates and the workload only (not on the decode surface), and costs 5-10 ms at max_num_seqs
        128 (50+ ms at 1024), so it is recomputed only when the rates move by 0.01 or a workload
        length by 5 %: at steady state almost never."""
        wl = self.workload()
        if wl is None or self.served is None:
            return np.zeros_like(times), np.zeros_like(times)
        key = (tuple(round(float(r), 2) for r in rates), round(float(np.log(wl.prompt_tokens)) / 0.05),
               round(float(np.log(wl.output_tokens)) / 0.05))
        if self._served_cache is None or self._served_cache[0] != key:
            cost = StepCost(ks=tuple(allowed_k), decode_ms=times, envelope=self.served.envelope,
                            fits=self.served.fits).served(rates, wl)
            self._served_cache = (key, cost.extra_ms, cost.var)
        return self._served_cache[1], self._served_cache[2]

    def step_times(self, settings: ControllerSettings, rates: np.ndarray,
                   allowed_k: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """T(B, k) as served, with its (co)variance: the profile corrected by the live observations
        (with ``step_time_correction``), plus what a served step costs over the decode surface: the
        tuner's pricing under the live workload (the one step-cost model, ``core.stepcost``),
        corrected by every served step observed. Needs the step-time model."""
        model, s = self.model, settings
        assert model is not None
        if s.step_time_correction:
            times, var = model.corrected(), model.variance()
        else:
            times, var = model.profile, np.zeros_like(model.profile)
        if self.served is not None or s.step_time_correction:
            e0 = v0 = None
            if self.served is not None:
                e0, v0 = self._served_extra_prior(times, rates, allowed_k)
            if s.step_time_correction:
                extra, xcov = model.served_extra_cov(e0, v0)
            else:
                assert e0 is not None and v0 is not None  # no correction: self.served priced them above
                extra, xcov = e0, v0
            times = np.maximum(times + extra, 1e-6)
            var = as_covariance(var) + as_covariance(xcov)
        return times, var

    def search(self, settings: ControllerSettings, allowed_k: tuple[int, ...], rates: np.ndarray,
               incumbent: np.ndarray) -> Any:
        """The evidence rule revising ``incumbent`` (k per batch size) on this evidence: the
        ``core.evidence.EvidenceTable``. Needs the estimator and the step-time model."""
        est, model, s = self.estimator, self.model, settings
        assert est is not None and model is not None
        times, var = self.step_times(s, rates, allowed_k)
        n_eff = est.prior_weight + est.drafted  # the prior counts as w drafts at every position
        cov = rates_covariance(rates, drafted_per_pos=n_eff.tolist())
        search = SearchSettings(allowed_ks=allowed_k, threshold=float(s.stickiness),
                                confidence=float(s.evidence_confidence), min_range=model.pool_width())
        return search_with_evidence(StepTimes(allowed_k, times, var), rates, rates_cov=cov, settings=search,
                                    incumbent=incumbent,
                                    visits=model.all_count.sum(axis=0) if s.merge_islands else None)

    # ------------------------------------------------------------------ after a rebuild
    def settle(self, settings: ControllerSettings, rates: np.ndarray,
               left: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray, float]:
        """After a rebuild that is installed: halve the live counters (not below ``live_count_floor``
        drafts per position) and decay the prior's weight, halve the live workload, drop the step
        times of the k the table left (``left``: (old, new) k per batch size, or None), decay the
        step-time weights. Returns the live drafted and accepted counts and the prior weight the
        rebuild used (for its log line); ``last_estimate`` becomes ``rates``."""
        est, model, s = self.estimator, self.model, settings
        assert est is not None and model is not None
        drafted_live, accepted_live, w = est.drafted.copy(), est.accepted.copy(), est.prior_weight
        est.rebuild()  # halves the live counters, decays w
        self.wl = [x * 0.5 for x in self.wl]
        if s.halve_after_rebuild and s.live_count_floor > 0:
            # ... but not below the floor: keep max(d / 2, min(d, floor)) draws, same acceptance ratio.
            keep = np.maximum(drafted_live * 0.5, np.minimum(drafted_live, s.live_count_floor))
            scale = np.where(drafted_live > 0, keep / np.maximum(drafted_live, 1e-12), 0.0)
            est.drafted[:] = drafted_live * scale
            est.accepted[:] = accepted_live * scale
        if left is not None:
            model.forget_left(*left)
        model.decay()
        self.last_estimate = tuple(float(x) for x in rates)
        return drafted_live, accepted_live, w

    # ------------------------------------------------------------------ export
    def acceptance_state(self) -> dict[str, Any]:
        """The acceptance part of the controller state: prior weight and live counts."""
        est = self.estimator
        return {"prior_weight": round(est.prior_weight, 4) if est else None,
                "live_drafted": [round(float(x), 1) for x in est.drafted] if est else [],
                "live_accepted": [round(float(x), 1) for x in est.accepted] if est else []}

    def step_time_state(self) -> dict[str, Any]:
        """The step-time part of the controller state: the correction's weight and cells, the served
        steps, the workload in force (each only where there is one)."""
        st: dict[str, Any] = {}
        if self.model is not None:
            st["step_time_weight"] = round(self.model.weight, 4)
            st["step_time"] = self.model.summary()
            st["served_step"] = self.model.served_summary()
        wl = self.workload()
        if wl is not None:
            st["workload"] = {"prompt_tokens": round(wl.prompt_tokens, 2), "output_tokens": round(wl.output_tokens, 2)}
        return st

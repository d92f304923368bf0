"""Derive a draft-length table from a step-time profile and an acceptance prior (no I/O).

The steps (docs/method.md, "Step time T(B, k)", "Table search", "Limitations" 2):

1. Every cell's median with its error (``core.noise``: the repetitions' scatter, shrunk towards
   the profile's pooled scatter), made non-decreasing in B by a fit weighted with the errors, and
   interpolated to every B with the interpolation's own error.
2. The accepted-work correction fitted with two parameters across B and k from the all-accepted
   cells (``core.noise.fit_accepted_work``) and applied only when the fit is significant.
2b. What serving pays (``core.stepcost``): with a workload (the prior's, or one given) the step
   time each k is judged by is E[T(B, k, P)], the decode surface plus the expected prefill and
   graph-mode extra of the steps serving runs there, fitted from the profile's mixed steps and
   the engine's graph envelope; the fits' errors enter the bounds. Without mixed steps on an engine
   with CUDA graphs, the cells whose served steps cross the capture ceiling are listed as
   unmeasured (the ``cuda_graph_headroom`` gate blocks a table that uses them).
3. The table search (``core.evidence.search_with_evidence``): by default k changes only where the
   goodput gain's lower confidence bound, from the cells' errors, the prior's count-based error
   and the interpolation, exceeds the stickiness threshold; ``policy="stickiness"`` is the
   method's 0.5 % rule on point estimates.

The result is a ``DraftLengthTable`` carrying the evidence (boundaries with their gain and
confidence, the k within noise per B, the predicted worst loss with its bounds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune_pipelines.core.evidence import (
    DEFAULT_CONFIDENCE,
    DEFAULT_SEARCH_RULE,
    EvidenceTable,
    SearchSettings,
    search_with_evidence,
)
from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.noise import (
    AcceptedWorkFit,
    NoisySurface,
    corrected_dense,
    fit_accepted_work,
    median_variances,
    rates_covariance,
)
from tabletune_pipelines.core.served_calibration import ServedCalibration
from tabletune_pipelines.core.stepcost import (
    ServedCost,
    StepCost,
    Workload,
    fit_prefill_costs,
    unmeasured_cells,
)
from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.core.table import DEFAULT_STICKINESS, DraftTable, TableChoice
from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidValueError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, StepTimeProfile
from tabletune_pipelines.options import DRAFT_LENGTH, Bound, check_bounds
from tabletune_pipelines.vocab import SearchRule

NO_ERROR_WARNING = ("the profile has no error estimates (no cell has two repetitions to compare): the table "
                    "rests on point estimates and its boundaries are not backed by evidence; profile with "
                    "repetitions >= 2")


@dataclass(frozen=True)
class LevelSearch:
    """The table search at one context level of a (B, ctx) derivation (``tuning.derive_context``)."""

    level: int
    """The context level, tokens: what each request's KV length was held at while its steps were timed."""
    bucket: tuple[int, int]
    """The inclusive context bucket the level stands for (``core.table.context_buckets``), before merging."""
    evidence: EvidenceTable
    """The search's result at this level: chosen k per B, the goodput of every k, the bounds."""
    pooled: bool
    """Whether the level was searched under the pooled prior (no acceptance of its own)."""


@dataclass(frozen=True)
class TunedTable:
    """A derived table together with the predictions and the evidence behind it."""

    table: DraftLengthTable
    """The table as stored and published."""
    choice: TableChoice
    """The search's result: chosen k per B and the goodput of every k."""
    step_ms_dense: np.ndarray
    """T(B, k) used for the search, shape (len(ks), max_num_seqs): E[T(B, k, P)] under the workload
    when there is one (``served``), else the decode surface (the table's ``step_ms``)."""
    corrected: bool
    """Whether the accepted-work correction was applied."""
    evidence: EvidenceTable | None = None
    """Bounds, boundaries, k within noise (``core.evidence``)."""
    accepted_work_fit: AcceptedWorkFit | None = None
    """The correction's fit (None: no all-accepted cells, or the correction was off)."""
    step_ms_sd: np.ndarray | None = None
    """Standard error of ``step_ms_dense``, same shape."""
    cost: StepCost | None = None
    """The step-cost model (decode surface after the corrections, envelope, prefill fits)."""
    served: ServedCost | None = None
    """E[T(B, k, P)] under the workload (None: no workload, the search ran on decode steps)."""
    warnings: tuple[str, ...] = ()
    """What the table's reader should know (no error estimates, wall-timed cells, ...)."""
    by_context: tuple[LevelSearch, ...] = ()
    """The search at each context level, ascending (empty: derived without context levels)."""


@dataclass(frozen=True)
class DeriveOptions:
    """How ``derive_table`` turns a profile and a prior into a table (the defaults are the method's)."""

    allowed_ks: tuple[int, ...] | None = None
    """k values the table may use; None: every k the profile measured."""
    stickiness: float = DEFAULT_STICKINESS
    """The threshold a gain (its lower bound, under ``policy="evidence"``) must exceed for the table to change k."""
    policy: SearchRule = DEFAULT_SEARCH_RULE
    """``evidence``: k changes only where the gain's lower confidence bound clears ``stickiness``;
    ``stickiness``: the method's 0.5 % rule on point estimates."""
    confidence: float = DEFAULT_CONFIDENCE
    """Level of every bound."""
    prior_error: bool = True
    """Include the prior's count-based error in the bounds."""
    correct_accepted_work: bool = True
    """Fit the accepted-work correction from the all-accepted cells (applied where significant)."""
    non_decreasing_in_batch: bool = True
    """Pool measured dips of T over B (noise) away before anything else."""
    workload: Workload | None = None
    """What the traffic brings per request; None: the prior's ``workload`` (None there too: decode steps only)."""
    served_calibration: ServedCalibration | None = None
    """Served wall time per step measured for fixed k at a few loads, which corrects the priced
    E[T(B, k, P)] (``core.served_calibration.ServedCalibration``); None: the price alone. Needs a workload."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # every number of the search (``options.check_bounds``)
        "allowed_ks": dataclasses.replace(DRAFT_LENGTH, optional=True, why="a draft length; null: every profiled k"),
        "stickiness": Bound(0.0, 10.0, why="a fraction of goodput; at 10 another k must be 11 times better, so the "
                                           "table never changes"),
        "confidence": Bound(0.5, 1.0, high_open=True, why="a confidence level; at 1 no bound is finite"),
    }

    def __post_init__(self) -> None:
        if self.allowed_ks is not None:
            object.__setattr__(self, "allowed_ks", tuple(self.allowed_ks))
        check_bounds(self, where="table search options", error=InvalidValueError)


@dataclass(frozen=True)
class _StepSurface:
    """The step times the search judges, with what they were built from (one ``derive_table`` call)."""

    noisy: NoisySurface
    """The profile's all-rejected cells with their errors (non-decreasing in B when asked)."""
    decode_ms: np.ndarray
    """The decode surface after the accepted-work correction, (len(ks), max_num_seqs)."""
    ms: np.ndarray
    """What the search judges: E[T(B, k, P)] under the workload, else ``decode_ms``."""
    cov: np.ndarray
    """Covariance of ``ms`` (the served fits' variance added on the diagonal)."""
    fit: AcceptedWorkFit | None
    """The accepted-work fit (None: no all-accepted cells, or the correction was off)."""
    cost: StepCost
    """The step-cost model around ``decode_ms``."""
    workload: Workload | None
    """The workload the served cost is priced under."""
    served: ServedCost | None
    """E[T(B, k, P)] under ``workload`` (None without one)."""

    @property
    def sd(self) -> np.ndarray:
        """Standard error of ``ms``, same shape."""
        return np.sqrt(np.stack([self.cov[i, i] for i in range(len(self.noisy.ks))]))

    def corrected(self, max_num_seqs: int) -> bool:
        """Whether the accepted-work correction was applied at some batch size."""
        return self.fit is not None and bool(self.fit.applied_at(max_num_seqs).any())


def derive_table(profile: StepTimeProfile, prior: AcceptancePrior,
                 options: DeriveOptions = DeriveOptions(), *, judged: StepTimes | None = None) -> TunedTable:
    """Goodput-best table for ``profile``'s engine under ``prior``'s acceptance (module docstring;
    ``options``: the search's knobs, the corrections and the workload). ``judged``: the surface the
    search judges instead of the profile's own (the base context level's, ``tuning.derive_context``);
    the table's provenance still comes from ``profile``."""
    surface = _step_surface(profile, prior, options)
    ev = _search(surface, prior, options) if judged is None else search_times(judged, prior, options)
    return TunedTable(table=_table_document(profile, prior, options, surface, ev), choice=ev.choice,
                      step_ms_dense=surface.ms if judged is None else judged.ms,
                      corrected=surface.corrected(profile.identity.max_num_seqs), evidence=ev,
                      accepted_work_fit=surface.fit,
                      step_ms_sd=surface.sd if judged is None else np.sqrt(judged.variance()),
                      warnings=_warnings(profile, surface), cost=surface.cost, served=surface.served)


def _step_surface(profile: StepTimeProfile, prior: AcceptancePrior, options: DeriveOptions) -> _StepSurface:
    """Steps 1, 2 and 2b of the module docstring: the surface the search judges, with its covariance."""
    noisy = _decode_cells(profile, prior, options)
    ms, var = noisy.dense_cov(profile.identity.max_num_seqs)
    fit = _accepted_work_fit(profile, noisy, options)
    decode, cov = corrected_dense(ms, var, noisy.ks, prior.rates, fit)
    cost = step_cost(profile, decode, noisy.ks)
    workload = options.workload if options.workload is not None else prior.workload_model()
    if options.served_calibration is not None and workload is None:
        raise InvalidValueError("a served calibration corrects the served price, which needs a workload: give "
                                "DeriveOptions(workload=...) or a prior that carries one")
    served = cost.served(prior.rates, workload, options.served_calibration) if workload is not None else None
    dense = decode
    if served is not None:
        dense = served.ms
        cov = cov.copy()
        for i in range(len(noisy.ks)):
            cov[i, i] = cov[i, i] + served.var[i]
        if served.cross_cov is not None:
            cov = cov + served.cross_cov
    return _StepSurface(noisy=noisy, decode_ms=decode, ms=dense, cov=cov, fit=fit, cost=cost, workload=workload,
                        served=served)


def _decode_cells(profile: StepTimeProfile, prior: AcceptancePrior, options: DeriveOptions) -> NoisySurface:
    """The all-rejected cells with their errors; the prior must have a rate for every k measured."""
    noisy = NoisySurface.from_cells(profile.estimates("reject"))
    if options.non_decreasing_in_batch:
        noisy = noisy.non_decreasing()
    if len(prior.rates) < max(noisy.ks):
        raise InvalidAcceptanceError(
            f"prior {prior.prior_id} has {len(prior.rates)} acceptance rates but the profile measured k up to "
            f"{max(noisy.ks)}; measure acceptance at K = {profile.identity.max_k}"
        )
    return noisy


def _accepted_work_fit(profile: StepTimeProfile, noisy: NoisySurface,
                       options: DeriveOptions) -> AcceptedWorkFit | None:
    """The accepted-work correction's fit from the all-accepted cells (None: none, or the correction is off)."""
    accept = {k: row for k, row in profile.estimates("accept").items() if k in noisy.ks}
    if not (options.correct_accepted_work and accept):
        return None
    flat = [(k, b, c) for k, row in accept.items() for b, c in row.items()]
    variances = median_variances([c for _, _, c in flat])
    accept_var: dict[int, dict[int, float | None]] = {}
    for (k, b, _), v in zip(flat, variances, strict=True):
        accept_var.setdefault(k, {})[b] = v
    return fit_accepted_work(noisy, accept, accept_var, confidence=options.confidence)


def _search(surface: _StepSurface, prior: AcceptancePrior, options: DeriveOptions) -> EvidenceTable:
    """Step 3: the table search on the judged surface."""
    return search_times(_judged_times(surface), prior, options)


def _judged_times(surface: _StepSurface) -> StepTimes:
    """What the search judges, as ``StepTimes``: no covariance when the profile has no error estimates."""
    noisy = surface.noisy
    return StepTimes(noisy.ks, surface.ms, surface.cov if noisy.has_errors else None)


def judged_step_times(profile: StepTimeProfile, prior: AcceptancePrior,
                      options: DeriveOptions = DeriveOptions()) -> StepTimes:
    """The surface ``derive_table`` judges for ``profile`` under ``prior`` (steps 1, 2 and 2b of the
    module docstring): one context level's ``StepTimes``."""
    return _judged_times(_step_surface(profile, prior, options))


def decode_step_times(profile: StepTimeProfile, prior: AcceptancePrior,
                      options: DeriveOptions = DeriveOptions()) -> StepTimes:
    """The decode surface ``derive_table`` stores as the table's ``step_ms`` (after the accepted-work
    correction, before served steps are priced), without errors: one context level's."""
    surface = _step_surface(profile, prior, options)
    return StepTimes(surface.noisy.ks, surface.decode_ms)


def search_times(times: StepTimes, prior: AcceptancePrior | Sequence[float], options: DeriveOptions, *,
                 incumbent: Sequence[int] | None = None) -> EvidenceTable:
    """Step 3 on any judged surface (one context level's, ``tuning.derive_context``): the evidence rule
    under ``prior``'s rates, with their count-based error when the surface has error estimates (bare
    rates carry no counts and are taken as exact). ``incumbent`` (k per B, index B - 1): the table
    this search revises on evidence only (the evidence policy; the stickiness policy ignores it)."""
    if isinstance(prior, AcceptancePrior):
        rates, drafted, drafts = prior.rates, prior.drafted_per_pos, prior.num_drafts
    else:
        rates, drafted, drafts = tuple(float(a) for a in prior), (), 0
    rates_cov = (rates_covariance(rates, drafted, drafts)
                 if options.prior_error and times.cov is not None else None)
    settings = SearchSettings(allowed_ks=options.allowed_ks, threshold=options.stickiness,
                              confidence=options.confidence, policy=options.policy)
    return search_with_evidence(times, rates, rates_cov=rates_cov, settings=settings,
                                incumbent=incumbent if options.policy == "evidence" else None)


def _table_document(profile: StepTimeProfile, prior: AcceptancePrior, options: DeriveOptions,
                    surface: _StepSurface, ev: EvidenceTable) -> DraftLengthTable:
    """The table as stored and published, with its evidence and provenance."""
    ident, ks = profile.identity, surface.noisy.ks
    n = ident.max_num_seqs
    return DraftLengthTable(
        ranges=tuple((lo, hi, k) for lo, hi, k in ev.ranges),
        max_num_seqs=n,
        max_k=ident.max_k,
        identity_key=ident.key,
        prior_id=prior.prior_id,
        acceptance_rates=tuple(float(a) for a in prior.rates),
        predicted_worst_loss=ev.worst_loss,
        # The decode surface: what the controller's clean decode steps and the k = 0 check compare
        # with; the served extra the search added is in served_cost.
        step_ms={str(k): {str(b): float(surface.decode_ms[i, b - 1]) for b in range(1, n + 1)}
                 for i, k in enumerate(ks)},
        search_policy=options.policy,
        confidence=float(options.confidence),
        has_error_estimates=surface.noisy.has_errors,
        predicted_worst_loss_lcb=ev.worst_loss_lcb,
        predicted_worst_loss_ucb=ev.worst_loss_ucb,
        boundaries=ev.boundaries,
        within_noise={str(b): list(k_ok) for b, k_ok in enumerate(ev.within_noise(), start=1)},
        cells_remeasured=len(profile.remeasured()),
        wall_timed_cells=len(profile.wall_timed()),
        accepted_work_fit=_fit_summary(surface.fit, n),
        served_cost=_served_summary(surface.cost, surface.served, surface.workload, ks, ev.ranges, n),
    )


def _warnings(profile: StepTimeProfile, surface: _StepSurface) -> tuple[str, ...]:
    """What the table's reader should know about the evidence behind it."""
    warnings = []
    if not surface.noisy.has_errors:
        warnings.append(NO_ERROR_WARNING)
    wall = profile.wall_timed()
    if wall:
        bs = sorted({c.batch_size for c in wall})
        warnings.append(f"{len(wall)} cell(s) fell back to wall timing (engine timing had too few steps) at B = {bs}")
    fit = surface.fit
    if fit is not None and not fit.significant:
        warnings.append("accepted-work correction " + "; ".join(fit.notes))
    if surface.served is not None and not surface.cost.fits and surface.cost.envelope.has_graphs:
        warnings.append("the profile has no mixed steps: served steps with prefill are priced as pure decode steps; "
                        "profile again with mixed_steps on")
    return tuple(warnings)


def step_cost(profile: StepTimeProfile, decode_ms: np.ndarray, ks: Sequence[int]) -> StepCost:
    """The profile's step-cost model: ``decode_ms`` (K, N) as the decode surface, the identity's
    graph envelope, and the prefill fits of its mixed-step samples (``core.stepcost``)."""
    ks = tuple(int(k) for k in ks)
    n = decode_ms.shape[1]
    env = profile.identity.graph_envelope()
    samples = [s for s in profile.samples if s.k in ks and 1 <= s.batch <= n]
    fits = fit_prefill_costs(samples, lambda k, b: decode_ms[ks.index(k), b - 1], env) if samples else {}
    return StepCost(ks=ks, decode_ms=decode_ms, envelope=env, fits=fits)


#: Batch sizes (fractions of max_num_seqs) at which the table's provenance shows the served extra.
_SHOWN_AT = (1, 0.25, 0.5, 0.75, 1.0)


def _served_summary(cost: StepCost, served: ServedCost | None, workload: Workload | None, ks: Sequence[int],
                    ranges: Sequence[Sequence[int]], n: int) -> dict:
    """The table's ``served_cost`` provenance (empty without a workload)."""
    if served is None or workload is None:
        return {}
    dense_k = DraftTable.from_entries([list(r) for r in ranges]).vllm_lookup(n, max(ks))[1:]
    bs = sorted({max(1, min(n, int(round(f * n)) if isinstance(f, float) else f)) for f in _SHOWN_AT})
    return {
        "workload": workload.to_dict(),
        **cost.summary(),
        "extra_ms": {str(k): {str(b): round(float(served.extra_ms[i, b - 1]), 4) for b in bs}
                     for i, k in enumerate(ks)},
        "arrivals_per_step": {str(k): {str(b): round(float(served.arrivals[i, b - 1]), 4) for b in bs}
                              for i, k in enumerate(ks)},
        "unmeasured": [[b, k, round(p, 4)] for b, k, p in unmeasured_cells(served, ks, dense_k)],
        "unmeasured_cliff": [[b, k, round(p, 4)] for b, k, p in unmeasured_cells(served, ks, dense_k, cliff_only=True)],
        **({} if served.calibration is None or served.offset_ms is None else {"calibration": {
            **served.calibration.to_dict(),
            "offset_ms": {str(k): {str(b): round(float(served.offset_ms[i, b - 1]), 4) for b in bs}
                          for i, k in enumerate(ks)}}}),
    }


def _fit_summary(fit: AcceptedWorkFit | None, max_num_seqs: int) -> dict:
    """The fit's figures plus the batch-size ranges where it was applied (``[[start, end], ...]``)."""
    if fit is None:
        return {}
    out = dict(fit.summary())
    on = fit.applied_at(max_num_seqs)
    runs: list[list[int]] = []
    for b, flag in enumerate(on, start=1):
        if flag and runs and runs[-1][1] == b - 1:
            runs[-1][1] = b
        elif flag:
            runs.append([b, b])
    out["applied_at_batch_sizes"] = runs
    return out


def table_step_and_tau(table: DraftLengthTable) -> tuple[np.ndarray, np.ndarray]:
    """Per B (index B-1): the step time of the table's k and tau of that k."""
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    taus = tau_curve(table.acceptance_rates)
    t = np.array([table.step_ms[str(k)][str(b)] for b, k in enumerate(dense_k, start=1)])
    tau = np.array([taus[k] for k in dense_k])
    return t, tau

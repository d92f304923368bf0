"""Which CUDA-graph envelope to serve: vLLM's default capture ceiling or a raised one, with figures.

A table is right only for the envelope it was priced on (docs/engine-facts.md, "Served steps are not
profiled steps"), so the question is answered per envelope, each from its own profile (the ceiling
is fixed at launch: one profile per engine identity, the two identities differing only in the
envelope):

1. ``raised_ceiling``: the one raised ceiling to compare, the smallest on vLLM's capture grid that
   holds a decode step at max_num_seqs and K, B·(1 + K) tokens, plus the prefill the workload admits
   per step (the 99th percentile of the Poisson arrivals ``core.stepcost`` prices, times the prompt
   length, within the token budget); without a workload twice the decode step (vLLM's own rule
   without its 512 cap: 1024 at max_num_seqs 128 and K = 3). None when the default already holds it.
2. ``compare_envelopes``: for each envelope, the table ``tuning.derive.derive_table`` derives from
   its profile under the one prior (and that identity's served calibration, if any), and the
   predicted served goodput at each load L: G(L, k_table(L)) = L·τ(k)/E[T(L, k, P)], the derive's
   own served price (one step-cost model). Its standard error comes from the derive's step-time
   errors (cells, interpolation, prefill fits, calibration) and the prior's count error; the two
   profiles come from two launches, so the ratio between envelopes is unpaired (variances added),
   while the prior is shared (its error enters through τ(k_raised) / τ(k_default) only).
3. The recommendation: judged like a table (docs/method.md, "How a table is judged"), each
   envelope's worst loss over the loads against the better envelope at that load; the smaller wins.
   A raised ceiling is recommended only when it wins and, at the load that decides (where the
   default loses most), its gain's lower confidence bound is above 1; otherwise the default is kept
   and the reason is printed. Without error estimates the point estimates decide, and the answer says
   it carries no uncertainty.

The cost of the raised ceiling (capture time, graph memory, the KV cache left) is read from each
launch's log (``engine.envelope_log.capture_cost``) and printed beside the answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.noise import rates_covariance, z_value
from tabletune_pipelines.core.stepcost import Workload, default_capture_ceiling
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity, StepTimeProfile
from tabletune_pipelines.formats.identity_match import ENVELOPE_FIELDS, capture_grid_ceil
from tabletune_pipelines.tuning.derive import DeriveOptions, TunedTable, derive_table

PREFILL_QUANTILE = 0.99
"""Share of steps whose arrivals the raised ceiling holds (Poisson, as ``core.stepcost`` prices them)."""


def _poisson_quantile(lam: float, q: float) -> int:
    """The smallest n with P(N <= n) >= q for N ~ Poisson(lam)."""
    if lam <= 0:
        return 0
    pmf = math.exp(-lam)
    cdf, n = pmf, 0
    while cdf < q and n < 100_000:
        n += 1
        pmf *= lam / n
        cdf += pmf
    return n


def raised_ceiling(max_num_seqs: int, max_k: int, *, rates: Sequence[float] | None = None,
                   workload: Workload | None = None, max_num_batched_tokens: int | None = None,
                   quantile: float = PREFILL_QUANTILE) -> int | None:
    """The raised capture ceiling to compare with vLLM's default (module docstring, 1); None when the
    default ceiling already holds a full decode step at K plus that prefill."""
    m, k = int(max_num_seqs), int(max_k)
    decode = m * (1 + k)
    if workload is not None and rates is not None:
        lam = float(workload.arrivals_per_step(m, float(tau_curve(rates)[k])))
        prefill = _poisson_quantile(lam, quantile) * float(workload.prompt_tokens)
    else:
        prefill = decode  # vLLM's rule, min(max_num_seqs·(1 + K)·2, 512), without its cap
    if max_num_batched_tokens is not None:
        prefill = min(prefill, max(int(max_num_batched_tokens) - decode, 0))
    ceiling = capture_grid_ceil(math.ceil(decode + prefill))
    if max_num_batched_tokens is not None:  # vLLM caps the ceiling at the budget
        ceiling = min(ceiling, int(max_num_batched_tokens))
    return ceiling if ceiling > default_capture_ceiling(m, k) else None


def raised_identity(identity: EngineIdentity, ceiling: int) -> EngineIdentity:
    """The engine identity of ``identity`` served at capture ceiling ``ceiling`` (its own partition)."""
    return dataclasses.replace(identity, capture_ceiling=int(ceiling))


def envelope_identities(identity: EngineIdentity, *, pinned: bool, rates: Sequence[float] | None = None,
                        workload: Workload | None = None) -> tuple[EngineIdentity, ...]:
    """The identities to profile for one deployment: its own, and the raised ceiling's unless the
    fleet pins the envelope (``max_cudagraph_capture_size`` set: then only the table is tuned), the
    engine captures no graphs, or vLLM's default already holds a full step (``raised_ceiling``)."""
    if pinned or identity.capture_ceiling is None or identity.cudagraph_mode == "none":
        return (identity,)
    ceiling = raised_ceiling(identity.max_num_seqs, identity.max_k, rates=rates, workload=workload,
                             max_num_batched_tokens=identity.max_num_batched_tokens)
    return (identity,) if ceiling is None else (identity, raised_identity(identity, ceiling))


# -- predictions per envelope ------------------------------------------------------------------

@dataclass(frozen=True)
class LoadPrediction:
    """Predicted served goodput of one envelope's table at one load."""

    load: int
    k: int
    """The k the envelope's table runs at this load."""
    goodput: float
    """Tokens per second, L·τ(k)/E[T(L, k, P)]."""
    log_var_step: float
    """Variance of log E[T(L, k, P)] from the derive's step-time errors (0: none)."""


@dataclass(frozen=True)
class EnvelopePrediction:
    """One envelope: its identity, the table derived for it and the goodput predicted per load."""

    label: str
    identity: EngineIdentity
    tuned: TunedTable
    loads: tuple[LoadPrediction, ...]
    cost: Any = None
    """``engine.envelope_log.CaptureCost`` of its launch (None: no log given)."""

    @property
    def ranges(self) -> list[list[int]]:
        return [list(r) for r in self.tuned.table.ranges]

    def at(self, load: int) -> LoadPrediction:
        return next(p for p in self.loads if p.load == load)


def predict_envelope(label: str, profile: StepTimeProfile, prior: AcceptancePrior, loads: Sequence[int],
                     options: DeriveOptions = DeriveOptions(), cost: Any = None) -> EnvelopePrediction:
    """The table ``derive_table`` derives for ``profile``'s envelope and its predicted served
    goodput at each load (the concurrency of a closed loop: the batch size it serves)."""
    tuned = derive_table(profile, prior, options)
    n = profile.identity.max_num_seqs
    ks = list(tuned.choice.ks)
    out = []
    for load in loads:
        if not 1 <= int(load) <= n:
            raise InvalidValueError(f"load {load} is outside 1..max_num_seqs = {n}")
        k = int(tuned.choice.chosen[load - 1])
        i = ks.index(k)
        t = float(tuned.step_ms_dense[i, load - 1])
        sd = 0.0 if tuned.step_ms_sd is None else float(tuned.step_ms_sd[i, load - 1])
        out.append(LoadPrediction(int(load), k, float(tuned.choice.goodput[i, load - 1]), (sd / t) ** 2))
    return EnvelopePrediction(label, profile.identity, tuned, tuple(out), cost)


# -- the comparison ----------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadComparison:
    """The raised envelope's predicted goodput over the default's at one load."""

    load: int
    ratio: float
    """G(raised) / G(default)."""
    se: float | None
    """Standard error of ``ratio`` (None: no error estimates)."""


@dataclass(frozen=True)
class EnvelopeRecommendation:
    """The answer: which envelope to serve, by how much, with what uncertainty, at what cost."""

    default: EnvelopePrediction
    raised: EnvelopePrediction
    comparisons: tuple[LoadComparison, ...]
    worst_loss: Mapping[str, float]
    """Per envelope label: its worst loss over the loads against the better envelope there."""
    winner: str
    """The envelope with the smaller worst loss (point estimates; the default on a tie)."""
    deciding: LoadComparison
    """The load where the loser loses most, as G(winner) / G(loser) with its s.e."""
    decided: bool
    """The winner's gain there has a lower confidence bound above 1 (point estimate without errors)."""
    confidence: float
    z: float

    @property
    def recommended(self) -> str:
        """The raised envelope only when it wins beyond the noise; else the default."""
        return self.winner if (self.winner == self.default.label or self.decided) else self.default.label

    @property
    def recommended_prediction(self) -> EnvelopePrediction:
        return self.raised if self.recommended == self.raised.label else self.default

    @property
    def has_errors(self) -> bool:
        return self.deciding.se is not None

    @property
    def margin(self) -> float:
        """How much smaller the winner's worst loss is than the loser's."""
        loser = self.raised.label if self.winner == self.default.label else self.default.label
        return float(self.worst_loss[loser] - self.worst_loss[self.winner])

    def lines(self) -> list[str]:
        """The answer in a few lines, as the CLI and a GPU run print it."""
        out = []
        for e in (self.default, self.raised):
            ceiling = e.identity.capture_ceiling
            per = ", ".join(f"L{p.load}: k = {p.k} {p.goodput:,.0f} tok/s" for p in e.loads)
            out.append(f"  {e.label} (capture ceiling {ceiling}): table {e.ranges}; {per}; worst loss "
                       f"{self.worst_loss[e.label]:.1%}" + (f"; {e.cost.describe()}" if e.cost is not None else ""))
        for c in self.comparisons:
            se = "" if c.se is None else f" ± {c.se:.3f}"
            out.append(f"  load {c.load}: {self.raised.label} / {self.default.label} = {c.ratio:.3f}{se}")
        d = self.deciding
        gain = f"{d.ratio:.3f}" + ("" if d.se is None else f" ± {d.se:.3f}")
        where = f"at load {d.load}, where the other loses most: {self.winner} / the other = {gain}"
        if d.se is None:
            why = "point estimates only: the profiles carry no error estimates, so the answer has no uncertainty"
        else:
            low = d.ratio * math.exp(-self.z * d.se / d.ratio)
            why = (f"{self.confidence:.0%} lower bound {low:.3f}: "
                   + ("beyond the noise" if self.decided else "within the noise"))
        rec = self.recommended
        verdict = (f"recommended: {rec}" + ("" if rec == self.winner else f" (kept: {self.winner} wins on point "
                                                                         "estimates only)"))
        out.append(f"  {verdict}; worst loss {self.worst_loss[self.winner]:.1%} against {self.margin:.1%} more for "
                   f"the other; {where} ({why})")
        return out


def _same_engine_but_envelope(a: EngineIdentity, b: EngineIdentity) -> None:
    da, db = a.to_dict(), b.to_dict()
    differ = sorted(f for f in set(da) | set(db) if f not in ENVELOPE_FIELDS and da.get(f) != db.get(f))
    if differ:
        raise InvalidValueError(f"the two profiles are of different engines ({', '.join(differ)} differ), not of one "
                                "engine in two graph envelopes")
    if a.capture_ceiling is None or b.capture_ceiling is None:
        raise InvalidValueError("both envelopes need a capture ceiling (an eager engine captures no graphs: there is "
                                "no envelope to choose)")


def compare_envelopes(default: StepTimeProfile, raised: StepTimeProfile, prior: AcceptancePrior, *,
                      loads: Sequence[int] | None = None, options: DeriveOptions = DeriveOptions(),
                      calibrations: Mapping[str, Any] | None = None, costs: Mapping[str, Any] | None = None,
                      labels: tuple[str, str] = ("default", "raised")) -> EnvelopeRecommendation:
    """Derive a table per envelope, predict served goodput per load for each and recommend one
    (module docstring). ``calibrations`` / ``costs``: per identity key, that envelope's served
    calibration and ``CaptureCost`` (its launch log). ``loads`` default to the served verification's
    (1, max_num_seqs / 2, max_num_seqs)."""
    _same_engine_but_envelope(default.identity, raised.identity)
    n = default.identity.max_num_seqs
    loads = tuple(sorted({int(x) for x in (loads or (1, max(1, n // 2), n))}))
    cal, cost = dict(calibrations or {}), dict(costs or {})
    preds = [predict_envelope(label, prof, prior, loads,
                              dataclasses.replace(options, served_calibration=cal.get(prof.identity.key)),
                              cost.get(prof.identity.key))
             for label, prof in zip(labels, (default, raised), strict=True)]
    d, r = preds
    has_errors = any(p.log_var_step > 0 for e in preds for p in e.loads)
    sigma_a = (rates_covariance(prior.rates, prior.drafted_per_pos, prior.num_drafts)
               if has_errors and options.prior_error else None)
    comps = tuple(_ratio(r.at(x), d.at(x), prior.rates, sigma_a, has_errors) for x in loads)
    best = {x: max(d.at(x).goodput, r.at(x).goodput) for x in loads}
    worst = {e.label: max(1.0 - e.at(x).goodput / best[x] for x in loads) for e in preds}
    winner = r.label if worst[r.label] < worst[d.label] else d.label
    loser = d if winner == r.label else r
    at = max(loads, key=lambda x: (1.0 - loser.at(x).goodput / best[x], -x))
    c = next(c for c in comps if c.load == at)
    deciding = c if winner == r.label else LoadComparison(at, 1.0 / c.ratio, None if c.se is None
                                                          else c.se / c.ratio ** 2)
    z = z_value(options.confidence)
    if deciding.se is None:
        decided = deciding.ratio > 1.0
    else:
        decided = math.log(deciding.ratio) - z * deciding.se / deciding.ratio > 0.0
    return EnvelopeRecommendation(d, r, comps, worst, winner, deciding, decided, float(options.confidence), float(z))


def _ratio(raised: LoadPrediction, default: LoadPrediction, rates: Sequence[float], sigma_a: np.ndarray | None,
           has_errors: bool) -> LoadComparison:
    """G(raised) / G(default) at one load with its unpaired standard error (delta method on the log)."""
    ratio = raised.goodput / default.goodput
    if not has_errors:
        return LoadComparison(raised.load, ratio, None)
    var = raised.log_var_step + default.log_var_step
    if sigma_a is not None and raised.k != default.k:
        taus = tau_curve(rates)
        g = np.array([(i <= raised.k) / taus[raised.k] - (i <= default.k) / taus[default.k]
                      for i in range(1, len(rates) + 1)])
        var += float(g @ sigma_a @ g)
    return LoadComparison(raised.load, ratio, ratio * math.sqrt(max(var, 0.0)))


# -- over the store --------------------------------------------------------------------------------

def recommend_from_store(store: Any, default_key: str, raised_key: str, *, settings: Any = None,
                         loads: Sequence[int] | None = None, launch_logs: Mapping[str, Any] | None = None,
                         log: Any = None) -> EnvelopeRecommendation:
    """``compare_envelopes`` over the store's profiles of two identities of one engine (the default
    envelope's and the raised one's, ``envelope_identities``), under the prior a table of the default
    would be derived from (``gates.prior_for_table``), each with its identity's newest served
    calibration, as ``build.build_table`` derives. ``settings``: ``build.BuildSettings`` (None: the
    defaults). ``launch_logs``: per identity key, the server log of that envelope's launch, for the
    capture cost (``engine.envelope_log.capture_cost``)."""
    import logging

    from tabletune_pipelines.engine.envelope_log import capture_cost, read_log
    from tabletune_pipelines.errors import NotFoundError
    from tabletune_pipelines.tuning.build import DefaultBuildSettings, _served_calibration, derive_options
    from tabletune_pipelines.tuning.gates import prior_for_table

    log = log or logging.getLogger(__name__)
    settings = settings or DefaultBuildSettings()
    profiles = {key: store.load_profile(key) for key in (default_key, raised_key)}
    prior, skipped = prior_for_table(store, profiles[default_key].identity, settings.gates().min_prior_drafts)
    if prior is None:
        raise NotFoundError(f"no sane acceptance prior for {default_key}"
                            + (f" ({'; '.join(skipped)})" if skipped else ""))
    calibrations = {key: _served_calibration(store, key, p, prior, log) for key, p in profiles.items()}
    costs = {key: capture_cost(read_log(path)) for key, path in (launch_logs or {}).items()}
    options = derive_options(settings)
    return compare_envelopes(profiles[default_key], profiles[raised_key], prior, loads=loads, options=options,
                             calibrations=calibrations, costs=costs)

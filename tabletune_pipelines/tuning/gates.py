"""The gates that decide whether a profile, a prior or a table may be used: plain functions, plain results.

Each gate returns a ``Gate`` (name, verdict, a sentence that says why, and the figures behind it).
The Dagster layer turns gates into asset-check results; the same functions run again right before
publishing, so a table that failed a blocking gate is never published, whichever run tries.

Blocking gates (``BLOCKING_GATES``): ``profile_complete``, ``prior_sane``, ``valid_for_vllm``,
``predicted_loss_under_threshold``, ``table_supported_by_evidence``, ``cuda_graph_headroom``
(docs/engine-facts.md, "the CUDA-graph capture-size cliff") and, right before publishing,
``served_goodput_verified`` (the table against every fixed k by served goodput in one launch,
``tuning.served_verification``). Warning gates (they never block; they tell an operator where
the method's assumptions may not hold): ``engine_dependence_trap`` (docs/method.md, "Limitations" 1)
and ``k0_costs_vs_no_spec`` (docs/method.md, "Limitations" 3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args

from tabletune_pipelines.core.goodput import tau_curve, validate_acceptance
from tabletune_pipelines.core.stepcost import Workload, default_capture_ceiling
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError, TableTuneError
from tabletune_pipelines.formats.documents import (
    AcceptancePrior,
    DraftLengthTable,
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
)
from tabletune_pipelines.options import COUNT, Bound, check_bounds
from tabletune_pipelines.tuning.derive import table_step_and_tau

if TYPE_CHECKING:
    from tabletune_pipelines.tuning.served_verdict import ServedVerification

GateName = Literal["profile_complete", "prior_sane", "valid_for_vllm", "predicted_loss_under_threshold",
                   "table_supported_by_evidence", "engine_dependence_trap", "k0_costs_vs_no_spec",
                   "cuda_graph_headroom", "served_goodput_verified"]
"""Every gate's name (also the name of its asset check)."""
GATE_NAMES: tuple[str, ...] = get_args(GateName)
BLOCKING_GATES: tuple[GateName, ...] = ("profile_complete", "prior_sane", "valid_for_vllm",
                                        "predicted_loss_under_threshold", "table_supported_by_evidence",
                                        "cuda_graph_headroom", "served_goodput_verified")
"""Gates whose failure stops the pipeline; the others only warn."""
NOT_MEASURED = "NOT MEASURED"
"""How a warning gate's description starts when its inputs were not measured (it then passes)."""


@dataclass(frozen=True)
class Gate:
    """One gate's verdict on one input."""

    name: GateName
    """Which gate (see ``GateName``)."""
    passed: bool
    """True when the input may be used (a warning gate that could not be checked passes)."""
    description: str
    """One sentence: what was found and, on failure, what to do."""
    figures: Mapping[str, Any] = field(default_factory=dict)
    """Numbers, strings and lists behind the verdict (plain JSON values)."""
    comparison: str = ""
    """A markdown table of the figures per batch size ('' when the gate has none)."""
    warning: bool = False
    """The input may be used (``passed``) but the gate could not confirm it: shown as a warning, never
    as a pass (an unverified served verification)."""

    @property
    def blocking(self) -> bool:
        """Whether a failure of this gate stops the pipeline."""
        return self.name in BLOCKING_GATES


@dataclass(frozen=True)
class GateThresholds:
    """Thresholds of the gates (the defaults of the pipeline's TuningSettings resource)."""

    max_predicted_loss: float = 0.03
    """Blocking: a table's predicted worst loss vs the best fixed k at any B must be below this."""
    min_prior_drafts: int = 200
    """Blocking: a prior needs at least this many drafts behind its rates."""
    trap_margin: float = 0.03
    """Warn when the table is this much slower than the best fixed k launched with K = k."""
    k0_margin: float = 0.10
    """Warn when no speculation beats the table, or k = 0 costs, by more than this."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # every threshold (``options.check_bounds``: NaN, inf, a bool refused)
        "max_predicted_loss": Bound(0.0, 1.0, why="a fraction of goodput; 1 lets any table through"),
        "min_prior_drafts": COUNT,
        "trap_margin": Bound(0.0, 1.0, why="a fraction of goodput"),
        "k0_margin": Bound(0.0, 1.0, why="a fraction of goodput"),
    }

    def __post_init__(self) -> None:
        check_bounds(self, where="gate thresholds", error=InvalidValueError)


# -- profiles and priors -----------------------------------------------------------------------

def profile_gate(profile: StepTimeProfile) -> Gate:
    """Every k in 0..K measured at the same batch sizes, from B = 1 up to max_num_seqs."""
    ident = profile.identity
    cells = profile.reject_cells()
    missing_k = sorted(set(range(0, ident.max_k + 1)) - set(cells))
    figures: dict[str, Any] = {"ks_measured": sorted(cells), "cells": len(profile.cells)}
    if missing_k:
        return Gate("profile_complete", False,
                    f"profile of {ident.key} misses k = {missing_k} (needs every k in 0..{ident.max_k}); "
                    "re-run step_time_profile for this partition to measure the missing cells", figures)
    try:
        surface = profile.surface()
        surface.dense(ident.max_num_seqs)
    except TableTuneError as exc:
        return Gate("profile_complete", False, f"profile of {ident.key} is incomplete: {exc}", figures)
    figures["batch_sizes"] = list(surface.batch_sizes)
    wall = profile.wall_timed()
    figures["wall_timed_cells"] = len(wall)
    figures["wall_timed_batch_sizes"] = sorted({c.batch_size for c in wall})
    figures["cells_remeasured"] = len(profile.remeasured())
    figures["has_error_estimates"] = profile.has_error_estimates
    notes = []
    if wall:
        notes.append(f"{len(wall)} cell(s) fell back to wall timing")
    if not profile.has_error_estimates:
        notes.append("no error estimates (one repetition per cell)")
    return Gate("profile_complete", True, f"{len(surface.ks)} k values × {len(surface.batch_sizes)} batch sizes "
                                          f"(1..{surface.max_batch_size})" + (f"; {'; '.join(notes)}" if notes else ""),
                figures)


def prior_gate(prior: AcceptancePrior, max_k: int, min_drafts: int) -> Gate:
    """Rates in [0, 1], non-increasing, at least max_k of them, enough drafts behind them."""
    figures = {"rates": list(prior.rates), "num_drafts": prior.num_drafts}
    try:
        validate_acceptance(prior.rates, name=f"prior {prior.prior_id}")
    except TableTuneError as exc:
        return Gate("prior_sane", False, str(exc), figures)
    if len(prior.rates) < max_k:
        return Gate("prior_sane", False, f"prior {prior.prior_id} has {len(prior.rates)} rates; the engine drafts up "
                                         f"to k = {max_k}", figures)
    if prior.num_drafts < min_drafts:
        return Gate("prior_sane", False, f"prior {prior.prior_id} rests on {prior.num_drafts} drafts; at least "
                                         f"{min_drafts} are needed (log more prompts or lower policy.min_prior_drafts)",
                    figures)
    return Gate("prior_sane", True, f"{prior.prior_id}: a = {[round(a, 3) for a in prior.rates]} from "
                                    f"{prior.num_drafts} drafts", figures)


def first_sane_prior(candidates: Iterable[AcceptancePrior], max_k: int, min_drafts: int
                     ) -> tuple[AcceptancePrior | None, list[str]]:
    """The first candidate that passes ``prior_gate``, and why each one before it was skipped."""
    skipped: list[str] = []
    for prior in candidates:
        gate = prior_gate(prior, max_k, min_drafts)
        if gate.passed:
            return prior, skipped
        skipped.append(gate.description)
    return None, skipped


class PriorSource(Protocol):
    """Where applicable priors come from (``store.TableTuneStore`` is one)."""

    def applicable_priors(self, identity: EngineIdentity) -> list[AcceptancePrior]: ...


def prior_for_table(store: PriorSource, identity: EngineIdentity, min_drafts: int = GateThresholds.min_prior_drafts
                    ) -> tuple[AcceptancePrior | None, list[str]]:
    """The prior a table of ``identity`` is derived from, the one rule (the ``draft_length_table`` asset
    and ``tabletune table``): of the priors that apply to it (``applicable_priors``: its own and those of
    the same model, drafter and method; newest week first, a live prior before a measured one within a
    week), the first that passes ``prior_gate``; and why each one before it was skipped. None when
    no prior passes."""
    return first_sane_prior(store.applicable_priors(identity), identity.max_k, min_drafts)


# -- tables ------------------------------------------------------------------------------------

def loss_gate(table: DraftLengthTable, max_predicted_loss: float) -> Gate:
    """Blocking: the table's predicted worst loss vs the best fixed k at any B is under the threshold.

    With error estimates the gate fails only when the loss's *lower* confidence bound reaches the
    threshold (the loss is real, not noise); without them, when the point estimate does.
    """
    loss = float(table.predicted_worst_loss)
    lcb, ucb = table.predicted_worst_loss_lcb, table.predicted_worst_loss_ucb
    judged = float(lcb) if (table.has_error_estimates and lcb is not None) else loss
    ok = judged < max_predicted_loss
    figures: dict[str, Any] = {"predicted_worst_loss": loss, "threshold": max_predicted_loss}
    if table.has_error_estimates and lcb is not None and ucb is not None:
        figures.update(predicted_worst_loss_lcb=float(lcb), predicted_worst_loss_ucb=float(ucb),
                       confidence=table.confidence)
        conf = f"{table.confidence:.0%}" if table.confidence is not None else "?"
        text = (f"predicted worst loss vs the best fixed k at any batch size: {loss:.2%} ({conf} bounds "
                f"{lcb:.2%}–{ucb:.2%}); " + (f"its lower bound is under the threshold {max_predicted_loss:.2%}"
                                              if ok else f"even its lower bound reaches the threshold "
                                                         f"{max_predicted_loss:.2%}: the loss is real"))
    else:
        text = (f"predicted worst loss vs the best fixed k at any batch size: {loss:.2%} "
                f"({'<' if ok else '>='} threshold {max_predicted_loss:.2%}"
                + ("; no error estimates" if not table.has_error_estimates else "") + ")")
    return Gate("predicted_loss_under_threshold", ok, text, figures)


def evidence_gate(table: DraftLengthTable) -> Gate:
    """Blocking: every boundary of the table is backed by evidence (its gain's lower confidence bound
    exceeds the stickiness threshold; ``core.evidence``). A table whose boundary is not supported
    does not publish, so the previous one stays."""
    name: GateName = "table_supported_by_evidence"
    bounds = table.boundaries
    figures: dict[str, Any] = {"ranges": len(table.ranges),
                               "one_batch_size_ranges": sum(1 for s, e, _ in table.ranges if s == e),
                               "boundaries": [dataclasses.asdict(b) for b in bounds],
                               "search_policy": table.search_policy, "confidence": table.confidence}
    if table.confidence is None:
        if len(table.ranges) == 1:
            return Gate(name, True, f"{NOT_MEASURED}: the table has one range and no recorded evidence", figures)
        return Gate(name, False, "the table was derived without recording the evidence for its "
                                 f"{len(table.ranges) - 1} boundaries; derive it again with this TableTune", figures)
    if not bounds:
        return Gate(name, True, f"one range (k = {table.ranges[0][2]}): no boundary to support", figures)
    if not table.has_error_estimates:
        return Gate(name, True, f"{NOT_MEASURED}: the profile has no error estimates, so the "
                                f"{len(bounds)} boundaries rest on point estimates; profile with repetitions >= 2",
                    figures)
    weak = [b for b in bounds if not b.supported]
    listing = ", ".join(f"B = {b.batch_size}: k {b.from_k}→{b.to_k} gain {b.gain:+.1%} (lower bound "
                        f"{b.gain_lcb:+.1%}, P(> threshold) {b.confidence:.0%})" for b in (weak or bounds))
    if weak:
        return Gate(name, False, f"{len(weak)} of {len(bounds)} boundaries are within noise at "
                                 f"{table.confidence:.0%} confidence ({listing}); not publishing, the previous "
                                 "table stays. Re-profile with more repetitions, or use the evidence search policy",
                    figures)
    return Gate(name, True, f"all {len(bounds)} boundaries are backed by evidence at {table.confidence:.0%} "
                            f"confidence ({listing})", figures)


def table_gates(table: DraftLengthTable, max_predicted_loss: float) -> list[Gate]:
    """vLLM's validation, and the predicted loss threshold (see ``blocking_table_gates`` for all)."""
    gates = []
    try:
        DraftTable.from_entries([list(r) for r in table.ranges], max_num_seqs=table.max_num_seqs, max_k=table.max_k)
        gates.append(Gate("valid_for_vllm", True, f"{len(table.ranges)} ranges cover 1..{table.max_num_seqs}, "
                                                  f"k <= {table.max_k}"))
    except TableTuneError as exc:
        gates.append(Gate("valid_for_vllm", False, f"vLLM would reject the table: {exc}"))
    gates.append(loss_gate(table, max_predicted_loss))
    return gates


def blocking_table_gates(table: DraftLengthTable, max_predicted_loss: float) -> list[Gate]:
    """Every blocking gate of a table (checked again right before publishing)."""
    return [*table_gates(table, max_predicted_loss), evidence_gate(table)]


def engine_dependence_gate(table: DraftLengthTable, fixed_cells: Mapping[int, Mapping[int, float]],
                           margin: float, table_reject_ms: Mapping[int, Mapping[int, float]]) -> Gate:
    """Warn: is the table slower somewhere than the best fixed k launched with K = k (no table)?

    Like is compared with like: both sides use step times measured with every draft rejected
    (``table_reject_ms`` = the profile's cells under the launch K), at the batch sizes both measured.
    ``fixed_cells``: k -> B -> ms of launches with K = k (one k or more: the table is compared with
    the best of the k measured, which the description names; empty = not measured).
    """
    name: GateName = "engine_dependence_trap"
    if not fixed_cells:
        return Gate(name, True, f"{NOT_MEASURED}: the profile has no cells of launches with K = k and no table, so the "
                                "engine-dependence trap (docs/method.md, \"Limitations\" 1) cannot be checked; profile "
                                "in fixed_k mode (EngineResource fixed_k_baseline, or `tabletune profile --mode "
                                "fixed_k`) to measure it", {"status": "not measured"})
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    taus = tau_curve(table.acceptance_rates)
    rows, worst, worst_b = [], 0.0, None
    for b in sorted(set.intersection(*[set(v) for v in fixed_cells.values()])):
        k_table = dense_k[b - 1] if b <= table.max_num_seqs else None
        if k_table is None or b not in table_reject_ms.get(k_table, {}):
            continue
        g_fixed = {k: 1000.0 * b * taus[k] / fixed_cells[k][b] for k in fixed_cells if k < len(taus)}
        best_k = max(g_fixed, key=g_fixed.__getitem__)
        g_table = 1000.0 * b * taus[k_table] / table_reject_ms[k_table][b]
        slow = 1.0 - g_table / g_fixed[best_k]
        rows.append(f"| {b} | {best_k} | {g_fixed[best_k]:.1f} | {g_table:.1f} | {slow:+.1%} |")
        if slow > worst:
            worst, worst_b = slow, b
    figures = {"worst_slowdown": float(worst), "at_batch_size": worst_b or 0, "fixed_k": sorted(fixed_cells)}
    among = f"the best fixed k of {sorted(fixed_cells)} launched with K = k"
    comparison = ("| B | best fixed k (K=k) | its tok/s | table tok/s | table slower by |\n"
                  "|---|---|---|---|---|\n" + "\n".join(rows))
    if worst > margin:
        return Gate(name, False, f"the table is {worst:.1%} slower at B = {worst_b} than {among} and no table "
                                 f"(margin {margin:.0%}): check the engine path before deploying a table", figures,
                    comparison)
    return Gate(name, True, f"the table is never more than {margin:.0%} slower than {among} (worst {worst:.1%})",
                figures, comparison)


def k0_gate(table: DraftLengthTable, no_spec_ms: Mapping[int, float], k0_ms: Mapping[int, float],
            margin: float) -> Gate:
    """Warn: k = 0 is not "off" (docs/method.md, "Limitations" 3). Fails where no speculation beats
    the table by more than ``margin``, or where the table runs k = 0 and k = 0 costs ``margin`` more
    than no speculation (the drafter still runs)."""
    name: GateName = "k0_costs_vs_no_spec"
    if not no_spec_ms:
        return Gate(name, True, f"{NOT_MEASURED}: the profile has no no-speculation baseline cells",
                    {"status": "not measured"})
    t, tau = table_step_and_tau(table)
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    rows, losing, k0_costly, worst_overhead = [], [], [], 0.0
    for b in sorted(no_spec_ms):
        if b > table.max_num_seqs:
            continue
        ns = no_spec_ms[b]
        g_ns, g_table = 1000.0 * b / ns, 1000.0 * b * tau[b - 1] / t[b - 1]
        over = (k0_ms[b] / ns - 1.0) if b in k0_ms else float("nan")
        if b in k0_ms:
            worst_overhead = max(worst_overhead, over)
            if dense_k[b - 1] == 0 and over > margin:
                k0_costly.append(b)
        rows.append(f"| {b} | {dense_k[b - 1]} | {ns:.2f} | {k0_ms.get(b, float('nan')):.2f} | {over:+.1%} | "
                    f"{g_ns * 1000:.0f} | {g_table * 1000:.0f} |")
        if g_ns > g_table * (1.0 + margin):
            losing.append(b)
    figures = {"k0_worst_overhead": float(worst_overhead), "batch_sizes_where_no_spec_wins": losing,
               "batch_sizes_where_table_runs_costly_k0": k0_costly}
    comparison = ("| B | table k | no-spec ms | k=0 ms | k=0 overhead | no-spec tok/s | table tok/s |\n"
                  "|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    bad = sorted(set(losing) | set(k0_costly))
    if bad:
        parts = []
        if losing:
            parts.append(f"no speculation beats the table by more than {margin:.0%} at B = {losing}")
        if k0_costly:
            parts.append(f"the table runs k = 0 at measured B = {k0_costly}, where k = 0 costs more than "
                         f"{margin:.0%} over no speculation (the drafter still runs)")
        advice = ("consider serving without speculation" if min(bad) == 1
                  else f"consider turning speculation off above B = {min(bad) - 1}")
        return Gate(name, False, "; ".join(parts) + f" (k = 0 overhead up to {worst_overhead:.0%}): {advice}",
                    figures, comparison)
    return Gate(name, True, f"the table stays within {margin:.0%} of no speculation everywhere "
                            f"(k = 0 overhead up to {worst_overhead:.0%})", figures, comparison)


#: Tokens of prefill a served decode step typically carries on top of its B·(1 + k) decode tokens
#: (one short arriving prompt, or the start of a chunk).
PREFILL_HEADROOM_TOKENS = 32


def cuda_graph_headroom_gate(table: DraftLengthTable, cudagraph_mode: str, *, capture_size: int | None = None,
                             prefill_tokens: int = PREFILL_HEADROOM_TOKENS) -> Gate:
    """Block a table that puts a k where serving falls off the CUDA graphs and the profile never
    measured what such a step costs (docs/method.md, "What a served step costs").

    A served step carries prefill of arriving requests; above the capture ceiling
    (``capture_size``, default vLLM's rule ``core.stepcost.default_capture_ceiling``) it runs without
    graphs: on an H200 at load 128 k = 3 ran ~3.5x slower per step and lost 50-58% of goodput
    (docs/engine-facts.md). With a workload (``table.served_cost``), the cells are those where the
    table's k crosses the ceiling with probability >= 1% in a transition no mixed-step fit covers
    (``unmeasured_cliff``); where the profile measured steps beyond the ceiling, their cost is in the
    table and the gate passes with the figures. Without a workload, the cells are those where
    B·(1 + k) + ``prefill_tokens`` exceeds the ceiling. Passes without CUDA graphs."""
    name: GateName = "cuda_graph_headroom"
    if str(cudagraph_mode).strip().lower() in ("none", ""):
        return Gate(name, True, "no CUDA graphs in this engine (cudagraph_mode none): nothing to check",
                    {"cudagraph_mode": str(cudagraph_mode)})
    served = table.served_cost or {}
    env = served.get("envelope") or {}
    cap = int(capture_size or env.get("capture_ceiling") or default_capture_ceiling(table.max_num_seqs, table.max_k))
    suggested = table.max_num_seqs * (1 + table.max_k) * 2
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    over_cap = [(b, k) for b, k in enumerate(dense_k, start=1) if k > 0 and b * (1 + k) + prefill_tokens > cap]
    priced = [t for t in (served.get("fits") or {}) if t.endswith(">none") and not t.startswith("none")]
    if served:
        over = [(int(b), int(k)) for b, k, _ in served.get("unmeasured_cliff", [])]
        try:
            basis = f"under the workload of {Workload.from_dict(served['workload']).describe()}"
        except (KeyError, TypeError, TableTuneError):
            basis = "under the table's workload"  # a stored table's provenance without a readable workload
    else:
        over = [] if priced else over_cap
        basis = f"B·(1 + k) + {prefill_tokens} prefill tokens"
    figures = {"capture_size": cap, "prefill_tokens": int(prefill_tokens), "suggested_capture_size": suggested,
               "batch_sizes_over_the_cap": [b for b, _ in over], "batch_sizes_crossing_priced": [
                   b for b, _ in over_cap] if priced else [], "measured_cliff_fits": priced}
    if not over:
        how = (f"; the steps that cross it from B = {over_cap[0][0]} were measured ({', '.join(priced)}) and are "
               "priced into the table") if (over_cap and priced) else ""
        return Gate(name, True, f"every served step of the table that falls off the CUDA graphs ({cap}-token ceiling) "
                                f"has a measured cost ({basis}){how}", figures)
    first_b, first_k = over[0]
    rows = "\n".join(f"| {b} | {k} | {b * (1 + k)} | {cap} |" for b, k in over)
    comparison = "| B | table k | decode tokens B·(1+k) | capture cap |\n|---|---|---|---|\n" + rows
    return Gate(name, False,
                f"from B = {first_b} (k = {first_k}) served steps ({basis}) exceed the largest captured CUDA graph "
                f"({cap} tokens) and run without graphs, and the profile never measured such a step, so the "
                f"table's cost there is a guess (measured on an H200: k = 3 lost ~50% at load 128). Profile with "
                f"mixed steps (mixed_steps: true, the default) so the cost is measured, serve with "
                f"--compilation-config '{{\"max_cudagraph_capture_size\": {suggested}}}' (a new engine identity: "
                f"profile it), or keep k lower at those B", figures, comparison)


def fixed_launch_cells(profile_cells: Iterable[StepTimeCell]) -> dict[int, dict[int, float]]:
    """k -> B -> ms of cells timed under a launch with K = k and no table (``fixed_k`` mode), every
    draft rejected: the engine-dependence gate's baseline (``ProfileOptions.fixed_k_ks`` says which
    k are launched; one is enough for a comparison with that k)."""
    out: dict[int, dict[int, float]] = {}
    for c in profile_cells:
        if c.k is not None and c.k >= 1 and c.acceptance == "reject":
            out.setdefault(c.k, {})[c.batch_size] = c.median_ms
    return out


# -- served verification (docs/evaluation.md, "Served verification") -----------------------------

def served_gate(result: ServedVerification | None, *, disabled_reason: str = "") -> Gate:
    """Blocking: no fixed k serves more than the candidate by over the tolerance at a checked load
    (``tuning.served_verification``; docs/evaluation.md, "Served verification"). A verification that reached no
    verdict somewhere (``unverified``) lets the table through as a warning with its figures. ``result``
    None: not measured (``disabled_reason`` says why), which passes as NOT MEASURED like the other gates."""
    name: GateName = "served_goodput_verified"
    if result is None:
        return Gate(name, True, f"{NOT_MEASURED}: {disabled_reason or 'served verification did not run'}",
                    {"status": "not measured"})
    figures: dict[str, Any] = {
        "loads": sorted(result.plan.loads), "rounds": result.plan.rounds, "window_s": result.plan.window_s,
        "budget_s": result.plan.budget_s, "elapsed_s": round(result.elapsed_s, 1), "budget_cut": result.budget_cut,
        "tolerance": result.tolerance, "verdict": result.verdict, "failed_loads": result.failed_loads,
        "inconclusive_loads": result.inconclusive_loads, "excluded_windows": result.excluded_windows,
        "client_errors": result.client_errors, "rule": result.rule,
        "worst_loss": None if result.worst_loss is None else round(result.worst_loss, 4),
    }
    if result.launch_s is not None:
        figures["launch_s"] = round(result.launch_s, 1)
    if result.acceptance:
        figures["acceptance"] = result.acceptance
    if result.stop_reasons:
        figures["stop_reasons"] = {str(load): why for load, why in result.stop_reasons}
    return Gate(name, result.passed, result.summary(), figures, served_markdown(result),
                warning=result.verdict == "unverified")


def served_markdown(result: ServedVerification) -> str:
    """One row per load: every policy's goodput ± s.e., the best fixed k, the paired ratio and the verdict."""
    pols = list(dict.fromkeys(g.policy for g in result.goodput))
    head = ["load", *[f"{p} (tok/s)" for p in pols], "best fixed", "table / best (paired)", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in result.verdicts:
        cells = []
        for p in pols:
            g = next((x for x in result.goodput if x.policy == p and x.load == v.load), None)
            if g is None or g.rounds == 0:
                cells.append("n/a")
            else:
                cells.append(f"{g.goodput:.1f}" + (f" ± {g.stderr:.1f}" if g.rounds > 1 else ""))
        ratio = ("n/a" if v.ratio is None else f"{v.ratio:.3f}" + (f" ± {v.ratio_se:.3f} ({v.rounds} rounds)"
                                                                    if v.ratio_se is not None else " (1 round)"))
        lines.append(f"| {v.load} | " + " | ".join(cells) + f" | {v.best_fixed or 'n/a'} | {ratio} | {v.status} |")
    return "\n".join(lines)

"""What a pipeline run measures and stores (no Dagster): one engine identity's step-time profile
(``profile_identity``) and one week's measured acceptance priors of the fleet (``measure_week``).

Each returns a plain result that the Dagster layer describes (``orchestration/metadata.py``); a run
that cannot produce what it was asked for raises ``PipelineFailure`` saying what was kept. The
engine is reached through ``deployments.Engine`` (the pipeline's ``EngineResource``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tabletune_pipelines.errors import PipelineFailure, TableTuneError
from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity, StepTimeProfile
from tabletune_pipelines.formats.fleet import Deployment, Fleet
from tabletune_pipelines.formats.prompts import count_prompts
from tabletune_pipelines.tuning.deployments import Engine, deployment_for_identity, resolve_identity
from tabletune_pipelines.tuning.gates import Gate, prior_gate, profile_gate

# -- the step-time profile of one engine identity ----------------------------------------------

@dataclass(frozen=True)
class ProfileRun:
    """One run of ``profile_identity``: the profile as stored now and its gate."""

    identity: EngineIdentity
    deployment: str
    """The deployment of the fleet that runs this identity ('' when none does)."""
    profile: StepTimeProfile
    """Every cell of the identity in the store, those of earlier runs included."""
    cells_before: int
    """Cells already in the store before this run (kept and skipped)."""
    gate: Gate
    """``profile_complete``."""

    @property
    def cells_measured(self) -> int:
        return len(self.profile.cells) - self.cells_before


def profile_identity(store: Any, fleet: Fleet, key: str, engine: Engine, *, deployment: str = "",
                     identity_json: str = "", log: logging.Logger) -> ProfileRun:
    """Profile engine identity ``key`` (``deployments.resolve_identity``: ``identity_json``, else the
    store, else a deployment running it now), resuming from the cells already stored."""
    try:
        identity = resolve_identity(key, identity_json=identity_json, fleet=fleet, known=store.find_identity,
                                    identity_of=engine.current_identity)
        dep = deployment_for_identity(fleet, identity, deployment)
    except TableTuneError as exc:
        raise PipelineFailure(str(exc)) from exc
    store.upsert_identity(identity)
    before = len(store.profile_cells(key))
    log.info(f"profiling {key} ({before} cells already in the store are kept and skipped)")
    try:
        profile = engine.profile(identity, dep, store, log)
    except TableTuneError as exc:
        kept = len(store.profile_cells(key))
        raise PipelineFailure(
            f"profiling engine identity {key} failed: {exc}\n{kept} measured cells of this partition are kept in "
            "DuckDB; re-running the partition resumes from them. Other partitions are untouched.",
            {"identity": key, "cells_kept": kept}) from exc
    return ProfileRun(identity=identity, deployment=dep.name if dep else "", profile=profile, cells_before=before,
                      gate=profile_gate(profile))


# -- the measured acceptance priors of one week ------------------------------------------------

@dataclass(frozen=True)
class MeasuredPrior:
    """One deployment's prior of the week, as stored."""

    deployment: str
    prior: AcceptancePrior
    identity_key: str
    gate: Gate
    """``prior_sane``."""
    sample: dict[str, Any]
    """The sample behind it (``sample_summary``)."""


@dataclass(frozen=True)
class WeekPriors:
    """One run of ``measure_week``."""

    week: str
    measured: tuple[MeasuredPrior, ...]
    without_prompts: tuple[str, ...]
    """One sentence per deployment that has no logged prompts for the week."""

    @property
    def sane(self) -> bool:
        """Whether every measured prior passed ``prior_sane`` (one check over the run's deployments)."""
        return all(m.gate.passed for m in self.measured)

    @property
    def sanity(self) -> str:
        """The check's description: the priors that are not sane, else how many are."""
        bad = [f"{m.deployment}: {m.gate.description}" for m in self.measured if not m.gate.passed]
        return "; ".join(bad) if bad else f"{len(self.measured)} prior(s) sane"


def sample_summary(dep: Deployment, prior: AcceptancePrior, week: str, seed: int = 0) -> dict[str, Any]:
    """The sample behind a prior: mix (``prompt_mixes.sample_mix``; logs without ``mix`` labels count as
    unlabelled), size, and a_i with its 95 % Wilson interval."""
    from tabletune_pipelines.core.acceptance_ci import prior_intervals
    from tabletune_pipelines.formats.prompt_mixes import sample_mix

    ivs = prior_intervals(prior)
    return {"mix": sample_mix(dep.prompts_file(week), dep.max_prompts, seed), "prompt_count": prior.prompt_count,
            "num_drafts": prior.num_drafts,
            "a": [{"value": round(iv.value, 4), "ci95": [round(iv.lo, 4), round(iv.hi, 4)]} for iv in ivs]}


def measure_week(store: Any, fleet: Fleet, week: str, engine: Engine, *, deployments: Sequence[str] = (),
                 min_drafts: int, log: logging.Logger) -> WeekPriors:
    """Measure and store the acceptance prior of each deployment (``deployments``, default every one)
    on its logged prompts of ``week``. A deployment without prompts is noted; a failed measurement,
    or no prior at all, is a ``PipelineFailure`` (the priors measured before it stay stored)."""
    deps = [fleet.deployment(n) for n in deployments] if deployments else list(fleet.deployments)
    measured, no_prompts, failures = [], [], []
    for dep in deps:
        prompts = dep.prompts_file(week)
        if not prompts.exists():
            msg = f"{dep.name}: no logged prompts for the week of {week} ({prompts} does not exist)"
            log.warning(msg)
            no_prompts.append(msg)
            continue
        try:
            n = count_prompts(prompts)
            identity = engine.current_identity(dep)
            log.info(f"{dep.name}: measuring acceptance on {n} logged prompts of {week} ({identity.key})")
            prior = engine.measure_acceptance(identity, dep, prompts, week, log)
        except TableTuneError as exc:
            log.error(f"{dep.name}: acceptance measurement failed: {exc}")
            failures.append(f"{dep.name}: {exc}")
            continue
        store.write_acceptance_prior(prior, store.upsert_identity(identity))
        measured.append((dep, prior, identity.key, prior_gate(prior, identity.max_k, min_drafts)))
    if not measured:
        raise PipelineFailure(
            f"no acceptance prior measured for the week of {week}:\n" + "\n".join(no_prompts + failures)
            + "\nThe previous priors and published tables are unchanged.",
            {"week": week, "deployments_without_prompts": len(no_prompts), "failures": len(failures)})
    if failures:
        raise PipelineFailure(
            f"acceptance measurement failed for {len(failures)} deployment(s) in the week of {week}:\n"
            + "\n".join(failures) + f"\nMeasured and stored: {[m[0].name for m in measured]}",
            {"week": week, "measured": [m[0].name for m in measured]})
    seed = int(engine.acceptance_options.get("seed", 0))
    return WeekPriors(week=week, without_prompts=tuple(no_prompts), measured=tuple(
        MeasuredPrior(dep.name, prior, key, gate, sample_summary(dep, prior, week, seed))
        for dep, prior, key, gate in measured))

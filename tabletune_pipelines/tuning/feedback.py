"""The controller's live counters of a week → a ``live`` acceptance prior.

Everything but ``ingest_live_counters`` is pure (no I/O); that one runs the week for a fleet: it
reads each deployment's counters file, makes its live prior and stores it.

The controller inside vLLM exports drafted/accepted counts per draft position in windows
(``tabletune_pipelines.formats.live_counters``). A week's windows are summed and blended with the latest
measured prior as ``w`` observations: â_i = (w·a_i + accepted_i) / (w + drafted_i)
(docs/method.md, "Online controller"). Without a usable measured prior the live rates stand alone.

A window is counted once however often it was exported (``unique_windows``), and a window with
more draft positions than the deployment's ``max_k`` is refused: it cannot come from its engine.

Counts of one engine only: every window names the engine identity that counted it (``identity_key``,
from the published table the controller served). One ``live_counters`` file can hold windows of two
engines — a deployment upgraded mid-week (another vLLM, K or max_num_seqs, another GPU) keeps its
file — and acceptance measured on one engine is no prior for another. ``live_prior`` given the
deployment's current identity key keeps that engine's windows only and says how many of other
engines (and without a key) it left out (``EngineWindows``); without a key it refuses windows of
several engines rather than pooling them. Leaving out, not refusing, is what the pipeline does: a
mid-week upgrade should not cost the week's feedback of the engine that now runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from tabletune_pipelines.core.acceptance_estimate import AcceptanceEstimator, EstimatorConfig, rates_from_counts
from tabletune_pipelines.errors import InvalidValueError, LiveCountersError, PipelineFailure, TableTuneError
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.formats.live_counters import CounterWindow, read_live_counters

if TYPE_CHECKING:
    from tabletune_pipelines.formats.fleet import Fleet
    from tabletune_pipelines.tuning.deployments import Engine


@dataclass(frozen=True)
class LivePrior:
    """A week's live prior of one deployment and what it was made from."""

    prior: AcceptancePrior
    """The prior to store (``source = "live"``)."""
    windows: int
    """Counter windows of the week that went into it."""
    drafted: tuple[int, ...]
    """Drafts per position summed over the windows."""
    accepted: tuple[int, ...]
    """Accepted drafts per position summed over the windows."""
    blended_with: str | None
    """Id of the measured prior the counts were blended with; None when they stand alone."""
    prior_weight: float
    """w: how many observations the measured prior counted as in the blend."""
    identity_key: str | None
    """Engine identity whose windows were counted (the key asked for; else the one the windows name)."""
    left_out: dict[str, int] = dataclasses.field(default_factory=dict)
    """Windows of other engines that were not counted: identity key ('' = none recorded) -> windows."""

    @property
    def basis(self) -> str:
        """How the rates were made, in words."""
        if self.blended_with:
            return f"blended with {self.blended_with} (w = {self.prior_weight:g})"
        return "live counters only (no measured prior; never-drafted positions count as 0)"


def unique_windows(windows: Iterable[CounterWindow]) -> list[CounterWindow]:
    """The windows with each exported window once (same writer, number, start and end, same
    counts), in their first order. ``read_live_counters`` drops such duplicates too (and refuses
    two different windows with the same key); this keeps a list of windows from anywhere honest."""
    out: list[CounterWindow] = []
    seen: set[CounterWindow] = set()
    for w in windows:
        key = dataclasses.replace(w, controller=None)  # the free-form state is not hashable
        if key not in seen:
            seen.add(key)
            out.append(w)
    return out


def windows_in_week(windows: Iterable[CounterWindow], deployment: str, start: datetime, end: datetime
                    ) -> list[CounterWindow]:
    """The deployment's windows whose end falls in [start, end)."""
    return [w for w in windows if w.deployment == deployment and start <= w.window_end < end]


@dataclass(frozen=True)
class EngineWindows:
    """Windows split by the engine that counted them."""

    identity_key: str
    """The engine whose windows are kept."""
    kept: tuple[CounterWindow, ...]
    """Windows of that engine, in their order."""
    left_out: dict[str, int]
    """Other engines' windows: identity key ('' = the window names none) -> how many."""

    @property
    def left_out_count(self) -> int:
        return sum(self.left_out.values())

    def describe_left_out(self) -> str:
        """``"3 window(s) of other engines left out (only KEY is counted): KEY2 (2), without an identity
        key (1)"``, or '' when none was."""
        if not self.left_out:
            return ""
        parts = [f"{k} ({n})" if k else f"without an identity key ({n})" for k, n in sorted(self.left_out.items())]
        return (f"{self.left_out_count} window(s) of other engines left out (only {self.identity_key} is counted): "
                + ", ".join(parts))


def windows_of_engine(windows: Iterable[CounterWindow], identity_key: str) -> EngineWindows:
    """Keep the windows counted by engine ``identity_key``; count the others per key."""
    kept: list[CounterWindow] = []
    left_out: dict[str, int] = {}
    for w in windows:
        if w.identity_key == identity_key:
            kept.append(w)
        else:
            left_out[w.identity_key or ""] = left_out.get(w.identity_key or "", 0) + 1
    return EngineWindows(identity_key=identity_key, kept=tuple(kept), left_out=left_out)


def live_prior(deployment: str, week: str, windows: Sequence[CounterWindow], *, max_k: int,
               measured: AcceptancePrior | None, prior_weight: float, counters_fingerprint: str,
               identity_key: str | None = None) -> LivePrior | None:
    """The live prior of ``deployment`` for ``week`` from that week's ``windows`` (None if none count).

    ``measured``: the latest measured prior of the deployment; used as the blend's prior when it
    has a rate for every position the controller counted. ``counters_fingerprint``: digest of the
    counters file, so the prior id changes when the counts do. ``identity_key``: the deployment's
    current engine identity; only its windows count (``LivePrior.left_out`` says what was not).
    Without it, windows naming several engines are refused (``InvalidValueError``), never pooled.
    """
    windows = unique_windows(windows)
    left_out: dict[str, int] = {}
    if identity_key is not None:
        split = windows_of_engine(windows, identity_key)
        windows, left_out = list(split.kept), split.left_out
    else:
        keys = sorted({w.identity_key or "" for w in windows})
        if len(keys) > 1:
            raise InvalidValueError(
                f"live counters of {deployment!r} for the week of {week} mix windows of {len(keys)} engines ("
                + ", ".join(k or "no identity key" for k in keys) + "); acceptance of one engine is no prior for "
                "another: name the deployment's current engine identity to count its windows only")
        identity_key = (keys[0] or None) if keys else None
    if not windows:
        return None
    for w in windows:
        if len(w.drafted_per_pos) > max_k:
            raise InvalidValueError(
                f"live counters of {deployment!r}: the window ending {w.window_end.isoformat()} has "
                f"{len(w.drafted_per_pos)} draft positions, but the deployment's max_k is {max_k}")
    k = max_k
    drafted, accepted = np.zeros(k), np.zeros(k)
    for w in windows:
        drafted[: len(w.drafted_per_pos)] += w.drafted_per_pos
        accepted[: len(w.accepted_per_pos)] += w.accepted_per_pos
    blended_with = None
    if measured is not None and len(measured.rates) >= k:
        est = AcceptanceEstimator(measured.rates[:k], EstimatorConfig(prior_weight=prior_weight,
                                                                      halve_after_rebuild=False))
        est.observe_counts(drafted, accepted)
        rates = est.estimate()
        blended_with = measured.prior_id
    else:
        rates = rates_from_counts(accepted, drafted, undrafted="zero")
    prior = AcceptancePrior(
        rates=tuple(float(r) for r in rates), num_drafts=int(sum(w.num_drafts for w in windows)),
        drafted_per_pos=tuple(int(x) for x in drafted), accepted_per_pos=tuple(int(x) for x in accepted),
        prompt_fingerprint=hashlib.sha256((counters_fingerprint + week + deployment).encode()).hexdigest(),
        prompt_count=0, source="live", week=week, deployment=deployment,
    )
    return LivePrior(prior=prior, windows=len(windows), drafted=prior.drafted_per_pos,
                     accepted=prior.accepted_per_pos, blended_with=blended_with,
                     prior_weight=prior_weight, identity_key=identity_key, left_out=left_out)


# -- the week of a fleet: files in, live priors stored ---------------------------------------------

@dataclass(frozen=True)
class IngestedCounters:
    """One deployment's live prior of the week, as stored."""

    deployment: str
    live: LivePrior
    prior_id: str
    left_out: int
    """Windows of other engines in the file's week that were not counted."""


@dataclass(frozen=True)
class LiveWeek:
    """One run of ``ingest_live_counters``."""

    week: str
    ingested: tuple[IngestedCounters, ...]
    notes: tuple[str, ...]
    """One sentence per deployment without a live prior (no file, no windows, engine unknown)."""
    left_out: dict[str, dict[str, int]]
    """Per deployment, windows of other engines left out: identity key ('' = none recorded) -> windows."""

    @property
    def windows_left_out(self) -> int:
        return sum(n for per in self.left_out.values() for n in per.values())


def ingest_live_counters(store: Any, fleet: Fleet, week: str, bounds: tuple[datetime, datetime], engine: Engine, *,
                         deployments: Sequence[str] = (), prior_weight: float, log: logging.Logger) -> LiveWeek:
    """The live prior of ``week`` (windows ending in ``bounds``, [start, end)) of each deployment
    (``deployments``, default every one), from its ``live_counters`` file and its current engine's
    windows only, blended with its latest measured prior, and stored. An unreadable file is a
    ``PipelineFailure``; the priors stored before it stay."""
    deps = [fleet.deployment(n) for n in deployments] if deployments else list(fleet.deployments)
    ingested, notes, left_out = [], [], {}
    for dep in deps:
        if dep.live_counters is None:
            notes.append(f"{dep.name}: no live_counters file configured")
            continue
        if not dep.live_counters.exists():
            notes.append(f"{dep.name}: {dep.live_counters} does not exist yet (no controller export)")
            continue
        try:
            identity = engine.current_identity(dep)
        except TableTuneError as exc:  # counts of an engine we cannot name cannot be attributed to it
            notes.append(f"{dep.name}: live counters not read: the engine it runs could not be learned ({exc})")
            continue
        try:
            read = read_live_counters(dep.live_counters, max_k=dep.max_k)
            split = windows_of_engine(windows_in_week(read.windows, dep.name, *bounds), identity.key)
            live = live_prior(dep.name, week, split.kept, max_k=dep.max_k,
                              measured=store.latest_measured_prior(dep.name, up_to_week=week),
                              prior_weight=prior_weight, counters_fingerprint=read.fingerprint,
                              identity_key=identity.key)
        except (LiveCountersError, InvalidValueError) as exc:
            raise PipelineFailure(f"{dep.name}: unreadable live counters: {exc}") from exc
        if split.left_out:
            left_out[dep.name] = split.left_out
            log.warning(f"{dep.name}: {split.describe_left_out()}")
        if read.skipped_partial_last_line:
            log.warning(f"{dep.name}: skipped half-written line(s) {list(read.skipped_lines)} of {dep.live_counters}")
        if read.duplicates:
            log.warning(f"{dep.name}: {read.duplicates} window(s) of {dep.live_counters} were exported twice; "
                        "each is counted once")
        if live is None:
            notes.append(f"{dep.name}: no counter windows of {identity.key} ending in the week of {week}"
                         + (f" ({split.left_out_count} of other engines left out)" if split.left_out else ""))
            continue
        if live.blended_with is None:
            log.warning(f"{dep.name}: {live.basis}")
        pid = store.write_acceptance_prior(live.prior, store.upsert_identity(identity))
        ingested.append(IngestedCounters(dep.name, live, pid, split.left_out_count))
    for n in notes:
        log.info(n)
    return LiveWeek(week=week, ingested=tuple(ingested), notes=tuple(notes), left_out=left_out)

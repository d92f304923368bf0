"""The controller's live counters of a week → a ``live`` acceptance prior (no I/O).

The controller inside vLLM exports drafted/accepted counts per draft position in windows
(``tabletune_pipelines.live_counters``). A week's windows are summed and blended with the latest
measured prior as ``w`` observations: â_i = (w·a_i + accepted_i) / (w + drafted_i)
(docs/method.md, "Online controller"). Without a usable measured prior the live rates stand alone.

A window is counted once however often it was exported (``unique_windows``), and a window with
more draft positions than the deployment's ``max_k`` is refused: it cannot come from its engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from tabletune_pipelines.core.acceptance import AcceptanceEstimator, EstimatorConfig
from tabletune_pipelines.documents import AcceptancePrior
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.live_counters import CounterWindow


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
    """Engine identity the controller reported in the week's last window (None if it did not)."""

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


def live_prior(deployment: str, week: str, windows: Sequence[CounterWindow], *, max_k: int,
               measured: AcceptancePrior | None, prior_weight: float, counters_fingerprint: str) -> LivePrior | None:
    """The live prior of ``deployment`` for ``week`` from that week's ``windows`` (None if there are none).

    ``measured``: the latest measured prior of the deployment; used as the blend's prior when it
    has a rate for every position the controller counted. ``counters_fingerprint``: digest of the
    counters file, so the prior id changes when the counts do.
    """
    windows = unique_windows(windows)
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
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0)
        rates = np.minimum.accumulate(np.clip(rates, 0.0, 1.0))
    prior = AcceptancePrior(
        rates=tuple(float(r) for r in rates), num_drafts=int(sum(w.num_drafts for w in windows)),
        drafted_per_pos=tuple(int(x) for x in drafted), accepted_per_pos=tuple(int(x) for x in accepted),
        prompt_fingerprint=hashlib.sha256((counters_fingerprint + week + deployment).encode()).hexdigest(),
        prompt_count=0, source="live", week=week, deployment=deployment,
    )
    return LivePrior(prior=prior, windows=len(windows), drafted=prior.drafted_per_pos,
                     accepted=prior.accepted_per_pos, blended_with=blended_with,
                     prior_weight=prior_weight, identity_key=windows[-1].identity_key or None)

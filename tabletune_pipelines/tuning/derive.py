"""Derive a draft-length table from a step-time profile and an acceptance prior (no I/O).

The search itself is ``core.table.build_table`` (docs/method.md, "Table search"); this module
prepares its inputs from the stored documents and wraps the result as a ``DraftLengthTable``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.steptime import accepted_work_correction
from tabletune_pipelines.core.table import DEFAULT_STICKINESS, TableChoice, build_table, expand_table
from tabletune_pipelines.documents import AcceptancePrior, DraftLengthTable, StepTimeProfile
from tabletune_pipelines.errors import InvalidAcceptanceError


@dataclass(frozen=True)
class TunedTable:
    """A derived table together with the predictions behind it."""

    table: DraftLengthTable
    """The table as stored and published."""
    choice: TableChoice
    """The search's result: chosen k per B and the goodput of every k."""
    step_ms_dense: np.ndarray
    """T(B, k) used for the search, shape (len(ks), max_num_seqs)."""
    corrected: bool
    """Whether the accepted-work correction was applied."""


def derive_table(
    profile: StepTimeProfile,
    prior: AcceptancePrior,
    *,
    allowed_ks: Iterable[int] | None = None,
    stickiness: float = DEFAULT_STICKINESS,
    correct_accepted_work: bool = True,
    non_decreasing_in_batch: bool = True,
) -> TunedTable:
    """Goodput-best table for ``profile``'s engine under ``prior``'s acceptance.

    With ``correct_accepted_work`` and all-accepted cells in the profile, step times include the
    work that grows with accepted tokens (docs/method.md, "Limitations" 2). With
    ``non_decreasing_in_batch``, measured dips of T over B (noise) are pooled away first.
    """
    ident = profile.identity
    surface = profile.surface()
    if non_decreasing_in_batch:
        surface = surface.non_decreasing()
    rates = prior.rates
    if len(rates) < max(surface.ks):
        raise InvalidAcceptanceError(
            f"prior {prior.prior_id} has {len(rates)} acceptance rates but the profile measured k up to "
            f"{max(surface.ks)}; measure acceptance at K = {ident.max_k}"
        )
    accept = profile.accept_cells()
    corrected = bool(correct_accepted_work and accept)
    dense = (accepted_work_correction(surface, accept, rates, ident.max_num_seqs) if corrected
             else surface.dense(ident.max_num_seqs))
    choice = build_table(surface, rates, ident.max_num_seqs, allowed_ks=allowed_ks, stickiness=stickiness,
                         step_ms_dense=dense)
    table = DraftLengthTable(
        ranges=tuple(tuple(r) for r in choice.ranges),
        max_num_seqs=ident.max_num_seqs,
        max_k=ident.max_k,
        identity_key=ident.key,
        prior_id=prior.prior_id,
        acceptance_rates=tuple(float(a) for a in rates),
        predicted_worst_loss=choice.worst_loss_vs_fixed(),
        step_ms={str(k): {str(b): float(dense[i, b - 1]) for b in range(1, ident.max_num_seqs + 1)}
                 for i, k in enumerate(surface.ks)},
    )
    return TunedTable(table=table, choice=choice, step_ms_dense=dense, corrected=corrected)


def table_step_and_tau(table: DraftLengthTable) -> tuple[np.ndarray, np.ndarray]:
    """Per B (index B-1): the step time of the table's k and tau of that k."""
    dense_k = expand_table([list(r) for r in table.ranges], table.max_num_seqs, table.max_k)
    taus = tau_curve(table.acceptance_rates)
    t = np.array([table.step_ms[str(k)][str(b)] for b, k in enumerate(dense_k, start=1)])
    tau = np.array([taus[k] for k in dense_k])
    return t, tau

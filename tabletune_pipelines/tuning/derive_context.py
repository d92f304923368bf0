"""Derive a (B, ctx) draft-length table from a step-time surface per context level (no I/O).

A context level is a token count each request's KV length was held at while its decode steps were
timed; the surface is ``{level: StepTimes}`` (``core.steptime.StepTimes``, what the table search
judges at that level). The shortest level gets today's batch-only search with the evidence rule
(``tuning.derive.search_times``); each longer level revises the table of the level below it with the
same rule, as the controller revises the table in force: a k changes at (B, level) only where
another k beats the shorter level's k there beyond the evidence threshold. So context changes the
table only where the measurement says it does; a lead the noise could flip keeps the shorter
level's k (a tie keeps the incumbent). Each level is judged under its own acceptance where it has
one, the pooled prior where it does not. The chosen k per B of every level become one
``DraftTable`` over the context buckets ``core.table.context_buckets(levels, max_model_len)``,
adjacent buckets whose k agree at every B merged (``DraftTable.from_columns``). One bucket left,
the table has no context axis and the result is ``derive_table``'s, byte for byte.

The stored and published document keeps the base level's derivation: ``ranges`` is the batch-only
table of the first (shortest) level, the one an engine without the 5-item form launches with, with
that level's evidence and provenance; ``context_entries`` carries the full (B, ctx) table, and
``context_columns`` per bucket the level that priced it (the first level merged into it), its decode
step times and the rates it was searched under: what the controller corrects each bucket from
(``formats.context_columns``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.core.table import DraftTable, context_buckets
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.context_columns import ContextColumn
from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
from tabletune_pipelines.formats.profile_levels import at_context, context_levels
from tabletune_pipelines.tuning.derive import (
    DeriveOptions,
    LevelSearch,
    TunedTable,
    decode_step_times,
    derive_table,
    judged_step_times,
    search_times,
)
from tabletune_pipelines.vocab import CONTEXT_AGGREGATES, ContextAggregate

LevelRates = AcceptancePrior | Sequence[float]
"""One context level's acceptance: a prior (its counts give the rates' error) or bare rates (exact)."""


def derive_context_table(profile: StepTimeProfile, prior: AcceptancePrior, surfaces: Mapping[int, StepTimes], *,
                         max_model_len: int | None = None, rates: Mapping[int, LevelRates] | None = None,
                         options: DeriveOptions = DeriveOptions(), ctx_agg: ContextAggregate = "mean",
                         decode: Mapping[int, StepTimes] | None = None) -> TunedTable:
    """The (B, ctx) table of ``profile``'s engine (module docstring). ``surfaces``: the judged step
    times per context level; ``rates``: acceptance per level (a level without: ``prior``, the pooled
    one); ``max_model_len``: where the last bucket ends (None: at the last level); ``ctx_agg``: how
    the served step's context is aggregated, written with a context axis; ``decode``: the decode
    surface per level (``stored_decode_surface``) the columns carry (None: the judged ones)."""
    levels = _levels(surfaces, profile.identity.max_num_seqs)
    if ctx_agg not in CONTEXT_AGGREGATES:
        raise InvalidValueError(f"ctx_agg = {ctx_agg!r} must be one of {list(CONTEXT_AGGREGATES)}")
    own = dict(rates or {})
    unknown = sorted(set(own) - set(levels))
    if unknown:
        raise InvalidValueError(f"acceptance given for context level(s) {unknown} that the surface does not hold "
                                f"(levels {levels})")
    buckets = context_buckets(levels, levels[-1] if max_model_len is None else max_model_len)
    priors = [_prior_at(level, own, prior) for level in levels]
    base = derive_table(profile, priors[0], options, judged=surfaces[levels[0]])
    if base.evidence is None:  # derive_table always searches with evidence
        raise InvalidValueError(f"the table search at context level {levels[0]} returned no evidence")
    searches = [LevelSearch(levels[0], buckets[0], base.evidence, levels[0] not in own)]
    for level, bucket, level_prior in zip(levels[1:], buckets[1:], priors[1:], strict=True):
        below = searches[-1].evidence.choice.chosen  # the shorter level's table: kept unless evidence moves it
        searches.append(LevelSearch(level, bucket, search_times(surfaces[level], level_prior, options, incumbent=below),
                                    level not in own))
    draft = DraftTable.from_columns([s.evidence.choice.chosen for s in searches], buckets)
    table = base.table if draft.axes.context is None else dataclasses.replace(
        base.table, context_entries=draft.entry_tuples(), ctx_agg=ctx_agg,
        context_columns=_columns(draft, searches, priors, decode or surfaces))
    return dataclasses.replace(base, table=table, by_context=tuple(searches))


def _columns(draft: DraftTable, searches: Sequence[LevelSearch], priors: Sequence[AcceptancePrior],
             decode: Mapping[int, StepTimes]) -> tuple[dict, ...]:
    """Per context bucket of ``draft`` (merged), the column the controller corrects it from: the
    first level merged into the bucket, its decode step times and the rates it was searched under."""
    out = []
    for lo, hi in draft.axes.context or ():
        j = next(i for i, s in enumerate(searches) if s.bucket[0] == lo)
        times = decode[searches[j].level]
        step_ms = {k: {b: float(times.ms[i, b - 1]) for b in range(1, times.max_batch_size + 1)}
                   for i, k in enumerate(times.ks)}
        out.append(ContextColumn(ctx=(lo, hi), level=searches[j].level, step_ms=step_ms,
                                 acceptance_rates=tuple(float(a) for a in priors[j].rates),
                                 pooled=searches[j].pooled).to_dict())
    return tuple(out)


def _prior_at(level: int, own: Mapping[int, LevelRates], pooled: AcceptancePrior) -> AcceptancePrior:
    """The acceptance a level is searched under: its own prior, its bare rates as a prior without
    counts (exact rates), or the pooled prior where it has none."""
    given = own.get(level)
    if given is None:
        return pooled
    if isinstance(given, AcceptancePrior):
        return given
    rates = tuple(float(a) for a in given)
    zeros = (0,) * len(rates)
    return dataclasses.replace(pooled, rates=rates, num_drafts=0, drafted_per_pos=zeros, accepted_per_pos=zeros)


def _levels(surfaces: Mapping[int, StepTimes], max_num_seqs: int) -> list[int]:
    """The context levels, ascending, each surface covering batch sizes 1..max_num_seqs."""
    if not surfaces:
        raise InvalidValueError("no context levels: a (B, ctx) derivation needs the step times of at least one level")
    levels = sorted(int(lv) for lv in surfaces)
    for level in levels:
        n = surfaces[level].max_batch_size
        if n != max_num_seqs:
            raise InvalidValueError(f"the step times at context level {level} cover batch sizes 1..{n}; the table "
                                    f"covers 1..{max_num_seqs}")
    return levels


def stored_context_surface(profile: StepTimeProfile, prior: AcceptancePrior,
                           options: DeriveOptions) -> dict[int, StepTimes]:
    """The judged step times per context level of ``profile`` (its cells carry the level they were
    measured at, ``formats.profile_levels``): each level's cells judged alone, as ``derive_table``
    judges a profile. A profile of one level gives ``{level: judged_step_times(profile)}``, exactly
    the surface the batch-only derivation searches."""
    levels = context_levels(profile)
    if len(levels) == 1:
        return {levels[0]: judged_step_times(profile, prior, options)}
    return {level: judged_step_times(at_context(profile, level), prior, options) for level in levels}


def stored_decode_surface(profile: StepTimeProfile, prior: AcceptancePrior,
                          options: DeriveOptions) -> dict[int, StepTimes]:
    """The decode surface per context level of ``profile`` (``derive.decode_step_times``, each level's
    cells alone, as ``stored_context_surface`` judges them): what a (B, ctx) table's columns carry."""
    levels = context_levels(profile)
    if len(levels) == 1:
        return {levels[0]: decode_step_times(profile, prior, options)}
    return {level: decode_step_times(at_context(profile, level), prior, options) for level in levels}


def rates_per_level(prior: AcceptancePrior, levels: Sequence[int]) -> tuple[dict[int, tuple[float, ...]], str | None]:
    """Acceptance per context level from the prior's breakdown by context bucket, and None; or no
    rates (every level searched under the pooled prior) and the reason, when the prior has no
    breakdown or one measured at other levels."""
    if prior.context is None:
        return {}, None
    have = [b.level for b in prior.context]
    if [int(x) for x in levels] != have:
        return {}, (f"acceptance prior {prior.prior_id} was measured per context bucket at levels {have}, the "
                    f"profile at {list(levels)}: every level is searched under the pooled rates")
    return prior.rates_by_context(tuple(levels)), None

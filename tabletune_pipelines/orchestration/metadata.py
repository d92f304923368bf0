"""Dagster-side rendering of what the library produced: check results, images and JSON in the UI.

The assets call the library and hand its plain result to one ``describe_*`` function here, which
turns it into the ``dg.MaterializeResult`` (metadata and check results) the UI shows. Keys that
``draft_length_table`` and ``published_table`` share are written once (``table_metadata``). Library
code raises ``PipelineFailure`` when a run cannot produce its asset; ``failures()`` turns it into
the step's ``dg.Failure``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from tabletune_pipelines.errors import PipelineFailure
from tabletune_pipelines.formats.documents import DraftLengthTable
from tabletune_pipelines.formats.fleet import tabletune_home
from tabletune_pipelines.formats.strict_io import atomic_write_bytes
from tabletune_pipelines.tuning.build import BuiltTable
from tabletune_pipelines.tuning.feedback import LiveWeek
from tabletune_pipelines.tuning.gates import Gate
from tabletune_pipelines.tuning.measure import ProfileRun, WeekPriors
from tabletune_pipelines.tuning.publishing import Publication, Rollback
from tabletune_pipelines.tuning.report import (
    accepted_work_text,
    boundaries_markdown,
    context_grid_lines,
    identity_markdown,
    loss_text,
    priors_markdown,
    profile_markdown,
    ranges_line,
    table_markdown,
    within_noise_markdown,
)


def live_priors_markdown(week: LiveWeek) -> str:
    """One row per deployment with a live prior of the week: windows, counts, the stored prior and
    how many windows of other engines were left out."""
    rows = ["| deployment | windows | drafts | drafted_i | accepted_i | live prior | other engines' windows left out |",
            "|---|---|---|---|---|---|---|"]
    for i in week.ingested:
        live = i.live
        rates = [round(r, 3) for r in live.prior.rates]
        rows.append(f"| {i.deployment} | {live.windows} | {live.prior.num_drafts} | {list(live.drafted)} | "
                    f"{list(live.accepted)} | `{i.prior_id}`: {rates} — {live.basis} | {i.left_out} |")
    return "\n".join(rows)


def publications_markdown(publication: Publication) -> str:
    """One row per target deployment: the version it holds now (``(unchanged)`` when it held the table
    already), the published file and its ``--speculative-config`` companion."""
    rows = ["| deployment | version | file | --speculative-config |", "|---|---|---|---|"]
    rows += [f"| {t.deployment} | v{t.version}{' (unchanged)' if t.unchanged else ''} | `{t.path}` | "
             f"`{t.speculative_config_path}` |" for t in publication.targets]
    return "\n".join(rows)


ROLLBACK_HOWTO = (
    "Roll back with the job `rollback_published_table` (config: `deployment`), e.g.\n\n"
    "`dg launch --job rollback_published_table --config-json "
    "'{\"ops\": {\"rollback_published_table_op\": {\"config\": {\"deployment\": \"<name>\"}}}}'`\n\n"
    "In a fleet of several engine groups, also give the run the deployment's engine tag, so the run queue "
    "serialises it with that engine's runs: the launchpad's tags, or `dagster job launch -j "
    "rollback_published_table --tags '{\"tabletune/engine\": \"<engine group>\"}' ...`.")
"""Shown with every published table: how to go back one version."""


def _value(v: Any) -> Any:
    """Lists and mappings as JSON metadata; numbers and strings as they are (Dagster infers them)."""
    if isinstance(v, (list, tuple, Mapping)):
        return dg.MetadataValue.json(list(v) if isinstance(v, tuple) else v)
    return v


@contextmanager
def failures() -> Iterator[None]:
    """Around a library call: its ``PipelineFailure`` fails the step as a ``dg.Failure`` (the message as
    the description, its details as metadata)."""
    try:
        yield
    except PipelineFailure as exc:
        raise dg.Failure(description=str(exc),
                         metadata={k: _value(v) for k, v in exc.details.items()} or None) from exc


def check_result(gate: Gate, *, severity: dg.AssetCheckSeverity | None = None,
                 extra: Mapping[str, Any] | None = None) -> dg.AssetCheckResult:
    """A gate as an asset-check result of the asset being materialized (its name is the check's).

    Severity: ERROR for blocking gates, WARN for the others, unless given; a gate that lets its input
    through with a warning (``Gate.warning``) is a failed check of severity WARN, which blocks nothing.
    ``extra``: more metadata.
    """
    md: dict[str, Any] = {k: _value(v) for k, v in gate.figures.items()}
    if gate.comparison:
        md["comparison"] = dg.MetadataValue.md(gate.comparison)
    md["summary"] = dg.MetadataValue.text(gate.description)
    md.update(extra or {})
    passed = gate.passed
    if gate.warning:  # may be used, but unconfirmed (an unverified table): a failed check of severity WARN
        passed, severity = False, dg.AssetCheckSeverity.WARN
    if severity is None:
        severity = dg.AssetCheckSeverity.ERROR if gate.blocking else dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(check_name=gate.name, passed=passed, severity=severity, metadata=md,
                               description=gate.description)


def plots_dir() -> Path:
    """``$TABLETUNE_HOME/plots`` (created): where plot PNGs shown in the UI are also kept as files."""
    p = tabletune_home() / "plots"
    p.mkdir(parents=True, exist_ok=True)
    return p


def image_metadata(png: bytes, name: str, alt: str = "goodput vs batch size") -> dict[str, dg.MetadataValue]:
    """The plot inline (markdown with a base64 PNG, ``alt`` its text) and as a file path."""
    path = plots_dir() / f"{name}.png"
    shown_path: dg.MetadataValue
    try:  # the one atomic writer: a symbolic link (or anything but a file) there is refused, never followed
        shown_path = dg.MetadataValue.path(str(atomic_write_bytes(path, png)))
    except OSError as exc:
        shown_path = dg.MetadataValue.text(f"not written: {path}: {exc.strerror or exc}")
    b64 = base64.b64encode(png).decode()
    return {"goodput_plot": dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{b64})"),
            "goodput_plot_path": shown_path}


def json_md(obj: Any) -> dg.MetadataValue:
    """A JSON value as a fenced, paste-able markdown block."""
    return dg.MetadataValue.md("```json\n" + json.dumps(obj, indent=2, sort_keys=True) + "\n```")


# -- one function per asset: the library's result as what the UI shows ----------------------------

def describe_profile(run: ProfileRun) -> dg.MaterializeResult:
    """``step_time_profile``: the cells of the identity and the check ``profile_complete``."""
    profile = run.profile
    spreads = [c.spread for c in profile.cells]
    return dg.MaterializeResult(
        metadata={
            "identity": dg.MetadataValue.md(identity_markdown(run.identity)),
            "identity_key": run.identity.key,
            "deployment": run.deployment,
            "dagster/row_count": len(profile.cells),
            "cells_measured_this_run": run.cells_measured,
            "step_ms": dg.MetadataValue.md("Step time, ms (median of repetitions, every draft rejected)\n\n"
                                           + profile_markdown(profile)),
            "median_spread": float(np.median(spreads)) if spreads else 0.0,
            "max_spread": float(max(spreads)) if spreads else 0.0,
            "cells_remeasured": len(profile.remeasured()),
            "wall_timed_cells": len(profile.wall_timed()),
            "mode": profile.mode,
        },
        check_results=[check_result(run.gate)],
    )


def context_buckets_metadata(week: WeekPriors) -> dict[str, list[dict[str, Any]]]:
    """Per deployment measured per context bucket: each bucket's span, level, prompts (n), drafts, and
    its rates, or ``"pooled: <why>"`` where it serves the pooled rates."""
    return {m.deployment: [
        {"bucket": [b.lo, b.hi], "level": b.level, "n": b.prompt_count, "num_drafts": b.num_drafts,
         "rates": f"pooled: {b.reason}" if b.pooled else [round(r, 4) for r in b.rates]}
        for b in m.prior.context] for m in week.measured if m.prior.context is not None}


def describe_acceptance(week: WeekPriors) -> dg.MaterializeResult:
    """``acceptance_prior``: the week's priors, their samples, each prior's context buckets where it
    was measured per bucket, and one ``prior_sane`` check over all deployments of the run (it fails if
    any prior is not sane)."""
    buckets = context_buckets_metadata(week)
    return dg.MaterializeResult(
        metadata={
            **({"context_buckets": dg.MetadataValue.json(buckets)} if buckets else {}),
            "priors": dg.MetadataValue.md(priors_markdown((m.deployment, m.prior) for m in week.measured)),
            "dagster/row_count": len(week.measured),
            "week": week.week,
            "identities": dg.MetadataValue.json(sorted({m.identity_key for m in week.measured})),
            "deployments_without_prompts": dg.MetadataValue.json(list(week.without_prompts)),
            # Which mix each prior's sample came from, its size and each a_i's 95 % interval (Wilson, counts).
            "samples": dg.MetadataValue.json({m.deployment: m.sample for m in week.measured}),
        },
        check_results=[dg.AssetCheckResult(
            check_name="prior_sane", passed=week.sane, description=week.sanity,
            metadata={m.deployment: m.gate.description for m in week.measured},
        )],
    )


def describe_live_priors(week: LiveWeek) -> dg.MaterializeResult:
    """``live_acceptance_counters``: the week's live priors and the windows left out."""
    return dg.MaterializeResult(metadata={
        "live_priors": dg.MetadataValue.md(live_priors_markdown(week)),
        "dagster/row_count": len(week.ingested),
        "week": week.week,
        "notes": dg.MetadataValue.json(list(week.notes)),
        "windows_left_out": week.windows_left_out,
        "windows_left_out_by_engine": dg.MetadataValue.json(week.left_out),
    })


def table_metadata(table: DraftLengthTable) -> dict[str, Any]:
    """The keys ``draft_length_table`` and ``published_table`` share: the table, its provenance and
    its predicted figures and evidence."""
    return {
        "table": dg.MetadataValue.md(table_markdown(table.ranges)),
        # One line each (JSON metadata would show one number per line): the ranges as a person reads
        # them, and as vLLM's num_speculative_tokens_per_batch_size, ready to paste.
        "table_ranges": dg.MetadataValue.text(ranges_line(table.ranges)),
        "table_json": dg.MetadataValue.text(json.dumps(table.as_vllm())),
        "table_id": table.table_id,
        "identity_key": table.identity_key,
        "prior_id": table.prior_id,
        "predicted_worst_loss": float(table.predicted_worst_loss),
        "predicted_worst_loss_lcb": float(table.predicted_worst_loss_lcb or 0.0),
        "predicted_worst_loss_ucb": float(table.predicted_worst_loss_ucb or 0.0),
        "predicted_loss": loss_text(table),
        "ranges": len(table.ranges),
        "boundaries": dg.MetadataValue.md(boundaries_markdown(table)),
        "k_within_noise": dg.MetadataValue.md(within_noise_markdown(table)),
        "cells_remeasured": table.cells_remeasured,
        # With a context axis: k by batch size and context bucket, and vLLM's 5-item entries.
        **({} if not table.context_entries else {
            "table_grid": dg.MetadataValue.md("```\n" + "\n".join(context_grid_lines(table.full_table)) + "\n```"),
            "context_entries_json": dg.MetadataValue.text(json.dumps([list(e) for e in table.context_entries]))}),
    }


def describe_table(built: BuiltTable) -> dg.MaterializeResult:
    """``draft_length_table``: the table, what it was built from, its plot and every table check."""
    table, prior, key = built.table, built.prior, built.profile.identity.key
    return dg.MaterializeResult(
        metadata={
            **table_metadata(table),
            "one_batch_size_ranges": sum(1 for s, e, _ in table.ranges if s == e),
            "search_policy": table.search_policy,
            "wall_timed_cells": table.wall_timed_cells,
            "has_error_estimates": table.has_error_estimates,
            "accepted_work_fit": dg.MetadataValue.md(accepted_work_text(table)),
            "warnings": dg.MetadataValue.json(list(built.tuned.warnings)),
            "identity": dg.MetadataValue.md(identity_markdown(built.profile.identity)),
            "prior_week": prior.week or "",
            "prior_source": prior.source,
            "acceptance_rates": dg.MetadataValue.json(list(prior.rates)),
            "accepted_work_corrected": built.tuned.corrected,
            "dagster/row_count": len(table.ranges),
            "profile_cells": len(built.profile.cells),
            "speculative_config": json_md(table.speculative_config()),
            **image_metadata(built.plot, f"{key}-{built.table_id}"),
        },
        check_results=[check_result(g) for g in built.gates],
    )


def served_check(publication: Publication) -> dg.AssetCheckResult:
    """``served_goodput_verified``, with the served goodput-vs-load plot when the verification ran."""
    return check_result(publication.gate, extra=_served_plot(publication))


def _served_plot(publication: Publication) -> dict[str, dg.MetadataValue]:
    if publication.served_plot is None:
        return {}
    shown = image_metadata(publication.served_plot, f"{publication.identity_key}-{publication.table.table_id}-served",
                           alt="served goodput vs load")
    return {"served_goodput_plot": shown["goodput_plot"], "served_goodput_plot_path": shown["goodput_plot_path"]}


def describe_publication(publication: Publication) -> dg.MaterializeResult:
    """``published_table``: where the table went, its ``--speculative-config``, how to roll back, what
    was measured (``Publication.report``, the lines ``tabletune run`` and ``tabletune show`` print),
    and the check ``served_goodput_verified``."""
    check, gate = served_check(publication), publication.gate
    return dg.MaterializeResult(
        check_results=[check],
        metadata={
            **table_metadata(publication.table),
            "publications": dg.MetadataValue.md(publications_markdown(publication)),
            "published": dg.MetadataValue.json([{"deployment": t.deployment, "version": t.version, "path": str(t.path)}
                                                for t in publication.published]),
            "unchanged": dg.MetadataValue.json(list(publication.unchanged)),
            "dagster/row_count": len(publication.published),
            "speculative_config": json_md(publication.speculative_config),
            "rollback": dg.MetadataValue.md(ROLLBACK_HOWTO),
            "skipped_deployments": dg.MetadataValue.json(list(publication.skipped)),
            "served_verification": dg.MetadataValue.text(gate.description),
            **({"what_was_measured": dg.MetadataValue.md("```\n" + "\n".join(publication.report) + "\n```")}
               if publication.report else {}),
            **({"served_goodput": dg.MetadataValue.md(gate.comparison)} if gate.comparison else {}),
            **{k: v for k, v in check.metadata.items() if k.startswith("served_goodput_plot")},
        },
    )


def describe_rollback(done: Rollback, partitions: Sequence[str]) -> dg.AssetMaterialization:
    """A rollback as a materialization of ``published_table`` (of the identity's partition when it has one)."""
    return dg.AssetMaterialization(
        asset_key="published_table",
        partition=done.identity_key if done.identity_key in partitions else None,
        description=f"rollback of {done.deployment}",
        metadata={"deployment": done.deployment, "version": done.version, "path": str(done.path),
                  "identity_key": done.identity_key, "prior_id": done.prior_id,
                  "table": dg.MetadataValue.md(table_markdown(done.ranges)), "rollback": True},
    )

"""Synthetic inputs with no measurement behind them, for the CPU test engine and the benchmarks.

The engine they describe is the tiny CPU one of ``evaluation.rig`` (and the fake engine of the
controller's pure-logic tests, ``evaluation.simulator.FakeEngine``): ``N`` = 16 sequences, ``K`` = 3,
launch table ``LAUNCH`` (every k 0..3 listed), identity ``IDENTITY``, the facts its controller knows
``ENGINE``. What they give:

* ``linear_profile``: a step-time profile T(B, k) = c0 + c1·k + B·(d0 + d1·k) ms;
* ``true_table``: the table ``core.table``'s search builds from a profile and acceptance rates (the
  reference a controller is compared with);
* ``fixed_prior``: an ``AcceptancePrior`` with given rates and no drafts counted;
* ``publish``: a published-table file (``tabletune_pipelines.formats.published``) for that engine.

Stdlib, numpy and the serving-side modules only (no vLLM, no Dagster). The replay simulator's
published file for its simulated engine is ``evaluation.simulator.published_for``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.core.table import DraftTable, choose_draft_lengths
from tabletune_pipelines.formats.published_build import published_document
from tabletune_pipelines.formats.published_files import write_published_table
from tabletune_pipelines.formats.published_schema import PublishedVersion

if TYPE_CHECKING:
    from tabletune_pipelines.formats.documents import AcceptancePrior

__all__ = ["ENGINE", "IDENTITY", "K", "LAUNCH", "N", "REBUILD_BUDGET_MS", "dense", "fixed_prior", "linear_profile",
           "publish", "true_table"]

N, K = 16, 3
"""max_num_seqs and K of the test engine."""
LAUNCH = ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, N, 3))
"""The test engine's launch table: every k 0..K appears, so the controller may use each."""
IDENTITY = {"gpu": "cpu", "vllm_version": "0.32.0+cpu", "model": "/m/target", "drafter": "/m/draft",
            "method": "draft_model", "max_k": K, "max_num_seqs": N, "dtype": "bfloat16", "cudagraph_mode": "none"}
"""The identity ``publish`` writes by default (``rig.identity`` fills in the tiny models' paths)."""
ENGINE = EngineFacts(max_k=K, max_num_seqs=N, launch_ranges=LAUNCH, model="/m/target", method="draft_model",
                     vllm_version="0.32.0")
"""What a controller on the test engine is told about its engine (the fake engine's default)."""


def linear_profile(n: int = N, k_max: int = K, c0=4.0, c1=0.6, d0=0.1, d1=0.1) -> dict[int, dict[int, float]]:
    """T(B, k) = c0 + c1·k + B·(d0 + d1·k) ms: k costs a fixed part and a part per request."""
    return {k: {b: c0 + c1 * k + b * (d0 + d1 * k) for b in range(1, n + 1)} for k in range(k_max + 1)}


def dense(profile: dict[int, dict[int, float]], ks: Sequence[int], n: int = N) -> np.ndarray:
    """``profile`` as an array: one row per k of ``ks``, one column per B = 1..n."""
    return np.array([[profile[k][b] for b in range(1, n + 1)] for k in ks])


def true_table(profile, rates, ks=(0, 1, 2, 3), n: int = N, stickiness: float = 0.005) -> list[list[int]]:
    """The table core.table's search builds from ``profile`` and ``rates`` (the reference)."""
    choice = choose_draft_lengths(dense(profile, ks, n), ks, rates, stickiness=stickiness)
    return DraftTable.from_dense(choice.chosen).entries()


def fixed_prior(rates: Sequence[float]) -> AcceptancePrior:
    """An AcceptancePrior with known rates (no measurement behind it)."""
    from tabletune_pipelines.formats.documents import AcceptancePrior

    n = len(rates)
    return AcceptancePrior(rates=tuple(rates), num_drafts=0, drafted_per_pos=(0,) * n, accepted_per_pos=(0,) * n,
                           prompt_fingerprint="synthetic", prompt_count=0, source="synthetic")


#: ``publish`` (and the simulator's ``published_for``) writes a rebuild budget no busy machine reaches: a
#: rebuild the 20 ms default would abandon on a preempted core would leave the table a test expects
#: unchanged. The budget itself is tested on its
#: own (test_logic: ``rebuild_budget_ms: 1e-6``); its cost is a benchmark's (controller_overhead.py).
REBUILD_BUDGET_MS = 60_000.0


def publish(path: Path, *, ranges, rates, profile=None, version: int = 1, controller: dict | None = None,
            identity: dict | None = IDENTITY, prior_count: int = 0, allowed_k=None, n: int = N, k_max: int = K,
            over_junk: bool = False, served_cost: dict | None = None, deployment: str = "test",
            context_entries=None, ctx_agg: str | None = None, context_columns=None) -> Path:
    """Publish a table of ``deployment`` for the test engine (``profile``: T(B, k) as ``{k: {B: ms}}``,
    by default ``linear_profile``; ``context_entries``: a (batch size x context) table's 5-item entries,
    with its ``ctx_agg``; ``context_columns``: its columns, ``formats.context_columns.ContextColumn.to_dict``
    forms). ``over_junk``: a deliberately broken file was left there, which publishing
    refuses to replace: remove it first."""
    if over_junk:
        path.unlink(missing_ok=True)
    profile = linear_profile(n, k_max) if profile is None else profile
    table = {"schema": "tabletune.draft_length_table", "schema_version": 1, "ranges": [list(r) for r in ranges],
             "max_num_seqs": n, "max_k": k_max, "identity_key": "cpu__test", "prior_id": "prior-test",
             "acceptance_rates": list(rates), "predicted_worst_loss": 0.0,
             "step_ms": {str(k): {str(b): float(v) for b, v in row.items()} for k, row in profile.items()}}
    if served_cost:
        table["served_cost"] = served_cost
    if context_entries is not None:
        table["context_entries"] = [list(e) for e in context_entries]
    if ctx_agg is not None:
        table["ctx_agg"] = ctx_agg
    if context_columns is not None:
        table["context_columns"] = [dict(c) for c in context_columns]
    doc = published_document(
        PublishedVersion(deployment=deployment, version=version, table=table,
                         speculative_config={"method": "draft_model", "num_speculative_tokens": k_max,
                                             "num_speculative_tokens_per_batch_size": [list(r) for r in ranges]},
                         published_at="2026-11-23T10:00:00Z"),
        identity=identity,
        prior={"rates": list(rates), "num_drafts": prior_count, "prior_id": "prior-test", "source": "synthetic"},
        allowed_k=allowed_k, controller={"rebuild_budget_ms": REBUILD_BUDGET_MS, **(controller or {})})
    return write_published_table(path, doc)

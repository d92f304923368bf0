"""The published-table file's document: its schema, the bounds of its version and size, and the
typed records a publication states (``PublishedVersion``) and the strict reader returns
(``PublishedTable``, ``PublishedPrior``). Stdlib only, plus ``options``: the controller inside vLLM
imports it.

Format (schema ``tabletune.published_table``, version 1; the keys marked *new* are optional so
files written before them still load)::

    {"schema": "tabletune.published_table", "schema_version": 1,
     "deployment": "local-cpu", "version": 3, "published_at": "2026-11-23T10:00:00Z",
     "table": {...},               # DraftLengthTable.to_dict(): ranges, max_num_seqs, max_k,
                                   #   identity_key, prior_id, acceptance_rates (the prior's a_i),
                                   #   predicted_worst_loss, step_ms {k: {B: ms}} (profiled T(B, k));
                                   #   new: context_entries [[bs_lo, bs_hi, ctx_lo, ctx_hi, k], ...]
                                   #   (the (batch size x context) table, absent with one context
                                   #   bucket) and ctx_agg ("mean", "median" or "max"; default
                                   #   "mean"; only with context_entries)
     "speculative_config": {...},  # the --speculative-config a deployment without the controller uses:
                                   #   num_speculative_tokens_per_batch_size (3-item, table.ranges), or
                                   #   speculative_token_schedule (5-item, table.context_entries) where
                                   #   the engine's vLLM takes the 5-item form
     "identity": {...},            # new: EngineIdentity fields (gpu, vllm_version, model, drafter,
                                   #   method, max_k, max_num_seqs, dtype, cudagraph_mode)
     "prior": {"rates": [...], "num_drafts": 4800, "drafted_per_pos": [...],
               "accepted_per_pos": [...], "prior_id": "...", "source": "measured"},   # new
     "allowed_k": [0, 1, 3],       # new: k values the controller may choose (default: the table's)
     "controller": {...},          # new: ControllerSettings overrides (docs/controller.md)
     "evidence": {...},            # new: the table search's evidence (policy, confidence, loss bounds,
                                   #   boundaries with gain and confidence, k within noise per B,
                                   #   number of ranges, cells re-measured, wall-timed cells)
     "served_verification": {...}} # new: the served goodput verification the table passed before it

The strict reader is ``formats.published``, the document builder ``formats.published_build``, the
writer, the publication lock and the speculative-config companion ``formats.published_files``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tabletune_pipelines.formats.context_columns import ContextColumn
from tabletune_pipelines.options import Bound
from tabletune_pipelines.vocab import ContextAggregate

PUBLISHED_SCHEMA = "tabletune.published_table"
PUBLISHED_SCHEMA_VERSION = 1
#: A published table is a few kB (a 1024-batch-size profile of 9 k values is ~300 kB).
MAX_PUBLISHED_BYTES = 8 * 1024 * 1024

VERSION = Bound(1, 2 ** 31 - 1, integer=True, why="a publication version; the store keeps it as a 32-bit integer")
"""A published version: what the file says and what the store's ``publications.version`` can hold."""

TOP_KEYS = frozenset({"schema", "schema_version", "deployment", "version", "published_at", "table",
                      "speculative_config", "identity", "prior", "allowed_k", "controller", "evidence",
                      "served_verification", "serving"})
"""The top-level keys a published document may have."""
PRIOR_KEYS = frozenset({"rates", "num_drafts", "drafted_per_pos", "accepted_per_pos", "prior_id", "source"})
"""The keys of its ``prior`` section."""
CONTEXT_SCHEDULE_KEY = "speculative_token_schedule"
"""vLLM's name of the schedule that takes 5-item ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]`` entries (the
versions with context buckets; ``num_speculative_tokens_per_batch_size`` is its 3-item alias)."""

SERVED_VERIFICATION_FORMAT = """\
"served_verification": {
  "passed": true,                     # no checked load failed (the section is written only for a pass)
  "verdict": "verified" | "unverified",  # every load passed / some load reached no verdict (optional)
  "rule": "...",                      # the rule in words (docs/evaluation.md, "Served verification")
  "tolerance": 0.03,                  # a loss up to this passes whatever the noise
  "candidate": [[1, 16, 3]],          # the verified table: equal to table.ranges
  "candidate_is": "k=3",              # the fixed-k policy the table equals at every B, or null
  "loads": [1, 8, 16],                # closed-loop concurrencies checked (each 1..max_num_seqs)
  "rounds": 3, "window_s": 1.5,       # the plan after the budget (rounds per load, seconds per window)
  "window": "time" | "requests",      # optional: a span of a running load, or a fixed set of requests
  "requests_per_client": 2 (or null), # optional: requests each client sends in a "requests" window
  "budget_s": 75.0, "elapsed_s": 71.2, "budget_cut": false, "launch_s": 31.0 (or null),
  "device": "cpu", "acceptance": "real" (or "prior [0.7, 0.5, 0.3]", or null),
  "excluded_windows": 0,              # windows the step-log check left out
  "client_errors": 0,
  "plot": "<stem>.served-verification.png" (or null; a file name beside the published table),
  "no_verdict_expected": ["load 1: the profile predicts ..."] (optional: loads where the sizing from the
                                      profile's step times expected no verdict within the most rounds),
  "per_load": [{"load": 16, "status": "pass" | "fail" | "inconclusive", "best_fixed_k": 2 (or null),
                "ratio": 0.987 (or null), "ratio_se": 0.011 (or null), "rounds": 3, "t": 4.303 (or null),
                "mean_batch": 5.5 (optional, or null: requests per step over the load's windows; a
                               "requests" window ends with its drain, so it sits below the load),
                "stop": "decided" | "rounds" | "budget" (optional: why the load's rounds stopped),
                "candidate_is": "k=3" (optional, or null: the fixed k the table runs at this load's batch sizes;
                                 the table is then judged against the other fixed k),
                "references": {"docs' table": {"ratio": 1.12 (or null), "ratio_se": 0.03 (or null), "rounds": 4,
                               "same_as": "table" | "k=1" | null}} (optional: paired ratios, not gating),
                "goodput": {"k=0": [tok/s or null, s.e. or null, windows], "k=1": [...], ..., "table": [...]}}]}
"""
"""The ``served_verification`` section (optional; checked strictly by ``parse_published``)."""


@dataclass(frozen=True)
class PublishedPrior:
    """The acceptance prior the table was built from."""

    rates: tuple[float, ...]
    """a_i: probability that the first i drafts are all kept (non-increasing, in [0, 1])."""
    num_drafts: int = 0
    """Request-steps behind the rates (0 = unknown, e.g. synthetic or an old file)."""
    drafted_per_pos: tuple[int, ...] = ()
    """How often each position was drafted in the measurement (may be empty)."""
    accepted_per_pos: tuple[int, ...] = ()
    """How often each position was kept in the measurement (may be empty)."""
    prior_id: str | None = None
    """The prior's id in the store."""
    source: str | None = None
    """``measured``, ``synthetic`` or ``live``."""


@dataclass(frozen=True)
class PublishedTable:
    """A validated published file, typed (``parse_published``)."""

    deployment: str
    """Fleet deployment the file was published for."""
    version: int
    """Publication version (>= 1; every publish, rollbacks included, gets a higher one)."""
    published_at: str
    """UTC timestamp of the publication."""
    ranges: tuple[tuple[int, int, int], ...]
    """The starting table, vLLM's ``[[start, end, k], ...]`` covering 1..max_num_seqs."""
    max_num_seqs: int
    """Batch sizes the table covers."""
    max_k: int
    """Launch ``num_speculative_tokens`` (K) the table is meant for."""
    identity_key: str
    """Engine identity whose profile produced the table."""
    prior: PublishedPrior
    """The acceptance prior (rates and how many drafts stand behind them)."""
    step_ms: dict[int, dict[int, float]]
    """Profiled T(B, k) in ms, ``{k: {B: ms}}`` (may be empty in files of old pipelines)."""
    allowed_k: tuple[int, ...]
    """k values a controller may choose (sorted; always includes every k of ``ranges``)."""
    identity: dict[str, Any] | None = None
    """Engine identity fields (model, method, max_k, max_num_seqs, vllm_version, ...) if recorded."""
    controller: dict[str, Any] = field(default_factory=dict)
    """Controller settings of the deployment (keys of ControllerSettings)."""
    served_verification: dict[str, Any] | None = None
    """The served goodput verification the table passed before publishing (``SERVED_VERIFICATION_FORMAT``), if any."""
    context_entries: tuple[tuple[int, int, int, int, int], ...] | None = None
    """``table.context_entries``: the (batch size x context) table as vLLM's 5-item entries
    ``(bs_lo, bs_hi, ctx_lo, ctx_hi, k)``, sorted; None when the table has one context bucket (then
    ``ranges`` is the whole table)."""
    ctx_agg: ContextAggregate = "mean"
    """``table.ctx_agg``: how one step's context length is taken from its running requests' (mean,
    median or max; ``core.table.aggregate_context``)."""
    context_columns: tuple[ContextColumn, ...] | None = None
    """``table.context_columns``: per context bucket of ``context_entries`` (in order), the level's
    step times and acceptance the controller corrects that bucket from (``formats.context_columns``);
    None: absent (the grid is then served as published)."""
    document: dict[str, Any] = field(default_factory=dict, repr=False)
    """The whole JSON document as read."""


@dataclass(frozen=True)
class PublishedVersion:
    """What every published file states: which version of whose table, when, and how vLLM launches it."""

    deployment: str
    """The fleet deployment the table is published for."""
    version: int
    """The publication's version (the controller loads a file only when its version is newer)."""
    table: dict[str, Any]
    """The table: a DraftLengthTable's ``to_dict()`` (or its ``published_parts()`` table fields)."""
    speculative_config: dict[str, Any]
    """vLLM's ``--speculative-config`` that serves the table."""
    published_at: str
    """When, ISO 8601 UTC (``...Z``)."""

"""The published-table file's strict reader: what the controller inside vLLM loads as its prior.

The controller reads the file with this very module, so it imports only the stdlib and numpy-only
``core.table`` (whose ``DraftTable.from_entries`` is the one table validator); the document's schema and
typed records are ``formats.published_schema``'s.

``parse_published`` is the strict reader: it applies the publish gate's table rules (contiguous
ranges covering exactly 1..max_num_seqs, no overlap, 0 <= k <= max_k), rejects NaN and Infinity,
duplicate keys, nesting past 64 levels, integers of more than 32 digits, non-UTF-8 bytes, booleans
where integers belong, unknown keys, step times outside ``options.STEP_MS``, a version outside
``VERSION``, files over ``MAX_PUBLISHED_BYTES`` and paths that are not regular files (a named pipe is
never waited on; the file rules and the JSON parser are ``strict_io``'s); every message names the file
and the key (the field checks are ``published_fields``'). ``published_build.published_document``
runs the same checks on what it builds, so the pipeline cannot publish a file the controller would
refuse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import PublishedTableError, SettingsError
from tabletune_pipelines.formats import strict_io
from tabletune_pipelines.formats.context_columns import COLUMN_KEYS, ContextColumn
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.formats.published_fields import (
    Buckets,
    bool_field,
    bounded_field,
    counts_field,
    fail,
    int_field,
    num_field,
    obj_field,
    opt_num_field,
    rates_field,
    step_ms_field,
    str_field,
    validate_context_entries,
    validate_ranges,
)
from tabletune_pipelines.formats.published_schema import (
    CONTEXT_SCHEDULE_KEY,
    MAX_PUBLISHED_BYTES,
    PRIOR_KEYS,
    PUBLISHED_SCHEMA,
    PUBLISHED_SCHEMA_VERSION,
    TOP_KEYS,
    VERSION,
    PublishedPrior,
    PublishedTable,
)
from tabletune_pipelines.vocab import CONTEXT_AGGREGATES, WINDOW_KINDS, ContextAggregate

# The ``served_verification`` section's keys and words (``published_schema.SERVED_VERIFICATION_FORMAT``).
_SERVED_KEYS = {"passed", "verdict", "rule", "tolerance", "candidate", "candidate_is", "loads", "rounds", "window_s",
                "budget_s", "elapsed_s", "budget_cut", "launch_s", "device", "acceptance", "excluded_windows",
                "client_errors", "plot", "per_load", "no_verdict_expected", "window", "requests_per_client"}
_SERVED_LOAD_KEYS = {"load", "status", "best_fixed_k", "ratio", "ratio_se", "rounds", "t", "goodput", "stop",
                     "candidate_is", "references", "mean_batch"}
_SERVED_REF_KEYS = {"ratio", "ratio_se", "rounds", "same_as"}
_SERVED_STATUS = ("pass", "fail", "inconclusive")
_SERVED_VERDICTS = ("verified", "unverified")  # a failed verification publishes nothing
_SERVED_STOPS = ("decided", "rounds", "budget")


# -- strict JSON -------------------------------------------------------------------------------

def strict_json_loads(text: str) -> Any:
    """``json.loads`` that rejects NaN/Infinity, duplicate keys, deep nesting and huge integers
    (raises ``ValueError``): ``strict_io.loads``, the one strict parser of every reader."""
    return strict_io.loads(text)


@dataclass(frozen=True)
class _TableFields:
    """The ``table`` section's fields the other sections are checked against (``parse_published``)."""

    ranges: tuple[tuple[int, int, int], ...]
    """``table.ranges``, validated."""
    max_num_seqs: int
    """``table.max_num_seqs``."""
    max_k: int
    """``table.max_k``."""
    identity_key: str
    """``table.identity_key``."""
    prior_id: str
    """``table.prior_id``."""
    rates: tuple[float, ...]
    """``table.acceptance_rates`` (empty when absent)."""
    step_ms: dict[int, dict[int, float]]
    """``table.step_ms`` as ``{k: {B: ms}}``."""
    context_entries: tuple[tuple[int, int, int, int, int], ...] | None
    """``table.context_entries``, validated (None: absent)."""
    ctx_agg: ContextAggregate
    """``table.ctx_agg`` (default ``mean``)."""
    context_columns: tuple[ContextColumn, ...] | None = None
    """``table.context_columns``, validated against the grid's buckets (None: absent)."""

    @property
    def ks(self) -> list[int]:
        """Every k the table uses, in ``ranges`` and ``context_entries``, ascending."""
        return sorted({r[-1] for r in (*self.ranges, *(self.context_entries or ()))})


def parse_published(doc: Any, where: str = "<document>") -> PublishedTable:
    """Validate a decoded published document strictly and return it typed (one parser per section,
    in the order below: the first rule broken is the one reported)."""
    _check_envelope(doc, where)
    deployment = str_field(where, "deployment", doc["deployment"])
    version = bounded_field(where, VERSION, "version", int_field(where, "version", doc["version"], 1))
    published_at = str_field(where, "published_at", doc.get("published_at", "unknown"))
    table = _table_section(where, doc["table"])
    _speculative_config_section(where, doc["speculative_config"], table)
    identity = _identity_section(where, doc.get("identity"), table)
    prior = _prior_section(where, doc.get("prior"), table)
    allowed = _allowed_k_section(where, doc.get("allowed_k"), table)
    if doc.get("evidence") is not None:  # the table search's evidence: reported, not used to serve
        obj_field(where, "evidence", doc["evidence"])
    _serving_section(where, doc.get("serving"))
    served = None
    if doc.get("served_verification") is not None:  # the served verification: reported, not used to serve
        served = _served_verification(where, doc["served_verification"], table)
    controller = _controller_section(where, doc.get("controller"))
    return PublishedTable(
        deployment=deployment, version=version, published_at=published_at, ranges=table.ranges,
        max_num_seqs=table.max_num_seqs, max_k=table.max_k, identity_key=table.identity_key, prior=prior,
        step_ms=table.step_ms, allowed_k=tuple(allowed), identity=identity, controller=controller,
        served_verification=served, context_entries=table.context_entries, ctx_agg=table.ctx_agg,
        context_columns=table.context_columns, document=doc)


def _check_envelope(doc: Any, where: str) -> None:
    """The schema and its version, no unknown top-level key, the required sections present."""
    if not isinstance(doc, dict) or doc.get("schema") != PUBLISHED_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise PublishedTableError(f"{where} is not a TableTune published table (schema {got!r})")
    sv = doc.get("schema_version")
    if type(sv) is not int or sv != PUBLISHED_SCHEMA_VERSION:
        raise PublishedTableError(
            f"{where} has schema_version {sv!r}; this reader understands {PUBLISHED_SCHEMA_VERSION} "
            "(re-publish it with this TableTune, or upgrade the reader)")
    obj_field(where, "the document", doc, TOP_KEYS)
    for key in ("deployment", "version", "table", "speculative_config"):
        if key not in doc:
            raise PublishedTableError(f"published table {where} lacks the field {key!r}")


def _table_section(where: str, v: Any) -> _TableFields:
    """``table``: a DraftLengthTable document, which grows fields of its own (documents.py owns
    them): the fields read here are checked strictly, the others only as JSON."""
    t = obj_field(where, "table", v)
    for key in ("ranges", "max_num_seqs", "max_k", "identity_key", "prior_id"):
        if key not in t:
            raise fail(where, f"table lacks the field {key!r}")
    max_num_seqs = int_field(where, "table.max_num_seqs", t["max_num_seqs"], 1)
    max_k = int_field(where, "table.max_k", t["max_k"], 1)
    ranges = validate_ranges(where, t["ranges"], max_num_seqs, max_k)
    identity_key = str_field(where, "table.identity_key", t["identity_key"])
    prior_id = str_field(where, "table.prior_id", t["prior_id"])
    rates = rates_field(where, "table.acceptance_rates", t.get("acceptance_rates", []))
    num_field(where, "table.predicted_worst_loss", t.get("predicted_worst_loss", 0.0))
    step_ms = step_ms_field(where, t.get("step_ms", {}), max_k)
    grid = None
    buckets: Buckets = ()
    if t.get("context_entries") is not None:
        grid, buckets = validate_context_entries(where, t["context_entries"], max_num_seqs, max_k)
    agg = t.get("ctx_agg", "mean")
    if agg not in CONTEXT_AGGREGATES:
        raise fail(where, f"table.ctx_agg = {agg!r:.40} must be one of {list(CONTEXT_AGGREGATES)}")
    if "ctx_agg" in t and grid is None:
        raise fail(where, f"table.ctx_agg = {agg!r} is set without table.context_entries; it says how a step's "
                           "context length picks a context bucket, and the table has none")
    columns = None
    if t.get("context_columns") is not None:
        if grid is None:
            raise fail(where, "table.context_columns is set without table.context_entries; it prices the context "
                              "buckets of a (batch size x context) table, and the table has none")
        columns = context_columns_field(where, t["context_columns"], buckets, max_k)
    return _TableFields(ranges=ranges, max_num_seqs=max_num_seqs, max_k=max_k, identity_key=identity_key,
                        prior_id=prior_id, rates=rates, step_ms=step_ms, context_entries=grid, ctx_agg=agg,
                        context_columns=columns)


def context_columns_field(where: str, v: Any, buckets: tuple[tuple[int, int], ...],
                          max_k: int) -> tuple[ContextColumn, ...]:
    """``table.context_columns`` (``formats.context_columns``): one entry per context bucket of the
    grid, in order, each naming its bucket, a level inside it, the level's step times and rates."""
    key = "table.context_columns"
    if not isinstance(v, list) or len(v) != len(buckets):
        raise fail(where, f"{key} must be a list of {len(buckets)} entries, one per context bucket "
                          f"{[list(b) for b in buckets]}, got {v!r:.60}")
    out = []
    for i, (raw, bucket) in enumerate(zip(v, buckets, strict=True)):
        at = f"{key}[{i}]"
        col = obj_field(where, at, raw, COLUMN_KEYS)
        missing = sorted(COLUMN_KEYS - set(col))
        if missing:
            raise fail(where, f"{at} lacks {', '.join(missing)}")
        ctx = col["ctx"]
        if not (isinstance(ctx, list) and all(type(x) is int for x in ctx)) or tuple(ctx) != bucket:
            raise fail(where, f"{at}.ctx = {ctx!r:.40} must be its context bucket {list(bucket)}")
        level = int_field(where, f"{at}.level", col["level"], 1)
        if not bucket[0] <= level <= bucket[1]:
            raise fail(where, f"{at}.level = {level} must lie in its context bucket {list(bucket)}")
        rates = rates_field(where, f"{at}.acceptance_rates", col["acceptance_rates"])
        if not 1 <= len(rates) <= max_k:
            raise fail(where, f"{at}.acceptance_rates holds {len(rates)} rates; 1..{max_k} (table.max_k) are allowed")
        out.append(ContextColumn(ctx=bucket, level=level,
                                 step_ms=step_ms_field(where, col["step_ms"], max_k, key=f"{at}.step_ms"),
                                 acceptance_rates=rates, pooled=bool_field(where, f"{at}.pooled", col["pooled"])))
    return tuple(out)


def _speculative_config_section(where: str, v: Any, table: _TableFields) -> None:
    """``speculative_config``: its K and its per-batch-size table are the table's."""
    spec = obj_field(where, "speculative_config", v)
    if "num_speculative_tokens" in spec and spec["num_speculative_tokens"] != table.max_k:
        raise fail(where, f"speculative_config.num_speculative_tokens = {spec['num_speculative_tokens']!r} "
                           f"differs from table.max_k = {table.max_k}")
    if "num_speculative_tokens_per_batch_size" in spec:
        spec_ranges = spec["num_speculative_tokens_per_batch_size"]
        plain = isinstance(spec_ranges, list) and all(  # only then can they be sorted and compared
            isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r) for r in spec_ranges)
        if not plain or sorted(tuple(r) for r in spec_ranges) != list(table.ranges):
            raise fail(where, "speculative_config.num_speculative_tokens_per_batch_size differs from table.ranges")
    if CONTEXT_SCHEDULE_KEY in spec:
        _context_schedule(where, spec, table)


def _context_schedule(where: str, spec: dict[str, Any], table: _TableFields) -> None:
    """``speculative_config.speculative_token_schedule`` (vLLM's 5-item form): equal to
    ``table.context_entries``, never beside its 3-item alias, its ``ctx_agg`` the table's."""
    key = f"speculative_config.{CONTEXT_SCHEDULE_KEY}"
    if table.context_entries is None:
        raise fail(where, f"{key} is set but the table has no context_entries; a batch-only table is "
                           "launched with num_speculative_tokens_per_batch_size")
    if "num_speculative_tokens_per_batch_size" in spec:
        raise fail(where, f"{key} and its alias num_speculative_tokens_per_batch_size are both set; vLLM takes one")
    sched = spec[CONTEXT_SCHEDULE_KEY]
    plain = isinstance(sched, list) and all(
        isinstance(r, list) and len(r) == 5 and all(type(x) is int for x in r) for r in sched)
    if not plain or sorted(tuple(r) for r in sched) != list(table.context_entries):
        raise fail(where, f"{key} = {sched!r:.80} differs from table.context_entries")
    if spec.get("ctx_agg", table.ctx_agg) != table.ctx_agg:
        raise fail(where, f"speculative_config.ctx_agg = {spec['ctx_agg']!r:.40} differs from table.ctx_agg = "
                           f"{table.ctx_agg!r}")


def _identity_section(where: str, v: Any, table: _TableFields) -> dict[str, Any] | None:
    """``identity`` (optional). EngineIdentity grows fields over time (the controller compares only
    the ones it knows), so other keys are allowed as long as they hold plain one-line values."""
    if v is None:
        return None
    identity = dict(obj_field(where, "identity", v))
    if len(identity) > 64:
        raise fail(where, f"identity has {len(identity)} keys; not an engine identity")
    for key, value in identity.items():
        if value is not None and type(value) not in (str, int, bool) or (isinstance(value, str) and "\n" in value):
            raise fail(where, f"identity.{key} = {value!r:.80} must be a one-line string, an integer or null")
    for key in ("gpu", "vllm_version", "model", "method"):
        if key in identity:
            str_field(where, f"identity.{key}", identity[key])
    if "drafter" in identity:
        str_field(where, "identity.drafter", identity["drafter"], allow_none=True)
    for key, want in (("max_k", table.max_k), ("max_num_seqs", table.max_num_seqs)):
        if key in identity and int_field(where, f"identity.{key}", identity[key], 1) != want:
            raise fail(where, f"identity.{key} = {identity[key]} differs from table.{key} = {want}")
    return identity


def _prior_section(where: str, v: Any, table: _TableFields) -> PublishedPrior:
    """``prior`` (optional; absent: the table's rates and prior id), with a rate for every k up to max_k."""
    if v is not None:
        prior = _measured_prior(where, v, table.rates)
    else:
        prior = PublishedPrior(rates=table.rates, prior_id=table.prior_id)
    if prior.rates and len(prior.rates) < table.max_k:
        raise fail(where, f"the prior has {len(prior.rates)} rates; max_k = {table.max_k} needs {table.max_k}")
    return prior


def _measured_prior(where: str, v: Any, table_rates: tuple[float, ...]) -> PublishedPrior:
    """A ``prior`` section: rates equal to the table's (when it has them) and consistent counts."""
    p = obj_field(where, "prior", v, PRIOR_KEYS)
    if "rates" not in p:
        raise fail(where, "prior lacks the field 'rates'")
    rates = rates_field(where, "prior.rates", p["rates"])
    if table_rates and tuple(round(r, 9) for r in table_rates) != tuple(round(r, 9) for r in rates):
        raise fail(where, f"prior.rates {list(rates)} differ from table.acceptance_rates {list(table_rates)}")
    drafted = counts_field(where, "prior.drafted_per_pos", p.get("drafted_per_pos", []), len(rates))
    accepted = counts_field(where, "prior.accepted_per_pos", p.get("accepted_per_pos", []), len(rates))
    if len(drafted) != len(accepted):
        raise fail(where, "prior.drafted_per_pos and prior.accepted_per_pos differ in length")
    for i, (d, a) in enumerate(zip(drafted, accepted, strict=True), 1):
        if a > d:
            raise fail(where, f"prior position {i}: accepted {a} > drafted {d}")
    return PublishedPrior(
        rates=rates, num_drafts=int_field(where, "prior.num_drafts", p.get("num_drafts", 0), 0),
        drafted_per_pos=drafted, accepted_per_pos=accepted,
        prior_id=str_field(where, "prior.prior_id", p.get("prior_id"), allow_none=True),
        source=str_field(where, "prior.source", p.get("source"), allow_none=True))


def _allowed_k_section(where: str, raw: Any, table: _TableFields) -> list[int]:
    """``allowed_k`` (optional; absent: the table's k values), sorted, within max_k, listing every k the table uses."""
    table_ks = table.ks
    if raw is None:
        return table_ks
    if not isinstance(raw, list) or not raw:
        raise fail(where, f"allowed_k = {raw!r:.80} must be a non-empty list of k values")
    allowed = sorted({int_field(where, f"allowed_k[{i}]", k, 0) for i, k in enumerate(raw)})
    if allowed[-1] > table.max_k:
        raise fail(where, f"allowed_k has k = {allowed[-1]} > max_k = {table.max_k}")
    missing = sorted(set(table_ks) - set(allowed))
    if missing:
        raise fail(where, f"the table uses k = {missing}, which allowed_k {allowed} does not list")
    return allowed


def _serving_section(where: str, v: Any) -> None:
    """``serving`` (optional): the serving flags and environment the table assumes (reported)."""
    if v is None:
        return
    serving = obj_field(where, "serving", v)
    flags, env = serving.get("flags"), serving.get("env")
    if (set(serving) - {"flags", "env"} or not isinstance(flags, list) or not all(isinstance(f, str) for f in flags)
            or not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise PublishedTableError(f"published table {where}: 'serving' must be {{\"flags\": [strings], \"env\": "
                                  "{name: string}}; republish it with this TableTune")


def _controller_section(where: str, v: Any) -> dict[str, Any]:
    """``controller`` (optional): keys of ControllerSettings, checked by its own reader."""
    controller = dict(obj_field(where, "controller", v or {}))
    if controller:
        try:
            ControllerSettings.from_mapping(controller, where=f"{where}: controller")
        except SettingsError as exc:
            raise PublishedTableError(str(exc)) from None
    return controller


def _served_verification(where: str, v: Any, table: _TableFields) -> dict[str, Any]:
    """The ``served_verification`` section, strictly (``published_schema.SERVED_VERIFICATION_FORMAT``)."""
    key = "served_verification"
    sv = obj_field(where, key, v, _SERVED_KEYS)
    for name in ("passed", "tolerance", "candidate", "loads", "rounds", "window_s", "budget_s", "elapsed_s",
                 "budget_cut", "per_load"):
        if name not in sv:
            raise fail(where, f"{key} lacks the field {name!r}")
    passed = bool_field(where, f"{key}.passed", sv["passed"])
    bool_field(where, f"{key}.budget_cut", sv["budget_cut"])
    if "rule" in sv:
        str_field(where, f"{key}.rule", sv["rule"])
    tol = num_field(where, f"{key}.tolerance", sv["tolerance"])
    if not 0.0 <= tol < 1.0:
        raise fail(where, f"{key}.tolerance = {tol!r} must be in [0, 1)")
    cand = validate_ranges(where, sv["candidate"], table.max_num_seqs, table.max_k)
    if [list(r) for r in cand] != [list(r) for r in table.ranges]:
        raise fail(where, f"{key}.candidate {[list(r) for r in cand]} is not the published table.ranges")
    for name in ("candidate_is", "device", "acceptance", "plot"):
        if sv.get(name) is not None:
            str_field(where, f"{key}.{name}", sv[name])
    expected = sv.get("no_verdict_expected", [])
    if not isinstance(expected, list):
        raise fail(where, f"{key}.no_verdict_expected must be a list of lines")
    for i, line in enumerate(expected):
        str_field(where, f"{key}.no_verdict_expected[{i}]", line)
    if sv.get("plot") is not None and ("/" in sv["plot"] or "\\" in sv["plot"] or not sv["plot"].endswith(".png")):
        raise fail(where, f"{key}.plot = {sv['plot']!r:.80} must be the file name of a PNG beside the published table")
    load_set = _served_loads(where, sv, table.max_num_seqs)
    per = sv["per_load"]
    if not isinstance(per, list):
        raise fail(where, f"{key}.per_load must be a list")
    statuses = [_served_load_row(where, f"{key}.per_load[{i}]", row, load_set, table.max_k)
                 for i, row in enumerate(per)]
    failed = "fail" in statuses
    if passed == failed:
        raise fail(where, f"{key}.passed = {str(passed).lower()} contradicts per_load "
                           f"({'a' if failed else 'no'} load failed)")
    if sv.get("verdict") is not None:
        verdict = sv["verdict"]
        if verdict not in _SERVED_VERDICTS:
            raise fail(where, f"{key}.verdict = {verdict!r:.40} must be one of {list(_SERVED_VERDICTS)}")
        every = bool(statuses) and all(st == "pass" for st in statuses)
        if (verdict == "verified") != every:
            raise fail(where, f"{key}.verdict = {verdict!r} contradicts per_load "
                               f"({'every' if every else 'not every'} load passed)")
    return sv


def _served_loads(where: str, sv: dict[str, Any], max_num_seqs: int) -> set[int]:
    """The served verification's plan: its loads (returned), rounds, window, budget and counts."""
    key = "served_verification"
    loads = sv["loads"]
    if not isinstance(loads, list) or not loads:
        raise fail(where, f"{key}.loads must be a non-empty list of loads")
    load_set = {int_field(where, f"{key}.loads[{i}]", x, 1) for i, x in enumerate(loads)}
    if max(load_set) > max_num_seqs:
        raise fail(where, f"{key}.loads has a load above max_num_seqs = {max_num_seqs}")
    int_field(where, f"{key}.rounds", sv["rounds"], 1)
    for name in ("window_s", "budget_s"):
        if num_field(where, f"{key}.{name}", sv[name]) <= 0:
            raise fail(where, f"{key}.{name} must be > 0 seconds")
    opt_num_field(where, f"{key}.elapsed_s", sv["elapsed_s"], 0.0)
    opt_num_field(where, f"{key}.launch_s", sv.get("launch_s"), 0.0)
    for name in ("excluded_windows", "client_errors"):
        if name in sv:
            int_field(where, f"{key}.{name}", sv[name], 0)
    if sv.get("window") is not None and sv["window"] not in WINDOW_KINDS:
        raise fail(where, f"{key}.window = {sv['window']!r:.40} must be one of {list(WINDOW_KINDS)}")
    if sv.get("requests_per_client") is not None:
        int_field(where, f"{key}.requests_per_client", sv["requests_per_client"], 1)
    return load_set


def _served_load_row(where: str, at: str, row: Any, load_set: set[int], max_k: int) -> str:
    """One ``per_load`` row of the served verification; its status."""
    r = obj_field(where, at, row, _SERVED_LOAD_KEYS)
    for name in ("load", "status", "goodput"):
        if name not in r:
            raise fail(where, f"{at} lacks the field {name!r}")
    if int_field(where, f"{at}.load", r["load"], 1) not in load_set:
        raise fail(where, f"{at}.load = {r['load']} is not one of served_verification.loads")
    if r["status"] not in _SERVED_STATUS:
        raise fail(where, f"{at}.status = {r['status']!r:.40} must be one of {list(_SERVED_STATUS)}")
    if r.get("best_fixed_k") is not None and int_field(where, f"{at}.best_fixed_k", r["best_fixed_k"], 0) > max_k:
        raise fail(where, f"{at}.best_fixed_k = {r['best_fixed_k']} > max_k = {max_k}")
    opt_num_field(where, f"{at}.ratio", r.get("ratio"), 0.0)
    opt_num_field(where, f"{at}.ratio_se", r.get("ratio_se"), 0.0)
    opt_num_field(where, f"{at}.t", r.get("t"), 0.0)
    opt_num_field(where, f"{at}.mean_batch", r.get("mean_batch"), 0.0)
    if "rounds" in r:
        int_field(where, f"{at}.rounds", r["rounds"], 0)
    if r.get("stop") is not None and r["stop"] not in _SERVED_STOPS:
        raise fail(where, f"{at}.stop = {r['stop']!r:.40} must be one of {list(_SERVED_STOPS)}")
    if r.get("candidate_is") is not None and (not isinstance(r["candidate_is"], str) or len(r["candidate_is"]) > 40):
        raise fail(where, f"{at}.candidate_is = {r['candidate_is']!r:.40} must be a policy name such as 'k=2'")
    for name, ref in obj_field(where, f"{at}.references", r.get("references", {})).items():
        ref = obj_field(where, f"{at}.references[{name!r:.40}]", ref, _SERVED_REF_KEYS)
        opt_num_field(where, f"{at}.references[{name!r:.40}].ratio", ref.get("ratio"), 0.0)
        opt_num_field(where, f"{at}.references[{name!r:.40}].ratio_se", ref.get("ratio_se"), 0.0)
        int_field(where, f"{at}.references[{name!r:.40}].rounds", ref.get("rounds", 0), 0)
        if ref.get("same_as") is not None and not isinstance(ref["same_as"], str):
            raise fail(where, f"{at}.references[{name!r:.40}].same_as must be a policy name or null")
    for pol, cell in obj_field(where, f"{at}.goodput", r["goodput"]).items():
        if not isinstance(cell, list) or len(cell) != 3:
            raise fail(where, f"{at}.goodput[{pol!r:.40}] must be [goodput, s.e., windows]")
        opt_num_field(where, f"{at}.goodput[{pol!r:.40}][0]", cell[0], 0.0)
        opt_num_field(where, f"{at}.goodput[{pol!r:.40}][1]", cell[1], 0.0)
        int_field(where, f"{at}.goodput[{pol!r:.40}][2]", cell[2], 0)
    return r["status"]


# -- reading -----------------------------------------------------------------------------------

def read_published_text(path: str | os.PathLike[str]) -> tuple[str, os.stat_result]:
    """The file's text and its stat (size-bounded, UTF-8); errors say which file and what is wrong."""
    p = Path(path)
    try:
        raw, st = strict_io.read_bounded(p, MAX_PUBLISHED_BYTES)  # a regular file only: a FIFO never blocks
    except FileNotFoundError:
        raise PublishedTableError(f"published table {p} does not exist; publish one with the pipeline first") from None
    except IsADirectoryError:
        raise PublishedTableError(f"published table {p} is a folder, not a file") from None
    except strict_io.NotRegularFileError as exc:
        raise PublishedTableError(f"published table {p} is {exc.kind}, not a regular file; it was not read") from None
    except strict_io.FileTooLargeError:
        raise PublishedTableError(f"published table {p} is larger than {MAX_PUBLISHED_BYTES} bytes; not a "
                                  "TableTune published table") from None
    except OSError as exc:
        raise PublishedTableError(f"cannot read published table {p}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8"), st
    except UnicodeDecodeError as exc:
        raise PublishedTableError(f"published table {p} is not UTF-8 (byte {exc.start}); not a TableTune "
                                  "published table") from None


def load_published(path: str | os.PathLike[str]) -> PublishedTable:
    """Read and strictly validate a published file (the controller's reader)."""
    text, _ = read_published_text(path)
    try:
        doc = strict_json_loads(text)
    except ValueError as exc:  # JSONDecodeError and StrictJSONError (NaN, duplicate keys, depth, digits)
        raise PublishedTableError(f"published table {path} is not valid JSON: {exc}") from None
    return parse_published(doc, str(path))


def read_published_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a published table file, strictly validated, as its JSON document."""
    return load_published(path).document

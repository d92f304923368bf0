"""Building a published document: ``published_document`` (the JSON body of a publication, checked
with the strict reader before it is returned), the serving envelope beside ``--speculative-config``,
and the keyword arguments of a deployment with the controller (``controller_fields``). Stdlib only,
plus the published file's schema and strict reader."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tabletune_pipelines.errors import PublishedTableError
from tabletune_pipelines.formats.published import parse_published, strict_json_loads
from tabletune_pipelines.formats.published_schema import (
    PRIOR_KEYS,
    PUBLISHED_SCHEMA,
    PUBLISHED_SCHEMA_VERSION,
    PublishedVersion,
)
from tabletune_pipelines.vocab import vllm_compilation_config


def published_document(
    publication: PublishedVersion, *, identity: Mapping[str, Any] | None = None, prior: Mapping[str, Any] | None = None,
    allowed_k: Sequence[int] | None = None, controller: Mapping[str, Any] | None = None,
    evidence: Mapping[str, Any] | None = None, served_verification: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of the file that publishes ``publication``.

    ``identity``: ``EngineIdentity.to_dict()`` (the controller compares model, method, K,
    max_num_seqs and vLLM version with the engine it runs in). ``prior``: the AcceptancePrior's
    rates and counts (``rates``, ``num_drafts``, ``drafted_per_pos``, ``accepted_per_pos``,
    ``prior_id``, ``source``). ``allowed_k``: the k values the controller may choose (default: the
    table's). ``controller``: the deployment's controller settings (docs/controller.md).
    ``served_verification``: ``ServedVerification.to_dict()`` of the check the table passed
    (``SERVED_VERIFICATION_FORMAT``). The document is validated with ``parse_published`` before it
    is returned.
    """
    deployment, table = publication.deployment, publication.table
    doc: dict[str, Any] = {
        "schema": PUBLISHED_SCHEMA,
        "schema_version": PUBLISHED_SCHEMA_VERSION,
        "deployment": deployment,
        "version": int(publication.version),
        "published_at": publication.published_at,
        "table": table,
        "speculative_config": publication.speculative_config,
    }
    if identity is not None:
        doc["identity"] = {k: v for k, v in dict(identity).items() if k not in ("schema", "schema_version")}
    if prior is not None:
        doc["prior"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(prior).items()
                        if k in PRIOR_KEYS}
    doc["allowed_k"] = sorted({int(k) for k in allowed_k} if allowed_k is not None  # every k of ranges and the grid
                              else {int(r[-1]) for r in [*table.get("ranges", []), *table.get("context_entries", [])]})
    doc["controller"] = dict(controller or {})
    if evidence is not None:
        doc["evidence"] = dict(evidence)
    if served_verification is not None:
        doc["served_verification"] = dict(served_verification)
    if identity is not None:
        doc["serving"] = serving_envelope(doc["identity"])
    roundtrip_check(doc, f"being published for {deployment!r}")
    return doc


def serving_envelope(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The serving flags and environment the table assumes, beside ``--speculative-config``: the
    engine the profile measured (its graph envelope and model runner, docs/method.md, "What a served
    step costs"). An operator who serves with them gets the step costs the table was derived from."""
    flags: list[str] = ["--max-num-seqs", str(int(identity["max_num_seqs"]))]
    mode = str(identity.get("cudagraph_mode") or "none")
    compilation = {} if mode.lower() == "none" else vllm_compilation_config(mode, identity.get("capture_ceiling"))
    if compilation:  # what every measurement launch of the identity passed (engine/command.py)
        flags += ["--compilation-config", json.dumps(compilation, separators=(",", ":"))]
    if identity.get("max_num_batched_tokens") is not None:
        flags += ["--max-num-batched-tokens", str(int(identity["max_num_batched_tokens"]))]
    env = {}
    runner = identity.get("model_runner")
    if runner in ("v1", "v2"):
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    return {"flags": flags, "env": env}


def roundtrip_check(doc: dict[str, Any], where: str) -> None:
    """Check ``doc`` as the reader will see it (tuples become lists, NaN is refused)."""
    try:
        text = json.dumps(doc, allow_nan=True)
        decoded = strict_json_loads(text)
    except (TypeError, ValueError) as exc:
        raise PublishedTableError(f"published table {where}: cannot be written as strict JSON: {exc}") from None
    parse_published(decoded, where)


def controller_fields(
    *, identity: Any = None, prior: Any = None, controller: Mapping[str, Any] | None = None,
    live_counters: str | os.PathLike[str] | None = None, allowed_k: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``published_document`` keyword arguments for a deployment with the controller.

    ``identity``: an ``EngineIdentity`` (or its dict) of the table's engine; ``prior``: the
    ``AcceptancePrior`` (or its dict) the table was built from; ``controller``: the fleet
    deployment's ``controller:`` mapping; ``live_counters``: the fleet's ``live_counters`` path, which
    becomes the controller's ``export_path`` unless the mapping sets one (what the controller
    exports is then what ``live_acceptance_counters`` ingests). Objects are read through their
    ``to_dict()``, so this module needs no document class.
    """

    def as_dict(x: Any) -> dict[str, Any] | None:
        if x is None:
            return None
        return dict(x.to_dict() if hasattr(x, "to_dict") else x)

    out: dict[str, Any] = {}
    ident = as_dict(identity)
    if ident is not None:
        out["identity"] = ident
    p = as_dict(prior)
    if p is not None:
        pid = getattr(prior, "prior_id", None) or p.get("prior_id")
        out["prior"] = {"rates": list(p["rates"]), "num_drafts": int(p.get("num_drafts", 0)),
                        "drafted_per_pos": list(p.get("drafted_per_pos", ())),
                        "accepted_per_pos": list(p.get("accepted_per_pos", ())),
                        "prior_id": pid, "source": p.get("source")}
    ctl = dict(controller or {})
    if live_counters is not None and "export_path" not in ctl:
        ctl["export_path"] = os.fspath(live_counters)
    export = ctl.get("export_path")
    if isinstance(export, str) and os.path.isabs(export):  # a relative one is the published file's folder's
        # The controller will append there: refused before anything is published.
        from tabletune_pipelines.formats.live_counters import check_live_counters_target

        check_live_counters_target(export)  # LiveCountersError naming the file and what it is
    out["controller"] = ctl
    if allowed_k is not None:
        out["allowed_k"] = sorted({int(k) for k in allowed_k})
    return out

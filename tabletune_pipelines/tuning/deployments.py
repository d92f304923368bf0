"""What TableTune does with a deployment of the fleet: its engine identity, its profile, its acceptance.

Library code (no Dagster): the pipeline's ``EngineResource`` and the CLI both call these functions.
Identity probing asks vLLM's ``GET /version`` for remote deployments and the installed
distribution for ``endpoint: embedded``; profiling and acceptance measurement launch the local
engine (``tabletune_pipelines.engine``) and refuse when it is not the version the identity names.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, overload

from tabletune_pipelines.core.table import context_buckets
from tabletune_pipelines.engine.client import EngineClient
from tabletune_pipelines.engine.identity import deployment_identity
from tabletune_pipelines.engine.installed import installed_vllm_version
from tabletune_pipelines.engine.plan import LaunchOverrides, ProfileOptions
from tabletune_pipelines.errors import (
    EndpointUnreachable,
    EngineConfigError,
    EngineError,
    EngineMismatchError,
    InvalidTableError,
    InvalidValueError,
    NotFoundError,
)
from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity, StepTimeProfile
from tabletune_pipelines.formats.fleet import Deployment, Fleet, tabletune_home
from tabletune_pipelines.formats.identity_match import COMPARED_FIELDS, identity_mismatches
from tabletune_pipelines.options import Bound, check_bounds, options_from_mapping

__all__ = [
    "AcceptanceOptions", "CurrentIdentity", "Engine", "EndpointUnreachable", "LocalEngine", "EngineMismatchError",
    "ProfileOptions",
    "check_local_engine", "current_identity", "default_cache_dir", "default_work_dir", "deployment_for_identity",
    "deployments_running", "identity_for", "measure_acceptance", "one_launch", "probe_vllm_version", "profile",
    "resolve_identity",
    "resolve_model", "same_engine", "verification_launch_table", "verify_served",
]

TINY_PREFIX = "tiny:"
"""Fleet model names ``tiny:<size>`` are the project's tiny local models, built on first use."""

CurrentIdentity = Callable[[Deployment], EngineIdentity]
"""How the caller learns a deployment's current identity (the pipeline's resource or ``current_identity``)."""


class Engine(Protocol):
    """How a pipeline run reaches a deployment's vLLM: the pipeline's ``EngineResource`` (these functions
    with its configuration), or a test's scripted engine. The run-level library functions
    (``tuning.measure``, ``tuning.feedback.ingest_live_counters``, ``publishing``) take one."""

    @property
    def acceptance_options(self) -> Mapping[str, Any]:
        """``AcceptanceOptions`` fields (the seed of the prompt sample among them)."""

    def current_identity(self, dep: Deployment) -> EngineIdentity: ...

    def local_model_path(self, name: str | None, drafter: bool = False, dtype: str | None = None) -> str | None: ...

    def profile(self, identity: EngineIdentity, dep: Deployment | None, store: Any,
                log: logging.Logger) -> StepTimeProfile: ...

    def measure_acceptance(self, identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str,
                           log: logging.Logger) -> AcceptancePrior: ...

    def served_verification_options(self) -> Any: ...

    def verify_served(self, identity: EngineIdentity, dep: Deployment | None, table: Any,
                      prior: AcceptancePrior | None, log: logging.Logger) -> Any: ...


# -- identity ------------------------------------------------------------------------------

def probe_vllm_version(endpoint: str, timeout_s: float = 5.0) -> str:
    """``GET <endpoint>/version`` → the version (``engine.client``: ``EngineClient.version``, whose
    ``version_from_answer`` is the one reading of the answer); no answer, an error status or an answer
    without a non-empty version → EndpointUnreachable."""
    try:
        return EngineClient(endpoint).version(timeout=timeout_s)
    except EngineError as exc:
        raise EndpointUnreachable(str(exc)) from None


def identity_for(dep: Deployment, vllm_version: str) -> EngineIdentity:
    """The identity of ``dep`` when it runs vLLM ``vllm_version`` (built by ``engine.identity``, the one place)."""
    return deployment_identity(dep, vllm_version)


def current_identity(dep: Deployment, timeout_s: float = 5.0) -> EngineIdentity:
    """The engine identity the deployment runs right now: the fleet file + the installed vLLM
    (``endpoint: embedded``) or the endpoint's ``GET /version``."""
    version = installed_vllm_version() if dep.embedded else probe_vllm_version(dep.endpoint, timeout_s)
    return identity_for(dep, version)


def same_engine(dep: Deployment, identity: EngineIdentity) -> bool:
    """Whether ``identity`` describes ``dep``'s GPU, model, drafter, method and shape (any vLLM version),
    by the comparison the controller uses on a published file (``identity_match.identity_mismatches``)."""
    fields = [f for f in COMPARED_FIELDS if f != "vllm_version"]
    return not identity_mismatches(identity.to_dict(), {f: getattr(dep, f) for f in fields}, fields=fields)


def deployment_for_identity(fleet: Fleet, identity: EngineIdentity, preferred: str = "") -> Deployment | None:
    """``preferred`` (a deployment name), else the first deployment of the fleet with this engine."""
    if preferred:
        return fleet.deployment(preferred)
    return next((d for d in fleet.deployments if same_engine(d, identity)), None)


def deployments_running(key: str, fleet: Fleet, identity_of: CurrentIdentity) -> tuple[list[Deployment], list[str]]:
    """Deployments whose current identity is ``key``, and one note per deployment that did not answer."""
    running, notes = [], []
    for d, ident, exc in _current_identities(fleet, identity_of):
        if exc is not None:
            notes.append(f"{d.name}: unreachable ({exc})")
        elif ident.key == key:
            running.append(d)
    return running, notes


def _current_identities(fleet: Fleet, identity_of: CurrentIdentity):
    """(deployment, its current identity or None, the EndpointUnreachable or None) for each deployment."""
    for d in fleet.deployments:
        try:
            yield d, identity_of(d), None
        except EndpointUnreachable as exc:
            yield d, None, exc


def resolve_identity(key: str, *, identity_json: str, fleet: Fleet, known: Callable[[str], EngineIdentity | None],
                     identity_of: CurrentIdentity) -> EngineIdentity:
    """The EngineIdentity behind a partition key: ``identity_json`` (set by the upgrade sensor), else
    ``known(key)`` (the store), else a deployment of the fleet that runs it now."""
    if identity_json:
        ident = EngineIdentity.from_json(identity_json)
        if ident.key != key:
            raise InvalidValueError(f"run config identity_json has key {ident.key}, but the run's partition is {key}; "
                                    "launch the run for the partition of that identity")
        return ident
    stored = known(key)
    if stored is not None:
        return stored
    unreachable = []
    for d, ident, exc in _current_identities(fleet, identity_of):
        if exc is not None:
            unreachable.append(f"{d.name}: {exc}")
        elif ident.key == key:
            return ident
    raise NotFoundError(
        f"partition {key} is not an engine identity TableTune knows: it is not in the store and no deployment of "
        f"{fleet.source} runs it now" + (f" (unreachable: {'; '.join(unreachable)})" if unreachable else "")
        + "; partitions are added by engine_upgrade_sensor when a deployment starts running a new engine")


def check_local_engine(identity: EngineIdentity) -> None:
    """Measurements launch vLLM here: it must be the version the identity names, by the one comparison
    of engine identities (``identity_match.identity_mismatches``: the same public version, so
    ``0.32.0+cpu`` is ``0.32.0``), the rule the controller applies to a published file."""
    here = installed_vllm_version()
    if identity_mismatches({"vllm_version": identity.vllm_version}, {"vllm_version": here}, fields=("vllm_version",)):
        raise EngineMismatchError(
            f"this run's environment has vLLM {here}, but partition {identity.key} needs vLLM "
            f"{identity.vllm_version}; run it where that version is installed (on Kubernetes: the "
            "deployment's k8s.image in the fleet file)"
        )


# -- local paths ---------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """Where the tiny local models are built: ``$TABLETUNE_HOME/models``."""
    return tabletune_home() / "models"


def default_work_dir(sub: str) -> Path:
    """Server logs and scratch of one kind of launch: ``$TABLETUNE_HOME/work/<sub>`` (created)."""
    p = tabletune_home() / "work" / sub
    p.mkdir(parents=True, exist_ok=True)
    return p


@overload
def resolve_model(name: str, cache_dir: str | Path, *, drafter: bool = False, dtype: str | None = None) -> str: ...
@overload
def resolve_model(name: None, cache_dir: str | Path, *, drafter: bool = False, dtype: str | None = None) -> None: ...
@overload
def resolve_model(name: str | None, cache_dir: str | Path, *, drafter: bool = False,
                  dtype: str | None = None) -> str | None: ...
def resolve_model(name: str | None, cache_dir: str | Path, *, drafter: bool = False,
                  dtype: str | None = None) -> str | None:
    """``tiny:<size>`` → the tiny local model folder saved in ``dtype`` (built once; None: this
    machine's default dtype); ``real:<name>`` → the real model converted once from its package
    (``engine/real_model.py``; it has no draft model); anything else unchanged."""
    if name is not None and name.startswith("real:"):
        from tabletune_pipelines.engine.real_model import REAL_PREFIX, ensure_real_model

        return str(ensure_real_model(None, name[len(REAL_PREFIX):], dtype).model_dir)  # one per venv
    if name is None or not name.startswith(TINY_PREFIX):
        return name
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    models = ensure_tiny_models(cache_dir, name[len(TINY_PREFIX):] or "small", dtype)
    return str(models.draft_dir if drafter else models.target_dir)


# -- measurement options -------------------------------------------------------------------
# What a profile measures is the engine's ``ProfileOptions`` (engine/plan.py), re-exported here.

@dataclass(frozen=True)
class AcceptanceOptions(LaunchOverrides):
    """How acceptance is measured on a prompt file (docs/method.md, "Acceptance"); the server
    settings of its launch are ``engine.plan.LaunchOverrides``."""

    max_tokens: int | None = None
    """Tokens generated per prompt; None = the engine's default."""
    seed: int = 0
    """Seed of the prompt sample and of sampling."""
    context_levels: tuple[int, ...] = ()
    """The plan's context levels (tokens, ascending): two or more measure acceptance per context
    bucket (``core.context_acceptance``); none or one measure one bucket, the prior alone."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # the launch overrides' are engine.plan.PROFILE_LIMITS
        "max_tokens": Bound(1, 1_000_000, integer=True, optional=True, why="tokens generated per prompt"),
        "seed": Bound(0, 2 ** 63 - 1, integer=True, why="a random seed"),
    }

    def __post_init__(self) -> None:
        LaunchOverrides.__post_init__(self)
        check_bounds(self, where="acceptance options", error=InvalidValueError)
        levels = self.context_levels
        if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)) or any(
                isinstance(x, bool) or not isinstance(x, int) for x in levels):
            raise InvalidValueError(f"acceptance options: context_levels = {levels!r:.60} must be a list of "
                                    "integers (tokens)")
        object.__setattr__(self, "context_levels", tuple(levels))
        if levels:
            try:
                context_buckets(levels, levels[-1])  # the one rule: positive, strictly ascending
            except InvalidTableError as exc:
                raise InvalidValueError(f"acceptance options: context_levels: {exc}") from None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "acceptance options") -> AcceptanceOptions:
        """Options from a dict (a Dagster resource config; ``options.options_from_mapping``); an unknown
        key is named with ``where``."""
        return options_from_mapping(cls, data, where=where, error=InvalidValueError)


# -- measurement ---------------------------------------------------------------------------

def _server_config(identity: EngineIdentity, dep: Deployment | None, cache_dir: str | Path, work_dir: str | Path,
                   overrides: Mapping[str, Any]) -> Any:
    from tabletune_pipelines.engine.config import OWNED_SPECULATIVE_KEYS, ServerConfig

    # The deployment's extra --speculative-config keys, minus those the measurement launch sets
    # itself (its serving table or rejection mode would otherwise replace the profiler's).
    extra = {k: v for k, v in dep.speculative_config.items() if k not in OWNED_SPECULATIVE_KEYS} if dep else {}
    settings: dict[str, Any] = {**launch_envelope(identity), "extra_env": compile_cache_env(identity)}
    settings.update(overrides)
    return ServerConfig(
        model=resolve_model(identity.model, cache_dir, dtype=identity.dtype),
        drafter=resolve_model(identity.drafter, cache_dir, drafter=True, dtype=identity.dtype),
        method=identity.method, num_speculative_tokens=identity.max_k, max_num_seqs=identity.max_num_seqs,
        dtype=identity.dtype, work_dir=str(work_dir), speculative_extra=extra,
        model_runner=identity.model_runner, load_format=dep.load_format if dep else None, **settings,
    )


def launch_envelope(identity: EngineIdentity) -> dict[str, Any]:
    """The graph envelope the identity names, as ``ServerConfig`` fields: every launch that measures
    an identity runs in its envelope. A declared CUDA-graph mode (the fleet's ``cudagraph_mode``) is
    passed as ``cudagraph_mode``; a capture ceiling other than vLLM's own rule
    (``core.stepcost.default_capture_ceiling``) as ``max_cudagraph_capture_size``; a token budget as
    ``max_num_batched_tokens``; vLLM's defaults are left to vLLM."""
    from tabletune_pipelines.core.stepcost import default_capture_ceiling

    out: dict[str, Any] = {}
    mode = identity.cudagraph_mode
    if mode is not None and mode.lower() not in ("none", "default"):  # "none": the identity of an eager engine
        out["cudagraph_mode"] = mode
    ceiling = identity.capture_ceiling
    if ceiling is not None and ceiling != default_capture_ceiling(identity.max_num_seqs, identity.max_k):
        out["max_cudagraph_capture_size"] = int(ceiling)
    if identity.max_num_batched_tokens is not None:
        out["max_num_batched_tokens"] = int(identity.max_num_batched_tokens)
    return out


COMPILE_CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""The compile caches a GPU launch keeps under the store's home (vLLM's, torch inductor's, Triton's)."""


def compile_cache_dir(identity: EngineIdentity) -> Path:
    """``$TABLETUNE_HOME/compile-cache/<identity key>``: one engine's compile caches, so a second launch
    of the same engine (re-profiling after a prior-only change, a second deployment on the node)
    starts warm."""
    return tabletune_home() / "compile-cache" / identity.key


def compile_cache_env(identity: EngineIdentity) -> dict[str, str]:
    """The launch environment that keeps a GPU engine's compile caches under ``compile_cache_dir``
    (none on the CPU build, which runs eagerly and compiles nothing)."""
    if identity.gpu == "cpu":
        return {}
    root = compile_cache_dir(identity)
    return {var: str(root / var.split("_")[0].lower()) for var in COMPILE_CACHE_VARS}


def _real_model_overrides(identity: EngineIdentity) -> dict[str, Any]:
    """Real prompts run long: a ``real:`` model's launches get its context length."""
    if not (identity.model or "").startswith("real:"):
        return {}
    from tabletune_pipelines.engine.real_model import MAX_MODEL_LEN

    return {"max_model_len": MAX_MODEL_LEN}


def with_fleet_levels(options: ProfileOptions, dep: Deployment | None) -> ProfileOptions:
    """``options`` with the deployment's ``context_levels`` where the options name none."""
    if options.context_levels is None and dep is not None and dep.context_levels:
        return dataclasses.replace(options, context_levels=dep.context_levels)
    return options


@contextmanager
def one_launch(identity: EngineIdentity, dep: Deployment | None, *, log: logging.Logger,
               options: ProfileOptions | None = None, cache_dir: str | Path | None = None,
               work_dir: str | Path | None = None) -> Iterator[Any]:
    """One running launch of ``identity`` that serves the whole tuning flow: the profile (every k of the
    plan in its launch table, switched at runtime, synthetic rates 0) and then the served verification
    (the prior's rates switched in at runtime; ``verify_served(server=...)``). Stopped on exit.

    A verification whose acceptance is ``real`` (real weights, real prompts) cannot share it: the
    profile's launch rejects drafts synthetically, so that verification launches its own server."""
    check_local_engine(identity)
    from tabletune_pipelines.engine.envelope_log import envelope_checked
    from tabletune_pipelines.engine.plan import context_config, plan_from_options, switching_config

    opts = with_fleet_levels(options or ProfileOptions(), dep)
    work = Path(work_dir or default_work_dir("flow"))
    cfg = opts.apply_to(_server_config(identity, dep, cache_dir or default_cache_dir(), work,
                                       _real_model_overrides(identity)))
    plan = plan_from_options(cfg, opts)
    cfg = context_config(cfg, plan)  # the profile's longest context level fits the one launch
    ks = sorted({k for k in plan.ks if k is not None} | set(range(identity.max_k + 1)))
    with envelope_checked(identity, log.info)(switching_config(cfg, ks, 0.0, str(work))) as server:
        log.info(f"one launch of {identity.key}: up in {server.startup_seconds:.0f} s; it serves the profile, "
                 "then the served verification")
        yield server


def profile(identity: EngineIdentity, dep: Deployment | None, store: Any, *, log: logging.Logger,
            options: ProfileOptions | None = None, cache_dir: str | Path | None = None,
            work_dir: str | Path | None = None, server: Any = None) -> StepTimeProfile:
    """Measure (or resume) the step-time profile of ``identity`` on the local engine.

    Each cell is written to ``store`` (a ``TableTuneStore``) as soon as it is measured; cells
    already there are skipped, so a re-run after a crash resumes. With ``options.fixed_k_baseline``
    the engine-dependence baseline (a launch per k with K = k and no table) is measured after.
    ``server``: a running launch to profile on (``one_launch``) instead of launching one.
    """
    check_local_engine(identity)
    from tabletune_pipelines.engine.envelope_log import envelope_checked
    from tabletune_pipelines.engine.plan import fixed_k_baseline_options, plan_from_options
    from tabletune_pipelines.engine.profile_run import ProfileServers
    from tabletune_pipelines.engine.profiler import profile_step_times, store_hooks

    opts = with_fleet_levels(options or ProfileOptions(), dep)
    if opts.decision_rates is None:  # re-measure where decisions are close under the acceptance the store knows
        priors = [p for p in store.applicable_priors(identity) if len(p.rates) >= identity.max_k]
        if priors:
            opts = dataclasses.replace(opts, decision_rates=tuple(priors[0].rates[:identity.max_k]))
    cfg = _server_config(identity, dep, cache_dir or default_cache_dir(), work_dir or default_work_dir("profile"), {})
    result = profile_step_times(cfg, opts, hooks=store_hooks(store, identity, opts.mode), identity=identity,
                                servers=ProfileServers(server=server, factory=envelope_checked(identity, log.info)),
                                progress=log.info)
    if opts.fixed_k_baseline and opts.mode != "fixed_k":
        fixed = fixed_k_baseline_options(opts, plan_from_options(opts.apply_to(cfg), opts))
        profile_step_times(cfg, fixed, hooks=store_hooks(store, identity, "fixed_k"), identity=identity,
                           servers=ProfileServers(factory=envelope_checked(identity, log.info)), progress=log.info)
    return result


def measure_acceptance(identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str, *,
                       log: logging.Logger, options: AcceptanceOptions | None = None,
                       cache_dir: str | Path | None = None, work_dir: str | Path | None = None) -> AcceptancePrior:
    """Acceptance a_1..a_K of the deployment's model and drafter on a prompt file: a local launch at
    K = max_k (fixed, no table), ``dep.max_prompts`` prompts sampled with a fixed seed at the
    deployment's temperature."""
    check_local_engine(identity)
    from tabletune_pipelines.engine import acceptance as engine_acceptance
    from tabletune_pipelines.engine.envelope_log import envelope_checked

    opts = options or AcceptanceOptions()
    if not opts.context_levels and dep.context_levels:  # the buckets of the deployment's profile
        opts = dataclasses.replace(opts, context_levels=tuple(dep.context_levels))
    if opts.max_model_len is None and (long := _real_model_overrides(identity)):  # real prompts run long
        opts = dataclasses.replace(opts, **long)
    cfg = _server_config(identity, dep, cache_dir or default_cache_dir(),
                         work_dir or default_work_dir("acceptance"), opts.server_overrides())
    log.info(f"measuring acceptance of {identity.key} on {prompts_file} (<= {dep.max_prompts} prompts)")
    extra = {"max_tokens": opts.max_tokens} if opts.max_tokens is not None else {}
    if opts.context_levels and opts.context_levels[-1] > cfg.max_model_len:
        raise InvalidValueError(f"acceptance options: context level {opts.context_levels[-1]} is above the "
                                f"launch's max_model_len = {cfg.max_model_len}; raise max_model_len or lower it")
    with envelope_checked(identity, log.info)(dataclasses.replace(cfg, table=None)) as server:  # fixed K
        return engine_acceptance.measure_acceptance_from_file(
            cfg, prompts_file, n=dep.max_prompts, temperature=dep.temperature, week=week, deployment=dep.name,
            source="measured", seed=opts.seed, server=server, context_levels=opts.context_levels, **extra,
        )


def verification_launch_table(max_num_seqs: int, max_k: int) -> tuple[tuple[int, int, int], ...]:
    """A launch table that lists every k (``[[1,1,0],[2,2,1],...,[K+1,M,K]]``): runtime tables need a
    launch table, and on a GPU Model Runner V2 captures full CUDA graphs only for its k values."""
    if max_num_seqs < max_k + 1:
        return ((1, max_num_seqs, max_k),)
    return tuple((k + 1, k + 1, k) for k in range(max_k)) + ((max_k + 1, max_num_seqs, max_k),)


def verify_served(identity: EngineIdentity, dep: Deployment | None, table: Any, prior: AcceptancePrior | None, *,
                  log: logging.Logger, options: Any = None, cache_dir: str | Path | None = None,
                  work_dir: str | Path | None = None, server: Any = None) -> Any:
    """Launch the local engine of ``identity`` once and verify ``table`` (a ``DraftLengthTable``) by
    served goodput against every fixed k (``tuning.served_verification.verify_on_server``; docs/evaluation.md,
    "Served verification"). The workload: the deployment's logged prompts of the prior's week when
    they exist, else the embedded default's prompt set. Acceptance (``options.acceptance``): real
    verification of the drafts, or synthetic at the prior's rates (``prior``; ``auto`` picks it for
    dummy weights). Returns a ``ServedVerification`` with ``launch_s`` set. ``server``: the flow's
    running launch (``one_launch``) to verify on with the prior's rates switched in; a ``real``
    verification launches its own (the shared launch rejects drafts synthetically). Where that
    launch does not take the new rates, it is stopped before the verification's own launch starts."""
    check_local_engine(identity)
    from tabletune_pipelines.engine.acceptance import write_default_prompt_file
    from tabletune_pipelines.engine.envelope_log import envelope_checked
    from tabletune_pipelines.formats.prompts import load_prompts
    from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions

    opts = options or ServedVerificationOptions()
    work = Path(work_dir or default_work_dir("verify"))
    mode = opts.acceptance
    if mode == "auto":
        mode = "prior" if (dep is not None and dep.load_format == "dummy") else "real"
    overrides: dict[str, Any] = {"table": verification_launch_table(identity.max_num_seqs, identity.max_k)}
    if mode == "prior":
        rates = tuple(float(r) for r in (prior.rates if prior is not None else table.acceptance_rates))[:identity.max_k]
        overrides["synthetic_acceptance_rates"] = rates
        acceptance = f"prior {[round(r, 3) for r in rates]}"
    else:
        acceptance = "real"
    if opts.startup_timeout is not None:
        overrides["startup_timeout"] = opts.startup_timeout
    overrides.update(_real_model_overrides(identity))
    cfg = _server_config(identity, dep, cache_dir or default_cache_dir(), work, overrides)
    prompts_file = dep.prompts_file(prior.week) if (dep is not None and prior is not None and prior.week) else None
    if prompts_file is None or not prompts_file.is_file():
        prompts_file = write_default_prompt_file(work / "default-prompts.jsonl")
    prompts = load_prompts(prompts_file)
    shared = server is not None and mode == "prior"
    if server is not None and not shared:
        log.info("served verification with real acceptance: the flow's launch rejects drafts synthetically, so the "
                 "verification launches its own server")
    where = "on the flow's launch" if shared else "one launch"
    log.info(f"served verification of {identity.key}: {where}, acceptance {acceptance}, workload {prompts_file} "
             f"({len(prompts)} prompts)")
    if shared:
        try:
            server.set_synthetic_rates(overrides["synthetic_acceptance_rates"])
        except (EngineError, EngineConfigError) as exc:
            log.warning(f"the flow's launch did not switch its synthetic rates ({str(exc).splitlines()[0]}); "
                        "stopping it, and the verification launches its own server")
            server.stop()  # one launch at a time: two would share one GPU's memory (or the CPU's core 0)
            shared = False
    if shared:
        return _run_verification(server, table, identity, opts, prompts, acceptance, log)
    with envelope_checked(identity, log.info)(cfg) as launched:
        log.info(f"verification server up in {launched.startup_seconds:.0f} s")
        return dataclasses.replace(_run_verification(launched, table, identity, opts, prompts, acceptance, log),
                                   launch_s=launched.startup_seconds)


def _run_verification(server: Any, table: Any, identity: EngineIdentity, opts: Any, prompts: Any, acceptance: str,
                      log: logging.Logger) -> Any:
    """``tuning.served_verification.verify_on_server`` of ``table`` on a running ``server`` with ``opts``."""
    from tabletune_pipelines.tuning.run_report import docs_table
    from tabletune_pipelines.tuning.served_verification import verify_on_server

    M, K = identity.max_num_seqs, identity.max_k
    within = {int(b): tuple(int(k) for k in ks) for b, ks in (getattr(table, "within_noise", None) or {}).items()}
    return verify_on_server(
        server, [list(r) for r in table.ranges], K=K, max_num_seqs=M, loads=opts.loads, rounds=opts.rounds,
        window_s=opts.window_s, budget_s=opts.budget_s, window=opts.window,
        requests_per_client=opts.requests_per_client, settle_s=opts.settle_s, warmup_s=opts.warmup_s,
        first_warmup_s=opts.first_warmup_s, min_steps=opts.min_steps, tolerance=opts.tolerance,
        prompt=lambda rng: rng.choice(prompts), output_tokens=tuple(opts.output_tokens), acceptance=acceptance,
        progress=log.info, fixed_k=opts.fixed_k, within_noise=within,
        references={"docs' table": docs_table(M, K)} if opts.compare_docs_table else None,
        profile_steps=_profile_steps(table))


def _profile_steps(table: Any) -> tuple[dict, tuple[float, ...]] | None:
    """The table's decode step times and acceptance rates, for sizing the verification; None where
    the table carries no step time for some k at some batch size."""
    steps, rates = getattr(table, "step_ms", None), getattr(table, "acceptance_rates", None)
    M, K = table.max_num_seqs, table.max_k
    if not steps or not rates or any(str(b) not in steps.get(str(k), {})
                                     for k in range(K + 1) for b in range(1, M + 1)):
        return None
    return steps, tuple(float(r) for r in rates)


# -- the engine without Dagster ------------------------------------------------------------

@dataclass(frozen=True)
class LocalEngine:
    """The ``Engine`` of a run without Dagster (a GPU node with only vLLM: ``benchmarks/gpu_flow.py``):
    the functions above with one configuration. The pipeline's ``EngineResource`` holds the same
    fields as Dagster config and hands every call to one of these."""

    cache_dir: str | None = None
    """Tiny models cache; None = ``$TABLETUNE_HOME/models``."""
    work_dir: str | None = None
    """Server logs and scratch; None = ``$TABLETUNE_HOME/work``."""
    probe_timeout_s: float = 5.0
    """Timeout of a deployment's ``/version`` probe."""
    profile_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``ProfileOptions`` fields, e.g. batch_sizes, repetitions, fixed_k_baseline."""
    acceptance_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``AcceptanceOptions`` fields, e.g. max_tokens, seed."""
    served_verification: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``tuning.served_plan.ServedVerificationOptions`` fields of the check before publishing."""
    where: str = "engine"
    """How error messages name this configuration (the pipeline: ``EngineResource``)."""
    server: Any = None
    """A running launch (``one_launch``) that profiles and verifies on instead of launching; None: each
    measurement launches its own."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # ``options.check_bounds``: NaN, infinity and a bool are refused
        "probe_timeout_s": Bound(0.0, 3600.0, low_open=True, why="seconds a /version probe may wait; at most an "
                                                                  "hour"),
    }

    def __post_init__(self) -> None:
        check_bounds(self, where=self.where, error=InvalidValueError)

    def check_options(self) -> None:
        """Every option mapping read by its class (``ProfileOptions``, ``AcceptanceOptions``,
        ``ServedVerificationOptions``), so a bad number is refused before anything launches."""
        ProfileOptions.from_mapping(self.profile_options, where=f"{self.where} profile_options")
        AcceptanceOptions.from_mapping(self.acceptance_options, where=f"{self.where} acceptance_options")
        self.served_verification_options()

    def _cache(self) -> str:
        return self.cache_dir or str(default_cache_dir())

    def _work(self, sub: str) -> Path:
        if self.work_dir is None:
            return default_work_dir(sub)
        p = Path(self.work_dir) / sub
        p.mkdir(parents=True, exist_ok=True)
        return p

    def current_identity(self, dep: Deployment) -> EngineIdentity:
        """Raises ``errors.EndpointUnreachable`` when a remote endpoint does not answer."""
        return current_identity(dep, self.probe_timeout_s)

    def local_model_path(self, name: str | None, drafter: bool = False, dtype: str | None = None) -> str | None:
        """Where a fleet model name lives for this engine (``tiny:<size>`` → the folder built in ``dtype``)."""
        return resolve_model(name, self._cache(), drafter=drafter, dtype=dtype)

    def profile(self, identity: EngineIdentity, dep: Deployment | None, store: Any,
                log: logging.Logger) -> StepTimeProfile:
        options = ProfileOptions.from_mapping(self.profile_options, where=f"{self.where} profile_options")
        return profile(identity, dep, store, log=log, options=options, cache_dir=self._cache(),
                       work_dir=self._work("profile"), server=self.server)

    def served_verification_options(self) -> Any:
        from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions

        return ServedVerificationOptions.from_mapping(self.served_verification,
                                                      where=f"{self.where} served_verification")

    def verify_served(self, identity: EngineIdentity, dep: Deployment | None, table: Any,
                      prior: AcceptancePrior | None, log: logging.Logger) -> Any:
        """The table against every fixed k by served goodput, in one launch of this engine."""
        return verify_served(identity, dep, table, prior, log=log, options=self.served_verification_options(),
                             cache_dir=self._cache(), work_dir=self._work("verify"), server=self.server)

    def measure_acceptance(self, identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str,
                           log: logging.Logger) -> AcceptancePrior:
        options = AcceptanceOptions.from_mapping(self.acceptance_options, where=f"{self.where} acceptance_options")
        return measure_acceptance(identity, dep, prompts_file, week, log=log, options=options,
                                  cache_dir=self._cache(), work_dir=self._work("acceptance"))

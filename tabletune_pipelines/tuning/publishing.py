"""Publishing a table to the deployments that run its engine (no Dagster): the one entry point
(``publish_table``), its undo (``rollback_table``), and what a publication writes beside the table.

The layers under it: ``published`` owns the file format (``published_document``,
``controller_fields``: what the controller reads) and the rules of what may be replaced; the store
(``TableTuneStore.publish``/``rollback``) allocates the version under the publication lock and writes
the file, its ``--speculative-config`` companion and the version row. This module decides what to
publish and where: the blocking table gates again, the deployments running the engine now, which of
them already hold the table, the served verification (a failure publishes nothing), then one
publication per deployment with its controller settings, the table's engine identity and prior, and
the served verification's section and plot.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletune_pipelines.engine.installed import context_schedule_support
from tabletune_pipelines.errors import PipelineFailure, TableTuneError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity
from tabletune_pipelines.formats.fleet import Deployment, Fleet
from tabletune_pipelines.formats.identity_match import identity_mismatches
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.formats.published_files import (
    check_publish_targets,
    served_plot_path,
    write_speculative_config_companion,
)
from tabletune_pipelines.tuning.deployments import Engine, deployments_running
from tabletune_pipelines.tuning.gates import Gate, blocking_table_gates, served_gate
from tabletune_pipelines.tuning.report import check_plot_target, served_goodput_plot

# -- what a publication writes besides the table -------------------------------------------------

def serving_speculative_config(dep: Deployment, local_model_path: Callable[..., str | None]) -> dict[str, Any]:
    """The deployment's ``--speculative-config`` keys other than the table and K; for the embedded
    default the drafter is the built local folder (``tiny:small`` → a path), so the file can be pasted."""
    cfg = dep.base_speculative_config()
    if dep.embedded and "model" in cfg:
        cfg["model"] = local_model_path(cfg["model"], drafter=True, dtype=dep.dtype)
    return cfg


def publication_kwargs(dep: Deployment, engine: Engine, table: DraftLengthTable | None = None,
                       store: Any = None) -> dict[str, Any]:
    """Keyword arguments of ``store.publish`` / ``store.rollback`` for one deployment: the base
    ``--speculative-config`` and further fields of the published document (``document_fields``:
    keyword arguments of ``published_build.published_document``; add new document fields here), and
    whether the installed vLLM takes the (B, ctx) schedule (``engine.installed.context_schedule_support``).
    With ``table`` and ``store``, the controller also gets the table's engine identity and prior."""
    identity = prior = None
    if table is not None and store is not None:
        identity = store.find_identity(table.identity_key)
        prior = _prior_of(store, table)
    return {"base_speculative_config": serving_speculative_config(dep, engine.local_model_path),
            "document_fields": controller_fields(identity=identity, prior=prior, controller=dep.controller,
                                                 live_counters=dep.live_counters),
            "context_schedule": context_schedule_support().accepted}


def write_speculative_config(dep: Deployment, published: Mapping[str, Any]) -> Path:
    """Write the paste-able ``--speculative-config`` JSON of a published document beside the table
    (``TableTuneStore.publish`` writes it itself, under the publication lock; this is for callers
    that build a document by other means)."""
    check_publish_targets(dep.published_table, dep.name)  # never beside, or over, a file TableTune does not own
    return write_speculative_config_companion(dep.published_table, published)


def _prior_of(store: Any, table: DraftLengthTable) -> AcceptancePrior | None:
    try:
        return store.acceptance_prior(table.prior_id)
    except TableTuneError:
        return None


# -- publishing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One deployment a table was published to, or that already held it."""

    deployment: str
    version: int
    path: Path
    """The published table."""
    speculative_config_path: Path
    """Its ``--speculative-config`` companion."""
    unchanged: bool
    """True when the deployment already held this table (no new version)."""


@dataclass(frozen=True)
class Publication:
    """One run of ``publish_table``: what was published where, or why nothing was."""

    table: DraftLengthTable
    identity_key: str
    targets: tuple[Target, ...]
    """The deployments that held the table already, then those it was published to (when refused:
    only the first)."""
    skipped: tuple[str, ...]
    """Deployments of the fleet that could not be asked which engine they run (one sentence each)."""
    gate: Gate
    """``served_goodput_verified``."""
    served_plot: bytes | None
    """The served verification's goodput-vs-load plot (PNG), when it ran."""
    speculative_config: dict[str, Any]
    """The ``--speculative-config`` of the first target, table included ({} when refused)."""
    refusal: str = ""
    """Why nothing was published (the served verification failed); '' when it was."""
    report: tuple[str, ...] = ()
    """What was measured, as ``tabletune run`` and ``tabletune show`` print it
    (``run_report.measured_lines``), for the first target's file; () when refused."""

    @property
    def published(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if not t.unchanged)

    @property
    def unchanged(self) -> tuple[str, ...]:
        return tuple(t.deployment for t in self.targets if t.unchanged)


@dataclass(frozen=True)
class _Served:
    gate: Gate
    section: dict[str, Any] | None = None
    plot: bytes | None = None


def publish_table(store: Any, fleet: Fleet, key: str, engine: Engine, *, deployments: Sequence[str] = (),
                  force: bool = False, max_predicted_loss: float, log: logging.Logger) -> Publication:
    """Publish the latest table of engine identity ``key`` to ``deployments`` (default: every
    deployment running that engine now). A deployment whose file already holds the table gets no new
    version unless ``force``. Refused before anything is written: no table, a failed blocking gate,
    no deployment running the engine, bad served-verification options (``PipelineFailure``), a
    target TableTune may not replace (``PublishedTableError``, from ``published_files.check_publish_targets``).
    A failed served verification returns a ``Publication`` with ``refusal`` set and nothing written."""
    table = store.latest_table(key)
    if table is None:
        raise PipelineFailure(f"no draft_length_table for {key}; materialize it first (nothing published)")
    # The blocking gates again: a table that failed them is never published, whichever run tries.
    failed = [g for g in blocking_table_gates(table, max_predicted_loss) if not g.passed]
    if failed:
        raise PipelineFailure(
            f"refusing to publish table {table.table_id} of {key}: " + "; ".join(g.description for g in failed)
            + ". The previously published tables are untouched.")
    targets, skipped = _targets(fleet, key, engine, deployments, log)
    unchanged, to_publish = [], []
    for dep in targets:
        pubs = store.publications(dep.name)
        if pubs and pubs[-1]["table_id"] == table.table_id and not force and dep.published_table.exists():
            unchanged.append(Target(dep.name, pubs[-1]["version"], dep.published_table, dep.speculative_config_path,
                                    unchanged=True))
        else:
            to_publish.append(dep)
    for dep in to_publish:  # a target TableTune may not replace is refused before the verification's launch
        check_publish_targets(dep.published_table, dep.name)
    served = _served_verification(store, engine, table, key, to_publish, log)
    result = Publication(table=table, identity_key=key, targets=tuple(unchanged), skipped=tuple(skipped),
                         gate=served.gate, served_plot=served.plot, speculative_config={})
    if not served.gate.passed:
        current = ", ".join(f"{d.name} v{n}" if (n := store.latest_publication_version(d.name)) else
                            f"{d.name}: none yet" for d in to_publish)
        return dataclasses.replace(result, refusal=(
            f"refusing to publish table {table.table_id} of {key}: {served.gate.description}. Nothing was "
            f"published; the previously published tables stay ({current})."))
    if served.gate.warning:
        log.warning(f"publishing table {table.table_id} UNVERIFIED: {served.gate.description}")
    published = [_publish_one(store, engine, table, key, dep, served, log) for dep in to_publish]
    return dataclasses.replace(result, targets=(*unchanged, *published), speculative_config=table.speculative_config(
        serving_speculative_config(targets[0], engine.local_model_path),
        context_schedule=context_schedule_support().accepted), report=_report(store, engine, targets[0]))


def _report(store: Any, engine: Engine, dep: Deployment) -> tuple[str, ...]:
    """``run_report.measured_lines`` of the file now at ``dep``'s path, or one line saying why not."""
    from tabletune_pipelines.formats.published import load_published
    from tabletune_pipelines.tuning.run_report import measured_lines

    try:
        seed = int(engine.acceptance_options.get("seed", 0))
        return tuple(measured_lines(load_published(dep.published_table), dep, store, sample_seed=seed))
    except (TableTuneError, ValueError, KeyError, OSError) as exc:  # published; only the summary failed
        return (f"could not summarise the measurements: {exc}",)


def _targets(fleet: Fleet, key: str, engine: Engine, names: Sequence[str],
             log: logging.Logger) -> tuple[list[Deployment], list[str]]:
    """The deployments to publish to (``names``, else those running ``key`` now) and the ones skipped."""
    if names:
        return [fleet.deployment(n) for n in names], []
    targets, notes = deployments_running(key, fleet, engine.current_identity)
    for n in notes:
        log.warning(f"not publishing to {n}")
    if not targets:
        raise PipelineFailure(f"no deployment of {fleet.source} runs engine identity {key} now; nothing published"
                              + (f" ({'; '.join(notes)})" if notes else ""))
    return targets, notes


def _served_verification(store: Any, engine: Engine, table: DraftLengthTable, key: str,
                         to_publish: list[Deployment], log: logging.Logger) -> _Served:
    """The check ``served_goodput_verified``: its gate, the published file's section and the plot."""
    if not to_publish:
        return _Served(served_gate(None, disabled_reason=f"every target already holds table {table.table_id}; "
                                                         "nothing new to publish"))
    try:
        opts = engine.served_verification_options()
    except TableTuneError as exc:
        raise PipelineFailure(f"EngineResource served_verification: {exc} (nothing published)") from exc
    if not opts.enabled:
        return _Served(served_gate(None, disabled_reason="served verification is off (EngineResource "
                                                         "served_verification: {enabled: false}); the table "
                                                         "publishes on its predicted figures alone"))
    identity: EngineIdentity | None = store.find_identity(key)
    if identity is None:
        raise PipelineFailure(f"engine identity {key} is not in the store; cannot verify table {table.table_id}")
    try:
        result = engine.verify_served(identity, to_publish[0], table, _prior_of(store, table), log)
    except TableTuneError as exc:
        return _Served(Gate("served_goodput_verified", False,
                            f"the served verification could not run ({exc}); set EngineResource served_verification "
                            "{enabled: false} to publish without it", {"status": "error"}))
    _keep_calibration(store, key, table, result, log)
    plot = served_goodput_plot(result, f"{key}\ntable {[list(r) for r in table.ranges]}")
    return _Served(served_gate(result), result.to_dict(), plot)


def _keep_calibration(store: Any, key: str, table: DraftLengthTable, result: Any, log: logging.Logger) -> None:
    """The verification's fixed-k windows, kept as the identity's served calibration: the next derive
    prices served steps with what serving measured (``core.served_calibration.ServedCalibration``). A pass or a
    fail alike: both measured every fixed k."""
    from tabletune_pipelines.core.served_calibration import ServedCalibration
    from tabletune_pipelines.tuning.served_windows import fixed_name, served_points

    policies = {fixed_name(k): [[1, result.max_num_seqs, k]] for k in range(result.max_k + 1)}
    points = served_points(result.windows, policies)
    if not points:
        log.info(f"served verification of {table.table_id}: too few rounds of fixed k for a served calibration")
        return
    cal = ServedCalibration(points=tuple(points), source=f"served verification of table {table.table_id} "
                                                         f"({result.device or 'device?'}, acceptance "
                                                         f"{result.acceptance or '?'})")
    store.write_served_calibration(key, cal)
    log.info(f"kept a served calibration of {key} ({len(points)} fixed-k points at loads "
             f"{sorted({p.load for p in points})}): the next derive prices served steps with it")


def _publish_one(store: Any, engine: Engine, table: DraftLengthTable, key: str, dep: Deployment, served: _Served,
                 log: logging.Logger) -> Target:
    """One deployment's publication: the file, its companion and the version row, under one lock."""
    fields = publication_kwargs(dep, engine, table, store)
    beside: dict[Path, bytes] = {}
    if served.section is not None:
        plot = _served_plot_target(dep, served.plot, log)
        if plot is not None and served.plot is not None:
            beside[plot] = served.plot
        fields["document_fields"] = {**fields["document_fields"],
                                     "served_verification": {**served.section, "plot": plot and plot.name}}
    # The plot is written by the store with the file, inside its transaction: a publication that fails
    # puts it back too, so the old file never points at a new plot.
    doc = store.publish(dep.name, table, dep.published_table, note=f"identity {key}, prior {table.prior_id}",
                        beside=beside, **fields)
    log.info(f"published {table.table_id} to {dep.name} as v{doc['version']}: {dep.published_table}")
    return Target(dep.name, doc["version"], dep.published_table, dep.speculative_config_path, unchanged=False)


def _served_plot_target(dep: Deployment, png: bytes | None, log: logging.Logger) -> Path | None:
    """Where the plot goes beside the published table (``<stem>.served-verification.png``), checked by
    ``report.check_plot_target`` (nothing there, or a plot TableTune wrote); None, with a warning, when
    there is no plot or it may not be written there (the table publishes without it)."""
    if png is None:
        return None
    path = served_plot_path(dep.published_table)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # publishing creates it too
        check_plot_target(path)
    except (TableTuneError, OSError) as exc:
        log.warning(f"{dep.name}: served verification plot not written ({exc})")
        return None
    return path


# -- rollback ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rollback:
    """One run of ``rollback_table``: the version now published."""

    deployment: str
    group: str
    """The deployment's engine group (the run queue's key)."""
    path: Path
    document: dict[str, Any]
    """The published document (the old version's table, as a new version)."""

    @property
    def version(self) -> int:
        return int(self.document["version"])

    @property
    def identity_key(self) -> str:
        return self.document["table"]["identity_key"]

    @property
    def prior_id(self) -> str:
        return (self.document.get("prior") or {}).get("prior_id") or ""

    @property
    def ranges(self) -> Sequence[Sequence[int]]:
        return self.document["table"]["ranges"]


def rollback_table(store: Any, load_fleet: Callable[[], Fleet], deployment: str, engine: Engine, *,
                   log: logging.Logger) -> Rollback:
    """Re-publish the deployment's version before the current one, as a new version, with the engine
    identity and prior it was published with (``store.rollback``) and today's controller settings and
    live_counters. Says so when that engine is not the one the deployment runs now."""
    try:
        dep = load_fleet().deployment(deployment)
        doc = store.rollback(dep.name, dep.published_table, **publication_kwargs(dep, engine))
    except TableTuneError as exc:
        raise PipelineFailure(f"cannot roll back {deployment}: {exc}") from exc
    done = Rollback(deployment=dep.name, group=dep.group, path=dep.published_table, document=doc)
    log.info(f"{dep.name}: rolled back; now v{done.version} ({done.ranges})")
    try:
        running = engine.current_identity(dep)
    except TableTuneError as exc:
        log.warning(f"{dep.name}: could not learn the engine it runs now ({exc}); v{done.version} was made "
                    f"for {done.identity_key}")
        return done
    differ = identity_mismatches(doc["identity"], running.to_dict(), running_name=f"{dep.name}'s now")
    if differ:
        log.warning(f"{dep.name}: v{done.version} was made for engine {done.identity_key}, not the one it "
                    f"runs now ({'; '.join(differ)}): its controller refuses this file and serves on the "
                    "engine's own table until a table of the current engine is published")
    return done

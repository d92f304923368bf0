"""From the published file to the controller's starting point — or the reason there is none.

``load_start`` reads the file with the strict reader (``tabletune_pipelines.formats.published``) and then
checks that it was made for *this* engine: the file must record its engine identity (a file without
one could be any engine's table), and that identity must match the engine on every field the engine
reports — GPU type, vLLM version (its public part: ``0.32.0+cpu`` matches ``0.32.0``), model,
drafter, method, K (``num_speculative_tokens``), max_num_seqs and the graph envelope (the CUDA-graph
capture ceiling, the token budget where the file pins one) — by the one comparison
``tabletune_pipelines.formats.identity_match.identity_mismatches`` (the library's ``deployments.same_engine``
uses it too). When the engine was told which deployment it serves (``TABLETUNE_DEPLOYMENT``), the
file must be that deployment's; without that setting the deployment name cannot be checked, and the
starting point carries a note naming the file's deployment (logged with the version it installs).
Every k of the table must be one the launch table lists (on GPU, Model Runner V2 captures CUDA
graphs only for those:
docs/engine-facts.md, "GPU (H200, vLLM 0.26)"). Any failure is returned as one sentence for the
log; the caller keeps the engine's configured table. Stdlib + numpy, no vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tabletune_pipelines.core.steptime import every_batch_size
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import PublishedTableError, SettingsError
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.formats.identity_match import identity_mismatches as _mismatches
from tabletune_pipelines.formats.identity_match import missing_fields
from tabletune_pipelines.formats.published import load_published
from tabletune_pipelines.formats.published_schema import PublishedTable

DEPLOYMENT_ENV = "TABLETUNE_DEPLOYMENT"
"""The fleet deployment this engine serves (optional): a published file of another deployment is refused."""


@dataclass(frozen=True)
class EngineFacts:
    """What the controller knows about the engine it runs in (read from vLLM's config)."""

    max_k: int
    """Launch ``num_speculative_tokens`` (K)."""
    max_num_seqs: int
    """``--max-num-seqs``: the lookup covers batch sizes 1..max_num_seqs."""
    launch_ranges: tuple[tuple[int, int, int], ...] | None
    """The launch's ``num_speculative_tokens_per_batch_size`` (None: no table, k cannot change)."""
    model: str | None = None
    """Target model as given to vLLM."""
    method: str | None = None
    """``speculative_config.method``."""
    drafter: str | None = None
    """Draft model as given to vLLM (``speculative_config.model``; None for n-gram)."""
    vllm_version: str | None = None
    """``vllm.__version__``."""
    gpu: str | None = None
    """Accelerator type (``"cpu"``, or the GPU's model such as ``"NVIDIA H200"``; None: not known)."""
    deployment: str | None = None
    """The fleet deployment this engine serves (``TABLETUNE_DEPLOYMENT``; None: not configured, not checked)."""
    capture_ceiling: int | None = None
    """vLLM's ``max_cudagraph_capture_size`` (None: no graphs, or not known): a table priced at another
    ceiling is refused."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step (None: not known); compared where the file's identity pins one."""

    def identity_fields(self) -> dict[str, object]:
        """The engine identity fields this engine knows (what ``identity_mismatches`` compares)."""
        known = {"gpu": self.gpu, "vllm_version": self.vllm_version, "model": self.model, "drafter": self.drafter,
                 "method": self.method, "max_k": self.max_k, "max_num_seqs": self.max_num_seqs,
                 "capture_ceiling": self.capture_ceiling, "max_num_batched_tokens": self.max_num_batched_tokens}
        return {k: v for k, v in known.items() if v is not None}

    @property
    def launch_ks(self) -> tuple[int, ...]:
        return tuple(sorted({int(k) for _, _, k in self.launch_ranges})) if self.launch_ranges else ()


@dataclass(frozen=True)
class ColumnStart:
    """One context bucket's starting point (``formats.context_columns``), checked against this engine."""

    bucket: tuple[int, int]
    """The bucket, inclusive tokens."""
    prior: tuple[float, ...]
    """a_1..a_K its level was searched under."""
    profile_ms: np.ndarray
    """T(B, k) of its level for ``StartPoint.allowed_k`` rows and B = 1..max_num_seqs."""


@dataclass(frozen=True)
class StartPoint:
    """A published file that passed every check, with the arrays the controller needs."""

    published: PublishedTable
    """The validated file."""
    settings: ControllerSettings
    """Its controller settings (defaults where it sets none)."""
    allowed_k: tuple[int, ...]
    """Candidate k values (the file's allowed_k that the launch table also lists)."""
    prior: tuple[float, ...]
    """a_1..a_K (empty when the file has none: the controller then only observes)."""
    prior_count: int
    """Drafts behind the prior (0 = unknown)."""
    profile_ms: np.ndarray | None
    """T(B, k) for ``allowed_k`` rows and B = 1..max_num_seqs (None: no usable profile → observe)."""
    export_path: Path
    """Where the live counters go."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Things worth one log line that do not stop the file from being used."""
    grid: DraftTable | None = None
    """The file's (batch size x context) table (``table.context_entries``; None: batch-only, ``ranges``)."""
    columns: tuple[ColumnStart, ...] | None = None
    """Per context bucket of ``grid``, what its correction starts from (``table.context_columns``);
    None: the file has none usable, and the grid is served as published."""

    @property
    def can_control(self) -> bool:
        return bool(self.prior) and self.profile_ms is not None


def identity_mismatches(pub: PublishedTable, engine: EngineFacts) -> list[str]:
    """What differs between the file's engine and this engine: K and max_num_seqs always, the
    identity's other fields where both the file and the engine know them (``identity_match``)."""
    made_for = {**(pub.identity or {}), "max_k": pub.max_k, "max_num_seqs": pub.max_num_seqs}
    return _mismatches(made_for, engine.identity_fields())


def profile_rows(step_ms: Mapping[int, Mapping[int, float]], ks: Sequence[int], n: int) -> np.ndarray | str:
    """T(B, k) for B = 1..n per k in ``ks`` from a file's ``step_ms`` ``{k: {B: ms}}``, or why it cannot be had."""
    rows = []
    for k in ks:
        cells = step_ms.get(int(k))
        if not cells:
            return f"its step-time profile has no k = {k}"
        bs = sorted(cells)
        if bs[0] != 1 or bs[-1] < n:
            return f"its step-time profile of k = {k} covers B {bs[0]}..{bs[-1]}, not 1..{n}"
        rows.append(every_batch_size(bs, [[cells[b] for b in bs]], n)[0])
    return np.vstack(rows)


def default_export_path(published_path: str | os.PathLike[str]) -> Path:
    p = Path(published_path)
    return p.with_name(p.stem + ".live.jsonl")


def load_start(path: str | os.PathLike[str], engine: EngineFacts) -> StartPoint | str:
    """The starting point from the published file at ``path``, or one sentence saying why not."""
    try:
        pub = load_published(path)  # strict_io: a FIFO, deep nesting or a huge integer is a PublishedTableError
    except PublishedTableError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a reader bug on a hostile file must not stop the engine
        return f"published table {path} could not be read ({type(exc).__name__}: {str(exc)[:200]})"
    return start_from(pub, Path(path), engine)


def start_from(pub: PublishedTable, path: Path, engine: EngineFacts) -> StartPoint | str:
    """Checks of a validated file against this engine (``load_start`` after reading)."""
    where = f"published table {path} (v{pub.version})"
    if engine.deployment and pub.deployment != engine.deployment:
        return (f"{where} was published for deployment {pub.deployment!r}, but this engine serves "
                f"{engine.deployment!r} ({DEPLOYMENT_ENV}); point TABLETUNE_PUBLISHED_TABLE at the published_table of "
                f"{engine.deployment!r} in the fleet file")
    bad = identity_mismatches(pub, engine)
    if bad:
        return f"{where} was made for another engine: " + "; ".join(bad)
    if pub.identity is None:
        return (f"{where} records no engine identity, so nothing says which engine its table was measured on; "
                "re-publish it with the pipeline (which records one)")
    missing = missing_fields(pub.identity)
    if missing:
        return f"{where}: its identity lacks {', '.join(missing)}, so it cannot be checked against this engine"
    try:
        settings = ControllerSettings.from_mapping(pub.controller, where=f"{where}: controller")
    except SettingsError as exc:
        return str(exc)
    notes: list[str] = []
    if not engine.deployment:  # whose table it is cannot be checked: said with the version it installs
        notes.append(f"it was published for deployment {pub.deployment!r}; this engine was not told which deployment "
                     f"it serves, so a file of another deployment at this path would be served too: set "
                     f"{DEPLOYMENT_ENV}=<deployment> to have it refused")
    grid = None if pub.context_entries is None else DraftTable.from_entries(
        [list(e) for e in pub.context_entries], allow_context=True)
    table_ks = sorted({k for _, _, k in pub.ranges} | set(grid.allowed_ks() if grid else ()))
    allowed = list(pub.allowed_k)
    if engine.launch_ranges is not None:
        launch = set(engine.launch_ks)
        missing_ks = [k for k in table_ks if k not in launch]
        if missing_ks:
            return (f"{where} uses k = {missing_ks}, which the launch table {list(map(list, engine.launch_ranges))} "
                    "does not list (CUDA graphs exist only for launch-table k values); launch with a table that "
                    f"lists every k the controller may use, e.g. k = {sorted(launch | set(allowed))}")
        dropped = [k for k in allowed if k not in launch]
        if dropped:
            notes.append(f"allowed k {dropped} are not in the launch table and are left out")
            allowed = [k for k in allowed if k in launch]
    prior = tuple(pub.prior.rates[: engine.max_k])
    rows = profile_rows(pub.step_ms, allowed, engine.max_num_seqs)
    if isinstance(rows, str):
        notes.append(f"{rows}: the controller applies the published table and only observes")
    profile = None if isinstance(rows, str) else rows
    if not prior:
        notes.append("it carries no acceptance prior: the controller applies the published table and only observes")
    export = Path(settings.export_path) if settings.export_path else default_export_path(path)
    if not export.is_absolute():
        export = path.parent / export
    columns = None if grid is None else column_starts(pub, allowed, engine.max_k, engine.max_num_seqs, notes)
    return StartPoint(published=pub, settings=settings, allowed_k=tuple(allowed), prior=prior,
                      prior_count=int(pub.prior.num_drafts), profile_ms=profile, export_path=export,
                      notes=tuple(notes), grid=grid, columns=columns)


def column_starts(pub: PublishedTable, allowed: Sequence[int], max_k: int, n: int,
                  notes: list[str]) -> tuple[ColumnStart, ...] | None:
    """The grid's columns as this engine starts them (``table.context_columns``), or None, with the
    reason in ``notes``, when the file has none or one lacks a k or batch size (the grid is then
    served as published)."""
    if pub.context_columns is None:
        notes.append("its (batch size x context) table carries no context_columns (step times and acceptance per "
                     "context bucket): it is served as published, without correction")
        return None
    out = []
    for col in pub.context_columns:
        rows = profile_rows(col.step_ms, allowed, n)
        if isinstance(rows, str):
            notes.append(f"context bucket {list(col.ctx)}: {rows}: the (batch size x context) table is served as "
                         "published, without correction")
            return None
        out.append(ColumnStart(bucket=col.ctx, prior=tuple(col.acceptance_rates[:max_k]), profile_ms=rows))
    return tuple(out)

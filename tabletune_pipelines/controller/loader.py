"""From the published file to the controller's starting point — or the reason there is none.

``load_start`` reads the file with the strict reader (``tabletune_pipelines.published``) and then
checks that it was made for *this* engine: model, drafter, method, K (``num_speculative_tokens``),
max_num_seqs and the vLLM version (its public part: ``0.32.0+cpu`` matches ``0.32.0``), and that
every k of its table is one the launch table lists (on GPU, Model Runner V2 captures CUDA graphs
only for those: docs/engine-facts.md, "GPU (H200, vLLM 0.26)"). Any failure is returned as one
sentence for the log; the caller keeps the engine's configured table. Stdlib + numpy, no vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tabletune_pipelines.controller.settings import ControllerSettings, SettingsError
from tabletune_pipelines.published import PublishedTable, PublishedTableError, load_published


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

    @property
    def launch_ks(self) -> tuple[int, ...]:
        return tuple(sorted({int(k) for _, _, k in self.launch_ranges})) if self.launch_ranges else ()


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

    @property
    def can_control(self) -> bool:
        return bool(self.prior) and self.profile_ms is not None


def _public(version: str | None) -> str | None:
    return None if version is None else str(version).split("+", 1)[0].strip()


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
    except (OSError, ValueError):
        return False


def identity_mismatches(pub: PublishedTable, engine: EngineFacts) -> list[str]:
    """What differs between the file's engine identity and this engine (compared where both are known)."""
    out = []
    if pub.max_k != engine.max_k:
        out.append(f"K (num_speculative_tokens) {pub.max_k} != this engine's {engine.max_k}")
    if pub.max_num_seqs != engine.max_num_seqs:
        out.append(f"max_num_seqs {pub.max_num_seqs} != this engine's {engine.max_num_seqs}")
    ident = pub.identity or {}
    if ident.get("model") and engine.model and not _same_model(str(ident["model"]), engine.model):
        out.append(f"model {ident['model']!r} != this engine's {engine.model!r}")
    if ident.get("drafter") and engine.drafter and not _same_model(str(ident["drafter"]), engine.drafter):
        out.append(f"drafter {ident['drafter']!r} != this engine's {engine.drafter!r}")
    if ident.get("method") and engine.method and ident["method"] != engine.method:
        out.append(f"method {ident['method']!r} != this engine's {engine.method!r}")
    if ident.get("vllm_version") and engine.vllm_version and \
            _public(ident["vllm_version"]) != _public(engine.vllm_version):
        out.append(f"vLLM {ident['vllm_version']!r} != this engine's {engine.vllm_version!r}")
    return out


def profile_rows(pub: PublishedTable, ks: Sequence[int], n: int) -> np.ndarray | str:
    """T(B, k) for B = 1..n per k in ``ks`` from the file's ``step_ms``, or why it cannot be had."""
    rows = []
    for k in ks:
        cells = pub.step_ms.get(int(k))
        if not cells:
            return f"its step-time profile has no k = {k}"
        bs = sorted(cells)
        if bs[0] != 1 or bs[-1] < n:
            return f"its step-time profile of k = {k} covers B {bs[0]}..{bs[-1]}, not 1..{n}"
        rows.append(np.interp(np.arange(1, n + 1, dtype=float), np.asarray(bs, dtype=float),
                              np.asarray([cells[b] for b in bs], dtype=float)))
    return np.vstack(rows)


def default_export_path(published_path: str | os.PathLike[str]) -> Path:
    p = Path(published_path)
    return p.with_name(p.stem + ".live.jsonl")


def load_start(path: str | os.PathLike[str], engine: EngineFacts) -> StartPoint | str:
    """The starting point from the published file at ``path``, or one sentence saying why not."""
    try:
        pub = load_published(path)
    except PublishedTableError as exc:
        return str(exc)
    return start_from(pub, Path(path), engine)


def start_from(pub: PublishedTable, path: Path, engine: EngineFacts) -> StartPoint | str:
    """Checks of a validated file against this engine (``load_start`` after reading)."""
    where = f"published table {path} (v{pub.version})"
    bad = identity_mismatches(pub, engine)
    if bad:
        return f"{where} was made for another engine: " + "; ".join(bad)
    try:
        settings = ControllerSettings.from_mapping(pub.controller, where=f"{where}: controller")
    except SettingsError as exc:
        return str(exc)
    notes: list[str] = []
    table_ks = sorted({k for _, _, k in pub.ranges})
    allowed = list(pub.allowed_k)
    if engine.launch_ranges is not None:
        launch = set(engine.launch_ks)
        missing = [k for k in table_ks if k not in launch]
        if missing:
            return (f"{where} uses k = {missing}, which the launch table {list(map(list, engine.launch_ranges))} "
                    "does not list (CUDA graphs exist only for launch-table k values); launch with a table that "
                    f"lists every k the controller may use, e.g. k = {sorted(launch | set(allowed))}")
        dropped = [k for k in allowed if k not in launch]
        if dropped:
            notes.append(f"allowed k {dropped} are not in the launch table and are left out")
            allowed = [k for k in allowed if k in launch]
    prior = tuple(pub.prior.rates[: engine.max_k])
    profile = profile_rows(pub, allowed, engine.max_num_seqs)
    if isinstance(profile, str):
        notes.append(f"{profile}: the controller applies the published table and only observes")
        profile = None
    if not prior:
        notes.append("it carries no acceptance prior: the controller applies the published table and only observes")
    export = Path(settings.export_path) if settings.export_path else default_export_path(path)
    if not export.is_absolute():
        export = path.parent / export
    return StartPoint(published=pub, settings=settings, allowed_k=tuple(allowed), prior=prior,
                      prior_count=int(pub.prior.num_drafts), profile_ms=profile, export_path=export,
                      notes=tuple(notes))

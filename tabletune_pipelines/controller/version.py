"""The installed version: everything a validated published file puts in force, built before any of
it is (``prepare``), and the watch on the file that brings newer versions (``FileWatch``).

Installing is all or nothing (docs/controller.md, "Start-up and the published file"): ``prepare``
builds the whole ``Installed`` record without touching the controller — the acceptance estimator
and the step-time model (``evidence.Evidence``), the lookup and its hysteresis variants, the
exploration lookups, the version's flap history — and ``logic.Controller`` puts it in force with
plain assignments only when all of it was built. If anything raises, the version in force stays
whole. The record is frozen: which parts are in force does not change while the version is; the
parts themselves (the evidence, the exploration, the flap counter) take in what is served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tabletune_pipelines.controller.columns import Column, Columns
from tabletune_pipelines.controller.evidence import Evidence
from tabletune_pipelines.controller.exploration import Exploration
from tabletune_pipelines.controller.flapping import FlapCounter
from tabletune_pipelines.controller.loader import EngineFacts, StartPoint, load_start
from tabletune_pipelines.controller.record import Notes, fmt_rates, fmt_table
from tabletune_pipelines.controller.search import Lookups, Ranges, TableInForce, compact, lookups_of
from tabletune_pipelines.core.table import ContextLookups, context_lookups
from tabletune_pipelines.formats.controller_settings import ControllerSettings


@dataclass(frozen=True)
class Installed:
    """One published version as the controller runs it."""

    start: StartPoint
    """The validated published file (its table, prior, profile, settings, export path)."""
    applying: bool
    """The launch has a table, so k can be switched: the published table is handed to vLLM."""
    controlling: bool
    """``mode: control`` with a prior and a profile, k switchable and the policy TableTune's: the
    table is rebuilt, explored around and held with hysteresis."""
    table: Ranges
    """The published table (k capped at the engine's K)."""
    lookups: Lookups
    """vLLM's lookup of ``table`` and its hysteresis variants (only while controlling)."""
    evidence: Evidence
    """The version's counts, estimator and step-time model, empty at install."""
    exploration: Exploration | None
    """The version's exploration (None: it does not explore)."""
    flaps: FlapCounter
    """The version's flap history (the switch counts carry over from the version before)."""
    context: ContextLookups | None = None
    """The file's (batch size x context) table, one lookup per context bucket, served at every step in
    place of ``lookups`` (None: a batch-only table, or k cannot be switched)."""
    columns: Columns | None = None
    """While controlling a (batch size x context) table: its columns, each corrected on its own
    bucket's evidence (``columns.Columns``); None: a batch-only table, or a grid served as published."""

    @property
    def settings(self) -> ControllerSettings:
        return self.start.settings

    @property
    def allowed_k(self) -> tuple[int, ...]:
        return tuple(self.start.allowed_k)

    def choose(self, incumbent: np.ndarray, rates: np.ndarray, rebuild: int, b: int) -> np.ndarray:
        """k per batch size (index B - 1) at rebuild number ``rebuild``: the evidence rule revising
        ``incumbent`` (``Evidence.search``), the exploration focused on the open decision at batch
        size ``b`` (the one in service), and batch sizes that do not flip back while the flap
        backoff holds the table, unless the gain is large (``FlapCounter.restrain``)."""
        found = self.evidence.search(self.settings, self.start.allowed_k, rates, incumbent)
        chosen = np.asarray(found.choice.chosen, dtype=np.int64)
        if self.exploration is not None:
            self.exploration.refocus(found, chosen, b, self.settings)
        return self.flaps.restrain(incumbent, chosen, rebuild, found)


def prepare(start: StartPoint, engine: EngineFacts, flaps: FlapCounter, steps: int, *,
            note: Callable[..., None]) -> Installed:
    """Everything ``start`` puts in force, built without touching the controller. ``flaps``: the
    flap counter in force (its switch counts carry over); ``steps``: the step count now (exploration
    is due from it); ``note(key, msg, *args)``: a warning logged once (a served model that cannot be
    read)."""
    pub, s = start.published, start.settings
    K, n = int(engine.max_k), int(engine.max_num_seqs)
    ks = start.allowed_k
    evidence = Evidence.build(start, K, n, note)
    can_switch = engine.launch_ranges is not None
    # The published table is put in force whenever k can be switched; only in control mode (with a
    # prior and a profile) is it rebuilt, explored around and held with hysteresis. A baseline policy
    # (evaluation.baselines) chooses k itself: TableTune's rebuilds are then only observed.
    # A (batch size x context) table is served with its bucket chosen at every step. With the
    # file's context columns each bucket's column is corrected on its own evidence (columns.Columns);
    # without them it is served as published (not controlled: nothing explores).
    controlling = (s.mode == "control" and start.can_control and can_switch and s.policy == "tabletune"
                   and (start.grid is None or start.columns is not None))
    context = (context_lookups(start.grid, n, K, pub.ctx_agg) if start.grid is not None and can_switch
               else None)
    table = tuple((a, b, min(K, k)) for a, b, k in pub.ranges)
    lookups = lookups_of(table, n, ks, s.hysteresis, applying=can_switch, controlling=controlling)
    columns = None
    if controlling and context is not None and start.columns is not None:
        columns = Columns(context, [
            Column(col.bucket, Evidence.build(start, K, n, note, column=col), _column_table(lookup, n, ks, s),
                   FlapCounter(n, int(s.flap_backoff_rebuilds)))
            for col, lookup in zip(start.columns, context.columns, strict=True)])
        evidence.on_fold = columns.before_fold  # the step histograms' counts go to their columns first
    # With step-time correction, each exploration runs at the largest k and then, for as many steps,
    # at the next other allowed k in turn, so every k's cost is observed, not only the largest one's
    # (a k never run keeps its profile however wrong, and a wrong profile of an unused k pulls the
    # table towards it); the largest k keeps its full share of exploration.
    # A grid's columns are explored together: an exploration lookup runs one k at every batch size
    # whatever the context, and each step's observations go to the column of its context bucket.
    exploration = Exploration.plan(n, ks, s, controlling=controlling, steps=steps,
                                   correcting=evidence.model is not None and bool(s.step_time_correction))
    # A new version starts its own flap history (its table is not the old one's); the switch counts
    # stay cumulative for the export.
    return Installed(start=start, applying=can_switch, controlling=controlling, table=table, lookups=lookups,
                     evidence=evidence, exploration=exploration,
                     flaps=flaps.restarted(int(s.flap_backoff_rebuilds)), context=context, columns=columns)


def _column_table(lookup: list[int], n: int, ks: tuple[int, ...], s: ControllerSettings) -> TableInForce:
    """A context bucket's table in force, from its column of the published grid (vLLM's lookup)."""
    ranges = compact(lookup[1:n + 1])
    t = TableInForce(ranges)
    t.install(ranges, lookups_of(ranges, n, ks, s.hysteresis, applying=True, controlling=True),
              s.hysteresis_hold_steps)
    return t


def announce(log: logging.Logger, new: Installed, *, honours_policy: bool) -> None:
    """The log lines of a newly installed version (``honours_policy``: the controller runs the
    evaluation's baselines, so a baseline ``policy`` is no reason for a warning)."""
    start = new.start
    pub, ks, s = start.published, start.allowed_k, start.settings
    for note in start.notes:
        log.info("TableTune controller: published v%d: %s", pub.version, note)
    if s.policy != "tabletune" and not honours_policy:
        log.warning("TableTune controller: policy %s is an evaluation baseline and runs only under "
                    "--scheduler-cls tabletune_pipelines.evaluation.scheduler.EvaluationScheduler; this "
                    "plugin observes and serves the published table", s.policy)
    if not new.applying:
        log.warning("TableTune controller: the launch has no num_speculative_tokens_per_batch_size, so k "
                    "cannot change; only observing (launch with a table listing every k in %s)", list(ks))
    if start.grid is not None:
        log.info("TableTune controller: published v%d serves the (batch size x context) table %s, its context "
                 "bucket chosen at every step by the %s of the running requests' KV lengths; %s", pub.version,
                 [list(e) for e in start.grid.entries()], pub.ctx_agg,
                 "each bucket's column corrected on its own evidence" if new.columns is not None else
                 "served as published, without correction")
    est = new.evidence.estimator
    log.info("TableTune controller: published v%d of %s loaded (%s; table %s; allowed k %s; prior %s "
             "from %d drafts; w = %s; export %s)", pub.version, pub.deployment,
             "controlling" if new.controlling else "observing only", fmt_table(new.table), list(ks),
             fmt_rates(start.prior) if start.prior else "none", start.prior_count,
             f"{est.prior_weight:g}" if est else "-", start.export_path)


class FileWatch:
    """The published file's signature as last judged, and when to look at it again (one ``os.stat``
    at most every ``poll_every_s``). ``path`` None: no file is configured."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else Path(path)
        self.sig: tuple[int, int, int] | None = None
        """(inode, mtime, size) of the version of the file judged last."""
        self.next_at = 0.0
        """Clock time of the next look."""
        self.refused = 0
        """Changed files judged and not installed (refused, not newer, or not installable)."""

    def stat(self) -> tuple[int, int, int] | None:
        """The file's signature now (None: it is not there)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def first_look(self, engine: EngineFacts) -> StartPoint | str:
        """At start: the file's version (its signature recorded), or why there is none to install."""
        if self.path is None:
            return "no published file is configured"
        self.sig = self.stat()
        return load_start(self.path, engine)

    def look(self, now: float, settings: ControllerSettings, engine: EngineFacts, current: int, table: str,
             notes: Notes) -> tuple[StartPoint, tuple[int, int, int]] | None:
        """At clock time ``now`` (when a poll is due): a changed file holding a valid version newer
        than ``current`` (the version in force), with the signature to record once it is judged; else
        None, the change judged here (a file gone, refused or not newer: one note each, ``table``
        naming the table in force)."""
        self.next_at = now + max(1.0, float(settings.poll_every_s))
        if self.path is None:
            return None
        sig = self.stat()
        if sig == self.sig:
            return None
        res = None if sig is None else load_start(self.path, engine)
        if res is not None and (isinstance(res, str) or res.published.version <= current):
            self.refused += 1
        if res is None:
            notes.once("gone", "TableTune controller: published file %s is gone; keeping table %s", self.path, table)
        elif isinstance(res, str):
            notes.once("reject:" + res, "TableTune controller: not using the changed published file, keeping "
                       "table %s: %s", table, res)
        elif res.published.version <= current:
            notes.once(f"old:{res.published.version}", "TableTune controller: published file %s holds v%d, not "
                       "newer than v%d in force; ignored", self.path, res.published.version, current)
        else:
            assert sig is not None  # res was loaded, so the file was there
            return res, sig
        self.sig = sig  # this version of the file is judged: do not re-read it every second
        return None

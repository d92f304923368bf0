"""The online controller's logic: counters, rebuilds, lookups, export. No vLLM import.

The vLLM adapter (``controller/scheduler.py``) calls three methods; a simulator can call the same:

* ``next_lookup()`` before each ``Scheduler.schedule``: the lookup vLLM should use for the next
  step (None = leave it alone). This is where exploration (a run of ``exploration_run_steps`` steps
  every ``exploration_every_steps``: at the largest allowed k, and with step-time correction then as
  many steps at the next other allowed k) and boundary hysteresis (keep the current k while B is within h of
  a range that uses it) take effect, by handing vLLM one of a few lookups precomputed at rebuild.
* ``on_step(step)`` after each ``update_from_output``, with the step's ``step.StepOutcome``: per
  request drafted = ``len(scheduled_spec_decode_tokens[req])``, kept = ``len(sampled_token_ids[i]) - 1``
  (``step.count_drafts``: one increment in each of two histograms, no per-request allocation). It
  times the step (``observations.CostObserver``), and every ``rebuild_every_steps`` steps rebuilds
  the table (docs/method.md, "Online controller"):

  1. per-position counts from the histograms (drafted_i = request-steps that drafted >= i; a
     variable k then does not bias later positions), added to the live counters;
  2. â_i = (w·a_i + accepted_i) / (w + drafted_i) (``core.acceptance_estimate.AcceptanceEstimator``);
  3. step times: the profile blended with observed step durations (``controller/step_correction.py``);
  4. the table search over the allowed k: the offline tuner's evidence rule
     (``core.evidence.search_with_evidence``, one implementation) revising the table in force, so
     a k changes at a batch size only when the lower confidence bound of its gain (acceptance
     counts and step-time spread) clears ``stickiness``, and a range narrower than the step-time
     evidence pools (``StepTimeModel.pool_width()`` batch sizes) takes a neighbour's k unless
     its own beats that k beyond the threshold; while the flap backoff holds the table
     (``flapping.FlapCounter``: after a change that flips some batch size back, for 8, 64, 512, ...
     rebuilds as the flips repeat, up to ``flap_backoff_rebuilds``) a batch size goes back to its
     previous k only on a gain above 10 % at the lower confidence bound, 8 rebuilds in a row;
  5. within the time budget: install it (only if it changed), halve the live counters, decay w;
     else skip (counted). Every change of k at a batch size is counted (``switches``, exported
     per batch size and per hour).

* ``close()`` at shutdown: exports the last window.

The published file is polled (one ``os.stat``, at most once per ``poll_every_s``); a newer valid
version restarts the controller from it. Every failure is counted and logged once; the last good
table stays.

``Controller`` coordinates named parts, each with its own state: the installed version
(``version.Installed``, frozen; ``version.prepare`` builds it all or nothing), the evidence it keeps
(``evidence.Evidence``), the exploration (``exploration.Exploration``), the table in force with its
hysteresis (``search.TableInForce``), the export window (``window.ExportWindow``), the flap counter
(``flapping.FlapCounter``), its counters and log lines (``record``). The per-step path
(``next_lookup``, ``on_step``) touches their plain fields in place and allocates nothing per request.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import numpy as np

from tabletune_pipelines.controller.evidence import Evidence
from tabletune_pipelines.controller.exploration import Exploration
from tabletune_pipelines.controller.flapping import FlapCounter
from tabletune_pipelines.controller.loader import EngineFacts, StartPoint
from tabletune_pipelines.controller.metrics import Metrics, note_install, note_state, take_counts
from tabletune_pipelines.controller.record import Counters, Notes, fmt_table
from tabletune_pipelines.controller.search import (
    ContextInForce,
    TableInForce,
    context_state,
    dense_of,
    put_in_force,
)
from tabletune_pipelines.controller.step import StepOutcome, count_drafts
from tabletune_pipelines.controller.version import FileWatch, Installed, announce, prepare
from tabletune_pipelines.controller.window import ExportWindow
from tabletune_pipelines.formats.controller_settings import ControllerSettings

logger = logging.getLogger("tabletune.controller")

_DEFAULTS = ControllerSettings()


_ANOMALY = ("TableTune controller: a request-step reported %d drafted and %d kept (kept > drafted or drafted > "
            "K = %d); counted as clamped, further ones are only counted")
"""The note of a request-step with impossible counts (kept > drafted, or drafted > K): logged once."""


class Controller:
    """One engine's controller (see the module docstring). ``published_path`` may be None (then
    it only falls back); ``wall`` gives the UTC seconds used in exported windows."""

    honours_policy = False
    """Whether this class runs the ``policy`` setting's baselines (``evaluation.baselines.PolicyController``
    does). This one, the production controller, observes a version whose policy is not ``tabletune``."""

    def __init__(self, engine: EngineFacts, published_path: str | os.PathLike[str] | None, *,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None, source: str | None = None, metrics: Metrics | None = None) -> None:
        self.engine, self.metrics = engine, metrics  # metrics: the Prometheus series (None: none)
        self.log = log or logger
        self._clock = clock
        K, n = int(engine.max_k), int(engine.max_num_seqs)
        self._K, self._n = K, n
        self.steps = 0
        self.counters = Counters()
        self.notes = Notes(self.log)
        self.flaps = FlapCounter(n)
        self._t_started = clock()
        self.window = ExportWindow(K, clock(), wall=wall,
                                   source=source or f"{socket.gethostname()}:{os.getpid()}:{int(wall())}")
        # The step before (its end, batch size and k) and when the next rebuild is due.
        self._last_t: float | None = None
        self._prev_b = 0
        self._prev_k: int | None = None
        self._next_rebuild = 0
        # What is in force: until a version is installed, the launch table and an empty evidence.
        launch = engine.launch_ranges or ((1, n, K),)
        self.table = TableInForce(tuple((int(s), int(e), min(K, int(k))) for s, e, k in launch))
        self.version: Installed | None = None
        self.evidence = Evidence(K)
        self.exploration: Exploration | None = None
        self.grid = ContextInForce()  # a (batch size x context) table in force, and the step's bucket
        self.fallback_reason: str | None = None
        self.watch = FileWatch(published_path)
        res = self.watch.first_look(engine)
        new = res if isinstance(res, str) else self._try_prepare(res)
        if isinstance(new, str):
            self.fallback_reason = new
            self.log.warning("TableTune controller: using the engine's configured table %s: %s",
                             fmt_table(self.table.ranges), new)
        else:
            self._commit(new)

    # ------------------------------------------------------------------ what is in force
    @property
    def start(self) -> StartPoint | None:  # the validated published file in force (None while falling back)
        return self.version.start if self.version else None

    @property
    def settings(self) -> ControllerSettings:  # the settings in force (the defaults while falling back)
        return self.version.settings if self.version else _DEFAULTS

    # Read often from outside: the version's flags, the table in force, the counters (``Counters`` holds all).
    controlling = property(lambda self: self.version is not None and self.version.controlling)
    applying = property(lambda self: self.version is not None and self.version.applying)
    ranges = property(lambda self: self.table.ranges)
    rebuilds = property(lambda self: self.counters.rebuilds)
    errors = property(lambda self: self.counters.errors)
    exports = property(lambda self: self.counters.exports)
    export_failures = property(lambda self: self.counters.export_failures)

    # ------------------------------------------------------------------ installing a version
    def _try_prepare(self, start: StartPoint) -> Installed | str:
        """``_prepare(start)``, or one sentence saying why ``start`` cannot be installed."""
        try:
            return self._prepare(start)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the version in force stays whole
            return (f"published table {self.watch.path} (v{start.published.version}) could not be installed "
                    f"({type(exc).__name__}: {exc})")

    def _prepare(self, start: StartPoint) -> Installed:
        """Everything ``start`` puts in force, built without touching ``self`` (``version.prepare``)."""
        return prepare(start, self.engine, self.flaps, self.steps, note=self.notes.once)

    def _commit(self, new: Installed) -> None:
        """Put a prepared version in force (plain assignments: nothing can fail half-way), then say so."""
        self.version, self.evidence, self.exploration, self.flaps = new, new.evidence, new.exploration, new.flaps
        self.grid.install(new.context, new.columns)
        self.table.install(new.table, new.lookups, new.settings.hysteresis_hold_steps)
        self._next_rebuild = self.steps + int(new.settings.rebuild_every_steps)
        self.fallback_reason = None
        self._announce(new)
        note_install(self.metrics, self)

    def _announce(self, new: Installed) -> None:
        """The log lines of a newly installed version (``version.announce``)."""
        announce(self.log, new, honours_policy=self.honours_policy)

    def _poll(self, now: float) -> None:
        """Look at the published file (when due, ``FileWatch.look``) and install a newer valid version."""
        cur = self.start.published.version if self.start else 0
        found = self.watch.look(now, self.settings, self.engine, cur, fmt_table(self.table.ranges), self.notes)
        if found is None:
            return
        res, sig = found
        new = self._try_prepare(res)
        if isinstance(new, str):  # the version in force stays whole
            self.watch.refused += 1
            self.notes.once("install:" + new, "TableTune controller: not using the changed published file, keeping "
                            "v%d and table %s: %s", cur, fmt_table(self.table.ranges), new)
        else:
            self.export(now, force=True)  # the old version's last window
            self.counters.reloads += 1
            self._commit(new)
        self.watch.sig = sig  # judged (a new version once in force: if anything above raised, polls retry it)

    # ------------------------------------------------------------------ the hot path
    def next_lookup(self, lengths: Sequence[int] | None = None) -> list[int] | None:
        """The lookup for the next step (None: leave vLLM's); ``lengths``: the running requests' KV lengths."""
        grid = self.grid  # a (batch size x context) table: its bucket's column (explored as a batch-only one)
        ex = self.exploration  # None unless controlling (and then a run of steps at K, then at another k)
        if ex is not None and (ex.left > 0 or self.steps >= ex.next_at):
            grid.locate(lengths)  # a grid: the step's drafts and time go to its bucket's column
            self.counters.exploration_steps += 1
            return ex.next(self.steps)
        return self.table.pick() if grid.lookups is None else grid.pick(lengths)

    def on_step(self, step: StepOutcome) -> None:
        """One engine step's outcome (``update_from_output``; ``step.now`` is ``time.monotonic()``)."""
        t_in = perf_counter()
        b = len(step.num_scheduled_tokens)
        now = step.now
        last, self._last_t = self._last_t, now
        if b == 0:
            self._prev_b = 0
            return
        self.steps += 1
        ev, win, cols = self.evidence, self.window, self.grid.cols
        k_next, num_new, total_tokens = step.k_next, step.num_new, step.total_tokens
        if self.metrics is not None:  # the step's cell and k; the counts before it are the cell before's
            self.metrics.cells.enter(b, k_next, ev.hist_d, ev.hist_a, step.column)
        if cols is not None:  # the counts before it are the column before's
            cols.enter(step.column, ev.hist_d, ev.hist_a)
        if k_next is not None:
            drafted, kept, _ = count_drafts(step.spec_tokens, step.req_id_to_index, step.sampled, self._K,
                                            ev.hist_d, ev.hist_a, self._anomaly)
        else:  # an engine whose SchedulerOutput lacks the field: the k just verified (this step's longest draft)
            drafted, kept, k_next = ev.count_unknown_k(step, self._anomaly)
        win.tokens += b + kept
        if ev.served is not None:  # the live workload only prices the published served model
            wl = ev.wl
            wl[0] += num_new
            wl[1] += max(0, total_tokens - b - drafted)
            wl[2] += b + kept
        if last is not None and self._prev_b:
            dt = now - last
            win.busy += dt
            costs = ev.costs if cols is None else cols.columns[step.column].evidence.costs
            if costs is not None:  # which intervals observe T(B, k): CostObserver.observe
                decode_only = step.decode_only(drafted)
                dec = b - num_new + drafted  # the decoding requests' tokens and drafts (StepSample's)
                costs.observe(dt, b, k_next, self._prev_b, self._prev_k, decode_only, dec, total_tokens - dec)
        self._prev_b, self._prev_k = b, k_next
        ex = self.exploration
        if ex is not None and ex.pending and k_next == ex.k:
            ex.pending -= 1  # an exploration step: the k in force for hysteresis stays
        else:  # vLLM looked the step's k up at b = len(num_scheduled_tokens)
            (self.table if cols is None else cols.columns[step.column].table).served(b, k_next)
        win.steps += 1
        # Per-step cost of this hook (the counting above); the occasional rebuild and poll are timed on their own.
        hook = perf_counter() - t_in
        win.hook_s += hook
        if hook > win.hook_max:
            win.hook_max = hook
        if self.steps >= self._next_rebuild:
            self._next_rebuild = self.steps + (int(self.settings.rebuild_every_steps) if self.version else 100)
            self.rebuild(now)
        if now >= self.watch.next_at:
            self._poll(now)

    def _anomaly(self, n: int, m: int) -> None:
        self.counters.anomalies += 1
        self.notes.once("anomaly", _ANOMALY, n, m, self._K)

    # ------------------------------------------------------------------ rebuild
    def rebuild(self, now: float) -> None:
        """Fold the counts in and, when a search is possible, rebuild the table (module docstring)."""
        t0 = perf_counter()
        ev = self.evidence
        self.window.add_counts(*take_counts(ev, self.metrics))
        ev.hand_over_costs()
        cols = self.grid.cols
        if cols is not None and self.version is not None:  # a grid: each column on its own evidence
            cols.rebuild(t0, self.version, self.counters, self.notes, self.steps, self._clock(), self.table.ranges)
        elif self.version is not None and ev.estimator is not None and ev.model is not None:
            self._search(t0, self.version, ev, ev.estimator.estimate())
        self.export(now)
        note_state(self.metrics, self)

    def _search(self, t0: float, v: Installed, ev: Evidence, rates: np.ndarray) -> None:
        """Steps 3-5 of the module docstring on the estimated ``rates``, within ``rebuild_budget_ms`` of ``t0``."""
        s, t, n = v.settings, self.table, self._n
        budget = float(s.rebuild_budget_ms) / 1000.0
        incumbent = dense_of(t.candidate, n)
        chosen = (v.choose(incumbent, rates, self.counters.rebuilds, self._prev_b)
                  if perf_counter() - t0 <= budget else None)
        elapsed = perf_counter() - t0
        if chosen is None or elapsed > budget:
            self.counters.skipped_rebuilds += 1
            self.notes.skipped(elapsed * 1000.0, s.rebuild_budget_ms, t.ranges)
            return
        old, new, live = put_in_force(t, incumbent, chosen, ev, self.flaps, s, v.allowed_k, n, self.counters.rebuilds,
                                      rates, controlling=v.controlling)
        self.counters.rebuilt((perf_counter() - t0) * 1000.0, changed=new != old)
        self.notes.rebuilt(self.counters, self.steps, v, (old, new), rates, live, ev.model, self._clock())

    # ------------------------------------------------------------------ export
    def estimate(self) -> tuple[float, ...]:
        """â_i in force: the last rebuild's, else the current blend (the live counts alone without a prior)."""
        return self.evidence.estimate(self.window.rates)

    def state(self) -> dict[str, Any]:
        """The controller's state as exported (bounded size)."""
        v, t = self.version, self.table
        start = v.start if v else None
        return {
            "mode": "fallback" if v is None else ("control" if v.controlling else "observe"),
            "applied": self.applying, "published_version": start.published.version if start else None,
            "fallback_reason": self.fallback_reason,
            "table": [list(r) for r in t.ranges], "candidate_table": [list(r) for r in t.candidate],
            **context_state(start, self.grid.lookups),
            "allowed_k": list(start.allowed_k) if start else [], "prior": list(start.prior) if start else [],
            **self.evidence.acceptance_state(), "steps": self.steps, **self.counters.exported(),
            "step_time_correction": bool(self.settings.step_time_correction), **self.window.hook_state(),
            **self.evidence.step_time_state(), "refused_files": self.watch.refused,
            # switches of k per batch size since the controller started, flips back, holds
            **self.flaps.summary(self.counters.rebuilds, max(self._clock() - self._t_started, 1e-9) / 3600.0),
            **(self.grid.cols.state(self._n) if self.grid.cols is not None else {}),
        }

    def export(self, now: float, *, force: bool = False) -> bool:
        """Append the window's counts if due (or ``force``); True when a line was written."""
        v, win = self.version, self.window
        if v is None or not win.due(now, v.settings, force):
            return False
        win.add_counts(*take_counts(self.evidence, self.metrics, always=False))  # counts still in the histograms
        return win.write(now, v.start, self.estimate, self.state, self.counters, self.notes)

    # ------------------------------------------------------------------ failures
    def fail(self, where: str, exc: BaseException) -> None:
        """An exception in a hook: count it, log the first of its kind, keep the last good table."""
        self.counters.errors += 1
        self.notes.failure(where, exc, self.table.ranges)

    def close(self) -> None:
        """At shutdown: write the last window."""
        self.export(self._clock(), force=True)

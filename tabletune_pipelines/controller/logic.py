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
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tabletune_pipelines.controller.flapping import OVERRIDE_CONFIDENCE, FlapCounter
from tabletune_pipelines.controller.loader import EngineFacts, StartPoint, load_start
from tabletune_pipelines.controller.observations import CostObserver
from tabletune_pipelines.controller.search import (
    compact,
    dense_from_ranges,
    hysteresis_lookups,
    vllm_lookup,
)
from tabletune_pipelines.controller.settings import ControllerSettings
from tabletune_pipelines.controller.step import StepOutcome, count_drafts, fold, longest
from tabletune_pipelines.controller.step_correction import ServedPrior, StepTimeModel, served_prior
from tabletune_pipelines.core.acceptance_estimate import AcceptanceEstimator, EstimatorConfig
from tabletune_pipelines.core.evidence import SearchSettings, as_covariance, search_with_evidence
from tabletune_pipelines.core.noise import z_value
from tabletune_pipelines.core.noise import rates_covariance
from tabletune_pipelines.core.stepcost import StepCost, Workload
from tabletune_pipelines.formats.live_counters import CounterWindow, append_line, window_line

logger = logging.getLogger("tabletune.controller")


def _fmt_table(ranges: Sequence[Sequence[int]]) -> str:
    return "[" + ",".join(f"[{s},{e},{k}]" for s, e, k in ranges) + "]"


def _fmt(xs: Sequence[float], nd: int = 3) -> str:
    return "(" + ", ".join(f"{float(x):.{nd}f}" for x in xs) + ")"


class Controller:
    """One engine's controller (see the module docstring). ``published_path`` may be None (then
    it only falls back); ``wall`` gives the UTC seconds used in exported windows."""

    honours_policy = False
    """Whether this class runs the ``policy`` setting's baselines (``evaluation.baselines.PolicyController``
    does). This one, the production controller, observes a version whose policy is not ``tabletune``."""

    def __init__(self, engine: EngineFacts, published_path: str | os.PathLike[str] | None, *,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None, source: str | None = None) -> None:
        self.engine = engine
        self.path = None if published_path is None else Path(published_path)
        self.log = log or logger
        self._wall = wall
        self._clock = clock
        K, n = int(engine.max_k), int(engine.max_num_seqs)
        self._K, self._n = K, n
        self.source = source or f"{socket.gethostname()}:{os.getpid()}:{int(wall())}"
        launch = engine.launch_ranges or ((1, n, K),)
        self.launch_ranges = tuple((int(s), int(e), min(K, int(k))) for s, e, k in launch)
        # Counters (cumulative; exported in the state).
        self.steps = 0
        self.rebuilds = 0
        self.table_changes = 0
        self.skipped_rebuilds = 0
        self.exploration_steps = 0
        self.errors = 0
        self.anomalies = 0
        self.exports = 0
        self.export_failures = 0
        self.reloads = 0
        self.last_rebuild_ms = 0.0
        self.max_rebuild_ms = 0.0
        # Flapping: changes of k per batch size, reversals and the flap backoff's holds.
        self.flaps = FlapCounter(n)
        self._t_started = clock()
        self._logged: set[str] = set()
        self._last_unchanged_log = float("-inf")
        self._last_wall_end = float("-inf")
        self._last_estimate: tuple[float, ...] = ()
        # Per-step state: plain lists and ints, nothing allocated per request.
        self._hist_d = [0] * (K + 1)
        self._hist_a = [0] * (K + 1)
        self._last_t: float | None = None
        self._prev_b = 0
        self._prev_k: int | None = None
        self._cur_k: int | None = None
        self._off_table = 0  # consecutive steps served at a k the table in force does not give their B
        self._hyst_limit = 32  # hysteresis_hold_steps
        self._explore_left = 0  # lookups of the current exploration run still to hand out
        self._explore_pending = 0  # exploration steps handed out whose on_step has not come yet
        self._explore_k = 0
        self._explore_run = 1
        self._next_rebuild = 0
        self._next_explore = 0
        self._next_poll = 0.0
        self._sig: tuple[int, int, int] | None = None
        self._reset_window(clock())
        # What is in force.
        self.start: StartPoint | None = None
        self.settings = ControllerSettings()
        self.fallback_reason: str | None = None
        self.controlling = False
        self.applying = False
        self.ranges = self.launch_ranges
        self.candidate_ranges = self.launch_ranges
        self.estimator: AcceptanceEstimator | None = None
        self.model: StepTimeModel | None = None
        self._lookup: list[int] | None = None
        self._hyst: dict[int, list[int]] = {}
        self._explore: list[int] | None = None
        self._explore_cycle: list[list[tuple[int, list[int] | None]]] = []
        self._explore_seq: list[tuple[int, list[int] | None]] = []
        self._explore_i = 0
        # An open decision at the batch size in service: the run that explores the k that could beat
        # the table's k there (set at rebuilds; None when every decision there is settled).
        self._explore_focus: list[tuple[int, list[int] | None]] | None = None
        # Step intervals observed since the last rebuild (None without a step-time profile).
        self.costs: CostObserver | None = None
        # The live workload (requests admitted, prefill tokens, tokens produced), halved at rebuilds.
        self._wl = [0.0, 0.0, 0.0]
        self.served: ServedPrior | None = None
        self._served_cache: tuple[Any, np.ndarray, np.ndarray] | None = None
        self._initial_load()

    # ------------------------------------------------------------------ loading
    def _initial_load(self) -> None:
        res: StartPoint | str
        if self.path is None:
            res = "no published file is configured"
        else:
            self._sig = self._stat()
            res = load_start(self.path, self.engine)
        if not isinstance(res, str):
            new = self._try_prepare(res)
            if not isinstance(new, str):
                self._commit(res, new)
                return
            res = new
        self.fallback_reason = res
        self.log.warning("TableTune controller: using the engine's configured table %s: %s",
                         _fmt_table(self.launch_ranges), res)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _try_prepare(self, start: StartPoint) -> dict[str, Any] | str:
        """``_prepare(start)``, or one sentence saying why ``start`` cannot be installed."""
        try:
            return self._prepare(start)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the version in force stays whole
            return (f"published table {self.path} (v{start.published.version}) could not be installed "
                    f"({type(exc).__name__}: {exc})")

    def _prepare(self, start: StartPoint) -> dict[str, Any]:
        """Everything a validated published file puts in force, built without touching ``self``:
        ``{attribute: value}`` for ``_commit``. Installing is all or nothing: if anything here
        raises, the version in force (its state, its log and vLLM's lookup) stays as it was."""
        pub, s = start.published, start.settings
        K, n = self._K, self._n
        estimator: AcceptanceEstimator | None = None
        if start.prior:
            w = float(s.prior_weight)
            if start.prior_count > 0:
                w = min(w, float(start.prior_count))  # a prior is worth no more drafts than it saw
            estimator = AcceptanceEstimator(start.prior, EstimatorConfig(
                prior_weight=w, halve_after_rebuild=s.halve_after_rebuild, prior_decay=s.prior_decay,
                min_prior_weight=min(float(s.min_prior_weight), w)))
        ks = start.allowed_k
        model: StepTimeModel | None = None
        costs: CostObserver | None = None
        if start.profile_ms is not None:
            model = StepTimeModel(ks, start.profile_ms, prior_weight=s.step_time_prior_weight,
                                  min_prior_weight=s.step_time_min_prior_weight, max_count=s.step_time_max_count,
                                  hysteresis=int(s.hysteresis))
        served = served_prior(pub.document) if model is not None else None
        if isinstance(served, str):
            self._once("served:" + served, "TableTune controller: published v%d: %s", pub.version, served)
            served = None
        if model is not None:
            # Each served step's own prefill priced by the published served model (the one step-cost model).
            extra = (None if served is None else
                     StepCost(ks=tuple(ks), decode_ms=start.profile_ms, envelope=served.envelope,
                              fits=served.fits).step_extra())
            costs = CostObserver(ks, start.profile_ms, float(s.step_time_outlier_ratio), K, n, extra)
        can_switch = self.engine.launch_ranges is not None
        # The published table is put in force whenever k can be switched; only in control mode
        # (with a prior and a profile) is it rebuilt, explored around and held with hysteresis.
        controlling = (s.mode == "control" and start.can_control and can_switch
                       and (s.policy == "tabletune" or self.honours_policy))
        table = tuple((a, b, min(K, k)) for a, b, k in pub.ranges)
        lookup, hyst = self._lookups(table, applying=can_switch, controlling=controlling, ks=ks, h=s.hysteresis)
        kmax = max(ks) if ks else 0
        every, N = int(s.exploration_every_steps), int(s.rebuild_every_steps)
        explore = vllm_lookup(np.full(n, kmax)) if (controlling and every and kmax) else None
        # With step-time correction, each exploration runs at the largest k and then, for as many steps,
        # at the next other allowed k in turn, so every k's cost is observed, not only the largest one's
        # (a k never run keeps its profile however wrong, and a wrong profile of an unused k pulls the
        # table towards it); the largest k keeps its full share of exploration.
        run = int(s.exploration_run_steps)
        others = ([k for k in sorted(ks, reverse=True) if k != kmax]
                  if (explore is not None and model is not None and s.step_time_correction) else [])
        explore_cycle = ([[(kmax, explore)] * run + [(k, vllm_lookup(np.full(n, k)))] * run for k in others]
                         or [[(kmax, explore)] * run])
        return {
            "start": start, "settings": s, "fallback_reason": None, "_last_estimate": (),
            "estimator": estimator, "model": model, "costs": costs,
            "served": served, "_wl": [0.0, 0.0, 0.0], "_served_cache": None,
            "_hist_d": [0] * (K + 1), "_hist_a": [0] * (K + 1),
            "_N": N, "_next_rebuild": self.steps + N, "_explore_every": every,
            "_explore_run": int(s.exploration_run_steps), "_next_explore": self.steps + every,
            "_explore_left": 0, "_explore_pending": 0, "applying": can_switch, "controlling": controlling,
            "candidate_ranges": table, "ranges": table, "_lookup": lookup, "_hyst": hyst, "_explore": explore,
            "_explore_k": kmax, "_explore_cycle": explore_cycle, "_explore_i": 0, "_explore_seq": explore_cycle[0],
            "_explore_focus": None, "_off_table": 0, "_hyst_limit": int(s.hysteresis_hold_steps),
            # A new version starts its own flap history (its table is not the old one's); the switch
            # counts stay cumulative for the export.
            "flaps": self.flaps.restarted(int(s.flap_backoff_rebuilds)),
        }

    def _commit(self, start: StartPoint, new: dict[str, Any]) -> None:
        """Put a prepared version in force (plain assignments: nothing here can fail half-way), then
        say so."""
        self.__dict__.update(new)
        self._announce(start)

    def _announce(self, start: StartPoint) -> None:
        """The log lines of a newly installed version."""
        pub, ks, table = start.published, start.allowed_k, self.ranges
        for note in start.notes:
            self.log.info("TableTune controller: published v%d: %s", pub.version, note)
        if start.settings.policy != "tabletune" and not self.honours_policy:
            self.log.warning("TableTune controller: policy %s is an evaluation baseline and runs only under "
                             "--scheduler-cls tabletune_pipelines.evaluation.scheduler.EvaluationScheduler; this "
                             "plugin observes and serves the published table", start.settings.policy)
        if not self.applying:
            self.log.warning("TableTune controller: the launch has no num_speculative_tokens_per_batch_size, so k "
                             "cannot change; only observing (launch with a table listing every k in %s)", list(ks))
        self.log.info("TableTune controller: published v%d of %s loaded (%s; table %s; allowed k %s; prior %s "
                      "from %d drafts; w = %s; export %s)", pub.version, pub.deployment,
                      "controlling" if self.controlling else "observing only", _fmt_table(table), list(ks),
                      _fmt(start.prior) if start.prior else "none", start.prior_count,
                      f"{self.estimator.prior_weight:g}" if self.estimator else "-", start.export_path)

    def _lookups(self, ranges: tuple[tuple[int, int, int], ...], *, applying: bool, controlling: bool,
                 ks: Sequence[int], h: int) -> tuple[list[int] | None, dict[int, list[int]]]:
        """vLLM's lookup of ``ranges`` and its hysteresis variants (None, {} when k cannot change)."""
        if not applying:
            return None, {}
        dense = dense_from_ranges(ranges, self._n)
        return vllm_lookup(dense), (hysteresis_lookups(dense, ks, int(h)) if controlling else {})

    def _apply(self, ranges: tuple[tuple[int, int, int], ...],
               lookups: tuple[list[int] | None, dict[int, list[int]]] | None = None) -> None:
        """Make ``ranges`` the table in force (only handed to vLLM while controlling); ``lookups``:
        its ``_lookups``, when the caller built them before changing anything else."""
        if lookups is None:
            lookups = self._lookups(ranges, applying=self.applying, controlling=self.controlling,
                                    ks=self.start.allowed_k if self.start else (), h=self.settings.hysteresis)
        self.ranges, (self._lookup, self._hyst) = ranges, lookups

    def _poll(self, now: float) -> None:
        self._next_poll = now + max(1.0, float(self.settings.poll_every_s))
        if self.path is None:
            return
        sig = self._stat()
        if sig == self._sig:
            return
        if sig is None:
            self._sig = sig
            self._once("gone", "TableTune controller: published file %s is gone; keeping table %s",
                       self.path, _fmt_table(self.ranges))
            return
        res = load_start(self.path, self.engine)
        if isinstance(res, str):
            self._sig = sig  # this version of the file is judged: do not re-read it every second
            self._once("reject:" + res, "TableTune controller: not using the changed published file, keeping "
                       "table %s: %s", _fmt_table(self.ranges), res)
            return
        cur = self.start.published.version if self.start else 0
        if res.published.version <= cur:
            self._sig = sig
            self._once(f"old:{res.published.version}", "TableTune controller: published file %s holds v%d, not "
                       "newer than v%d in force; ignored", self.path, res.published.version, cur)
            return
        new = self._try_prepare(res)
        if isinstance(new, str):
            self._sig = sig  # judged, as a file the checks refuse: the version in force stays whole
            self._once("install:" + new, "TableTune controller: not using the changed published file, keeping "
                       "v%d and table %s: %s", cur, _fmt_table(self.ranges), new)
            return
        self.export(now, force=True)  # the old version's last window
        self.reloads += 1
        self._commit(res, new)
        # Only now is the new version in force: if anything above raised, the next poll retries it.
        self._sig = sig

    # ------------------------------------------------------------------ the hot path
    def next_lookup(self) -> list[int] | None:
        """The lookup for the next scheduled step (None: leave vLLM's as it is)."""
        if not self.controlling:
            return self._lookup
        if self._explore is not None and (self._explore_left > 0 or self.steps >= self._next_explore):
            # A run of exploration_run_steps steps at the largest k (then, with step-time correction, as
            # many at the next other k): steps after a run's first follow a step of the same k, so they
            # are clean observations of that k's step time.
            if self._explore_left > 0:
                self._explore_left -= 1
            else:
                self._next_explore = self.steps + self._explore_every
                # Every other run explores the open decision at the batch size in service, if any (the
                # evidence rule moves only on observations, and the cycle alone visits each other k
                # once per len(cycle) runs); the others follow the cycle, so every k stays observed.
                focus = self._explore_focus
                if focus is not None and self._explore_i % 2:
                    self._explore_seq = focus
                else:
                    self._explore_seq = self._explore_cycle[(self._explore_i // 2 if focus is not None else
                                                             self._explore_i) % len(self._explore_cycle)]
                self._explore_i += 1
                self._explore_left = len(self._explore_seq) - 1
            self._explore_k, lookup = self._explore_seq[len(self._explore_seq) - 1 - self._explore_left]
            self.exploration_steps += 1
            self._explore_pending = min(self._explore_pending + 1, len(self._explore_seq) + 1)  # idle schedules
            return lookup
        if self._hyst and self._cur_k is not None:
            if self._off_table < self._hyst_limit:
                return self._hyst.get(self._cur_k, self._lookup)
            # The hold is spent: B has stayed off the k in force for hysteresis_hold_steps steps (a load
            # that sits inside a range, not one that crosses its boundary). One step of the table as it
            # is makes the table's k the current one.
            self._off_table = 0
        return self._lookup

    def on_step(self, step: StepOutcome) -> None:
        """One engine step's outcome (``update_from_output``; ``step.now`` is ``time.monotonic()``)."""
        t_in = time.perf_counter()
        b = len(step.num_scheduled_tokens)
        now = step.now
        last, self._last_t = self._last_t, now
        if b == 0:
            self._prev_b = 0
            return
        self.steps += 1
        k_next, num_new, total_tokens = step.k_next, step.num_new, step.total_tokens
        if k_next is not None:
            drafted, kept, _ = count_drafts(step.spec_tokens, step.req_id_to_index, step.sampled, self._K,
                                            self._hist_d, self._hist_a, self._anomaly)
        else:  # an engine whose SchedulerOutput lacks the field: the k just verified (this step's longest draft)
            hd, ha = [0] * (self._K + 1), [0] * (self._K + 1)
            drafted, kept, _ = count_drafts(step.spec_tokens, step.req_id_to_index, step.sampled, self._K, hd, ha,
                                            self._anomaly)
            k_next = longest(hd)
            for i, (d, a) in enumerate(zip(hd, ha)):
                self._hist_d[i] += d
                self._hist_a[i] += a
        self._win_tokens += b + kept
        if self.served is not None:  # the live workload only prices the published served model
            self._wl[0] += num_new
            self._wl[1] += max(0, total_tokens - b - drafted)
            self._wl[2] += b + kept
        if last is not None and self._prev_b:
            dt = now - last
            self._win_busy += dt
            if self.costs is not None:  # which intervals observe T(B, k): CostObserver.observe
                decode_only = num_new == 0 and total_tokens == b + drafted  # nothing admitted, no prefill
                dec = b - num_new + drafted  # the decoding requests' tokens and drafts (StepSample's)
                self.costs.observe(dt, b, k_next, self._prev_b, self._prev_k, decode_only, dec, total_tokens - dec)
        self._prev_b, self._prev_k = b, k_next
        if self._explore_pending and k_next == self._explore_k:
            self._explore_pending -= 1  # an exploration step: the k in force for hysteresis stays
        else:
            self._cur_k = k_next
            lk = self._lookup  # vLLM looked the step's k up at b = len(num_scheduled_tokens)
            if lk is not None and b < len(lk):
                self._off_table = self._off_table + 1 if k_next != lk[b] else 0
        self._win_steps += 1
        t_out = time.perf_counter()
        # Per-step cost of this hook (the counting above), without the occasional rebuild and poll,
        # which are timed and reported on their own.
        hook = t_out - t_in
        self._win_hook_s += hook
        if hook > self._win_hook_max:
            self._win_hook_max = hook
        if self.steps >= self._next_rebuild:
            self._next_rebuild = self.steps + self._N if self.start else self.steps + 100
            self.rebuild(now)
        if now >= self._next_poll:
            self._poll(now)

    def _anomaly(self, n: int, m: int) -> None:
        self.anomalies += 1
        self._once("anomaly", "TableTune controller: a request-step reported %d drafted and %d kept (kept > drafted "
                   "or drafted > K = %d); counted as clamped, further ones are only counted", n, m, self._K)

    # ------------------------------------------------------------------ rebuild
    def _fold(self) -> tuple[list[int], list[int]]:
        """Per-position deltas from the histograms (drafted_i = request-steps with >= i drafts)."""
        return fold(self._hist_d, self._hist_a)

    def rebuild(self, now: float) -> None:
        """Fold the counts in and, when a search is possible, rebuild the table (module docstring)."""
        t0 = time.perf_counter()
        d, a = self._fold()
        for i in range(self._K):
            self._win_d[i] += d[i]
            self._win_a[i] += a[i]
        est, model, start = self.estimator, self.model, self.start
        if est is not None:
            est.observe_counts(d, a)
        if model is not None and self.costs is not None:
            self.costs.hand_over(model)
        if start is not None and est is not None and model is not None:
            self._search(t0, est, model, start)
        self.export(now)

    def _search(self, t0: float, est: AcceptanceEstimator, model: StepTimeModel, start: StartPoint) -> None:
        s = self.settings
        budget = float(s.rebuild_budget_ms) / 1000.0
        rates = est.estimate()
        chosen = self._choose(est, model, start, rates) if time.perf_counter() - t0 <= budget else None
        elapsed = time.perf_counter() - t0
        if chosen is None or elapsed > budget:
            self.skipped_rebuilds += 1
            self._once("budget", "TableTune controller: a rebuild took %.2f ms, over rebuild_budget_ms = %g; "
                       "skipped, keeping table %s (further skips are only counted)", elapsed * 1000.0,
                       s.rebuild_budget_ms, _fmt_table(self.ranges))
            return
        new = compact(chosen)
        old = self.candidate_ranges
        if new != old:
            self.flaps.count(dense_from_ranges(old, self._n), chosen, self.rebuilds)
        # The lookups first: if building them failed, nothing below (halving, decay) has happened.
        lookups = self._lookups(new, applying=self.applying, controlling=True, ks=start.allowed_k,
                                h=s.hysteresis) if self.controlling and new != old else None
        drafted_live, accepted_live, w = est.drafted.copy(), est.accepted.copy(), est.prior_weight
        est.rebuild()  # halves the live counters, decays w
        self._wl = [x * 0.5 for x in self._wl]
        if s.halve_after_rebuild and s.live_count_floor > 0:
            # ... but not below the floor: keep max(d / 2, min(d, floor)) draws, same acceptance ratio.
            keep = np.maximum(drafted_live * 0.5, np.minimum(drafted_live, s.live_count_floor))
            scale = np.where(drafted_live > 0, keep / np.maximum(drafted_live, 1e-12), 0.0)
            est.drafted[:] = drafted_live * scale
            est.accepted[:] = accepted_live * scale
        if self.controlling and new != old and s.step_time_correction:
            model.forget_left(dense_from_ranges(old, self._n), chosen)
        model.decay()
        self.candidate_ranges = new
        self.rebuilds += 1
        self.last_rebuild_ms = (time.perf_counter() - t0) * 1000.0
        self.max_rebuild_ms = max(self.max_rebuild_ms, self.last_rebuild_ms)
        self._last_estimate = tuple(float(x) for x in rates)
        if new != old:
            self.table_changes += 1
            if lookups is not None:
                self._apply(new, lookups)
            ratios = model.ratios()
            corr = ", ".join(f"k{k} x{float(np.median(ratios[i])):.2f}" for i, k in enumerate(model.ks)
                             if np.any(model.count[i] > 0))
            self.log.info("TableTune controller: rebuild %d at step %d%s: table %s -> %s; a = %s; live drafted %s "
                          "kept %s; prior weight %g; step-time correction %s; %.2f ms", self.rebuilds, self.steps,
                          "" if self.controlling else " (observing: not applied)", _fmt_table(old), _fmt_table(new),
                          _fmt(rates), [int(x) for x in drafted_live], [int(x) for x in accepted_live], w,
                          (corr or "none observed") if s.step_time_correction else "off", self.last_rebuild_ms)
            self._last_unchanged_log = self._clock()
        else:
            now = self._clock()
            if now - self._last_unchanged_log >= float(s.log_unchanged_every_s):
                self._last_unchanged_log = now
                self.log.info("TableTune controller: rebuild %d at step %d: table %s unchanged; a = %s; prior "
                              "weight %g; %.2f ms", self.rebuilds, self.steps, _fmt_table(new), _fmt(rates), w,
                              self.last_rebuild_ms)

    def _choose(self, est: AcceptanceEstimator, model: StepTimeModel, start: StartPoint,
                rates: np.ndarray) -> np.ndarray:
        """k per batch size (index B - 1): the evidence rule revising the table in force, on the
        corrected step times with their spread and the acceptance estimate with its counts; batch
        sizes do not flip back while the flap backoff holds the table, unless the gain is large."""
        s = self.settings
        if s.step_time_correction:
            times, var = model.corrected(), model.variance()
        else:
            times, var = model.profile, np.zeros_like(model.profile)
        if self.served is not None or s.step_time_correction:
            # What a served step costs over the decode surface: the tuner's pricing (the one step-cost
            # model, core.stepcost) under the live workload, corrected by every served step observed.
            e0 = v0 = None
            if self.served is not None:
                e0, v0 = self._served_extra_prior(times, rates, start)
            if s.step_time_correction:
                extra, xcov = model.served_extra_cov(e0, v0)
            else:
                extra, xcov = e0, v0
            times = np.maximum(times + extra, 1e-6)
            var = as_covariance(var) + as_covariance(xcov)
        n_eff = est.prior_weight + est.drafted  # the prior counts as w drafts at every position
        cov = rates_covariance(rates, drafted_per_pos=n_eff.tolist())
        incumbent = dense_from_ranges(self.candidate_ranges, self._n)
        search = SearchSettings(allowed_ks=start.allowed_k, threshold=float(s.stickiness),
                                confidence=float(s.evidence_confidence), min_range=model.pool_width())
        ev = search_with_evidence(times, var, start.allowed_k, rates, rates_cov=cov, settings=search,
                                  incumbent=incumbent,
                                  visits=model.all_count.sum(axis=0) if s.merge_islands else None)
        chosen = np.asarray(ev.choice.chosen, dtype=np.int64)
        self._explore_focus = self._focus(ev, chosen, start)
        if self.flaps.holding(self.rebuilds):
            chosen = self.flaps.allow(incumbent, chosen, self.rebuilds, _gain_lcb(ev, incumbent, chosen))
        return chosen

    def _served_extra_prior(self, times: np.ndarray, rates: np.ndarray,
                            start: StartPoint) -> tuple[np.ndarray, np.ndarray]:
        """The tuner's served extra (``StepCost.served``) under the live workload. It depends on the
        rates and the workload only (not on the decode surface), and costs 5-10 ms at max_num_seqs
        128 (50+ ms at 1024), so it is recomputed only when the rates move by 0.01 or a workload
        length by 5 %: at steady state almost never."""
        wl = self.workload()
        if wl is None or self.served is None:
            return np.zeros_like(times), np.zeros_like(times)
        key = (tuple(round(float(r), 2) for r in rates), round(float(np.log(wl.prompt_tokens)) / 0.05),
               round(float(np.log(wl.output_tokens)) / 0.05))
        if self._served_cache is None or self._served_cache[0] != key:
            cost = StepCost(ks=tuple(start.allowed_k), decode_ms=times, envelope=self.served.envelope,
                            fits=self.served.fits).served(rates, wl)
            self._served_cache = (key, cost.extra_ms, cost.var)
        return self._served_cache[1], self._served_cache[2]

    #: Requests the published workload counts as, against the live ones.
    WORKLOAD_PRIOR_REQUESTS = 100.0

    def workload(self) -> Workload | None:
        """L_in and L_out in force: the published workload blended with the live one (prefill tokens
        and tokens produced per admitted request), the published one counting as
        ``WORKLOAD_PRIOR_REQUESTS`` requests. None without a published workload."""
        if self.served is None:
            return None
        w0, (new, prefill, made) = self.served.workload, self._wl
        W = self.WORKLOAD_PRIOR_REQUESTS
        return Workload(prompt_tokens=max(1.0, (W * w0.prompt_tokens + prefill) / (W + new)),
                        output_tokens=max(1.0, (W * w0.output_tokens + made) / (W + new)), source="live")

    def _focus(self, ev: Any, chosen: np.ndarray, start: StartPoint) -> list[tuple[int, list[int] | None]] | None:
        """The exploration run for the open decision at the batch size in service: the largest k, then
        the other k whose gain over the chosen k there has the largest upper confidence bound above
        the stickiness (None when no k other than the largest is open there, or without exploration
        at the largest k)."""
        b = self._prev_b
        if self._explore is None or not 1 <= b <= self._n or not self.settings.step_time_correction:
            return None
        ks, c = ev.choice.ks, b - 1
        j = ks.index(int(chosen[c]))
        kmax = max(start.allowed_k)
        lim = float(np.log1p(self.settings.stickiness))
        best, best_up = None, lim
        for k in start.allowed_k:
            if k == kmax or k == int(chosen[c]):
                continue
            i = ks.index(k)
            up = float(ev.log_ratio[i, j, c] + ev.z * ev.log_sd[i, j, c])
            if up > best_up:
                best, best_up = k, up
        if best is None:
            return None
        run = int(self.settings.exploration_run_steps)
        return [(kmax, self._explore)] * run + [(best, vllm_lookup(np.full(self._n, best)))] * run

    def flapping(self) -> dict[str, Any]:
        """Switches of k (table changes at a batch size): total, per hour since the controller
        started, flips back, the batch sizes that switched most and how many are held now
        (``FlapCounter.summary``)."""
        return self.flaps.summary(self.rebuilds, max(self._clock() - self._t_started, 1e-9) / 3600.0)

    # ------------------------------------------------------------------ export
    def _reset_window(self, now: float) -> None:
        self._win_d = [0] * self._K
        self._win_a = [0] * self._K
        self._win_steps = 0
        self._win_tokens = 0
        self._win_busy = 0.0
        self._win_hook_s = 0.0
        self._win_hook_max = 0.0
        self._win_t0 = now
        self._win_wall0 = self._wall()
        self._next_export_try = now

    def estimate(self) -> tuple[float, ...]:
        """â_i in force: the last rebuild's (the table was built from it), else the current blend
        (live counts alone when there is no prior)."""
        if self._last_estimate:
            return self._last_estimate
        if self.estimator is not None:
            return tuple(float(x) for x in self.estimator.estimate())
        return tuple(float(x) for x in self._win_a_rate())

    def _win_a_rate(self) -> np.ndarray:
        d, a = np.asarray(self._win_d, dtype=float), np.asarray(self._win_a, dtype=float)
        return np.minimum.accumulate(np.where(d > 0, a / np.maximum(d, 1.0), 0.0))

    def state(self) -> dict[str, Any]:
        """The controller's state as exported (bounded size)."""
        st: dict[str, Any] = {
            "mode": "fallback" if self.start is None else ("control" if self.controlling else "observe"),
            "applied": bool(self.applying),
            "published_version": self.start.published.version if self.start else None,
            "fallback_reason": self.fallback_reason,
            "table": [list(r) for r in self.ranges],
            "candidate_table": [list(r) for r in self.candidate_ranges],
            "allowed_k": list(self.start.allowed_k) if self.start else [],
            "prior": list(self.start.prior) if self.start else [],
            "prior_weight": round(self.estimator.prior_weight, 4) if self.estimator else None,
            "live_drafted": [round(float(x), 1) for x in self.estimator.drafted] if self.estimator else [],
            "live_accepted": [round(float(x), 1) for x in self.estimator.accepted] if self.estimator else [],
            "steps": self.steps, "rebuilds": self.rebuilds, "table_changes": self.table_changes,
            "skipped_rebuilds": self.skipped_rebuilds, "exploration_steps": self.exploration_steps,
            "errors": self.errors, "anomalies": self.anomalies, "exports": self.exports,
            "export_failures": self.export_failures, "reloads": self.reloads,
            "last_rebuild_ms": round(self.last_rebuild_ms, 4), "max_rebuild_ms": round(self.max_rebuild_ms, 4),
            "step_time_correction": bool(self.settings.step_time_correction),
            "hook_us_mean": round(1e6 * self._win_hook_s / self._win_steps, 3) if self._win_steps else None,
            "hook_us_max": round(1e6 * self._win_hook_max, 3),
            **self.flapping(),
        }
        if self.model is not None:
            st["step_time_weight"] = round(self.model.weight, 4)
            st["step_time"] = self.model.summary()
            st["served_step"] = self.model.served_summary()
        wl = self.workload()
        if wl is not None:
            st["workload"] = {"prompt_tokens": round(wl.prompt_tokens, 2), "output_tokens": round(wl.output_tokens, 2)}
        return st

    def export(self, now: float, *, force: bool = False) -> bool:
        """Append the window's counts if due (or ``force``); True when a line was written."""
        start = self.start
        if start is None or (self._win_steps == 0 and not force):
            return False
        s = self.settings
        due = force or self._win_steps >= s.export_every_steps or now - self._win_t0 >= s.export_every_s
        if not due or (not force and now < self._next_export_try):
            return False
        if self._win_steps == 0:
            return False
        # Counts still in the histograms belong to this window too.
        d, a = self._fold()
        for i in range(self._K):
            self._win_d[i] += d[i]
            self._win_a[i] += a[i]
        if self.estimator is not None and any(d):
            self.estimator.observe_counts(d, a)
        # One writer's windows follow each other in time even if the wall clock steps back.
        w0 = max(self._win_wall0, self._last_wall_end)
        w1 = max(self._wall(), w0)
        try:
            line = window_line(CounterWindow(
                deployment=start.published.deployment,
                window_start=datetime.fromtimestamp(w0, timezone.utc),
                window_end=datetime.fromtimestamp(w1, timezone.utc),
                num_drafts=self._win_d[0] if self._K else 0, drafted_per_pos=tuple(self._win_d),
                accepted_per_pos=tuple(self._win_a), identity_key=start.published.identity_key,
                table_version=start.published.version, steps=self._win_steps, tokens=self._win_tokens,
                busy_s=round(self._win_busy, 6), estimate=self.estimate(), source=self.source, seq=self.exports,
                controller=self.state()))
            append_line(start.export_path, line)
        except (OSError, ValueError) as exc:
            # ValueError: LiveCountersError, a line the format refuses or a file at export_path that is
            # not a live counters file (append_line writes nothing to it). One line for the disk's
            # failures, one for the format's and the file's.
            self.export_failures += 1
            self._next_export_try = now + max(1.0, float(s.export_every_s))
            self._once("export" if isinstance(exc, OSError) else "export:refused", "TableTune controller: cannot "
                       "write live counters to %s (%s); serving goes on, counts are kept for the next attempt "
                       "(further failures are only counted)", start.export_path,
                       getattr(exc, "strerror", None) or exc)
            return False
        self.exports += 1
        self._last_wall_end = w1
        self._reset_window(now)
        return True

    # ------------------------------------------------------------------ failures
    def _once(self, key: str, msg: str, *args: Any) -> None:
        if key in self._logged:
            return
        if len(self._logged) >= 256:  # a bounded set: past it, stay quiet rather than log every time
            self.suppressed_logs = getattr(self, "suppressed_logs", 0) + 1
            return
        self._logged.add(key)
        self.log.warning(msg, *args)

    def fail(self, where: str, exc: BaseException) -> None:
        """An exception in a hook: count it, log the first of its kind, keep the last good table."""
        self.errors += 1
        key = f"error:{where}:{type(exc).__name__}"
        if key not in self._logged:
            self._logged.add(key)
            self.log.warning("TableTune controller: %s failed (%r); serving goes on with table %s (further "
                             "failures of this kind are only counted)", where, exc, _fmt_table(self.ranges),
                             exc_info=exc)

    def close(self) -> None:
        """At shutdown: write the last window."""
        self.export(self._clock(), force=True)


def _gain_lcb(ev: Any, incumbent: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Per batch size, the lower confidence bound of log(G(chosen) / G(incumbent)) in the search's
    own evidence (``ev``: ``core.evidence.EvidenceTable``), at the search's confidence or
    ``flapping.OVERRIDE_CONFIDENCE``, whichever is higher; +inf where the incumbent's k was not
    searched (it has no claim), 0 where nothing changes."""
    row = {int(k): i for i, k in enumerate(ev.choice.ks)}
    cols = np.arange(incumbent.size)
    ci = np.array([row.get(int(k), -1) for k in chosen])
    ii = np.array([row.get(int(k), -1) for k in incumbent])
    ok = (ci >= 0) & (ii >= 0)
    c, i = np.where(ok, ci, 0), np.where(ok, ii, 0)
    z = max(float(ev.z), z_value(OVERRIDE_CONFIDENCE, max(1, len(ev.allowed) - 1)))
    lcb = ev.log_ratio[c, i, cols] - z * ev.log_sd[c, i, cols]
    return np.where(ok, np.where(ci == ii, 0.0, lcb), np.inf)

"""One profile run's inputs and state: what a rerun keeps and who gets each new measurement
(``ProfileHooks``), the servers it runs on (``ProfileServers``), what it measures (``ProfileTarget``)
and ``ProfileRun``, which measures groups of cells on a server, runs the adaptive plan and the
re-measurement, and reports the profile. ``engine.profiler`` picks the launches and drives a run
(its docstring holds the protocol)."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tabletune_pipelines.core.remeasure import (
    DEFAULT_DECISION_RATES,
    BoundaryReport,
    RemeasureReport,
    RemeasureSettings,
    cells_behind,
    coarse_batch_sizes,
    evidence_from_repetitions,
    geometric_rates,
    next_batch_sizes,
    remeasure,
    search_boundaries,
    seeded_batch_sizes,
    table_boundaries,
)
from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.core.steptime import median_step_time
from tabletune_pipelines.engine.cell import Measurement, measure_cell_once, warm_up
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.installed import resolve_device
from tabletune_pipelines.engine.plan import CellKey, ProfileOptions, ProfilePlan, rotations
from tabletune_pipelines.engine.process import VLLMServer
from tabletune_pipelines.engine.progress import ProfilerProgress
from tabletune_pipelines.errors import EngineError, TableTuneError
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell, StepTimeProfile
from tabletune_pipelines.vocab import DraftVerdict

__all__ = ["ProfileHooks", "ProfileRun", "ProfileServers", "ProfileTarget", "cell_key", "cell_seed"]

def cell_key(cell: StepTimeCell) -> CellKey:
    """(k, batch size, acceptance) of a cell."""
    return (cell.k, cell.batch_size, cell.acceptance)


def cell_seed(b: int, k: int | None, rep: int, acceptance: str) -> int:
    """The random seed of one repetition: distinct per batch size, k, repetition and verdict."""
    return b * 1000 + (0 if k is None else k + 1) * 10 + rep + (500_000 if acceptance == "accept" else 0)


@dataclass(frozen=True)
class ProfileHooks:
    """Where a profile's measurements come from and go to: what a rerun keeps, and who gets each new
    measurement the moment it exists (``store_hooks`` backs both with a ``TableTuneStore``)."""

    existing: tuple[StepTimeCell, ...] = ()
    """Cells measured before: kept, not measured again (a rerun after a crash resumes where it stopped)."""
    on_cell: Callable[[StepTimeCell], None] | None = None
    """Called with every new cell as soon as its last repetition is measured, and with every
    re-measured cell (all its repetitions)."""
    existing_samples: tuple[StepSample, ...] = ()
    """Mixed-step samples measured before: kept, and the mixed steps are not measured again."""
    on_samples: Callable[[list[StepSample]], None] | None = None
    """Called once with all the mixed-step samples of the run."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "existing", tuple(self.existing))
        object.__setattr__(self, "existing_samples", tuple(self.existing_samples))


@dataclass(frozen=True)
class ProfileServers:
    """The servers a profile runs on: running ones to use instead of launching, and how to launch the others."""

    server: VLLMServer | None = None
    """A running launch of the profiled config with a table and synthetic rates (``one_launch``;
    not stopped). Its rates are switched to 0 / 1 at runtime and restored afterwards; on a GPU its
    table must list every k of the plan."""
    nospec_server: VLLMServer | None = None
    """A running server without speculation for the baseline cells (not stopped)."""
    factory: Callable[[ServerConfig], VLLMServer] = VLLMServer
    """Makes the server of each launch (started and stopped by the profiler)."""


@dataclass(frozen=True)
class ProfileTarget:
    """What one ``profile_step_times`` call measures."""

    config: ServerConfig
    """The launch config, the options' server overrides applied."""
    options: ProfileOptions
    """The profile's options (mode, warm-up, re-measurement, mixed steps)."""
    plan: ProfilePlan
    """The cells to measure and how often."""
    identity: EngineIdentity
    """The engine the cells belong to."""
    vocab_size: int
    """Token ids of the timing prompts are drawn below this."""

    @property
    def K(self) -> int:
        """The launch K."""
        return int(self.config.num_speculative_tokens or 0)


class ProfileRun:
    """State of one ``profile_step_times`` call at one context level (``target.plan`` holds one
    level, its ``prompt_tokens``). The runs of the further levels of one call share the first's
    servers, warm-up and k switches (``shared``); each has its own cells, search and report."""

    def __init__(self, target: ProfileTarget, hooks: ProfileHooks, servers: ProfileServers,
                 progress: Callable[[str], None] | None, shared: ProfileRun | None = None) -> None:
        self.target, self.hooks, self.servers = target, hooks, servers
        self.level = target.plan.prompt_tokens
        """The context level: tokens of each timed request's prompt."""
        self.plan, self.K, self.vocab_size = target.plan, target.K, target.vocab_size
        self.config, self.work = target.config, target.config.work_dir
        device = getattr(servers.server, "device", None) or resolve_device(target.config.device)
        self.warmup = target.options.warmup_for(device)
        self.have: dict[CellKey, StepTimeCell] = {cell_key(c): c for c in hooks.existing}
        self.grid = target.plan.batch_sizes
        """Every batch size the plan may measure; the adaptive search measures some of them (``self.plan``)."""
        self.search_report: BoundaryReport | None = None
        if self.adaptive_search:
            complete = set(self._complete_batch_sizes())
            # a further level starts from its seed (``seed_from``); on a rerun, from what it measured
            coarse = set(coarse_batch_sizes(self.grid, target.options.coarse_points))
            start = complete if shared is not None and complete else coarse | complete
            self.plan = dataclasses.replace(target.plan, batch_sizes=tuple(sorted(start)))
        self.wanted = self.plan.cells(target.options.mode)
        self.todo = [key for key in self.wanted if key not in self.have]
        self.prog = ProfilerProgress(total=len(self.wanted), done=len(self.wanted) - len(self.todo),
                                     printer=progress or (lambda m: print(m, file=sys.stderr, flush=True)))
        self.on_cell = hooks.on_cell
        self.samples: list[StepSample] = list(hooks.existing_samples)
        self.new_cells: list[StepTimeCell] = []
        self._warmed: dict[int, set[tuple[int | None, int]]] = shared._warmed if shared else {}
        self.k_set: dict[int, int | None] = shared.k_set if shared else {}
        """The k this run (or the run it shares with) last set on each server (by id)."""
        self.seed: list[int] | None = None
        """The adaptive search's first pass when another level's boundaries seed it (``seed_from``)."""
        self.budget_s = target.options.remeasure_budget_s
        """Seconds of re-measurement this level may spend (the driver shares the options' budget out)."""
        self.fallbacks: dict[str, int] = {}
        """Repetitions that could not use the exact engine timing, by how they were timed instead."""
        self.remeasure_report: RemeasureReport | None = None

    @property
    def adaptive_search(self) -> bool:
        """Whether the batch sizes come from the adaptive search (``ProfileOptions.plan_search``): in
        ``one_launch`` mode, with two k or more and B = 1 in the grid (the search judges tables)."""
        opts, ks = self.target.options, [k for k in self.target.plan.ks if k is not None]
        return (opts.mode == "one_launch" and opts.plan_search == "adaptive" and len(ks) >= 2 and max(ks) >= 1
                and self.grid[0] == 1)

    def _complete_batch_sizes(self) -> list[int]:
        """Batch sizes of the grid whose all-rejected cells are measured for every k of the plan."""
        return [b for b in self.grid if all((k, b, "reject") in self.have for k in self.target.plan.ks)]

    def _replan(self, batch_sizes: Sequence[int]) -> None:
        """The plan's batch sizes become ``batch_sizes`` (the adaptive search added some)."""
        self.plan = dataclasses.replace(self.plan, batch_sizes=tuple(sorted(set(batch_sizes))))
        self.wanted = self.plan.cells(self.target.options.mode)
        self.todo = [key for key in self.wanted if key not in self.have]
        self.prog.total = len(self.wanted)

    def announce(self) -> None:
        """The opening progress line: how many cells, how many already measured, how."""
        n, left, plan = len(self.wanted), len(self.todo), self.plan
        how = (f"adaptive plan: coarse B = {list(plan.batch_sizes)} of the grid's {len(self.grid)} batch sizes first, "
               f"then bisection where the best k changes; {plan.repetitions} repetitions, then more until each "
               f"decision is settled or tied within {self.target.options.accepted_loss:.0%}"
               if self.adaptive_search else f"{plan.repetitions} repetitions")
        self.prog.say(f"[profile] {self.target.identity.key} at context {self.level}: {n} cells, {n - left} already "
                      "measured, "
                      f"{left} to measure (mode {self.target.options.mode}, {how}, "
                      f"warm-up {'on' if self.warmup else 'off'})")

    def pending_ks(self) -> tuple[list[int], list[int]]:
        """(k values with all-rejected cells to measure, k >= 1 with all-accepted cells to measure)."""
        plan = self.plan
        reject = [k for k in plan.ks if any((k, b, "reject") in self.todo for b in plan.batch_sizes)]
        accept = [k for k in plan.ks if k >= 1 and any((k, b, "accept") in self.todo for b in plan.accept_batch_sizes)]
        return reject, accept

    def measured(self) -> StepTimeProfile:
        """The profile (every cell, in the plan's order) after the closing progress line."""
        order = {key: i for i, key in enumerate(self.wanted)}
        cells = sorted(self.have.values(), key=lambda c: order.get(cell_key(c), len(order)))
        wall = [c for c in cells if c.timing == "wall"]
        rr = self.remeasure_report
        sr = self.search_report
        if sr is not None:
            self.prog.say(f"[profile] adaptive plan: {len(self.plan.batch_sizes)} of {len(self.grid)} batch sizes "
                          f"measured: coarse {sr.coarse}"
                          + "".join(f", {b} ({why})" for b, why in sorted(sr.added.items()))
                          + (f"; not bisected (k tied within {self.target.options.accepted_loss:.0%}): "
                             + ", ".join(f"{lo}..{hi}" for lo, hi in sr.skipped_ties) if sr.skipped_ties else "")
                          + ("; not measured (budget spent): "
                             + ", ".join(f"{b} ({why})" for b, why in sorted(sr.unmeasured.items()))
                             if sr.unmeasured else ""))
        self.prog.say(
            f"[profile] done: {len(self.new_cells)} cells measured in {time.monotonic() - self.prog.started:.0f} s"
            + (f" (+{rr.measurements} repetitions of {len(rr.cells)} cells re-measured)" if rr else "") + "; "
            f"repetitions timed by the draft-count fit: {self.fallbacks.get('fit', 0)}, by the wall clock: "
            f"{self.fallbacks.get('wall', 0)}; wall-timed cells in the profile: {len(wall)}"
            + (f" at B = {sorted({c.batch_size for c in wall})}" if wall else ""))
        return StepTimeProfile(identity=self.target.identity, cells=tuple(cells), mode=self.target.options.mode,
                               samples=tuple(self.samples))

    def launch(self, cfg: ServerConfig) -> VLLMServer:
        srv = self.servers.factory(cfg)
        srv.start()
        self.prog.say(f"[profile] server up in {srv.startup_seconds:.1f} s (log {srv.log_path})")
        return srv

    def emit(self, cell: StepTimeCell, note: str = "") -> None:
        self.have[cell_key(cell)] = cell
        self.new_cells.append(cell)
        if self.on_cell is not None:
            self.on_cell(cell)
        self.prog.cell(cell, note)

    def switch_k(self, server: Any, k: int | None) -> None:
        """``server.set_k(k)`` unless this run set it to k last."""
        if self.k_set.get(id(server), object()) != k:
            server.set_k(k)
            self.k_set[id(server)] = k

    def warm(self, server: Any, k: int | None, b: int) -> None:
        warmed = self._warmed.setdefault(id(server), set())
        if not self.warmup or (k, b) in warmed:
            return
        warm_up(server, b, prompt_tokens=self.plan.prompt_tokens, vocab_size=self.vocab_size)
        warmed.add((k, b))

    def group(self, server: Any, ks: Sequence[int | None], batch_sizes: Sequence[int], acceptance: DraftVerdict,
              switch: bool, launch_k: int | None = None) -> None:
        """Measure every missing (k, B) of ``ks`` x ``batch_sizes`` on ``server``."""
        for b in batch_sizes:
            pending = [k for k in ks if (k, b, acceptance) not in self.have]
            if not pending:
                continue
            reps: dict[int | None, list[Measurement]] = {k: [] for k in pending}
            for r, order in enumerate(rotations(pending, self.plan.repetitions)):
                for k in order:
                    if switch:
                        self.switch_k(server, k)
                    self.warm(server, k, b)
                    reps[k].append(measure_cell_once(
                        server, k, b, seed=cell_seed(b, k, r, acceptance), prompt_tokens=self.plan.prompt_tokens,
                        vocab_size=self.vocab_size, all_accepted=acceptance == "accept",
                        decode_steps=self.plan.decode_steps))
            for k in pending:
                self.emit(*self._cell(reps[k], k, b, acceptance, launch_k))

    def _cell(self, ms: list[Measurement], k: int | None, b: int, acceptance: DraftVerdict,
              launch_k: int | None) -> tuple[StepTimeCell, str]:
        vals = tuple(round(m.step_ms, 4) for m in ms)
        late = sum(1 for m in ms if not m.admitted_together)
        self._count_fallbacks(ms)
        cell = StepTimeCell(k=k, batch_size=b, median_ms=median_step_time(vals), repetitions_ms=vals,
                            acceptance=acceptance,
                            launch_k=None if k is None else (self.K if launch_k is None else launch_k),
                            timing="engine" if all(m.timing == "engine" for m in ms) else "wall",
                            context_tokens=self.level)
        walls = [m.wall_ms for m in ms if m.wall_ms]
        note = f"  wall {statistics.median(walls):.2f} ms" if walls else ""
        if late:
            note += f"  late-admission reps {late}"
        fitted = sum(1 for m in ms if m.engine_method == "fit")
        if fitted:
            note += f"  draft-count fit reps {fitted}"
        wall_reps = [m.engine_method for m in ms if m.timing == "wall"]
        if wall_reps:
            note += f"  WALL-timed reps {len(wall_reps)} ({wall_reps[0]})"
        return cell, note

    def _count_fallbacks(self, ms: Sequence[Measurement]) -> None:
        for m in ms:
            key = "wall" if m.timing == "wall" else ("fit" if m.engine_method == "fit" else None)
            if key:
                self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    # -- adaptive re-measurement ---------------------------------------------------------------
    def _reps(self, ks: Sequence[int]) -> dict[tuple[int, int], list[float]] | None:
        """The all-rejected repetitions of the plan's batch sizes, or None while a cell is missing."""
        reps = {}
        for k in ks:
            for b in self.plan.batch_sizes:
                cell = self.have.get((k, b, "reject"))
                if cell is None or not cell.repetitions_ms:
                    return None
                reps[(k, b)] = list(cell.repetitions_ms)
        return reps

    def adaptive_settings(self, options: ProfileOptions,
                          budget: bool = True) -> tuple[list[tuple[float, ...]], int] | None:
        """(acceptance profiles to judge decisions under, largest batch size) or None when the plan
        cannot give a table to judge (one k, or a grid without B = 1), or (``budget``) when the
        re-measurement is off."""
        ks = [k for k in self.plan.ks if k is not None]
        if len(ks) < 2 or self.plan.batch_sizes[0] != 1 or (budget and self.budget_s <= 0):
            return None
        kmax = max(ks)
        if kmax < 1:
            return None
        if options.decision_rates is not None:
            rates = [tuple(options.decision_rates)]
        else:
            rates = [geometric_rates(p, kmax) for p in DEFAULT_DECISION_RATES]
        return rates, self.grid[-1]

    def _settings(self, options: ProfileOptions) -> RemeasureSettings:
        tolerance = options.accepted_loss if self.adaptive_search else RemeasureSettings().tolerance
        return RemeasureSettings(max_repetitions=options.max_repetitions, budget_s=self.budget_s, tolerance=tolerance)

    def search_pending(self, options: ProfileOptions) -> bool:
        """Whether the adaptive search would measure something: a missing coarse cell, a batch size
        to add (``core.remeasure.next_batch_sizes``; only with a budget, which added batch sizes draw
        on) or an open decision."""
        settings = self.adaptive_settings(options, budget=False)
        reps = self._reps(self.plan.ks)
        if settings is None or reps is None:
            return True
        try:
            if self.budget_s > 0 and next_batch_sizes(reps, settings[0], settings[1], self.grid,
                                                      self._settings(options)):
                return True
        except TableTuneError:
            return False
        return self.remeasure_pending(options)

    def remeasure_pending(self, options: ProfileOptions) -> bool:
        """Whether some decision is ambiguous and a cell behind it may still get a repetition."""
        settings = self.adaptive_settings(options)
        reps = self._reps(self.plan.ks)
        if settings is None or reps is None:
            return False
        rates_options, n = settings
        tolerance = self._settings(options).tolerance
        try:
            for rates in rates_options:
                ev = evidence_from_repetitions(reps, rates, n)
                for b, (_, ks) in cells_behind(ev.ambiguous(tolerance), self.plan.batch_sizes).items():
                    if any(len(reps[(k, b)]) < options.max_repetitions for k in ks):
                        return True
        except TableTuneError:
            return False
        return False

    def remeasure(self, server: Any, options: ProfileOptions) -> None:
        """More repetitions where decisions are ambiguous (``core.remeasure``), on a server that
        runs every k of the plan with every draft rejected."""
        settings = self.adaptive_settings(options)
        reps = self._reps(self.plan.ks)
        if settings is None or reps is None:
            return
        rates_options, n = settings
        measure, update = self._remeasure_callbacks(server, reps)
        self.prog.say(f"[profile] re-measuring ambiguous decisions for up to {self.budget_s:.0f} s "
                      f"(at most {options.max_repetitions} repetitions per cell)")
        try:
            report = remeasure(reps, measure, rates_options, n, self._settings(options), on_update=update)
        except TableTuneError as exc:
            self.prog.say(f"[profile] re-measurement skipped: {exc}")
            return
        self._say_remeasured(report)

    def _say_remeasured(self, report: RemeasureReport) -> None:
        self.remeasure_report = report
        self.prog.say(f"[profile] re-measurement: {report.measurements} repetitions of {len(report.cells)} cells in "
                      f"{report.seconds:.0f} s, {report.stop_reason}"
                      + (f"; still open at B = {report.ambiguous_left}" if report.ambiguous_left else ""))
        by_reason: dict[str, list[int]] = {}
        for b, why in sorted(report.per_batch.items()):
            by_reason.setdefault(why, []).append(b)
        self.prog.say("[profile] re-measurement stopped per batch size: "
                      + "; ".join(f"{why}: B = {bs}" for why, bs in by_reason.items()))

    def _remeasure_callbacks(self, server: Any, reps: dict[tuple[int, int], list[float]]) -> tuple[
            Callable[[int, int], float], Callable[[int, int, list[float]], None]]:
        """``measure(k, B)`` (one more all-rejected repetition on ``server``) and ``update(k, B, values)``
        (the cell with all its repetitions, to ``on_cell``) for ``core.remeasure``."""
        last: dict[tuple[int, int], Measurement] = {}

        def measure(k: int, b: int) -> float:
            self.switch_k(server, k)
            m = measure_cell_once(server, k, b, seed=cell_seed(b, k, len(reps[(k, b)]), "reject"),
                                  prompt_tokens=self.plan.prompt_tokens, vocab_size=self.vocab_size,
                                  decode_steps=self.plan.decode_steps)
            self._count_fallbacks([m])
            last[(k, b)] = m
            return m.step_ms

        def update(k: int, b: int, values: list[float]) -> None:
            old = self.have[(k, b, "reject")]
            vals = tuple(round(v, 4) for v in values)
            m = last[(k, b)]
            cell = StepTimeCell(k=k, batch_size=b, median_ms=median_step_time(vals), repetitions_ms=vals,
                                acceptance="reject", launch_k=old.launch_k,
                                timing="wall" if old.timing == "wall" or m.timing == "wall" else "engine",
                                context_tokens=self.level)
            self.have[cell_key(cell)] = cell
            if self.on_cell is not None:
                self.on_cell(cell)
            self.prog.say(f"[profile] re-measured k={k} B={b} context {self.level}: {cell.median_ms:.2f} ms "
                          f"± {cell.stderr_ms or 0:.2f} "
                          f"({len(vals)} reps, spread {cell.spread:.0%}, {m.timing}"
                          + (f" {m.engine_method}" if m.engine_method != "exact" else "") + ")")

        return measure, update

    def spent_s(self) -> float:
        """Seconds of re-measurement this run spent (the adaptive search's or the re-measurement's)."""
        if self.search_report is not None:  # added batch sizes and repetitions: one budget
            return self.search_report.seconds
        return self.remeasure_report.seconds if self.remeasure_report is not None else 0.0

    def boundaries(self) -> list[tuple[int, int]]:
        """Where this level's tables change: neighbouring measured batch sizes (lo, hi) between which
        the k the evidence rule chooses differs under some judged acceptance
        (``core.remeasure.table_boundaries``); empty when the plan cannot be judged."""
        settings = self.adaptive_settings(self.target.options, budget=False)
        reps = self._reps(self.plan.ks)
        if settings is None or reps is None:
            return []
        try:
            return table_boundaries(reps, settings[0], settings[1], self._settings(self.target.options))
        except TableTuneError:
            return []

    def seed_from(self, previous: ProfileRun) -> None:
        """Start this level's adaptive search where ``previous`` (the level below) found its
        boundaries: the grid's ends and both sides of each (``core.remeasure.seeded_batch_sizes``),
        not the coarse batch sizes; the bisection and the verify step then go on as at the first level."""
        if not self.adaptive_search:
            return
        self.seed = seeded_batch_sizes(self.grid, previous.boundaries())
        self._replan([*self.seed, *self._complete_batch_sizes()])
        self.prog.say(f"[profile] context {self.level}: seeded by context {previous.level}'s boundaries "
                      f"{previous.boundaries()}: first pass B = {self.seed}")

    def search(self, server: Any, options: ProfileOptions) -> None:
        """The adaptive plan on a server that runs every k of the plan with every draft rejected
        (``core.remeasure.search_boundaries``): each batch size it picks measured at every k with the
        plan's repetitions, then repetitions where a decision is open, within the re-measurement budget."""
        rates_options, n = self.adaptive_settings(options, budget=False) or ([], self.grid[-1])
        ks = list(self.plan.ks)
        reps: dict[tuple[int, int], list[float]] = {}
        for b in self._complete_batch_sizes():
            for k in ks:
                reps[(k, b)] = list(self.have[(k, b, "reject")].repetitions_ms)

        def measure_batch(b: int) -> None:
            self._replan([*self.plan.batch_sizes, b])
            self.group(server, ks, [b], "reject", True)
            for k in ks:
                reps[(k, b)] = list(self.have[(k, b, "reject")].repetitions_ms)

        measure, update = self._remeasure_callbacks(server, reps)
        try:
            report = search_boundaries(self.grid, measure_batch, reps, measure, rates_options, n,
                                       self._settings(options), seed=self.seed, on_update=update,
                                       coarse_points=options.coarse_points)
        except EngineError:
            raise  # a dead engine ends the profile: the cells measured so far are stored, a rerun resumes
        except TableTuneError as exc:  # the cells measured so far stay; the grid's coarse points are in the plan
            self.prog.say(f"[profile] adaptive plan stopped: {exc}")
            return
        self.search_report = report
        self._replan(report.batch_sizes)
        self._say_remeasured(report.remeasure)


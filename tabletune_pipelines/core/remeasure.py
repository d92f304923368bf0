"""Measure more where the decision is close (docs/method.md, "Step time T(B, k)").

After the profiler's first pass (the same repetitions for every cell), the evidence search
(``core.evidence``) says at which batch sizes another k could still beat the chosen one by more
than a tolerance. Only the cells behind those decisions get more repetitions: the chosen k and
its rivals at that B (at the measured batch sizes around it when B is interpolated), one
repetition each, in an order that rotates from round to round (drift hits every k alike). Then
the search runs again on the new medians. It stops when no decision is ambiguous, when the
ambiguous cells all have ``max_repetitions``, or when the budget (seconds or measurements) is
spent. Cells that cannot change any decision are never measured again.

``remeasure`` is pure logic around a ``measure(k, B)`` callable, so the profiler drives a real
engine with it and the tests drive synthetic surfaces. Every updated cell goes to ``on_update``
with all its repetitions, so an interrupted run keeps what it measured (resumable: a rerun
starts from the stored repetitions).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tabletune_pipelines.core.evidence import (
    DEFAULT_CONFIDENCE,
    DEFAULT_TOLERANCE,
    Ambiguity,
    EvidenceTable,
    SearchSettings,
    search_with_evidence,
)
from tabletune_pipelines.core.noise import CellEstimate, NoisySurface
from tabletune_pipelines.core.steptime import median_standard_error
from tabletune_pipelines.core.table import DEFAULT_STICKINESS
from tabletune_pipelines.errors import InvalidValueError

#: Acceptance profiles the decisions are judged under when the profiler knows no prior:
#: geometric survival a_i = p^i for a low, a middle and a high acceptance.
DEFAULT_DECISION_RATES: tuple[float, ...] = (0.5, 0.7, 0.9)
#: Upper bound on any cell's repetitions through re-measurement.
DEFAULT_MAX_REPETITIONS = 9

Reps = MutableMapping[tuple[int, int], list[float]]
"""Repetitions (ms) per (k, B) cell."""


def geometric_rates(p: float, max_k: int) -> tuple[float, ...]:
    """a_i = p^i, i = 1..max_k."""
    return tuple(float(p ** i) for i in range(1, max_k + 1))


def evidence_from_repetitions(reps: Mapping[tuple[int, int], Sequence[float]], rates: Sequence[float],
                              max_num_seqs: int, *, threshold: float = DEFAULT_STICKINESS,
                              confidence: float = DEFAULT_CONFIDENCE, non_decreasing: bool = True) -> EvidenceTable:
    """The evidence search on raw repetitions ``{(k, B): [ms, ...]}`` (every draft rejected)."""
    cells: dict[int, dict[int, CellEstimate]] = {}
    for (k, b), r in reps.items():
        cells.setdefault(int(k), {})[int(b)] = CellEstimate(float(np.median(r)), len(r), median_standard_error(r),
                                                            tuple(float(x) for x in r))
    surface = NoisySurface.from_cells(cells)
    if non_decreasing:
        surface = surface.non_decreasing()
    return search_with_evidence(surface.step_times(max_num_seqs), rates,
                                settings=SearchSettings(threshold=threshold, confidence=confidence))


def cells_behind(ambiguities: Sequence[Ambiguity], batch_sizes: Sequence[int]) -> dict[int, tuple[float, set[int]]]:
    """Measured B -> (priority, k values) of the cells the ambiguous decisions rest on."""
    grid = sorted(batch_sizes)
    out: dict[int, tuple[float, set[int]]] = {}
    for a in ambiguities:
        if a.batch_size in grid:
            near = [a.batch_size]
        else:
            hi = next((b for b in grid if b > a.batch_size), grid[-1])
            lo = max((b for b in grid if b < a.batch_size), default=grid[0])
            near = [lo, hi]
        for b in near:
            prio, ks = out.get(b, (-np.inf, set()))
            out[b] = (max(prio, a.priority), ks | {a.chosen_k, *a.rivals})
    return out


@dataclass(frozen=True)
class RemeasureSettings:
    """How ``remeasure`` judges decisions and when it stops."""

    threshold: float = DEFAULT_STICKINESS
    """Gain (its lower bound) another k must show for the table to change k: the search's stickiness."""
    confidence: float = DEFAULT_CONFIDENCE
    """Level of the search's bounds."""
    tolerance: float = DEFAULT_TOLERANCE
    """A decision is ambiguous when another k could beat the chosen one by more than this."""
    max_repetitions: int = DEFAULT_MAX_REPETITIONS
    """No cell gets more repetitions than this (>= 1)."""
    budget_s: float | None = None
    """Seconds of the run's clock to spend (None: no limit of that kind; a round in progress finishes)."""
    budget_measurements: int | None = None
    """Repetitions to measure (None: no limit of that kind; a round in progress finishes)."""

    def __post_init__(self) -> None:
        if self.max_repetitions < 1:
            raise InvalidValueError(f"max_repetitions = {self.max_repetitions!r} must be >= 1")

    @property
    def disabled(self) -> bool:
        """A budget of zero (or less) turns the re-measurement off."""
        return ((self.budget_s is not None and self.budget_s <= 0)
                or (self.budget_measurements is not None and self.budget_measurements <= 0))

    def budget_spent(self, elapsed: Callable[[], float], measurements: int) -> bool:
        """Whether the seconds ``elapsed()`` says were spent (asked only under a budget in seconds) or
        the ``measurements`` taken exhaust a budget."""
        return ((self.budget_s is not None and elapsed() >= self.budget_s)
                or (self.budget_measurements is not None and measurements >= self.budget_measurements))


@dataclass
class RemeasureReport:
    """What a re-measurement run did."""

    measurements: int = 0
    """Repetitions measured."""
    rounds: int = 0
    """Rounds (one batch size's cells each)."""
    cells: set[tuple[int, int]] = field(default_factory=set)
    """(k, B) cells that got at least one more repetition."""
    stop_reason: str = ""
    """``resolved``, ``max repetitions``, ``budget`` or ``disabled``."""
    ambiguous_left: list[int] = field(default_factory=list)
    """Batch sizes still ambiguous at the end."""
    per_batch: dict[int, str] = field(default_factory=dict)
    """Measured batch size -> why its re-measurement stopped (``batch_stop_reasons``): ``decided``,
    ``tie within <tolerance>``, or the run's stop (``budget`` / ``max repetitions``) where still open."""
    seconds: float = 0.0
    """Wall time spent."""


def remeasure(
    reps: Reps,
    measure: Callable[[int, int], float],
    rates_options: Sequence[Sequence[float]],
    max_num_seqs: int,
    settings: RemeasureSettings = RemeasureSettings(),
    *,
    on_update: Callable[[int, int, list[float]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RemeasureReport:
    """Add repetitions to ``reps`` (in place) where a decision is ambiguous; see the module docstring.

    ``rates_options``: acceptance profiles to judge decisions under (a decision is ambiguous if it
    is under any). ``measure(k, B)`` returns one repetition in ms. ``settings``: the search's
    threshold, confidence and tolerance, the repetition cap and the budgets (``budget_s`` counts
    seconds of ``clock``).
    """
    if not rates_options:
        raise InvalidValueError("rates_options is empty: give at least one acceptance profile to judge decisions")
    report = RemeasureReport()
    t0 = clock()
    if settings.disabled:
        report.stop_reason = "disabled"
        return report
    grid = sorted({b for _, b in reps})
    while True:
        todo = _ambiguous_cells(reps, rates_options, max_num_seqs, settings, grid)
        report.ambiguous_left = sorted(todo)
        stop, pick = _next_round(reps, todo, settings, lambda: clock() - t0, report.measurements)
        if pick is None:
            report.stop_reason = stop
            break
        _measure_round(reps, measure, pick, report, on_update)
    report.per_batch = batch_stop_reasons(reps, rates_options, max_num_seqs, settings, grid, open_reason=stop)
    report.seconds = clock() - t0
    return report


def batch_stop_reasons(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int,
                       settings: RemeasureSettings, grid: Sequence[int], *, open_reason: str) -> dict[int, str]:
    """Measured B -> why it needs no more repetitions, under every acceptance profile at once: ``decided``
    (no other k can beat the chosen one at all, at the search's confidence), ``tie within X%`` (another
    k may be better, but by no more than the tolerance: a tie is a decision, the incumbent keeps it), or
    ``open_reason`` (the run's stop) where a rival could still win by more than the tolerance."""
    beyond = _ambiguous_cells(reps, rates_options, max_num_seqs, settings, grid)
    at_all = _ambiguous_cells(reps, rates_options, max_num_seqs, dataclasses.replace(settings, tolerance=0.0), grid)
    tie = f"tie within {settings.tolerance:.0%}"
    return {b: open_reason if b in beyond else tie if b in at_all else "decided" for b in grid}


def _ambiguous_cells(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int,
                     settings: RemeasureSettings, grid: Sequence[int]) -> dict[int, tuple[float, set[int]]]:
    """Measured B -> (priority, k values) of the cells behind decisions ambiguous under any acceptance profile."""
    todo: dict[int, tuple[float, set[int]]] = {}
    for rates in rates_options:
        ev = evidence_from_repetitions(reps, rates, max_num_seqs, threshold=settings.threshold,
                                       confidence=settings.confidence)
        for b, (prio, ks) in cells_behind(ev.ambiguous(settings.tolerance), grid).items():
            old = todo.get(b, (-np.inf, set()))
            todo[b] = (max(old[0], prio), old[1] | ks)
    return todo


def _next_round(reps: Reps, todo: Mapping[int, tuple[float, set[int]]], settings: RemeasureSettings,
                elapsed: Callable[[], float], measurements: int) -> tuple[str, tuple[int, list[int]] | None]:
    """(why to stop, None) or ("", (B, k values)): the batch size of highest priority whose cells
    may still get a repetition."""
    if not todo:
        return "resolved", None
    candidates = [(prio, b, sorted(k for k in ks if len(reps[(k, b)]) < settings.max_repetitions))
                  for b, (prio, ks) in todo.items()]
    candidates = [c for c in candidates if c[2]]
    if not candidates:
        return "max repetitions", None
    if settings.budget_spent(elapsed, measurements):
        return "budget", None
    _, b, ks = max(candidates, key=lambda c: (c[0], -c[1]))
    return "", (b, ks)


def _measure_round(reps: Reps, measure: Callable[[int, int], float], pick: tuple[int, list[int]],
                   report: RemeasureReport, on_update: Callable[[int, int, list[float]], None] | None) -> None:
    """One repetition of each cell of batch size B, the k order rotated by the round number."""
    b, ks = pick
    r = report.rounds % len(ks)
    for k in ks[r:] + ks[:r]:
        reps[(k, b)].append(float(measure(k, b)))
        report.measurements += 1
        report.cells.add((k, b))
        if on_update is not None:
            on_update(k, b, reps[(k, b)])
    report.rounds += 1


# -- boundaries, not grids -----------------------------------------------------------------------
#: Batch sizes of the adaptive plan's first pass: this many points spread evenly over the grid
#: (its smallest and largest among them).
COARSE_POINTS = 5


def coarse_batch_sizes(grid: Sequence[int], points: int = COARSE_POINTS) -> list[int]:
    """``points`` batch sizes of ``grid`` spread evenly by index, the first and last included."""
    g = sorted(set(int(b) for b in grid))
    if len(g) <= points:
        return g
    return sorted({g[round(i * (len(g) - 1) / (points - 1))] for i in range(points)})


@dataclass
class BoundaryReport:
    """What ``search_boundaries`` measured and why."""

    coarse: list[int] = field(default_factory=list)
    """Batch sizes of the first pass."""
    added: dict[int, str] = field(default_factory=dict)
    """Batch size -> why it was added: ``bisect`` (the best k changes between its neighbours) or
    ``verify`` (the midpoint of a run of equal decisions)."""
    skipped_ties: list[tuple[int, int]] = field(default_factory=list)
    """(lo, hi) neighbours whose k differ but are tied within the tolerance over lo..hi: not bisected."""
    unmeasured: dict[int, str] = field(default_factory=dict)
    """Batch size -> why the search wanted it (``bisect`` / ``verify``) where the budget was spent
    before it could be measured: a boundary there is placed between measured neighbours, unverified."""
    search_seconds: float = 0.0
    """Seconds of the clock spent measuring the added batch sizes (``added``); with the repetitions'
    (``remeasure.seconds``) they draw on one budget."""
    remeasure: RemeasureReport = field(default_factory=RemeasureReport)
    """The sequential repetitions over all passes (``remeasure``), its per-batch reasons from the last pass."""

    @property
    def batch_sizes(self) -> list[int]:
        """Every batch size measured, sorted."""
        return sorted({*self.coarse, *self.added})

    @property
    def seconds(self) -> float:
        """Seconds spent after the first pass: added batch sizes and repetitions (the budget's count)."""
        return self.search_seconds + self.remeasure.seconds


def _dense_decisions(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int,
                     settings: RemeasureSettings) -> list[EvidenceTable]:
    """The evidence search on the measured cells under each acceptance profile."""
    return [evidence_from_repetitions(reps, rates, max_num_seqs, threshold=settings.threshold,
                                      confidence=settings.confidence) for rates in rates_options]


def _tied(ev: EvidenceTable, ks: set[int], lo: int, hi: int, tolerance: float) -> bool:
    """Whether every pair of ``ks`` is within ``tolerance`` of each other (point estimates) at every
    B in lo..hi: a boundary placed anywhere between them then costs at most that."""
    lim = math.log1p(tolerance)
    idx = np.array([ev.choice.ks.index(k) for k in ks], dtype=np.intp)
    block = ev.log_ratio[np.ix_(idx, idx, np.arange(lo - 1, hi))]
    return bool(np.all(np.abs(block) <= lim))


def _midpoint(inside: Sequence[int], lo: int, hi: int) -> int:
    return min(inside, key=lambda b: (abs(b - (lo + hi) / 2), b))


def _best(evs: Sequence[EvidenceTable]) -> list[tuple[int, ...]]:
    """The best k at every B on point estimates, per acceptance profile (the rule's walk keeps an
    incumbent, so a boundary the best k shows may not show in the table yet)."""
    return [tuple(ev.choice.ks[i] for i in ev.choice.goodput.argmax(axis=0)) for ev in evs]


def _changes(measured: Sequence[int], evs: Sequence[EvidenceTable]) -> list[tuple[int, int]]:
    """Neighbouring measured batch sizes (lo, hi) between which the chosen or the best k changes
    under some acceptance profile."""
    out = []
    for lo, hi in zip(measured, measured[1:], strict=False):
        if any(len(set(ev.choice.chosen[lo - 1:hi]) | set(top[lo - 1:hi])) > 1
               for ev, top in zip(evs, _best(evs), strict=True)):
            out.append((lo, hi))
    return out


def table_boundaries(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int,
                     settings: RemeasureSettings = RemeasureSettings()) -> list[tuple[int, int]]:
    """The boundaries of a measured surface's tables: neighbouring measured batch sizes (lo, hi)
    between which the k the evidence rule chooses changes under some acceptance profile. A longer
    context level revises the shorter level's table on evidence (``tuning.derive_context``), so its
    search starts at these (``seeded_batch_sizes``). Changes of the best point estimate that the
    evidence does not carry into the table are left out: on a noisy surface they fall between almost
    every pair of neighbours (the embedded default at 32 tokens: 14 of 15 pairs, against 3 table
    boundaries over the three acceptance profiles)."""
    measured = sorted({b for _, b in reps})
    out = []
    for ev in _dense_decisions(reps, rates_options, max_num_seqs, settings):
        out += [(lo, hi) for lo, hi in zip(measured, measured[1:], strict=False)
                if len(set(ev.choice.chosen[lo - 1:hi])) > 1]
    return sorted(set(out))


def seeded_batch_sizes(grid: Sequence[int], boundaries: Sequence[tuple[int, int]]) -> list[int]:
    """The first pass of a search seeded by another surface's ``boundaries`` (the previous context
    level's): the grid's ends and both sides of every boundary. With no boundary, the ends and the
    grid's middle (one k everywhere there, so the verify step checks the run in between). Grid
    1..16 then every 8 to 64 with boundaries (4, 5) and (24, 32) gives ``[1, 4, 5, 24, 32, 64]``."""
    g = sorted(set(int(b) for b in grid))
    seed = {g[0], g[-1]} | {b for pair in boundaries for b in pair if b in g}
    if not boundaries:
        seed.add(g[len(g) // 2])
    return sorted(seed)


def next_batch_sizes(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int, grid: Sequence[int],
                     settings: RemeasureSettings = RemeasureSettings(),
                     skipped: list[tuple[int, int]] | None = None) -> dict[int, str]:
    """Batch sizes of ``grid`` to measure next, -> ``bisect`` or ``verify``: between measured
    neighbours where the chosen k or the best k (point estimates) differ anywhere over lo..hi (under
    any acceptance profile), their
    midpoint, unless those k are tied within ``settings.tolerance`` there (then ``skipped`` gets
    (lo, hi)); and for a run of measured batch sizes with equal decisions and no measured batch size
    inside it, the run's midpoint. Empty: every boundary sits between neighbouring grid points or
    between tied k, and every run is verified."""
    measured = sorted({b for _, b in reps})
    evs = _dense_decisions(reps, rates_options, max_num_seqs, settings)
    want: dict[int, str] = {}
    changes = set(_changes(measured, evs))
    for lo, hi in sorted(changes):
        inside = [b for b in grid if lo < b < hi]
        if not inside:
            continue
        for ev, top in zip(evs, _best(evs), strict=True):
            span = set(ev.choice.chosen[lo - 1:hi]) | set(top[lo - 1:hi])
            if len(span) < 2:
                continue
            if _tied(ev, span, lo, hi, settings.tolerance):
                if skipped is not None and (lo, hi) not in skipped:
                    skipped.append((lo, hi))
                continue
            want[_midpoint(inside, lo, hi)] = "bisect"
    start = 0
    for i in range(1, len(measured) + 1):  # runs of equal decisions, split where a decision changes
        if i < len(measured) and (measured[i - 1], measured[i]) not in changes:
            continue
        run = measured[start:i]
        start = i
        if len(run) == 2:
            inside = [b for b in grid if run[0] < b < run[1]]
            if inside:
                want.setdefault(_midpoint(inside, run[0], run[1]), "verify")
    return want


def search_boundaries(
    grid: Sequence[int],
    measure_batch: Callable[[int], None],
    reps: Reps,
    measure: Callable[[int, int], float],
    rates_options: Sequence[Sequence[float]],
    max_num_seqs: int,
    settings: RemeasureSettings = RemeasureSettings(),
    *,
    coarse_points: int = COARSE_POINTS,
    seed: Sequence[int] | None = None,
    on_update: Callable[[int, int, list[float]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BoundaryReport:
    """The adaptive plan ("boundaries, not grids"): the coarse batch sizes of ``grid``
    first, then ``next_batch_sizes`` until it is empty, each pass followed by ``remeasure`` (the
    sequential cells: repetitions only where a decision is open beyond the tolerance). Everything
    after the first pass, added batch sizes and repetitions alike, draws on ``settings.budget_s``:
    once it is spent no batch size is added (bisections first, then verifications, each pass), and
    the ones still wanted go to ``report.unmeasured``. ``measure_batch(B)`` measures every k at B
    once per repetition of the first pass and puts the repetitions into ``reps`` (in place);
    ``measure(k, B)`` gives one more. Batch sizes already in ``reps`` (a rerun) count as measured.
    ``seed``: the first pass instead of the coarse batch sizes (``seeded_batch_sizes``: where
    another surface's boundaries were)."""
    report = BoundaryReport(coarse=sorted(seed) if seed is not None else coarse_batch_sizes(grid, coarse_points))
    done = {b for _, b in reps}
    todo = {b: "coarse" for b in report.coarse if b not in done}

    def left_s() -> float | None:
        return None if settings.budget_s is None else max(0.0, settings.budget_s - report.seconds)

    while True:
        for b, why in sorted(todo.items(), key=lambda item: (item[1] != "coarse", item[1] != "bisect", item[0])):
            if why == "coarse":
                measure_batch(b)
                continue
            if left_s() == 0.0:
                report.unmeasured[b] = why
                continue
            t0 = clock()
            measure_batch(b)
            report.search_seconds += clock() - t0
            report.added[b] = why
        left = left_s()
        if left is not None and left > 0 and _wanted(reps, rates_options, max_num_seqs, grid, settings, report):
            left /= 2  # repetitions take at most half of what is left while batch sizes are still wanted
        sub = remeasure(reps, measure, rates_options, max_num_seqs,
                        dataclasses.replace(settings, budget_s=left), on_update=on_update, clock=clock)
        if sub.stop_reason == "disabled":  # the budget is spent: say where decisions are still open
            sub.per_batch = batch_stop_reasons(reps, rates_options, max_num_seqs, settings,
                                               sorted({b for _, b in reps}), open_reason="budget")
        _merge_report(report.remeasure, sub, budget_gone=left is not None and left <= 0)
        todo = _wanted(reps, rates_options, max_num_seqs, grid, settings, report)
        if not todo:
            return report


def _wanted(reps: Reps, rates_options: Sequence[Sequence[float]], max_num_seqs: int, grid: Sequence[int],
            settings: RemeasureSettings, report: BoundaryReport) -> dict[int, str]:
    """``next_batch_sizes`` less the measured ones and the ones the budget already left out."""
    measured = {b for _, b in reps}
    todo = next_batch_sizes(reps, rates_options, max_num_seqs, grid, settings, report.skipped_ties)
    return {b: why for b, why in todo.items() if b not in measured and b not in report.unmeasured}


def _merge_report(total: RemeasureReport, sub: RemeasureReport, *, budget_gone: bool) -> None:
    total.measurements += sub.measurements
    total.rounds += sub.rounds
    total.cells |= sub.cells
    total.seconds += sub.seconds
    total.ambiguous_left = sub.ambiguous_left
    total.stop_reason = "budget" if budget_gone and sub.stop_reason == "disabled" else sub.stop_reason
    total.per_batch = sub.per_batch


def replay_search(recorded: Mapping[tuple[int, int], Sequence[float]], rates_options: Sequence[Sequence[float]],
                  max_num_seqs: int, settings: RemeasureSettings = RemeasureSettings(), *,
                  coarse_points: int = COARSE_POINTS) -> BoundaryReport:
    """``search_boundaries`` replayed on a full grid's recorded repetitions ``{(k, B): [ms, ...]}``
    (every k at every batch size of the grid): the plan sees only the batch sizes it asks for, each
    with every recorded repetition, and never more than the record holds (``settings.max_repetitions``
    is capped at the smallest recorded count, so no repetition is asked for). Judges the plan against
    the grid on the same data, without launch-to-launch drift."""
    grid = sorted({b for _, b in recorded})
    ks = sorted({k for k, _ in recorded})
    missing = [(k, b) for k in ks for b in grid if not recorded.get((k, b))]
    if missing:
        raise InvalidValueError(f"replay_search needs repetitions of every k at every batch size of the grid; "
                                f"none for (k, B) = {missing[:5]}")
    reps: dict[tuple[int, int], list[float]] = {}

    def measure_batch(b: int) -> None:
        for k in ks:
            reps[(k, b)] = [float(x) for x in recorded[(k, b)]]

    def measure(k: int, b: int) -> float:
        raise AssertionError(f"replay_search asked for a repetition of (k={k}, B={b}) beyond the record")

    cap = min(settings.max_repetitions, min(len(v) for v in recorded.values()))
    return search_boundaries(grid, measure_batch, reps, measure, rates_options, max_num_seqs,
                             dataclasses.replace(settings, max_repetitions=cap), coarse_points=coarse_points)

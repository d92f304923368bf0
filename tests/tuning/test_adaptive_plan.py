"""The adaptive profile plan (``core.remeasure.search_boundaries``) against the full grid on the
same data (``core.remeasure.replay_search``): the step-time profiles measured on a real H200
(benchmarks/data/h200/, every batch size of the grid, 3 repetitions each) and the embedded default's
full grids on the CPU build (benchmarks/data/cpu/2026-12-0[67]-adaptive-vs-grid/). The adaptive plan
sees only the batch sizes it asks for; its table
must be the grid's table or lose at most the accepted loss (1 %) of goodput against it, judged on
the grid's own cells, averaged over the batch sizes (a uniform load)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tabletune_pipelines.core.evidence import ACCEPTED_LOSS
from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.core.remeasure import (
    DEFAULT_DECISION_RATES,
    RemeasureSettings,
    coarse_batch_sizes,
    geometric_rates,
    next_batch_sizes,
    replay_search,
    search_boundaries,
)
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
from tabletune_pipelines.tuning.derive import derive_table
from tabletune_pipelines.tuning.run_report import compare_tables

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200"
#: The embedded default's full grids on the CPU build (benchmarks/adaptive_vs_grid.py, 2026-12-06 with
#: ProfileOptions' defaults, 2026-12-07 with the main job's settings).
CPU_GRIDS = [DATA.parent / "cpu" / f"{day}-adaptive-vs-grid" / "grid.profile.json" for day in ("2026-12-06", "2026-12-07")]
PROFILES = [*sorted(DATA.glob("**/*.one_launch.json")), *CPU_GRIDS]


def _prior(rates):
    n = len(rates)
    return AcceptancePrior(rates=tuple(rates), num_drafts=0, drafted_per_pos=(0,) * n, accepted_per_pos=(0,) * n,
                           prompt_fingerprint="given", prompt_count=0, source="synthetic")


def _adaptive(prof: StepTimeProfile):
    """The adaptive plan replayed on the profile's recorded repetitions (``replay_search``): (report,
    grid, profile of what it measured)."""
    full = {(c.k, c.batch_size): list(c.repetitions_ms) for c in prof.cells if c.acceptance == "reject"}
    grid = sorted({b for _, b in full})
    rates = [geometric_rates(p, max(k for k, _ in full)) for p in DEFAULT_DECISION_RATES]
    report = replay_search(full, rates, prof.identity.max_num_seqs,
                           RemeasureSettings(max_repetitions=3, tolerance=ACCEPTED_LOSS))
    kept = set(report.batch_sizes)
    sub = dataclasses.replace(prof, cells=tuple(c for c in prof.cells
                                                if c.acceptance != "reject" or c.batch_size in kept))
    return report, grid, sub


def test_a_replay_sees_only_the_batch_sizes_it_asks_for_and_refuses_a_partial_record():
    recorded = {(k, b): [10.0 + b + 3 * k, 10.2 + b + 3 * k, 9.9 + b + 3 * k] for k in (0, 1, 3) for b in range(1, 17)}
    report = replay_search(recorded, [geometric_rates(0.7, 3)], 16, RemeasureSettings(max_repetitions=9))
    assert set(coarse_batch_sizes(range(1, 17))) <= set(report.batch_sizes) < set(range(1, 17))
    assert report.remeasure.measurements == 0  # never past the record (3 repetitions a cell)
    del recorded[(3, 7)]
    with pytest.raises(InvalidValueError, match=r"\(3, 7\)"):
        replay_search(recorded, [geometric_rates(0.7, 3)], 16)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.parent.name[:30] + "/" + p.name[:32])
@pytest.mark.parametrize("p", DEFAULT_DECISION_RATES)
def test_adaptive_table_is_the_grids_or_within_the_accepted_loss(path, p):
    prof = StepTimeProfile.from_json(path.read_text())
    report, grid, sub = _adaptive(prof)
    prior = _prior(geometric_rates(p, prof.identity.max_k))
    grid_t, adaptive_t = derive_table(prof, prior), derive_table(sub, prior)
    # the grid's own cells judge both tables
    cmp = compare_tables(grid_t.evidence, grid_t.choice.ks, adaptive_t.table.ranges, grid_t.table.ranges,
                         prof.identity.max_num_seqs)
    assert adaptive_t.table.ranges == grid_t.table.ranges or 1.0 - cmp.mean <= ACCEPTED_LOSS, (
        adaptive_t.table.ranges, grid_t.table.ranges, cmp.mean)
    assert set(coarse_batch_sizes(grid)) <= set(report.batch_sizes) <= set(grid)


def test_the_adaptive_plan_measures_a_fraction_of_a_large_grid():
    dense = next(p for p in PROFILES if "qwen3-4b" in p.name)
    report, grid, _ = _adaptive(StepTimeProfile.from_json(dense.read_text()))
    assert len(grid) == 30 and len(report.batch_sizes) <= len(grid) // 2


def _surface_reps(ms_of, grid, ks, reps_n=3, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return {(k, b): [ms_of(k, b) * (1 + noise * rng.standard_normal()) for _ in range(reps_n)]
            for k in ks for b in grid}


def test_bisection_pins_a_boundary_between_neighbouring_grid_points():
    # k = 3 is 20 % cheaper per token than k = 1 below B = 11 and 20 % dearer from it on.
    rates = (0.8, 0.64, 0.512)  # tau(1) = 1.8, tau(3) = 2.952

    def ms(k, b):
        base = 10.0 + b
        return base if k == 1 else base * 2.952 / 1.8 * (0.8 if b < 11 else 1.2)

    grid, ks = list(range(1, 17)), [1, 3]
    full = _surface_reps(ms, grid, ks)
    reps: dict = {}

    def measure_batch(b):
        for k in ks:
            reps[(k, b)] = list(full[(k, b)])

    report = search_boundaries(grid, measure_batch, reps, lambda k, b: ms(k, b), [rates], 16,
                               RemeasureSettings(max_repetitions=3))
    assert {10, 11} <= set(report.batch_sizes)  # the boundary sits between measured neighbours
    assert "bisect" in report.added.values() and len(report.batch_sizes) < len(grid)


def test_tied_neighbours_are_not_bisected_and_a_run_is_verified_at_its_midpoint():
    rates = (0.8, 0.64, 0.512)

    def ms(k, b):  # k = 1 and k = 3 within 0.2 % of each other in goodput everywhere: a tie
        base = 10.0 + b
        return base if k == 1 else base * 2.952 / 1.8 * (1.0 + (0.002 if b % 2 else -0.002))

    grid, ks = list(range(1, 17)), [1, 3]
    reps = {key: v for key, v in _surface_reps(ms, grid, ks).items() if key[1] in (1, 16)}
    skipped: list = []
    want = next_batch_sizes(reps, [rates], 16, grid, RemeasureSettings(tolerance=ACCEPTED_LOSS), skipped)
    assert "bisect" not in want.values()
    # only the two ends measured: either one run to verify, or a tie between them that is not bisected
    assert want == {8: "verify"} or (skipped == [(1, 16)] and want == {})


def test_the_run_summary_names_tied_batch_sizes_within_the_accepted_loss():
    from tabletune_pipelines.core.evidence import SearchSettings, search_with_evidence
    from tabletune_pipelines.tuning.run_report import tie_lines

    rates = (0.8, 0.64, 0.512)  # tau(1) = 1.8, tau(3) = 2.952
    n, ks = 16, (1, 3)
    t1 = np.array([10.0 + b for b in range(1, n + 1)])
    # k = 3 far ahead below B = 9; from B = 9 on, k = 1 and k = 3 give the same goodput (a tie).
    t3 = np.array([t * 2.952 / 1.8 * (0.7 if b < 9 else 1.0) for b, t in enumerate(t1, start=1)])
    ms = np.vstack([t1, t3])
    var = (0.001 * ms) ** 2  # 0.1 % standard errors: the tie is resolved within 1 %
    ev = search_with_evidence(StepTimes(ks, ms, var), rates, settings=SearchSettings())
    lines = tie_lines(ev, ACCEPTED_LOSS)
    assert len(lines) == 1 and "tied within 1%" in lines[0] and "any of them serves as well" in lines[0]
    tied = [b for b, c in enumerate(ev.ties(ACCEPTED_LOSS), start=1) if c]
    assert tied and min(tied) >= 9 and "B = 1" not in lines[0].split(":", 1)[1].split(";")[0][:6]
    # With 5 % errors nothing is settled within 1 %: the same surface is undecided, not tied.
    loose = search_with_evidence(StepTimes(ks, ms, (0.05 * ms) ** 2), rates, settings=SearchSettings())
    assert any(line.startswith("  undecided (beyond 1% at 95% confidence): B = ") and "could beat the table" in line
               for line in tie_lines(loose, ACCEPTED_LOSS))


def test_the_run_summary_prices_the_other_placements_of_a_change_between_measured_batch_sizes():
    from tabletune_pipelines.core.evidence import SearchSettings, search_with_evidence
    from tabletune_pipelines.tuning.run_report import boundary_lines

    rates = (0.8, 0.64, 0.512)  # tau(1) = 1.8, tau(3) = 2.952
    n, ks = 16, (1, 3)
    t1 = np.array([10.0 + b for b in range(1, n + 1)])
    # G(3) / G(1) = 1 / 0.7 below B = 12 and 1 / 1.3 from B = 12 on: the table is k = 3 up to 11.
    t3 = np.array([t * 2.952 / 1.8 * (0.7 if b < 12 else 1.3) for b, t in enumerate(t1, start=1)])
    ev = search_with_evidence(StepTimes(ks, np.vstack([t1, t3]), (0.001 * np.vstack([t1, t3])) ** 2), rates,
                              settings=SearchSettings())
    table = ev.choice.ranges
    assert table == [[1, 11, 3], [12, 16, 1]]
    # Measured at 1, 5, 9 and 16 (the adaptive plan's coarse pass and one bisection): the change at
    # 11/12 could sit anywhere from 9/10 to 15/16. Moving it to 9/10 serves B = 10, 11 at k = 1, 0.7 of
    # k = 3 there: (14 + 2 x 0.7) / 16 = 0.9625; to 15/16 serves B = 12-15 at k = 3, 1/1.3 of k = 1
    # there: (12 + 4 / 1.3) / 16 = 0.9423 (the lowest); to 12/13: (15 + 1 / 1.3) / 16 = 0.9856 (the highest).
    lines = boundary_lines(ev, ks, table, [1, 5, 9, 16], n)
    assert len(lines) == 1
    assert "B = 10-15 (k 3 at B = 9, k 1 at B = 16; this table changes at 11/12)" in lines[0]
    assert "predict 0.942-0.986 of this table's goodput" in lines[0]
    # The change between measured neighbours (11 and 12), or every batch size measured: nothing to say.
    assert boundary_lines(ev, ks, table, [1, 5, 9, 11, 12, 16], n) == []
    assert boundary_lines(ev, ks, table, range(1, n + 1), n) == []


def test_the_budget_counts_repetitions_beyond_the_first_pass_only():
    # Every first-pass measurement takes 100 s of the clock; each extra repetition 1 s. The 10 s
    # budget must still buy extra repetitions after a first pass far longer than it.
    now = [0.0]
    rates = (0.8, 0.64, 0.512)
    rng = np.random.default_rng(1)

    def ms(k, b):  # k = 1 and k = 3 within 3 % of each other: open at 1 % with 20 % noise
        return (10.0 + b) * (1.0 if k == 1 else 2.952 / 1.8 * 1.03)

    grid, ks, reps = [1, 4, 8], [1, 3], {}  # every batch size in the first pass: nothing to add

    def measure_batch(b):
        now[0] += 100.0
        for k in ks:
            reps[(k, b)] = [ms(k, b) * (1 + 0.2 * rng.standard_normal()) for _ in range(3)]

    def measure(k, b):
        now[0] += 1.0
        return ms(k, b) * (1 + 0.2 * rng.standard_normal())

    report = search_boundaries(grid, measure_batch, reps, measure, [rates], 8,
                               RemeasureSettings(max_repetitions=9, budget_s=10.0), clock=lambda: now[0])
    assert 10 <= report.remeasure.measurements <= 12  # the 10 s budget, a round in progress finishing
    assert report.remeasure.stop_reason == "budget"


def test_added_batch_sizes_and_repetitions_share_the_budget_and_what_it_leaves_out_is_named():
    # A boundary at B = 11 (the bisection test's surface) with 15 % noise; every batch size costs
    # 50 s of the clock, every extra repetition 1 s. Unbounded, the search adds batch sizes until
    # the boundary is pinned; with 60 s it adds what 60 s buy, gives repetitions at most half of
    # what is left while batch sizes are wanted, and names the rest.
    rates = (0.8, 0.64, 0.512)

    def ms(k, b):
        base = 10.0 + b
        return base if k == 1 else base * 2.952 / 1.8 * (0.8 if b < 11 else 1.2)

    def run(budget):
        now, rng, reps = [0.0], np.random.default_rng(3), {}

        def measure_batch(b):
            now[0] += 50.0
            for k in (1, 3):
                reps[(k, b)] = [ms(k, b) * (1 + 0.15 * rng.standard_normal()) for _ in range(3)]

        def measure(k, b):
            now[0] += 1.0
            return ms(k, b) * (1 + 0.15 * rng.standard_normal())

        return search_boundaries(list(range(1, 17)), measure_batch, reps, measure, [rates], 16,
                                 RemeasureSettings(max_repetitions=9, budget_s=budget), clock=lambda: now[0])

    free, capped = run(None), run(60.0)
    assert not free.unmeasured and len(free.added) >= 3
    assert 0 < len(capped.added) < len(free.added)
    assert capped.unmeasured and set(capped.unmeasured.values()) <= {"bisect", "verify"}
    assert not set(capped.unmeasured) & set(capped.batch_sizes)
    assert capped.search_seconds == 50.0 * len(capped.added)
    assert capped.seconds <= 60.0 + 50.0 + 2.0  # one batch size or one round may cross the line
    assert capped.remeasure.measurements >= 1 and capped.remeasure.seconds <= 30.0 + 2.0


def test_a_longer_level_is_seeded_at_the_tables_boundaries_not_at_every_flip_of_the_best_point_estimate():
    # The embedded default at 32 tokens (benchmarks/data/cpu/2026-12-07-context-profile/): the best k
    # on point estimates flips between almost every pair of neighbours (leads of 0-4 % +- 1-8 %); the
    # tables the evidence rule chooses under the three decision profiles change at three places.
    from tabletune_pipelines.core.remeasure import _changes, _dense_decisions, seeded_batch_sizes, table_boundaries
    from tabletune_pipelines.formats.profile_levels import at_context

    path = DATA.parent / "cpu" / "2026-12-07-context-profile" / "local-cpu-32-64-128.one_launch.levels.json"
    level = at_context(StepTimeProfile.from_json(path.read_text()), 32)
    reps = {(c.k, c.batch_size): list(c.repetitions_ms) for c in level.cells
            if c.acceptance == "reject" and c.k is not None}
    rates = [geometric_rates(p, 3) for p in DEFAULT_DECISION_RATES]
    settings = RemeasureSettings(tolerance=ACCEPTED_LOSS)
    bounds = table_boundaries(reps, rates, 16, settings)
    flips = _changes(list(range(1, 17)), _dense_decisions(reps, rates, 16, settings))
    assert bounds == [(1, 2), (5, 6), (8, 9)] and len(flips) == 14
    tables = {tuple(tuple(r) for r in ev.ranges) for ev in _dense_decisions(reps, rates, 16, settings)}
    assert {hi for rs in tables for (_lo, hi, _k) in rs[:-1]} == {lo for lo, _ in bounds}  # each table's last B of a range
    assert seeded_batch_sizes(range(1, 17), bounds) == [1, 2, 5, 6, 8, 9, 16]

"""The controller's Prometheus series without vLLM (controller/metrics.py): the cells, the counts per
cell against an independent count, the series against the export, and a failing sink that turns
the series off while the controller serves on. The real server: test_engine_metrics.py."""

from __future__ import annotations

import logging
import random

import pytest
from prometheus_client import CollectorRegistry

from tabletune_pipelines.controller.metrics import CellCounts, Metrics, PromSink, batch_cells, table_k_per_cell
from tabletune_pipelines.controller.step import StepOutcome, count_drafts, fold
from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
from tabletune_pipelines.evaluation.synthetic import linear_profile, publish
from tabletune_pipelines.formats.live_counters import read_live_counters

PROFILE = linear_profile()
LABELS = {"model_name": "m", "engine": "0"}


def test_cells_are_power_of_two_bins_ending_at_max_num_seqs():
    assert batch_cells(16) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)]
    assert batch_cells(12) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 12)]
    assert batch_cells(1) == [(1, 1)]
    assert len(batch_cells(4096)) == 13
    assert table_k_per_cell([(1, 2, 3), (3, 10, 1), (11, 16, 2)], batch_cells(16)) == [3, 3, 1, 1, 2]
    assert table_k_per_cell([(1, 12, 1), (13, 16, 2)], [(9, 16)]) == [2]  # 4 of 8 each: the larger k
    assert table_k_per_cell([(1, 13, 1), (14, 16, 2)], [(9, 16)]) == [1]


def test_counts_per_cell_match_counting_each_cell_on_its_own():
    K, n = 3, 16
    rng = random.Random(3)
    cells = CellCounts(K, n)
    hd, ha = [0] * (K + 1), [0] * (K + 1)
    own = {c: ([0] * (K + 1), [0] * (K + 1)) for c in range(len(cells.cells))}
    totals = {c: ([0] * K, [0] * K) for c in range(len(cells.cells))}
    steps = {}
    for s in range(400):
        b = rng.choice([1, 2, 3, 5, 8, 9, 16])
        c = cells.of_b[b]
        if c != cells.cur:
            cells.move(c, hd, ha)
        ids = [f"r{i}" for i in range(b)]
        k = rng.randint(0, K)
        spec = {r: [0] * k for r in ids}
        sampled = [[1] * (1 + rng.randint(0, k)) for _ in ids]
        idx = {r: i for i, r in enumerate(ids)}
        count_drafts(spec, idx, sampled, K, hd, ha)
        count_drafts(spec, idx, sampled, K, *own[c])
        cells.steps[cells.cur][k] += 1
        steps[(c, k)] = steps.get((c, k), 0) + 1
        if s % 37 == 36:  # a take, as at rebuilds and exports
            per_cell, st = cells.take(hd, ha)
            fold(hd, ha)
            for cc, d, a in per_cell:
                for i in range(K):
                    totals[cc][0][i] += d[i]
                    totals[cc][1][i] += a[i]
            for cc, row in enumerate(st):
                for kk, x in enumerate(row):
                    steps[(cc, kk)] = steps.get((cc, kk), 0) - x
    per_cell, st = cells.take(hd, ha)
    for cc, d, a in per_cell:
        for i in range(K):
            totals[cc][0][i] += d[i]
            totals[cc][1][i] += a[i]
    for cc, row in enumerate(st):
        for kk, x in enumerate(row):
            steps[(cc, kk)] = steps.get((cc, kk), 0) - x
    for c, (d, a) in own.items():
        assert totals[c] == tuple(fold(d, a)), c
    assert all(v == 0 for v in steps.values())


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    out = 0.0
    for fam in reg.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out += s.value
    return out


def test_the_series_agree_with_the_export_to_the_token(tmp_path):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3), allowed_k=[0, 1, 2, 3],
                controller={"rebuild_every_steps": 20, "export_every_steps": 1, "exploration_every_steps": 10,
                            "prior_weight": 10, "min_prior_weight": 1})
    clock = [1000.0]
    reg = CollectorRegistry()
    cells = CellCounts(3, 16)
    log = logging.getLogger("tabletune.tests.metrics")
    c = fake_controller(p, clock, metrics=Metrics(cells, PromSink(LABELS, cells, registry=reg, log=log), log))
    eng = FakeEngine(c, (0.3, 0.1, 0.05), lambda b, k: PROFILE[k][b], seed=1, clock=clock)
    for b in (1, 2, 7, 12, 16, 3):
        eng.run(60, b)
    assert c.steps % 20 == 0  # the last step's rebuild exported: every step counted is in a window
    ws = read_live_counters(tmp_path / "pub.live.jsonl").windows
    steps = sum(w.steps for w in ws)
    assert steps == c.steps == sample(reg, "tabletune_steps_total")
    for i in range(3):
        assert sample(reg, "tabletune_drafted_tokens_total", position=str(i + 1)) == sum(w.drafted_per_pos[i] for w in ws)
        assert sample(reg, "tabletune_accepted_tokens_total", position=str(i + 1)) == sum(w.accepted_per_pos[i] for w in ws)
    # per cell: B = 7 ran in cell 5-8 only, so its 60 steps are there
    assert sample(reg, "tabletune_steps_total", batch="5-8") == 60
    assert sample(reg, "tabletune_steps_total", batch="9-16") == 120
    last = ws[-1].controller
    assert sample(reg, "tabletune_table_version") == ws[-1].table_version
    assert sample(reg, "tabletune_switches_total", reason="evidence") == last["switches"] > 0
    assert sample(reg, "tabletune_rebuilds_total") == last["rebuilds"] + last["skipped_rebuilds"]
    assert sample(reg, "tabletune_rebuilds_total", outcome="skipped") == last["skipped_rebuilds"]
    assert sample(reg, "tabletune_rebuilds_total", outcome="changed") == last["table_changes"]
    assert sample(reg, "tabletune_exploration_steps_total") == last["exploration_steps"] > 0
    assert sample(reg, "tabletune_table_source", source="corrected") == 1  # truth (0.3, 0.1, 0.05) moved the table
    assert sample(reg, "tabletune_step_seconds") > 0 and sample(reg, "tabletune_profile_step_seconds") > 0
    # k per cell is the table in force
    ks = table_k_per_cell(c.ranges, cells.cells)
    for lab, k in zip(cells.labels, ks):
        assert sample(reg, "tabletune_k", batch=lab, context="all") == k


def test_a_failing_sink_turns_the_series_off_and_serving_goes_on(tmp_path, caplog):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3),
                controller={"rebuild_every_steps": 10, "export_every_steps": 1})
    clock = [1000.0]
    reg = CollectorRegistry()
    cells = CellCounts(3, 16)
    log = logging.getLogger("tabletune.tests.metrics.fail")
    sink = PromSink(LABELS, cells, registry=reg, log=log)

    def broken(*a, **k):
        raise RuntimeError("disk full")

    sink.counts = broken  # type: ignore[method-assign]
    m = Metrics(cells, sink, log)
    c = fake_controller(p, clock, metrics=m)
    with caplog.at_level(logging.WARNING, logger="tabletune.tests.metrics.fail"):
        FakeEngine(c, (0.7, 0.5, 0.3), lambda b, k: PROFILE[k][b], seed=1, clock=clock).run(50, 4)
    assert c.errors == 0 and c.rebuilds == 5 and m.sink is None
    lines = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(lines) == 1 and "disk full" in lines[0], lines


def test_a_rollback_is_told_from_a_newer_table(tmp_path):
    clock = [1000.0]
    reg = CollectorRegistry()
    cells = CellCounts(3, 16)
    log = logging.getLogger("tabletune.tests.metrics.rb")
    p = tmp_path / "pub.json"
    publish(p, version=1, ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3), controller={"poll_every_s": 1})
    c = fake_controller(p, clock, metrics=Metrics(cells, PromSink(LABELS, cells, registry=reg, log=log), log))
    eng = FakeEngine(c, (0.7, 0.5, 0.3), lambda b, k: PROFILE[k][b], seed=1, clock=clock)
    # the launch table [[1,1,0],[2,2,1],[3,3,2],[4,16,3]] -> v1's k = 3 everywhere: 3 batch sizes
    assert sample(reg, "tabletune_switches_total", reason="published") == 3
    publish(p, version=2, ranges=[(1, 8, 1), (9, 16, 3)], rates=(0.7, 0.5, 0.3), controller={"poll_every_s": 1})
    clock[0] += 2
    eng.run(5, 4)
    assert c.start.published.version == 2
    assert sample(reg, "tabletune_switches_total", reason="published") == 3 + 8
    publish(p, version=3, ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3), controller={"poll_every_s": 1})
    clock[0] += 2
    eng.run(5, 4)
    assert c.start.published.version == 3
    assert sample(reg, "tabletune_switches_total", reason="rollback") == 8
    publish(p, version=1, ranges=[(1, 16, 2)], rates=(0.7, 0.5, 0.3), controller={"poll_every_s": 1})  # older: refused
    clock[0] += 2
    eng.run(5, 4)
    c.rebuild(clock[0])
    assert sample(reg, "tabletune_refused_files_total") == 1 and c.start.published.version == 3


def test_the_k_series_follow_the_context_axis_of_the_version_in_force(tmp_path):
    # v1 is a (batch size x context) grid: k per batch cell and context bucket; v2 is batch-only: the
    # bucket series go, one series per batch cell with context "all" stays; v3, a grid again, brings
    # its buckets back and drops "all".
    grid = [(1, 4, 1, 64, 3), (1, 4, 65, 4096, 1), (5, 16, 1, 64, 2), (5, 16, 65, 4096, 0)]
    clock = [1000.0]
    reg = CollectorRegistry()
    cells = CellCounts(3, 16)
    log = logging.getLogger("tabletune.tests.metrics.ctx")
    p = tmp_path / "pub.json"
    kw = {"rates": (0.7, 0.5, 0.3), "allowed_k": [0, 1, 2, 3], "controller": {"poll_every_s": 1}}
    publish(p, version=1, ranges=[(1, 16, 2)], context_entries=grid, **kw)
    c = fake_controller(p, clock, metrics=Metrics(cells, PromSink(LABELS, cells, registry=reg, log=log), log))
    eng = FakeEngine(c, (0.7, 0.5, 0.3), lambda b, k: PROFILE[k][b], seed=1, clock=clock)

    def k_series():
        return {(s.labels["batch"], s.labels["context"]): s.value for m in reg.collect() for s in m.samples
                if s.name == "tabletune_k"}

    assert k_series() == {("1", "1-64"): 3, ("2", "1-64"): 3, ("3-4", "1-64"): 3, ("5-8", "1-64"): 2, ("9-16", "1-64"): 2,
                          ("1", "65-4096"): 1, ("2", "65-4096"): 1, ("3-4", "65-4096"): 1, ("5-8", "65-4096"): 0,
                          ("9-16", "65-4096"): 0}
    publish(p, version=2, ranges=[(1, 8, 1), (9, 16, 3)], **kw)
    clock[0] += 2
    eng.run(5, 4)
    assert c.start.published.version == 2
    assert k_series() == {("1", "all"): 1, ("2", "all"): 1, ("3-4", "all"): 1, ("5-8", "all"): 1, ("9-16", "all"): 3}
    publish(p, version=3, ranges=[(1, 16, 2)], context_entries=grid, **kw)
    clock[0] += 2
    eng.run(5, 4)
    assert c.start.published.version == 3
    assert {ctx for _, ctx in k_series()} == {"1-64", "65-4096"} and len(k_series()) == 10

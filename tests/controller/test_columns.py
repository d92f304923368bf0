"""The controller correcting a (batch size x context) table column by column, without vLLM: each
context bucket's column starts from its own step times and rates, counts only its own steps' drafts
and step times, and changes k only on its own evidence; a grid without columns, and a batch-only
file, are served as before.

The grid of ``test_context`` (max_num_seqs 16, K = 3): batch sizes 1-4 and 5-16 by context buckets
1-64, 65-256 and 257-4096, k = [[3, 2, 1], [2, 1, 0]]. Step times T(B, k) = 4 + 0.6 k + B (0.1 + 0.1 k)
ms (``linear_profile``) in every column.
"""

from __future__ import annotations

import pytest

from tabletune_pipelines.controller.step import StepOutcome
from tabletune_pipelines.evaluation.simulator import fake_controller
from tabletune_pipelines.evaluation.synthetic import linear_profile, publish
from tabletune_pipelines.formats.context_columns import ContextColumn

from .test_context import COL0, COL1, COL2, GRID

BUCKETS = [(1, 64), (65, 256), (257, 4096)]
RATES = (0.7, 0.5, 0.3)
PROFILE = linear_profile(16, 3)
#: Few prior drafts and a rebuild every 10 steps: a column's evidence turns within a few hundred steps.
FAST = {"rebuild_every_steps": 10, "prior_weight": 20.0, "min_prior_weight": 1.0, "hysteresis": 0}


def columns(rates=RATES):
    return [ContextColumn(ctx=b, level=lv, step_ms=PROFILE, acceptance_rates=tuple(rates), pooled=False).to_dict()
            for b, lv in zip(BUCKETS, (32, 128, 1024), strict=True)]


@pytest.fixture
def clock():
    return [1000.0]


def controller(tmp_path, clock, *, cols=True, controller=None):
    p = publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 2)], rates=RATES, allowed_k=[0, 1, 2, 3],
                context_entries=GRID, context_columns=columns() if cols else None,
                controller={**FAST, **(controller or {})})
    return fake_controller(p, clock)


def step(c, clock, lengths, kept):
    """One step of ``len(lengths)`` requests at the k the controller hands out for them, each
    request keeping ``kept`` of its drafts (capped at k); its interval the profile's own step time."""
    b = len(lengths)
    k = c.next_lookup(lengths)[b]
    ids = [str(i) for i in range(b)]
    spec = {r: [0] * k for r in ids} if k else {}
    sampled = [[1] * (1 + min(kept, k)) for _ in ids]
    clock[0] += PROFILE[k][b] / 1000.0
    c.on_step(StepOutcome({r: 1 for r in ids}, spec, {r: i for i, r in enumerate(ids)}, sampled, k, 0, b + b * k,
                          clock[0], c.grid.column))
    return k


def test_a_grid_with_columns_is_controlled_column_by_column(tmp_path, clock):
    c = controller(tmp_path, clock)
    assert c.controlling and c.exploration is not None and c.grid.cols is not None
    assert [col.bucket for col in c.grid.cols.columns] == BUCKETS
    assert [c.next_lookup(lengths) for lengths in ([20], [100], [2000])] == [COL0, COL1, COL2]
    assert [list(map(list, col.table.ranges)) for col in c.grid.cols.columns] == [[[1, 4, 3], [5, 16, 2]],
                                                                              [[1, 4, 2], [5, 16, 1]],
                                                                              [[1, 4, 1], [5, 16, 0]]]
    st = c.state()
    assert st["context_table"] == [list(e) for e in GRID] and [x["ctx"] for x in st["columns"]] == [[1, 64], [65, 256],
                                                                                                    [257, 4096]]


def test_the_drafts_and_step_times_of_a_step_go_to_its_own_column(tmp_path, clock):
    c = controller(tmp_path, clock, controller={"rebuild_every_steps": 100_000})
    for _ in range(3):  # B = 2: bucket 1-64 at k = 3 keeps every draft, bucket 65-256 at k = 2 keeps none
        step(c, clock, [20, 30], kept=3)
        step(c, clock, [100, 120], kept=0)
    for _ in range(4):  # clean decode steps in bucket 65-256 only (same B and k as the step before)
        step(c, clock, [100, 120], kept=0)
    c.rebuild(clock[0])
    short, mid, long = (col.evidence for col in c.grid.cols.columns)
    # drafted per position: request-steps that drafted >= i; bucket 1-64: 3 steps x 2 requests at k = 3
    assert list(short.estimator.drafted) == [6, 6, 6] and list(short.estimator.accepted) == [6, 6, 6]
    assert list(mid.estimator.drafted) == [14, 14, 0] and list(mid.estimator.accepted) == [0, 0, 0]
    assert list(long.estimator.drafted) == [0, 0, 0]
    # the pooled counts hold both
    assert list(c.evidence.estimator.drafted) == [20, 20, 6] and list(c.evidence.estimator.accepted) == [6, 6, 6]
    # step times: clean steps at (k = 2, B = 2) seen in bucket 65-256's model only
    row = mid.model.ks.index(2)
    assert mid.model.all_count[row, 1] >= 4 and short.model.all_count[mid.model.ks.index(2), 1] == 0


def test_a_bucket_whose_drafts_are_rejected_lowers_its_own_k_and_no_other(tmp_path, clock):
    c = controller(tmp_path, clock)
    served = [step(c, clock, [100, 120], kept=0) for _ in range(400)]
    # every draft rejected: tau(k) = 1 at every k, so k = 0, the cheapest step, wins at B = 2 in 65-256
    assert served[0] == 2 and served[-1] == 0
    mid = dict((b, k) for lo, hi, k in c.grid.cols.columns[1].table.ranges for b in range(lo, hi + 1))
    assert mid[2] == 0
    # the other buckets saw no step: their tables are what a controller that served nothing makes of
    # the same file after as many rebuilds (their own prior evidence may revise the published grid)
    idle = controller(tmp_path / "idle", clock)
    for _ in range(c.rebuilds):
        idle.rebuild(clock[0])
    assert [col.table.ranges for col in c.grid.cols.columns] != [col.table.ranges for col in idle.grid.cols.columns]
    for j in (0, 2):
        assert c.grid.cols.columns[j].table.ranges == idle.grid.cols.columns[j].table.ranges
    assert c.grid.cols.columns[1].table.ranges != idle.grid.cols.columns[1].table.ranges
    assert c.state()["columns"][1]["switches"] > idle.state()["columns"][1]["switches"]


def test_a_grid_without_columns_is_served_as_published(tmp_path, clock, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="tabletune.controller"):
        c = controller(tmp_path, clock, cols=False)
    assert not c.controlling and c.grid.cols is None
    served = [step(c, clock, [100, 120], kept=0) for _ in range(100)]
    assert set(served) == {2} and c.next_lookup([100, 120]) == COL1
    assert "carries no context_columns" in caplog.text and "served as published, without correction" in caplog.text


def test_a_column_lacking_a_k_leaves_the_grid_served_as_published(tmp_path, clock):
    cols = columns()
    cols[2]["step_ms"] = {k: v for k, v in cols[2]["step_ms"].items() if k != "0"}
    p = publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 2)], rates=RATES, allowed_k=[0, 1, 2, 3],
                context_entries=GRID, context_columns=cols, controller=FAST)
    c = fake_controller(p, clock)
    assert c.grid.cols is None and not c.controlling and c.next_lookup([2000]) == COL2
    assert any("context bucket [257, 4096]: its step-time profile has no k = 0" in n for n in c.start.notes)


def test_exploration_runs_every_k_and_its_steps_go_to_their_own_bucket(tmp_path, clock):
    c = controller(tmp_path, clock, controller={"exploration_every_steps": 5, "rebuild_every_steps": 100_000})
    # bucket 65-256 serves k = 2 at B = 2; the runs every 5 steps go to K = 3 and then each other k
    ks = {step(c, clock, [100, 120], kept=0) for _ in range(200)}
    assert ks == {0, 1, 2, 3} and c.counters.exploration_steps > 0
    c.grid.cols.take_counts()  # step times to each column (a search would drop those of a k its table left)
    short, mid = c.grid.cols.columns[0].evidence.model, c.grid.cols.columns[1].evidence.model
    assert all(mid.all_count[mid.ks.index(k), 1] > 0 for k in (0, 1, 2, 3)) and short.all_count.sum() == 0


def test_a_rebuild_over_its_budget_leaves_no_column_unsearched(tmp_path, clock):
    """A budget too tight for a whole grid: each search takes one column and the next search starts
    at the column the last one stopped at, so the buckets are searched in turn (0, 1, 2, 0, ...)
    instead of the first bucket every time; a search within its budget takes all, from that point."""
    c = controller(tmp_path, clock)
    cols, v = c.grid.cols, c.version
    order = []
    for _ in range(4):
        out, done = cols.search(v.settings, v.allowed_k, cols.n, 0, over=lambda: True)
        assert not done and len(out) == 1
        order.append(out[0][0])
    assert order == [0, 1, 2, 0]
    out, done = cols.search(v.settings, v.allowed_k, cols.n, 0, over=lambda: False)
    assert done and [i for i, _ in out] == [1, 2, 0]
    out, done = cols.search(v.settings, v.allowed_k, cols.n, 0, over=lambda: False)
    assert done and [i for i, _ in out] == [0, 1, 2]


def test_the_metrics_say_corrected_once_a_column_leaves_the_published_grid(tmp_path, clock):
    import logging

    from prometheus_client import CollectorRegistry

    from tabletune_pipelines.controller.metrics import CellCounts, Metrics, PromSink
    from tests.controller.test_metrics import LABELS, sample

    reg, cells, log = CollectorRegistry(), CellCounts(3, 16), logging.getLogger("tabletune.tests.columns")
    p = publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 2)], rates=RATES, allowed_k=[0, 1, 2, 3],
                context_entries=GRID, context_columns=columns(), controller={**FAST, "export_every_steps": 1})
    c = fake_controller(p, clock, metrics=Metrics(cells, PromSink(LABELS, cells, registry=reg, log=log), log))
    step(c, clock, [100, 120], kept=0)
    c.export(clock[0], force=True)  # no rebuild yet: every column is the published grid's
    assert sample(reg, "tabletune_table_source", source="published") == 1
    for _ in range(400):  # bucket 65-256 rejects every draft: its column moves to k = 0 at B = 2
        step(c, clock, [100, 120], kept=0)
    c.rebuild(clock[0])
    assert c.grid.cols.columns[1].table.ranges != ((1, 4, 2), (5, 16, 1))
    assert sample(reg, "tabletune_table_source", source="corrected") == 1
    assert sample(reg, "tabletune_table_source", source="published") == 0

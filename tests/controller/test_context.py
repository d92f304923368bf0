"""The controller serving a (batch size x context) table, without vLLM: worked numbers for the
column a step's context picks, the lookup of each column, the counts per cell, a k = 0 cell, the
launch check over the grid's k, and an old 3-item file served as before.

The grid (max_num_seqs 16, K = 3): batch sizes 1-4 and 5-16 by context buckets 1-64, 65-256 and
257-4096, k = [[3, 2, 1], [2, 1, 0]].
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tabletune_pipelines.controller.metrics import CellCounts, Metrics
from tabletune_pipelines.controller.search import lookups_of
from tabletune_pipelines.controller.step import StepOutcome, running_context
from tabletune_pipelines.evaluation.simulator import fake_controller
from tabletune_pipelines.evaluation.synthetic import ENGINE, publish

GRID = [(1, 4, 1, 64, 3), (1, 4, 65, 256, 2), (1, 4, 257, 4096, 1),
        (5, 16, 1, 64, 2), (5, 16, 65, 256, 1), (5, 16, 257, 4096, 0)]
COL0 = [0, 3, 3, 3, 3] + [2] * 12
COL1 = [0, 2, 2, 2, 2] + [1] * 12
COL2 = [0, 1, 1, 1, 1] + [0] * 12


@pytest.fixture
def clock():
    return [1000.0]


def grid_controller(tmp_path, clock, *, ctx_agg=None, metrics=True, **kw):
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 2)], rates=(0.7, 0.5, 0.3), allowed_k=[0, 1, 2, 3],
                context_entries=GRID, ctx_agg=ctx_agg, **kw)
    m = Metrics(CellCounts(3, 16), None, logging.getLogger("test")) if metrics else None
    return fake_controller(p, clock, metrics=m)


def test_each_column_is_the_dense_lookup_of_its_bucket(tmp_path, clock):
    c = grid_controller(tmp_path, clock)
    assert c.grid.lookups is not None and c.grid.lookups.agg == "mean"
    assert list(c.grid.lookups.columns) == [COL0, COL1, COL2]
    assert c.state()["context_entries"] == [list(e) for e in GRID] and c.state()["context_served"]


@pytest.mark.parametrize("agg,lengths,column", [
    ("mean", [10, 20, 30], 0),        # mean 20 -> bucket 1-64
    ("mean", [64, 65], 1),            # mean 64.5 rounds to 65 -> bucket 65-256
    ("mean", [100, 200], 1),          # 150
    ("mean", [100, 1000], 2),         # 550 -> 257-4096
    ("mean", [9000], 2),              # past the last bucket: the last one
    ("mean", [], 0),                  # no running request: the first bucket
    ("mean", [10, 10, 300], 1),       # 106.67 -> 107
    ("median", [10, 10, 300], 0),     # 10
    ("max", [10, 10, 300], 2),        # 300
])
def test_the_column_of_a_step_is_the_bucket_of_its_aggregate_context(tmp_path, clock, agg, lengths, column):
    c = grid_controller(tmp_path, clock, ctx_agg=None if agg == "mean" else agg)
    assert c.next_lookup(lengths) == [COL0, COL1, COL2][column] and c.grid.column == column


def test_drafted_kept_and_steps_are_counted_per_cell(tmp_path, clock):
    c = grid_controller(tmp_path, clock)
    cells = c.metrics.cells
    assert cells.ctx_labels == ["1-64", "65-256", "257-4096"] and cells.ncol == 3
    ids = ["a", "b"]
    # two steps at B = 2 in bucket 65-256 (k = 2): a keeps 2 of 2, b keeps 0 of 2; then a kept 1 of 2
    for sampled in ([[1, 2, 3], [1]], [[1, 2], [1, 2, 3]]):
        clock[0] += 0.01
        c.next_lookup([100, 120])
        c.on_step(StepOutcome({r: 1 for r in ids}, {r: [0, 0] for r in ids}, {"a": 0, "b": 1}, sampled, 2, 0, 6,
                              clock[0], c.grid.column))
    # one step at B = 6 in bucket 257-4096 (k = 0): nothing drafted
    clock[0] += 0.01
    c.next_lookup([300] * 6)
    c.on_step(StepOutcome({str(i): 1 for i in range(6)}, {}, {str(i): i for i in range(6)}, [[1]] * 6, 0, 0, 6,
                          clock[0], c.grid.column))
    per_cell, steps = cells.take(c.evidence.hist_d, c.evidence.hist_a)
    b2 = cells.of_b[2] * 3 + 1  # batch bin "2", bucket 65-256
    b6 = cells.of_b[6] * 3 + 2  # batch bin "5-8", bucket 257-4096
    assert cells.label(b2) == ("2", "65-256") and cells.label(b6) == ("5-8", "257-4096")
    # drafted per position (4 request-steps drafted 2), kept per position: a 2, b 0, a 1, b 2 -> >=1: 3, >=2: 2
    assert per_cell == [(b2, [4, 4, 0], [3, 2, 0])]
    assert steps[b2][2] == 2 and steps[b6][0] == 1 and sum(map(sum, steps)) == 3


def test_a_k0_cell_is_served_as_k0_not_as_speculation_off(tmp_path, clock):
    c = grid_controller(tmp_path, clock)
    lookup = c.next_lookup([300] * 6)
    # B = 5..16 at a long context runs k = 0: the speculative machinery stays on (a lookup, not None),
    # and B = 1..4 keeps drafting in the same column.
    assert lookup is not None and lookup[6] == 0 and lookup[16] == 0 and lookup[4] == 1


def test_the_launch_table_must_list_every_k_of_the_grid(tmp_path, clock, caplog):
    from dataclasses import replace

    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 2)], rates=(0.7, 0.5, 0.3), allowed_k=[0, 1, 2, 3],
                context_entries=GRID)
    eng = replace(ENGINE, launch_ranges=((1, 4, 1), (5, 16, 2)))
    with caplog.at_level(logging.WARNING, logger="tabletune.controller"):
        c = fake_controller(p, clock, engine=eng)
    assert c.grid.lookups is None and "uses k = [0, 3], which the launch table [[1, 4, 1], [5, 16, 2]]" in c.fallback_reason


def test_a_three_item_file_is_served_as_before(tmp_path, clock):
    p = publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 1)], rates=(0.7, 0.5, 0.3), allowed_k=[0, 1, 2, 3],
                controller={"mode": "observe"})
    c = fake_controller(p, clock)
    expected, _ = lookups_of(((1, 4, 3), (5, 16, 1)), 16, (0, 1, 2, 3), 0, applying=True, controlling=False)
    assert c.grid.lookups is None and c.next_lookup() == expected == c.next_lookup([5000, 9000]) and c.grid.column == 0
    assert "context_entries" not in c.state()


def test_a_grid_version_serves_the_grid_and_leaves_the_correction_off(tmp_path, clock):
    c = grid_controller(tmp_path, clock, controller={"rebuild_every_steps": 1})
    assert c.applying and not c.controlling and c.exploration is None
    for _ in range(5):  # rebuilds run (counts folded, exported) but never change what is served
        clock[0] += 0.01
        c.next_lookup([20, 30])
        c.on_step(StepOutcome({"a": 1, "b": 1}, {"a": [0, 0, 0], "b": [0, 0, 0]}, {"a": 0, "b": 1}, [[1], [1]], 3, 0,
                              8, clock[0], c.grid.column))
    assert c.rebuilds >= 4 and c.next_lookup([20, 30]) == COL0 and c.next_lookup([2000]) == COL2


def test_running_context_reads_each_running_requests_kv_length():
    sched = SimpleNamespace(running=[SimpleNamespace(num_computed_tokens=n, num_tokens=n + 1) for n in (17, 40, 99)])
    assert running_context(sched) == [17, 40, 99]

"""A served comparison at two context levels (benchmarks/context_served.py): the step-log check of a
(batch size x context) table's windows (``tuning.served_windows.table_mismatches``: each step's k
against the cell of its batch size and context column) and which pairs are A/A at a load and context
(``evaluation.served.same_k_reached``). Pure logic, worked numbers."""

from __future__ import annotations

import pytest

from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.evaluation.served import same_k_reached
from tabletune_pipelines.tuning import served_windows

GRID = [[1, 4, 1, 64, 3], [1, 4, 65, 512, 1], [5, 8, 1, 64, 2], [5, 8, 65, 512, 0]]


class FakeServer:
    """Replays a step log; records the tables it was asked to run."""

    def __init__(self, steps):
        self.steps, self.tables = steps, []

    def set_k(self, *, table):
        self.tables.append(table)

    def step_log_offset(self):
        return 0

    def read_steps(self, since=None, until=None, offset=0):
        return self.steps


def test_each_step_is_checked_against_the_cell_of_its_batch_size_and_context():
    steps = [{"b": 2, "k": 3, "a": 1, "dt": 10.0, "x": 35},    # B 1-4, ctx 1-64: 3
             {"b": 2, "k": 1, "a": 0, "dt": 10.0, "x": 115},   # B 1-4, ctx 65-512: 1
             {"b": 6, "k": 0, "a": 0, "dt": 10.0, "x": 300},   # B 5-8, ctx 65-512: 0
             {"b": 12, "k": 2, "a": 2, "dt": 10.0, "x": 64},   # B past 8 is B 8's row; ctx 64: 2
             {"b": 6, "k": 2, "a": 0, "dt": 10.0, "x": 900}]   # ctx past 512 is the last column: 0, ran 2
    assert served_windows.table_mismatches(steps, GRID, 8, 3) == [[6, 2, 0, 0, 900]]
    w = served_windows.measure_window(FakeServer(steps), "grid", GRID, load=8, round_=0, window_s=0.0,
                                      settle_s=0.0, max_num_seqs=8, max_k=3)
    assert w.mismatched_steps == 1 and w.table_verified  # one step of slack for the swap
    assert w.kept_tokens == 2 + 1 + 2 + 6 + 12 + 2 + 6 and w.steps == 5


def test_a_step_without_its_context_did_not_run_the_columns():
    # the previous table's steps (no "x") cannot verify a grid's window, even at the k of a column
    steps = [{"b": 3, "k": 3, "a": 0, "dt": 5.0}] * 2 + [{"b": 3, "k": 3, "a": 0, "dt": 5.0, "x": 20}]
    w = served_windows.measure_window(FakeServer(steps), "grid", GRID, load=4, round_=0, window_s=0.0,
                                      settle_s=0.0, max_num_seqs=8, max_k=3)
    assert w.mismatch_examples == [[3, 3, None, 0, None]] * 2 and not w.table_verified
    # a batch-only table ignores "x"
    assert served_windows.table_mismatches([{"b": 3, "k": 1, "x": 700}], [[1, 8, 1]], 8, 3) == []


def test_a_fixed_k_of_five_item_entries_is_its_k():
    assert served_windows.fixed_k_of([[1, 8, 1, 64, 2], [1, 8, 65, 512, 2]]) == 2
    assert served_windows.fixed_k_of(GRID) is None


SHORT_LONG = [[1, 16, 1, 256, 3], [1, 16, 257, 2048, 1]]
"""k = 3 at contexts 1-256, 1 from 257 (the buckets of levels 64 and 1024 up to 2048)."""


@pytest.mark.parametrize("a, b, load, context, same", [
    (SHORT_LONG, [[1, 16, 3]], 4, (64, 192), True),       # the short level reaches only the first column
    (SHORT_LONG, [[1, 16, 3]], 4, (1024, 1152), False),   # the long level: 1 against 3
    (SHORT_LONG, [[1, 16, 3]], 4, (200, 300), False),     # a level that straddles the edge at 256
    (SHORT_LONG, [[1, 16, 1]], 8, (1024, 1152), True),    # the grid's long column is fixed k = 1
    ([[1, 4, 3], [5, 16, 1]], [[1, 16, 3]], 4, (64, 192), True),   # load 4 never reaches B 5
    ([[1, 4, 3], [5, 16, 1]], [[1, 16, 3]], 8, (64, 192), False),
    ([[1, 4, 3], [5, 16, 1]], [[1, 16, 3]], 40, (64, 192), False),  # B stops at max_num_seqs 16
    (SHORT_LONG, [[1, 16, 1, 512, 3], [1, 16, 513, 2048, 1]], 8, (64, 192), True),   # other edges, same k there
    (SHORT_LONG, [[1, 16, 1, 512, 3], [1, 16, 513, 2048, 1]], 8, (300, 428), False),
])
def test_a_pair_is_aa_where_it_runs_the_same_k_in_every_cell_reached(a, b, load, context, same):
    assert same_k_reached(a, b, load=load, max_num_seqs=16, max_k=3, context=context) is same
    assert same_k_reached(b, a, load=load, max_num_seqs=16, max_k=3, context=context) is same


def test_k_capped_at_the_launch_counts_as_served():
    # k = 5 is served as the launch's K = 3: the same k as a fixed 3
    assert same_k_reached([[1, 16, 5]], [[1, 16, 3]], load=8, max_num_seqs=16, max_k=3, context=(64, 64))


def test_a_context_range_must_be_positive_and_ordered():
    with pytest.raises(InvalidValueError, match=r"context \[0, 5\] must be 1 <= lo <= hi"):
        same_k_reached([[1, 16, 3]], [[1, 16, 3]], load=8, max_num_seqs=16, max_k=3, context=(0, 5))

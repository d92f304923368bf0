"""The closed-loop window check of benchmarks/_closed_loop.py (used for the GPU goodput runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_closed_loop.py"
_spec = importlib.util.spec_from_file_location("_closed_loop", _PATH)
closed_loop = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("_closed_loop", closed_loop)  # dataclasses look their module up
_spec.loader.exec_module(closed_loop)


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


def test_window_counts_kept_tokens_and_checks_k_at_the_range_edges():
    # docs-like table on max_num_seqs 128: k = 3 up to 64, k = 1 from 65; steps exactly at both
    # edges and at 128 must all verify (the first GPU run indexed the lookup off by one).
    table = [[1, 64, 3], [65, 128, 1]]
    steps = [{"b": 64, "k": 3, "a": 10, "dt": 20.0}, {"b": 65, "k": 1, "a": 5, "dt": 20.0},
             {"b": 128, "k": 1, "a": 7, "dt": 20.0}, {"b": 0, "k": 0, "a": 0, "dt": 1.0}]
    w = closed_loop.measure_window(FakeServer(steps), "docs", table, load=128, round_=0, window_s=0.0,
                                   settle_s=0.0, max_num_seqs=128, max_k=3)
    assert w.mismatched_steps == 0 and w.table_verified
    assert w.kept_tokens == 64 + 10 + 65 + 5 + 128 + 7 and w.steps == 3
    assert abs(w.seconds - 0.060) < 1e-12


def test_window_that_ran_another_table_fails_the_check():
    steps = [{"b": 8, "k": 3, "a": 0, "dt": 5.0}] * 3
    w = closed_loop.measure_window(FakeServer(steps), "k1", [[1, 16, 1]], load=8, round_=0, window_s=0.0,
                                   settle_s=0.0, max_num_seqs=16, max_k=3)
    assert w.mismatched_steps == 3 and not w.table_verified


def test_rotation_and_paired_ratio():
    assert closed_loop.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    W = closed_loop.Window
    ws = [W("a", 1, r, kept, 1.0, 10, 1.0, 0) for r, kept in ((0, 110), (1, 90))] + \
         [W("b", 1, r, 100, 1.0, 10, 1.0, 0) for r in (0, 1)]
    ratio, se, n = closed_loop.paired_ratio(ws, "a", "b", 1)
    assert n == 2 and abs(ratio - 1.0) < 1e-12 and abs(se - 0.1) < 1e-12

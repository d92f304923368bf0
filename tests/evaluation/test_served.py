"""Served verification (tuning/served_*.py): the window check, the paired statistics and the verdict
with worked numbers, the budget plan, the result's published section; the harness's envelope comparison
(evaluation/served.py). Pure logic, no engine."""

from __future__ import annotations

import dataclasses
import math
import statistics
import subprocess
import sys

import time

import pytest

from tabletune_pipelines.errors import InvalidValueError, PublishedTableError
from tabletune_pipelines.evaluation import served as harness
from tabletune_pipelines.tuning import served_load, served_plan, served_verdict, served_verification, served_windows
from tabletune_pipelines.core.stats import t_quantile
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions, default_loads, plan_verification
from tabletune_pipelines.tuning.served_verdict import judge, judge_load
from tabletune_pipelines.tuning.served_windows import Window, policy_ratio
from tabletune_pipelines.formats.published import parse_published


class FakeServer:
    """Replays a step log; records the tables it was asked to run."""

    device = "cpu"

    def __init__(self, steps):
        self.steps, self.tables = steps, []

    def set_k(self, *, table):
        self.tables.append(table)

    def step_log_offset(self):
        return 0

    def read_steps(self, since=None, until=None, offset=0):
        return self.steps


# -- the window and its step-log check ---------------------------------------------------------

def test_window_counts_kept_tokens_and_checks_k_at_the_range_edges():
    # docs-like table on max_num_seqs 128: k = 3 up to 64, k = 1 from 65; steps exactly at both
    # edges and at 128 must all verify (the first GPU run indexed the lookup off by one).
    table = [[1, 64, 3], [65, 128, 1]]
    steps = [{"b": 64, "k": 3, "a": 10, "dt": 20.0}, {"b": 65, "k": 1, "a": 5, "dt": 20.0},
             {"b": 128, "k": 1, "a": 7, "dt": 20.0}, {"b": 0, "k": 0, "a": 0, "dt": 1.0}]
    w = served_windows.measure_window(FakeServer(steps), "docs", table, load=128, round_=0, window_s=0.0,
                              settle_s=0.0, max_num_seqs=128, max_k=3)
    assert w.mismatched_steps == 0 and w.table_verified
    assert w.kept_tokens == 64 + 10 + 65 + 5 + 128 + 7 and w.steps == 3
    assert abs(w.seconds - 0.060) < 1e-12
    assert abs(w.goodput - (64 + 10 + 65 + 5 + 128 + 7) / 0.060) < 1e-9


def test_window_that_ran_another_table_fails_the_check():
    steps = [{"b": 8, "k": 3, "a": 0, "dt": 5.0}] * 3
    w = served_windows.measure_window(FakeServer(steps), "k1", [[1, 16, 1]], load=8, round_=0, window_s=0.0,
                              settle_s=0.0, max_num_seqs=16, max_k=3)
    assert w.mismatched_steps == 3 and not w.table_verified
    assert w.mismatch_examples[0] == [8, 3, 1, 0]


def test_one_step_of_slack_for_the_swap():
    steps = [{"b": 8, "k": 3, "a": 0, "dt": 5.0}] + [{"b": 8, "k": 1, "a": 0, "dt": 5.0}] * 5
    w = served_windows.measure_window(FakeServer(steps), "k1", [[1, 16, 1]], load=8, round_=0, window_s=0.0,
                              settle_s=0.0, max_num_seqs=16, max_k=3)
    assert w.mismatched_steps == 1 and w.table_verified


def test_a_window_of_a_slow_engine_waits_for_min_steps_up_to_its_limit():
    class Growing(FakeServer):
        def __init__(self):
            super().__init__([])
            self.calls = 0

        def read_steps(self, since=None, until=None, offset=0):
            self.calls += 1
            return [{"b": 4, "k": 1, "a": 1, "dt": 50.0}] * (3 if self.calls == 1 else 25)

    steps, w = served_windows.counted_window(Growing(), "k1", load=4, round_=0, window_s=0.01, min_steps=20)
    assert len(steps) == 25 and w.steps == 25 and w.kept_tokens == 25 * 5 and abs(w.seconds - 1.25) < 1e-12
    assert 0.0 < w.t_start < w.t_end  # the span the window read, on the step log's clock
    steps, w = served_windows.counted_window(Growing(), "k1", load=4, round_=0, window_s=0.01, min_steps=20,
                                     max_window_s=0.0)
    assert w.steps == 3  # the limit is reached: the window keeps what it has


def test_round_orders_are_balanced_for_position_and_predecessor():
    # Worked example, 4 policies: 0, 1, 3, 2 shifted by the round.
    assert served_load.rotated(["a", "b", "c", "d"], 0) == ["a", "b", "d", "c"]
    assert served_load.rotated(["a", "b", "c", "d"], 1) == ["b", "c", "a", "d"]
    assert served_load.rotated(["a", "b", "c"], 3) == ["c", "b", "a"]  # odd n: the second n rounds run backwards
    assert served_load.rotated(["a"], 5) == ["a"] and served_load.rotated([], 2) == []
    for n in range(2, 9):
        names = list(range(n))
        period = n if n % 2 == 0 else 2 * n
        rounds = [served_load.rotated(names, r) for r in range(period)]
        assert all(sorted(o) == names for o in rounds)
        for pos in range(n):  # each policy in each position equally often
            assert sorted(o[pos] for o in rounds) == sorted(names * (period // n))
        follows = {}
        for o in rounds:
            for a, b in zip(o, o[1:]):
                follows[(a, b)] = follows.get((a, b), 0) + 1
        # every ordered pair once (even n) or twice (odd n): no policy always follows the same one
        assert set(follows.values()) == {period // n} and len(follows) == n * (n - 1)
        assert served_load.rotated(names, period + 1) == served_load.rotated(names, 1)


def test_policy_ratio():
    ws = [Window("a", 1, r, kept, 1.0, 10, 1.0, 0) for r, kept in ((0, 110), (1, 90))] + \
         [Window("b", 1, r, 100, 1.0, 10, 1.0, 0) for r in (0, 1)]
    ratio, se, n = policy_ratio(ws, "a", "b", 1)
    assert n == 2 and abs(ratio - 1.0) < 1e-12 and abs(se - 0.1) < 1e-12


def test_benchmarks_have_no_copy_of_the_closed_loop():
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    assert not (bench / "_closed_loop.py").exists()
    for script in ("gpu_goodput.py", "real_engine_eval.py", "served_vs_profiled.py", "gpu_controller.py"):
        text = (bench / script).read_text()
        assert "from _closed_loop" not in text and "_closed_loop." not in text, script
        assert "tabletune_pipelines.tuning.served_load" in text, script


# -- the verdict, worked numbers ------------------------------------------------------------------

def test_t_quantiles():
    assert t_quantile(1) == 12.706 and t_quantile(2) == 4.303 and t_quantile(4) == 2.776
    assert t_quantile(11) == 2.201 and t_quantile(22) == 2.086  # 22: the next tabulated dof below (exact 2.074)
    assert t_quantile(1000) == 1.96 + 2.4 / 1000  # above 120: within 0.001 above the exact 1.962
    with pytest.raises(ValueError):
        t_quantile(0)


def test_a_loss_below_the_tolerance_with_confidence_passes():
    # ratios 0.98, 0.98, 0.98: s.e. 0, interval [0.98, 0.98] above 0.97
    v = judge_load(16, {0: 98.0, 1: 196.0, 2: 49.0}, {"k=2": {0: 100.0, 1: 200.0, 2: 50.0},
                                                      "k=0": {0: 60.0, 1: 60.0, 2: 60.0}}, tolerance=0.03)
    assert v.status == "pass" and v.best_fixed == "k=2" and v.best_fixed_k == 2
    assert abs(v.ratio - 0.98) < 1e-12 and v.ratio_se == 0.0 and v.rounds == 3
    assert abs(v.loss - 0.02) < 1e-12 and "below the tolerance" in v.reason


def test_noise_never_passes_a_table():
    # ratios 0.8, 1.0, 0.9: mean 0.9, sd 0.1, s.e. 0.0577; t(2) = 4.303 -> interval [0.652, 1.148]
    # straddles 0.97: undecided, not a pass
    v = judge_load(8, {0: 80.0, 1: 100.0, 2: 90.0}, {"k=1": {0: 100.0, 1: 100.0, 2: 100.0}}, tolerance=0.03)
    assert v.status == "inconclusive" and "undecided" in v.reason and "[0.652, 1.148]" in v.reason
    assert abs(v.ratio - 0.9) < 1e-12 and abs(v.ratio_se - 0.1 / math.sqrt(3)) < 1e-12 and v.t == 4.303
    # a table that serves more than every fixed k, but within wide noise, is not verified either
    # ratios 1.2, 0.9, 1.05: mean 1.05, s.e. 0.0866 -> lower 1.05 - 4.303 * 0.0866 = 0.677 < 0.97
    w = judge_load(8, {0: 120.0, 1: 90.0, 2: 105.0}, {"k=1": {0: 100.0, 1: 100.0, 2: 100.0}}, tolerance=0.03)
    assert w.status == "inconclusive"


def test_a_small_significant_loss_within_the_tolerance_passes():
    # ratios 0.985, 0.990, 0.995: mean 0.99, s.e. 0.00289; lower 0.99 - 4.303 * 0.00289 = 0.9776 >= 0.97
    v = judge_load(8, {0: 98.5, 1: 99.0, 2: 99.5}, {"k=1": {0: 100.0, 1: 100.0, 2: 100.0}}, tolerance=0.03)
    assert v.status == "pass"


def test_rounds_to_decide_worked_numbers():
    # sd of the per-round ratio 0.05, mean 0.99, floor 0.97: (1.96 * 0.05 / 0.02)^2 = 24.01 -> 25 rounds
    assert served_verdict.rounds_to_decide(0.05, 0.99, 0.03) == 25
    # far from the line: at least 2 rounds
    assert served_verdict.rounds_to_decide(0.01, 0.5, 0.03) == 2
    assert served_verdict.rounds_to_decide(0.05, 0.97, 0.03) is None


def test_a_large_significant_loss_fails():
    # ratios 0.70, 0.72, 0.74: mean 0.72, s.e. 0.01155; upper 0.72 + 4.303 * 0.01155 = 0.7697 < 1
    v = judge_load(16, {0: 70.0, 1: 72.0, 2: 74.0}, {"k=1": {0: 100.0, 1: 100.0, 2: 100.0},
                                                     "k=3": {0: 90.0, 1: 90.0, 2: 90.0}}, tolerance=0.03)
    assert v.status == "fail" and v.best_fixed == "k=1"
    assert abs(v.ratio - 0.72) < 1e-12 and abs(v.ratio_se - 0.02 / math.sqrt(3)) < 1e-12
    assert abs(v.loss - 0.28) < 1e-12 and "exceeds the tolerance" in v.reason
    # a loss beyond the tolerance that the interval does not separate from it is undecided, not a failure:
    # ratios 0.90, 0.96, 0.99 -> mean 0.95, s.e. 0.0265, interval [0.836, 1.064]
    u = judge_load(16, {0: 90.0, 1: 96.0, 2: 99.0}, {"k=1": {0: 100.0, 1: 100.0, 2: 100.0}}, tolerance=0.03)
    assert u.status == "inconclusive"


def test_the_best_fixed_k_is_the_highest_mean_and_pairing_is_by_round():
    # k=3 has the higher mean (105 vs 100); the candidate is paired with k=3 round by round:
    # 50/100 and 100/110 -> mean 0.7045..., not 150/210.
    v = judge_load(4, {0: 50.0, 1: 100.0}, {"k=3": {0: 100.0, 1: 110.0}, "k=2": {0: 100.0, 1: 100.0}},
                   tolerance=0.03)
    assert v.best_fixed == "k=3" and v.rounds == 2
    assert abs(v.ratio - (0.5 + 100 / 110) / 2) < 1e-12
    # two rounds: t(1) = 12.706, s.e. 0.2045 -> an interval far wider than the tolerance: undecided
    assert v.status == "inconclusive" and v.t == 12.706


def test_one_paired_round_is_inconclusive_and_does_not_fail_the_verification():
    v = judge_load(1, {0: 10.0}, {"k=0": {0: 100.0, 1: 100.0}}, tolerance=0.03)
    assert v.status == "inconclusive" and v.ratio == 0.1 and v.ratio_se is None and v.rounds == 1
    assert judge_load(1, {}, {"k=0": {0: 1.0}}, tolerance=0.03).status == "inconclusive"


def test_judge_leaves_out_windows_the_step_log_check_failed():
    ws = []
    for r in range(3):
        ws.append(Window("k=0", 8, r, 100, 1.0, 10, 8.0, 0))
        ws.append(Window("table", 8, r, 50 + r, 1.0, 10, 8.0, 0))
    ws.append(Window("k=1", 8, 0, 1000, 1.0, 10, 8.0, 5))  # ran another table: left out
    goodput, (v,) = judge(ws, [8], ["k=0", "k=1"], tolerance=0.03)
    assert v.best_fixed == "k=0" and v.status == "fail"
    g = {x.policy: x for x in goodput}
    assert g["k=1"].rounds == 0 and math.isnan(g["k=1"].goodput)
    assert g["table"].rounds == 3 and abs(g["table"].goodput - 51.0) < 1e-12 and abs(g["table"].stderr - 1 / math.sqrt(3)) < 1e-12


# -- budget plan and options ----------------------------------------------------------------------

def test_default_loads_include_max_num_seqs():
    assert default_loads(16) == (1, 8, 16) and default_loads(128) == (1, 64, 128)
    assert default_loads(2) == (1, 2) and default_loads(1) == (1,)


def test_plan_keeps_the_defaults_when_they_fit():
    p = plan_verification(4, (1, 8, 16), budget_s=1000, rounds=3, window_s=2.0, settle_s=0.5, warmup_s=2.0)
    assert (p.rounds, p.window_s, p.note) == (3, 2.0, "")
    assert abs(p.estimated_s - 3 * (2.0 + 3 * 4 * (2.0 + 0.5 + served_plan.SWAP_OVERHEAD_S))) < 1e-9


def test_plan_shortens_windows_before_it_drops_rounds_and_says_so():
    # 3 loads, 5 policies: 3 rounds of 2 s need 3 * (2 + 15 * 2.7) = 127.5 s
    p = plan_verification(5, (1, 8, 16), budget_s=90, rounds=3, window_s=2.0, settle_s=0.5, warmup_s=2.0)
    # (90 / 3 - 2) / (3 * 5) - 0.7 = 1.166 -> 1.1 s windows, 3 rounds kept
    assert p.rounds == 3 and p.window_s == 1.1 and p.estimated_s <= 90 and "3 round(s) of 1.1 s" in p.note
    p = plan_verification(5, (1, 8, 16), budget_s=60, rounds=3, window_s=2.0, settle_s=0.5, warmup_s=2.0)
    # 3 rounds would need 0.5 s windows; 2 rounds: (60 / 3 - 2) / 10 - 0.7 = 1.1 s
    assert p.rounds == 2 and p.window_s == 1.1 and p.estimated_s <= 60
    p = plan_verification(5, (1, 8, 16), budget_s=20, rounds=3, window_s=2.0, settle_s=0.5, warmup_s=2.0)
    assert p.rounds == 1 and p.window_s == served_plan.MIN_WINDOW_S and "until the budget is spent" in p.note


def test_options_from_mapping_are_strict():
    o = ServedVerificationOptions.from_mapping({"budget_s": 30, "loads": [1, 4], "enabled": False})
    assert o.budget_s == 30 and o.loads == (1, 4) and not o.enabled
    with pytest.raises(InvalidValueError, match="unknown key"):
        ServedVerificationOptions.from_mapping({"budget": 30})
    with pytest.raises(InvalidValueError, match="budget_s"):
        ServedVerificationOptions(budget_s=0)
    with pytest.raises(InvalidValueError, match="tolerance"):
        ServedVerificationOptions(tolerance=1.5)
    with pytest.raises(InvalidValueError, match="acceptance"):
        ServedVerificationOptions(acceptance="maybe")


# -- the whole verification on a scripted server --------------------------------------------------

class ScriptedServer:
    """A server whose step log follows the table in force: at load L every step runs B = L requests at
    the table's k for L, takes ms[k], and keeps ``L * (1 + kept[k])`` tokens. ``time.sleep`` is not
    patched; windows are short."""

    device = "cpu"

    def __init__(self, ms, kept, max_num_seqs, max_k):
        self.ms, self.kept, self.M, self.K = ms, kept, max_num_seqs, max_k
        self.lookup = [max_k] * max_num_seqs
        self.load = None
        self.prompts = []

    def set_k(self, *, table):
        from tabletune_pipelines.core.table import DraftTable

        self.lookup = DraftTable.from_entries([list(r) for r in table]).vllm_lookup(self.M, self.K)[1:]

    def complete(self, prompt, **kw):
        import time

        self.prompts.append(prompt)
        time.sleep(0.01)

    def step_log_offset(self):
        return 0

    def read_steps(self, since=None, until=None, offset=0):
        b = self.load
        k = self.lookup[b - 1]
        return [{"b": b, "k": k, "a": b * self.kept[k], "dt": self.ms[k]}] * 20


def _verify(server, table, loads, monkeypatch, **kw):
    real = served_load.LoadGenerator.__post_init__

    def remember(gen):
        server.load = gen.load  # the scripted step log follows the running load
        real(gen)

    monkeypatch.setattr(served_load.LoadGenerator, "__post_init__", remember)
    kw.setdefault("first_warmup_s", 0.0)
    return served_verification.verify_on_server(server, table, K=3, max_num_seqs=8, loads=loads, rounds=2, window_s=0.01,
                                               settle_s=0.0, warmup_s=0.0, budget_s=60, progress=lambda s: None, **kw)


def test_the_first_warmup_runs_every_policy_before_any_window_and_is_off_the_budget(monkeypatch):
    ms, kept = {0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 1.8}
    srv = ScriptedServer(ms, kept, 8, 3)
    swaps, reads = [], []
    set_k, read = srv.set_k, srv.read_steps
    srv.set_k = lambda *, table: (swaps.append([list(r) for r in table]), set_k(table=table))
    srv.read_steps = lambda **kw: (reads.append(len(swaps)), read(**kw))[1]
    # [[1, 6, 2], [7, 8, 1]] runs k = 2 and 1 at load 8's batch sizes (6..8): no fixed k stands for it
    res = _verify(srv, [[1, 6, 2], [7, 8, 1]], (8,), monkeypatch, first_warmup_s=0.5)
    # the first five swaps are the warm-up, one per policy (the candidate and k = 0..3), before any window
    assert sorted(map(str, swaps[:5])) == sorted(map(str, [[[1, 6, 2], [7, 8, 1]]] + [[[1, 8, k]] for k in range(4)]))
    assert min(reads) > 5
    assert res.plan.first_warmup_s == 0.5 and not res.budget_cut
    # the warm-up is not charged to the budget: a warm-up that takes 1000 s on the verification's clock
    # leaves a 60 s budget uncut and the measuring time short
    jump, real_warmup = [0.0], served_verification.first_warmup

    def slow_warmup(server, tables, seconds):
        real_warmup(server, tables, 0.0)
        jump[0] += 1000.0

    monkeypatch.setattr(served_verification, "first_warmup", slow_warmup)
    res = _verify(srv, [[1, 6, 2], [7, 8, 1]], (8,), monkeypatch, first_warmup_s=0.5,
                  clock=lambda: time.monotonic() + jump[0])
    assert jump[0] == 1000.0 and not res.budget_cut and res.elapsed_s < 60 and len(res.windows) == 10
    # none asked: the device default; 0 turns it off (no extra swaps)
    assert served_plan.DEFAULTS["gpu"].first_warmup_s == 30.0
    swaps.clear()
    _verify(srv, [[1, 6, 2], [7, 8, 1]], (8,), monkeypatch)
    assert len(swaps) == 2 * 5


def test_first_warmup_shares_its_seconds_among_the_tables():
    calls, slept = [], []

    class S:
        def set_k(self, *, table):
            calls.append(table)

    served_verification.first_warmup(S(), [[[1, 8, 0]], [[1, 8, 1]], [[1, 8, 2]], [[1, 8, 3]]], 30.0, sleep=slept.append)
    assert [t[0][2] for t in calls] == [0, 1, 2, 3] and slept == [7.5] * 4
    with pytest.raises(InvalidValueError, match="first_warmup_s"):
        ServedVerificationOptions(first_warmup_s=-1)


def test_verify_served_fails_a_table_that_loses_and_passes_one_that_does_not(monkeypatch):
    # k = 2 keeps 1.5 drafts per request at 10 ms; k = 0 keeps none at 6 ms: k = 2 is ~1.5x better.
    ms, kept = {0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 1.8}
    srv = ScriptedServer(ms, kept, 8, 3)
    bad = _verify(srv, [[1, 4, 2], [5, 8, 0]], (2, 8), monkeypatch, prompt=lambda rng: "p")
    assert not bad.passed and bad.failed_loads == [8] and bad.candidate_is is None
    (v8,) = [v for v in bad.verdicts if v.load == 8]
    # the step log is the same every round: ratio exact, s.e. 0
    assert v8.best_fixed == "k=2" and abs(v8.ratio - (1.0 / 6.0) / (2.5 / 10.0)) < 1e-9 and v8.ratio_se == 0.0
    assert "NOT verified" in bad.summary() and srv.prompts and srv.prompts[0] == "p"
    # a verdict decided after 2 rounds ends the load's rounds: no window is spent past the decision
    assert bad.verdict == "failed" and dict(bad.stop_reasons)[8] == "decided"
    assert max(w.round for w in bad.windows if w.load == 8) == 1
    good = _verify(srv, [[1, 8, 2]], (2, 8), monkeypatch)
    assert good.passed and good.candidate_is == "k=2" and all(v.status == "pass" for v in good.verdicts)
    assert good.verdict == "verified" and dict(good.stop_reasons) == {8: "decided", 2: "decided"}
    # the table is k = 2 at both loads: judged against the best other fixed k (k = 1), not itself (an
    # A/A pair, 1.000 ± 0.000, is no evidence)
    assert [(v.candidate_is, v.best_fixed) for v in good.verdicts] == [("k=2", "k=1")] * 2, good.verdicts
    # (kept tokens are whole: load 2 keeps int(2 * 0.8) = 1 draft a step at k = 1, so k = 2 serves
    # (2 + 3) / 10 ms against (2 + 1) / 8 ms; load 8: (8 + 12) / 10 ms against (8 + 6) / 8 ms)
    assert [round(v.ratio, 12) for v in good.verdicts] == [round(500 / 375, 12), round(2000 / 1750, 12)]
    # the published section is what the strict reader accepts
    doc = _published(good)
    assert parse_published(doc).served_verification["passed"] is True


def _published(result, ranges=None):
    from tabletune_pipelines.formats.published_build import published_document
    from tabletune_pipelines.formats.published_schema import PublishedVersion

    ranges = ranges or [list(r) for r in result.candidate]
    table = {"ranges": ranges, "max_num_seqs": 8, "max_k": 3, "identity_key": "id", "prior_id": "p",
             "acceptance_rates": [0.7, 0.5, 0.3]}
    head = PublishedVersion(deployment="d", version=1, table=table, speculative_config={"method": "x"},
                            published_at="2026-11-23T10:00:00Z")
    return published_document(head, served_verification=result.to_dict())


def _section():
    loads = (1, 8)
    ws = [Window(n, load, r, 100 * (2 if n == "k=2" or n == "table" else 1), 1.0, 10, 1.0, 0)
          for load in loads for r in range(3) for n in ("k=0", "k=1", "k=2", "k=3", "table")]
    goodput, verdicts = judge(ws, loads, ["k=0", "k=1", "k=2", "k=3"], tolerance=0.03)
    plan = served_plan.VerificationPlan(loads, 3, 1.5, 0.4, 1.5, 75.0, 60.0)
    return served_verdict.ServedVerification(candidate=((1, 8, 2),), max_k=3, max_num_seqs=8, plan=plan,
                                     goodput=tuple(goodput), verdicts=tuple(verdicts), tolerance=0.03,
                                     elapsed_s=55.0, budget_cut=False, candidate_is="k=2", windows=tuple(ws))


def test_published_section_round_trips_and_the_reader_is_strict():
    res = _section()
    doc = _published(res)
    sv = parse_published(doc).served_verification
    assert sv["passed"] and sv["loads"] == [1, 8] and sv["per_load"][0]["best_fixed_k"] == 2
    assert sv["per_load"][0]["goodput"]["table"] == [200.0, 0.0, 3]

    def broken(edit):
        d = _published(res)
        edit(d["served_verification"])
        with pytest.raises(PublishedTableError) as exc:
            parse_published(d, "f.json")
        return str(exc.value)

    assert "unknown key" in broken(lambda s: s.update(extra=1))
    assert "must be true or false" in broken(lambda s: s.update(passed=1))
    assert "contradicts per_load" in broken(lambda s: s.update(passed=False))
    assert "contradicts per_load" in broken(lambda s: s["per_load"][0].update(status="fail"))
    assert "must be one of" in broken(lambda s: s["per_load"][0].update(status="ok"))
    assert "is not the published table.ranges" in broken(lambda s: s.update(candidate=[[1, 8, 3]]))
    assert "above max_num_seqs" in broken(lambda s: s.update(loads=[1, 9]))
    assert "is not one of" in broken(lambda s: s["per_load"][0].update(load=4))
    assert "finite number" in broken(lambda s: s["per_load"][0].update(ratio="1"))
    assert "[goodput, s.e., windows]" in broken(lambda s: s["per_load"][0]["goodput"].update(table=[1.0]))
    assert "file name of a PNG" in broken(lambda s: s.update(plot="../x.png"))
    assert "lacks the field" in broken(lambda s: s.pop("per_load"))
    assert sv["window"] == "time" and sv["requests_per_client"] is None and sv["per_load"][0]["mean_batch"] == 1.0
    assert "window = 'hours' must be one of ['time', 'requests']" in broken(lambda s: s.update(window="hours"))
    assert "requests_per_client" in broken(lambda s: s.update(window="requests", requests_per_client=0))
    assert "mean_batch" in broken(lambda s: s["per_load"][0].update(mean_batch=-1.0))


def test_served_gate_is_blocking_and_reports_the_figures():
    from tabletune_pipelines.tuning.gates import BLOCKING_GATES, served_gate

    assert "served_goodput_verified" in BLOCKING_GATES
    res = _section()
    g = served_gate(res)
    assert g.passed and g.blocking and g.figures["loads"] == [1, 8] and g.figures["failed_loads"] == []
    assert "| load |" in g.comparison and "k=2" in g.comparison
    off = served_gate(None, disabled_reason="served verification is off")
    assert off.passed and off.description.startswith("NOT MEASURED")


def test_plot_is_a_tabletune_png():
    from tabletune_pipelines.tuning.report import _tabletune_png, served_goodput_plot

    png = served_goodput_plot(_section(), "id")
    assert _tabletune_png(png[:65536]) is None and len(png) > 5000


def test_served_module_imports_without_dagster_duckdb_pandas_matplotlib():
    code = ("import sys, tabletune_pipelines.tuning.served_verification, tabletune_pipelines.evaluation.served\n"
            "print(','.join(m for m in ('dagster', 'duckdb', 'pandas', 'matplotlib', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_step_mix_counts_arrivals_and_the_steps_above_the_ceiling():
    """Worked numbers: arrivals 0, 2, 4, 2 (mean 2, variance 2: dispersion 1); two of four steps above
    a 512-token ceiling (513 and 600 tokens), at 30 and 50 ms, the others at 10 and 20 ms. A step
    that ran no request is not a served step; a bad ceiling is refused by name."""
    steps = [{"b": 100, "new": 0, "tok": 400, "dt": 10.0}, {"b": 100, "new": 2, "tok": 513, "dt": 30.0},
             {"b": 100, "new": 4, "tok": 600, "dt": 50.0}, {"b": 100, "new": 2, "tok": 512, "dt": 20.0},
             {"b": 0, "new": 9, "tok": 9999, "dt": 1.0}]
    m = served_windows.step_mix(steps, 512)
    assert m.steps == 4 and m.arrivals_mean == 2.0 and m.arrivals_dispersion == pytest.approx(1.0)
    assert m.over_ceiling == 0.5 and m.ms_over == 40.0 and m.ms_under == 15.0
    # Regular arrivals (always 2) are under-dispersed; with no step above the ceiling its mean is nan.
    even = served_windows.step_mix([{"b": 8, "new": 2, "tok": 100, "dt": 5.0}] * 3, 512)
    assert even.arrivals_dispersion == 0.0 and even.over_ceiling == 0.0 and math.isnan(even.ms_over)
    with pytest.raises(InvalidValueError, match="ceiling = 0"):
        served_windows.step_mix(steps, 0)


def test_a_window_records_its_time_span_so_a_kept_step_log_can_be_cut_by_window():
    w = Window("fixed_k1", 8, 0, 100, 1.0, 10, 8.0, 0)
    assert (w.t_start, w.t_end) == (0.0, 0.0)  # windows judged before the span was recorded still load
    assert Window(**{**w.__dict__, "t_start": 5.0, "t_end": 9.0}).t_end == 9.0


def test_served_points_are_wall_ms_per_step_of_fixed_k_paired_by_round():
    policies = {"k1": [[1, 8, 1]], "k3": [[1, 8, 3]], "mixed": [[1, 4, 3], [5, 8, 1]]}
    ws = [Window("k1", 6, r, 100, s, 100, 5.0 + r, 0) for r, s in ((0, 2.0), (1, 2.2), (2, 2.4))] + \
         [Window("k3", 6, r, 100, s, 100, 5.0, 0) for r, s in ((0, 1.0), (1, 1.1))] + \
         [Window("mixed", 6, r, 100, 1.0, 100, 5.0, 0) for r in (0, 1)] + \
         [Window("k3", 6, 2, 100, 1.0, 100, 5.0, 9)]           # unverified (9 mismatched steps): left out
    pts = {p.k: p for p in served_windows.served_points(ws, policies)}
    assert set(pts) == {1, 3}                                   # the two-range table is not a fixed k
    assert pts[1].ms == pytest.approx(22.0) and pts[1].se_ms == pytest.approx(2.0 / 3 ** 0.5)
    assert pts[1].batch == pytest.approx(6.0) and pts[1].rounds == 3 and pts[1].load == 6
    assert dict(pts[3].per_round) == pytest.approx({"r0": 10.0, "r1": 11.0})
    named = served_windows.served_points(ws, policies, launch=lambda w: "A")
    assert [key for key, _ in named[0].per_round] == ["Ar0", "Ar1", "Ar2"]
    assert served_windows.served_points(ws, policies, min_rounds=3)[0].k == 1 and len(served_windows.served_points(ws, policies, min_rounds=3)) == 1
    assert served_windows.fixed_k_of([[1, 8, 2]]) == 2 and served_windows.fixed_k_of([[2, 8, 2]]) is None


def _judge_doc(goodputs: dict[str, list[int]], load: int = 128) -> dict:
    """A judge document: fixed_k<k> policies (and a docs' table), windows of 1 s keeping the given tokens."""
    pols = {"fixed_k1": [[1, 128, 1]], "fixed_k2": [[1, 128, 2]], "fixed_k3": [[1, 128, 3]],
            "docs": [[1, 64, 3], [65, 128, 1]]}
    wins = [dict(policy=p, load=load, round=r, kept_tokens=g, seconds=1.0, steps=100, mean_batch=120.0,
                 mismatched_steps=0) for p, gs in goodputs.items() for r, g in enumerate(gs)]
    return {"policies": {p: pols[p] for p in goodputs}, "windows": wins}


def test_compare_envelopes_worked_numbers():
    # default ceiling: k1 best (100, 110 -> 105 ± 5); raised: k3 best (160, 180 -> 170 ± 10), k1 there 100
    low = _judge_doc({"fixed_k1": [100, 110], "fixed_k3": [40, 50], "docs": [500, 500]})
    high = _judge_doc({"fixed_k1": [95, 105], "fixed_k3": [160, 180]})
    (a,) = harness.compare_envelopes([("512", low), ("1024", high)], default="512")
    assert a.load == 128 and a.winner == "1024"
    assert a.best == {"512": (1, 105.0, 5.0, 2), "1024": (3, 170.0, 10.0, 2)}  # the docs' table is not a fixed k
    assert a.ratio == pytest.approx(170 / 105)
    assert a.ratio_se == pytest.approx(170 / 105 * math.hypot(5 / 105, 10 / 170))
    assert a.anchor[0] == 1 and a.anchor[1] == pytest.approx(100 / 105)
    # 1.619 ± 0.120: two rounds each, t(1) = 12.71, so not beyond the noise; with 6 rounds each (same
    # means and s.e.s) t(5) = 2.57 and it is
    assert not a.finding and "not a finding" in a.sentence()
    six = dataclasses.replace(a, best={"512": (1, 105.0, 5.0, 6), "1024": (3, 170.0, 10.0, 6)})
    assert six.finding and "raise the ceiling" in six.sentence()


def test_compare_envelopes_keeps_the_default_or_calls_noise_no_finding():
    low = _judge_doc({"fixed_k1": [100, 120], "fixed_k2": [90, 90]})
    same = _judge_doc({"fixed_k1": [90, 130], "fixed_k2": [100, 130]})  # 115 ± 15 vs 110 ± 10
    (a,) = harness.compare_envelopes([("512", low), ("1024", same)], default="512")
    assert a.winner == "1024" and not a.finding and "not a finding" in a.sentence()
    worse = _judge_doc({"fixed_k1": [50, 60]})
    (b,) = harness.compare_envelopes([("512", low), ("1024", worse)], default="512")
    assert b.winner == "512" and b.ratio == 1.0 and b.anchor is None and b.sentence().startswith("load 128: keep 512")
    with pytest.raises(InvalidValueError, match="'2048'"):
        harness.compare_envelopes([("512", low)], default="2048")


def test_an_undecided_load_makes_the_table_unverified_and_the_file_says_so():
    # the candidate's ratio alternates 0.9 / 1.1 round by round: mean 1.0, wide interval -> undecided
    loads = (8,)
    ws = [Window(n, 8, r, (90.0 if r % 2 else 110.0) if n == "table" else 100.0, 1.0, 10, 1.0, 0)
          for r in range(4) for n in ("k=0", "k=1", "k=2", "k=3", "table")]
    goodput, verdicts = judge(ws, loads, ["k=0", "k=1", "k=2", "k=3"], tolerance=0.03)
    plan = served_plan.VerificationPlan(loads, 4, 1.5, 0.4, 1.5, 75.0, 60.0)
    res = served_verdict.ServedVerification(candidate=((1, 4, 2), (5, 8, 1)), max_k=3, max_num_seqs=8, plan=plan,
                                    goodput=tuple(goodput), verdicts=tuple(verdicts), tolerance=0.03,
                                    elapsed_s=55.0, budget_cut=True, windows=tuple(ws),
                                    stop_reasons=((8, "budget"),))
    assert res.passed and res.verdict == "unverified"
    assert "UNVERIFIED" in res.summary() and "verified:" not in res.summary().split("UNVERIFIED")[0]
    doc = _published(res)
    section = parse_published(doc).served_verification
    assert section["verdict"] == "unverified" and section["per_load"][0]["stop"] == "budget"
    doc["served_verification"]["verdict"] = "verified"  # a file that calls an undecided table verified
    with pytest.raises(PublishedTableError, match="contradicts per_load"):
        parse_published(doc)


def test_a_load_with_no_verdict_expected_is_not_measured_when_its_share_buys_too_few_rounds(monkeypatch):
    # The profile: every k costs the same per token at every B (tau(k) / T(k) equal), so the table
    # (k = 3 everywhere) sits on the 0.97 line against the best fixed k: no verdict is expected. A
    # 5 s budget cannot buy 3 paired rounds of 4 policies in 1 s windows: nothing is served.
    rates = (0.8, 0.64, 0.512)
    taus = [1.0, 1.8, 2.44, 2.952]
    steps = {str(k): {str(b): 10.0 * taus[k] for b in range(1, 9)} for k in range(4)}
    srv = ScriptedServer({0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 1.8}, 8, 3)
    said = []
    res = served_verification.verify_on_server(srv, [[1, 8, 3]], K=3, max_num_seqs=8, loads=(8,), rounds=8,
                                               window_s=1.0, settle_s=0.0, warmup_s=0.0, budget_s=5.0,
                                               first_warmup_s=0.0, progress=said.append,
                                               profile_steps=(steps, rates))
    assert res.stop_reasons == ((8, "budget"),) and not res.windows and res.budget_cut
    assert any("load 8: not measured: no verdict expected" in s and "fewer than 3 paired rounds" in s for s in said)
    assert any("load 8:" in line and "none is expected" in line for line in res.expected_open)


class _Recorder:
    """Records each request's (prompt, max_tokens) per client thread."""

    def __init__(self):
        import threading

        self.seen, self._lock = [], threading.Lock()

    def complete(self, prompt, **kw):
        with self._lock:
            self.seen.append((tuple(prompt), kw["max_tokens"]))
        time.sleep(0.001)
        return {"choices": [{}]}


def _sequence(epoch, n=6):
    rec = _Recorder()
    gen = served_load.LoadGenerator(rec, 1, 1000, seed=3)
    if epoch is not None:
        gen.reseed(epoch)
    gen.start()
    deadline = time.monotonic() + 30
    while len(rec.seen) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    gen.stop()
    return rec.seen[:n]


def test_a_reseeded_client_serves_the_epochs_request_sequence():
    """Common random numbers: two windows reseeded with the same epoch draw the same prompts and
    lengths; another epoch, or none, draws others."""
    same = _sequence(5)
    assert len(same) == 6 and same == _sequence(5)
    assert _sequence(6) != same and _sequence(None) != same


def test_every_window_of_a_round_is_reseeded_with_its_round(monkeypatch):
    ms, kept = {0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 1.8}
    srv = ScriptedServer(ms, kept, 8, 3)
    epochs = []
    real = served_load.LoadGenerator.reseed
    monkeypatch.setattr(served_load.LoadGenerator, "reseed", lambda gen, e: (epochs.append(e), real(gen, e))[1])
    res = _verify(srv, [[1, 6, 2], [7, 8, 1]], (8,), monkeypatch, window="time")
    assert len(res.windows) == 10 and epochs == [w.round for w in res.windows] == [0] * 5 + [1] * 5


def test_fixed_work_serves_each_clients_first_requests_of_the_epoch_and_waits_for_all():
    """``serve_requests``: 3 clients x 4 requests, all answered before it returns; the same epoch
    again sends the same requests per client (prompts and lengths) as ``reseed`` + the loop would,
    and another epoch others."""
    rec = _Recorder()
    gen = served_load.LoadGenerator(rec, 3, 1000, seed=3)
    assert gen.serve_requests(7, 4) == 12 and len(rec.seen) == 12 and gen.completed == 12
    first = sorted(rec.seen)
    rec.seen.clear()
    gen.serve_requests(7, 4)
    assert sorted(rec.seen) == first
    rec.seen.clear()
    gen.serve_requests(8, 4)
    assert sorted(rec.seen) != first
    one = served_load.LoadGenerator(rec, 1, 1000, seed=3)
    rec.seen.clear()
    one.serve_requests(5, 6)
    assert rec.seen == _sequence(5)  # client 0's sequence for epoch 5, as the reseeded loop sends it


def test_windows_of_fixed_work_serve_the_rounds_requests_for_every_policy(monkeypatch):
    """``window = "requests"`` (the CPU default): no request flows between windows, each window serves
    round r's requests (``serve_requests(r, requests_per_client)``) with the acceptance prior's
    temperature, so every policy of a round gets the same prompts."""
    ms, kept = {0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 1.8}
    srv = ScriptedServer(ms, kept, 8, 3)
    calls, temps = [], set()
    real = served_load.LoadGenerator.serve_requests

    def spy(gen, epoch, requests):
        calls.append((epoch, requests, len(srv.prompts)))
        temps.add(gen.temperature)
        return real(gen, epoch, requests)

    monkeypatch.setattr(served_load.LoadGenerator, "serve_requests", spy)
    res = _verify(srv, [[1, 6, 2], [7, 8, 1]], (8,), monkeypatch, prompt=lambda rng: rng.random(),
                  requests_per_client=2)
    assert served_plan.DEFAULTS["cpu"].window == "requests" and temps == {0.0}
    assert [(e, n) for e, n, _ in calls] == [(w.round, 2) for w in res.windows] == [(0, 2)] * 5 + [(1, 2)] * 5
    # nothing is sent between windows: each window's 16 requests (8 clients x 2) are all there is
    assert [b - a for (_, _, a), (_, _, b) in zip(calls, calls[1:])] == [16] * 9 and calls[0][2] == 0
    per_window = [sorted(srv.prompts[i:i + 16]) for i in range(0, 160, 16)]
    assert all(p == per_window[0] for p in per_window[:5]) and all(p == per_window[5] for p in per_window[5:])
    assert per_window[0] != per_window[5]
    assert res.verdicts and all(w.table_verified for w in res.windows)
    # the published section says what a window counted and the batch it ran at each load
    sv = res.to_dict()
    assert (sv["window"], sv["requests_per_client"]) == ("requests", 2)
    mean_b = statistics.fmean(w.mean_batch for w in res.windows)
    assert sv["per_load"][0]["mean_batch"] == round(mean_b, 2) == round(res.mean_batch(8), 2)


def test_a_fixed_k_the_best_outserves_beyond_the_noise_stops_being_served():
    """``outserved`` worked numbers at load 8, two rounds: k = 2 is best (100, 104); k = 0 serves
    (80, 84) of it: ratios 0.8 and 0.8077, mean 0.8038 ± 0.0038, upper end 0.8038 + 12.71 x 0.0038
    = 0.853 < 1: out. k = 1 serves (90, 104): ratios 0.9, 1.0, upper end 0.95 + 12.71 x 0.05 > 1:
    kept. The candidate's own k (k = 3 where the table is k = 3) is never dropped, however it does."""
    from tabletune_pipelines.tuning.served_plan import LoadPolicies

    def ws(name, goodputs):
        return [Window(name, 8, r, int(g * 10), 10.0, 50, 8.0, 0) for r, g in enumerate(goodputs)]

    windows = ws("k=2", (100, 104)) + ws("k=0", (80, 84)) + ws("k=1", (90, 104)) + ws("k=3", (50, 52))
    fixed = ["k=0", "k=1", "k=2", "k=3"]
    plain = LoadPolicies(8, {"table": [[1, 8, 1]], **{f: [[1, 8, int(f[2])]] for f in fixed}}, tuple(fixed), None, {})
    assert served_verification.outserved(windows, plain, fixed) == ["k=0", "k=3"]
    same = LoadPolicies(8, {f: [[1, 8, int(f[2])]] for f in fixed}, tuple(fixed), "k=3", {})
    assert served_verification.outserved(windows, same, fixed) == ["k=0"]
    assert served_verification.outserved(windows[:1] + windows[2:3], plain, fixed) == []  # one round: no noise estimate


def test_rounds_after_an_elimination_serve_only_the_policies_left(monkeypatch):
    """The table is k = 3 at load 8 and serves ~0.965 of k = 2 (each window's steps 3 % slower or faster
    at random): undecided for 3 rounds. k = 0 keeps nothing at 6 ms, 2/3 of k = 2: out after two."""
    import random

    class Noisy(ScriptedServer):
        rng = random.Random(4)

        def read_steps(self, since=None, until=None, offset=0):
            f = 1 + self.rng.uniform(-0.03, 0.03)
            return [dict(x, dt=x["dt"] * f) for x in super().read_steps()]

    srv = Noisy({0: 6.0, 1: 8.0, 2: 10.0, 3: 14.0}, {0: 0.0, 1: 0.8, 2: 1.5, 3: 2.4}, 8, 3)
    lines = []
    real = served_load.LoadGenerator.__post_init__
    monkeypatch.setattr(served_load.LoadGenerator, "__post_init__", lambda gen: (setattr(srv, "load", gen.load),
                                                                                   real(gen))[1])
    res = served_verification.verify_on_server(srv, [[1, 8, 3]], K=3, max_num_seqs=8, loads=(8,), rounds=3,
                                               window="requests", requests_per_client=1, settle_s=0.0, budget_s=60,
                                               first_warmup_s=0.0, progress=lines.append)
    by = {r: sorted(w.policy for w in res.windows if w.round == r) for r in range(3)}
    assert by[0] == by[1] == ["k=0", "k=1", "k=2", "k=3"], by
    assert by[2] == ["k=2", "k=3"], (by, lines)  # k = 1 (0.875 of k = 2) goes too
    assert any("not served in the rounds left" in line for line in lines)
    assert res.verdicts[0].rounds == 3 and res.verdicts[0].best_fixed == "k=2"


def test_a_dropped_fixed_k_is_listed_but_never_the_best_the_candidate_is_judged_against():
    """Drift: rounds 0-1 serve everything 30 % faster than rounds 2-4. k = 1 ran only rounds 0-1
    (paired, 0.9 of k = 2: dropped), so its mean (117) tops k = 2's over five rounds (112): without
    ``dropped`` it would be the best, paired with the candidate on 2 rounds only (t = 12.7)."""
    fast, slow = 1.3, 1.0
    speed = [fast, fast, slow, slow, slow]
    ws = [Window("k=2", 8, r, int(1000 * speed[r]), 10.0, 50, 8.0, 0) for r in range(5)]
    ws += [Window("k=1", 8, r, int(1000 * speed[r] * 0.9), 10.0, 50, 8.0, 0) for r in range(2)]
    table = [1.03, 1.0, 1.04, 1.02, 1.03]  # of k = 2, round by round
    ws += [Window("table", 8, r, int(1000 * speed[r] * table[r]), 10.0, 50, 8.0, 0) for r in range(5)]
    fixed = ["k=1", "k=2"]
    _, (plain,) = judge(ws, [8], fixed, tolerance=0.03)
    assert plain.best_fixed == "k=1" and plain.rounds == 2 and plain.status == "inconclusive"
    goodput, (v,) = judge(ws, [8], fixed, tolerance=0.03, dropped={8: {"k=1"}})
    assert v.best_fixed == "k=2" and v.rounds == 5 and v.status == "pass", v.reason
    assert {g.policy for g in goodput} >= {"k=1", "k=2", "table"}

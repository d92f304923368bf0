"""The served verification sized from the profile (``served_plan.size_verification``) and the
no-verdict note printed before the table (``run_report.no_verdict_lines``)."""

from __future__ import annotations

import dataclasses
import math

from tabletune_pipelines.tuning import served_plan
from tabletune_pipelines.tuning.run_report import no_verdict_lines

M, K = 16, 3
RATES = (0.8, 0.64, 0.512)  # tau = 1, 1.8, 2.44, 2.95


def _steps(slow: float = 1.0, k3_penalty: float = 1.0):
    """Decode step times {k: {B: ms}}: 30 ms + 2 ms per request, +10 % per k; k = 3 times ``k3_penalty``."""
    return {str(k): {str(b): slow * (30.0 + 2.0 * b) * (1 + 0.1 * k) * (k3_penalty if k == 3 else 1.0)
                     for b in range(1, M + 1)} for k in range(K + 1)}


def _per_load(table, loads=(1, 8, 16)):
    out = {}
    for load in loads:
        ks = served_plan.plausible_fixed_ks(table, load, max_k=K, max_num_seqs=M)
        out[load] = served_plan.load_policies(table, load, max_k=K, max_num_seqs=M, fixed_ks=ks)
    return out


def test_windows_grow_with_the_profiles_step_times():
    table = [[1, 16, 3]]
    fast = served_plan.size_verification(_steps(slow=0.3), RATES, _per_load(table), max_k=K, max_num_seqs=M, device="cpu",
                                    tolerance=0.03, most_rounds=8)
    slow = served_plan.size_verification(_steps(slow=10.0), RATES, _per_load(table), max_k=K, max_num_seqs=M,
                                     device="cpu", tolerance=0.03, most_rounds=8)
    # 20 steps x 1.5 x the slowest step (k = 3 at B = 16: 62 ms x 1.3 = 80.6 ms; x 0.3 = 24 ms: 0.7 s, under the
    # default 1.5 s; x 10 = 806 ms: 24.2 s)
    assert fast.window_s == served_plan.DEFAULTS["cpu"].window_s
    assert slow.window_s == math.ceil(20 * 1.5 * 806.0 / 100) / 10
    assert slow.ratio_sd < fast.ratio_sd  # longer windows, smaller expected spread per round


def test_a_table_far_from_the_line_is_decidable_and_one_on_it_is_named_before_measuring():
    # k = 3 twice as slow as its neighbours: the table [[1, 16, 1]] is far ahead of k = 0 and of k = 3 but
    # next to k = 2 (tau 2.44 / 1.2 vs 1.8 / 1.1: 1.24x). A table equal to a fixed k is judged against the
    # other plausible fixed k.
    steps = _steps(k3_penalty=2.0)
    far = served_plan.size_verification(steps, RATES, _per_load([[1, 16, 2]]), max_k=K, max_num_seqs=M, device="cpu",
                                   tolerance=0.03, most_rounds=8)
    for need in far.needs:
        assert need.predicted_ratio is not None and need.predicted_ratio > 1.0
    # a table of k = 1 against k = 2: predicted ratio 0.81, far below the 0.97 line: a verdict (fail) is reachable
    losing = served_plan.size_verification(steps, RATES, _per_load([[1, 16, 1]]), max_k=K, max_num_seqs=M,
                                      device="cpu", tolerance=0.03, most_rounds=8)
    assert all(n.rounds is not None and n.predicted_ratio < 0.9 for n in losing.needs)
    assert losing.budget_s >= served_plan.DEFAULTS["cpu"].budget_s and losing.unreachable == []
    # a table 1 % ahead of its rival: 0.04 from the line, beyond 8 rounds at a 0.2 spread
    close = {str(k): dict(row) for k, row in _steps().items()}
    for b in range(1, M + 1):  # k = 2 made 1 % worse than k = 3 per token, so the table k = 3 is ahead by ~1 %
        close["2"][str(b)] = close["3"][str(b)] * 2.44 / 2.952 * 1.01
    tight = served_plan.size_verification(close, RATES, _per_load([[1, 16, 3]]), max_k=K, max_num_seqs=M, device="cpu",
                                     tolerance=0.03, most_rounds=8)
    assert tight.unreachable and all("none is expected" in line for line in tight.lines(0.03, 8))
    assert tight.budget_s <= served_plan.BUDGET_CAP * served_plan.DEFAULTS["cpu"].budget_s


def test_no_verdict_lines_name_the_open_loads_and_what_stopped_them():
    section = {"verdict": "unverified", "budget_s": 60.0,
               "per_load": [{"load": 1, "status": "inconclusive", "rounds": 3, "stop": "budget"},
                            {"load": 8, "status": "pass", "rounds": 4, "stop": "decided"}],
               "no_verdict_expected": ["load 1: the profile predicts ..."]}
    lines = no_verdict_lines(section)
    assert lines[0].startswith("served verification reached NO VERDICT at load 1 (stopped by the budget, 3 paired")
    assert "60 s budget" in lines[0] and lines[1] == "  expected before measuring: load 1: the profile predicts ..."
    section["per_load"][0]["status"] = "pass"
    assert no_verdict_lines(section) == [] and no_verdict_lines(None) == []


def test_every_loads_share_of_the_budget_holds_the_neediest_loads_rounds():
    d = served_plan.DEFAULTS["cpu"]
    per_load = _per_load([[1, 8, 3], [9, 16, 1]])
    sizing = served_plan.size_verification(_steps(k3_penalty=2.0), RATES, per_load, max_k=K, max_num_seqs=M,
                                      device="cpu", tolerance=0.03, most_rounds=8)
    per_window = sizing.window_s + d.settle_s + served_plan.SWAP_OVERHEAD_S
    need = max(d.warmup_s + (n.rounds or 2) * len(per_load[n.load].policies) * per_window for n in sizing.needs)
    assert sizing.budget_s >= min(3 * need, served_plan.BUDGET_CAP * d.budget_s) - 1
    assert sizing.budget_s <= served_plan.BUDGET_CAP * d.budget_s


def test_loads_where_a_verdict_is_expected_go_first_and_share_the_budget():
    from tabletune_pipelines.tuning.served_verification import _loads_sharing, verdict_order

    need = served_plan.LoadNeed
    sizing = served_plan.VerificationSizing(window_s=4.8, rounds=7, budget_s=180.0, ratio_sd=0.11, needs=(
        need(16, 0.80, 3), need(8, 0.995, None), need(1, 1.39, 3), need(4, None, None)))
    # reachable first, fewest rounds first, the larger load first on a tie; then the rest, largest first
    order = verdict_order((16, 8, 4, 1), sizing)
    assert order == (16, 1, 8, 4)
    # the two reachable loads split the budget; once they are measured, the rest split what is left
    assert [_loads_sharing(order[i:], sizing) for i in range(4)] == [2, 1, 2, 1]
    assert _loads_sharing((16, 8, 1), None) == 3  # sized by hand: every load gets its share
    fewer = dataclasses.replace(sizing, needs=(need(16, 0.8, 6), need(8, 0.7, 2), need(1, 1.39, None)))
    assert verdict_order((16, 8, 1), fewer) == (8, 16, 1)


def test_the_main_jobs_verification_serves_the_fixed_k_its_profile_leaves_open():
    """``embedded.FULL_VERIFICATION`` on run 1's table and evidence (benchmarks/data/cpu/2026-12-07-main-job):
    at load 1 (B = 1) the profile ruled out k = 0 and 1, so the round is the table (k = 3) and fixed k = 2,
    half the windows of serving every k; at loads 8 and 16 nothing is ruled out and every k is served."""
    from tabletune_pipelines.embedded import FULL_VERIFICATION
    from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions

    opts = ServedVerificationOptions(**FULL_VERIFICATION)
    assert opts.fixed_k == "plausible"
    table = [[1, 15, 3], [16, 16, 1]]
    within = {1: [3], 2: [3], 3: [2, 3], 4: [2, 3], 5: [2, 3], 6: [1, 2, 3], 7: [1, 2, 3], 8: [1, 2, 3],
              **{b: [0, 1, 2, 3] for b in range(9, 16)}, 16: [0, 1, 2]}
    ks = {load: served_plan.plausible_fixed_ks(table, load, max_k=K, max_num_seqs=M, within_noise=within)
          for load in (1, 8, 16)}
    assert ks == {1: (2, 3), 8: (0, 1, 2, 3), 16: (0, 1, 2, 3)}
    one = served_plan.load_policies(table, 1, max_k=K, max_num_seqs=M, fixed_ks=ks[1])
    assert list(one.policies) == ["k=2", "k=3"] and one.same == "k=3"


def test_windows_of_fixed_work_last_as_long_as_their_requests_at_the_slowest_k():
    """``window = "requests"``: 3 requests of 80 tokens (the mean of 32..128) a client at the largest load
    (16), at the k that takes longest per token there, times the 1.5 step margin. With ``_steps()``:
    T(16, k) = 62 ms x (1 + 0.1 k), tau = 1, 1.8, 2.44, 2.952: k = 0 is slowest per token (62 ms), so
    3 x 80 x 62 ms x 1.5 = 22.32 s, rounded up to 22.4 s. The spread is the fixed-work prior, whatever
    the windows' length."""
    table = [[1, 16, 3]]
    sz = served_plan.size_verification(_steps(), RATES, _per_load(table), max_k=K, max_num_seqs=M, device="cpu",
                                       tolerance=0.03, most_rounds=8, window="requests", requests=3)
    assert sz.window_s == 22.4 and sz.ratio_sd == served_plan.RATIO_SD_PRIOR_REQUESTS["cpu"] == 0.05
    slow = served_plan.size_verification(_steps(slow=2.0), RATES, _per_load(table), max_k=K, max_num_seqs=M,
                                         device="cpu", tolerance=0.03, most_rounds=8, window="requests", requests=3)
    assert slow.window_s == 44.7 and slow.ratio_sd == sz.ratio_sd
    time_windows = served_plan.size_verification(_steps(), RATES, _per_load(table), max_k=K, max_num_seqs=M,
                                                 device="cpu", tolerance=0.03, most_rounds=8)
    # against 0.155 for the time windows sized here (2.5 s): the table, predicted 1.117 x the best other
    # fixed k, needs 3 paired rounds instead of 7 (t = 4.30 x 0.05 / sqrt 3 = 0.124 < 1.117 - 0.97)
    assert round(time_windows.ratio_sd, 3) == 0.155
    assert [n.rounds for n in sz.needs] == [3, 3, 3] and [n.rounds for n in time_windows.needs] == [7, 7, 7]

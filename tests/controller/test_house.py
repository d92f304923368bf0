"""The controller's parts alone, on worked numbers: the step record and the one count of drafted and
kept tokens (``controller.step``), flap counting and backoff (``controller.flapping``) and cost
observation (``controller.observations``). No vLLM, no published file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tabletune_pipelines.controller.flapping import FLAP_WINDOW_REBUILDS, FlapCounter
from tabletune_pipelines.controller.observations import CostObserver
from tabletune_pipelines.controller.step import StepOutcome, count_drafts, fold, longest


# ---------------------------------------------------------------- the step record and the count
def test_step_outcome_is_one_frozen_slotted_record():
    s = StepOutcome({"a": 1}, {"a": [0]}, {"a": 0}, [[1, 2]], 1, 0, 2, 5.0)
    assert [f.name for f in dataclasses.fields(StepOutcome)] == [
        "num_scheduled_tokens", "spec_tokens", "req_id_to_index", "sampled", "k_next", "num_new", "total_tokens",
        "now", "column"]
    assert not hasattr(s, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.now = 6.0  # type: ignore[misc]


def test_count_drafts_worked_example():
    # K = 3. a: drafted 3 kept 2; b: 3 kept 0; c: 1 kept 1; d: finished in the step (empty output) and
    # e: no row in the output count nothing; f: drafted 5 > K, 6 tokens out -> clamped to 3 and 3; g:
    # drafted 1, 4 tokens out (kept 3 > drafted) -> clamped to 1 and 1; h drafted nothing.
    spec = {"a": [0] * 3, "b": [0] * 3, "c": [0], "d": [0] * 2, "e": [0] * 2, "f": [0] * 5, "g": [0], "h": []}
    idx = {"a": 0, "b": 1, "c": 2, "d": 3, "f": 4, "g": 5, "h": 6}
    sampled = [[1] * 3, [1], [1] * 2, [], [1] * 6, [1] * 4, [1]]
    hd, ha, seen = [0] * 4, [0] * 4, []
    out = count_drafts(spec, idx, sampled, 3, hd, ha, lambda n, m: seen.append((n, m)))
    assert out == (3 + 3 + 1 + 3 + 1, 2 + 0 + 1 + 3 + 1, 2)  # drafted, kept, rejections (a and b)
    assert (hd, ha) == ([0, 2, 0, 3], [1, 2, 1, 1]) and seen == [(5, 5), (1, 3)]
    assert longest(hd) == 3 and longest([1, 0, 2, 0]) == 2 and longest([4, 0, 0, 0]) == 0
    # per position: drafted_i = request-steps that drafted >= i, accepted_i = those that kept >= i
    assert fold(hd, ha) == ([5, 3, 3], [4, 2, 1]) and hd == ha == [0, 0, 0, 0]
    assert count_drafts(None, idx, sampled, 3, hd, ha) == (0, 0, 0)
    assert count_drafts(spec, idx, [], 3, hd, ha) == (0, 0, 0) and hd == [0, 0, 0, 0]


def test_the_step_module_needs_only_the_stdlib():
    """``engine.timing_scheduler`` imports it inside vLLM's engine core, next to nothing but the stdlib."""
    code = ("import sys; import tabletune_pipelines.controller.step; "
            "print(','.join(m for m in ('numpy', 'vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


# ---------------------------------------------------------------- flapping
def test_flap_counter_worked_numbers():
    f = FlapCounter(4, cap=100)
    tab = lambda *ks: np.array(ks)  # noqa: E731 - k at B = 1..4
    f.count(tab(1, 1, 1, 1), tab(2, 2, 1, 1), rebuild=0)  # first switches (new ks): no reversal, no hold
    assert f.switches.tolist() == [0, 1, 1, 0, 0] and f.reversals == 0 and not f.holding(0)
    f.count(tab(2, 2, 1, 1), tab(2, 1, 1, 1), rebuild=50)  # B = 2 back to 1: a reversal event, held 8
    assert f.reversals == 1 and f.level == 1 and f.held_until == 50 + 1 + 8
    assert f.held(51).tolist() == [True] * 4 and f.held(59).tolist() == [False] * 4  # the whole table
    assert [f.holding(r) for r in (51, 58, 59)] == [True, True, False]
    # While held: no change unless the gain's lower bound clears 10 % in 8 held rebuilds in a row
    # (OVERRIDE_PERSIST), wanting the same k; a first change to a new k is held like any other.
    want = tab(1, 2, 1, 2)  # B = 1 back to 1 (refused), B = 2 back to 2 (clears: +20 %), B = 4 new (refused)
    lcb = np.log([1.05, 1.20, 1.0, 1.01])
    for r in range(51, 58):  # seven in a row: not yet
        assert f.allow(tab(2, 1, 1, 1), want, r, gain_lcb=lcb).tolist() == [2, 1, 1, 1] and f.overrides == 0
    assert f.allow(tab(2, 1, 1, 1), want, 58, gain_lcb=lcb).tolist() == [2, 2, 1, 1] and f.overrides == 1
    assert f.allow(tab(2, 1, 1, 1), want, 59).tolist() == want.tolist()  # the hold is over
    # Repeats within cap (100) rebuilds of the hold's end: holds 8 x 8 = 64, then the cap.
    f.count(tab(2, 1, 1, 1), tab(2, 2, 1, 1), rebuild=150)  # 150 - 59 = 91 <= 100: a repeat
    assert f.level == 2 and f.held_until == 150 + 1 + 64
    f.count(tab(2, 2, 1, 1), tab(2, 1, 1, 1), rebuild=215)
    assert f.level == 3 and f.held_until == 215 + 1 + 100  # 512 capped at 100
    # A reversal after a quiet spell longer than the cap: the level starts again (a change of traffic).
    f.count(tab(2, 1, 1, 1), tab(2, 2, 1, 1), rebuild=316 + 101)
    assert f.level == 1 and f.held_until == 417 + 1 + 8 and f.reversals == 4
    # Round three ks: 1 -> 3 (new), 3 -> 2 (new), 2 -> 1 returns to a k B = 1 had had: a reversal too,
    # and held (a cycle 1 -> 2 -> 3 -> 1 ... never flips straight back, and is flapping all the same).
    g = FlapCounter(4, cap=100)
    g.count(tab(1, 1, 1, 1), tab(3, 1, 1, 1), rebuild=0)
    g.count(tab(3, 1, 1, 1), tab(2, 1, 1, 1), rebuild=1)  # 2 is new at B = 1 (before: 1, then 3)
    assert g.reversals == 0 and not g.holding(2)
    g.count(tab(2, 1, 1, 1), tab(1, 1, 1, 1), rebuild=2)  # back to 1, which B = 1 had two changes ago
    assert g.reversals == 1 and g.holding(3)
    assert g.allow(tab(1, 1, 1, 1), tab(3, 2, 1, 1), 3).tolist() == [1, 1, 1, 1]  # held, the new k at B = 2 too
    assert f.summary(418, hours=0.5) == {"switches": 6, "switches_per_hour": 12.0, "reversals": 4,
                                         "switches_by_batch_size": {"1": 1, "2": 5}, "held_batch_sizes": 4,
                                         "flap_level": 1, "flap_overrides": 1}
    # The run of strong rebuilds breaks on a gap, on a weak rebuild, or when the wanted k changes.
    q = FlapCounter(2, cap=100)
    q.count(tab(1, 1), tab(2, 1), rebuild=0)
    q.count(tab(2, 1), tab(1, 1), rebuild=1)  # held 8
    q.count(tab(1, 1), tab(2, 1), rebuild=10)  # a repeat: held 64, rebuilds 11..74
    strong, weak = np.log([0.8, 1.0]), np.log([1.0, 1.0])  # back to k = 1 at B = 1: +25 %
    for r in (11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22):  # 15 missing: 4, then 7 in a row
        assert q.allow(tab(2, 1), tab(1, 1), r, gain_lcb=-strong).tolist() == [2, 1]
    for r in range(23, 30):  # 23 weak: the run starts again at 24
        q.allow(tab(2, 1), tab(1, 1), r, gain_lcb=-(weak if r == 23 else strong))
    for r in range(30, 37):  # wanting 1, then 3, ...: no run
        q.allow(tab(2, 1), tab(1 if r % 2 else 3, 1), r, gain_lcb=-strong)
    assert q.overrides == 0
    got = [q.allow(tab(2, 1), tab(3, 1), r, gain_lcb=-strong).tolist() for r in range(37, 44)]
    assert got == [[2, 1]] * 6 + [[3, 1]] and q.overrides == 1  # 3 wanted since 36: the 8th in a row is 43
    # a new published version: its own flap history, the cumulative counts carried over
    h = f.restarted(cap=0)
    assert h.switches.tolist() == f.switches.tolist() and h.switches is not f.switches and h.reversals == 4
    assert not h.holding(418) and h.had.tolist() == [0] * 5
    h.count(tab(1, 1, 1, 1), tab(2, 1, 1, 1), rebuild=500)
    h.count(tab(2, 1, 1, 1), tab(1, 1, 1, 1), rebuild=501)  # cap 0: a reversal, counted, never held
    assert h.reversals == 5 and not h.holding(502)
    assert FLAP_WINDOW_REBUILDS == 16


# ---------------------------------------------------------------- cost observation
def test_cost_observer_worked_numbers():
    # allowed k (1, 3): rows 0 and 1 of the profile, B = 1..4; outlier ratio 1.5 (served steps: 1.5^2)
    prof = np.array([[10.0, 11.0, 12.0, 13.0], [20.0, 22.0, 24.0, 26.0]])
    o = CostObserver((1, 3), prof, 1.5, max_k=3, n=4)
    o.observe(0.011, 2, 1, 2, 1, True)  # clean decode step at (B 2, k 1): both
    o.observe(0.015, 2, 1, 3, 1, True)  # B changed since the step before: served only
    o.observe(0.030, 2, 1, 2, 1, True)  # 30 ms > 11 · 1.5^2: a pause, neither
    o.observe(0.022, 3, 3, 3, 1, True)  # the first step at a new k: neither
    o.observe(0.024, 3, 3, 3, 3, False)  # prefill or admissions: served only
    o.observe(0.005, 2, 2, 2, 2, True)  # k = 2 has no profile row
    o.observe(0.010, 5, 1, 5, 1, True)  # B above max_num_seqs
    o.observe(0.010, 2, None, 2, None, True)  # the k is unknown
    assert o.clean == {2: pytest.approx([11.0, 1.0, 121.0])}
    # Without a published served model every served step's own prefill is priced at 0.
    assert o.served == {2: pytest.approx([26.0, 2.0, 346.0, 0.0, 0.0, 0.0]),
                        1 * 5 + 3: pytest.approx([24.0, 1.0, 576.0, 0.0, 0.0, 0.0])}
    got = []
    model = SimpleNamespace(profile=prof, add=lambda *a: got.append(("clean", a)),
                            add_served=lambda *a: got.append(("served", a)))
    o.hand_over(model)
    (w1, (s1, c1, q1)), (w2, (s2, c2, q2, *priced)) = got
    assert (w1, w2) == ("clean", "served")
    assert s1[0, 1] == pytest.approx(11.0) and c1.sum() == 1 and c1[0, 1] == 1 and q1[0, 1] == pytest.approx(121.0)
    assert s2[0, 1] == pytest.approx(26.0) and c2[0, 1] == 2 and s2[1, 2] == pytest.approx(24.0) and c2.sum() == 3
    assert len(priced) == 3 and all(not a.any() for a in priced)
    assert o.clean == {} and o.served == {}
    o.hand_over(model)
    assert len(got) == 2  # nothing new: nothing handed over


def test_cost_observer_prices_each_served_step_by_the_prefill_it_carried():
    """With the published served model (``StepExtra``: ceiling 16 tokens; within it a mixed step costs
    2 + 0.1·P ms more than its decode step, above it 30 ms more), each served step keeps the extra
    its own content is priced at: m, m² and interval·m per cell."""
    from tabletune_pipelines.core.stepcost import StepExtra

    prof = np.array([[10.0, 11.0, 12.0, 13.0], [20.0, 22.0, 24.0, 26.0]])
    ex = StepExtra(ceiling=16, coefs=((2.0, 0.0, 0.1), (30.0, 0.0, 0.0), (30.0, 0.0, 0.0)))
    o = CostObserver((1, 3), prof, 3.0, max_k=3, n=4, extra=ex)
    o.observe(0.012, 2, 1, 2, 1, True, 4, 0)  # pure decode: m = 0
    o.observe(0.016, 2, 1, 2, 1, False, 4, 10)  # 4 + 10 = 14 tokens, within: m = 2 + 1 = 3
    o.observe(0.045, 2, 1, 2, 1, False, 4, 40)  # 44 tokens, above the ceiling: m = 30
    ms, m = [12.0, 16.0, 45.0], [0.0, 3.0, 30.0]
    assert o.served[2] == pytest.approx([sum(ms), 3.0, sum(x * x for x in ms), sum(m), sum(v * v for v in m),
                                         sum(x * v for x, v in zip(ms, m))])
    got = []
    o.hand_over(SimpleNamespace(profile=prof, add=lambda *a: None, add_served=lambda *a: got.append(a)))
    [(s, c, q, m1, m2, xm)] = got
    assert (s[0, 1], c[0, 1], m1[0, 1], m2[0, 1], xm[0, 1]) == pytest.approx((73.0, 3.0, 33.0, 909.0, 1398.0))


def test_without_k_in_the_scheduler_output_the_longest_draft_counted_stands_for_it(tmp_path):
    from tabletune_pipelines.evaluation.simulator import fake_controller
    from tabletune_pipelines.evaluation.synthetic import publish

    clock = [1000.0]
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=(0.5, 0.5, 0.5),
                controller={"rebuild_every_steps": 10_000})
    given, missing = fake_controller(p, clock), fake_controller(p, clock)
    # a drafted 2 (kept 1), b drafted 3 but finished in the step (empty output): the k is a's 2
    spec, idx, sampled = {"a": [0, 0], "b": [0, 0, 0]}, {"a": 0, "b": 1}, [[1, 1], []]
    given.on_step(StepOutcome({"a": 1, "b": 1}, spec, idx, sampled, 2, 0, 7, clock[0]))
    missing.on_step(StepOutcome({"a": 1, "b": 1}, spec, idx, sampled, None, 0, 7, clock[0]))
    assert missing._prev_k == missing.table.cur_k == 2
    e, g = missing.evidence, given.evidence
    assert e.hist_d == g.hist_d == [0, 0, 1, 0] and e.hist_a == g.hist_a == [0, 1, 0, 0]

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
        "now"]
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
    """``engine.step_scheduler`` imports it inside vLLM's engine core, next to nothing but the stdlib."""
    code = ("import sys; import tabletune_pipelines.controller.step; "
            "print(','.join(m for m in ('numpy', 'vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


# ---------------------------------------------------------------- flapping
def test_flap_counter_worked_numbers():
    f = FlapCounter(4, cap=8)
    one = lambda k: np.array([k, 1, 1, 1])  # noqa: E731 - batch size 1 at k, the others at 1
    f.count(one(1), one(2), rebuild=0)  # first switch: after a quiet spell (none before), not held
    assert f.switches.tolist() == [0, 1, 0, 0, 0] and f.reversals == 0 and not f.held(0).any()
    f.count(one(2), one(1), rebuild=3)  # back within 16 rebuilds: a reversal, and held 2^1 = 2 rebuilds
    assert f.reversals == 1 and f.backoff_level[1] == 1 and f.held_until[1] == 3 + 1 + 2
    assert [bool(f.held(r)[0]) for r in (3, 5, 6)] == [True, True, False]
    # the quiet spell starts when the hold ends (rebuild 6): at 10 it is a repeat, held 2^2 = 4 rebuilds
    f.count(one(1), one(3), rebuild=10)
    assert f.reversals == 1 and f.held_until[1] == 10 + 1 + 4 and f.last_switch[1] == 15
    # 25 > FLAP_WINDOW_REBUILDS rebuilds after the hold ended: a change of traffic, level back to 0, not held
    assert 40 - 15 > FLAP_WINDOW_REBUILDS
    f.count(one(3), one(1), rebuild=40)
    assert f.backoff_level[1] == 0 and f.held_until[1] == 15 and f.reversals == 2  # 1 was its k before 3
    # repeats from there: holds 2, 4, 8, then the cap (8, not 16)
    holds = []
    r, k = 41, 1
    for _ in range(4):
        f.count(one(k), one(3 - k), rebuild=r)
        holds.append(int(f.held_until[1]) - r - 1)
        r, k = int(f.held_until[1]), 3 - k
    assert holds == [2, 4, 8, 8]  # 1 -> 2 (its k before was 3), then three flips back: 2 + 3 reversals
    assert f.summary(r - 1, hours=0.5) == {"switches": 8, "switches_per_hour": 16.0, "reversals": 5,
                                           "switches_by_batch_size": {"1": 8}, "held_batch_sizes": 1}
    assert f.summary(r, hours=0.5)["held_batch_sizes"] == 0  # held while the rebuild is below held_until
    # a new published version: its own flap history, the cumulative counts carried over
    g = f.restarted(cap=0)
    assert g.switches.tolist() == f.switches.tolist() and g.switches is not f.switches and g.reversals == 5
    assert not g.held(r - 1).any() and g.k_before.tolist() == [-1] * 5
    g.count(one(1), one(2), rebuild=r)
    g.count(one(2), one(1), rebuild=r)  # cap 0: a repeat and a reversal, counted, never held
    assert g.reversals == 6 and g.backoff_level[1] == 1 and not g.held_until.any()


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
    assert o.served == {2: pytest.approx([26.0, 2.0, 346.0]), 1 * 5 + 3: pytest.approx([24.0, 1.0, 576.0])}
    got = []
    model = SimpleNamespace(profile=prof, add=lambda *a: got.append(("clean", a)),
                            add_served=lambda *a: got.append(("served", a)))
    o.hand_over(model)
    (w1, (s1, c1, q1)), (w2, (s2, c2, q2)) = got
    assert (w1, w2) == ("clean", "served")
    assert s1[0, 1] == pytest.approx(11.0) and c1.sum() == 1 and c1[0, 1] == 1 and q1[0, 1] == pytest.approx(121.0)
    assert s2[0, 1] == pytest.approx(26.0) and c2[0, 1] == 2 and s2[1, 2] == pytest.approx(24.0) and c2.sum() == 3
    assert o.clean == {} and o.served == {}
    o.hand_over(model)
    assert len(got) == 2  # nothing new: nothing handed over


def test_without_k_in_the_scheduler_output_the_longest_draft_counted_stands_for_it(tmp_path):
    from tests.controller._fake import controller, publish

    clock = [1000.0]
    p = publish(tmp_path / "pub.json", ranges=[(1, 16, 3)], rates=(0.5, 0.5, 0.5),
                controller={"rebuild_every_steps": 10_000})
    given, missing = controller(p, clock), controller(p, clock)
    # a drafted 2 (kept 1), b drafted 3 but finished in the step (empty output): the k is a's 2
    spec, idx, sampled = {"a": [0, 0], "b": [0, 0, 0]}, {"a": 0, "b": 1}, [[1, 1], []]
    given.on_step(StepOutcome({"a": 1, "b": 1}, spec, idx, sampled, 2, 0, 7, clock[0]))
    missing.on_step(StepOutcome({"a": 1, "b": 1}, spec, idx, sampled, None, 0, 7, clock[0]))
    assert missing._prev_k == missing._cur_k == 2
    assert missing._hist_d == given._hist_d == [0, 0, 1, 0] and missing._hist_a == given._hist_a == [0, 1, 0, 0]

"""The controller on real vLLM (CPU build): the method's claims with a known ground truth.

The controller tests' shared server (tests/controller/conftest.py): tiny target + 1-layer draft
model, K = 3, launch table listing every k (``[[1,1,0],[2,2,1],[3,3,2],[4,16,3]]``), synthetic
acceptance switched at runtime (the CPU plugin) as the known truth, the controller plugin's hooks
(sync on the CPU build; ``PolicyController`` with no baseline policy is ``Controller``) and the
published file named by ``TABLETUNE_PUBLISHED_TABLE``. Each test publishes the next version while
the engine serves 8 closed-loop clients; what is asserted is read from the controller's export.

Unless a test says otherwise the published step times are the synthetic linear profile of
``evaluation.synthetic.linear_profile`` with the live step-time correction off, so "the true-rate table" is the
table ``core.table`` builds from that profile and the true rates. Tolerances (stated): â_1 within
0.05 of the truth, â_2 and â_3 within 0.10 (past the table's k they are seen in exploration steps
only); the table must be one the search picks for some rates in that box (``robust_choices``).
Step bounds are about twice what the fake-engine simulation needs (test_logic.py).
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from tabletune_pipelines.evaluation.rig import Rig, closed_loop
from tabletune_pipelines.evaluation.simulator import quartered
from tabletune_pipelines.evaluation.synthetic import N, linear_profile, true_table
from tests.controller.references import on_robust_table, robust_choices, table_dense

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROFILE = linear_profile()
TOL = (0.05, 0.10, 0.10)
CLIENTS = 8
STALL_PROOF_STEPS = 40000
"""Step budget of a wait for work done at B = CLIENTS: several of the B = 1 spells ``_calibrate``
describes (about 6000 steps each); 40000 steps at B = 1 take 2-3 minutes."""


@pytest.fixture(scope="module")
def rig(controller_rig):
    r = controller_rig((0.3, 0.1, 0.05))
    srv = r.server
    r.log_from = len(r.log())  # the shared server's log before this module (other modules' lines)
    r.first_version = r.publish(ranges=[(1, 16, 3)], rates=(0.9, 0.8, 0.7), controller={"step_time_correction": False})
    # Long requests (96-160 tokens): few admissions, so most steps are clean decode steps at B = 8 even
    # when the clients' threads get little CPU (with 32-64 tokens one run saw 1230 clean steps at B = 1
    # against 236 at B = 8).
    r.load = closed_loop(srv, CLIENTS, max_tokens=(96, 160)).start()
    try:
        yield r
    finally:
        r.load.stop()
        print(f"\n[controller-method] requests sent {r.load.sent}, completed {r.load.completed}, "
              f"errors {len(r.load.errors)}")
        assert not r.load.errors, r.load.errors[:3]


def report(what, hit, mine):
    steps, secs = Rig.steps_into(hit, mine), Rig.seconds_into(hit, mine)
    print(f"\n[{what}] after {steps} steps / {secs:.1f} s: table {hit.controller['table']}, "
          f"â = {[round(x, 3) for x in hit.estimate]}")
    return steps


def within(est, truth, tol=TOL):
    return est is not None and all(abs(a - b) <= t for a, b, t in zip(est, truth, tol))


def test_known_truth_convergence(rig):
    truth = (0.3, 0.1, 0.05)  # the launch's synthetic rates; the prior says (0.9, 0.8, 0.7)
    ok = robust_choices(PROFILE, truth, TOL)
    hit, mine = rig.wait(lambda w: within(w.estimate, truth) and on_robust_table(w.controller["table"], ok),
                         version=rig.first_version, max_steps=2000)
    assert hit is not None, (mine[-1].estimate, mine[-1].controller["table"], ok)
    report("convergence", hit, mine)
    assert hit.controller["table"] != [[1, 16, 3]] and hit.controller["errors"] == 0
    # one INFO line per table change
    assert rig.log()[rig.log_from:].count("TableTune controller: rebuild") >= 2


def test_repair_from_the_table_shrunk_to_a_quarter(rig):
    rates = (0.7, 0.5, 0.3)
    tuned = true_table(PROFILE, rates)
    wrong = quartered(tuned, N)
    assert table_dense(wrong) != table_dense(tuned)
    rig.server.set_synthetic_rates(rates)
    v = rig.publish(ranges=wrong, rates=rates, controller={"step_time_correction": False})
    ok = robust_choices(PROFILE, rates, (0.03, 0.03, 0.03))
    hit, mine = rig.wait(lambda w: on_robust_table(w.controller["table"], ok), version=v, max_steps=400)
    assert hit is not None, (mine[-1].controller["table"], tuned)
    report("repair", hit, mine)
    assert mine[0].controller["table"] == wrong or Rig.steps_into(hit, mine) <= 400


def test_stuck_short_trap_without_and_with_exploration_and_decay(rig):
    low, high = (0.3, 0.1, 0.05), (0.9, 0.8, 0.7)
    short = true_table(PROFILE, low)
    ok = robust_choices(PROFILE, high, TOL)
    rig.server.set_synthetic_rates(high)
    off = {"step_time_correction": False, "prior_decay": False, "exploration_every_steps": 0}
    v = rig.publish(ranges=short, rates=low, controller=off)
    hit, mine = rig.wait(lambda w: on_robust_table(w.controller["table"], ok), version=v, max_steps=1200)
    assert hit is None, "without exploration and prior decay the table should stay short"
    assert all(max(k for _, _, k in w.controller["table"]) <= 1 for w in mine)
    assert all(w.controller["exploration_steps"] == mine[0].controller["exploration_steps"] for w in mine)
    print(f"\n[stuck-short, off] {Rig.steps_into(mine[-1], mine)} steps: table still "
          f"{mine[-1].controller['table']}, â = {[round(x, 3) for x in mine[-1].estimate]}")

    v = rig.publish(ranges=short, rates=low, controller={"step_time_correction": False})  # the defaults: both on
    hit, mine = rig.wait(lambda w: within(w.estimate, high) and on_robust_table(w.controller["table"], ok),
                         version=v, max_steps=2000)
    assert hit is not None, (mine[-1].estimate, mine[-1].controller["table"])
    report("stuck-short, exploration + decay", hit, mine)


def _calibrate(rig, rates, k):
    """True T(B, k) in this launch: observe mode with every batch size at k, the controller's own
    mean of clean step intervals per batch size, ``{B: (ms, clean steps)}`` for the cells it exports."""
    # The published profile is a placeholder here: every step interval counts, whatever this machine's
    # steps take (a few ms on a fast one, hundreds on a slow one).
    v = rig.publish(ranges=[(1, 16, k)], rates=rates, allowed_k=[k],
                    controller={"mode": "observe", "step_time_outlier_ratio": 1000.0})
    # Until 30 clean steps at B = CLIENTS (the batch size the load runs at when no client lags): a
    # total of 300 clean steps was once reached with almost all of them at B = 1, and the test then
    # compared the ks at B = 1, where no profile error up to 60% flips the choice.
    # The budget is counted in steps at every batch size, and on 2 cores the engine runs spells of
    # B = 1 while all 8 clients have a request in flight (vLLM's own log: "Running: 1 reqs, Waiting:
    # 0 reqs" for 20 s; benchmarks/data/cpu/2026-12-04-frontend-stall.log): one such spell is ~6000
    # steps, 1.5x faster than B = 8 steps, and it spent the whole of the old 6000-step budget (13 clean
    # steps at B = 8 in one loop run). So the budget outlasts several spells; a run without one
    # needs a few hundred steps.
    hit, mine = rig.wait(lambda w: _at(w, k, CLIENTS), version=v, max_steps=STALL_PROOF_STEPS)
    assert hit is not None, f"too few clean steps at k = {k}, B = {CLIENTS}: {mine[-1].controller.get('step_time')}"
    # ... and at B = 1, where those spells put the load, so that T_true has the engine's shape from
    # B = 1 up (the test's main function): held flat below B = 8, the profile was 11-28 % too HIGH at
    # B = 1 for k = 2 (live/profile 0.78-0.90 in three runs), the spells' steps there corrected it
    # downwards, and carried to B0 that correction sent B0 back to k = 2 (3 of 8 loop runs failed so;
    # one more, with the island merge off, kept the true k in 24 of 45 windows). One client for as
    # long as it takes.
    if not _at(hit, k, 1):
        rig.load.stop()
        one = closed_loop(rig.server, 1, max_tokens=(96, 160)).start()
        try:
            hit, mine = rig.wait(lambda w: _at(w, k, 1), version=v, max_steps=STALL_PROOF_STEPS)
        finally:
            one.stop()
            rig.load.start()
        assert not one.errors, one.errors[:3]
        assert hit is not None, f"too few clean steps at k = {k}, B = 1: {mine[-1].controller.get('step_time')}"
    cells = hit.controller["step_time"][str(k)]
    return {int(b): (ms, n) for b, ms, n, _ in cells}


def _at(w, k, b, n=30):
    """Whether window ``w`` exports ``n`` or more clean steps at k = ``k``, B = ``b``."""
    return any(int(c[0]) == b and c[2] >= n for c in w.controller.get("step_time", {}).get(str(k), []))


def _first_flip(errors, low_ks, t_true, rates, ks, common, dense_true):
    """The first profile error in ``errors`` (the fraction by which the profile is too low for the
    ks in ``low_ks``) that flips the choice at some batch size in ``common``: (error, wrong T, its
    table, the flipped B); the flipped list is empty when none does."""
    for low in errors:
        t_wrong = {k: {b: t * (1.0 - low if k in low_ks else 1.0) for b, t in row.items()} for k, row in t_true.items()}
        dense_wrong = table_dense(true_table(t_wrong, rates, ks))
        flipped = [b for b in common if dense_wrong[b - 1] != dense_true[b - 1]]
        if flipped:
            break
    return low, t_wrong, dense_wrong, flipped


def test_step_time_correction_with_a_profile_30_percent_low(rig):
    rates = (0.6, 0.02, 0.01)  # a_1 worth a draft, later positions nearly worthless
    rig.server.set_synthetic_rates(rates)
    ks = (1, 2, 3)
    # Calibration rounds in alternating order, the median per k: a burst of load during one k's
    # calibration (one run measured T1 = 10.6 > T2 = T3 = 9.3 ms at B = 8 with the ks one after the
    # other) moves one value, not the comparison. At least three rounds, and more (up to seven) while
    # the medians say a longer draft costs less: one loop run measured k = 1 slower than k = 2 in two
    # of three rounds (T1 = 11.8, T2 = 10.4 ms), each time as the first k of its round.
    rounds: list[dict] = []
    while True:
        rounds.append({k: _calibrate(rig, rates, k) for k in (ks if len(rounds) % 2 == 0 else ks[::-1])})
        # The batch sizes every round measured at every k (30 clean steps or more): where ks are compared.
        common = sorted(b for b in range(1, 17) if all(r[k].get(b, (0, 0))[1] >= 30 for r in rounds for k in ks))
        med = {k: {b: statistics.median(r[k][b][0] for r in rounds) for b in common} for k in ks}
        monotone = med[1][CLIENTS] < med[2][CLIENTS] < med[3][CLIENTS]  # calibrated at CLIENTS in every round
        if len(rounds) >= 3 and (monotone or len(rounds) >= 7):
            break
    # T_true(B, k): this launch's measured T(B, k) over B: the medians at the common B, and the
    # count-weighted mean of the rounds at any other B with 30 clean steps in all, interpolated between
    # them and held beyond. Its shape over B must be the engine's: an invented shape (T(B0) scaled by
    # B) gave every k a profile error of 20-60 % (so the controller trusted none), and T(B0) held flat
    # made k = 2's profile 40 % off at B = 1, whose correction, carried to B0, once sent B0 back to k = 2.
    t_true = {}
    for k in ks:
        pooled = {}
        for b in range(1, 17):
            cells = [r[k][b] for r in rounds if b in r[k]]
            if sum(n for _, n in cells) >= 30:
                pooled[b] = med[k][b] if b in med[k] else sum(ms * n for ms, n in cells) / sum(n for _, n in cells)
        xs = sorted(pooled)
        t_true[k] = {b: float(np.interp(b, xs, [pooled[x] for x in xs])) for b in range(1, 17)}
    served = {b: sum(r[k][b][1] for r in rounds for k in ks) for b in common}
    dense_true = table_dense(true_table(t_true, rates, ks))
    # A profile 30% low for k >= 2. B0: B = CLIENTS, the load's own batch size, where that error flips
    # the choice there; else, of the batch sizes where it flips the choice, the one this launch serves
    # most (most clean calibration steps), where the controller's evidence grows fastest (B = 1, now
    # calibrated on its own, is not a candidate while B = CLIENTS is one: outside the spells the load
    # does not run there). Where this machine's draft cost is such that 30% flips no choice, as much lower as it
    # takes (down to 60% low, still inside the 4x outlier ratio), so the test runs on every machine.
    low_ks = (2, 3)
    low, t_wrong, dense_wrong, flipped = _first_flip((0.3, 0.4, 0.5, 0.6), low_ks, t_true, rates, ks, common,
                                                     dense_true)
    if not flipped:
        # No low error flips a served B when the true table already runs k >= 2 there, that is when a
        # second draft costs this launch almost nothing (one CI run: T(8) = 12.85 / 12.88 / 16.83 ms, so
        # k = 2 led k = 1 by 0.8 %, a tie no controller can be asked to resolve). Then the test asks
        # the same repair the other way round: a_2 raised until k = 2 leads k = 1 by 20 % at CLIENTS
        # (acceptance moves no step time: the same T_true), and the profile too LOW for k = 1 (30 to 60 %),
        # which puts k = 1 where k = 2 is best. The error sits on the k the wrong table runs, as above: a
        # profile too HIGH for k = 2 instead left the error on a k seen only in exploration runs, and one
        # forced run of that form never moved in 10000 steps.
        t1, t2 = t_true[1][CLIENTS], t_true[2][CLIENTS]
        rates = (rates[0], min(rates[0], max(rates[1], (1 + rates[0]) * (1.20 * t2 / t1 - 1.0))), rates[2])
        rig.server.set_synthetic_rates(rates)
        dense_true = table_dense(true_table(t_true, rates, ks))
        low_ks = (1,)
        low, t_wrong, dense_wrong, flipped = _first_flip((0.3, 0.4, 0.5, 0.6), low_ks, t_true, rates, ks, common,
                                                         dense_true)
    assert flipped, f"measured T(B, k) = {med}, rates {rates}: no profile error up to 60% flips the choice at a served B"
    # B0: the clients' batch size where the error flips it (the load's own), else the most served.
    b0 = CLIENTS if CLIENTS in flipped else max(flipped, key=lambda b: served[b])
    m = {k: med[k][b0] for k in ks}
    want_true, want_wrong = dense_true[b0 - 1], dense_wrong[b0 - 1]
    print(f"\n[step time] measured T(B={b0}, k) = {m} ms ({served[b0]} clean calibration steps of "
          f"{sum(served.values())}, {len(rounds)} rounds); rates {rates}; true table k = {want_true}, profile "
          f"{low:.0%} low for k in {low_ks}: k = {want_wrong}")
    start = true_table(t_wrong, rates, ks)

    v = rig.publish(ranges=start, rates=rates, profile=t_wrong, allowed_k=list(ks),
                    controller={"step_time_correction": True})
    # Up to 5000 steps: the table starts on k = 2 at B0, so k = 1's cost there is seen only in exploration
    # runs (3 steps at k = 1 every 100 steps, 2 of them clean, and only those at B0), and the evidence rule
    # moves once the lower bound of k = 1's gain clears the stickiness (one CI run: ~2900 steps on a busy
    # machine; the point-estimate rule moved within 1500 steps, and flipped back). Up to 10000: one loop
    # run with a whole non-engine suite and two other pytest runs beside it (load 6-9 on 2 cores) did not
    # move in 5000, the 8 clients lagging so B0 was served less often than in its calibration. Now
    # the calibration's budget: the spells of B = 1 (``_calibrate``) serve B0 nothing; a passing run
    # had 2000 clean steps at B = 1 (the cell's cap) and 72 at B0 = 8 in this phase.
    hit, mine = rig.wait(lambda w: table_dense(w.controller["table"])[b0 - 1] == want_true, version=v,
                         max_steps=STALL_PROOF_STEPS)
    assert hit is not None, [w.controller["table"] for w in mine]
    at = report("step time, corrected", hit, mine)
    # ... and it stays there: every later window keeps the true k at B0 (the strict rule). Before
    # exploration ran in runs, k = K was never timed and kept its profile, 30% low, which pulled the table
    # back in about half the runs; after that, the per-cell noise of the corrected step times flipped
    # near ties (one CI run: 7 of 8 later windows). A k now changes at a batch size only when the lower
    # confidence bound of its gain clears the stickiness (core.evidence, the offline rule), and a batch
    # size that flips back is held (docs/controller.md, "Flapping").
    _, mine = rig.wait(lambda w: False, version=v, max_steps=at + 800)
    later = [w for w in mine if Rig.steps_into(w, mine) > at]
    kept = [table_dense(w.controller["table"])[b0 - 1] == want_true for w in later]
    g = {k: (1 + sum(rates[:k])) / t_true[k][b0] for k in ks}
    margin = g[want_true] / max(x for k, x in g.items() if k != want_true) - 1
    print(f"  true margin at B = {b0}: k = {want_true} ahead by {margin:.1%}; later windows keeping it "
          f"{sum(kept)}/{len(kept)}; switches {mine[-1].controller['switches']} "
          f"({mine[-1].controller['switches_per_hour']:.0f}/h), reversals {mine[-1].controller['reversals']}")
    assert later
    assert all(kept), ([w.controller["table"] for w in later], {key: mine[-1].controller.get(key) for key in (
        "switches", "reversals", "step_time")})
    print(f"  corrections: {mine[-1].controller['step_time']}")

    v = rig.publish(ranges=start, rates=rates, profile=t_wrong, allowed_k=list(ks),
                    controller={"step_time_correction": False})
    # Without the correction the table never reaches the true k. (It may move among the wrong profile's
    # own near ties: one launch measured T2 = 13.53 and T3 = 13.63 ms, so under the 30%-low profile k = 2
    # and k = 3 tied and acceptance noise picked either.)
    hit, mine = rig.wait(lambda w: table_dense(w.controller["table"])[b0 - 1] == want_true, version=v,
                         max_steps=600)
    assert hit is None, "without the correction the table should not find the true choice"
    ks_seen = sorted({table_dense(w.controller["table"])[b0 - 1] for w in mine})
    print(f"\n[step time, uncorrected] {Rig.steps_into(mine[-1], mine)} steps: k at B = {b0} in {ks_seen}, "
          f"never {want_true}")


#: The table must follow within this many controller steps of a switch of the served acceptance.
FOLLOW_STEPS = 2500


def test_estimate_and_table_follow_a_switch_of_the_served_acceptance(rig):
    """One published version while the acceptance the engine serves switches (the synthetic rates:
    a known truth before and after): the estimate and the table settle on the first rates, then
    leave them for the second within ``FOLLOW_STEPS`` steps, without a new version. The switch goes
    from long drafts to short ones, so every position is drafted before it (the other direction is
    the stuck-short trap, tested above)."""
    before, after = (0.9, 0.8, 0.7), (0.3, 0.1, 0.05)
    ok_before, ok_after = robust_choices(PROFILE, before, TOL), robust_choices(PROFILE, after, TOL)
    assert not any(on_robust_table(t, ok_after) for t in (true_table(PROFILE, before),))
    rig.server.set_synthetic_rates(before)
    v = rig.publish(ranges=true_table(PROFILE, before), rates=before, controller={"step_time_correction": False})
    settled, mine = rig.wait(lambda w: within(w.estimate, before) and on_robust_table(w.controller["table"], ok_before),
                             version=v, max_steps=FOLLOW_STEPS)
    assert settled is not None, (mine[-1].estimate, mine[-1].controller["table"])
    at = Rig.steps_into(mine[-1], mine)
    rig.server.set_synthetic_rates(after)
    switch = mine[-1].window_end  # windows that start after it count only the new acceptance
    hit, mine = rig.wait(lambda w: w.window_start >= switch and within(w.estimate, after)
                         and on_robust_table(w.controller["table"], ok_after), version=v, max_steps=at + FOLLOW_STEPS)
    assert hit is not None, [(w.estimate, w.controller["table"]) for w in mine[-3:]]
    steps = Rig.steps_into(hit, mine) - at
    print(f"\n[switch] table {settled.controller['table']} -> {hit.controller['table']} within {steps} steps "
          f"(â {[round(x, 3) for x in settled.estimate]} -> {[round(x, 3) for x in hit.estimate]})")
    assert hit.controller["table"] != settled.controller["table"] and hit.controller["errors"] == 0

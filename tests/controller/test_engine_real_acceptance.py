"""Traffic switch with real acceptance, on real vLLM (CPU build) and a real model: n-gram drafting on
SmolLM2-135M-Instruct (``engine/real_model.py``), the traffic switched mid-run from short code
completions (HumanEval, 32-48 tokens) to long writing requests (WritingBench English requests,
192-256 tokens: ``prompt_mixes``); the estimate and the table follow.

The session's real-model server (``real_model_server``, tests/conftest.py): the real model,
``method: ngram`` (prompt lookup 2..4), K = 3, real verification (no synthetic rates),
``--scheduler-cls ...AsyncControllerScheduler``; greedy decoding that stops at the model's end of
turn like a served request. Phase 1: 8 clients send HumanEval prompts; phase
2: WritingBench prompts. Nothing about either phase's acceptance is set by the test: "the truth" of
a phase is its own acceptance counted in the controller's windows of the phase's second half
(drafted/accepted per position). Tolerance (stated): â within (0.06, 0.08, 0.10) of it, or 3
standard errors where the phase drafts too little for that or â spreads wider from window to window
(``tolerance``), and the table one the search picks for rates in that box; over the prose phase's
second half, â's mean lies nearer prose's acceptance than code's. Phases are counted in engine
steps, so the test does the same work on any machine. The published step times are a synthetic
linear profile whose table depends on a_1..a_3 where the two phases' rates lie (step-time correction
off, so the table follows acceptance only); the test checks the two phases' real rates give
different tables under it before asking the controller to follow.

The effect the test must see, and its size (``PHASE_STEPS``): n-gram acceptance rises with the length of
the answer (a small model repeats itself later in an answer, docs/usage.md), so short code answers
and long writing answers differ by far more than the two mixes at one length. Measured on this
build (2026-12-06, native bf16, 48 prompts a sample, 3 samples each): code at 48 tokens a =
(0.60-0.71, 0.47-0.60, 0.38-0.50), prose at 256 tokens a = (0.78-0.81, 0.69-0.74, 0.64-0.68). At one
length (128 tokens) they differ by 0.03-0.09, which a run of this length could not always tell from
noise (a CI run saw 2.2 standard errors).
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone

import pytest

from tabletune_pipelines.evaluation.rig import Rig, closed_loop
from tabletune_pipelines.evaluation.synthetic import linear_profile, true_table
from tests.controller.references import on_robust_table, robust_choices, table_dense

# The whole-test limit is a last resort (Rig.wait_steps guards stalls): this test took 1424 s alone on an
# AVX2-only float32 machine (2026-12-03), too near the 1500 s it had.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(3000)]

#: Both phases' tables differ wherever their rates lie: for code's a in (0.58, 0.44, 0.34)..(0.72, 0.60,
#: 0.50) the search (``true_table``) drafts k = 3 up to B = 8..14 and k = 2 (then 1) above; for prose's a
#: from (0.74, 0.64, 0.56) up, k = 3 at every B = 1..16. So the code phase drafts k = 3 at most steps of
#: the operating batch (8 clients, B <= 8) and measures a_1..a_3 from its own drafts, and the table has
#: somewhere to go at the switch.
PROFILE = linear_profile(c0=4.0, c1=0.1, d0=0.1, d1=0.14)
#: The phases' difference the test is sized for: 0.15 at some position (measured 0.10-0.30 at a_1..a_3,
#: module docstring), seen through window batch means (``phase_difference``): a window holds ~10
#: requests, and prose's windows spread widely (â at a_3 from 0.52 to 0.69 in one run), so prose's
#: phase sets the error. One run with second halves of 500 and 700 steps read z = 3.8, 4.5, 4.9
#: (2026-12-06); the prose phase is 1800 steps (900 in its second half) to put the expected z near
#: 5.5 (two runs read 5.6 and 5.3 at a_3), where z at a_3 alone falls below 3 in about 1 run of 160.
TOL = (0.06, 0.08, 0.10)
PHASE_STEPS = (1000, 1800)  # engine steps of the code and the prose phase
#: A stall guard only (phases are counted in steps; ``Rig.wait_steps``: the longest wait with no new
#: step exported): ~9 steps/s at 8 clients on a 2-core native-bf16 machine, 2-4 on an AVX2-only one.
STALL_S = 300.0
#: max_tokens of the two phases' requests (drawn uniformly in the range).
CODE_TOKENS, PROSE_TOKENS = (32, 48), (192, 256)
#: The table must follow within this many controller steps of the switch (stated in the issue's note).
FOLLOW_STEPS = 2500


def mix_prompt(name):
    from tabletune_pipelines.formats.prompt_mixes import load_mix

    prompts = load_mix(name)
    return lambda rng: rng.choice(prompts)


def tolerance(windows, rates):
    """How close â must be to a phase's truth: the stated tolerance, or 3 standard errors of the
    estimate where its evidence is thinner, whichever is wider. Two measures of that error, the
    wider kept: (1) binomial on the drafts: the controller halves its live counts at every rebuild
    (one window), so â rests on about twice a window's drafts; a mix on which n-gram lookup finds
    few matches drafts only tens of times a window (â then wanders by ±0.05); (2) â's own spread
    over the phase's windows. Drafts are not independent draws: a window holds ~25 requests, and a
    prompt's acceptance is its own (a repetitive prompt accepts nearly every draft), so â spreads
    more than (1) says. In a CI run the prose phase's â at a_3 read 0.534, 0.463, 0.533 in its last
    three windows, against a binomial error of ~0.018."""
    out = []
    for i, (t, r) in enumerate(zip(TOL, rates)):
        n = 2 * statistics.median(w.drafted_per_pos[i] for w in windows)
        spread = statistics.stdev(w.estimate[i] for w in windows) if len(windows) > 1 else 0.0
        out.append(max(t, 3 * math.sqrt(max(r * (1 - r), 0.05) / max(n, 1)), 3 * spread))
    return tuple(out)


def nearer(estimates, rates, other):
    """The mean of ``estimates`` lies nearer ``rates`` than ``other`` (Euclidean, over a_1..a_3)."""
    mean = [statistics.fmean(e[i] for e in estimates) for i in range(len(rates))]
    return math.dist(mean, rates) < math.dist(mean, other)


def phase_rates(windows):
    d = [sum(w.drafted_per_pos[i] for w in windows) for i in range(3)]
    a = [sum(w.accepted_per_pos[i] for w in windows) for i in range(3)]
    rates, prev = [], 1.0
    for di, ai in zip(d, a):
        prev = min(prev, ai / di if di else 0.0)
        rates.append(prev)
    return tuple(rates), d


def phase_difference(one, two):
    """Per position, |difference of the two phases' rates| in standard errors, each phase's error by
    batch means over its windows (``acceptance_ci.group_standard_errors``) and never below the
    binomial error of its counts."""
    from tabletune_pipelines.core.acceptance_ci import group_standard_errors

    (r1, d1), (r2, d2) = phase_rates(one), phase_rates(two)
    ses = group_standard_errors(one), group_standard_errors(two)
    z = []
    for i in range(len(r1)):
        var = sum(max(se[i][1] ** 2, r[i] * (1 - r[i]) / max(d[i], 1)) for se, r, d in zip(ses, (r1, r2), (d1, d2)))
        z.append(abs(r1[i] - r2[i]) / math.sqrt(var) if var > 0 else 0.0)
    return z


def test_estimate_and_table_follow_a_traffic_switch(real_model_server):
    srv, ident = real_model_server.server, real_model_server.identity
    rig = Rig(srv, real_model_server.published, method="ngram")
    prior = (0.5, 0.4, 0.3)
    v = rig.publish(ranges=true_table(PROFILE, prior), rates=prior, profile=PROFILE, identity=ident,
                    controller={"step_time_correction": False})
    load = closed_loop(srv, 8, prompt=mix_prompt("code"), ignore_eos=False, max_tokens=CODE_TOKENS).start()
    try:
        # Phases in engine steps, not seconds (a slower machine runs them longer, not shorter). The
        # switch is taken once the first mix's requests have all finished, so no window after it
        # carries them.
        rig.wait_steps(PHASE_STEPS[0], timeout=STALL_S)
        load.stop()
        switch = datetime.now(timezone.utc)
        load.prompt, load.output_tokens = mix_prompt("prose"), PROSE_TOKENS
        load.start()
        rig.wait_steps(PHASE_STEPS[1], timeout=STALL_S)
    finally:
        load.stop()
    assert load.errors == [] and load.completed == load.sent
    ws = [w for w in rig.windows() if w.table_version == v]
    one = [w for w in ws if w.window_end <= switch]
    two = [w for w in ws if w.window_start >= switch]
    r1, d1 = phase_rates(one[len(one) // 2:])
    r2, d2 = phase_rates(two[len(two) // 2:])
    print(f"\n[traffic] code (HumanEval): a = {[round(x, 3) for x in r1]} (drafted {d1}); "
          f"prose (WritingBench): a = {[round(x, 3) for x in r2]} (drafted {d2})")
    # The change is real, not noise: at some position the two phases' rates differ by more than 3
    # standard errors, taken from the windows (batch means: a prompt's drafts are correlated, so a
    # binomial error on the counts is too small, docs/usage.md).
    z = phase_difference(one[len(one) // 2:], two[len(two) // 2:])
    print(f"[traffic] phase difference in standard errors: {[round(x, 1) for x in z]}")
    tol1, tol2 = tolerance(one[len(one) // 2:], r1), tolerance(two[len(two) // 2:], r2)
    print(f"[traffic] tolerance: code {[round(t, 3) for t in tol1]}, prose {[round(t, 3) for t in tol2]}")
    ok1, ok2 = robust_choices(PROFILE, r1, tol1), robust_choices(PROFILE, r2, tol2)
    apart = max(z) > 3 and table_dense(true_table(PROFILE, r1)) != table_dense(true_table(PROFILE, r2))
    if not apart and ident["dtype"] == "float32":
        # On the float32 path (AVX2-only CPUs) the model writes other text; where the two phases draft
        # alike there, one table serves both and there is no switch to follow. Not a pass: a skip.
        pytest.skip(f"float32 path: the real mixes gave a = {[round(x, 3) for x in r1]} and "
                    f"{[round(x, 3) for x in r2]} (z = {[round(x, 1) for x in z]}), the same table: no switch")
    # The change is real, not noise, and the table has somewhere to go: native bf16 (the CI machine kind).
    assert max(z) > 3, f"short code and long prose answers should differ in acceptance (z = {z})"
    assert table_dense(true_table(PROFILE, r1)) != table_dense(true_table(PROFILE, r2))

    def settled(w, rates, ok, tol):
        return all(abs(a - b) <= t for a, b, t in zip(w.estimate, rates, tol)) and on_robust_table(
            w.controller["table"], ok)

    print("[traffic] â and table in the prose phase's windows: "
          + " ".join(f"{[round(x, 3) for x in w.estimate]} {w.controller['table']}" for w in two))
    end1 = one[-1]
    assert settled(end1, r1, ok1, tol1), (end1.estimate, end1.controller["table"])
    # Followed: a window whose estimate has left the old traffic's (nearer the new one) and settled on the
    # new, on a table other than the old traffic's (prose's wide tolerance alone would admit the old one).
    hit = next((w for w in two if nearer([w.estimate], r2, r1) and settled(w, r2, ok2, tol2)
                and w.controller["table"] != end1.controller["table"]), None)
    assert hit is not None, [(w.estimate, w.controller["table"]) for w in two[-3:]]
    steps = hit.controller["steps"] - end1.controller["steps"]
    secs = (hit.window_end - switch).total_seconds()
    print(f"[traffic] table {end1.controller['table']} -> {hit.controller['table']} within {steps} steps, "
          f"{secs:.1f} s of the switch (â {[round(x, 3) for x in end1.estimate]} -> "
          f"{[round(x, 3) for x in hit.estimate]})")
    assert steps <= FOLLOW_STEPS
    # ... and it stays with the new traffic: every late window settled on it (within â's own error, on
    # its table), and â over the phase's second half nearer its acceptance than the old one's. Not each
    # window nearer: prose's â spreads from window to window by nearly the phases' difference (a_3 from
    # 0.53 to 0.69 over one run's late windows). A controller that did not follow keeps â at the old
    # traffic's, and fails both.
    late = two[len(two) // 2:]
    assert all(settled(w, r2, ok2, tol2) for w in two[-3:]), [(w.estimate, w.controller["table"]) for w in two[-3:]]
    assert nearer([w.estimate for w in late], r2, r1), ([w.estimate for w in late], r1, r2)

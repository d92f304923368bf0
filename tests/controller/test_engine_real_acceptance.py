"""The controller correcting a wrong prior from real drafts, on real vLLM (CPU build) and a real model:
n-gram drafting on SmolLM2-135M-Instruct (``engine/real_model.py``) answering short code completions
(HumanEval, 32-48 tokens), under the production plugin's asynchronous scheduler
(``AsyncControllerScheduler``) doing real control.

The session's real-model server (``real_model_server``, tests/conftest.py): the real model,
``method: ngram`` (prompt lookup 2..4), K = 3, real verification (no synthetic rates); greedy
decoding that stops at the model's end of turn like a served request. 8 clients send HumanEval
prompts for ``PHASE_STEPS`` engine steps under a published prior of (0.9, 0.85, 0.8), far above
what n-gram lookup keeps on code. Nothing about the acceptance is set by the test: "the truth" is
the phase's own acceptance counted in the controller's windows of its second half (drafted/accepted
per position). Tolerance (stated): â within (0.06, 0.08, 0.10) of it, or 3 standard errors where
the phase drafts too little for that or â spreads wider from window to window (``tolerance``), and
the table one the search picks for rates in that box. The published step times are a synthetic
linear profile whose table depends on a_1..a_3 where code's rates lie (step-time correction off, so
the table follows acceptance only): the prior's table drafts k = 3 everywhere, code's rates give
k = 2 at the top batch sizes, so the controller has somewhere to go.

That the real mixes' acceptance differs (short code answers against long prose ones) is measured,
with a power-sized sample, by tests/engine/test_real_model.py; that the estimate and the table follow
a switch of the served acceptance within one published version is tested with the synthetic rates
of the controller tests' shared server (test_engine_method.py,
``test_estimate_and_table_follow_a_switch_of_the_served_acceptance``). Measured on this build
(2026-12-06, native bf16, 48 prompts a sample, 3 samples each): code at 48 tokens a =
(0.60-0.71, 0.47-0.60, 0.38-0.50).
"""

from __future__ import annotations

import math
import statistics

import pytest

from tabletune_pipelines.evaluation.rig import Rig, closed_loop
from tabletune_pipelines.evaluation.synthetic import linear_profile, true_table
from tests.controller.references import on_robust_table, robust_choices, table_dense

# The whole-test limit is a last resort (Rig.wait_steps guards stalls): 1000 steps at 2-4 steps/s on an
# AVX2-only float32 machine take up to ~8 minutes.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

#: Code's a in (0.58, 0.44, 0.34)..(0.72, 0.60, 0.50) gives k = 3 up to B = 10..15 and k = 2 above
#: (``true_table``); the prior ``PRIOR`` gives k = 3 at every B = 1..16. So the load (8 clients, B <= 8)
#: drafts k = 3 at most steps and measures a_1..a_3 from its own drafts, and the table has somewhere to go.
PROFILE = linear_profile(c0=4.0, c1=0.1, d0=0.1, d1=0.14)
PRIOR = (0.9, 0.85, 0.8)
TOL = (0.06, 0.08, 0.10)
#: Engine steps of the code phase: the length of the first phase of a two-phase switch run that left the
#: controller settled on code's acceptance from a prior 0.15 below it.
PHASE_STEPS = 1000
#: A stall guard only (phases are counted in steps; ``Rig.wait_steps``: the longest wait with no new
#: step exported): ~9 steps/s at 8 clients on a 2-core native-bf16 machine, 2-4 on an AVX2-only one.
STALL_S = 300.0
#: max_tokens of the requests (drawn uniformly in the range).
CODE_TOKENS = (32, 48)


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
    more than (1) says (long prose answers' â at a_3 read 0.534, 0.463, 0.533 in three late windows
    of one run, against a binomial error of ~0.018)."""
    out = []
    for i, (t, r) in enumerate(zip(TOL, rates)):
        n = 2 * statistics.median(w.drafted_per_pos[i] for w in windows)
        spread = statistics.stdev(w.estimate[i] for w in windows) if len(windows) > 1 else 0.0
        out.append(max(t, 3 * math.sqrt(max(r * (1 - r), 0.05) / max(n, 1)), 3 * spread))
    return tuple(out)


def phase_rates(windows):
    d = [sum(w.drafted_per_pos[i] for w in windows) for i in range(3)]
    a = [sum(w.accepted_per_pos[i] for w in windows) for i in range(3)]
    rates, prev = [], 1.0
    for di, ai in zip(d, a):
        prev = min(prev, ai / di if di else 0.0)
        rates.append(prev)
    return tuple(rates), d


def test_the_async_controller_corrects_a_wrong_prior_from_real_drafts(real_model_server):
    srv, ident = real_model_server.server, real_model_server.identity
    rig = Rig(srv, real_model_server.published, method="ngram")
    start = true_table(PROFILE, PRIOR)
    v = rig.publish(ranges=start, rates=PRIOR, profile=PROFILE, identity=ident,
                    controller={"step_time_correction": False})
    load = closed_loop(srv, 8, prompt=mix_prompt("code"), ignore_eos=False, max_tokens=CODE_TOKENS).start()
    try:
        rig.wait_steps(PHASE_STEPS, timeout=STALL_S)  # engine steps, not seconds
    finally:
        load.stop()
    assert load.errors == [] and load.completed == load.sent
    ws = [w for w in rig.windows() if w.table_version == v]
    late = ws[len(ws) // 2:]
    rates, drafted = phase_rates(late)
    tol = tolerance(late, rates)
    ok = robust_choices(PROFILE, rates, tol)
    print(f"\n[real drafts] code (HumanEval): a = {[round(x, 3) for x in rates]} (drafted {drafted}), "
          f"tolerance {[round(t, 3) for t in tol]}; table {start} -> {ws[-1].controller['table']}, "
          f"â {[round(x, 3) for x in ws[-1].estimate]}")
    if ident["dtype"] == "float32" and table_dense(true_table(PROFILE, rates)) == table_dense(start):
        # On the float32 path (AVX2-only CPUs) the model writes other text; where code keeps as many
        # drafts as the prior says there, the prior's table is right and nothing has to move.
        pytest.skip(f"float32 path: code's a = {[round(x, 3) for x in rates]} gives the prior's table")
    # The table has somewhere to go: code's own rates give another table than the prior's (native bf16).
    assert table_dense(true_table(PROFILE, rates)) != table_dense(start), rates
    end = ws[-1]
    assert all(abs(a - b) <= t for a, b, t in zip(end.estimate, rates, tol)), (end.estimate, rates, tol)
    assert on_robust_table(end.controller["table"], ok), (end.controller["table"], ok)
    assert end.controller["errors"] == 0

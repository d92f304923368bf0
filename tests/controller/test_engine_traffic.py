"""Traffic switch with real acceptance, on real vLLM (CPU build) and a real model: n-gram drafting on
SmolLM2-135M-Instruct (``engine/real_model.py``), the prompt mix switched mid-run from code
(HumanEval) to prose (WritingBench English requests: ``prompt_mixes``); the estimate and the table follow.

ONE server: the real model, ``method: ngram`` (prompt lookup 2..4), K = 3, real verification (no
synthetic rates), greedy decoding that stops at the model's end of turn like a served request,
``--scheduler-cls ...AsyncControllerScheduler``. Phase 1: 8 clients send HumanEval prompts; phase
2: WritingBench prompts. Nothing about either phase's acceptance is set by the test: "the truth" of
a phase is its own acceptance counted in the controller's windows of the phase's second half
(drafted/accepted per position). Tolerance (stated): â within (0.06, 0.08, 0.10) of it, or 3
standard errors where the phase drafts too little for that or â spreads wider from window to window
(``tolerance``), and the table one the search picks for rates in that box; over the prose phase's
second half, â's mean lies nearer prose's acceptance than code's. Phases are counted in engine
steps, so the test does the same work on any machine. The published step times are a synthetic
linear profile whose table depends on a_1..a_3 where the two real mixes lie (step-time correction
off, so the table follows acceptance only); the test checks the two phases' real rates give
different tables under it before asking the controller to follow.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone

import pytest

from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
from tabletune_pipelines.engine import ServerConfig, VLLMServer
from tabletune_pipelines.evaluation.rig import SCHEDULER, Rig, closed_loop
from tabletune_pipelines.evaluation.synthetic import IDENTITY, LAUNCH, linear_profile, true_table
from tests.controller.references import on_robust_table, robust_choices, table_dense

# The whole-test limit is a last resort (Rig.wait_steps guards stalls): this test took 1424 s alone on an
# AVX2-only float32 machine (2026-12-03), too near the 1500 s it had.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(3000)]

#: k is cheap enough that the operating batch (8 clients, B <= 8) drafts k = 3 under both mixes, so both
#: phases measure a_1..a_3 from thousands of drafts. Code's k = 3 range ends at B = 8..13 for its a_3
#: anywhere in 0.37..0.46; prose's (a_3 ~0.50..0.55) covers B = 1..16: the table changes above the
#: operating batch, where code's k = 2 becomes k = 3 (both mixes measured here, docs/usage.md). An earlier
#: profile put code's boundary at B = 7..8: the code phase then ran k = 2 at B = 8, drafted k = 3 only
#: when B dipped below 8 (155 third drafts a run, twice), its a_3 rested on those, and the two phases
#: could not be told apart (2.2 and 2.7 standard errors at a_3, 2.9 and 2.3 at a_2).
PROFILE = linear_profile(c0=4.0, c1=0.3, d0=0.1, d1=0.115)
TOL = (0.06, 0.08, 0.10)
PHASE_STEPS = (1500, 2000)  # engine steps of the code and the prose phase
#: A stall guard only (phases are counted in steps; ``Rig.wait_steps``: the longest wait with no new
#: step exported): ~9 steps/s at 8 clients on a 2-core native-bf16 machine, 2-4 on an AVX2-only one.
STALL_S = 300.0
#: The table must follow within this many controller steps of the switch (stated in the issue's note).
FOLLOW_STEPS = 2500


def real_server(tmp_path, published):
    from tabletune_pipelines.engine.real_model import MAX_MODEL_LEN, ensure_real_model

    m = ensure_real_model()  # the venv's one conversion, shared with tests/engine/test_real_model.py
    cfg = ServerConfig(
        model=str(m.model_dir), method="ngram", num_speculative_tokens=3, table=tuple(LAUNCH), max_num_seqs=16,
        max_model_len=MAX_MODEL_LEN, dtype=m.dtype, work_dir=str(tmp_path), step_timing=False,
        extra_args=("--scheduler-cls", SCHEDULER + "AsyncControllerScheduler"),
        speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2}, extra_env={PUBLISHED_ENV: str(published)})
    return VLLMServer(cfg), dict(IDENTITY, model=str(m.model_dir), drafter=None, method="ngram", dtype=m.dtype)


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


def test_estimate_and_table_follow_a_traffic_switch(tmp_path):
    pub = tmp_path / "local.json"
    srv, ident = real_server(tmp_path, pub)
    rig = Rig(srv, pub, tmp_path / "local.live.jsonl", method="ngram")
    prior = (0.5, 0.4, 0.3)
    rig.publish(ranges=true_table(PROFILE, prior), rates=prior, profile=PROFILE, identity=ident,
                controller={"step_time_correction": False})
    srv.start()
    load = closed_loop(srv, 8, prompt=mix_prompt("code"), ignore_eos=False, max_tokens=(96, 128)).start()
    try:
        # Phases in engine steps, not seconds (a slower machine runs them longer, not shorter): about
        # 16 s and 22 s of this 2-core machine at 8 clients. The switch is taken once the first mix's
        # requests have all finished, so no window after it carries them.
        rig.wait_steps(PHASE_STEPS[0], timeout=STALL_S)
        load.stop()
        switch = datetime.now(timezone.utc)
        load.prompt = mix_prompt("prose")
        load.start()
        rig.wait_steps(PHASE_STEPS[1], timeout=STALL_S)
    finally:
        load.stop()
        srv.stop()
    assert load.errors == [] and load.completed == load.sent
    ws = [w for w in rig.windows() if w.table_version == 1]
    one = [w for w in ws if w.window_end <= switch]
    two = [w for w in ws if w.window_start >= switch]
    r1, d1 = phase_rates(one[len(one) // 2:])
    r2, d2 = phase_rates(two[len(two) // 2:])
    print(f"\n[traffic] code (HumanEval): a = {[round(x, 3) for x in r1]} (drafted {d1}); "
          f"prose (WritingBench): a = {[round(x, 3) for x in r2]} (drafted {d2})")
    # The change is real, not noise: at some position the two phases' rates differ by more than 3
    # standard errors of their counts (binomial on the windows' drafts; the real mixes differ by a few
    # hundredths here, docs/usage.md, "The embedded default: a real model on real prompts").
    se = [math.sqrt(a * (1 - a) / max(n, 1) + b * (1 - b) / max(m, 1)) for a, b, n, m in zip(r1, r2, d1, d2)]
    z = [abs(a - b) / s if s > 0 else 0.0 for a, b, s in zip(r1, r2, se)]
    print(f"[traffic] phase difference in standard errors: {[round(x, 1) for x in z]}")
    tol1, tol2 = tolerance(one[len(one) // 2:], r1), tolerance(two[len(two) // 2:], r2)
    print(f"[traffic] tolerance: code {[round(t, 3) for t in tol1]}, prose {[round(t, 3) for t in tol2]}")
    ok1, ok2 = robust_choices(PROFILE, r1, tol1), robust_choices(PROFILE, r2, tol2)
    apart = max(z) > 3 and table_dense(true_table(PROFILE, r1)) != table_dense(true_table(PROFILE, r2))
    if not apart and ident["dtype"] == "float32":
        # On the float32 path (AVX2-only CPUs) the model writes other text, and the two mixes drafted
        # alike under n-gram lookup: a = (0.713, 0.556, 0.515) and (0.710, 0.597, 0.528), one table for
        # both on this profile, so there is no switch to follow. Not a pass: reported as a skip.
        pytest.skip(f"float32 path: the real mixes gave a = {[round(x, 3) for x in r1]} and "
                    f"{[round(x, 3) for x in r2]} (z = {[round(x, 1) for x in z]}), the same table: no switch")
    # The change is real, not noise, and the table has somewhere to go: native bf16 (the CI machine kind).
    assert max(z) > 3, "the two real prompt mixes should differ in acceptance"
    assert table_dense(true_table(PROFILE, r1)) != table_dense(true_table(PROFILE, r2))

    def settled(w, rates, ok, tol):
        return all(abs(a - b) <= t for a, b, t in zip(w.estimate, rates, tol)) and on_robust_table(
            w.controller["table"], ok)

    print("[traffic] â in the prose phase's windows: "
          + " ".join(str([round(x, 3) for x in w.estimate]) for w in two))
    end1 = one[-1]
    assert settled(end1, r1, ok1, tol1), (end1.estimate, end1.controller["table"])
    # Followed: a window whose estimate has left the old traffic's (nearer the new one) and settled on the new.
    hit = next((w for w in two if nearer([w.estimate], r2, r1) and settled(w, r2, ok2, tol2)), None)
    assert hit is not None, [(w.estimate, w.controller["table"]) for w in two[-3:]]
    steps = hit.controller["steps"] - end1.controller["steps"]
    secs = (hit.window_end - switch).total_seconds()
    print(f"[traffic] table {end1.controller['table']} -> {hit.controller['table']} within {steps} steps, "
          f"{secs:.1f} s of the switch (â {[round(x, 3) for x in end1.estimate]} -> "
          f"{[round(x, 3) for x in hit.estimate]})")
    assert steps <= FOLLOW_STEPS
    # ... and it stays with the new traffic: every late window settled on it (within â's own error, on
    # its table), and â over the phase's second half nearer its acceptance than the old one's. Not each
    # window nearer: the mixes differ by 0.01-0.07 a position, less than â's window-to-window spread
    # (a CI run failed that way: a window at (0.665, 0.542, 0.463), with the mixes at (0.707, 0.558,
    # 0.463) and (0.696, 0.599, 0.530), the windows around it nearer prose). A controller that did not
    # follow keeps â at the old traffic's, and fails both.
    late = two[len(two) // 2:]
    assert all(settled(w, r2, ok2, tol2) for w in two[-3:]), [(w.estimate, w.controller["table"]) for w in two[-3:]]
    assert nearer([w.estimate for w in late], r2, r1), ([w.estimate for w in late], r1, r2)

"""Traffic switch with real acceptance, on real vLLM (CPU build): n-gram drafting, the prompt mix
switched mid-run from highly repetitive to non-repetitive; the estimate and the table follow.

ONE server: tiny target, ``method: ngram`` (prompt lookup 2..4), K = 3, real verification (no
synthetic rates), ``--scheduler-cls ...AsyncControllerScheduler``. Phase 1: 8 clients send prompts
made of a short random pattern repeated; phase 2: prompts of random tokens. (The random-weight
target loops at temperature 0 whatever the prompt, so n-gram acceptance stays non-zero in phase 2,
only lower; sampled output would stop n-gram drafting altogether.) "The truth" of a phase is its
own acceptance counted in the controller's windows of the phase's second half (drafted/accepted per
position). Tolerance (stated): â within (0.06, 0.08, 0.10) of it, or 3 standard errors where the
phase drafts too little for that (``tolerance``), and the table one the search picks for rates in
that box. Phases are counted in engine steps, so the test does the same work on any machine. The published step times are a synthetic linear profile whose table
depends on a_2, a_3 in this range (step-time correction off, so the table follows acceptance only).
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone

import pytest

from tabletune_pipelines.engine import VLLMServer
from tests.controller._engine import Load, Rig, server_config
from tests.controller._fake import linear_profile, on_robust_table, robust_choices, table_dense, true_table

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROFILE = linear_profile(c0=4.0, c1=1.0, d0=0.1, d1=0.2)
TOL = (0.06, 0.08, 0.10)
PHASE_STEPS = (1500, 2800)  # engine steps of the repetitive and the non-repetitive phase


def repetitive(rng):
    pattern = [rng.randrange(3, 2000) for _ in range(rng.randint(3, 6))]
    return (pattern * 20)[:48]


def random_tokens(rng):
    return [rng.randrange(3, 2000) for _ in range(48)]


def tolerance(windows, rates):
    """How close â must be to a phase's truth: the stated tolerance, or 3 standard errors of the
    estimate where its evidence is thinner. The controller halves its live counts at every rebuild
    (one window), so â rests on about twice a window's drafts; with the random-weight target the
    non-repetitive mix sometimes drafts only ~50 times a window (â then wanders by ±0.05), and how
    often depends on the kernels' numerics, not on the controller."""
    out = []
    for i, (t, r) in enumerate(zip(TOL, rates)):
        n = 2 * statistics.median(w.drafted_per_pos[i] for w in windows)
        out.append(max(t, 3 * math.sqrt(max(r * (1 - r), 0.05) / max(n, 1))))
    return tuple(out)


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
    srv = VLLMServer(server_config(tmp_path, pub, method="ngram", rates=None, cls="AsyncControllerScheduler",
                                   speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2}))
    rig = Rig(srv, pub, tmp_path / "local.live.jsonl", method="ngram")
    prior = (0.5, 0.4, 0.3)
    rig.publish(ranges=true_table(PROFILE, prior), rates=prior, profile=PROFILE,
                controller={"step_time_correction": False})
    srv.start()
    load = Load(srv, 8, prompt=repetitive).start()
    try:
        # Phases in engine steps, not seconds (a slower machine runs them longer, not shorter): about
        # 16 s and 22 s of this 2-core machine at 8 clients. The switch is taken once the first mix's
        # requests have all finished, so no window after it carries them.
        rig.wait_steps(PHASE_STEPS[0])
        load.stop()
        switch = datetime.now(timezone.utc)
        load.prompt = random_tokens
        load.start()
        rig.wait_steps(PHASE_STEPS[1])
    finally:
        load.stop()
        srv.stop()
    assert load.errors == [] and load.completed == load.sent
    ws = [w for w in rig.windows() if w.table_version == 1]
    one = [w for w in ws if w.window_end <= switch]
    two = [w for w in ws if w.window_start >= switch]
    r1, d1 = phase_rates(one[len(one) // 2:])
    r2, d2 = phase_rates(two[len(two) // 2:])
    print(f"\n[traffic] repetitive: a = {[round(x, 3) for x in r1]} (drafted {d1}); "
          f"non-repetitive: a = {[round(x, 3) for x in r2]} (drafted {d2})")
    assert max(abs(a - b) for a, b in zip(r1, r2)) > 0.1, "the two prompt mixes should differ in acceptance"
    tol1, tol2 = tolerance(one[len(one) // 2:], r1), tolerance(two[len(two) // 2:], r2)
    print(f"[traffic] tolerance: repetitive {[round(t, 3) for t in tol1]}, non-repetitive {[round(t, 3) for t in tol2]}")
    ok1, ok2 = robust_choices(PROFILE, r1, tol1), robust_choices(PROFILE, r2, tol2)
    assert table_dense(true_table(PROFILE, r1)) != table_dense(true_table(PROFILE, r2))

    def settled(w, rates, ok, tol):
        return all(abs(a - b) <= t for a, b, t in zip(w.estimate, rates, tol)) and on_robust_table(
            w.controller["table"], ok)

    def nearer(w, rates, other):
        return max(abs(a - b) for a, b in zip(w.estimate, rates)) < max(abs(a - b) for a, b in zip(w.estimate, other))

    end1 = one[-1]
    assert settled(end1, r1, ok1, tol1), (end1.estimate, end1.controller["table"])
    # Followed: a window whose estimate has left the old traffic's (nearer the new one) and settled on the new.
    hit = next((w for w in two if nearer(w, r2, r1) and settled(w, r2, ok2, tol2)), None)
    assert hit is not None, [(w.estimate, w.controller["table"]) for w in two[-3:]]
    steps = hit.controller["steps"] - end1.controller["steps"]
    secs = (hit.window_end - switch).total_seconds()
    print(f"[traffic] table {end1.controller['table']} -> {hit.controller['table']} within {steps} steps, "
          f"{secs:.1f} s of the switch (â {[round(x, 3) for x in end1.estimate]} -> "
          f"{[round(x, 3) for x in hit.estimate]})")
    assert steps <= 2500
    # ... and it stays with the new traffic: nearer its acceptance than the old one's, on its table.
    assert all(nearer(w, r2, r1) and settled(w, r2, ok2, tol2) for w in two[-3:]), \
        [(w.estimate, w.controller["table"]) for w in two[-3:]]

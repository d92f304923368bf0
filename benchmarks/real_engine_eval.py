"""Every policy's closed-loop goodput on real vLLM (CPU build), side by side (docs/evaluation.md,
"Real engine").

    python benchmarks/real_engine_eval.py                  # full run, ~30-35 min on 2 cores
    python benchmarks/real_engine_eval.py --quick          # smoke run (minutes; not for claims)
    python benchmarks/evaluate.py --real-only              # re-render benchmarks/simulator.md's real-engine part
    python benchmarks/report.py                            # re-render docs/results.md

Engine: the medium tiny target (12 layers, hidden 1024, made locally by
``engine.tiny_models``), launch K = 3, max_num_seqs 16, launch table ``[[1,1,0],[2,2,1],[3,3,2],
[4,16,3]]`` (lists every k, so k can be switched at runtime). Two acceptance scenarios:

* ``synthetic``: the 1-layer draft model (``draft_model``) with synthetic acceptance
  (0.7, 0.5, 0.3) — known rates. Prompts of 16-64 random token ids.
* ``ngram``: n-gram drafting (prompt lookup 2..4) with real verification, on the embedded
  default's prompt set (``engine.acceptance.write_default_prompt_file``: short texts with repeated
  phrases, so n-gram drafting finds matches).

Load: ``L`` closed-loop clients, each sending one request at a time, ``max_tokens`` uniform in
32..128 (``ignore_eos``), so clients do not finish in lockstep; L in ``--loads`` (1..16).

Per scenario:

1. **Table launch** (TableTune's timing scheduler): first the profile IN THIS LAUNCH — synthetic:
   the tuner's own profiler (``engine.profile_step_times``: every draft rejected, all-accepted
   cells for the accepted-work correction, adaptive re-measurement) and ``tuning.derive_table``
   under the known rates, once with the paper's 0.5% rule (``policy="stickiness"``) and once with
   ours (``policy="evidence"``); ngram: the profiler's timing protocol needs synthetic rejection,
   which a real-verification launch does not have, so T(B, k) and its standard error are the
   served steps' intervals per (B, k) from a profiling pass (every fixed k at every load, windows
   not reused for evaluation) and the rates are the pass's per-position counts; the same search
   (``core.evidence.search_with_evidence``) with both rules. Then every table policy — fixed
   k = 0..K, the docs' dense example scaled to max_num_seqs, tuned (0.5% rule), tuned (evidence)
   and its A/A copy (two names for the same table) — hot-swapped between windows in rotating order
   across ``--rounds`` rounds (``tuning.served_windows.measure_window``: kept tokens = Σ(b + a) over the
   step log, every step checked to have run the window's table).
2. **Adaptive launches**, one per policy: the controller (control mode from the tuned table),
   TurboSpec-style and Nightjar-style (``controller: {policy: ...}``), each the production plugin
   under ``evaluation.scheduler.AnchoredEvaluationScheduler``. The policy runs through every load in order
   (its state carries over, as in serving); each round has one adaptive window and one anchor
   window of the tuned (evidence) table with the controller bypassed (paired within the launch).
3. **No-spec launch** (no speculative config at all), both scenarios' workloads.

Loss = 1 − goodput / best fixed k at that load (fixed k measured in the table launch). Adaptive
policies' loss is bridged through the anchor: 1 − (adaptive / anchor, paired in its launch) ×
(tuned / best fixed k, in the table launch); the raw cross-launch loss is written next to it.
The A/A pair's paired difference is the noise floor. Written: ``--out``/real_engine_eval.json
(rendered into docs/results.md by benchmarks/report.py and into benchmarks/simulator.md by
benchmarks/evaluate.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.core.stats import mean_se
from tabletune_pipelines.tuning.served_load import LoadGenerator, rotated
from tabletune_pipelines.tuning.served_windows import (
    Window,
    counted_window,
    measure_window,
    policy_ratio,
    summarize,
)
from tabletune_pipelines.evaluation.synthetic import fixed_prior

HERE = Path(__file__).resolve().parent

N, K = 16, 3
ANCHORED_SCHEDULER = "tabletune_pipelines.evaluation.scheduler.AnchoredEvaluationScheduler"
LAUNCH = ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, N, 3))
KS = (0, 1, 2, 3)
RATES = (0.7, 0.5, 0.3)
DOCS_DENSE = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
FIXED = tuple(f"k={k}" for k in KS)
TUNED, TUNED_RULE, AA = "tuned (evidence)", "tuned (0.5% rule)", "tuned (evidence, A/A copy)"
DOCS = "docs' table"
ADAPTIVE = ("controller", "TurboSpec-style", "Nightjar-style")
POLICY_SETTING = {"controller": "tabletune", "TurboSpec-style": "turbospec", "Nightjar-style": "nightjar"}


def say(msg: str) -> None:
    print(msg, flush=True)


def scaled(ranges, n: int) -> list[list[int]]:
    """The docs' 512-request table scaled to max_num_seqs n (range ends × n / 512)."""
    out, start = [], 1
    for _, e, k in ranges:
        end = max(start, min(n, round(e * n / 512)))
        if end >= start:
            out.append([start, end, int(k)])
            start = end + 1
    if out and out[-1][1] < n:
        out[-1][1] = n
    return out


# ----------------------------------------------------------------------------------- load
def token_prompts(vocab: int) -> Callable[[random.Random], list[int]]:
    return lambda rng: [rng.randrange(3, vocab) for _ in range(rng.randint(16, 64))]


def text_prompts(prompts: Sequence[str]) -> Callable[[random.Random], str]:
    return lambda rng: rng.choice(prompts)


def plain_window(server: Any, policy: str, *, load: int, round_: int, window_s: float, settle_s: float) -> Window:
    """A window whose k is chosen by the engine-side policy: kept tokens from the step log, no table check
    (``mismatched_steps`` = 0; the k histogram is returned by ``k_hist``)."""
    time.sleep(settle_s)
    steps, w = counted_window(server, policy, load=load, round_=round_, window_s=window_s)
    w.k_hist = {str(k): sum(1 for s in steps if s.get("k") == k) for k in KS}  # type: ignore[attr-defined]
    return w


def wdict(w: Window, **extra: Any) -> dict:
    d = asdict(w)
    d.update(goodput=w.goodput, verified=w.table_verified, **extra)
    if hasattr(w, "k_hist"):
        d["k_hist"] = w.k_hist
    return d


# ----------------------------------------------------------------------------------- servers
def server_cfg(models, work: Path, scenario: str, *, spec: bool = True, cls: str | None = None,
               env: dict | None = None):
    from tabletune_pipelines.engine import ServerConfig

    base = dict(model=str(models.target_dir), max_num_seqs=N, max_model_len=512, work_dir=str(work))
    if not spec:
        return ServerConfig(**base)
    extra = ("--scheduler-cls", cls) if cls else ()
    if scenario == "synthetic":
        return ServerConfig(**base, drafter=str(models.draft_dir), method="draft_model", num_speculative_tokens=K,
                            table=LAUNCH, synthetic_acceptance_rates=RATES, extra_args=extra, extra_env=env or {})
    return ServerConfig(**base, method="ngram", num_speculative_tokens=K, table=LAUNCH,
                        speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2}, extra_args=extra,
                        extra_env=env or {})


def start(cfg):
    from tabletune_pipelines.engine import VLLMServer

    srv = VLLMServer(cfg)
    t0 = time.monotonic()
    srv.start()
    say(f"  server up in {time.monotonic() - t0:.0f} s ({srv.log_path}); load average {loadavg()}")
    return srv


# ----------------------------------------------------------------------------------- tuning
def profile_synthetic(srv, cfg, vocab: int, args) -> tuple[dict, dict, dict]:
    """The tuner's profile in this launch and derive_table's tables under both rules."""
    from tabletune_pipelines.engine import ProfileServers, profile_step_times
    from tabletune_pipelines.engine.identity import engine_identity
    from tabletune_pipelines.engine.plan import ProfileOptions, default_plan
    from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table

    bs = ints(args.profile_batch_sizes)
    plan = default_plan(cfg, batch_sizes=bs, ks=KS, repetitions=3, include_no_spec=False,
                        accept_batch_sizes=sorted({bs[0], bs[-1]}))
    opts = ProfileOptions(remeasure_budget_s=args.profile_budget, decision_rates=RATES)
    t0 = time.monotonic()
    prof = profile_step_times(cfg, opts, plan=plan, servers=ProfileServers(server=srv), identity=engine_identity(cfg),
                              vocab_size=vocab)
    ev = derive_table(prof, fixed_prior(RATES), DeriveOptions(policy="evidence"))
    rule = derive_table(prof, fixed_prior(RATES), DeriveOptions(policy="stickiness"))
    dense = {int(k): {b: float(ev.step_ms_dense[i, b - 1]) for b in range(1, N + 1)}
             for i, k in enumerate(ev.choice.ks)}
    info = {"source": "engine.profile_step_times in the table launch (every draft rejected; accepted-work fit "
                      f"{'applied' if ev.corrected else 'not applied'}), tuning.derive_table",
            "seconds": round(time.monotonic() - t0, 1), "cells": len(prof.cells), "batch_sizes": bs,
            "rates": list(RATES), "warnings": list(ev.warnings)}
    say(f"  profile: {len(prof.cells)} cells in {info['seconds']} s; tables: evidence {ev.table.ranges}, "
        f"0.5% rule {rule.table.ranges}")
    return ({TUNED: [list(r) for r in ev.table.ranges], TUNED_RULE: [list(r) for r in rule.table.ranges]},
            dense, info)


def profile_served(srv, prompt, args) -> tuple[dict, dict, dict, tuple[float, ...]]:
    """T(B, k) ± s.e. from the served steps' intervals at every fixed k and load (a profiling pass),
    per-position acceptance from the same steps; the search with both rules."""
    import numpy as np

    from tabletune_pipelines.core.acceptance_estimate import rates_from_counts
    from tabletune_pipelines.core.evidence import SearchSettings, search_with_evidence
    from tabletune_pipelines.core.noise import rates_covariance
    from tabletune_pipelines.core.steptime import StepTimes, every_batch_size

    t0 = time.monotonic()
    samples: dict[int, dict[int, list[float]]] = {k: {} for k in KS}
    dp, ap = [0] * K, [0] * K
    for load in ints(args.loads):
        with LoadGenerator(srv, load, 0, output_tokens=(32, 128), seed=7 + load, prompt=prompt) as cl:
            time.sleep(args.warmup)
            for k in KS:
                srv.set_k(k)
                time.sleep(args.settle)
                steps, _ = counted_window(srv, f"k={k}", load=load, round_=0, window_s=args.profile_window)
                for s in steps:
                    if s.get("new", 1) == 0 and s.get("dt") and s.get("k") == k:
                        samples[k].setdefault(int(s["b"]), []).append(float(s["dt"]))
                        if k == K:
                            for i, (d, c) in enumerate(zip(s.get("dp", []), s.get("ap", []))):
                                dp[i] += d
                                ap[i] += c
        if cl.errors:
            say(f"  profile load {load}: {len(cl.errors)} client errors, first {cl.errors[0]}")
    rates = tuple(float(x) for x in rates_from_counts(ap, dp, undrafted="zero"))
    ms = np.zeros((len(KS), N))
    var = np.zeros((len(KS), N))
    for i, k in enumerate(KS):
        bs = sorted(b for b, xs in samples[k].items() if len(xs) >= 5)
        if not bs:
            raise RuntimeError(f"the profiling pass saw no clean decode steps at k = {k}")
        m = [statistics.fmean(samples[k][b]) for b in bs]
        v = [statistics.variance(samples[k][b]) / len(samples[k][b]) for b in bs]
        t, var[i] = every_batch_size(bs, [m, v], N)
        ms[i] = np.maximum.accumulate(t)  # non-decreasing in B, as derive_table pools
    cov = np.zeros((len(KS), len(KS), N))
    for i in range(len(KS)):
        cov[i, i] = var[i]
    rcov = rates_covariance(rates, dp, dp[0])
    ev = search_with_evidence(StepTimes(KS, ms, cov), rates, rates_cov=rcov, settings=SearchSettings(policy="evidence"))
    rule = search_with_evidence(StepTimes(KS, ms, cov), rates, rates_cov=rcov,
                                settings=SearchSettings(policy="stickiness"))
    dense = {int(k): {b: float(ms[i, b - 1]) for b in range(1, N + 1)} for i, k in enumerate(KS)}
    info = {"source": "served steps' intervals per (B, k) in a profiling pass of the table launch (the profiler's "
                      "all-rejected timing needs synthetic rejection, absent with real n-gram verification); "
                      "core.evidence.search_with_evidence",
            "seconds": round(time.monotonic() - t0, 1), "rates": [round(r, 4) for r in rates],
            "drafted_per_pos": dp, "accepted_per_pos": ap,
            "cells": {str(k): {str(b): [round(statistics.fmean(xs), 3), len(xs)] for b, xs in sorted(samples[k].items())}
                      for k in KS}}
    say(f"  served profile in {info['seconds']} s; n-gram rates {info['rates']} (drafted {dp}); tables: evidence "
        f"{ev.ranges}, 0.5% rule {rule.ranges}")
    return ({TUNED: [list(r) for r in ev.ranges], TUNED_RULE: [list(r) for r in rule.ranges]}, dense, info, rates)


# ----------------------------------------------------------------------------------- launches
def table_launch(models, work: Path, scenario: str, prompt, vocab: int, args) -> dict:
    say(f"\n[{scenario}] table launch")
    cfg = server_cfg(models, work / f"{scenario}-tables", scenario)
    srv = start(cfg)
    try:
        if scenario == "synthetic":
            tuned, dense, info = profile_synthetic(srv, cfg, vocab, args)
            rates = RATES
        else:
            tuned, dense, info, rates = profile_served(srv, prompt, args)
        policies = {f"k={k}": [[1, N, k]] for k in KS}
        policies[DOCS] = scaled(DOCS_DENSE, N)
        policies[TUNED_RULE] = tuned[TUNED_RULE]
        policies[TUNED] = tuned[TUNED]
        policies[AA] = tuned[TUNED]
        windows: list[Window] = []
        for load in ints(args.loads):
            with LoadGenerator(srv, load, 0, output_tokens=(32, 128), seed=load, prompt=prompt) as cl:
                time.sleep(args.warmup)
                for r in range(args.rounds):
                    for name in rotated(list(policies), r + load):
                        w = measure_window(srv, name, policies[name], load=load, round_=r, window_s=args.window,
                                           settle_s=args.settle, max_num_seqs=N, max_k=K)
                        windows.append(w)
                        say(f"  load {load:>2} round {r} {name:<28} {w.goodput:8.1f} tok/s  mean B {w.mean_batch:5.1f} "
                            f"steps {w.steps:4d}{'' if w.table_verified else f'  TABLE MISMATCH {w.mismatched_steps}'}")
            if cl.errors:
                say(f"  load {load}: {len(cl.errors)} client errors, first {cl.errors[0]}")
        say(f"  load average {loadavg()}")
    finally:
        srv.stop()
    return {"tables": policies, "profile": info, "profile_ms": {str(k): v for k, v in dense.items()},
            "rates": list(rates), "windows": windows}


def adaptive_launch(models, work: Path, scenario: str, name: str, prompt, base: dict, args) -> dict:
    """One adaptive policy in its own launch, with anchor windows of the tuned table."""
    from tabletune_pipelines.evaluation.synthetic import IDENTITY, publish

    say(f"\n[{scenario}] {name} launch")
    wd = work / f"{scenario}-{POLICY_SETTING[name]}"
    wd.mkdir(parents=True, exist_ok=True)
    pub, flag = wd / "local.json", wd / "anchor.on"
    flag.unlink(missing_ok=True)
    # TABLETUNE_EVAL_ANCHOR_FLAG is evaluation.scheduler.ANCHOR_ENV (not imported: that module imports vLLM)
    env = {"TABLETUNE_PUBLISHED_TABLE": str(pub), "TABLETUNE_EVAL_ANCHOR_FLAG": str(flag),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent),
                                          *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    cfg = server_cfg(models, wd, scenario, cls=ANCHORED_SCHEDULER, env=env)
    ident = dict(IDENTITY, model=cfg.model, drafter=cfg.drafter, method=cfg.method)
    profile = {int(k): {int(b): v for b, v in row.items()} for k, row in base["profile_ms"].items()}
    anchor = base["tables"][TUNED]
    setting = POLICY_SETTING[name]
    ctl = {"export_every_steps": 500, "export_every_s": 5.0}
    if setting == "tabletune":
        ctl["mode"] = "control"
    else:
        ctl.update(mode="observe", policy=setting)
    publish(pub, ranges=anchor, rates=base["rates"], profile=profile, allowed_k=list(KS), identity=ident,
            controller=ctl, n=N, k_max=K)
    srv = start(cfg)
    windows: list[Window] = []
    try:
        for load in ints(args.loads):
            with LoadGenerator(srv, load, 0, output_tokens=(32, 128), seed=load, prompt=prompt) as cl:
                time.sleep(args.warmup)
                for r in range(args.adaptive_rounds):
                    for which in rotated([name, "anchor"], r + load):
                        if which == "anchor":
                            flag.touch()
                            w = measure_window(srv, "anchor", anchor, load=load, round_=r, window_s=args.window,
                                               settle_s=args.settle, max_num_seqs=N, max_k=K)
                        else:
                            flag.unlink(missing_ok=True)
                            w = plain_window(srv, name, load=load, round_=r, window_s=args.window,
                                             settle_s=args.settle)
                        windows.append(w)
                        say(f"  load {load:>2} round {r} {which:<16} {w.goodput:8.1f} tok/s  mean B {w.mean_batch:5.1f} "
                            f"steps {w.steps:4d}" + (f"  k steps {w.k_hist}" if hasattr(w, "k_hist") else "")
                            + ("" if w.table_verified else f"  TABLE MISMATCH {w.mismatched_steps}"))
            flag.unlink(missing_ok=True)
            if cl.errors:
                say(f"  load {load}: {len(cl.errors)} client errors, first {cl.errors[0]}")
        time.sleep(6.0)  # one more export window
    finally:
        flag.unlink(missing_ok=True)
        srv.stop()
    state = {}
    try:
        from tabletune_pipelines.formats.live_counters import read_live_counters

        ws = [w for w in read_live_counters(wd / "local.live.jsonl").windows if w.controller]
        st = ws[-1].controller if ws else {}
        state = {k: st.get(k) for k in ("policy", "policy_active", "policy_failed", "errors", "table",
                                        "policy_table", "policy_alpha", "policy_k_steps", "rebuilds",
                                        "table_changes", "steps")}
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        state = {"export_error": repr(exc)}
    say(f"  controller state at the end: {state}; load average {loadavg()}")
    return {"windows": windows, "state": state}


def nospec_launch(models, work: Path, prompts: dict, args) -> dict:
    say("\n[no-spec] launch (no speculative config)")
    srv = start(server_cfg(models, work / "nospec", "synthetic", spec=False))
    out: dict[str, list[Window]] = {}
    try:
        for scenario, prompt in prompts.items():
            for load in ints(args.loads):
                with LoadGenerator(srv, load, 0, output_tokens=(32, 128), seed=load, prompt=prompt) as cl:
                    time.sleep(args.warmup)
                    for r in range(args.adaptive_rounds):
                        w = plain_window(srv, "no-spec", load=load, round_=r, window_s=args.window,
                                         settle_s=args.settle)
                        out.setdefault(scenario, []).append(w)
                        say(f"  [{scenario}] load {load:>2} round {r} no-spec {w.goodput:8.1f} tok/s  mean B "
                            f"{w.mean_batch:5.1f}")
                if cl.errors:
                    say(f"  load {load}: {len(cl.errors)} client errors, first {cl.errors[0]}")
    finally:
        srv.stop()
    return out


# ----------------------------------------------------------------------------------- analysis
def analyse(scn: dict, loads: Sequence[int]) -> dict:
    """Summary, loss, paired differences, A/A floor and the adaptive policies' bridged loss."""
    windows: list[Window] = scn["table"]["windows"]
    names = list(scn["table"]["tables"])
    summ = summarize(windows)
    res: dict[str, Any] = {"goodput": {}, "loss": {}, "worst": {}, "pairs": [], "aa": {}, "adaptive": {}}
    best = {}
    for load in loads:
        fx = [summ[(f, load)].goodput for f in FIXED if (f, load) in summ]
        best[load] = max(fx) if fx else float("nan")
        res.setdefault("best_fixed", {})[str(load)] = max((f for f in FIXED if (f, load) in summ),
                                                          key=lambda f: summ[(f, load)].goodput, default=None)
    for (p, load), s in summ.items():
        res["goodput"].setdefault(p, {})[str(load)] = [s.goodput, s.stderr, s.rounds]
        res["loss"].setdefault(p, {})[str(load)] = 1.0 - s.goodput / best[load]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for load in loads:
                r, se, n = policy_ratio(windows, a, b, load)
                res["pairs"].append({"a": a, "b": b, "load": load, "diff": r - 1.0, "se": se, "rounds": n})
    for load in loads:
        r, se, n = policy_ratio(windows, AA, TUNED, load)
        res["aa"][str(load)] = {"diff": r - 1.0, "se": se, "rounds": n}
    aa = [v for v in res["aa"].values() if not math.isnan(v["diff"])]
    res["aa_floor"] = max((abs(v["diff"]) for v in aa), default=float("nan"))
    ses = [p["se"] for p in res["pairs"] if not math.isnan(p["se"])]
    res["median_paired_se"] = statistics.median(ses) if ses else float("nan")
    res["excluded_windows"] = sum(1 for w in windows if not w.table_verified)
    res["windows"] = len(windows)
    tuned_over_best = {load: summ[(TUNED, load)].goodput / best[load] for load in loads if (TUNED, load) in summ}
    for name, launch in scn.get("adaptive", {}).items():
        ws: list[Window] = launch["windows"]
        per: dict[str, Any] = {}
        for load in loads:
            by_r: dict[int, dict[str, Window]] = {}
            for w in ws:
                if w.load == load and (w.policy != "anchor" or w.table_verified):
                    by_r.setdefault(w.round, {})[w.policy] = w
            ratios = [d[name].goodput / d["anchor"].goodput for d in by_r.values()
                      if name in d and "anchor" in d and d["anchor"].goodput > 0]
            r, se = mean_se(ratios)
            g, gse = mean_se([w.goodput for w in ws if w.load == load and w.policy == name])
            tb = tuned_over_best.get(load, float("nan"))
            per[str(load)] = {"goodput": g, "se": gse, "vs_anchor": r - 1.0, "vs_anchor_se": se, "rounds": len(ratios),
                              "loss": 1.0 - r * tb, "loss_se": se * tb, "raw_loss": 1.0 - g / best[load]}
        res["adaptive"][name] = per
        res["loss"][name] = {ld: v["loss"] for ld, v in per.items()}
    if "nospec" in scn:
        per = {}
        for load in loads:
            g, gse = mean_se([w.goodput for w in scn["nospec"] if w.load == load])
            per[str(load)] = {"goodput": g, "se": gse, "raw_loss": 1.0 - g / best[load]}
        res["nospec"] = per
        res["loss"]["no-spec (own launch, raw)"] = {ld: v["raw_loss"] for ld, v in per.items()}
    for p, row in res["loss"].items():
        vals = [v for v in row.values() if not math.isnan(v)]
        res["worst"][p] = max(vals) if vals else float("nan")
    floor = res["aa_floor"]
    target = max(0.03, floor) if not math.isnan(floor) else 0.03
    tw = res["worst"].get(TUNED, float("nan"))
    others = {p: res["worst"].get(p, float("nan")) for p in (DOCS, "TurboSpec-style", "Nightjar-style")}
    res["verdict"] = {"target": target, "tuned_worst": tw, "within_target": bool(tw <= target),
                      "better_than": {p: bool(tw < v) for p, v in others.items() if not math.isnan(v)}}
    return res


def print_summary(name: str, scn: dict, res: dict, loads: Sequence[int]) -> None:
    say(f"\n## {name}: loss vs best fixed k per load (%), worst case")
    say("| policy | " + " | ".join(f"L={ld}" for ld in loads) + " | worst |")
    say("|---|" + "---|" * (len(loads) + 1))
    for p, row in res["loss"].items():
        say(f"| {p} | " + " | ".join(f"{100 * row.get(str(ld), float('nan')):.1f}" for ld in loads)
            + f" | {100 * res['worst'][p]:.1f} |")
    say(f"best fixed k per load: {res['best_fixed']}")
    say(f"A/A floor (worst |paired difference| over loads): {100 * res['aa_floor']:.1f}%; per load "
        + ", ".join(f"L={ld}: {100 * v['diff']:+.1f} ± {100 * v['se']:.1f}" for ld, v in res["aa"].items()))
    say(f"median paired s.e. over all table pairs: {100 * res['median_paired_se']:.1f}%; windows excluded by the "
        f"step-log check: {res['excluded_windows']} of {res['windows']}")
    say("paired difference tuned (evidence) vs each table policy (%, ± s.e.):")
    for p in scn["table"]["tables"]:
        if p == TUNED:
            continue
        cells = []
        for ld in loads:
            row = next((x for x in res["pairs"] if x["load"] == ld and {x["a"], x["b"]} == {p, TUNED}), None)
            if row:
                sign = 1.0 if row["a"] == TUNED else -1.0
                d = row["diff"] if sign > 0 else 1.0 / (1.0 + row["diff"]) - 1.0
                cells.append(f"L={ld}: {100 * d:+.1f} ± {100 * row['se']:.1f}")
        say(f"  vs {p}: " + ", ".join(cells))
    for p, per in res["adaptive"].items():
        say(f"  {p} vs anchor (tuned table, same launch): " + ", ".join(
            f"L={ld}: {100 * v['vs_anchor']:+.1f} ± {100 * v['vs_anchor_se']:.1f}" for ld, v in per.items()))
    v = res["verdict"]
    say(f"verdict: tuned (evidence) worst {100 * v['tuned_worst']:.1f}% vs target {100 * v['target']:.1f}% -> "
        f"{'met' if v['within_target'] else 'NOT met'}; better than "
        + ", ".join(f"{p}: {'yes' if b else 'no'}" for p, b in v["better_than"].items()))


def to_json(obj: Any) -> Any:
    if isinstance(obj, Window):
        return wdict(obj)
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "data" / "cpu"))
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "tabletune-tiny-models"))
    ap.add_argument("--scenarios", default="synthetic,ngram")
    ap.add_argument("--adaptive", default=",".join(ADAPTIVE), help="adaptive policies to launch ('' = none)")
    ap.add_argument("--no-nospec", action="store_true", help="skip the no-spec launch")
    ap.add_argument("--loads", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the table launch")
    ap.add_argument("--adaptive-rounds", type=int, default=2, help="rounds of adaptive and no-spec launches")
    ap.add_argument("--window", type=float, default=3.5)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--warmup", type=float, default=2.5)
    ap.add_argument("--profile-batch-sizes", default="1,2,4,8,12,16")
    ap.add_argument("--profile-budget", type=float, default=60.0)
    ap.add_argument("--profile-window", type=float, default=2.5)
    ap.add_argument("--quick", action="store_true", help="loads 1,16, 1+1 rounds, short windows (a smoke run)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--merge-into", default=None, metavar="JSON",
                    help="replace only this run's scenarios in an existing results file (each keeps its own "
                         "run's meta) instead of writing a new one")
    args = ap.parse_args(argv)
    if args.quick:
        args.loads, args.rounds, args.adaptive_rounds = "1,16", 2, 1
        args.window, args.warmup, args.profile_window, args.profile_budget = 1.5, 1.5, 1.5, 5.0
        args.profile_batch_sizes = "1,16"
    import logging

    logging.getLogger("tabletune").setLevel(logging.WARNING)
    from tabletune_pipelines.engine.acceptance import write_default_prompt_file
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models, read_vocab_size
    from tabletune_pipelines.formats.prompts import iter_prompts

    t_start = time.monotonic()
    la0 = loadavg()
    say(f"real-engine evaluation: load average at start {la0}")
    work = Path(args.work or tempfile.mkdtemp(prefix="tt-real-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    models = ensure_tiny_models(args.models, "medium")
    vocab = read_vocab_size(models.target_dir) or 2048
    prompts = list(iter_prompts(write_default_prompt_file(work / "prompts.jsonl")))
    gens = {"synthetic": token_prompts(vocab), "ngram": text_prompts(prompts)}
    scenarios = [s for s in args.scenarios.split(",") if s]
    adaptive = [a for a in args.adaptive.split(",") if a]
    loads = ints(args.loads)
    data: dict[str, dict] = {}
    for scn in scenarios:
        data[scn] = {"table": table_launch(models, work, scn, gens[scn], vocab, args), "adaptive": {}}
    for scn in scenarios:
        for name in adaptive:
            data[scn]["adaptive"][name] = adaptive_launch(models, work, scn, name, gens[scn], data[scn]["table"], args)
    if not args.no_nospec:
        ns = nospec_launch(models, work, {s: gens[s] for s in scenarios}, args)
        for scn in scenarios:
            data[scn]["nospec"] = ns.get(scn, [])
    results = {}
    for scn in scenarios:
        results[scn] = analyse(data[scn], loads)
        print_summary(scn, data[scn], results[scn], loads)
    wall = time.monotonic() - t_start
    la1 = loadavg()
    say(f"\ntotal {wall / 60:.1f} min; load average at start {la0}, at the end {la1}")
    import vllm

    doc = {"schema": "tabletune.real_engine_eval", "schema_version": 1,
           "meta": {"engine": f"vLLM {vllm.__version__} (CPU build)", "target": "medium tiny (12 layers, hidden 1024)",
                    "max_num_seqs": N, "K": K, "launch_table": [list(r) for r in LAUNCH], "loads": loads,
                    "rounds": args.rounds, "adaptive_rounds": args.adaptive_rounds, "window_s": args.window,
                    "settle_s": args.settle, "quick": bool(args.quick), "wall_s": round(wall, 1),
                    "loadavg_start": la0, "loadavg_end": la1,
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "command": "python benchmarks/real_engine_eval.py " + " ".join(argv or sys.argv[1:])},
           "scenarios": {scn: {"tables": data[scn]["table"]["tables"], "profile": data[scn]["table"]["profile"],
                               "rates": data[scn]["table"]["rates"], "results": results[scn],
                               "adaptive_state": {n: a["state"] for n, a in data[scn]["adaptive"].items()},
                               "windows": data[scn]["table"]["windows"],
                               "adaptive_windows": {n: a["windows"] for n, a in data[scn]["adaptive"].items()},
                               "nospec_windows": data[scn].get("nospec", [])}
                         for scn in scenarios}}
    if args.merge_into:
        # A rerun of some scenarios (e.g. more rounds): the others and the file's meta stay as they were.
        target = Path(args.merge_into)
        existing = json.loads(target.read_text())
        for scn in scenarios:
            existing["scenarios"][scn] = {**doc["scenarios"][scn], "meta": doc["meta"]}
        target.write_text(json.dumps(to_json(existing), indent=1) + "\n")
        say(f"merged {', '.join(scenarios)} into {target}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "real_engine_eval.quick.json" if args.quick else "real_engine_eval.json"
    (out / name).write_text(json.dumps(to_json(doc), indent=1) + "\n")
    say(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

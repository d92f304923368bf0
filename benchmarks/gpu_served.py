"""Tables priced by what serving pays, on the GPU (docs/method.md, "What a served step costs"):
profile mixed steps, derive, judge served.

    python benchmarks/gpu_served.py profile --engine dense --out $OUT      # launch 1 (every draft rejected)
    python benchmarks/gpu_served.py judge --engine dense --tables $OUT/dense-served.json --out $OUT  # launch 2
    python benchmarks/gpu_served.py steps --tables $OUT/dense-judge.json \
        --step-log $OUT/dense-judge.steps.jsonl.gz --ceiling 512           # what the judged steps carried
    python benchmarks/gpu_served.py profile --cpu-smoke --out /tmp/x        # this script on the CPU build

``profile``: ONE launch of the engine with every draft rejected and a launch table listing every k.
The decode cells come from the committed one-launch profile (``benchmarks/data/h200/``, the same
machine kind and vLLM version), so the launch measures only what they lack: mixed steps
(``engine.mixed``: decoding batches at B in ``--mixed-batch-sizes`` with prompts of 16, 64, 256 and
512 tokens injected, the last crossing the 512-token capture ceiling). Then, with no engine, the
tuner derives two tables under a = (0.7, 0.5, 0.3): from decode steps alone (what TableTune
published before) and priced by what serving pays (``core.stepcost`` with the closed loop's
workload: 32-token prompts, 32-128 output tokens, mean 80). Wall time of profile + derive printed.

``judge``: ONE launch with synthetic acceptance (0.7, 0.5, 0.3), closed loop
(``tuning.served_load``) at each load, rounds in rotating order, every window checked against the
step log: fixed k = 1, 2, 3, the docs' table, the decode-only table and the served-priced table.
Printed per load: goodput ± s.e. across rounds, loss against the best fixed k, and the served
table's paired ratio to the best fixed k (by round) ± s.e. The launch's step log is kept beside the
figures (gzipped).

``--calibrate-first 'L:window_s:rounds'`` (judge): the fixed ks run first at those loads; with the
fixed-k windows of ``--calibrate``'s earlier judges they correct the served price
(``core.served_calibration.ServedCalibration``), and the table derived from it is judged as ``served``.
``rederive --calibrate A.json,B.json`` derives that table offline from judges' windows.

``--control-ks 3`` (judge): an A/A control, a second copy of fixed k = 3 measured as its own policy
(``control_k3``); its paired ratio to ``fixed_k3`` is the noise and carry-over between identical policies.

``envelopes --envelopes 'ceiling 512=A.json;ceiling 1024=B.json'``: raise the ceiling or lower k, from
judge launches one per envelope (``evaluation.served.compare_envelopes``): per load, the best fixed k of
each and the best against the default's (the first), unpaired, with the default's k measured in both
launches as the drift check.

``steps``: from a judge's figures and kept step log, no engine: per policy and load, arrivals per step
(mean and variance / mean, which the served pricing takes as Poisson), the fraction of steps above the
capture ceiling against what Poisson arrivals with the same mean give, and the step time above and
under the ceiling (``tuning.served_windows.step_mix``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

from tabletune_pipelines.core.stepcost import Workload
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
from tabletune_pipelines.tuning.served_windows import policy_ratio, summarize
from tabletune_pipelines.evaluation.served import loss_table, run_closed_loop

HERE = Path(__file__).resolve().parent

ENGINES = {"dense": ("qwen3-4b", "qwen3-4b-eagle3"), "moe": ("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3")}
PROFILES = {
    "dense": "H200__vllm-0.26.0__qwen3-4b__qwen3-4b-eagle3__eagle3__k3__n128__a10d0800.one_launch.json",
    "moe": "H200__vllm-0.26.0__qwen3-30b-a3b__qwen3-30b-a3b-eagle3__eagle3__k3__n128__3c6d7de3.one_launch.json",
}
RATES = (0.7, 0.5, 0.3)
WORKLOAD = Workload(prompt_tokens=32, output_tokens=80,
                    source="the closed loop's load: 32-token prompts, output uniform in 32..128 tokens")
DOCS = [[1, 64, 3], [65, 128, 1]]


def prior(rates=RATES, workload: Workload | None = WORKLOAD) -> AcceptancePrior:
    n = 100_000
    return AcceptancePrior(rates=tuple(rates), num_drafts=n, drafted_per_pos=(n,) * len(rates),
                           accepted_per_pos=tuple(int(n * a) for a in rates), prompt_fingerprint="synthetic",
                           prompt_count=0, source="synthetic",
                           workload=None if workload is None else workload.to_dict())


def server_config(args, rates, work: Path):
    from tabletune_pipelines.engine import ServerConfig

    K = len(rates)
    if args.cpu_smoke:
        from tabletune_pipelines.evaluation.rig import server_config as cpu_config

        n = 8
        launch = tuple((k + 1, k + 1, k) for k in range(K)) + ((K + 1, n, K),)
        cfg = cpu_config(work, None, rates=rates, launch=launch, max_num_seqs=n, k_max=K)
        return dataclasses.replace(cfg, step_timing=True, extra_args=(), extra_env={}), n
    n = args.max_num_seqs
    target, head = ENGINES[args.engine]
    launch = tuple((k + 1, k + 1, k) for k in range(K)) + ((K + 1, n, K),)
    return ServerConfig(
        model=f"{args.models}/{target}", drafter=f"{args.models}/{head}", method="eagle3", num_speculative_tokens=K,
        table=launch, synthetic_acceptance_rates=tuple(rates), max_num_seqs=n, max_model_len=1024, device="gpu",
        model_runner="v2", load_format="dummy", startup_timeout=600.0, work_dir=str(work),
        max_cudagraph_capture_size=args.capture_size), n


def cmd_profile(args) -> int:
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.engine.plan import ProfileOptions, ProfilePlan
    from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileServers
    from tabletune_pipelines.engine.profiler import profile_step_times

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cfg, n = server_config(args, (0.0, 0.0, 0.0), Path(args.work_dir) / "profile")
    if args.cpu_smoke:
        base = None
        plan = ProfilePlan(batch_sizes=(1, 4, 8), ks=(0, 1, 2, 3), repetitions=2, include_no_spec=False,
                           accept_batch_sizes=())
        mixed_bs = (1, 4, 7)
    else:
        base = StepTimeProfile.from_json((HERE / "data" / "h200" / PROFILES[args.engine]).read_text())
        grid = tuple(sorted({c.batch_size for c in base.cells if c.k is not None and c.acceptance == "reject"}))
        plan = ProfilePlan(batch_sizes=grid, ks=(0, 1, 2, 3), repetitions=3, include_no_spec=False,
                           accept_batch_sizes=())
        mixed_bs = tuple(int(x) for x in args.mixed_batch_sizes.split(","))
    opts = ProfileOptions(remeasure_budget_s=0, warmup=not args.cpu_smoke, mixed_batch_sizes=mixed_bs,
                          mixed_prefill_tokens=tuple(int(x) for x in args.prefill.split(",")),
                          max_model_len=cfg.max_model_len)
    existing = [] if base is None else [c for c in base.cells if c.k is not None and c.acceptance == "reject"]
    with VLLMServer(cfg) as srv:
        t_up = time.monotonic() - t0
        print(f"[served] {args.engine} healthy after {t_up:.0f} s", flush=True)
        prof = profile_step_times(cfg, opts, plan=plan, hooks=ProfileHooks(existing=existing),
                                  servers=ProfileServers(server=srv), identity=None if base is None else base.identity,
                                  vocab_size=151000 if not args.cpu_smoke else None,
                                  progress=lambda m: print(m, flush=True))
    t_prof = time.monotonic() - t0
    ident = dataclasses.replace(prof.identity, capture_ceiling=None if args.cpu_smoke else (args.capture_size or 512))
    if not args.cpu_smoke:
        ident = dataclasses.replace(ident, cudagraph_mode=ident.cudagraph_mode or "full_and_piecewise")
    if base is not None:  # the committed profile's all-accepted and no-spec cells ride along
        prof = dataclasses.replace(prof, cells=tuple(prof.cells) + tuple(
            c for c in base.cells if not (c.k is not None and c.acceptance == "reject")))
    prof = dataclasses.replace(prof, identity=ident)
    t1 = time.monotonic()
    decode_only, served = derive_both(prof)
    t_derive = time.monotonic() - t1
    seconds = {"launch": t_up, "profile": t_prof - t_up, "derive": t_derive, "total": time.monotonic() - t0}
    report(args, prof, decode_only, served, seconds, out)
    return 0


def derive_both(prof: StepTimeProfile, calibration=None):
    """The decode-only table (what TableTune published before) and the served-priced one
    (``calibration``: corrected by served measurements, ``core.served_calibration.ServedCalibration``)."""
    from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table

    return derive_table(prof, prior(workload=None)), derive_table(
        prof, prior(), DeriveOptions(workload=WORKLOAD, served_calibration=calibration))


def calibration_from_judges(paths: list[str]):
    """One ``ServedCalibration`` from judge JSONs (``tuning.served_windows.calibration_from_judges``)."""
    from tabletune_pipelines.tuning.served_windows import calibration_from_judges as pooled

    return pooled([(Path(p).name, json.loads(Path(p).read_text())) for p in paths])


def report(args, prof, decode_only, served, seconds, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t_up, t_prof, t_derive = seconds["launch"], seconds["launch"] + seconds["profile"], seconds["derive"]
    fits = served.table.served_cost.get("fits", {})
    print(f"\n[served] {args.engine}: launch {t_up:.0f} s, profile (mixed steps) {t_prof - t_up:.0f} s, derive "
          f"{t_derive:.1f} s; whole flow {seconds['total']:.0f} s")
    for t, f in fits.items():
        print(f"  fit {t}: a = {f['a_ms']:.3f}±{f['a_se']:.3f} ms, b = {f['b_ms_per_decode_token']:.5f}±{f['b_se']:.5f} "
              f"ms/decode token, c = {f['c_ms_per_prefill_token']:.5f}±{f['c_se']:.5f} ms/prefill token, n = {f['n']}, "
              f"rmse {f['rmse_ms']:.2f} ms, D {f['decode_tokens_range']}, P {f['prefill_tokens_range']}")
    print(f"  decode-only table: {decode_only.table.as_vllm()}")
    print(f"  served-priced table: {served.table.as_vllm()}  (unmeasured cliff cells: "
          f"{len(served.table.served_cost.get('unmeasured_cliff', []))})")
    (out / f"{args.engine}-served.json").write_text(json.dumps({
        "engine": args.engine, "rates": RATES, "workload": WORKLOAD.to_dict(),
        "decode_only": decode_only.table.as_vllm(), "served": served.table.as_vllm(),
        "served_cost": served.table.served_cost, "seconds": seconds,
        "profile": json.loads(prof.to_json()),
    }, indent=1, default=float))


def cmd_rederive(args) -> int:
    """Derive again from a profile phase's output; ``--attribute`` first applies
    ``core.stepcost.attribute_mixed_steps`` to raw samples (the first dense run logged raw ones);
    ``--capture-size`` prices the same samples in another envelope (a raised ceiling)."""
    from tabletune_pipelines.core.stepcost import attribute_mixed_steps

    d = json.loads(Path(args.tables).read_text())
    prof = StepTimeProfile.from_dict(d["profile"])
    if args.capture_size:  # the envelope of a second launch (the mixed-step samples stay those measured)
        prof = dataclasses.replace(prof, identity=dataclasses.replace(prof.identity, capture_ceiling=args.capture_size))
    if args.attribute:
        by: dict = {}
        for s in prof.samples:
            by.setdefault((s.batch, s.k), []).append(s)
        prof = dataclasses.replace(prof, samples=tuple(x for key in by for x in attribute_mixed_steps(by[key])))
    cal = calibration_from_judges(args.calibrate.split(",")) if args.calibrate else None
    t1 = time.monotonic()
    decode_only, served = derive_both(prof, cal)
    seconds = dict(d.get("seconds", {}), derive=time.monotonic() - t1)
    if cal is not None:
        priced = derive_both(prof)[1]
        print(f"[served] calibrated by {len(cal.points)} served points ({cal.source}); the price alone gives "
              f"{priced.table.as_vllm()}")
        for p in cal.points:
            print(f"  k = {p.k} at B = {p.batch:5.1f}: {p.ms:6.2f} ± {p.se_ms:4.2f} ms/step served ({p.rounds} windows)")
        for k, row in served.table.served_cost["calibration"]["offset_ms"].items():
            print(f"  offset k = {k}: " + ", ".join(f"B {b}: {v:+.2f} ms" for b, v in row.items()))
    report(args, prof, decode_only, served, seconds, Path(args.out))
    return 0


def cmd_judge(args) -> int:
    from tabletune_pipelines.engine import VLLMServer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = json.loads(Path(args.tables).read_text())
    cfg, n = server_config(args, RATES, Path(args.work_dir) / "judge")
    K = len(RATES)
    policies = {f"fixed_k{k}": [[1, n, k]] for k in args.fixed_ks}
    policies["docs"] = [[s, min(e, n), k] for s, e, k in DOCS if s <= n]
    policies["decode_only"] = tables["decode_only"]
    policies["served"] = tables["served"]
    for k in args.control_ks:  # A/A: a second copy of fixed k, measured as its own policy (carry-over and noise)
        policies[f"control_k{k}"] = [[1, n, k]]
    for name in ("decode_only",):  # a table equal to a fixed k's is that policy: measured once, not twice
        same = [p for p in policies if p.startswith("fixed_k") and policies[p] == policies[name]]
        if same:
            print(f"[judge] {name} {policies[name]} is {same[0]}: not measured twice", flush=True)
            del policies[name]
    groups = [([int(x) for x in g.split(":")[0].split(",")], float(g.split(":")[1])) for g in args.loads.split(";")]
    windows = []
    t0 = time.monotonic()
    log = open(out / f"{args.engine}-judge.log", "a")

    def say(s: str) -> None:
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    with VLLMServer(cfg) as srv:
        say(f"[judge] {args.engine} healthy after {time.monotonic() - t0:.0f} s; policies {policies}")
        if args.calibrate_first:
            policies["served"] = calibrate_in_launch(srv, args, tables, policies, n, K, say, out)
        for i, (loads, window) in enumerate(groups):
            loads = [min(load, n) for load in loads]
            here, alias = policies_at(policies, max(loads), n, K)
            for name, same in alias.items():
                say(f"[judge] loads {loads}: {name} runs the same k as {same} at every B <= {max(loads)}: "
                    f"measured once, its windows are {same}'s")
            got = run_closed_loop(srv, here, loads, vocab_size=151000 if not args.cpu_smoke else 2000,
                                  max_num_seqs=n, max_k=K, rounds=args.rounds, window_s=window, progress=say,
                                  warmup_s=args.first_warmup_s if i == 0 and not args.calibrate_first else 3.0)
            windows += got + [dataclasses.replace(w, policy=name) for name, same in alias.items()
                              for w in got if w.policy == same]
            (out / f"{args.engine}-judge.json").write_text(json.dumps({"windows": [w.__dict__ for w in windows],
                                                                          "policies": policies}, default=float))
            keep_step_log(srv, out / f"{args.engine}-judge.steps.jsonl.gz")  # after each group: a timeout keeps it
    summary = summarize(windows)
    fixed = [p for p in policies if p.startswith("fixed_k")]
    loads = sorted({w.load for w in windows})
    losses = loss_table(summary, fixed, list(policies), loads)
    say(f"\n{args.engine}: goodput tok/s ± s.e. across rounds (loss vs best fixed k)")
    for p in policies:
        cells = []
        for load in loads:
            s = summary.get((p, load))
            cells.append("n/a" if s is None else
                         f"{s.goodput:7.0f}±{s.stderr:5.0f} ({100 * losses.get(p, {}).get(load, float('nan')):5.1f}%)")
        say(f"  {p:<12} " + " | ".join(cells))
    say("  served vs best fixed k, paired by round (ratio ± s.e.):")
    verdict = {}
    for load in loads:
        best = max(fixed, key=lambda p: summary[(p, load)].goodput)
        r, se, m = policy_ratio(windows, "served", best, load)
        rd, sed, _ = policy_ratio(windows, "served", "docs", load)
        verdict[load] = {"best": best, "ratio": r, "se": se, "rounds": m, "vs_docs": rd, "vs_docs_se": sed}
        say(f"    L{load}: vs {best} {r:.3f}±{se:.3f} ({m} rounds); vs docs {rd:.3f}±{sed:.3f}")
        for k in args.control_ks:
            ra, sea, ma = policy_ratio(windows, f"control_k{k}", f"fixed_k{k}", load)
            verdict[load][f"control_k{k}"] = {"ratio": ra, "se": sea, "rounds": ma}
            say(f"    L{load}: A/A control_k{k} vs fixed_k{k} {ra:.3f}±{sea:.3f} ({ma} rounds): identical policies")
    (out / f"{args.engine}-judge.json").write_text(json.dumps({
        "windows": [w.__dict__ for w in windows], "policies": policies, "loss": losses, "verdict": verdict,
        "summary": {f"{p}@{l}": s.__dict__ for (p, l), s in summary.items()}}, indent=1, default=float))
    return 0


def policies_at(policies: dict, load: int, n: int, K: int) -> tuple[dict, dict]:
    """The policies a closed loop of ``load`` clients tells apart: it never runs more than ``load``
    requests, so the docs' table, where it runs the served table's k at every B <= load, is that
    policy there (measured once; its windows are the served table's). Returns (measured, alias -> same)."""
    upto = {p: DraftTable.from_entries(t).vllm_lookup(n, K)[1:load + 1] for p, t in policies.items()}
    alias = {p: "served" for p in ("docs",) if p in policies and "served" in policies and upto[p] == upto["served"]}
    return {p: t for p, t in policies.items() if p not in alias}, alias


def calibrate_in_launch(srv, args, tables: dict, policies: dict, n: int, K: int, say, out: Path) -> list:
    """Served verification's repair inside the launch: the fixed ks at ``--calibrate-first`` loads
    (with the windows of ``--calibrate`` judges of earlier launches) correct the served price, and the
    table derived from it is the one judged (``core.served_calibration.ServedCalibration``)."""
    fixed = {p: t for p, t in policies.items() if p.startswith("fixed_k")}
    windows = []
    for i, g in enumerate(args.calibrate_first.split(";")):
        loads, window, rounds = g.split(":")
        windows += run_closed_loop(srv, fixed, [min(int(x), n) for x in loads.split(",")],
                                   vocab_size=151000 if not args.cpu_smoke else 2000,
                                   max_num_seqs=n, max_k=K, rounds=int(rounds), window_s=float(window), progress=say,
                                   warmup_s=args.first_warmup_s if i == 0 else 3.0)
    here = out / f"{args.engine}-calibration.json"
    here.write_text(json.dumps({"windows": [w.__dict__ for w in windows], "policies": fixed}, default=float))
    cal = calibration_from_judges(([p for p in args.calibrate.split(",") if p] if args.calibrate else []) + [str(here)])
    prof = StepTimeProfile.from_dict(tables["profile"])
    t1 = time.monotonic()
    _, served = derive_both(prof, cal)
    table = served.table.as_vllm()
    say(f"[judge] calibrated by {len(cal.points)} served points in {time.monotonic() - t1:.1f} s: {table} "
        f"(the price alone: {tables['served']})")
    for p in cal.points:
        say(f"  k = {p.k} at load {p.load} (B = {p.batch:5.1f}): {p.ms:6.2f} ± {p.se_ms:4.2f} ms/step ({p.rounds} rounds)")
    tables["served_priced"] = tables["served"]
    tables["served"] = table
    (out / f"{args.engine}-calibrated.json").write_text(json.dumps({"served": table, "served_cost":
                                                                     served.table.served_cost}, default=float))
    return table


def cmd_steps(args) -> int:
    """What the judged windows' steps carried, per policy and load, from a judge's JSON and its kept step
    log: arrivals per step (mean, variance / mean: 1 for Poisson), the fraction of steps above the capture
    ceiling against what Poisson arrivals with the same mean would give, and the step time above and
    under the ceiling."""
    import gzip
    import math

    from tabletune_pipelines.tuning.served_windows import Window, step_mix

    d = json.loads(Path(args.tables).read_text())
    windows = [Window(**w) for w in d["windows"]]
    opener = gzip.open if str(args.step_log).endswith(".gz") else open
    with opener(args.step_log, "rt") as fh:
        records = [json.loads(line) for line in fh if line.strip().startswith("{")]
    if not any(w.t_end for w in windows):
        raise SystemExit("error: these windows carry no start and end times (judged before they were recorded)")
    c = args.ceiling
    print(f"policy@load: steps, arrivals/step (var/mean), over {c} tokens: measured vs Poisson, ms over | under")
    for key in sorted({(w.policy, w.load) for w in windows}, key=lambda x: (x[1], x[0])):
        steps = [r for w in windows if (w.policy, w.load) == key
                 for r in records if w.t_start <= r["t"] <= w.t_end and r.get("b", 0) > 0]
        m = step_mix(steps, c)
        lam = m.arrivals_mean

        # A check on core.stepcost's assumption, not a second pricing: the tuner's served expectation
        # (StepCost.served) sums over the same Poisson arrivals; here only their crossing is counted.
        def p_over(r):  # P(Poisson(lam) arrivals of --prompt-tokens push the step over the ceiling)
            room = c - int(r["b"]) * (1 + int(r.get("k") or 0))
            need = max(0, math.floor(room / args.prompt_tokens) + 1)
            return 1.0 - sum(math.exp(-lam) * lam ** i / math.factorial(i) for i in range(need))
        pred = sum(p_over(r) for r in steps) / len(steps) if steps else float("nan")
        print(f"  {key[0]:<12}@{key[1]:<4} {m.steps:6d}  {lam:5.2f} ({m.arrivals_dispersion:4.2f})  "
              f"{100 * m.over_ceiling:5.1f}% vs {100 * pred:5.1f}%  {m.ms_over:6.1f} | {m.ms_under:6.1f}")
    return 0


def keep_step_log(srv, dest: Path) -> None:
    """The launch's step log (tokens, arrivals and time of every step), gzipped beside the figures: what
    a served step carried is read from it afterwards (arrivals per step, steps over the capture ceiling)."""
    import gzip
    import shutil

    src = srv.step_log.path
    if src is None or not Path(src).exists():
        print(f"[judge] no step log to keep ({src})", flush=True)
        return
    with open(src, "rb") as fin, gzip.open(dest, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    print(f"[judge] step log kept: {dest} ({dest.stat().st_size} bytes)", flush=True)


def cmd_envelopes(args) -> int:
    """Raise the ceiling or lower k: the best fixed k of each envelope's judge launch, per load, against
    the default envelope's (``evaluation.served.compare_envelopes``; the first label is the default)."""
    from tabletune_pipelines.evaluation.served import compare_envelopes

    if not args.envelopes:
        raise SystemExit("envelopes needs --envelopes 'label=judge.json;label=judge.json' (the default first)")
    launches = []
    for part in args.envelopes.split(";"):
        label, _, path = part.partition("=")
        if not path:
            raise SystemExit(f"--envelopes: {part!r} is not 'label=judge.json'")
        launches.append((label.strip(), json.loads(Path(path.strip()).read_text())))
    for answer in compare_envelopes(launches, default=launches[0][0]):
        print(answer.sentence())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=["profile", "judge", "rederive", "steps", "envelopes"])
    ap.add_argument("--attribute", action="store_true", help="rederive: attribute raw mixed-step samples first")
    ap.add_argument("--calibrate", default=None,
                    help="rederive, judge: judge JSONs (comma-separated) whose fixed-k windows correct the served price")
    ap.add_argument("--calibrate-first", default=None,
                    help="judge: 'L,L:window_s:rounds;...' of fixed k measured first in the launch; with --calibrate's "
                         "files they correct the served price, and the table derived from it is judged as 'served'")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="dense")
    ap.add_argument("--models", default=os.environ.get("TT_GPU_MODELS", "/tmp/gv/models"))
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--capture-size", type=int, default=None, help="max_cudagraph_capture_size (None: vLLM's rule)")
    ap.add_argument("--mixed-batch-sizes", default="1,32,64,96,127")
    ap.add_argument("--prefill", default="16,64,256,512")
    ap.add_argument("--tables", help="judge: the profile phase's <engine>-served.json")
    ap.add_argument("--loads", default="1,32:2;64,96,128:4", help="groups 'L,L:window_s;...'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-warmup-s", type=float, default=3.0,
                    help="judge: load before the first group's first window (the MoE compiles kernels at a new size)")
    ap.add_argument("--fixed-ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    ap.add_argument("--control-ks", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                    help="judge: an A/A control per k, a second copy of fixed k measured as its own policy")
    ap.add_argument("--step-log", help="steps: the judge's kept step log (<engine>-judge.steps.jsonl.gz)")
    ap.add_argument("--ceiling", type=int, default=512, help="steps: the capture ceiling in tokens")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="steps: the closed loop's prompt length")
    ap.add_argument("--envelopes", default=None,
                    help="envelopes: 'label=judge.json;label=judge.json', one judge launch per envelope, the default first")
    ap.add_argument("--out", default=None, help="profile, judge, rederive: where the figures go")
    ap.add_argument("--work-dir", default="/tmp/tt-served")
    ap.add_argument("--cpu-smoke", action="store_true", help="run on vLLM's CPU build (tiny models; figures mean nothing)")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.prefill = "16,64,200"
    if args.phase not in ("steps", "envelopes") and not args.out:
        ap.error(f"{args.phase} needs --out")
    return {"profile": cmd_profile, "judge": cmd_judge, "rederive": cmd_rederive, "steps": cmd_steps,
            "envelopes": cmd_envelopes}[args.phase](args)


if __name__ == "__main__":
    raise SystemExit(main())

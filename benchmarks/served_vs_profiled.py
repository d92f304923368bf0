"""Does the profile predict what the engine serves?

    python benchmarks/served_vs_profiled.py --out /tmp/tt-served
    python benchmarks/served_vs_profiled.py --loads 1,4,8,16 --rates 0.75,0.5,0.3 --window 6

ONE launch of the medium tiny target (12 layers, hidden 1024, ~146 M parameters) with the 1-layer
draft model (``draft_model``, K = 3, every k switched at runtime, synthetic acceptance switched at
runtime so the acceptance is known), and the busy-wait switch of ``benchmarks/_busywait`` (vLLM's
shared-memory reader polls with ``sched_yield``; the switch rebinds it to a 50 µs sleep while a
flag file exists: docs/engine-facts.md, "Noise on 2 cores"), so both settings are measured in the
same launch:

1. For each busy-wait setting (off, then on): profile T(B, k) on the serving path
   (``profile_step_times(servers=ProfileServers(server=...))``: every draft rejected, all-accepted cells for the
   accepted-work correction, adaptive re-measurement with ``--budget`` seconds). The tuner's T
   is ``tuning.derive_table`` of that profile under the known acceptance (corrected where the fit
   is significant).
2. Closed loop (``tabletune_pipelines.tuning.served_load.LoadGenerator``): at each load L (concurrent clients,
   prompts of 32 random token ids, ``max_tokens`` uniform in ``--output-tokens``, ``ignore_eos``)
   and in ``--rounds`` rounds, every (setting, fixed k) pair gets a window of ``--window`` s, the
   order of settings and k rotating per round. Measured from the step log over the window:
   tokens/s = sum(b + a) / sum(dt) (every request keeps its token plus its accepted drafts).
   Predicted from the same window's steps with the setting's own profile and its step-cost model
   (``core.stepcost``: the decode surface plus the prefill fit of the profile's mixed steps), in
   four ways (``MODES``): decode steps only, priced by the decode surface (what T(B, k) is defined
   on); every served step, priced by its own decode and prefill tokens (``StepCost.step_ms``); and
   every served step priced by the workload's expectation (``StepCost.served``: 32-token prompts,
   the mean output length), which is what the tuner optimises; and that expectation corrected by a
   served calibration from the fixed-k windows at every *other* load (``core.served_calibration.ServedCalibration``,
   leave one load out: does what serving measured at some loads carry to the others?). Kept tokens predicted:
   sum((b - new)·tau(k) + new) (an admitted request keeps its first token), or sum(b·tau(k)) under
   the expectation.

Printed per setting, fixed k and load: measured and predicted tokens/s, error, realised tau,
measured vs predicted step time; per k the worst and mean |error| over loads (target within
10 %); per load whether the argmax k agrees; and per setting the A/A repeatability (spread of
the rounds) and the profile's cell spreads. The load average is printed next to every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _busywait import server_env

from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.tuning.served_load import LoadGenerator, rotated
from tabletune_pipelines.tuning.served_windows import counted_window
from tabletune_pipelines.evaluation.synthetic import fixed_prior


def window(server, k: int, load: int, seconds: float, settle: float) -> dict:
    """Switch to fixed ``k``, settle, then read the step log over ``seconds``."""
    server.set_k(k)
    time.sleep(settle)
    steps, _ = counted_window(server, f"k={k}", load=load, round_=0, window_s=seconds)
    steps = [s for s in steps if s.get("dt") is not None]
    return {"k": k, "load": load, "steps": [(int(s["b"]), int(s.get("a", 0)), int(s.get("new", 0)), float(s["dt"]),
                                              s.get("k"), int(s.get("tok", 0) or 0), int(s.get("d", 0) or 0))
                                             for s in steps]}


#: How a window's steps are priced (``score``): the decode surface alone on decode steps (what T(B, k)
#: is defined on); every served step by its own tokens (``StepCost.step_ms`` with the step's prefill);
#: every served step by the workload's expectation (``StepCost.served``, what the tuner optimises).
MODES = ("decode steps, decode surface", "every step, priced by its tokens", "every step, workload expectation",
         "every step, expectation calibrated at the other loads")


def calibrated_ms(windows: list[dict], setting: str, load: int, cost, rates, workload, M: int):
    """The workload expectation corrected by a served calibration (``core.served_calibration.ServedCalibration``)
    from this setting's fixed-k windows at every load but ``load``: what the tuner would price ``load``
    at had a served verification measured only the other loads (None: too few windows)."""
    from tabletune_pipelines.core.served_calibration import ServedCalibration
    from tabletune_pipelines.tuning.served_windows import Window, served_points

    ws = []
    for w in windows:
        steps = [s for s in w["steps"] if s[4] == w["k"]]
        if w["setting"] != setting or w["load"] == load or not steps:
            continue
        ws.append(Window(f"k{w['k']}", w["load"], w["round"], sum(b + a for b, a, *_ in steps),
                         sum(s[3] for s in steps) / 1000.0, len(steps), statistics.fmean(s[0] for s in steps), 0))
    points = served_points(ws, {f"k{k}": [[1, M, k]] for k in cost.ks})
    if not points:
        return None
    return cost.served(rates, workload, ServedCalibration(points=tuple(points))).ms


def score(w: dict, cost, served_ms, taus, mode: str) -> dict | None:
    """Measured and predicted tokens/s of one window (see the module docstring and ``MODES``)."""
    k = w["k"]
    i = list(cost.ks).index(k)
    steps = [s for s in w["steps"] if s[4] == k and (mode != MODES[0] or s[2] == 0)]
    steps = [s for s in steps if s[0] - s[2] >= 1]
    if not steps:
        return None
    n = cost.max_num_seqs
    kept = sum(b + a for b, a, *_ in steps)
    secs = sum(s[3] for s in steps) / 1000.0
    dec = [min(b - new, n) for b, _, new, *_ in steps]
    pred_kept = sum(d * taus[k] + s[2] for d, s in zip(dec, steps))
    if mode == MODES[1]:
        prefill = [max(0, tok - (b - new) - d) if tok else 0 for b, _, new, _, _, tok, d in steps]
        pred_secs = float(sum(cost.step_ms(dec, k, prefill))) / 1000.0
    elif mode in (MODES[2], MODES[3]):
        pred_kept = sum(d * taus[k] for d in dec)  # arrivals are inside the expectation
        pred_secs = sum(served_ms[i, d - 1] for d in dec) / 1000.0
    else:
        pred_secs = sum(cost.decode_ms[i, d - 1] for d in dec) / 1000.0
    return {"measured": kept / secs, "predicted": pred_kept / pred_secs, "steps": len(steps),
            "mean_b": statistics.fmean(b for b, *_ in steps), "tau": kept / sum(b for b, *_ in steps),
            "step_ms": 1000.0 * secs / len(steps), "pred_step_ms": 1000.0 * pred_secs / len(steps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/tt-served-vs-profiled")
    ap.add_argument("--models", default="/tmp/tabletune-tiny-models")
    ap.add_argument("--size", default="medium", choices=["small", "medium"])
    ap.add_argument("--rates", default="0.75,0.5,0.3")
    ap.add_argument("--ks", default="0,1,2,3")
    ap.add_argument("--loads", default="1,4,8,16")
    ap.add_argument("--batch-sizes", default="1,2,4,8,12,16", help="profile grid")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--budget", type=float, default=60.0, help="re-measurement seconds per profile")
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--settle", type=float, default=0.7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-tokens", default="32,128")
    ap.add_argument("--settings", default="off,on", help="busy-wait settings to measure")
    args = ap.parse_args(argv)

    from tabletune_pipelines.core.goodput import tau_curve
    from tabletune_pipelines.engine import ProfileServers, ServerConfig, VLLMServer, profile_step_times
    from tabletune_pipelines.engine.identity import engine_identity
    from tabletune_pipelines.engine.plan import ProfileOptions, default_plan
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models, read_vocab_size
    from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rates = tuple(float(x) for x in args.rates.split(","))
    K, M = len(rates), 16
    ks, loads, bs = ints(args.ks), ints(args.loads), ints(args.batch_sizes)
    otok = tuple(ints(args.output_tokens))
    taus = tau_curve(rates)
    from tabletune_pipelines.core.stepcost import Workload

    workload = Workload(prompt_tokens=32, output_tokens=(otok[0] + otok[1]) / 2.0,
                        source=f"the closed loop: 32-token prompts, output uniform in {otok[0]}..{otok[1]}")
    flag = out / "busywait.on"
    flag.unlink(missing_ok=True)
    t_start = time.monotonic()
    print(f"load at start {loadavg()}", flush=True)
    models = ensure_tiny_models(args.models, args.size)
    env = server_env(flag)
    cfg = ServerConfig(model=str(models.target_dir), drafter=str(models.draft_dir), method="draft_model",
                       num_speculative_tokens=K, table=((1, M, K),), synthetic_acceptance_rates=(0.0,) * K,
                       max_num_seqs=M, max_model_len=512, work_dir=str(out / "servers"), extra_env=env)
    identity = engine_identity(cfg)
    vocab = read_vocab_size(cfg.model) or 2048
    plan = default_plan(cfg, batch_sizes=bs, ks=ks, repetitions=args.repetitions, include_no_spec=False,
                        accept_batch_sizes=sorted({bs[0], bs[len(bs) // 2], bs[-1]}))
    opts = ProfileOptions(remeasure_budget_s=args.budget, decision_rates=rates)
    settings = args.settings.split(",")
    srv = VLLMServer(cfg)
    srv.start()
    print(f"server up in {srv.startup_seconds:.1f} s (log {srv.log_path}); load {loadavg()}", flush=True)
    profiles, tuned, windows = {}, {}, []
    try:
        log_text = Path(srv.log_path).read_text(errors="replace")
        patched = "[tabletune busy-wait]" in log_text
        print(f"busy-wait switch installed in the server: {patched}", flush=True)
        for setting in settings:
            if setting == "on":
                flag.touch()
            else:
                flag.unlink(missing_ok=True)
            time.sleep(1.0)
            t0 = time.monotonic()
            prof = profile_step_times(cfg, opts, plan=plan, servers=ProfileServers(server=srv), identity=identity,
                                      vocab_size=vocab, progress=lambda m: print(m, flush=True))
            profiles[setting] = prof
            tuned[setting] = derive_table(prof, fixed_prior(rates), DeriveOptions(workload=workload))
            (out / f"profile-{setting}.json").write_text(prof.to_json(indent=1))
            print(f"[{setting}] profile in {time.monotonic() - t0:.0f} s, load {loadavg()}; table "
                  f"{tuned[setting].table.as_vllm()}; correction {tuned[setting].table.accepted_work_fit}", flush=True)
        srv.set_synthetic_rates(list(rates))
        for load in loads:
            gen = LoadGenerator(srv, load, vocab, 32, otok, seed=load).start()
            try:
                time.sleep(3.0)
                for r in range(args.rounds):
                    for setting in rotated(settings, r):
                        if setting == "on":
                            flag.touch()
                        else:
                            flag.unlink(missing_ok=True)
                        for k in rotated(ks, r):
                            w = window(srv, k, load, args.window, args.settle)
                            w.update(setting=setting, round=r, load_avg=loadavg())
                            windows.append(w)
                            s = score(w, tuned[setting].cost, tuned[setting].step_ms_dense, taus, MODES[1])
                            if s:
                                print(f"load {load:>2} round {r} busy-wait {setting:<3} k={k}: measured "
                                      f"{s['measured']:7.1f} predicted {s['predicted']:7.1f} tok/s "
                                      f"({s['predicted'] / s['measured'] - 1:+.1%}), mean B {s['mean_b']:.1f}, "
                                      f"load {w['load_avg']}", flush=True)
            finally:
                gen.stop()
            if gen.errors:
                print(f"load {load}: {len(gen.errors)} client errors, first {gen.errors[0]}", flush=True)
    finally:
        srv.stop()
        flag.unlink(missing_ok=True)
    (out / "windows.json").write_text(json.dumps(windows))

    report = []

    def say(line: str = "") -> None:
        report.append(line)
        print(line, flush=True)

    say(f"\n# served vs profiled: {args.size} target + 1-layer draft, K = {K}, a = {rates}, loads {loads}")
    say(f"load at start/end of the run: see per-window figures; now {loadavg()}; total "
        f"{time.monotonic() - t_start:.0f} s")
    for setting in settings:
        prof, tt = profiles[setting], tuned[setting]
        spreads = sorted(c.spread for c in prof.cells if c.k is not None)
        say(f"\n## busy-wait {setting}: profile cell spread median {spreads[len(spreads) // 2]:.0%}, max "
            f"{spreads[-1]:.0%}; wall-timed cells {len(prof.wall_timed())}; re-measured cells "
            f"{len(prof.remeasured())}; accepted-work fit {tt.table.accepted_work_fit}")
        say(f"prefill fits: {tt.table.served_cost.get('fits')}")
        for mode in MODES:
            say(f"\n### {mode}")
            say("| k | load | measured tok/s | predicted tok/s | error | tau | step ms meas / pred | rounds spread |")
            say("|---|---|---|---|---|---|---|---|")
            per_k: dict[int, list[float]] = {}
            best: dict[int, tuple[dict, dict]] = {}
            for load in loads:
                meas_by_k, pred_by_k = {}, {}
                served_ms = tt.step_ms_dense
                if mode == MODES[3]:
                    served_ms = calibrated_ms(windows, setting, load, tt.cost, rates, workload, M)
                    if served_ms is None:
                        continue
                for k in ks:
                    ws = [w for w in windows if w["setting"] == setting and w["k"] == k and w["load"] == load]
                    sc = [score(w, tt.cost, served_ms, taus, mode) for w in ws]
                    sc = [s for s in sc if s]
                    if not sc:
                        continue
                    m = statistics.fmean(s["measured"] for s in sc)
                    p = statistics.fmean(s["predicted"] for s in sc)
                    spread = (max(s["measured"] for s in sc) - min(s["measured"] for s in sc)) / m
                    err = p / m - 1.0
                    per_k.setdefault(k, []).append(err)
                    meas_by_k[k], pred_by_k[k] = m, p
                    say(f"| {k} | {load} | {m:.1f} | {p:.1f} | {err:+.1%} | "
                        f"{statistics.fmean(s['tau'] for s in sc):.2f} (expected {taus[k]:.2f}) | "
                        f"{statistics.fmean(s['step_ms'] for s in sc):.1f} / "
                        f"{statistics.fmean(s['pred_step_ms'] for s in sc):.1f} | {spread:.1%} |")
                if meas_by_k:
                    best[load] = (meas_by_k, pred_by_k)
            for k, errs in per_k.items():
                say(f"k = {k}: worst |error| {max(abs(e) for e in errs):.1%}, mean |error| "
                    f"{statistics.fmean(abs(e) for e in errs):.1%} over loads "
                    f"{'(within 10%)' if max(abs(e) for e in errs) <= 0.10 else '(NOT within 10%)'}")
            for load, (m, p) in best.items():
                km, kp = max(m, key=m.get), max(p, key=p.get)
                gap = 1.0 - m[kp] / m[km]
                say(f"load {load}: argmax k measured {km}, predicted {kp} -> "
                    f"{'agree' if km == kp else f'DISAGREE (the predicted k serves {gap:.1%} less)'}")
    (out / "report.md").write_text("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The controller on a GPU: its per-step hook cost against a real decode step, and one repair run
from the quartered table, in ONE launch.

    python benchmarks/gpu_controller.py --engine dense --out controller.json

One launch of the Qwen3-4B-shaped (or 30B-A3B-shaped MoE) target + EAGLE-3 head on vLLM 0.26 (dummy
weights, Model Runner V2, full CUDA graphs, synthetic acceptance ``--rates`` fixed at launch, so the
true acceptance is known) with the controller as an operator turns it on: ``--scheduler-cls
tabletune_pipelines.controller.scheduler.ControllerScheduler`` + ``TABLETUNE_PUBLISHED_TABLE``. The
published files carry the engine's H200 step-time profile measured by ``tabletune profile``
(benchmarks/data/h200/, interpolated over B) and the true rates as the prior.

1. Hook cost: the tuned table in observe mode; at each ``--hook-loads`` load L (L closed-loop
   clients), the controller's own export gives per window the mean and max time of its per-step
   hook (timed inside the engine process) and its clean decode-step intervals. Printed: hook µs,
   the decode step at B = L, and their ratio (target < 1%).
   The "tuned" table here is the method's 0.5% point rule on that interpolated profile
   (``evaluation.synthetic.true_table``, the rule the controller's own rebuild applies), not the
   evidence search of ``tabletune table``.
2. Repair: policies ``wrong`` (the tuned table with every range shrunk to a quarter, k = 0 above:
   the method's repair experiment; observe mode), ``tuned`` (observe mode), ``controller`` (control
   mode starting from the wrong table), each published as a new version, at each ``--repair-loads``
   load, ``--rounds`` rounds in rotating order. Goodput = kept tokens / busy seconds from the
   controller's exported windows after a settle. Printed: goodput ± s.e., controller / wrong and
   controller / tuned paired per round, the share of the wrong-vs-tuned gap recovered, and the
   table the controller ended on.
3. Steady load (``--steady``: does the controller reach the best fixed k?): at each load, the
   controller starts from the table TableTune publishes from the decode-step profile (``cliff``:
   k = 3 at every B, ``decode_only`` in benchmarks/data/h200/<engine>-served.json) or from its
   quarter (``quartered``) and runs ``--converge`` seconds in control mode; then every
   fixed k and each table the controller ended on are served in ``--steady-rounds`` rounds in
   rotating order (observe mode). Printed: goodput ± s.e., each / the best fixed k paired by round,
   the controller's own goodput over the last third of its run / the best fixed k, its ranges and
   switches per hour.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from tabletune_pipelines.core.stats import mean_se
from tabletune_pipelines.tuning.served_load import rotated

ROOT = Path(__file__).resolve().parents[1]

ENGINES = {
    "dense": ("qwen3-4b", "qwen3-4b-eagle3"),
    "moe": ("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3"),
}
SCHEDULER = "tabletune_pipelines.controller.scheduler.ControllerScheduler"


def profile_ms(engine: str, n: int) -> dict[int, dict[int, float]]:
    """The engine's H200 profile (all-rejected cells), interpolated to every B in 1..n."""
    import numpy as np

    from tabletune_pipelines.formats.documents import StepTimeProfile

    [path] = [p for p in (ROOT / "benchmarks" / "data" / "h200").glob("*.one_launch.json")
              if f"__{ENGINES[engine][0]}__" in p.name]
    cells = StepTimeProfile.from_json(path.read_text()).reject_cells()
    out = {}
    for k, row in sorted(cells.items()):
        xs = sorted(row)
        out[k] = {b: float(np.interp(b, xs, [row[x] for x in xs])) for b in range(1, n + 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(ENGINES), required=True)
    ap.add_argument("--models", default=os.environ.get("TT_GPU_MODELS", "/tmp/gv/models"))
    ap.add_argument("--rates", default="0.7,0.5,0.3")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--hook-loads", default="1,128")
    ap.add_argument("--hook-window", type=float, default=6.0)
    ap.add_argument("--repair-loads", default="64,128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=6.0, help="seconds measured per policy and load")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after a publication before measuring")
    ap.add_argument("--steady", default="128:cliff,128:quartered,64:quartered",
                    help="load:start pairs for the steady-load stage (start: cliff = the tuned decode-step table, "
                         "quartered = its quarter); empty skips the stage")
    ap.add_argument("--converge", type=float, default=45.0, help="seconds the controller runs from each start")
    ap.add_argument("--steady-rounds", type=int, default=3)
    ap.add_argument("--steady-window", type=float, default=5.0)
    ap.add_argument("--fixed-k", dest="fixed_ks", type=lambda x: [int(v) for v in x.split(",")], default=None,
                    help="the fixed ks served in the steady stage's rounds (default: 0..K)")
    ap.add_argument("--extra-table", action="append", default=[], metavar="NAME=JSON",
                    help="another table served in the steady stage's rounds, e.g. served='[[1,96,3],[97,128,2]]'")
    ap.add_argument("--served-prior", action="store_true",
                    help="publish every table with the engine's served-step model (benchmarks/data/h200/"
                         "<engine>-served.json: envelope, mixed-step fits, workload), as the tuner publishes "
                         "a table it priced by served steps; the controller then prices each served step by "
                         "the prefill it carried")
    ap.add_argument("--out", default="gpu_controller.json")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script on vLLM's CPU build (small tiny model + draft model; figures mean nothing)")
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
    from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
    from tabletune_pipelines.engine import ServerConfig, VLLMServer
    from tabletune_pipelines.evaluation.rig import Rig
    from tabletune_pipelines.evaluation.simulator import quartered
    from tabletune_pipelines.evaluation.synthetic import true_table

    target, head = ENGINES[args.engine]
    if args.fixed_ks is None:
        args.fixed_ks = list(range(len(args.rates.split(",")) + 1))
    rates = tuple(float(x) for x in args.rates.split(","))
    K, n = len(rates), args.max_num_seqs
    ks = tuple(range(K + 1))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tt-gpu-controller-"))
    work.mkdir(parents=True, exist_ok=True)
    pub = work / "published.json"
    launch = tuple((k + 1, k + 1, k) for k in range(K)) + ((K + 1, n, K),)
    if args.cpu_smoke:
        from tabletune_pipelines.evaluation.rig import identity, server_config

        cfg = server_config(work / "engine", pub, rates=rates, launch=launch, max_num_seqs=n, k_max=K)
        ident = dict(identity(), max_num_seqs=n)
    else:
        cfg = ServerConfig(
            model=f"{args.models}/{target}", drafter=f"{args.models}/{head}", method="eagle3",
            num_speculative_tokens=K, table=launch, synthetic_acceptance_rates=rates, max_num_seqs=n,
            max_model_len=512, device="gpu", model_runner="v2", load_format="dummy", startup_timeout=600.0,
            work_dir=str(work / "engine"), step_timing=False, extra_args=("--scheduler-cls", SCHEDULER),
            extra_env={PUBLISHED_ENV: str(pub)})
        ident = {"gpu": "H200", "vllm_version": "0.26.0", "model": cfg.model, "drafter": cfg.drafter,
                 "method": "eagle3", "max_k": K, "max_num_seqs": n, "dtype": "bfloat16",
                 "cudagraph_mode": "FULL_AND_PIECEWISE"}
    profile = profile_ms(args.engine, n)
    tuned = true_table(profile, rates, ks, n=n)
    wrong = quartered(tuned, n=n)
    srv = VLLMServer(cfg)
    rig = Rig(srv, pub, work / "published.live.jsonl", method=cfg.method)

    served_cost = None
    if args.served_prior:
        # The served-step model the tuner stores with every table it prices by served steps (the
        # envelope, the mixed-step fits and the workload), as a published table carries it.
        sc = json.loads((ROOT / "benchmarks" / "data" / "h200" / f"{args.engine}-served.json").read_text())
        served_cost = {key: sc["served_cost"][key] for key in ("envelope", "fits", "workload")}
        print(f"[controller] published with the served model: envelope {served_cost['envelope']}, fits "
              f"{sorted(served_cost['fits'])}, workload {served_cost['workload']['prompt_tokens']:g} / "
              f"{served_cost['workload']['output_tokens']:g} tokens", flush=True)

    def publish(ranges, mode: str) -> int:
        return rig.publish(ranges=ranges, rates=rates, profile=profile, allowed_k=list(ks), n=n, k_max=K,
                           identity=ident, controller={"mode": mode, "step_time_outlier_ratio": 50.0},
                           served_cost=served_cost)

    print(f"[controller] tuned {tuned}; wrong (quartered) {wrong}; rates {rates}", flush=True)
    publish(tuned, "observe")
    t0 = time.monotonic()
    srv.start()
    print(f"[controller] {args.engine} healthy after {time.monotonic() - t0:.0f} s", flush=True)
    result: dict = {"engine": args.engine, "rates": rates, "tuned": tuned, "wrong": wrong, "hook": {}, "repair": {},
                    "served_prior": served_cost is not None}
    try:
        for load in [int(x) for x in args.hook_loads.split(",") if x]:
            publish(tuned, "observe")
            ws, gen = rig.serve(load, args.hook_window, args.settle)
            if not ws:
                print(f"[hook] load {load}: no windows; log tail:\n{srv.log_tail(20)}", flush=True)
                continue
            steps = sum(w.steps for w in ws)
            hook = sum(w.controller["hook_us_mean"] * w.steps for w in ws) / steps
            hook_max = max(w.controller["hook_us_max"] for w in ws)
            # The controller's clean decode steps at the k the tuned table runs at B = load (its own
            # step-time summary, per k), else the nearest batch size observed at that k; the profile's
            # cell is printed beside it (a clean interval under async scheduling can be shorter).
            k_in_force = next(k for s, e, k in tuned if s <= load <= e)
            cells = [(int(b), float(ms), int(c)) for b, ms, c, _ in
                     ws[-1].controller.get("step_time", {}).get(str(k_in_force), [])]
            near = [c for c in cells if c[0] == load] or sorted(cells, key=lambda c: (abs(c[0] - load), -c[2]))[:1]
            step_ms = near[0][1] if near else float("nan")
            prof_ms = float(profile[k_in_force][load])
            busy_ms = sum(w.busy_s for w in ws) * 1000.0 / steps
            result["hook"][load] = {"hook_us": hook, "hook_us_max": hook_max, "k": k_in_force, "step_ms": step_ms,
                                    "step_b": near[0][0] if near else None, "profile_ms": prof_ms,
                                    "busy_step_ms": busy_ms, "steps": steps, "ratio": hook / (step_ms * 1000.0),
                                    "ratio_profile": hook / (prof_ms * 1000.0), "requests": gen.completed}
            print(f"[hook] load {load:>3}: {steps} steps, {gen.completed} requests; hook {hook:.2f} µs mean "
                  f"(max {hook_max:.1f}); clean decode step at k = {k_in_force}, B = {near[0][0] if near else '?'}: "
                  f"{step_ms:.3f} ms (profiled {prof_ms:.3f} ms; all steps {busy_ms:.3f} ms); hook / step = "
                  f"{hook / (step_ms * 1000.0):.4%} ({hook / (prof_ms * 1000.0):.4%} of the profiled step)", flush=True)
        policies = {"wrong": (wrong, "observe"), "tuned": (tuned, "observe"), "controller": (wrong, "control")}
        names = list(policies)
        goodput: dict[tuple[str, int], list[float]] = {}
        ended: dict[int, list] = {}
        repaired_after: dict[int, list] = {}
        loads = [int(x) for x in args.repair_loads.split(",") if x]
        for r in range(args.rounds):
            for load in loads:
                for name in rotated(names, r):
                    ranges, mode = policies[name]
                    v = publish(ranges, mode)
                    t_pub = time.monotonic()
                    ws, gen = rig.serve(load, args.window, args.settle)
                    busy = sum(w.busy_s or 0.0 for w in ws)
                    g = sum(w.tokens or 0 for w in ws) / busy if busy else float("nan")
                    goodput.setdefault((name, load), []).append(g)
                    if name == "controller":
                        ended[load] = ws[-1].controller["table"] if ws else None
                        mine = [w for w in rig.windows() if w.table_version == v and w.controller]
                        first = next((w for w in mine if w.controller["table"] != [list(x) for x in wrong]), None)
                        repaired_after.setdefault(load, []).append(
                            None if first is None else round(Rig.seconds_into(first, mine), 2))
                    print(f"[repair] round {r} load {load:>3} {name:<10} {g:9.1f} tok/s ({len(ws)} windows, "
                          f"{gen.completed} requests, {time.monotonic() - t_pub:.1f} s)", flush=True)
        if args.steady:
            # The starts: the table TableTune publishes for this engine from its decode-step profile (the
            # evidence search of ``tabletune table``: k = K at every B for these rates, the cliff at load
            # 128; recorded with the served-step profile) and its quarter.
            served_json = ROOT / "benchmarks" / "data" / "h200" / f"{args.engine}-served.json"
            published = (json.loads(served_json.read_text())["decode_only"] if not args.cpu_smoke
                         else [[1, n, K]])
            published = [list(r) for r in published]
            result["steady"] = steady(args, rig, publish, {"cliff": published, "quartered": quartered(published, n=n)},
                                      K)
    finally:
        srv.stop()
    if not loads:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        return 0
    print(f"\n{args.engine}: controller repair from the quartered table (goodput tok/s ± s.e. across rounds)")
    print("| load | wrong | tuned | controller | controller / wrong | controller / tuned | gap recovered |")
    print("|---|---|---|---|---|---|---|")
    for load in loads:
        cells = {nm: mean_se(goodput.get((nm, load), [])) for nm in names}
        ratio = {}
        for other in ("wrong", "tuned"):
            ratio[other] = mean_se([c / o for c, o in zip(goodput.get(("controller", load), []),
                                                           goodput.get((other, load), [])) if o > 0])
        gaps = [(c - w) / (t - w) for c, w, t in zip(goodput.get(("controller", load), []),
                                                       goodput.get(("wrong", load), []),
                                                       goodput.get(("tuned", load), [])) if t - w != 0]
        gap = mean_se(gaps)
        result["repair"][load] = {"goodput": {nm: goodput.get((nm, load), []) for nm in names},
                                  "controller_over_wrong": ratio["wrong"], "controller_over_tuned": ratio["tuned"],
                                  "gap_recovered": gap, "ended_on": ended.get(load),
                                  "repaired_after_s": repaired_after.get(load)}
        print(f"| {load} | " + " | ".join(f"{cells[nm][0]:.0f} ± {cells[nm][1]:.0f}" for nm in names) + " | "
              + " | ".join(f"{ratio[o][0]:.3f} ± {ratio[o][1]:.3f}" for o in ("wrong", "tuned"))
              + f" | {gap[0]:.0%} ± {gap[1]:.0%} |")
    print("controller's table at the end: " + "; ".join(f"load {ld}: {ended.get(ld)}" for ld in loads))
    print("first table change after (s, per round): " + "; ".join(f"load {ld}: {repaired_after.get(ld)}" for ld in loads))
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


def _goodput(ws) -> float:
    busy = sum(w.busy_s or 0.0 for w in ws)
    return sum(w.tokens or 0 for w in ws) / busy if busy else float("nan")


def steady(args, rig, publish, starts: dict, K: int) -> dict:
    """The controller under steady load from each start (control mode, ``--converge`` seconds), then
    the table it ended on against every fixed k in rounds, all in this launch (observe mode,
    rotating order). Printed per load: goodput ± s.e. of each fixed k and each ended table, the ended
    table / best fixed k paired per round, the controller's own goodput over the last third of its run
    (exploration and hook included) / best fixed k, its ranges and its switches per hour."""
    from tabletune_pipelines.evaluation.rig import Rig

    pairs = [(int(a), b) for a, b in (x.split(":") for x in args.steady.split(",") if x)]
    out: dict = {}
    for load in sorted({ld for ld, _ in pairs}):
        runs = {}
        for ld, start in pairs:
            if ld != load:
                continue
            v = publish(starts[start], "control")
            t0 = time.monotonic()
            ws, gen = rig.serve(load, args.converge, 0.0)
            mine = [w for w in ws if w.table_version == v]
            tail = [w for w in mine if Rig.seconds_into(w, mine) >= args.converge * 2 / 3] or mine[-1:]
            last = mine[-1].controller if mine else {}
            live = [_goodput([w]) for w in tail]
            # Switches per hour in steady state: over the last third only (the first rebuilds repair the
            # start table, one switch per batch size changed).
            t_tail = sum((w.window_end - w.window_start).total_seconds() for w in tail)
            first = tail[0].controller.get("switches", 0) if tail else 0
            steady_sph = ((mine[-1].controller.get("switches", 0) - first) / (t_tail / 3600.0)
                          if tail and t_tail > 0 else float("nan"))
            runs[start] = {"ended_on": last.get("table"), "ranges": len(last.get("table") or []),
                           "switches": last.get("switches"), "switches_per_hour": last.get("switches_per_hour"),
                           "reversals": last.get("reversals"), "held": last.get("held_batch_sizes"),
                           "steps": last.get("steps"), "live_tail": live, "windows": len(mine),
                           "steady_switches_per_hour": steady_sph,
                           "tables": [w.controller["table"] for w in mine]}
            print(f"[steady] load {load:>3} controller from {start}: {len(mine)} windows, {last.get('steps')} steps, "
                  f"{gen.completed} requests in {time.monotonic() - t0:.0f} s; ended on {last.get('table')} "
                  f"({runs[start]['ranges']} ranges); switches {last.get('switches')} "
                  f"({last.get('switches_per_hour')}/h since start, {steady_sph:.0f}/h over the last third), "
                  f"reversals {last.get('reversals')}; live goodput over the "
                  f"last third {mean_se(live)[0]:.0f} ± {mean_se(live)[1]:.0f} tok/s", flush=True)
        policies = {f"k={k}": [[1, args.max_num_seqs, k]] for k in args.fixed_ks}
        policies.update({f"ended<-{st}": r["ended_on"] for st, r in runs.items() if r["ended_on"]})
        for spec in args.extra_table:
            name, _, table = spec.partition("=")
            policies[name] = json.loads(table)
        names = list(policies)
        g: dict[str, list[float]] = {nm: [] for nm in names}
        for r in range(args.steady_rounds):
            for nm in rotated(names, r):
                publish(policies[nm], "observe")
                ws, gen = rig.serve(load, args.steady_window, args.settle)
                g[nm].append(_goodput(ws))
                print(f"[steady] round {r} load {load:>3} {nm:<16} {g[nm][-1]:9.1f} tok/s ({len(ws)} windows)",
                      flush=True)
        fixed = [nm for nm in names if nm.startswith("k=")]
        best = max(fixed, key=lambda nm: mean_se(g[nm])[0])
        res = {"goodput": g, "best_fixed": best, "controller": runs, "vs_best": {}}
        print(f"\n{args.engine} load {load}: goodput tok/s ± s.e. over {args.steady_rounds} rounds; best fixed {best}")
        for nm in names:
            ratio = mean_se([a / b for a, b in zip(g[nm], g[best]) if b > 0])
            res["vs_best"][nm] = ratio
            print(f"  {nm:<16} {mean_se(g[nm])[0]:9.0f} ± {mean_se(g[nm])[1]:6.0f}   / best fixed (paired) "
                  f"{ratio[0]:.3f} ± {ratio[1]:.3f}")
        for st, r in runs.items():
            live = mean_se(r["live_tail"])
            b_mean, b_se = mean_se(g[best])
            ratio = live[0] / b_mean if b_mean else float("nan")
            err = ratio * ((live[1] / live[0]) ** 2 + (b_se / b_mean) ** 2) ** 0.5 if live[0] and b_mean else float("nan")
            r["live_over_best"] = (ratio, err)
            print(f"  controller from {st}: live {live[0]:.0f} ± {live[1]:.0f} tok/s = {ratio:.3f} ± {err:.3f} of best "
                  f"fixed (unpaired); ended on {r['ranges']} ranges {r['ended_on']}; switches/h "
                  f"{r['switches_per_hour']} since start, {r['steady_switches_per_hour']:.0f} over the last third")
        out[load] = res
    return out


if __name__ == "__main__":
    raise SystemExit(main())

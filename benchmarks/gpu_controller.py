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
   (``tests.controller._fake.true_table``, the rule the controller's own rebuild applies), not the
   evidence search of ``tabletune table``.
2. Repair: policies ``wrong`` (the tuned table with every range shrunk to a quarter, k = 0 above:
   the method's repair experiment; observe mode), ``tuned`` (observe mode), ``controller`` (control
   mode starting from the wrong table), each published as a new version, at each ``--repair-loads``
   load, ``--rounds`` rounds in rotating order. Goodput = kept tokens / busy seconds from the
   controller's exported windows after a settle. Printed: goodput ± s.e., controller / wrong and
   controller / tuned paired per round, the share of the wrong-vs-tuned gap recovered, and the
   table the controller ended on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tabletune_pipelines.evaluation.served import rotated  # noqa: E402
from _common import mean_se  # noqa: E402

ENGINES = {
    "dense": ("qwen3-4b", "qwen3-4b-eagle3"),
    "moe": ("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3"),
}
SCHEDULER = "tabletune_pipelines.controller.scheduler.ControllerScheduler"


def profile_ms(engine: str, n: int) -> dict[int, dict[int, float]]:
    """The engine's H200 profile (all-rejected cells), interpolated to every B in 1..n."""
    import numpy as np

    from tabletune_pipelines.documents import StepTimeProfile

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
    ap.add_argument("--out", default="gpu_controller.json")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script on vLLM's CPU build (small tiny model + draft model; figures mean nothing)")
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
    from tabletune_pipelines.controller.settings import PUBLISHED_ENV
    from tabletune_pipelines.engine import ServerConfig, VLLMServer
    from tests.controller._engine import Rig
    from tests.controller._fake import quartered, true_table

    target, head = ENGINES[args.engine]
    rates = tuple(float(x) for x in args.rates.split(","))
    K, n = len(rates), args.max_num_seqs
    ks = tuple(range(K + 1))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tt-gpu-controller-"))
    work.mkdir(parents=True, exist_ok=True)
    pub = work / "published.json"
    launch = tuple((k + 1, k + 1, k) for k in range(K)) + ((K + 1, n, K),)
    if args.cpu_smoke:
        from tests.controller._engine import identity, server_config

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

    def publish(ranges, mode: str) -> int:
        return rig.publish(ranges=ranges, rates=rates, profile=profile, allowed_k=list(ks), n=n, k_max=K,
                           identity=ident, controller={"mode": mode, "step_time_outlier_ratio": 50.0})

    print(f"[controller] tuned {tuned}; wrong (quartered) {wrong}; rates {rates}", flush=True)
    publish(tuned, "observe")
    t0 = time.monotonic()
    srv.start()
    print(f"[controller] {args.engine} healthy after {time.monotonic() - t0:.0f} s", flush=True)
    result: dict = {"engine": args.engine, "rates": rates, "tuned": tuned, "wrong": wrong, "hook": {}, "repair": {}}
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
            cells = [(int(b), float(ms), int(c)) for cs in ws[-1].controller.get("step_time", {}).values()
                     for b, ms, c, _ in cs]
            near = [c for c in cells if c[0] == load] or sorted(cells, key=lambda c: (abs(c[0] - load), -c[2]))[:1]
            step_ms = near[0][1] if near else float("nan")
            busy_ms = sum(w.busy_s for w in ws) * 1000.0 / steps
            result["hook"][load] = {"hook_us": hook, "hook_us_max": hook_max, "step_ms": step_ms,
                                    "step_b": near[0][0] if near else None, "busy_step_ms": busy_ms, "steps": steps,
                                    "ratio": hook / (step_ms * 1000.0), "requests": gen.completed}
            print(f"[hook] load {load:>3}: {steps} steps, {gen.completed} requests; hook {hook:.2f} µs mean "
                  f"(max {hook_max:.1f}); decode step at B = {near[0][0] if near else '?'}: {step_ms:.3f} ms "
                  f"(all steps {busy_ms:.3f} ms); hook / step = {hook / (step_ms * 1000.0):.4%}", flush=True)
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
    finally:
        srv.stop()
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


if __name__ == "__main__":
    raise SystemExit(main())

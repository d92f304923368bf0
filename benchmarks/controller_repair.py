"""Goodput recovered by the controller from a wrong table, next to the wrong and the tuned table,
in ONE launch.

    python benchmarks/controller_repair.py
    python benchmarks/controller_repair.py --rates 0.7,0.5,0.3 --loads 2,6,10,14 --rounds 3 --window 6

One launch of the small tiny target + 1-layer draft (``draft_model``, K = 3, launch table listing
every k, max_num_seqs 16, synthetic acceptance ``--rates``: the true acceptance is known) with the
controller plugin (``--scheduler-cls ...ControllerScheduler``, ``TABLETUNE_PUBLISHED_TABLE``).

1. Profile in the same launch: for each k in 0..3 and each load L, publish ``[[1, 16, k]]`` in
   observe mode and let L closed-loop clients run; the controller's own mean of clean step
   intervals at B = L is T(L, k) (interpolated over B in between, held beyond).
2. The tuned table = the search on that profile with the true rates; the wrong table = the tuned
   table with every range shrunk to a quarter, no speculation above (the method's repair
   experiment; its docs' table shrunk to a quarter: no speculation above 32 of 128).
3. Policies, each published as a new version and measured at every load, ``--rounds`` rounds in
   the order of ``served.rotated`` (a balanced Latin square) so drift and carry-over hit all alike:
   ``wrong`` (observe mode: the wrong table stays), ``tuned`` (observe mode), ``controller``
   (control mode starting from the wrong table, prior = the true rates, the profile above; its
   first rebuild after 100 steps repairs the table, so its windows include the repair), ``no-merge``
   (the same with ``merge_islands: false``: the island rule's A/B inside the launch).
   Goodput = kept tokens / busy seconds from the controller's exported windows (every step keeps
   each request's target token plus its accepted drafts), after a settle of ``--settle`` s.

Printed: per load, each policy's goodput (mean over rounds ± standard error), the controller over
each other policy (paired per round), the tables the two controllers ended on, and per window the
load average and the requests per drafting step (far below the load: the engine served one request
while the clients had more in flight).

``--busy-wait sleep`` (the default) runs the server with the poll of ``benchmarks/_busywait``
sleeping 50 µs instead of ``sched_yield()``: on 2 cores the yielding poll starves the clients, and
the engine serves one request at a time for seconds (docs/engine-facts.md, "Spells of one
request"; a launch with ``yield`` is decided by them: ``benchmarks/data/cpu/2026-12-04-controller-repair-island-ab.log``).
``yield`` is vLLM as shipped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.core.stats import mean_se
from tabletune_pipelines.tuning.served_load import rotated


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0.7,0.5,0.3")
    ap.add_argument("--loads", default="2,6,10,14")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=6.0, help="seconds measured per policy and load")
    ap.add_argument("--settle", type=float, default=1.5, help="seconds after a publication before measuring")
    ap.add_argument("--profile-window", type=float, default=4.0)
    ap.add_argument("--busy-wait", choices=("sleep", "yield"), default="sleep",
                    help="the engine core's poll: a 50 µs sleep (no spells on 2 cores) or vLLM's sched_yield")
    args = ap.parse_args()
    import logging

    logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.rig import Rig, drafting_requests_per_step, server_config
    from tabletune_pipelines.evaluation.simulator import quartered
    from tabletune_pipelines.evaluation.synthetic import true_table

    rates = tuple(float(x) for x in args.rates.split(","))
    loads = ints(args.loads) or [2, 8]
    n, ks = 16, (0, 1, 2, 3)
    work = Path(tempfile.mkdtemp(prefix="tt-repair-"))
    pub = work / "local.json"
    env = None
    if args.busy_wait == "sleep":
        from _busywait import server_env

        (work / "busywait.on").touch()
        env = server_env(work / "busywait.on")
    srv = VLLMServer(server_config(work, pub, rates=rates, extra_env=env))
    rig = Rig(srv, pub, work / "local.live.jsonl")

    def flat_profile(ms: float = 10.0):
        return {k: {b: ms for b in range(1, n + 1)} for k in ks}

    rig.publish(ranges=[(1, n, 3)], rates=rates, profile=flat_profile(), controller={"mode": "observe"})
    t0 = time.monotonic()
    srv.start()
    print(f"engine started in {time.monotonic() - t0:.0f} s; rates {rates}; busy-wait {args.busy_wait}; "
          f"load average {loadavg()}")

    try:
        # 1. profile in this launch
        measured: dict[int, dict[int, float]] = {k: {} for k in ks}
        for k in ks:
            for load in loads:
                rig.publish(ranges=[(1, n, k)], rates=rates, profile=flat_profile(), allowed_k=[k],
                            controller={"mode": "observe", "step_time_outlier_ratio": 50.0})
                ws, _ = rig.serve(load, args.profile_window, 1.5)
                cells = [c for w in ws[-1:] for c in w.controller.get("step_time", {}).get(str(k), [])]
                at = [c for c in cells if c[0] == load] or sorted(cells, key=lambda c: -c[2])[:1]
                if at:
                    measured[k][int(at[0][0])] = float(at[0][1])
            print(f"profile k = {k}: " + ", ".join(f"T({b}) = {ms:.2f} ms" for b, ms in sorted(measured[k].items())))
        import numpy as np

        profile = {}
        for k in ks:
            xs = sorted(measured[k])
            profile[k] = {b: float(np.interp(b, xs, [measured[k][x] for x in xs])) for b in range(1, n + 1)}
        tuned = true_table(profile, rates, ks)
        wrong = quartered(tuned, n)
        print(f"tuned table {tuned}; wrong table (quarter) {wrong}")
        policies = {
            "wrong": dict(ranges=wrong, controller={"mode": "observe"}),
            "tuned": dict(ranges=tuned, controller={"mode": "observe"}),
            "controller": dict(ranges=wrong, controller={"mode": "control"}),
            "no-merge": dict(ranges=wrong, controller={"mode": "control", "merge_islands": False}),
        }
        names = list(policies)
        results: dict[tuple[str, int], list[float]] = {}
        ended: dict[tuple[str, int], list] = {}
        for r in range(args.rounds):
            order = rotated(names, r)
            for load in loads:
                for name in order:
                    spec = policies[name]
                    rig.publish(ranges=spec["ranges"], rates=rates, profile=profile, allowed_k=list(ks),
                                controller=spec["controller"])
                    ws, gen = rig.serve(load, args.window, args.settle)
                    busy = sum(w.busy_s or 0.0 for w in ws)
                    g = sum(w.tokens or 0 for w in ws) / busy if busy else float("nan")
                    results.setdefault((name, load), []).append(g)
                    ended[(name, load)] = ws[-1].controller["table"] if ws else None
                    # Requests per drafting step: far below the load, the engine ran spells with one
                    # request while the clients had `load` in flight (docs/engine-facts.md, "Spells of one request").
                    per_step = drafting_requests_per_step(ws)
                    print(f"round {r} load {load:>2} {name:<10} {g:8.1f} tok/s ({len(ws)} windows, "
                          f"{gen.completed} requests, {per_step:.1f} drafting requests per step)  "
                          f"load average {loadavg()}")
    finally:
        srv.stop()

    others = [nm for nm in names if nm != "controller"]
    print("\n| load | " + " | ".join(f"{nm} tok/s" for nm in names) + " | "
          + " | ".join(f"controller / {o}" for o in others) + " |")
    print("|---|" + "---|" * (len(names) + len(others)))
    for load in loads:
        cells = {nm: mean_se(results[(nm, load)]) for nm in names}
        ratios = {}
        for other in others:
            rs = [c / o for c, o in zip(results[("controller", load)], results[(other, load)]) if o > 0]
            ratios[other] = mean_se(rs)
        print(f"| {load} | " + " | ".join(f"{cells[nm][0]:.1f} ± {cells[nm][1]:.1f}" for nm in names) + " | "
              + " | ".join(f"{ratios[o][0]:.3f} ± {ratios[o][1]:.3f}" for o in others) + " |")
    for nm in ("controller", "no-merge"):
        print(f"\n{nm}'s table at the end (last round): "
              + "; ".join(f"load {ld}: {ended[(nm, ld)]}" for ld in loads))
    print(f"load average at the end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

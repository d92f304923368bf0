"""What the controller costs: per-step hook and rebuild, as ratios to a decode step of the same run.

    python benchmarks/controller_overhead.py                      # engine part + in-process part
    python benchmarks/controller_overhead.py --no-engine          # in-process part only (seconds)
    python benchmarks/controller_overhead.py --loads 1,8,32,64 --window 6

Targets: the per-step hook under 1% of a decode step; a rebuild under 1 ms at
max_num_seqs 1024.

1. Engine (one launch of the small tiny target + 1-layer draft, ``draft_model``, K = 3, launch
   table listing every k, max_num_seqs = max(loads), the controller plugin in control mode, its
   Prometheus series on and served through ``PROMETHEUS_MULTIPROC_DIR``). At
   each load L (L closed-loop clients), the controller's own export reports, per window: the mean
   and max time of its per-step hook (``hook_us_mean``/``hook_us_max``: the counting in
   ``update_from_output``, timed inside the engine process, not counting the building of the
   step's ``StepOutcome``), the rebuild time, and the mean clean decode step (its step-time
   observations). Ratios hook / step are of the same windows.
2. In process (no vLLM): the same ``Controller`` driven by a fake scheduler output at B up to 256
   with max k 8 and max_num_seqs 1024 (``--max-num-seqs``): hook µs per step (``next_lookup``,
   building the step's ``StepOutcome`` and ``on_step``; median over ``--rounds`` rounds of
   ``--steps`` steps; min–max of the round medians), and the rebuild's ms (median, p90, max over
   ``--rebuilds`` rebuilds whose counts change every time, so most rebuilds change the table: the
   worst case). The decode step it is compared with is the engine's step at the nearest measured
   load (step times grow with B, so at B above the largest load the ratio is an upper bound), and
   H200 steps of vLLM 0.26 (docs/engine-facts.md, "GPU (H200, vLLM 0.26)": 4.7–10.5 ms at
   B = 1–128 with EAGLE-3) for reference.

3. Prometheus series on and off (``--metrics-ab``), side by side in one run: two controllers on the
   same published file, one with the series (``controller.metrics``, writing to a
   ``PROMETHEUS_MULTIPROC_DIR`` as inside vLLM's engine core) and one without, driven by the same
   fake steps in alternating rounds (which arm goes first alternates too). Per batch size: the
   mean over rounds of each round's median hook µs per step, with its standard error, and the
   paired difference on − off; then the rebuild's ms on and off, interleaved the same way (the
   series are pushed at rebuilds). ``--metrics-ab`` alone skips parts 1 and 2.

Every figure is printed with the machine's load average (docs/engine-facts.md, "Noise on 2 cores").
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import ints, loadavg

#: H200 step times (ms) of the docs' GPU facts, Qwen3-4B-shaped + EAGLE-3, table k = 3, V2.
H200_K3_MS = {1: 4.68, 8: 4.84, 32: 5.34, 64: 6.64, 128: 10.49}


def engine_part(loads: list[int], window_s: float) -> dict[int, dict[str, float]]:
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.rig import Rig, identity, server_config
    from tabletune_pipelines.evaluation.synthetic import linear_profile

    n = max(loads)
    work = Path(tempfile.mkdtemp(prefix="tt-overhead-"))
    pub = work / "local.json"
    launch = ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, n, 3)) if n >= 4 else ((1, n, 3),)
    (work / "prom").mkdir()  # the controller's Prometheus series reach /metrics, as in production (docs/metrics.md)
    srv = VLLMServer(server_config(work, pub, rates=(0.7, 0.5, 0.3), launch=launch, max_num_seqs=n,
                                   extra_env={"PROMETHEUS_MULTIPROC_DIR": str(work / "prom")}))
    rig = Rig(srv, pub, work / "local.live.jsonl")
    rig.publish(ranges=[(1, n, 3)], rates=(0.7, 0.5, 0.3), profile=linear_profile(n), n=n,
                identity=dict(identity(), max_num_seqs=n), controller={"step_time_outlier_ratio": 50.0})
    out: dict[int, dict[str, float]] = {}
    t0 = time.monotonic()
    srv.start()
    print(f"engine started in {time.monotonic() - t0:.0f} s; load average {loadavg()}")
    try:
        for load in loads:
            ws, _ = rig.serve(load, window_s, 2.0)
            ws = [w for w in ws if w.controller.get("hook_us_mean") is not None]
            if not ws:
                print(f"load {load}: no windows")
                continue
            steps = sum(w.steps for w in ws)
            hook = sum(w.controller["hook_us_mean"] * w.steps for w in ws) / steps
            hook_max = max(w.controller["hook_us_max"] for w in ws)
            cells = [(b, ms, cnt) for w in ws[-1:] for cs in w.controller.get("step_time", {}).values()
                     for b, ms, cnt, _ in cs]
            near = [c for c in cells if c[0] == load] or sorted(cells, key=lambda c: -c[2])[:1]
            step_ms = near[0][1] if near else sum(w.busy_s for w in ws) * 1000.0 / steps
            busy_step = sum(w.busy_s for w in ws) * 1000.0 / steps
            rebuild = max(w.controller["last_rebuild_ms"] for w in ws)
            out[load] = {"hook_us": hook, "hook_us_max": hook_max, "step_ms": step_ms, "busy_step_ms": busy_step,
                         "rebuild_ms": rebuild, "steps": steps}
            print(f"load {load:>3}: {steps} steps; hook {hook:7.2f} µs mean (max {hook_max:7.1f}); clean decode step "
                  f"at B = {near[0][0] if near else '?'}: {step_ms:7.2f} ms (all steps {busy_step:.2f} ms); "
                  f"hook / step = {hook / (step_ms * 1000):.4%}; last rebuild {rebuild:.3f} ms; "
                  f"load average {loadavg()}")
    finally:
        srv.stop()
    return out


def in_process(batch_sizes: list[int], max_k: int, n: int, steps: int, rounds: int, rebuilds: int):
    import random

    from tabletune_pipelines.controller.loader import EngineFacts
    from tabletune_pipelines.controller.logic import Controller
    from tabletune_pipelines.controller.step import StepOutcome
    from tabletune_pipelines.evaluation.synthetic import IDENTITY, linear_profile, publish

    work = Path(tempfile.mkdtemp(prefix="tt-overhead-"))
    launch = tuple((k + 1, k + 1, k) for k in range(max_k)) + ((max_k + 1, n, max_k),)
    rates = [max(0.05, 0.9 - 0.1 * i) for i in range(max_k)]
    profile = linear_profile(n, max_k)
    # The largest intervals the settings allow (ControllerSettings.BOUNDS): no rebuild or export inside
    # the timed steps (6 batch sizes x 3000 steps x 5 rounds = 90000 by default); rebuilds are timed below.
    p = publish(work / "p.json", ranges=[(1, n // 4, max_k), (n // 4 + 1, n // 2, 2), (n // 2 + 1, n, 1)],
                rates=rates, profile=profile, allowed_k=list(range(max_k + 1)), n=n, k_max=max_k,
                identity=dict(IDENTITY, max_k=max_k, max_num_seqs=n),  # a file without one is refused
                controller={"rebuild_every_steps": 100_000, "export_every_steps": 1_000_000,
                            "export_every_s": 3600.0, "step_time_outlier_ratio": 1000.0})
    clock = [0.0]
    c = Controller(EngineFacts(max_k, n, launch), p, clock=lambda: clock[0])
    rng = random.Random(0)
    hook: dict[int, list[float]] = {}
    for b in batch_sizes:
        ids = [f"req-{i}" for i in range(b)]
        idx = {r: i for i, r in enumerate(ids)}
        nst = {r: 1 + max_k for r in ids}
        spec = {r: [7] * max_k for r in ids}
        sampled_variants = [[[1] * (1 + rng.randint(0, max_k)) for _ in ids] for _ in range(16)]
        step_s = profile[max_k][b] / 1000.0
        meds = []
        for _ in range(rounds):
            ts = []
            for s in range(steps):
                sampled = sampled_variants[s % 16]
                clock[0] += step_s  # steps as long as the profile says: the correction stays ~1
                t = time.perf_counter_ns()
                c.next_lookup()
                # The record is built inside the timed part, as the vLLM adapter builds it per step.
                c.on_step(StepOutcome(nst, spec, idx, sampled, max_k, 0, b * (1 + max_k), clock[0]))
                ts.append(time.perf_counter_ns() - t)
            meds.append(statistics.median(ts) / 1000.0)
        hook[b] = meds
    times = []
    for i in range(rebuilds):
        # Acceptance flips between high and low each time, so (nearly) every rebuild changes the table.
        c.evidence.hist_d[max_k] += 20000
        c.evidence.hist_a[max_k if i % 2 == 0 else 0] += 20000
        t = time.perf_counter()
        c.rebuild(clock[0])
        times.append((time.perf_counter() - t) * 1000.0)
    times.sort()
    return hook, times, c.counters.table_changes


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and its standard error."""
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def metrics_ab(batch_sizes: list[int], max_k: int, n: int, steps: int, rounds: int, rebuilds: int) -> None:
    """Part 3 of the module docstring: the hook and the rebuild with the series on and off."""
    import os
    import random

    work = Path(tempfile.mkdtemp(prefix="tt-overhead-ab-"))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(work / "prom"))  # before prometheus_client is imported
    Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
    from prometheus_client import CollectorRegistry

    from tabletune_pipelines.controller.loader import EngineFacts
    from tabletune_pipelines.controller.logic import Controller
    from tabletune_pipelines.controller.metrics import CellCounts, Metrics, PromSink
    from tabletune_pipelines.controller.step import StepOutcome
    from tabletune_pipelines.evaluation.synthetic import IDENTITY, linear_profile, publish

    launch = tuple((k + 1, k + 1, k) for k in range(max_k)) + ((max_k + 1, n, max_k),)
    rates = [max(0.05, 0.9 - 0.1 * i) for i in range(max_k)]
    profile = linear_profile(n, max_k)
    log = logging.getLogger("tabletune.bench.ab")
    log.setLevel(logging.ERROR)
    arms = {}
    for name in ("off", "on"):
        p = publish(work / name / "p.json", ranges=[(1, n // 4, max_k), (n // 4 + 1, n // 2, 2), (n // 2 + 1, n, 1)],
                    rates=rates, profile=profile, allowed_k=list(range(max_k + 1)), n=n, k_max=max_k,
                    identity=dict(IDENTITY, max_k=max_k, max_num_seqs=n),
                    controller={"rebuild_every_steps": 100_000, "export_every_steps": 1_000_000,
                                "export_every_s": 3600.0, "step_time_outlier_ratio": 1000.0})
        clock = [0.0]
        cells = CellCounts(max_k, n)
        mt = Metrics(cells, PromSink({"model_name": "bench", "engine": "0"}, cells, registry=CollectorRegistry(),
                                     log=log), log) if name == "on" else None
        arms[name] = (Controller(EngineFacts(max_k, n, launch), p, clock=lambda c=clock: c[0], log=log, metrics=mt),
                      clock)
    rng = random.Random(0)
    print(f"\nPrometheus series on vs off, in process (max k {max_k}, max_num_seqs {n}, {rounds} rounds of {steps} "
          f"steps per arm and batch size, arms alternating; multiprocess folder {os.environ['PROMETHEUS_MULTIPROC_DIR']}); "
          f"load average {loadavg()}")
    print("| B | hook µs/step off | on | on − off (paired) | on − off vs H200 step (k=3) |")
    print("|---|---|---|---|---|")
    for b in batch_sizes:
        ids = [f"req-{i}" for i in range(b)]
        idx = {r: i for i, r in enumerate(ids)}
        nst = {r: 1 + max_k for r in ids}
        spec = {r: [7] * max_k for r in ids}
        variants = [[[1] * (1 + rng.randint(0, max_k)) for _ in ids] for _ in range(16)]
        step_s = profile[max_k][b] / 1000.0
        med: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(rounds):
            for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                c, clock = arms[name]
                ts = []
                for s_ in range(steps):
                    clock[0] += step_s
                    t = time.perf_counter_ns()
                    c.next_lookup()
                    c.on_step(StepOutcome(nst, spec, idx, variants[s_ % 16], max_k, 0, b * (1 + max_k), clock[0]))
                    ts.append(time.perf_counter_ns() - t)
                med[name].append(statistics.median(ts) / 1000.0)
        (m0, e0), (m1, e1) = mean_se(med["off"]), mean_se(med["on"])
        dm, de = mean_se([y - x for x, y in zip(med["off"], med["on"])])
        hb = max((x for x in H200_K3_MS if x <= b), default=1)
        print(f"| {b} | {m0:.2f} ± {e0:.2f} | {m1:.2f} ± {e1:.2f} | {dm:+.2f} ± {de:.2f} | "
              f"{dm / (H200_K3_MS[hb] * 1000):+.4%} of {H200_K3_MS[hb]} ms (B={hb}) |")
    times: dict[str, list[float]] = {"off": [], "on": []}
    push: list[float] = []
    for i in range(rebuilds):
        for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
            c, clock = arms[name]
            # Acceptance flips between high and low each time, so (nearly) every rebuild changes the table.
            c.evidence.hist_d[max_k] += 20000
            c.evidence.hist_a[max_k if i % 2 == 0 else 0] += 20000
            t = time.perf_counter()
            c.rebuild(clock[0])
            times[name].append((time.perf_counter() - t) * 1000.0)
            if name == "on":  # the push of the state the rebuild just made, once more on its own
                t = time.perf_counter()
                c.metrics.state(c)
                push.append((time.perf_counter() - t) * 1000.0)
    (r0, s0), (r1, s1) = mean_se(times["off"]), mean_se(times["on"])
    pm, ps = mean_se(push)
    push.sort()
    rd, rs = mean_se([y - x for x, y in zip(times["off"], times["on"])])
    print(f"\nrebuild ({rebuilds} per arm, interleaved): off {r0:.3f} ± {s0:.3f} ms (median "
          f"{statistics.median(times['off']):.3f}), on {r1:.3f} ± {s1:.3f} ms (median {statistics.median(times['on']):.3f}); "
          f"on − off {rd:+.3f} ± {rs:.3f} ms (paired); changes off {arms['off'][0].counters.table_changes}, "
          f"on {arms['on'][0].counters.table_changes}; load average {loadavg()}")
    print(f"the series' state push at a rebuild, timed on its own ({len(push)} times): {pm:.3f} ± {ps:.3f} ms, "
          f"median {statistics.median(push):.3f}, p99 {push[int(0.99 * (len(push) - 1))]:.3f} ms; per step at "
          f"rebuild_every_steps 100: {pm * 10:.2f} µs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-engine", action="store_true", help="skip the vLLM part")
    ap.add_argument("--loads", default="1,8,32,64", help="closed-loop clients per engine window")
    ap.add_argument("--window", type=float, default=6.0, help="seconds measured per load")
    ap.add_argument("--batch-sizes", default="1,8,32,64,128,256")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rebuilds", type=int, default=500)
    ap.add_argument("--metrics-ab", action="store_true", help="only part 3: the Prometheus series on vs off")
    ap.add_argument("--ab-rounds", type=int, default=20, help="rounds per arm and batch size in part 3")
    args = ap.parse_args()

    logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
    if args.metrics_ab:
        metrics_ab(ints(args.batch_sizes) or [1, 8], args.max_k, args.max_num_seqs, args.steps, args.ab_rounds,
                   args.rebuilds)
        return 0
    eng = {} if args.no_engine else engine_part(ints(args.loads) or [1, 8], args.window)
    bs = ints(args.batch_sizes) or [1, 8]
    hook, rb, changes = in_process(bs, args.max_k, args.max_num_seqs, args.steps, args.rounds, args.rebuilds)
    print(f"\nin process: max k {args.max_k}, max_num_seqs {args.max_num_seqs}, load average {loadavg()}")
    print("| B | hook µs/step (median of rounds) | min–max | vs engine step | vs H200 step (k=3) |")
    print("|---|---|---|---|---|")
    for b in bs:
        med = statistics.median(hook[b])
        near = max((x for x in eng if x <= b), default=None)
        vs_eng = f"{med / (eng[near]['step_ms'] * 1000):.3%} of {eng[near]['step_ms']:.1f} ms (B={near})" if near else "-"
        hb = max((x for x in H200_K3_MS if x <= b), default=1)
        print(f"| {b} | {med:.2f} | {min(hook[b]):.2f}–{max(hook[b]):.2f} | {vs_eng} | "
              f"{med / (H200_K3_MS[hb] * 1000):.3%} of {H200_K3_MS[hb]} ms (B={hb}) |")
    p90, p99 = rb[int(0.9 * (len(rb) - 1))], rb[int(0.99 * (len(rb) - 1))]
    print(f"\nrebuild at max_num_seqs {args.max_num_seqs}, max k {args.max_k} ({args.max_k + 1} candidate k, "
          f"{changes} of {len(rb)} rebuilds changed the table): median {statistics.median(rb):.3f} ms, "
          f"p90 {p90:.3f} ms, p99 {p99:.3f} ms, max {rb[-1]:.3f} ms (target < 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

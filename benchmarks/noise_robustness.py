"""Tables you can trust on a noisy machine (docs/method.md, "The evidence rule"): the embedded
default profiled twice in one run.

    python benchmarks/noise_robustness.py --out /tmp/tt-noise
    python benchmarks/noise_robustness.py --budget 60 --hog-cores 1

Profile 1 runs on the machine as it is ("quiet"), profile 2 with a bounded CPU hog: a child
process that spins on one core for at most the profile's duration and then exits. Both are the
main command's profile of the embedded default (``deployments.profile``: the fleet's
``local-cpu`` deployment, n-gram drafting on the tiny small target, one launch, 3 repetitions,
all-accepted cells, adaptive re-measurement with ``--budget`` seconds), each into its own DuckDB
store. One n-gram acceptance prior (the default prompt set, as ``tabletune run`` writes it) is
measured once and used for both.

For each profile, and for both search policies (``evidence``, the default, and the method's 0.5 %
``stickiness`` rule on the same cells), it prints: the table, the number of ranges and of
one-batch-size ranges, whether the evidence gate passes, the cells re-measured, the wall-timed
cells, the wall time; and the loss of each table judged on the OTHER profile (worst over B of
1 - G(table) / G(best k at B), with that profile's step times and the prior). Targets: <= 3
ranges and no one-batch-size range on the embedded default, and both evidence tables within 2 %
of each other on either profile. The load average is printed next to every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.evaluation.synthetic import fixed_prior

REPO = Path(__file__).resolve().parents[1]
HOG = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def start_hog(seconds: float, cores: int) -> list[subprocess.Popen]:
    """``cores`` child processes, each spinning on one core for at most ``seconds``."""
    return [subprocess.Popen([sys.executable, "-c", HOG, str(seconds)]) for _ in range(cores)]


def stop_hog(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def loss_on(table, profile, prior) -> float:
    """Worst loss over B of ``table``'s k against the best k at B, on ``profile``'s step times."""
    import numpy as np

    from tabletune_pipelines.tuning.derive import derive_table

    ref = derive_table(profile, prior)  # the same corrected, non-decreasing T the tuner would use
    g = ref.choice.goodput
    ks = list(ref.choice.ks)
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    return float(max(1.0 - g[ks.index(k), b] / g[:, b].max() for b, k in enumerate(dense_k)))


def gap_on(a, b, profile, prior) -> float:
    """Worst over B of |1 - G(table a) / G(table b)| on ``profile``: how far apart two tables are."""
    from tabletune_pipelines.tuning.derive import derive_table

    ref = derive_table(profile, prior)
    g, ks = ref.choice.goodput, list(ref.choice.ks)
    ka = a.draft.dense(a.max_num_seqs, a.max_k).tolist()
    kb = b.draft.dense(b.max_num_seqs, b.max_k).tolist()
    return float(max(abs(1.0 - g[ks.index(x), i] / g[ks.index(y), i]) for i, (x, y) in enumerate(zip(ka, kb))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/tt-noise-robustness")
    ap.add_argument("--models", default="/tmp/tabletune-tiny-models", help="tiny model cache folder")
    ap.add_argument("--budget", type=float, default=120.0, help="re-measurement seconds per profile")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--hog-cores", type=int, default=1)
    ap.add_argument("--hog-max-s", type=float, default=1800.0, help="the hog exits by itself after this")
    ap.add_argument("--order", default="quiet,hog", help="order of the two profiles")
    ap.add_argument("--batch-sizes", default=None, help="profile grid (default: the deployment's, 1..16)")
    ap.add_argument("--rates", default=None, help="acceptance a_1..a_K to use instead of measuring the n-gram prior")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TABLETUNE_HOME", str(out / "home"))
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("noise_robustness")

    from tabletune_pipelines.tuning import deployments
    from tabletune_pipelines.engine.acceptance import write_default_prompt_file
    from tabletune_pipelines.engine.installed import installed_vllm_version
    from tabletune_pipelines.engine.plan import ProfileOptions
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.store import TableTuneStore
    from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table
    from tabletune_pipelines.tuning.gates import evidence_gate

    dep = load_fleet(REPO / "fleet.yaml").deployment("local-cpu")
    identity = deployments.identity_for(dep, installed_vllm_version())
    print(f"identity {identity.key}; load {loadavg()}", flush=True)

    t0 = time.monotonic()
    if args.rates:
        prior = fixed_prior([float(x) for x in args.rates.split(",")])
    else:
        prompts = write_default_prompt_file(out / "prompts.jsonl")
        prior = deployments.measure_acceptance(identity, dep, prompts, "2026-11-23", log=log, cache_dir=args.models,
                                               work_dir=out / "acceptance")
    print(f"prior a = {[round(a, 3) for a in prior.rates]} ({prior.num_drafts} drafts) in "
          f"{time.monotonic() - t0:.0f} s; load {loadavg()}", flush=True)

    profiles, walls, loads = {}, {}, {}
    for name in args.order.split(","):
        store = TableTuneStore(out / f"{name}.duckdb")
        opts = ProfileOptions(repetitions=args.repetitions, remeasure_budget_s=args.budget,
                              decision_rates=tuple(prior.rates), batch_sizes=ints(args.batch_sizes))
        hog = start_hog(args.hog_max_s, args.hog_cores) if name == "hog" else []
        before = loadavg()
        t = time.monotonic()
        try:
            profiles[name] = deployments.profile(identity, dep, store, log=log, options=opts, cache_dir=args.models,
                                                 work_dir=out / f"work-{name}")
        finally:
            stop_hog(hog)
        walls[name] = time.monotonic() - t
        loads[name] = f"{before} -> {loadavg()}"
        (out / f"{name}.profile.json").write_text(profiles[name].to_json(indent=1))
        print(f"[{name}] profiled in {walls[name]:.0f} s; load {loads[name]}", flush=True)

    tables = {}
    rows = []
    for name, prof in profiles.items():
        for policy in ("evidence", "stickiness"):
            tuned = derive_table(prof, prior, DeriveOptions(policy=policy))
            t = tuned.table
            tables[(name, policy)] = t
            spreads = sorted(c.spread for c in prof.cells if c.k is not None)
            rows.append({
                "profile": name, "policy": policy, "ranges": len(t.ranges),
                "one_b_ranges": sum(1 for s, e, _ in t.ranges if s == e), "table": [list(r) for r in t.ranges],
                "evidence_gate": evidence_gate(t).passed, "cells_remeasured": t.cells_remeasured,
                "wall_timed_cells": t.wall_timed_cells, "predicted_loss": t.predicted_worst_loss,
                "loss_bounds": [t.predicted_worst_loss_lcb, t.predicted_worst_loss_ucb],
                "median_cell_spread": spreads[len(spreads) // 2], "max_cell_spread": spreads[-1],
                "correction": t.accepted_work_fit.get("significant"), "wall_s": round(walls[name]),
                "load": loads[name]})
    names = list(profiles)
    for r in rows:
        for other in names:
            r[f"loss_on_{other}"] = loss_on(tables[(r["profile"], r["policy"])], profiles[other], prior)
    (out / "results.json").write_text(json.dumps(rows, indent=1))

    print("\n| profile | policy | ranges | one-B | gate | re-measured | wall-timed | cell spread med/max | "
          + " | ".join(f"loss on {o}" for o in names) + " | wall s | load (before -> after) | table |")
    print("|" + "---|" * (10 + len(names)))
    for r in rows:
        print(f"| {r['profile']} | {r['policy']} | {r['ranges']} | {r['one_b_ranges']} | "
              f"{'pass' if r['evidence_gate'] else 'FAIL'} | {r['cells_remeasured']} | {r['wall_timed_cells']} | "
              f"{r['median_cell_spread']:.0%}/{r['max_cell_spread']:.0%} | "
              + " | ".join(f"{r[f'loss_on_{o}']:.2%}" for o in names)
              + f" | {r['wall_s']} | {r['load']} | {r['table']} |")
    ev = [r for r in rows if r["policy"] == "evidence"]
    ok_ranges = all(r["ranges"] <= 3 and r["one_b_ranges"] == 0 for r in ev)
    print(f"\ntarget <= 3 ranges, no one-B range (evidence tables): {'MET' if ok_ranges else 'MISSED'}")
    if len(names) == 2:
        for policy in ("evidence", "stickiness"):
            ta, tb = tables[(names[0], policy)], tables[(names[1], policy)]
            gaps = {o: gap_on(ta, tb, profiles[o], prior) for o in names}
            worst = max(gaps.values())
            print(f"{policy}: the two tables differ by at most " + ", ".join(f"{v:.2%} on {o}" for o, v in gaps.items())
                  + (f" -> target within 2%: {'MET' if worst <= 0.02 else 'MISSED'}" if policy == "evidence" else ""))
    print(f"total {time.monotonic() - t0:.0f} s; load now {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

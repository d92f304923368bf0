"""The adaptive profile plan against the full grid, on the embedded default (the fleet's first
deployment: real SmolLM2-135M-Instruct, n-gram drafting, vLLM CPU build, max_num_seqs 16, K = 3).

    flock /tmp/tabletune-engine.lock python benchmarks/adaptive_vs_grid.py --out benchmarks/data/cpu/DATE-adaptive-vs-grid \
        [--prior-db $TABLETUNE_HOME/tabletune_store.duckdb] [--order adaptive,grid]

Each plan profiles the all-rejected cells of k = 0..K in its own launch, into its own fresh DuckDB
store (nothing resumes): ``adaptive`` (``ProfileOptions.plan_search``: coarse batch sizes, bisection,
repetitions until each decision is settled or tied within 1 %, the default 120 s re-measurement
budget) and ``grid`` (every batch size 1..16, 3 repetitions, then the same re-measurement). No
mixed steps, no no-speculation or all-accepted cells: those are the same for both plans. Decisions
are judged under the acceptance prior of ``--prior-db`` (the newest prior ``tabletune run`` measured
for this engine) or, without one, geometric rates a_i = 0.7^i.

Printed and written to ``--out``/result.json: per plan the wall time, the cells and repetitions, the
batch sizes measured, the derived table; then each table judged on the grid's cells (goodput of
the adaptive table over the grid's table per batch size, mean over B = 1..16), and the grid table
judged on the adaptive plan's cells.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fleet", default="fleet.yaml")
    ap.add_argument("--prior-db", default=None, help="DuckDB store holding the engine's measured acceptance prior")
    ap.add_argument("--order", default="adaptive,grid")
    args = ap.parse_args(argv)

    from tabletune_pipelines.core.remeasure import geometric_rates
    from tabletune_pipelines.formats.documents import AcceptancePrior
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.store.duckdb_store import TableTuneStore
    from tabletune_pipelines.tuning import deployments
    from tabletune_pipelines.tuning.derive import derive_table

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dep = load_fleet(args.fleet).deployments[0]
    identity = deployments.current_identity(dep)
    prior = None
    if args.prior_db:
        priors = [p for p in TableTuneStore(args.prior_db, read_only=True).applicable_priors(identity)
                  if len(p.rates) >= identity.max_k]
        prior = priors[0] if priors else None  # newest week first
    if prior is None:
        rates = geometric_rates(0.7, identity.max_k)
        prior = AcceptancePrior(rates=rates, num_drafts=0, drafted_per_pos=(0,) * len(rates),
                                accepted_per_pos=(0,) * len(rates), prompt_fingerprint="given", prompt_count=0,
                                source="synthetic")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    log = logging.getLogger("tabletune.bench")
    result: dict = {"identity": identity.key, "prior_rates": [round(r, 4) for r in prior.rates],
                    "prior": prior.prior_id, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plans": {}}
    tables, profiles = {}, {}
    for plan in args.order.split(","):
        store = TableTuneStore(str(out / f"{plan}.duckdb"))
        opts = deployments.ProfileOptions(plan_search=plan, mixed_steps=False, include_no_spec=False,
                                          accept_batch_sizes=(), decision_rates=tuple(prior.rates[:identity.max_k]))
        t0 = time.monotonic()
        prof = deployments.profile(identity, dep, store, log=log, options=opts, work_dir=str(out / f"work-{plan}"))
        wall = time.monotonic() - t0
        tuned = derive_table(prof, prior)
        profiles[plan], tables[plan] = prof, tuned
        bs = sorted({c.batch_size for c in prof.cells})
        result["plans"][plan] = {"wall_s": round(wall, 1), "cells": len(prof.cells),
                                 "repetitions": sum(len(c.repetitions_ms) for c in prof.cells), "batch_sizes": bs,
                                 "table": [list(r) for r in tuned.table.ranges],
                                 "predicted_worst_loss": round(tuned.table.predicted_worst_loss, 4),
                                 "cells_ms": {f"{c.k},{c.batch_size}": list(c.repetitions_ms) for c in prof.cells}}
        (out / f"{plan}.profile.json").write_text(prof.to_json(indent=1))
        print(f"{plan}: {wall:.0f} s, {len(prof.cells)} cells, B = {bs}, table {tuned.table.ranges}", flush=True)
        (out / "result.json").write_text(json.dumps(result, indent=1))  # what is measured so far
    if {"adaptive", "grid"} <= set(tables):
        for judge, other in (("grid", "adaptive"), ("adaptive", "grid")):
            g = tables[judge].choice.goodput
            ks = list(tables[judge].choice.ks)
            cols = np.arange(g.shape[1])
            mine = g[[ks.index(k) for k in tables[other].choice.chosen], cols]
            theirs = g[[ks.index(k) for k in tables[judge].choice.chosen], cols]
            ratio = mine / theirs
            result[f"{other}_table_on_{judge}_cells"] = {"mean_ratio": round(float(ratio.mean()), 4),
                                                        "min_ratio": round(float(ratio.min()), 4),
                                                        "per_b": [round(float(x), 4) for x in ratio]}
            print(f"the {other} table judged on the {judge} plan's cells: goodput ratio mean {ratio.mean():.4f}, "
                  f"min {ratio.min():.4f} (1 = the same as the {judge} table)", flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    for plan in args.order.split(","):
        (out / f"{plan}.duckdb").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

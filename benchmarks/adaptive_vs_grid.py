"""The adaptive profile plan against the full grid, on the embedded default (the fleet's first
deployment: real SmolLM2-135M-Instruct, n-gram drafting, vLLM CPU build, max_num_seqs 16, K = 3).

    flock /tmp/tabletune-engine.lock python benchmarks/adaptive_vs_grid.py --out benchmarks/data/cpu/DATE-adaptive-vs-grid \
        [--prior-db $TABLETUNE_HOME/tabletune_store.duckdb] [--order adaptive,grid]

Each plan profiles the all-rejected cells of k = 0..K in its own launch, into its own fresh DuckDB
store (nothing resumes): ``adaptive`` (``ProfileOptions.plan_search``: coarse batch sizes, bisection,
repetitions until each decision is settled or tied within 1 %, then re-measurement within a time
budget) and ``grid`` (every batch size 1..16, 3 repetitions, then the same re-measurement). With
``--settings main-job`` (the default) both plans take the main job's decode steps, coarse points and
re-measurement budget (``embedded.FULL_PROFILE``); ``--settings defaults`` takes ProfileOptions' defaults. No
mixed steps, no no-speculation or all-accepted cells: those are the same for both plans. Decisions
are judged under the acceptance prior of ``--prior-db`` (the newest prior ``tabletune run`` measured
for this engine), the rates given with ``--rates``, or else geometric rates a_i = 0.7^i.

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fleet", default="fleet.yaml")
    ap.add_argument("--prior-db", default=None, help="DuckDB store holding the engine's measured acceptance prior")
    ap.add_argument("--order", default="adaptive,grid")
    ap.add_argument("--rejudge", action="store_true",
                    help="judge the tables of --out/result.json again (no launch) and rewrite it")
    ap.add_argument("--rates", default=None, help="acceptance rates a_1,a_2,... to judge decisions under "
                                                  "(instead of --prior-db's prior)")
    ap.add_argument("--settings", choices=("main-job", "defaults"), default="main-job",
                    help="main-job: both plans take the main job's decode steps, coarse points and re-measurement "
                         "budget (embedded.FULL_PROFILE); defaults: ProfileOptions' defaults")
    args = ap.parse_args(argv)

    from tabletune_pipelines.core.remeasure import geometric_rates
    from tabletune_pipelines.formats.documents import AcceptancePrior
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.store.duckdb_store import TableTuneStore
    from tabletune_pipelines.tuning import deployments
    from tabletune_pipelines.tuning.derive import derive_table

    out = Path(args.out)
    if args.rejudge:
        from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile

        result = json.loads((out / "result.json").read_text())
        rates = tuple(result["prior_rates"])
        prior = AcceptancePrior(rates=rates, num_drafts=0, drafted_per_pos=(0,) * len(rates),
                                accepted_per_pos=(0,) * len(rates), prompt_fingerprint="given", prompt_count=0,
                                source="synthetic")
        profiles = {p: StepTimeProfile.from_json((out / f"{p}.profile.json").read_text()) for p in ("adaptive", "grid")}
        judge_tables(result, profiles, prior)
        replay_on_grid_cells(result, profiles["grid"], prior)
        (out / "result.json").write_text(json.dumps(result, indent=1))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    dep = load_fleet(args.fleet).deployments[0]
    identity = deployments.current_identity(dep)
    prior = None
    if args.prior_db:
        priors = [p for p in TableTuneStore(args.prior_db, read_only=True).applicable_priors(identity)
                  if len(p.rates) >= identity.max_k]
        prior = priors[0] if priors else None  # newest week first
    if prior is None:
        rates = (tuple(float(x) for x in args.rates.split(",")) if args.rates
                 else geometric_rates(0.7, identity.max_k))
        prior = AcceptancePrior(rates=rates, num_drafts=0, drafted_per_pos=(0,) * len(rates),
                                accepted_per_pos=(0,) * len(rates), prompt_fingerprint="given", prompt_count=0,
                                source="synthetic")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    log = logging.getLogger("tabletune.bench")
    result: dict = {"identity": identity.key, "prior_rates": [round(r, 4) for r in prior.rates],
                    "prior": prior.prior_id, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plans": {}}
    from tabletune_pipelines.embedded import FULL_PROFILE

    timing = ({k: FULL_PROFILE[k] for k in ("decode_steps", "coarse_points", "remeasure_budget_s")}
              if args.settings == "main-job" else {})
    result["settings"] = {"name": args.settings, **timing}
    tables, profiles = {}, {}
    for plan in args.order.split(","):
        store = TableTuneStore(str(out / f"{plan}.duckdb"))
        opts = deployments.ProfileOptions(plan_search=plan, mixed_steps=False, include_no_spec=False,
                                          accept_batch_sizes=(), decision_rates=tuple(prior.rates[:identity.max_k]),
                                          **timing)
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
        judge_tables(result, profiles, prior)
    if "grid" in profiles:
        replay_on_grid_cells(result, profiles["grid"], prior)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    for plan in args.order.split(","):
        (out / f"{plan}.duckdb").unlink(missing_ok=True)
    return 0


def judge_tables(result: dict, profiles: dict, prior) -> None:  # noqa: ANN001
    """Each plan's table judged on the other plan's cells, into ``result``: the goodput ratio per
    batch size and its standard error from ``derive_table`` of the judging plan's profile under
    ``prior`` (``run_report.compare_tables``); the mean's s.e. takes the per-B errors as fully
    correlated, an upper bound."""
    from tabletune_pipelines.tuning.derive import derive_table

    tables = {plan: derive_table(prof, prior) for plan, prof in profiles.items()}
    for judge, other in (("grid", "adaptive"), ("adaptive", "grid")):
        cmp = _on_cells(tables[judge], tables[other].table.ranges)
        result[f"{other}_table_on_{judge}_cells"] = {
            "mean_ratio": round(cmp.mean, 4), "mean_ratio_se": round(cmp.mean_sd, 4),
            "min_ratio": round(float(cmp.ratio.min()), 4), "per_b": [round(float(x), 4) for x in cmp.ratio],
            "per_b_se": [round(float(x), 4) for x in cmp.sd]}
        print(f"the {other} table judged on the {judge} plan's cells: goodput ratio mean {cmp.mean:.4f} ± "
              f"{cmp.mean_sd:.4f}, min {cmp.ratio.min():.4f} (1 = the same as the {judge} table)", flush=True)


def _on_cells(judge, ranges):  # noqa: ANN001, ANN202
    """``ranges`` over the judging derive's own table, on its profile (``run_report.compare_tables``)."""
    from tabletune_pipelines.tuning.run_report import compare_tables

    return compare_tables(judge.evidence, judge.choice.ks, ranges, judge.table.ranges, judge.table.max_num_seqs)


def replay_on_grid_cells(result: dict, grid, prior) -> None:  # noqa: ANN001
    """The adaptive plan replayed on the grid's recorded repetitions (``core.remeasure.replay_search``,
    the plan's settings of ``result["settings"]``, decisions under ``prior``): the batch sizes it
    asks for, and its table judged on the grid's cells against the grid's table. The same data for
    both, so launch-to-launch drift plays no part; into ``result["adaptive_replayed_on_grid_cells"]``."""
    import dataclasses

    from tabletune_pipelines.core.remeasure import COARSE_POINTS, RemeasureSettings, replay_search
    from tabletune_pipelines.engine.plan import ProfileOptions
    from tabletune_pipelines.tuning.derive import derive_table

    opts = ProfileOptions(coarse_points=result["settings"].get("coarse_points", COARSE_POINTS))
    full = {(c.k, c.batch_size): list(c.repetitions_ms) for c in grid.cells if c.acceptance == "reject"}
    kmax = max(k for k, _ in full)
    report = replay_search(full, [tuple(prior.rates[:kmax])], grid.identity.max_num_seqs,
                           RemeasureSettings(max_repetitions=opts.max_repetitions, tolerance=opts.accepted_loss),
                           coarse_points=opts.coarse_points)
    kept = set(report.batch_sizes)
    sub = dataclasses.replace(grid, cells=tuple(c for c in grid.cells if c.acceptance != "reject" or c.batch_size in kept))
    mine, theirs = derive_table(sub, prior), derive_table(grid, prior)
    cmp = _on_cells(theirs, mine.table.ranges)
    result["adaptive_replayed_on_grid_cells"] = {
        "batch_sizes": report.batch_sizes, "table": [list(x) for x in mine.table.ranges],
        "grid_table": [list(x) for x in theirs.table.ranges], "mean_ratio": round(cmp.mean, 4),
        "mean_ratio_se": round(cmp.mean_sd, 4), "min_ratio": round(float(cmp.ratio.min()), 4),
        "per_b": [round(float(x), 4) for x in cmp.ratio]}
    print(f"the adaptive plan replayed on the grid's recorded cells: B = {report.batch_sizes} of "
          f"{len({b for _, b in full})}, table {mine.table.ranges} against the grid's {theirs.table.ranges}; "
          f"goodput ratio on the grid's cells mean {cmp.mean:.4f} ± {cmp.mean_sd:.4f}, min {cmp.ratio.min():.4f}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())

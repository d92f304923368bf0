"""``tabletune``: profile, measure acceptance, build and show tables, run the pipeline.

Every subcommand works on a deployment of the fleet file (default: the embedded ``local-cpu``
deployment on vLLM's CPU build) and the DuckDB store (default ``$TABLETUNE_HOME/tabletune_store.duckdb``).
Measured cells are written the moment they are measured, so an interrupted ``profile`` resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: {text!r} is not a comma-separated list of integers") from None


def _log() -> logging.Logger:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    return logging.getLogger("tabletune")


def _context(args: argparse.Namespace):
    from tabletune_pipelines.fleet import load_fleet
    from tabletune_pipelines.resources import default_duckdb_path
    from tabletune_pipelines.store import TableTuneStore

    fleet = load_fleet(args.fleet)
    dep = fleet.deployment(args.deployment) if args.deployment else fleet.deployments[0]
    store = TableTuneStore(args.db or default_duckdb_path())
    return dep, store


def _engine():
    from tabletune_pipelines.resources import EngineResource

    return EngineResource()


def cmd_profile(args: argparse.Namespace) -> int:
    dep, store = _context(args)
    engine = _engine()
    identity = engine.current_identity(dep)
    opts = {"mode": args.mode, "repetitions": args.repetitions}
    if args.batch_sizes:
        opts["batch_sizes"] = _ints(args.batch_sizes)
    if args.ks:
        opts["ks"] = _ints(args.ks)
    engine = engine.model_copy(update={"profile_options": opts})
    print(f"profiling {identity.key} into {store.path}", file=sys.stderr)
    profile = engine.profile(identity, dep, store, _log())
    print(json.dumps({"identity": identity.key, "cells": len(profile.cells), "mode": profile.mode}))
    return 0


def cmd_acceptance(args: argparse.Namespace) -> int:
    dep, store = _context(args)
    engine = _engine()
    identity = engine.current_identity(dep)
    week = args.week or "adhoc"
    prior = engine.measure_acceptance(identity, dep, Path(args.prompts), week, _log())
    store.write_acceptance_prior(prior, identity.key)
    print(prior.to_json(indent=2))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from tabletune_pipelines.report import goodput_markdown, goodput_plot, table_markdown
    from tabletune_pipelines.tuning import derive_table

    dep, store = _context(args)
    key = args.identity or _latest_profiled_identity(store, dep)
    profile = store.load_profile(key, args.mode)
    prior = store.acceptance_prior(args.prior) if args.prior else store.latest_acceptance_prior(dep.name) \
        or store.latest_acceptance_prior()
    if prior is None:
        raise SystemExit("error: no acceptance prior in the store; run `tabletune acceptance --prompts FILE` first")
    tuned = derive_table(profile, prior, correct_accepted_work=not args.no_correction)
    if args.format == "vllm":
        print(json.dumps(tuned.table.as_vllm()))
    else:
        print(f"# draft-length table for {key}\n# prior {prior.prior_id}: a = {[round(a, 3) for a in prior.rates]}\n")
        print(table_markdown(tuned.table.as_vllm()))
        print()
        print(goodput_markdown(tuned))
        print(f"\npredicted worst loss vs best fixed k: {tuned.table.predicted_worst_loss:.2%}")
        print("vLLM --speculative-config:", json.dumps(tuned.table.speculative_config(dep.base_speculative_config())))
    if args.plot:
        Path(args.plot).write_bytes(goodput_plot(tuned.table, profile.no_spec_ms(), f"{key}\nprior {prior.prior_id}"))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.save:
        print(f"stored as {store.write_table(tuned.table)}", file=sys.stderr)
    return 0


def _latest_profiled_identity(store, dep) -> str:
    rows = store.query(
        "SELECT c.identity_key FROM step_time_cells c JOIN engine_identities i USING (identity_key) "
        "WHERE i.model = ? GROUP BY c.identity_key ORDER BY max(c.measured_at) DESC LIMIT 1", [dep.model])
    if not rows:
        raise SystemExit(f"error: no step-time profile for deployment {dep.name!r} in {store.path}; "
                         "run `tabletune profile` first")
    return rows[0][0]


def cmd_run(args: argparse.Namespace) -> int:
    from tabletune_pipelines.embedded import main as run_embedded

    if args.fleet:
        os.environ["TABLETUNE_FLEET"] = args.fleet
    return run_embedded((["--quick"] if args.quick else []) + (["--week", args.week] if args.week else []))


def cmd_show(args: argparse.Namespace) -> int:
    from tabletune_pipelines.published import read_published_table

    dep, _ = _context(args)
    doc = read_published_table(dep.published_table)
    print(json.dumps(doc, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tabletune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", default=os.environ.get("TABLETUNE_FLEET"), help="fleet YAML (default: fleet.yaml)")
    ap.add_argument("--deployment", default=None, help="deployment name (default: the first in the fleet)")
    ap.add_argument("--db", default=None, help="DuckDB store (default $TABLETUNE_HOME/tabletune_store.duckdb)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="measure step times T(B, k) on the deployment's engine (resumable)")
    p.add_argument("--mode", default="one_launch", choices=["one_launch", "launch_per_k", "fixed_k"])
    p.add_argument("--batch-sizes", help="comma-separated (default: 1..16 then every 8 to max_num_seqs)")
    p.add_argument("--ks", help="comma-separated k values (default 0..max_k)")
    p.add_argument("--repetitions", type=int, default=3)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("acceptance", help="measure a_i on a JSONL prompt file (one {\"prompt\": ...} per line)")
    p.add_argument("--prompts", required=True)
    p.add_argument("--week", default=None, help="label, e.g. 2026-11-23 (default: adhoc)")
    p.set_defaults(func=cmd_acceptance)

    p = sub.add_parser("table", help="derive and show the goodput-optimal table from the store")
    p.add_argument("--identity", help="engine identity key (default: the deployment's latest profile)")
    p.add_argument("--prior", help="acceptance prior id (default: the latest)")
    p.add_argument("--mode", default="one_launch", choices=["one_launch", "launch_per_k", "fixed_k"])
    p.add_argument("--format", default="text", choices=["text", "vllm"])
    p.add_argument("--plot", help="write a goodput-vs-batch-size PNG here")
    p.add_argument("--no-correction", action="store_true", help="ignore the accepted-work step-time correction")
    p.add_argument("--save", action="store_true", help="store the table in DuckDB")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("run", help="run the whole Dagster pipeline on the fleet (the README's main command)")
    p.add_argument("--quick", action="store_true", help="small profile plan (3 batch sizes, 2 repetitions)")
    p.add_argument("--week", help="week of logged prompts (Monday, YYYY-MM-DD); default the last complete week")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("show", help="print the deployment's published table")
    p.set_defaults(func=cmd_show)
    return ap


def main(argv: list[str] | None = None) -> int:
    from tabletune_pipelines.errors import TableTuneError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TableTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: measured cells are stored; rerun to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The main job run several times on fresh homes, and the tables it publishes judged on every run's
profile: do repeated runs publish tables whose predicted goodput agrees within the accepted loss?

    flock /tmp/tabletune-engine.lock python benchmarks/main_job_repeat.py --runs 3 --out /tmp/mjr
    python benchmarks/main_job_repeat.py --out /tmp/mjr --judge          # judge the homes already there

Each run is ``bash scripts/run.sh`` (the README's main command) with ``TABLETUNE_HOME`` set to
``--out``/home-N, one after another, its output in ``--out``/run-N.log and its wall time in
``--out``/result.json. A run's home keeps its store (profile, prior, table), so ``--judge`` reads
them again without a launch.

Judged per profile: each run's profile is derived under its own prior (``derive_table``), and every
run's table is priced on it against the docs' table and against each other run's table
(``run_report.compare_tables``: the mean over B = 1..N of the goodput ratio, ± its standard error
with the per-B errors taken as fully correlated). A run's own output judges its table on its own
profile only, so the three runs' "against the docs' table" figures mix the tables' differences with
the profiles'; here each profile prices all the tables, and the spread between them on one profile
is the tables' difference alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_jobs(out: Path, runs: int) -> list[dict]:
    rows = []
    for i in range(1, runs + 1):
        home = out / f"home-{i}"
        if (home / "tabletune_store.duckdb").exists():
            print(f"run {i}: {home} already holds a store; judged as it is", flush=True)
            rows.append({"run": i, "home": str(home), "wall_s": None, "status": "kept"})
            continue
        env = dict(os.environ, TABLETUNE_HOME=str(home))
        t0 = time.monotonic()
        with open(out / f"run-{i}.log", "w") as log:
            rc = subprocess.call(["bash", str(REPO / "scripts" / "run.sh")], cwd=REPO, env=env, stdout=log,
                                 stderr=subprocess.STDOUT)
        wall = time.monotonic() - t0
        print(f"run {i}: exit {rc} after {wall / 60:.1f} min ({out / f'run-{i}.log'})", flush=True)
        rows.append({"run": i, "home": str(home), "wall_s": round(wall, 1), "status": rc})
    return rows


def load_run(home: Path) -> dict:
    """The run's newest table, its profile and its prior, from the home's store."""
    from tabletune_pipelines.store.duckdb_store import TableTuneStore

    store = TableTuneStore(str(home / "tabletune_store.duckdb"), read_only=True)
    ids = store.table_ids()
    if not ids:
        raise SystemExit(f"{home}: the store holds no table (did the run finish?)")
    table = store.table(ids[0])
    return {"table": [list(r) for r in table.ranges], "profile": store.load_profile(table.identity_key),
            "prior": store.acceptance_prior(table.prior_id), "n": table.max_num_seqs, "max_k": table.max_k}


def judge(rows: list[dict]) -> dict:
    from tabletune_pipelines.tuning.derive import derive_table
    from tabletune_pipelines.tuning.run_report import compare_tables, docs_table

    runs = [load_run(Path(r["home"])) for r in rows]
    n, max_k = runs[0]["n"], runs[0]["max_k"]
    docs = docs_table(n, max_k)
    tables = [r["table"] for r in runs]
    result: dict = {"tables": tables, "docs_table": docs, "per_profile": []}
    for i, r in enumerate(runs, 1):
        tuned = derive_table(r["profile"], r["prior"])
        ks = list(tuned.choice.ks)
        vs_docs = [compare_tables(tuned.evidence, ks, t, docs, n) for t in tables]
        pairs = {f"{j}/{l}": compare_tables(tuned.evidence, ks, tables[j - 1], tables[l - 1], n)
                 for j in range(1, len(tables) + 1) for l in range(1, len(tables) + 1) if j < l}
        means = [c.mean for c in vs_docs]
        spread = max(means) / min(means) - 1.0
        result["per_profile"].append({
            "profile_of_run": i, "prior": r["prior"].prior_id, "rates": [round(a, 4) for a in r["prior"].rates],
            "vs_docs": [[round(c.mean, 4), round(c.mean_sd, 4)] for c in vs_docs],
            "pairs": {k: [round(c.mean, 4), round(c.mean_sd, 4)] for k, c in pairs.items()},
            "spread": round(spread, 4)})
        print(f"on run {i}'s profile (prior a = {[round(a, 3) for a in r['prior'].rates]}):", flush=True)
        for j, c in enumerate(vs_docs, 1):
            print(f"  run {j}'s table {tables[j - 1]}: {c.mean:.4f} ± {c.mean_sd:.4f} of the docs' table", flush=True)
        for k, c in pairs.items():
            j, l = k.split("/")
            print(f"  run {j}'s table / run {l}'s: {c.mean:.4f} ± {c.mean_sd:.4f}", flush=True)
        print(f"  spread of the tables' predicted goodput on this profile: {spread:.2%}", flush=True)
    worst = max(p["spread"] for p in result["per_profile"])
    result["worst_spread"] = worst
    print(f"largest spread between the runs' tables on any one profile: {worst:.2%} "
          f"({'within' if worst <= 0.01 else 'beyond'} 1 %)", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the homes, logs and result.json (keep it short)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--judge", action="store_true", help="no runs: judge the homes under --out")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    if args.judge:
        rows = json.loads(path.read_text())["runs"] if path.exists() else [
            {"run": i, "home": str(h), "wall_s": None, "status": "kept"}
            for i, h in enumerate(sorted(out.glob("home-*")), 1)]
    else:
        rows = run_jobs(out, args.runs)
        path.write_text(json.dumps({"runs": rows}, indent=1))
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": rows,
              **judge([r for r in rows if r["status"] in (0, "kept")])}
    path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

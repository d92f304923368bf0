"""The (batch size x context) table and the batch-only table of a stored profile, as JSON, under
synthetic acceptance rates (the GPU engines verify drafts at fixed rates; deploy/gpu/context.sh).

    python benchmarks/context_table.py --db /tmp/tt-home/h200.duckdb --rates 0.7,0.5,0.3 --out tables.json
    python benchmarks/context_table.py --profile PROFILE.json --rates 0.626,0.479,0.374 --out tables.json

The store's one engine identity (or ``--identity``), or a profile exported as JSON, is derived per context level
(``tuning.derive_context``: the evidence rule per level, each longer level revising the shorter
level's table on evidence, adjacent buckets whose k agree merged).
Written: ``grid`` (5-item entries; the batch-only table as 5-item entries over one bucket when the
levels agree), ``batch`` (the first level's batch-only table, the published ``ranges``), the levels,
and per level the chosen k at every batch size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.derive import DeriveOptions
from tabletune_pipelines.tuning.derive_context import derive_context_table, stored_context_surface


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--db", help="DuckDB store holding the profile")
    src.add_argument("--profile", help="a profile exported as JSON (StepTimeProfile)")
    ap.add_argument("--rates", required=True, help="a_1..a_K, comma-separated")
    ap.add_argument("--identity", default=None, help="engine identity key (default: the store's only one)")
    ap.add_argument("--deployment", default=None, help="only printed")
    ap.add_argument("--max-model-len", type=int, default=None, help="where the last context bucket ends")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rates = tuple(float(x) for x in args.rates.split(","))
    if args.profile:
        profile = StepTimeProfile.from_json(Path(args.profile).read_text())
        key = profile.identity.key
    else:
        store = TableTuneStore(args.db, read_only=True)
        keys = store.identity_keys()
        key = args.identity or (keys[0] if len(keys) == 1 else None)
        if key is None:
            raise SystemExit(f"--identity: the store holds {len(keys)} identities {keys}; name one")
        profile = store.load_profile(key)
    if len(rates) != profile.identity.max_k:
        raise SystemExit(f"--rates has {len(rates)} values; the profile's K is {profile.identity.max_k}")
    zeros = (0,) * len(rates)
    prior = AcceptancePrior(rates=rates, num_drafts=0, drafted_per_pos=zeros, accepted_per_pos=zeros,
                            prompt_fingerprint="given", prompt_count=0, source="synthetic",
                            deployment=args.deployment or "")
    options = DeriveOptions()
    surfaces = stored_context_surface(profile, prior, options)
    tuned = derive_context_table(profile, prior, surfaces, max_model_len=args.max_model_len, options=options)
    table = tuned.table
    n = profile.identity.max_num_seqs
    batch = [list(r) for r in table.ranges]
    grid = ([list(e) for e in table.context_entries] if table.context_entries
            else [[lo, hi, 1, args.max_model_len or max(surfaces), k] for lo, hi, k in batch])
    per_level = {str(s.level): [int(k) for k in s.evidence.choice.chosen] for s in tuned.by_context}
    step_ms = {str(lv): {str(k): [round(float(surfaces[lv].at(k, b)[0]), 3) for b in range(1, n + 1)]
                         for k in surfaces[lv].ks} for lv in sorted(surfaces)}
    doc = {"identity": key, "rates": rates, "levels": sorted(surfaces), "grid": grid, "batch": batch,
           "context_axis": bool(table.context_entries), "k_per_level": per_level, "step_ms": step_ms}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"[context-table] {key}: levels {sorted(surfaces)}; batch-only {batch}")
    print(f"[context-table] grid {grid}")
    for lv, ks in per_level.items():
        print(f"[context-table]   level {lv}: {DraftTable.from_dense(ks).entries()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

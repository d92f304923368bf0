"""Profile T(B, k) and measure acceptance on the embedded default (vLLM CPU build, tiny models).

    python benchmarks/profile_embedded.py --size small --out /tmp/tt-bench
    python benchmarks/profile_embedded.py --size medium --batch-sizes 1,4,8,16 --ks 0,1,3
    python benchmarks/profile_embedded.py --mode launch_per_k --store /tmp/tt.duckdb

Writes ``profile.json`` (StepTimeProfile), ``acceptance.json`` (n-gram AcceptancePrior) and
``summary.txt`` (step-time grid, spreads, timings) into ``--out``. With ``--store`` every cell is
written to the DuckDB store as it is measured and a rerun resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import ints


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["small", "medium"])
    ap.add_argument("--models", default="/tmp/tabletune-tiny-models", help="tiny model cache folder")
    ap.add_argument("--out", default="/tmp/tabletune-bench")
    ap.add_argument("--k", type=int, default=3, help="launch K")
    ap.add_argument("--ks", default=None, help="k values to time (default 0..K)")
    ap.add_argument("--batch-sizes", default=None, help="default: batch_size_grid(max_num_seqs)")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--accept-batch-sizes", default=None, help="'none' to skip the all-accepted cells")
    ap.add_argument("--mode", default="one_launch", choices=["one_launch", "launch_per_k"])
    ap.add_argument("--no-nospec", action="store_true")
    ap.add_argument("--no-acceptance", action="store_true")
    ap.add_argument("--store", default=None, help="DuckDB file for resumable cells")
    args = ap.parse_args(argv)

    from tabletune_pipelines.engine.acceptance import measure_acceptance_from_file, write_default_prompt_file
    from tabletune_pipelines.engine.config import ServerConfig
    from tabletune_pipelines.engine.identity import engine_identity
    from tabletune_pipelines.engine.plan import ProfileOptions, default_plan
    from tabletune_pipelines.engine.profile_run import ProfileHooks
    from tabletune_pipelines.engine.profiler import profile_step_times, store_hooks
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    models = ensure_tiny_models(args.models, args.size)
    cfg = ServerConfig(model=str(models.target_dir), drafter=str(models.draft_dir), method="draft_model",
                       num_speculative_tokens=args.k, max_num_seqs=args.max_num_seqs, work_dir=str(out / "servers"))
    plan = default_plan(cfg, batch_sizes=ints(args.batch_sizes), ks=ints(args.ks), repetitions=args.repetitions,
                        include_no_spec=not args.no_nospec, accept_batch_sizes=ints(args.accept_batch_sizes))
    identity = engine_identity(cfg)
    hooks = ProfileHooks()
    if args.store:
        from tabletune_pipelines.store import TableTuneStore

        # the cells only, as this benchmark has always stored them (its mixed steps are measured each run)
        hooks = dataclasses.replace(store_hooks(TableTuneStore(args.store), identity, args.mode), existing_samples=(),
                                    on_samples=None)
    prof = profile_step_times(cfg, ProfileOptions(mode=args.mode), plan=plan, hooks=hooks, identity=identity)
    (out / "profile.json").write_text(prof.to_json(indent=1))
    t_prof = time.monotonic() - t0

    lines = [f"identity {identity.key}", f"mode {args.mode}; profile wall time {t_prof:.0f} s", ""]
    reject, nospec, accept = prof.reject_cells(), prof.no_spec_ms(), prof.accept_cells()
    spread = {(c.k, c.batch_size, c.acceptance): c.spread for c in prof.cells}
    bs = sorted({c.batch_size for c in prof.cells if c.acceptance == "reject"})
    lines.append("T(B, k) ms, all drafts rejected (spread %)")
    lines.append("B     " + "".join(f"{'nospec' if k is None else f'k={k}':>16}" for k in [None, *sorted(reject)]))
    for b in bs:
        row = f"{b:<6}"
        for k in [None, *sorted(reject)]:
            v = nospec.get(b) if k is None else reject.get(k, {}).get(b)
            row += f"{v:9.2f} ({spread.get((k, b, 'reject'), 0) * 100:3.0f}%)" if v else f"{'-':>16}"
        lines.append(row)
    if accept:
        lines.append("")
        lines.append("all drafts accepted, ms")
        for k in sorted(accept):
            lines.append(f"k={k}: " + ", ".join(f"B={b}: {v:.2f}" for b, v in sorted(accept[k].items())))
    if not args.no_acceptance:
        pf = write_default_prompt_file(out / "prompts.jsonl")
        ng = ServerConfig(model=str(models.target_dir), method="ngram", num_speculative_tokens=args.k,
                          speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2},
                          max_num_seqs=args.max_num_seqs, work_dir=str(out / "servers"))
        t1 = time.monotonic()
        prior = measure_acceptance_from_file(ng, pf, n=160, seed=0)
        (out / "acceptance.json").write_text(prior.to_json(indent=1))
        lines += ["", f"n-gram acceptance a_i = {tuple(round(r, 3) for r in prior.rates)} "
                      f"({prior.num_drafts} drafts, {time.monotonic() - t1:.0f} s incl. launch)"]
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    print(json.dumps({"total_seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

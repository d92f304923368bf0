"""One launch for all k vs one launch per k, measured in ONE run.

    python benchmarks/one_launch_vs_per_k.py                       # small target + 1-layer draft, K = 3
    python benchmarks/one_launch_vs_per_k.py --ks 0,1,3 --batch-sizes 1,4,8,16 --repetitions 3
    python benchmarks/one_launch_vs_per_k.py --order per_k_first   # run launch_per_k first (drift check)
    python benchmarks/one_launch_vs_per_k.py --with-fixed-k        # also time fixed k (K = k, no table)

Both modes profile the same plan on the same engine identity (same launch K, every draft rejected
through synthetic rejection, same prompts and seeds):

* ``one_launch``: ONE server (K, table ``[[1, N, K]]``); k is switched at runtime by rewriting the
  scheduler's table; repetitions are interleaved across k (k0 k1 k3, k1 k3 k0, ...).
* ``launch_per_k``: one server per k (same K, table ``[[1, N, k]]``), repetitions back to back.

Drafter: ``draft_model`` with the tiny 1-layer drafter, not the fleet default's n-gram. A draft
model drafts exactly k tokens every step, so T(B, k) grows clearly with k (NOTES.md: 10 -> 24 ms at
B = 16 for k = 0 -> 3) and every timed step verifies exactly B·k drafts (the engine-side timing
filter). n-gram drafting on the random timing prompts drafts fewer than k (often 0) tokens, so its
step time barely depends on k and both modes would trivially "agree" on a flat surface.

Printed per cell: each mode's median ms, per_k / one_launch ratio, each mode's repetition spread
((max - min) / median). Then the table each mode derives (``tuning.derive_table``) under fixed
priors, whether they are equal, and the goodput the per-k table gives up when judged on the
one-launch profile (and vice versa). Then each mode's wall time and the wall-time ratio.

Note on "spread": the stored spread is the spread of a cell's repetitions. In launch_per_k the
repetitions of a k run back to back in one launch, so their spread cannot show the launch-to-launch
noise (5-25 % per cell, docs/engine-facts.md, "Noise on 2 cores") that separates the k values; that
noise shows up only in the per-cell ratio between the modes. The result JSON keeps every repetition.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.evaluation.synthetic import fixed_prior

FIXED_PRIORS = {
    "a=(0.7,0.5,0.3)": (0.7, 0.5, 0.3),
    "n-gram-like a=(0.836,0.708,0.632)": (0.836, 0.708, 0.632),  # NOTES.md's measured n-gram prior
}








def _cross_loss(table_ranges, dense_ms, ks, rates, max_num_seqs, max_k):
    """Worst and mean goodput loss of ``table_ranges`` judged on step times ``dense_ms`` (rows = ks)."""
    from tabletune_pipelines.core.table import DraftTable, goodput_matrix

    g = goodput_matrix(dense_ms, ks, rates)
    chosen = DraftTable.from_entries([list(r) for r in table_ranges]).vllm_lookup(max_num_seqs, max_k)[1:]
    loss = [1.0 - g[ks.index(k), b] / g[:, b].max() for b, k in enumerate(chosen)]
    return max(loss), sum(loss) / len(loss)


def run_mode(cfg, plan, mode, identity, vocab_size, log):
    from tabletune_pipelines.engine.plan import ProfileOptions
    from tabletune_pipelines.engine.profiler import profile_step_times

    startups: list[float] = []

    def progress(msg: str) -> None:
        m = re.search(r"server up in ([0-9.]+) s", msg)
        if m:
            startups.append(float(m.group(1)))
        log(f"  {msg}")

    t0 = time.monotonic()
    prof = profile_step_times(cfg, ProfileOptions(mode=mode), plan=plan, identity=identity, vocab_size=vocab_size,
                              progress=progress)
    wall = time.monotonic() - t0
    return prof, wall, startups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["small", "medium"])
    ap.add_argument("--models", default="/tmp/tabletune-tiny-models", help="tiny model cache folder")
    ap.add_argument("--out", default="/tmp/tabletune-bench/one-vs-per-k")
    ap.add_argument("--k", type=int, default=3, help="launch K")
    ap.add_argument("--ks", default="0,1,2,3", help="k values to time (the profiler's default is 0..K)")
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--order", default="one_first", choices=["one_first", "per_k_first"])
    ap.add_argument("--with-fixed-k", action="store_true",
                    help="also profile mode fixed_k (K = k, no table) and compare (engine-dependence trap)")
    args = ap.parse_args(argv)

    from tabletune_pipelines.engine.config import ServerConfig
    from tabletune_pipelines.engine.identity import engine_identity
    from tabletune_pipelines.engine.plan import default_plan
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models, read_vocab_size
    from tabletune_pipelines.tuning.derive import derive_table

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str = "") -> None:
        print(msg, flush=True)

    def say(msg: str = "") -> None:
        lines.append(msg)
        print(msg, flush=True)

    load_start = loadavg()
    models = ensure_tiny_models(args.models, args.size)
    cfg = ServerConfig(model=str(models.target_dir), drafter=str(models.draft_dir), method="draft_model",
                       num_speculative_tokens=args.k, max_num_seqs=args.max_num_seqs, work_dir=str(out / "servers"))
    plan = default_plan(cfg, batch_sizes=ints(args.batch_sizes), ks=ints(args.ks), repetitions=args.repetitions,
                        include_no_spec=False, accept_batch_sizes=[])
    identity = engine_identity(cfg)
    vocab = read_vocab_size(cfg.model) or 2048
    modes = ["one_launch", "launch_per_k"] if args.order == "one_first" else ["launch_per_k", "one_launch"]
    res: dict[str, dict] = {}
    for mode in modes:
        log(f"== mode {mode} (load {loadavg()})")
        prof, wall, startups = run_mode(cfg, plan, mode, identity, vocab, log)
        res[mode] = {"profile": prof, "wall_s": wall, "startups_s": startups, "load_after": loadavg()}
    fixed = None
    if args.with_fixed_k:
        log(f"== mode fixed_k (load {loadavg()})")
        fplan = default_plan(cfg, batch_sizes=ints(args.batch_sizes), ks=[k for k in ints(args.ks) if k >= 1],
                             repetitions=args.repetitions, include_no_spec=False, accept_batch_sizes=[])
        fprof, fwall, fstart = run_mode(cfg, fplan, "fixed_k", identity, vocab, log)
        fixed = {"profile": fprof, "wall_s": fwall, "startups_s": fstart}
    load_end = loadavg()

    one, per = res["one_launch"]["profile"], res["launch_per_k"]["profile"]
    cell_one = {(c.k, c.batch_size): c for c in one.cells}
    cell_per = {(c.k, c.batch_size): c for c in per.cells}
    ks, bs = list(plan.ks), list(plan.batch_sizes)

    say(f"# one launch vs launch per k — {identity.key}")
    say(f"model {args.size} target + 1-layer draft (draft_model), launch K = {args.k}, ks {ks}, B {bs}, "
        f"{args.repetitions} repetitions, every draft rejected; order {' then '.join(modes)}")
    say(f"load average at start: {load_start}; at end: {load_end}")
    say("")
    say("| B | k | one_launch ms (spread) | launch_per_k ms (spread) | per_k / one |")
    say("|---|---|---|---|---|")
    ratios, sp_one, sp_per, cells_json = [], [], [], []
    for b in bs:
        for k in ks:
            co, cp = cell_one[(k, b)], cell_per[(k, b)]
            r = cp.median_ms / co.median_ms
            ratios.append(r)
            sp_one.append(co.spread)
            sp_per.append(cp.spread)
            say(f"| {b} | {k} | {co.median_ms:.2f} ({co.spread:.1%}) | {cp.median_ms:.2f} ({cp.spread:.1%}) | {r:.3f} |")
            cells_json.append({"B": b, "k": k, "one_launch_ms": co.median_ms, "one_launch_reps": co.repetitions_ms,
                               "one_launch_spread": co.spread, "per_k_ms": cp.median_ms,
                               "per_k_reps": cp.repetitions_ms, "per_k_spread": cp.spread, "ratio": r})
    dev = [abs(r - 1) for r in ratios]
    say("")
    say(f"per-cell ratio per_k/one: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f}, "
        f"median |ratio − 1| {statistics.median(dev):.1%}, max {max(dev):.1%}")
    say(f"repetition spread: one_launch median {statistics.median(sp_one):.1%} (max {max(sp_one):.1%}); "
        f"launch_per_k median {statistics.median(sp_per):.1%} (max {max(sp_per):.1%})")

    # Tables each mode derives.
    say("")
    tables_json = {}
    all_same = True
    for name, rates in FIXED_PRIORS.items():
        rates = tuple(rates[: args.k])
        to = derive_table(one, fixed_prior(rates))
        tp = derive_table(per, fixed_prior(rates))
        same = to.table.ranges == tp.table.ranges
        all_same &= same
        worst_po, mean_po = _cross_loss(tp.table.ranges, to.step_ms_dense, list(to.choice.ks), rates,
                                        args.max_num_seqs, args.k)
        worst_op, mean_op = _cross_loss(to.table.ranges, tp.step_ms_dense, list(tp.choice.ks), rates,
                                        args.max_num_seqs, args.k)
        say(f"prior {name}:")
        say(f"  one_launch table   {to.table.as_vllm()}")
        say(f"  launch_per_k table {tp.table.as_vllm()}")
        say(f"  same table: {'YES' if same else 'NO'}; per_k table judged on the one-launch profile: worst loss "
            f"{worst_po:.1%} (mean {mean_po:.1%}); one-launch table judged on the per_k profile: worst "
            f"{worst_op:.1%} (mean {mean_op:.1%})")
        tables_json[name] = {"rates": rates, "one_launch": to.table.as_vllm(), "launch_per_k": tp.table.as_vllm(),
                             "same": same, "per_k_table_loss_on_one_profile": [worst_po, mean_po],
                             "one_table_loss_on_per_k_profile": [worst_op, mean_op]}

    w1, wp = res["one_launch"]["wall_s"], res["launch_per_k"]["wall_s"]
    say("")
    say(f"wall time: one_launch {w1:.0f} s ({len(res['one_launch']['startups_s'])} launch, start-up "
        f"{sum(res['one_launch']['startups_s']):.0f} s); launch_per_k {wp:.0f} s "
        f"({len(res['launch_per_k']['startups_s'])} launches, start-ups "
        f"{', '.join(f'{s:.0f}' for s in res['launch_per_k']['startups_s'])} s)")
    say(f"wall-time ratio launch_per_k / one_launch = {wp / w1:.2f}x")
    smaller_spread = statistics.median(sp_one) < statistics.median(sp_per)
    say(f"target (one launch >= 2.5x faster, same table, smaller spread): wall {'MET' if wp / w1 >= 2.5 else 'MISSED'} "
        f"({wp / w1:.2f}x); table {'same' if all_same else 'DIFFERENT'}; median spread "
        f"{'smaller' if smaller_spread else 'NOT smaller'} ({statistics.median(sp_one):.1%} vs "
        f"{statistics.median(sp_per):.1%})")

    fixed_json = None
    if fixed is not None:
        fp = fixed["profile"]
        say("")
        say(f"fixed k (K = k, no table; {fixed['wall_s']:.0f} s): T ms vs one_launch (K = {args.k}, table k)")
        say("| B | k | fixed K=k ms | one_launch ms | fixed / one |")
        say("|---|---|---|---|---|")
        fixed_json = []
        for c in fp.cells:
            co = cell_one[(c.k, c.batch_size)]
            say(f"| {c.batch_size} | {c.k} | {c.median_ms:.2f} ({c.spread:.0%}) | {co.median_ms:.2f} | "
                f"{c.median_ms / co.median_ms:.3f} |")
            fixed_json.append({"B": c.batch_size, "k": c.k, "fixed_ms": c.median_ms, "reps": c.repetitions_ms,
                               "launch_k": c.launch_k, "one_launch_ms": co.median_ms})

    result = {
        "identity": identity.to_dict(), "plan": {"ks": ks, "batch_sizes": bs, "repetitions": args.repetitions},
        "order": modes, "load_start": load_start, "load_end": load_end, "cells": cells_json,
        "wall_s": {"one_launch": w1, "launch_per_k": wp, "ratio": wp / w1},
        "startups_s": {m: res[m]["startups_s"] for m in res}, "tables": tables_json, "fixed_k": fixed_json,
        "profiles": {m: res[m]["profile"].to_dict() for m in res},
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=list))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {out / 'result.json'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measured closed-loop goodput of the tuned table vs every fixed k vs the docs' table, on a GPU.

    python benchmarks/gpu_goodput.py --engine dense --tuned '[[1,64,3],[65,128,1]]' --out results.json

One launch per engine (Qwen3-4B-shaped or Qwen3-30B-A3B-shaped target + EAGLE-3 head, dummy
weights, Model Runner V2 with full CUDA graphs, synthetic acceptance fixed at launch), closed-loop
load at each concurrency, tables hot-swapped between windows in rotating order
(``tabletune_pipelines.tuning.served_load``, the library's closed loop). The launch table lists every k (V2 captures full CUDA graphs only for
k values in the launch table). Prints per load: goodput per policy with its standard error across
rounds, the loss against the best fixed k, and the paired A/A difference of two names for one table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tabletune_pipelines.tuning.served_windows import policy_ratio, summarize
from tabletune_pipelines.evaluation.served import loss_table, run_closed_loop

ENGINES = {
    "dense": ("qwen3-4b", "qwen3-4b-eagle3"),
    "moe": ("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3"),
}
DOCS_DENSE = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]


def docs_table(max_num_seqs: int, max_k: int) -> list[list[int]]:
    """The docs' dense-shaped example table cut to max_num_seqs, k capped at the launch K."""
    out = []
    for s, e, k in DOCS_DENSE:
        if s > max_num_seqs:
            break
        out.append([s, min(e, max_num_seqs), min(k, max_k)])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(ENGINES), required=True)
    ap.add_argument("--models", default=os.environ.get("TT_GPU_MODELS", "/tmp/gv/models"))
    ap.add_argument("--rates", default="0.7,0.5,0.3")
    ap.add_argument("--tuned", required=True, help="the tuned table, vLLM JSON [[start, end, k], ...]")
    ap.add_argument("--loads", default="1,8,32,64,128")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--out", default="gpu_goodput.json")
    ap.add_argument("--work-dir", default="/tmp/tt-goodput")
    ap.add_argument("--compilation-config", default=None,
                    help="vLLM --compilation-config JSON, e.g. '{\"max_cudagraph_capture_size\": 1024}'")
    args = ap.parse_args(argv)

    from tabletune_pipelines.engine import ServerConfig, VLLMServer

    target, head = ENGINES[args.engine]
    rates = tuple(float(x) for x in args.rates.split(","))
    K, M = len(rates), args.max_num_seqs
    launch_table = [[k + 1, k + 1, k] for k in range(K)] + [[K + 1, M, K]]
    cfg = ServerConfig(
        model=f"{args.models}/{target}", drafter=f"{args.models}/{head}", method="eagle3", num_speculative_tokens=K,
        table=tuple(tuple(r) for r in launch_table), synthetic_acceptance_rates=rates, max_num_seqs=M,
        max_model_len=512, device="gpu", model_runner="v2", load_format="dummy", startup_timeout=600.0,
        work_dir=args.work_dir,
        extra_args=("--compilation-config", args.compilation_config) if args.compilation_config else (),
    )
    policies = {f"fixed_k{k}": [[1, M, k]] for k in range(K + 1)}
    policies["docs"] = docs_table(M, K)
    policies["docs_again"] = docs_table(M, K)  # A/A: the same table under a second name (noise floor)
    policies["tuned"] = json.loads(args.tuned)
    loads = [int(x) for x in args.loads.split(",")]
    t0 = time.monotonic()
    with VLLMServer(cfg) as server:
        print(f"[goodput] {args.engine} healthy after {time.monotonic() - t0:.0f} s", flush=True)
        windows = run_closed_loop(server, policies, loads, vocab_size=151000, max_num_seqs=M, max_k=K,
                                  rounds=args.rounds, window_s=args.window, progress=lambda s: print(s, flush=True))
    summary = summarize(windows)
    fixed = [f"fixed_k{k}" for k in range(K + 1)]
    losses = loss_table(summary, fixed, list(policies), loads)
    print(f"\n{args.engine}: loss vs best fixed k per load (goodput tok/s ± s.e. across rounds)")
    for p in policies:
        cells = []
        for load in loads:
            s = summary.get((p, load))
            cells.append("n/a" if s is None else f"{s.goodput:8.0f}±{s.stderr:5.0f} ({100 * losses.get(p, {}).get(load, float('nan')):5.1f}%)")
        worst = max(losses.get(p, {}).values(), default=float("nan"))
        print(f"  {p:<11} " + " | ".join(cells) + f" | worst {100 * worst:5.1f}%")
    aa = {load: policy_ratio(windows, "docs", "docs_again", load) for load in loads}
    print("  A/A (docs vs docs_again) paired ratio: " + ", ".join(f"L{l}: {r:.3f}±{se:.3f}" for l, (r, se, _) in aa.items()))
    Path(args.out).write_text(json.dumps({
        "engine": args.engine, "compilation_config": args.compilation_config, "rates": rates, "policies": policies, "loads": loads,
        "windows": [w.__dict__ for w in windows],
        "summary": {f"{p}@{l}": s.__dict__ for (p, l), s in summary.items()},
        "loss": losses, "aa": {str(l): v for l, v in aa.items()},
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Served goodput of a (batch size x context) table against the batch-only table and every fixed k,
at two or more context levels, in one launch.

    python benchmarks/context_served.py --engine cpu --contexts 64,1024 --loads 4,8 --rounds 2 --window 3 \\
        --grid '[[1,16,1,256,3],[1,16,257,2048,1]]' --batch '[[1,16,3]]' --out /tmp/tt-context-served
    python benchmarks/context_served.py --engine dense --contexts 2048,8192 --loads 8,32,64 \\
        --grid /data/tables/dense.json --out /tmp/tt-context-served-dense

Engines: ``cpu`` is the embedded default's real model (SmolLM2-135M-Instruct, ``engine/real_model.py``)
on vLLM's CPU build with n-gram drafting (prompt lookup 2..4, real verification), K = 3, max_num_seqs
16, max_model_len 2048, the launch table listing every k; ``dense`` / ``moe`` are the GPU engines of
``benchmarks/gpu_goodput.py`` (dummy weights, EAGLE-3 head, synthetic acceptance ``--rates``), with
max_model_len fitting the longest level plus the longest output. Every launch runs TableTune's timing
scheduler, which serves a 5-item table column by column (each step the column of its running
requests' context, aggregated by the table's ``ctx_agg``) and logs each step's context.

At each context level (every request's prompt is that many random token ids, outputs uniform in
``--output-tokens``), closed-loop load at each ``--loads`` (``evaluation.served.run_closed_loop``),
policies hot-swapped between windows in rotating order over ``--rounds`` rounds: the grid (``--grid``:
5-item JSON, or a published file whose ``context_entries`` and ``ctx_agg`` are read), the batch-only
table (``--batch``: 3-item JSON; default the published file's ``ranges``), every fixed k, and on a GPU
the docs' table (``gpu_goodput.docs_table``). Every window is checked against the step log (each
step's k against the cell of its batch size and context column). A policy's windows at a level are
named ``<policy>@<level>``, so the levels stay apart.

Printed per level and load: goodput per policy ± s.e. across rounds, and the paired ratios
(``tuning.served_windows.policy_ratio``) grid/batch, grid/best fixed k and batch/best fixed k ± s.e.
with their rounds; a pair that runs the same k in every cell the load and level reach (batch sizes
1..load, contexts from the prompt to the prompt plus the longest output: ``evaluation.served.same_k_reached``)
is marked A/A: its ratio is the noise floor, not a comparison. Written: ``--out``/context_served.json
(every window, the policies, the summaries and the ratios) and ``--out``/context_served.log.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.evaluation.bench import ints, loadavg
from tabletune_pipelines.evaluation.served import run_closed_loop, same_k_reached
from tabletune_pipelines.tuning.served_windows import policy_ratio, summarize

CPU_K, CPU_M = 3, 16
CPU_LAUNCH = [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, CPU_M, 3]]


class Log:
    """Prints a line and keeps it for the .log file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.lines.append(msg)


class Agg:
    """The server as ``run_closed_loop`` drives it, with the grid's ``ctx_agg`` sent beside a 5-item table."""

    def __init__(self, server: Any, agg: str) -> None:
        self.server, self.agg = server, agg

    def set_k(self, k: int | None = None, *, table: Any = None, timeout: float = 30.0) -> None:
        grid = table is not None and DraftTable.from_entries(table, allow_context=True).axes.context is not None
        self.server.set_k(k, table=table, timeout=timeout, ctx_agg=self.agg if grid else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


def read_tables(grid_arg: str, batch_arg: str | None) -> tuple[list[list[int]], list[list[int]], str]:
    """(grid, batch-only table, ctx_agg) from the command line: JSON, or a published file's table."""
    if Path(grid_arg).is_file():
        from tabletune_pipelines.formats.published import parse_published, strict_json_loads

        pub = parse_published(strict_json_loads(Path(grid_arg).read_text()), where=grid_arg)
        if pub.context_entries is None:
            raise SystemExit(f"{grid_arg}: the published table has no context_entries (one context bucket)")
        grid, agg = [list(e) for e in pub.context_entries], pub.ctx_agg
        batch = json.loads(batch_arg) if batch_arg else [list(r) for r in pub.ranges]
    else:
        grid, agg = json.loads(grid_arg), "mean"
        if not batch_arg:
            raise SystemExit("--batch is required with a --grid given as JSON")
        batch = json.loads(batch_arg)
    if DraftTable.from_entries(grid, allow_context=True).axes.context is None:
        raise SystemExit(f"--grid {grid} has no context axis (5-item entries needed)")
    if DraftTable.from_entries(batch, allow_context=True).axes.context is not None:
        raise SystemExit(f"--batch {batch} must be a 3-item (batch-only) table")
    return grid, batch, agg


def launch(args: argparse.Namespace, levels: list[int], out_hi: int) -> tuple[Any, int, int, int, list | None]:
    """(ServerConfig, K, max_num_seqs, vocab size, the docs' table or None) of ``--engine``."""
    from tabletune_pipelines.engine import ServerConfig

    if args.engine == "cpu":
        from tabletune_pipelines.engine.real_model import MAX_MODEL_LEN, ensure_real_model

        if levels[-1] + out_hi > MAX_MODEL_LEN:
            raise SystemExit(f"level {levels[-1]} + output {out_hi} exceeds the real model's max_model_len "
                             f"{MAX_MODEL_LEN}")
        m = ensure_real_model()
        cfg = ServerConfig(model=str(m.model_dir), method="ngram", num_speculative_tokens=CPU_K,
                           table=tuple(tuple(r) for r in CPU_LAUNCH), max_num_seqs=CPU_M, max_model_len=MAX_MODEL_LEN,
                           dtype=m.dtype, work_dir=args.work_dir,
                           speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
        return cfg, CPU_K, CPU_M, 49152, None
    from gpu_goodput import ENGINES, docs_table  # the sibling GPU benchmark (the script's folder is on the path)

    target, head = ENGINES[args.engine]
    rates = tuple(float(x) for x in args.rates.split(","))
    K, M = len(rates), args.max_num_seqs
    table = [[k + 1, k + 1, k] for k in range(K)] + [[K + 1, M, K]]
    cfg = ServerConfig(
        model=f"{args.models}/{target}", drafter=f"{args.models}/{head}", method="eagle3", num_speculative_tokens=K,
        table=tuple(tuple(r) for r in table), synthetic_acceptance_rates=rates, max_num_seqs=M,
        max_model_len=levels[-1] + out_hi + 16, device="gpu", model_runner="v2", load_format="dummy",
        startup_timeout=600.0, work_dir=args.work_dir)
    return cfg, K, M, 151000, docs_table(M, K)


def ratio_line(windows: list, a: str, b: str, label: str, aa: bool, load: int) -> tuple[str, dict]:
    """One paired ratio, printed and kept: ``a``/``b`` at ``load`` ± s.e. with its rounds, marked A/A."""
    r, se, n = policy_ratio(windows, a, b, load)
    mark = "  A/A (same k in every cell reached: noise floor)" if aa else ""
    return f"    {label:<22} {r:6.3f} ± {se:5.3f} ({n} rounds){mark}", {
        "a": a, "b": b, "ratio": r, "se": se, "rounds": n, "aa": aa}


def report(log: Log, windows: list, tables: dict, level: int, loads: list[int], K: int, M: int,
           out_hi: int) -> dict:
    """Goodput per policy and the paired ratios at one context level; returns them for the JSON."""
    at = f"@{level}"
    summary = summarize([w for w in windows if w.policy.endswith(at)])
    fixed = [f"k={k}" for k in range(K + 1)]
    res: dict[str, Any] = {}
    for load in loads:
        log(f"  context {level}, load {load}: goodput tok/s ± s.e. across rounds  [load avg {loadavg()}]")
        for p in tables:
            s = summary.get((p + at, load))
            log(f"    {p:<8} " + ("n/a (no verified window)" if s is None else
                                   f"{s.goodput:9.1f} ± {s.stderr:6.1f}  ({s.rounds} rounds)"))
        got = [(summary[(f + at, load)].goodput, f) for f in fixed if (f + at, load) in summary]
        best = max(got)[1] if got else None
        ctx = (level, level + out_hi)
        pairs = [("grid", "batch")] + ([("grid", best), ("batch", best)] if best else [])
        cell: dict[str, Any] = {"best_fixed": best, "ratios": []}
        for a, b in pairs:
            aa = same_k_reached(tables[a], tables[b], load=load, max_num_seqs=M, max_k=K, context=ctx)
            line, row = ratio_line(windows, a + at, b + at, f"{a}/{b}" + (" (best)" if b == best else ""), aa, load)
            log(line)
            cell["ratios"].append(row)
        cell["summary"] = {p: summary[(p + at, load)].__dict__ for p in tables if (p + at, load) in summary}
        res[str(load)] = cell
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["cpu", "dense", "moe"], default="cpu")
    ap.add_argument("--contexts", default="64,1024", help="prompt tokens of every request, one level each")
    ap.add_argument("--loads", default="4,8")
    ap.add_argument("--grid", required=True, help="the (B, ctx) table: 5-item JSON, or a published file")
    ap.add_argument("--batch", default=None, help="the batch-only table, 3-item JSON (default: the file's ranges)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--min-steps", type=int, default=0,
                    help="a window goes on until it holds this many steps (up to 4 x --window): long prefills")
    ap.add_argument("--output-tokens", default="32,64", help="min,max output tokens per request")
    ap.add_argument("--rates", default="0.7,0.5,0.3", help="GPU: synthetic acceptance")
    ap.add_argument("--models", default=os.environ.get("TT_GPU_MODELS", "/tmp/gv/models"))
    ap.add_argument("--max-num-seqs", type=int, default=128, help="GPU launches")
    ap.add_argument("--work-dir", default="/tmp/tt-context-served")
    ap.add_argument("--out", required=True, help="folder for context_served.json and context_served.log")
    args = ap.parse_args(argv)

    from tabletune_pipelines.engine import VLLMServer

    levels, loads = sorted(ints(args.contexts) or []), ints(args.loads) or []
    out_lo, out_hi = ints(args.output_tokens) or [32, 64]
    grid, batch, agg = read_tables(args.grid, args.batch)
    cfg, K, M, vocab, docs = launch(args, levels, out_hi)
    tables: dict[str, list[list[int]]] = {"grid": grid, "batch": batch,
                                          **{f"k={k}": [[1, M, k]] for k in range(K + 1)}}
    if docs is not None:
        tables["docs"] = docs
    log = Log()
    log(f"[context-served] engine {args.engine}, levels {levels}, loads {loads}, rounds {args.rounds}, window "
        f"{args.window} s (min {args.min_steps} steps), outputs {out_lo}-{out_hi}; grid {grid} (ctx_agg {agg}); "
        f"batch {batch}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    windows = []
    t0 = time.monotonic()
    with VLLMServer(cfg) as server:
        log(f"[context-served] healthy after {time.monotonic() - t0:.0f} s")
        for level in levels:
            pol = {f"{p}@{level}": t for p, t in tables.items()}
            windows += run_closed_loop(Agg(server, agg), pol, loads, vocab_size=vocab, max_num_seqs=M, max_k=K,
                                       rounds=args.rounds, window_s=args.window, settle_s=args.settle,
                                       warmup_s=args.warmup, prompt_tokens=level, output_tokens=(out_lo, out_hi),
                                       progress=log, min_steps=args.min_steps)
    log(f"[context-served] measured in {time.monotonic() - t0:.0f} s; per context level:")
    results = {str(level): report(log, windows, tables, level, loads, K, M, out_hi) for level in levels}
    (out / "context_served.json").write_text(json.dumps({
        "engine": args.engine, "levels": levels, "loads": loads, "rounds": args.rounds, "window_s": args.window,
        "min_steps": args.min_steps,
        "output_tokens": [out_lo, out_hi], "max_num_seqs": M, "max_k": K, "ctx_agg": agg, "policies": tables,
        "windows": [w.__dict__ for w in windows], "results": results}, indent=1))
    (out / "context_served.log").write_text("\n".join(log.lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

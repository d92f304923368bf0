"""Which served window tells two policies apart in fewer rounds: time windows of a running closed loop
against windows of fixed work, side by side in one launch of the embedded default.

    flock /tmp/tabletune-engine.lock python benchmarks/served_windows.py --out benchmarks/data/cpu/DATE-served-windows \
        [--load 8] [--rounds 6] [--requests 3,2] [--window 5] [--a k=1 --b k=3]

ONE launch of the embedded default's engine for served verification (the fleet's first deployment:
real SmolLM2-135M-Instruct, n-gram drafting, K = 3, max_num_seqs 16, the launch table listing every
k), real acceptance, on the real prompt mixes (HumanEval and WritingBench, half each: what the main
job's week of logged prompts holds). At ``--load`` concurrent clients, two fixed-k policies (``--a``,
``--b``) are compared by their paired goodput ratio b / a in ``--rounds`` rounds; each round
measures both policies under three designs, in this order, the policies' order alternating by round:

- ``time``: the verification's time windows (``served_windows.measure_window``: ``--window`` s of a
  closed loop that keeps running, every client reseeded with the round before each window), at the
  server's default temperature;
- ``time-t0``: the same at temperature 0 (the acceptance prior's), to tell the window's effect from
  the sampling's;
- ``requests-N`` for each N of ``--requests``: windows of fixed work
  (``served_windows.measure_requests_window``: each client sends the round's first N requests from
  an idle engine, at temperature 0, until all are answered).

Printed and written to ``--out``/result.json: per design and round the two goodputs, steps and mean
batch, then per design the paired ratio's mean ± s.e. and its per-round standard deviation (what
the verification's rounds are sized by: rounds needed grow with its square), and the wall seconds
per window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fleet", default="fleet.yaml")
    ap.add_argument("--load", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", default="3,2", help="requests per client of a fixed-work window (one design each)")
    ap.add_argument("--window", type=float, default=5.0, help="seconds of a time window")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds after a swap before a time window counts")
    ap.add_argument("--a", default="k=1")
    ap.add_argument("--b", default="k=3")
    ap.add_argument("--work-dir", default="/tmp/tt-served-windows", help="server logs (a short path: vLLM's sockets)")
    args = ap.parse_args(argv)

    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.bench import loadavg
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.formats.prompt_mixes import load_mix
    from tabletune_pipelines.tuning import deployments
    from tabletune_pipelines.tuning.served_load import LoadGenerator
    from tabletune_pipelines.tuning.served_windows import measure_requests_window, measure_window

    requests = [int(x) for x in args.requests.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dep = load_fleet(args.fleet).deployments[0]
    identity = deployments.current_identity(dep)
    K, M = identity.max_k, identity.max_num_seqs
    tables = {name: [[1, M, int(name.split("=")[1])]] for name in (args.a, args.b)}
    # the verification's own launch with real acceptance (what deployments.verify_served builds)
    cfg = deployments._server_config(identity, dep, deployments.default_cache_dir(), args.work_dir, {
        "table": deployments.verification_launch_table(M, K), **deployments._real_model_overrides(identity)})
    prompts = list(load_mix("code")) + list(load_mix("prose"))

    def pick(rng):
        return rng.choice(prompts)

    result: dict = {"identity": identity.key, "load": args.load, "rounds": args.rounds, "requests": requests,
                    "window_s": args.window, "a": args.a, "b": args.b,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "designs": {}}
    designs = {"time": None, "time-t0": 0.0}
    srv = VLLMServer(cfg)
    srv.start()
    print(f"server up in {srv.startup_seconds:.0f} s; load {args.load}, {args.b} / {args.a}, {args.rounds} rounds",
          flush=True)
    try:
        for r in range(args.rounds):
            order = [args.a, args.b] if r % 2 == 0 else [args.b, args.a]
            for design, temperature in designs.items():
                gen = LoadGenerator(srv, args.load, 49152, prompt=pick, output_tokens=(32, 128), seed=args.load,
                                    temperature=temperature).start()
                time.sleep(1.5)  # the loop reaches its load before the first window
                row = {}
                for name in order:
                    t = time.monotonic()
                    gen.reseed(r)
                    w = measure_window(srv, name, tables[name], load=args.load, round_=r, window_s=args.window,
                                       settle_s=args.settle, max_num_seqs=M, max_k=K)
                    row[name] = _row(w, time.monotonic() - t)
                gen.stop(wait=True)
                _record(result, design, r, row, args)
            gen = LoadGenerator(srv, args.load, 49152, prompt=pick, output_tokens=(32, 128), seed=args.load,
                                temperature=0.0)
            for n in requests:
                row = {}
                for name in order:
                    t = time.monotonic()
                    w = measure_requests_window(srv, name, tables[name], gen, load=args.load, round_=r,
                                                requests=n, settle_s=0.3, max_num_seqs=M, max_k=K)
                    row[name] = _row(w, time.monotonic() - t)
                _record(result, f"requests-{n}", r, row, args)
            (out / "result.json").write_text(json.dumps(result, indent=1))
    finally:
        srv.stop()
    print(f"\n{args.b} / {args.a} at load {args.load} (load average {loadavg()}):")
    for design, d in result["designs"].items():
        ratios = [x["ratio"] for x in d["rounds"]]
        sd = statistics.stdev(ratios) if len(ratios) > 1 else float("nan")
        d.update(mean=round(statistics.fmean(ratios), 4), sd=round(sd, 4), se=round(sd / len(ratios) ** 0.5, 4),
                 wall_s=round(statistics.fmean(x[n]["wall_s"] for x in d["rounds"] for n in (args.a, args.b)), 1),
                 mean_batch=round(statistics.fmean(x[n]["mean_b"] for x in d["rounds"] for n in (args.a, args.b)), 2))
        print(f"  {design:<10} ratio {d['mean']:.3f} ± {d['se']:.3f}  per-round s.d. {d['sd']:.3f}  "
              f"({len(ratios)} rounds; {d['wall_s']:.1f} s a window, mean batch {d['mean_batch']:.1f})", flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


def _row(w, wall: float) -> dict:
    return {"goodput": round(w.goodput, 2), "kept": w.kept_tokens, "steps": w.steps, "mean_b": round(w.mean_batch, 2),
            "verified": w.table_verified, "wall_s": round(wall, 2)}


def _record(result: dict, design: str, r: int, row: dict, args: argparse.Namespace) -> None:
    row["ratio"] = row[args.b]["goodput"] / row[args.a]["goodput"]
    result["designs"].setdefault(design, {"rounds": []})["rounds"].append(row)
    print(f"{design:<10} round {r}: " + "  ".join(f"{n} {row[n]['goodput']:6.1f} tok/s ({row[n]['steps']} steps, "
                                                 f"mean B {row[n]['mean_b']:.1f})" for n in (args.a, args.b))
          + f"  ratio {row['ratio']:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

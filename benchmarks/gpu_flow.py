"""The whole tuning flow on one engine, timed step by step: profile, derive, verify, publish.

    python benchmarks/gpu_flow.py --deployment h200-qwen3-4b-eagle3 --out $OUT     # on the GPU machine
    python benchmarks/gpu_flow.py --cpu-smoke --out /tmp/flow                      # the same on the CPU build

The steps are ``tuning.flow.run_flow``, the library functions the Dagster pipeline's assets call,
without Dagster (the GPU machine has vLLM but no Dagster): ``tuning.deployments.LocalEngine`` is the
pipeline's ``EngineResource`` without its Dagster config, the store is the same DuckDB store. One
vLLM launch serves every step (``--two-launches``: the verification launches its own server).

1. **launch**: every k in the launch table, synthetic rates 0 (``deployments.one_launch``).
2. **profile**: ``LocalEngine.profile`` on that launch: decode cells, the mixed steps the served
   step-cost fit needs (``engine.mixed``), then re-measurement of the open decisions for
   ``--remeasure-budget`` seconds, with each batch size's stop reason printed. Resumable.
3. **derive**: the prior the table is derived for, then ``tuning.build.build_table`` with every
   table gate. The GPU models carry dummy weights, so acceptance cannot be measured there: the prior
   is synthetic (``--rates``), and its workload is the logged prompts this script writes for the
   week (``--prompt-tokens`` random token words each) and the verification's output lengths
   (uniform 32..128 tokens, mean 80). Its draft counts are nominal (100000), labelled ``synthetic``.
4. **publish**: ``tuning.publishing.publish_table``: on the same launch, the prior's rates switched
   in at runtime, the table against every fixed k at ``--verify-loads`` in rotating rounds until each
   load is decided (``served_goodput_verified``, ``--verify-budget`` seconds), then publishes
   (verified or UNVERIFIED) or refuses and keeps what was there.

Printed: each step's wall time, the table, the gates, the verification's per-load verdicts with
their paired standard errors. ``$OUT/flow-<deployment>-<steps>.json`` keeps them; ``$OUT/flow.log``
the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path

from tabletune_pipelines.core.stepcost import Workload
from tabletune_pipelines.engine.acceptance import prompt_fingerprint
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.formats.fleet import default_store_path, load_fleet
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.deployments import LocalEngine
from tabletune_pipelines.tuning.flow import FLOW_STEPS, run_flow

NOMINAL_DRAFTS = 100_000
OUTPUT_TOKENS = (32, 128)  # the verification's default max_tokens range (ServedVerificationOptions.output_tokens)


def logged_prompts(path: Path, n: int, tokens: int, vocab: int, seed: int) -> list[str]:
    """A week of logged prompts of ``tokens`` words each, written as ``{"prompt": ...}`` lines. The
    GPU models' tokenizer has one word per id (``t0 t1 ...``), so a prompt is ``tokens`` tokens long."""
    rng = random.Random(seed)
    prompts = [" ".join(f"t{rng.randrange(3, vocab)}" for _ in range(tokens)) for _ in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return prompts


def synthetic_prior(rates: tuple[float, ...], prompts: list[str], week: str, deployment: str,
                    prompt_tokens: float) -> AcceptancePrior:
    n = NOMINAL_DRAFTS
    out = sum(OUTPUT_TOKENS) / 2
    return AcceptancePrior(
        rates=rates, num_drafts=n, drafted_per_pos=(n,) * len(rates), accepted_per_pos=tuple(int(n * a) for a in rates),
        prompt_fingerprint=prompt_fingerprint(prompts), prompt_count=len(prompts), source="synthetic", week=week,
        deployment=deployment,
        workload=Workload(prompt_tokens=prompt_tokens, output_tokens=out,
                          source=f"the week's logged prompts ({prompt_tokens:g} tokens each); output uniform in "
                                 f"{OUTPUT_TOKENS[0]}..{OUTPUT_TOKENS[1]} tokens (the served verification's)").to_dict())


def run(args: argparse.Namespace, log: logging.Logger) -> dict:
    """The steps in ``args.steps`` through ``tuning.flow.run_flow`` (one launch unless ``--two-launches``)."""
    fleet = load_fleet(args.fleet)
    dep = fleet.deployment(args.deployment) if args.deployment else fleet.deployments[0]
    profile_options = {"batch_sizes": args.batch_sizes, "repetitions": args.repetitions,
                       "accept_batch_sizes": (), "include_no_spec": False,
                       "remeasure_budget_s": args.remeasure_budget}
    verification = {k: v for k, v in {"budget_s": args.verify_budget, "loads": args.verify_loads,
                                      "window_s": args.verify_window, "fixed_k": args.verify_fixed_k}.items() if v}
    engine = LocalEngine(profile_options={k: v for k, v in profile_options.items() if v is not None},
                         served_verification=verification, where="gpu_flow")
    store = TableTuneStore(Path(args.db) if args.db else default_store_path())
    prior: dict = {}

    def write_prior(identity) -> None:
        prompts = logged_prompts(dep.prompts_file(args.week), 400, args.prompt_tokens, args.vocab, seed=7)
        p = synthetic_prior(tuple(args.rates), prompts, args.week, dep.name, float(args.prompt_tokens))
        store.upsert_identity(identity)
        store.write_acceptance_prior(p, identity.key)
        prior.update({"rates": list(p.rates), "workload": p.workload})

    report = run_flow(store, fleet, dep, engine, log=log, steps=args.steps, one_launch_flow=not args.two_launches,
                      before_derive=write_prior)
    return {**report.to_dict(), "prior": prior, "one_launch": not args.two_launches}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", default=None, help="fleet YAML (default $TABLETUNE_FLEET or the embedded fleet)")
    ap.add_argument("--deployment", default=None, help="deployment name (default: the fleet's first)")
    ap.add_argument("--db", default=None, help="DuckDB store (default $TABLETUNE_HOME/tabletune_store.duckdb)")
    ap.add_argument("--batch-sizes", type=_ints, default=None, help="profile grid (default: the profiler's)")
    ap.add_argument("--repetitions", type=int, default=None)
    ap.add_argument("--remeasure-budget", type=float, default=None, help="seconds (default: the profiler's)")
    ap.add_argument("--verify-budget", type=float, default=None, help="seconds once the server is up and warm (default: "
                                                                         "the device's)")
    ap.add_argument("--verify-loads", type=_ints, default=None, help="verification loads (default 1, N/2, N)")
    ap.add_argument("--verify-window", type=float, default=None, help="seconds per verification window")
    ap.add_argument("--verify-fixed-k", choices=("all", "plausible"), default=None,
                    help="fixed k served per load: every k (default) or those the profile cannot rule out")
    ap.add_argument("--two-launches", action="store_true", help="profile and verify in separate launches")
    ap.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")), default=(0.7, 0.5, 0.3))
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=2048, help="token words t3..t<vocab-1> in the prompts")
    ap.add_argument("--week", default="2026-11-30", help="the week (a Monday) of the logged prompts written")
    ap.add_argument("--steps", type=lambda t: tuple(x for x in t.split(",") if x), default=FLOW_STEPS,
                    help="comma-separated, in order, of " + ",".join(FLOW_STEPS) + " (default all, in one launch)")
    ap.add_argument("--cpu-smoke", action="store_true", help="the embedded CPU deployment, a small plan")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if bad := [x for x in args.steps if x not in FLOW_STEPS]:
        ap.error(f"--steps {','.join(args.steps)}: unknown {bad}; give some of {','.join(FLOW_STEPS)}")
    if args.cpu_smoke:
        args.batch_sizes = args.batch_sizes or (1, 4, 8, 16)
        args.repetitions = args.repetitions or 2
        args.remeasure_budget = 0.0 if args.remeasure_budget is None else args.remeasure_budget
        args.verify_budget = args.verify_budget or 60.0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("gpu_flow")
    log.setLevel(logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    for h in (logging.StreamHandler(sys.stdout), logging.FileHandler(out / "flow.log")):
        h.setFormatter(fmt)
        log.addHandler(h)
    result = run(args, log)
    path = out / f"flow-{result['deployment']}-{'-'.join(args.steps)}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({"seconds": {k: round(v, 1) for k, v in result["seconds"].items()},
                      **{k: result[k] for k in ("table", "published_table", "refusal") if k in result}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

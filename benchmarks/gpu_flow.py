"""The whole tuning flow on one engine, timed step by step: profile, derive, verify, publish.

    python benchmarks/gpu_flow.py --deployment h200-qwen3-4b-eagle3 --out $OUT     # on the GPU machine
    python benchmarks/gpu_flow.py --cpu-smoke --out /tmp/flow                      # the same on the CPU build

The steps are the library functions the Dagster pipeline's assets call, without Dagster (the GPU
machine has vLLM but no Dagster): ``tuning.deployments.LocalEngine`` is the pipeline's
``EngineResource`` without its Dagster config, the store is the same DuckDB store.

1. **profile**: ``LocalEngine.profile``, one launch (``one_launch``: every k switched at runtime),
   decode cells and the mixed steps the served step-cost fit needs (``engine.mixed``), then adaptive
   re-measurement for ``--remeasure-budget`` seconds. Resumable: a rerun skips measured cells.
2. **prior**: the acceptance the table is derived for. The GPU models carry dummy weights, so
   acceptance cannot be measured there: the prior is synthetic (``--rates``, the rates the
   verification launch injects), and its workload is the logged prompts this script writes for the
   week (``--prompt-tokens`` random token words each) and the verification's output lengths
   (uniform 32..128 tokens, mean 80). Its draft counts are nominal (100000), labelled ``synthetic``.
3. **derive**: ``tuning.build.build_table`` (the ``draft_length_table`` asset's function): the
   prior's workload prices served steps with the profile's mixed-step fits; every table gate.
4. **verify + publish**: ``tuning.publishing.publish_table`` (the ``published_table`` asset's
   function): a second launch runs the table against every fixed k at loads 1, max_num_seqs/2 and
   max_num_seqs in rotating rounds (``served_goodput_verified``, ``--verify-budget`` seconds once the
   server is up), then publishes to the deployment's file, or refuses and keeps what was there.

``--steps`` runs some of them (a device call's 10-minute limit: the profile in one call, derive and
publish in the next). Printed: each step's wall time and theirs together, the table, the gates, the verification's per-load
verdicts. ``$OUT/flow-<deployment>-<steps>.json`` keeps them; ``$OUT/flow.log`` the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

from tabletune_pipelines.core.stepcost import Workload
from tabletune_pipelines.engine.acceptance import prompt_fingerprint
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.formats.fleet import default_store_path, load_fleet
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.build import DefaultBuildSettings, build_table
from tabletune_pipelines.tuning.deployments import LocalEngine
from tabletune_pipelines.tuning.publishing import publish_table

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


STEPS = ("profile", "derive", "publish")


def run(args: argparse.Namespace, log: logging.Logger) -> dict:
    """The steps in ``args.steps``, in order, each timed; a later step reads what an earlier call stored."""
    fleet = load_fleet(args.fleet)
    dep = fleet.deployment(args.deployment) if args.deployment else fleet.deployments[0]
    profile_options = {"batch_sizes": args.batch_sizes, "repetitions": args.repetitions,
                       "accept_batch_sizes": (), "include_no_spec": False,
                       "remeasure_budget_s": args.remeasure_budget}
    verification = {"budget_s": args.verify_budget} if args.verify_budget else {}
    engine = LocalEngine(profile_options={k: v for k, v in profile_options.items() if v is not None},
                         served_verification=verification, where="gpu_flow")
    store = TableTuneStore(Path(args.db) if args.db else default_store_path())
    identity = engine.current_identity(dep)
    result: dict = {"deployment": dep.name, "identity": identity.key, "seconds": {}}
    for step in args.steps:
        t = time.monotonic()
        result.update(STEP_FUNCTIONS[step](args, log, fleet, dep, engine, store, identity))
        result["seconds"][step] = time.monotonic() - t
        log.info(f"[flow] {step}: {result['seconds'][step]:.1f} s")
    result["seconds"]["these steps"] = sum(result["seconds"].values())
    log.info("[flow] wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in result["seconds"].items()))
    return result


def step_profile(args, log, fleet, dep, engine, store, identity) -> dict:
    log.info(f"[flow] profiling {identity.key} into {store.path}")
    profile = engine.profile(identity, dep, store, log)
    return {"profile_cells": len(profile.cells)}


def step_derive(args, log, fleet, dep, engine, store, identity) -> dict:
    prompts = logged_prompts(dep.prompts_file(args.week), 400, args.prompt_tokens, args.vocab, seed=7)
    prior = synthetic_prior(tuple(args.rates), prompts, args.week, dep.name, float(args.prompt_tokens))
    store.upsert_identity(identity)
    store.write_acceptance_prior(prior, identity.key)
    built = build_table(store, identity.key, DefaultBuildSettings(), log=log)
    table = [list(r) for r in built.table.ranges]
    gates = {g.name: {"passed": g.passed, "description": g.description} for g in built.gates}
    log.info(f"[flow] derived {table}; gates: " + ", ".join(f"{n} {'ok' if g['passed'] else 'FAILED'}"
                                                          for n, g in gates.items()))
    return {"table": table, "prior": {"rates": list(prior.rates), "workload": prior.workload}, "gates": gates}


def step_publish(args, log, fleet, dep, engine, store, identity) -> dict:
    pub = publish_table(store, fleet, identity.key, engine, deployments=[dep.name],
                        max_predicted_loss=DefaultBuildSettings().gates().max_predicted_loss, log=log)
    outcome = pub.refusal or "; ".join(f"published {t.deployment} v{t.version} ({t.path})" for t in pub.targets)
    log.info(f"[flow] served_goodput_verified: {pub.gate.description}")
    log.info(f"[flow] {outcome}")
    return {"published_table": [list(r) for r in pub.table.ranges],
            "served_goodput_verified": {"passed": pub.gate.passed, "description": pub.gate.description,
                                        "figures": pub.gate.figures},
            "refusal": pub.refusal, "published": [str(t.path) for t in pub.published]}


STEP_FUNCTIONS = {"profile": step_profile, "derive": step_derive, "publish": step_publish}


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
    ap.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")), default=(0.7, 0.5, 0.3))
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=2048, help="token words t3..t<vocab-1> in the prompts")
    ap.add_argument("--week", default="2026-11-30", help="the week (a Monday) of the logged prompts written")
    ap.add_argument("--steps", type=lambda t: tuple(x for x in t.split(",") if x), default=STEPS,
                    help="comma-separated, in order, of " + ",".join(STEPS) + " (default all): a device call's "
                         "time limit may need the profile in one call and derive + publish in the next")
    ap.add_argument("--cpu-smoke", action="store_true", help="the embedded CPU deployment, a small plan")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if bad := [x for x in args.steps if x not in STEPS]:
        ap.error(f"--steps {','.join(args.steps)}: unknown {bad}; give some of {','.join(STEPS)}")
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

"""``acceptance_prior``: a_1..a_K per deployment, measured weekly on that week's logged prompts."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.orchestration.partitions import weekly_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningPolicy, store_from
from tabletune_pipelines.prompts import count_prompts
from tabletune_pipelines.tuning.gates import prior_gate
from tabletune_pipelines.tuning.report import priors_markdown

logged_prompts = dg.AssetSpec(
    "logged_prompts",
    group_name="sources",
    kinds={"jsonl"},
    owners=OWNERS,
    description=("Each deployment's logged real prompts, one JSONL file per week: "
                 "`<logged_prompts>/<Monday YYYY-MM-DD>.jsonl`, one `{\"prompt\": ...}` object per line "
                 "(fleet file, `logged_prompts`; format: tabletune_pipelines/prompts.py). Written by the serving "
                 "side, not by this pipeline."),
)


def _sample_summary(dep, prior, week: str, seed: int = 0) -> dict:
    """The sample behind a prior: mix (``prompt_mixes.sample_mix``; logs without ``mix`` labels count as
    unlabelled), size, and a_i with its 95 % Wilson interval."""
    from tabletune_pipelines.acceptance_ci import prior_intervals
    from tabletune_pipelines.prompt_mixes import sample_mix

    ivs = prior_intervals(prior)
    return {"mix": sample_mix(dep.prompts_file(week), dep.max_prompts, seed), "prompt_count": prior.prompt_count,
            "num_drafts": prior.num_drafts,
            "a": [{"value": round(iv.value, 4), "ci95": [round(iv.lo, 4), round(iv.hi, 4)]} for iv in ivs]}


class AcceptanceConfig(dg.Config):
    """Which deployments to measure (empty = every deployment of the fleet)."""

    deployments: list[str] = []


@dg.asset(
    partitions_def=weekly_partitions,
    deps=[logged_prompts],
    kinds={"vllm", "duckdb"},
    group_name="acceptance",
    owners=OWNERS,
    tags={"tabletune/uses_engine": "true"},
    description=(
        "Acceptance prior a_i (probability the first i drafts are all accepted) per deployment, measured at "
        "K = max_k on the week's logged prompts (docs/method.md, \"Acceptance\"). Weekly partitions, weeks start "
        "Monday 00:00 UTC. Rows: DuckDB `acceptance_priors` (`WHERE week = '<partition>' AND source = 'measured'`)."
    ),
    check_specs=[dg.AssetCheckSpec("prior_sane", asset="acceptance_prior", blocking=True,
                                   description="Rates in [0, 1], non-increasing, one per k up to K, enough drafts.")],
)
def acceptance_prior(context: dg.AssetExecutionContext, config: AcceptanceConfig, duckdb: DuckDBResource,
                     fleet: FleetResource, engine: EngineResource, policy: TuningPolicy):
    week = context.partition_key
    the_fleet = fleet.load()
    deps = [the_fleet.deployment(n) for n in config.deployments] if config.deployments else list(the_fleet.deployments)
    store = store_from(duckdb)
    measured, no_prompts, failures, gates = [], [], [], []
    for dep in deps:
        prompts = dep.prompts_file(week)
        if not prompts.exists():
            msg = f"{dep.name}: no logged prompts for the week of {week} ({prompts} does not exist)"
            context.log.warning(msg)
            no_prompts.append(msg)
            continue
        try:
            n = count_prompts(prompts)
            identity = engine.current_identity(dep)
            context.log.info(f"{dep.name}: measuring acceptance on {n} logged prompts of {week} ({identity.key})")
            prior = engine.measure_acceptance(identity, dep, prompts, week, context.log)
        except TableTuneError as exc:
            context.log.error(f"{dep.name}: acceptance measurement failed: {exc}")
            failures.append(f"{dep.name}: {exc}")
            continue
        store.write_acceptance_prior(prior, store.upsert_identity(identity))
        gates.append((dep.name, prior_gate(prior, identity.max_k, policy.min_prior_drafts)))
        measured.append((dep.name, prior, identity.key))
    if not measured:
        raise dg.Failure(
            description=f"no acceptance prior measured for the week of {week}:\n" + "\n".join(no_prompts + failures)
            + "\nThe previous priors and published tables are unchanged.",
            metadata={"week": week, "deployments_without_prompts": len(no_prompts), "failures": len(failures)},
        )
    if failures:
        raise dg.Failure(
            description=(f"acceptance measurement failed for {len(failures)} deployment(s) in the week of {week}:\n"
                         + "\n".join(failures) + f"\nMeasured and stored: {[m[0] for m in measured]}"),
            metadata={"week": week, "measured": dg.MetadataValue.json([m[0] for m in measured])},
        )
    bad = [f"{name}: {g.description}" for name, g in gates if not g.passed]
    yield dg.MaterializeResult(
        metadata={
            "priors": dg.MetadataValue.md(priors_markdown((name, prior) for name, prior, _ in measured)),
            "dagster/row_count": len(measured),
            "week": week,
            "identities": dg.MetadataValue.json(sorted({m[2] for m in measured})),
            "deployments_without_prompts": dg.MetadataValue.json(no_prompts),
            # Which mix each prior's sample came from, its size and each a_i's 95 % interval (Wilson, counts).
            "samples": dg.MetadataValue.json({name: _sample_summary(the_fleet.deployment(name), prior, week,
                                                                    int(engine.acceptance_options.get("seed", 0)))
                                              for name, prior, _ in measured}),
        },
        # One check over all deployments of the run: it fails if any deployment's prior is not sane.
        check_results=[dg.AssetCheckResult(
            check_name="prior_sane", passed=not bad,
            description=("; ".join(bad) if bad else f"{len(gates)} prior(s) sane"),
            metadata={name: g.description for name, g in gates},
        )],
    )

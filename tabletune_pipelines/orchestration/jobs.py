"""Jobs: profile and publish one identity, re-tune one identity, the weekly acceptance, rollback.

Every job, the rollback included, carries a default ``tabletune/engine`` tag so runs launched by
hand from the UI queue behind the run of the same engine (tags.py): a rollback publishes to the
deployment, so it must not overlap a re-tune of that engine publishing to it. The fleet file is read
once, here, for that default.
"""

from __future__ import annotations

import dagster as dg

from assets.publishing import rollback_published_table_op
from tabletune_pipelines.orchestration.tags import manual_run_tags, try_load_fleet

#: Default tags of every job; the one read of the fleet file at definitions load time.
MANUAL_RUN_TAGS = manual_run_tags(try_load_fleet())

profile_and_publish_job = dg.define_asset_job(
    "profile_and_publish",
    selection=dg.AssetSelection.assets("step_time_profile", "draft_length_table", "published_table"),
    tags=MANUAL_RUN_TAGS,
    description="Profile one engine identity, derive its table from the latest prior, publish it (blocking checks gate "
                "each step). Requested by engine_upgrade_sensor.",
)

retune_job = dg.define_asset_job(
    "retune_and_publish",
    selection=dg.AssetSelection.assets("draft_length_table", "published_table"),
    tags=MANUAL_RUN_TAGS,
    description="Re-derive and publish the table of an engine identity from its stored profile and the latest prior.",
)

weekly_acceptance_job = dg.define_asset_job(
    "weekly_acceptance",
    selection=dg.AssetSelection.assets("acceptance_prior", "live_acceptance_counters"),
    tags=MANUAL_RUN_TAGS,
    description="Measure the week's acceptance priors from logged prompts and ingest the controller's live counters.",
)


@dg.job(tags=MANUAL_RUN_TAGS,
        description="Roll a deployment's published table back to the previous version (as a new version), with the "
                    "engine identity and prior it was published with. Queued by its tabletune/engine tag like every "
                    "run of the engine (give it the deployment's engine group in a fleet of several).")
def rollback_published_table():
    rollback_published_table_op()


defs = dg.Definitions(jobs=[profile_and_publish_job, retune_job, weekly_acceptance_job, rollback_published_table])

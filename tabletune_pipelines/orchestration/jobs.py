"""Jobs: profile and publish one identity, re-tune one identity, the weekly acceptance, rollback.

Every job, the rollback included, carries a default ``tabletune/engine`` tag so runs launched by
hand from the UI queue behind the run of the same engine (tags.py): a rollback publishes to the
deployment, so it must not overlap a re-tune of that engine publishing to it. That default comes
from the fleet file, so the jobs are built by ``build_jobs`` when Dagster loads the code location
(``definitions.defs``), never at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from assets.publishing import rollback_published_table_op

PROFILE_AND_PUBLISH = "profile_and_publish"
RETUNE = "retune_and_publish"
WEEKLY_ACCEPTANCE = "weekly_acceptance"
ROLLBACK = "rollback_published_table"


@dataclass(frozen=True)
class Jobs:
    """The code location's jobs, built with one set of default tags."""

    profile_and_publish: Any
    retune: Any
    weekly_acceptance: Any
    rollback: dg.JobDefinition

    def all(self) -> list[Any]:
        return [self.profile_and_publish, self.retune, self.weekly_acceptance, self.rollback]


def build_jobs(tags: Mapping[str, str]) -> Jobs:
    """Every job with ``tags`` as its default run tags (``tags.manual_run_tags`` of the fleet)."""
    tags = dict(tags)
    profile_and_publish = dg.define_asset_job(
        PROFILE_AND_PUBLISH,
        selection=dg.AssetSelection.assets("step_time_profile", "draft_length_table", "published_table"),
        tags=tags,
        description="Profile one engine identity, derive its table from the latest prior, publish it (blocking checks "
                    "gate each step). Requested by engine_upgrade_sensor.",
    )
    retune = dg.define_asset_job(
        RETUNE,
        selection=dg.AssetSelection.assets("draft_length_table", "published_table"),
        tags=tags,
        description="Re-derive and publish the table of an engine identity from its stored profile and the latest "
                    "prior.",
    )
    weekly_acceptance = dg.define_asset_job(
        WEEKLY_ACCEPTANCE,
        selection=dg.AssetSelection.assets("acceptance_prior", "live_acceptance_counters"),
        tags=tags,
        description="Measure the week's acceptance priors from logged prompts and ingest the controller's live "
                    "counters.",
    )

    @dg.job(name=ROLLBACK, tags=tags,
            description="Roll a deployment's published table back to the previous version (as a new version), with "
                        "the engine identity and prior it was published with. Queued by its tabletune/engine tag like "
                        "every run of the engine (give it the deployment's engine group in a fleet of several).")
    def rollback_published_table():
        rollback_published_table_op()

    return Jobs(profile_and_publish, retune, weekly_acceptance, rollback_published_table)

"""Jobs: profile and publish one identity, re-tune one identity, the weekly acceptance, rollback.

Every job, the rollback included, carries a default ``tabletune/engine`` tag so runs launched by
hand from the UI queue behind the run of the same engine (tags.py): a rollback publishes to the
deployment, so it must not overlap a re-tune of that engine publishing to it. That default comes
from the fleet file, so the jobs are built by ``build_jobs`` when Dagster loads the code location
(``tabletune_pipelines/definitions.py``, ``defs``), never at import. The rollback op is an argument:
it lives with the assets (``defs/publishing.py``), and this package never imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

PROFILE_AND_PUBLISH = "profile_and_publish"
RETUNE = "retune_and_publish"
WEEKLY_ACCEPTANCE = "weekly_acceptance"
ROLLBACK = "rollback_published_table"

PROFILE_AND_PUBLISH_ASSETS = ("step_time_profile", "draft_length_table", "published_table")
"""What profiling one engine identity materializes (also the main command's chain, ``embedded.py``)."""
WEEKLY_ACCEPTANCE_ASSETS = ("acceptance_prior", "live_acceptance_counters")
"""What a week's acceptance run materializes (also the main command's first run)."""


@dataclass(frozen=True)
class AssetJob:
    """One asset job of the code location, as ``build_jobs`` defines it."""

    name: str
    """The job's name."""
    assets: tuple[str, ...]
    """The assets it materializes."""
    description: str
    """What the UI shows for it."""


ASSET_JOBS = (
    AssetJob(PROFILE_AND_PUBLISH, PROFILE_AND_PUBLISH_ASSETS,
             "Profile one engine identity, derive its table from the latest prior, publish it (blocking checks "
             "gate each step). Requested by engine_upgrade_sensor."),
    AssetJob(RETUNE, ("draft_length_table", "published_table"),
             "Re-derive and publish the table of an engine identity from its stored profile and the latest prior."),
    AssetJob(WEEKLY_ACCEPTANCE, WEEKLY_ACCEPTANCE_ASSETS,
             "Measure the week's acceptance priors from logged prompts and ingest the controller's live counters."),
)
"""Every asset job (the rollback is an op job: ``build_jobs``)."""


@dataclass(frozen=True)
class Jobs:
    """The code location's jobs, built with one set of default tags."""

    profile_and_publish: Any
    """``PROFILE_AND_PUBLISH``: profile, derive and publish one engine identity."""
    retune: Any
    """``RETUNE``: re-derive and publish one engine identity from its stored profile."""
    weekly_acceptance: Any
    """``WEEKLY_ACCEPTANCE``: the week's acceptance priors and live counters."""
    rollback: dg.JobDefinition
    """``ROLLBACK``: a deployment's published table back to its previous version."""

    def all(self) -> list[Any]:
        return [self.profile_and_publish, self.retune, self.weekly_acceptance, self.rollback]


def build_jobs(tags: Mapping[str, str], rollback_op: Callable[[], Any]) -> Jobs:
    """Every job with ``tags`` as its default run tags (``tags.manual_run_tags`` of the fleet); the
    rollback job runs ``rollback_op`` (``assets.publishing.rollback_published_table_op``)."""
    tags = dict(tags)
    built = {job.name: dg.define_asset_job(job.name, selection=dg.AssetSelection.assets(*job.assets), tags=tags,
                                           description=job.description) for job in ASSET_JOBS}

    @dg.job(name=ROLLBACK, tags=tags,
            description="Roll a deployment's published table back to the previous version (as a new version), with "
                        "the engine identity and prior it was published with. Queued by its tabletune/engine tag like "
                        "every run of the engine (give it the deployment's engine group in a fleet of several).")
    def rollback_published_table():
        rollback_op()

    return Jobs(built[PROFILE_AND_PUBLISH], built[RETUNE], built[WEEKLY_ACCEPTANCE], rollback_published_table)

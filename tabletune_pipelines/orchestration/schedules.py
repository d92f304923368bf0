"""Weekly acceptance re-measurement.

``weekly_acceptance_schedule`` fires every Monday at 03:00 UTC (cron ``0 3 * * 1``,
``execution_timezone="UTC"``) and measures the week that has just ended (Monday 00:00 UTC to the
next Monday 00:00 UTC, partition key = that Monday's date): ``acceptance_prior`` from each
deployment's logged prompts of the week and ``live_acceptance_counters`` from the controller's
export. One run per engine group (deployments sharing an engine never run concurrently; the run
carries that group's ``tabletune/engine`` tag and Kubernetes placement). When the run succeeds,
``retune_after_acceptance`` (sensors.py) re-derives and publishes the tables.
"""

import dagster as dg

from tabletune_pipelines.formats.fleet import FleetError
from tabletune_pipelines.orchestration.jobs import WEEKLY_ACCEPTANCE
from tabletune_pipelines.orchestration.partitions import last_complete_week
from tabletune_pipelines.orchestration.resources import FleetResource
from tabletune_pipelines.orchestration.tags import run_tags

WEEKLY_CRON = "0 3 * * 1"
WEEKLY_TIMEZONE = "UTC"


@dg.schedule(
    job_name=WEEKLY_ACCEPTANCE,
    cron_schedule=WEEKLY_CRON,
    execution_timezone=WEEKLY_TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Mondays 03:00 UTC: acceptance of the week that just ended, one run per engine group.",
)
def weekly_acceptance_schedule(context: dg.ScheduleEvaluationContext, fleet: FleetResource):
    week = last_complete_week(context.scheduled_execution_time)
    try:
        the_fleet = fleet.load()
    except FleetError as exc:
        return dg.SkipReason(f"fleet file invalid: {exc}")
    requests = []
    for group, deps in sorted(the_fleet.groups().items()):
        names = [d.name for d in deps]
        cfg = {"config": {"deployments": names}}
        requests.append(dg.RunRequest(
            run_key=f"acceptance:{week}:{group}",
            partition_key=week,
            tags=run_tags(deps[0]),
            run_config={"ops": {"acceptance_prior": cfg, "live_acceptance_counters": cfg}},
        ))
    return requests


defs = dg.Definitions(schedules=[weekly_acceptance_schedule])

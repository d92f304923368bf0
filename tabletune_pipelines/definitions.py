"""The Dagster code location: assets, checks, jobs, schedules, sensors, resources.

Loaded by ``workspace.yaml`` and ``dg`` (``[tool.dg.project] code_location_target_module``).
"""

from __future__ import annotations

import dagster as dg

from assets import ALL_ASSETS, rollback_published_table
from tabletune_pipelines.resources import default_resources
from tabletune_pipelines.schedules import weekly_acceptance_job, weekly_acceptance_schedule
from tabletune_pipelines.sensors import (
    engine_upgrade_sensor,
    profile_and_publish_job,
    retune_after_acceptance,
    retune_job,
)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    jobs=[profile_and_publish_job, retune_job, weekly_acceptance_job, rollback_published_table],
    schedules=[weekly_acceptance_schedule],
    sensors=[engine_upgrade_sensor, retune_after_acceptance],
    resources=default_resources(),
)

"""The Dagster code location: one ``Definitions`` merged from each part of the layer.

Loaded by ``workspace.yaml`` and ``dg`` (``[tool.dg.project] code_location_target_module``).
Assets and their checks are discovered in the top-level ``assets`` package; the jobs and sensors
are built by ``jobs.build_jobs`` and ``sensors.build_sensors``, the schedule is ``schedules.defs``;
resources come from the environment. Importing this module reads no file and no environment
variable: ``defs`` is built when Dagster loads the code location (``@dg.definitions``), and then
reads the fleet file once (the jobs' default run tags) and ``TABLETUNE_SENSOR_INTERVAL_S``.
"""

import dagster as dg

import assets
from tabletune_pipelines.orchestration import schedules
from tabletune_pipelines.orchestration.jobs import build_jobs
from tabletune_pipelines.orchestration.resources import default_resources
from tabletune_pipelines.orchestration.sensors import build_sensors, sensor_interval_s
from tabletune_pipelines.orchestration.tags import manual_run_tags, try_load_fleet

ASSETS = dg.load_assets_from_package_module(assets, include_specs=True)
"""Every asset of the code location (also what ``dg.materialize`` takes in ``embedded`` and the tests)."""
ASSET_CHECKS = dg.load_asset_checks_from_package_module(assets)
"""Asset checks defined apart from their asset (the gates run inside the assets, as ``check_specs``)."""


@dg.definitions
def defs() -> dg.Definitions:
    """The code location (module docstring): call it for the ``Definitions``."""
    jobs = build_jobs(manual_run_tags(try_load_fleet()))
    return dg.Definitions.merge(
        dg.Definitions(assets=ASSETS, asset_checks=ASSET_CHECKS),
        dg.Definitions(jobs=jobs.all(), sensors=build_sensors(jobs, sensor_interval_s())),
        schedules.defs,
        dg.Definitions(resources=default_resources()),
    )

"""The Dagster code location: one ``Definitions`` merged from each part of the layer.

Loaded by ``workspace.yaml`` and ``dg`` (``[tool.dg.project] code_location_target_module``).
Assets and their checks are discovered in the top-level ``assets`` package; jobs, schedules and
sensors each contribute their module's ``defs``; resources come from the environment. Importing
this module reads the fleet file once (the jobs' default run tags) and does nothing else.
"""

import dagster as dg

import assets
from tabletune_pipelines.orchestration import jobs, schedules, sensors
from tabletune_pipelines.orchestration.resources import default_resources

ASSETS = dg.load_assets_from_package_module(assets, include_specs=True)
"""Every asset of the code location (also what ``dg.materialize`` takes in ``embedded`` and the tests)."""
ASSET_CHECKS = dg.load_asset_checks_from_package_module(assets)
"""Asset checks defined apart from their asset (the gates run inside the assets, as ``check_specs``)."""

defs = dg.Definitions.merge(
    dg.Definitions(assets=ASSETS, asset_checks=ASSET_CHECKS),
    jobs.defs,
    schedules.defs,
    sensors.defs,
    dg.Definitions(resources=default_resources()),
)

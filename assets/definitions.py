"""The Dagster code location: one ``Definitions`` merged from each part of the layer.

Loaded from the checkout by ``workspace.yaml`` and ``dg`` (``[tool.dg.project]
code_location_target_module``), and by ``tabletune run`` through ``workspace.yaml``. Imports run
one way: this folder uses ``tabletune_pipelines.orchestration`` and the library, and nothing in the
package imports it. Assets and their checks are discovered in this ``assets`` folder; the jobs and
sensors are built by ``orchestration.jobs.build_jobs`` (with the rollback op of
``assets/publishing.py``) and ``orchestration.sensors.build_sensors``, the schedule is
``orchestration.schedules.defs``; resources come from the environment. Importing this module reads
no file and no environment variable: ``defs`` is built when Dagster loads the code location
(``@dg.definitions``), and then reads the fleet file once (the jobs' default run tags) and
``TABLETUNE_SENSOR_INTERVAL_S``.
"""

import importlib
import pkgutil
from collections.abc import Mapping

import dagster as dg

import assets
from assets.publishing import rollback_published_table_op
from tabletune_pipelines.orchestration import schedules
from tabletune_pipelines.orchestration.jobs import Jobs, build_jobs
from tabletune_pipelines.orchestration.resources import default_resources
from tabletune_pipelines.orchestration.sensors import build_sensors, sensor_interval_s
from tabletune_pipelines.orchestration.tags import manual_run_tags, try_load_fleet

ASSET_MODULES = [importlib.import_module(f"assets.{m.name}") for m in pkgutil.iter_modules(assets.__path__)
                 if m.name != "definitions"]
"""Every module of this folder but this one (Dagster may load this file by its path, as a module of
another name: its ``ASSETS`` must not be found twice)."""
ASSETS = dg.load_assets_from_modules(ASSET_MODULES, include_specs=True)
"""Every asset of the code location (also what ``dg.materialize`` takes in ``embedded`` and the tests)."""
ASSET_CHECKS = dg.load_asset_checks_from_modules(ASSET_MODULES)
"""Asset checks defined apart from their asset (the gates run inside the assets, as ``check_specs``)."""


def jobs(tags: Mapping[str, str]) -> Jobs:
    """Every job of the code location with ``tags`` as its default run tags, the rollback included."""
    return build_jobs(tags, rollback_published_table_op)


@dg.definitions
def defs() -> dg.Definitions:
    """The code location (module docstring): call it for the ``Definitions``."""
    built = jobs(manual_run_tags(try_load_fleet()))
    return dg.Definitions.merge(
        dg.Definitions(assets=ASSETS, asset_checks=ASSET_CHECKS),
        dg.Definitions(jobs=built.all(), sensors=build_sensors(built, sensor_interval_s())),
        schedules.defs,
        dg.Definitions(resources=default_resources()),
    )

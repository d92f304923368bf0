"""The Dagster code location, inside the package: one ``Definitions`` merged from the ``defs/`` folder
and the rest of the Dagster layer.

``workspace.yaml`` (``python_module``), ``dg`` (``[tool.dg.project]``), ``dagster definitions
validate -m tabletune_pipelines.definitions`` and ``tabletune run`` all load this module from the
installed package, so a wheel install loads it from any folder. Imports run one way: this module
and ``defs/`` use ``tabletune_pipelines.orchestration`` and the library, and nothing else in the
package imports them. The assets and their checks are the ``defs/`` folder's, loaded as
``dg.load_from_defs_folder`` loads a project's defs folder (a ``dg.ComponentTree`` over the
module); the jobs and sensors are built by ``orchestration.jobs.build_jobs`` (with the rollback op
of ``defs/publishing.py``) and ``orchestration.sensors.build_sensors``, the schedule is
``orchestration.schedules.defs``; resources come from the environment. Importing this module reads
no file and no environment variable: ``defs`` is built when Dagster loads the code location
(``@dg.definitions``), and then reads the fleet file once (the jobs' default run tags) and
``TABLETUNE_SENSOR_INTERVAL_S``.
"""

import warnings
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from tabletune_pipelines import defs as defs_folder
from tabletune_pipelines.defs.publishing import rollback_published_table_op
from tabletune_pipelines.orchestration import schedules
from tabletune_pipelines.orchestration.jobs import Jobs, build_jobs
from tabletune_pipelines.orchestration.resources import default_resources
from tabletune_pipelines.orchestration.sensors import build_sensors, sensor_interval_s
from tabletune_pipelines.orchestration.tags import manual_run_tags, try_load_fleet

PACKAGE = Path(__file__).resolve().parent
"""The project root the ``defs/`` folder is loaded under: the package folder, wherever it is installed."""


def load_defs_folder() -> dg.Definitions:
    """The assets and checks of ``defs/``: the component tree ``dg.load_from_defs_folder`` builds, made
    from the module itself. ``load_from_defs_folder`` first looks for the project's ``pyproject.toml``
    or ``dg.toml`` above the folder; an installed wheel carries neither, so the tree is made from
    the ``defs`` module and the package folder it is installed in. The tree's module loader is marked
    preview in Dagster 1.13; its warning is not shown on every load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.ComponentTree.from_module(defs_module=defs_folder, project_root=PACKAGE).build_defs()


FOLDER = load_defs_folder()
"""The ``defs/`` folder's definitions, loaded once at import (modules only: no file of the user's,
no environment variable)."""
ASSETS = list({id(a): a for a in FOLDER.assets or []}.values())
"""Every asset of the code location, each once (the tree of Dagster 1.13 lists an external asset's
spec twice); also what ``dg.materialize`` takes in ``embedded`` and the tests."""
ASSET_CHECKS = list({id(c): c for c in FOLDER.asset_checks or []}.values())
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

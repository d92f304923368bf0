"""The engine-identity partitions and the jobs, as the upgrade sensor and the main command use them:
one registration (``partitions.register_identity``), one profile run config
(``partitions.profile_run_config``), and every asset job built from its one description
(``jobs.ASSET_JOBS``)."""

from __future__ import annotations

import dagster as dg

from tabletune_pipelines.definitions import jobs as code_location_jobs
from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.orchestration.jobs import (
    ASSET_JOBS,
    PROFILE_AND_PUBLISH,
    PROFILE_AND_PUBLISH_ASSETS,
    RETUNE,
    WEEKLY_ACCEPTANCE,
    WEEKLY_ACCEPTANCE_ASSETS,
)
from tabletune_pipelines.orchestration.partitions import (
    ENGINE_IDENTITY_PARTITIONS_NAME,
    profile_run_config,
    register_identity,
)


def test_register_identity_adds_a_key_once():
    with dg.DagsterInstance.ephemeral() as instance:
        assert register_identity(instance, "cpu__a") is True
        assert register_identity(instance, "cpu__a") is False
        assert register_identity(instance, "cpu__b") is True
        assert instance.get_dynamic_partitions(ENGINE_IDENTITY_PARTITIONS_NAME) == ["cpu__a", "cpu__b"]


def test_profile_run_config_carries_the_deployment_and_the_whole_identity(one_fleet):
    dep = load_fleet(one_fleet).deployment("local-cpu")
    ident = identity_for(dep, "0.32.0+cpu")
    cfg = profile_run_config(dep.name, ident)
    assert list(cfg) == ["ops"] and list(cfg["ops"]) == ["step_time_profile"]
    inner = cfg["ops"]["step_time_profile"]["config"]
    assert inner["deployment"] == "local-cpu" and EngineIdentity.from_json(inner["identity_json"]) == ident


def test_every_asset_job_is_built_from_its_description():
    jobs = code_location_jobs({"tabletune/engine": "local-cpu"})
    by_name = {j.name: j for j in ASSET_JOBS}
    assert [j.name for j in ASSET_JOBS] == [PROFILE_AND_PUBLISH, RETUNE, WEEKLY_ACCEPTANCE]
    assert by_name[PROFILE_AND_PUBLISH].assets == PROFILE_AND_PUBLISH_ASSETS
    assert by_name[WEEKLY_ACCEPTANCE].assets == WEEKLY_ACCEPTANCE_ASSETS
    for job in (jobs.profile_and_publish, jobs.retune, jobs.weekly_acceptance):
        spec = by_name[job.name]
        assert job.description == spec.description and dict(job.tags) == {"tabletune/engine": "local-cpu"}
        assert job.selection == dg.AssetSelection.assets(*spec.assets)
    assert [j.name for j in jobs.all()] == [PROFILE_AND_PUBLISH, RETUNE, WEEKLY_ACCEPTANCE, "rollback_published_table"]

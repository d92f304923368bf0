"""The upgrade sensor, the weekly schedule, the retune sensor, jobs and instance config."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.orchestration.partitions import register_identity
from tabletune_pipelines.orchestration.resources import FleetResource
from tabletune_pipelines.orchestration.schedules import WEEKLY_CRON, weekly_acceptance_schedule
from tests.pipeline.helpers import (
    WEEK,
    ScriptedEngine,
    VersionServer,
    deployment_dict,
    make_resources,
    write_fleet,
    write_prompts,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def sensor(name: str) -> dg.SensorDefinition:
    """A sensor of the code location, as Dagster loads it."""
    from tabletune_pipelines.definitions import defs

    return defs().resolve_sensor_def(name)


def tick(instance, fleet_path, cursor=None, engine=None):
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"fleet": FleetResource(path=str(fleet_path)),
                                             "engine": engine or ScriptedEngine()})
    result = sensor("engine_upgrade_sensor")(ctx)
    if isinstance(result, dg.SkipReason):
        return [], [], cursor, result.skip_message
    if result.dynamic_partitions_requests:
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    added = [k for r in result.dynamic_partitions_requests for k in r.partition_keys]
    skip = result.skip_reason.skip_message if result.skip_reason else None
    return added, list(result.run_requests or []), result.cursor, skip


def test_remote_upgrade_adds_one_partition_and_one_run(home, instance):
    with VersionServer("0.32.0") as srv:
        fleet = write_fleet(home, [deployment_dict("gpu-a", endpoint=srv.url, gpu="H100",
                                                   k8s={"node_selector": {"nvidia.com/gpu.product": "H100"}})])
        # First sight: one partition, one run with placement tags and the identity in run config.
        added, runs, cursor, _ = tick(instance, fleet)
        dep = load_fleet(fleet).deployment("gpu-a")
        key_old = identity_for(dep, "0.32.0").key
        assert added == [key_old] and len(runs) == 1
        run = runs[0]
        assert run.partition_key == key_old and run.run_key == f"profile:{key_old}"
        assert run.tags["tabletune/engine"] == "gpu-a" and "dagster-k8s/config" in run.tags
        cfg = run.run_config["ops"]["step_time_profile"]["config"]
        assert cfg["deployment"] == "gpu-a" and EngineIdentity.from_json(cfg["identity_json"]).key == key_old

        # Unchanged: nothing.
        added, runs, cursor2, skip = tick(instance, fleet, cursor)
        assert added == [] and runs == [] and "no engine identity changed" in skip
        assert json.loads(cursor2) == json.loads(cursor)

        # vLLM upgraded behind the endpoint: exactly one new partition and one run request.
        srv.version = "0.33.1"
        added, runs, cursor3, _ = tick(instance, fleet, cursor2)
        key_new = identity_for(dep, "0.33.1").key
        assert added == [key_new] and [r.partition_key for r in runs] == [key_new]
        assert set(instance.get_dynamic_partitions("engine_identity")) == {key_old, key_new}

        # The next tick is quiet again; a downgrade back to a profiled identity requests nothing.
        assert tick(instance, fleet, cursor3)[:2] == ([], [])
        srv.version = "0.32.0"
        added, runs, _, skip = tick(instance, fleet, cursor3)
        assert added == [] and runs == [] and skip


def test_fleet_file_change_is_an_identity_change(home, instance):
    fleet = write_fleet(home, [deployment_dict("local-cpu")])
    added, runs, cursor, _ = tick(instance, fleet)
    assert len(added) == 1 and len(runs) == 1
    write_fleet(home, [deployment_dict("local-cpu", max_num_seqs=32)])
    added, runs, cursor, _ = tick(instance, fleet, cursor)
    assert len(added) == 1 and len(runs) == 1 and "n32" in added[0]


def test_unreachable_endpoint_is_reported_not_fatal(home, instance):
    port = free_port()
    fleet = write_fleet(home, [deployment_dict("down", endpoint=f"http://127.0.0.1:{port}"),
                               deployment_dict("local-cpu")])
    added, runs, cursor, skip = tick(instance, fleet)
    # The reachable deployment still gets its partition and run; the cursor does not move for "down".
    assert len(added) == 1 and len(runs) == 1 and "down" not in json.loads(cursor)["identities"]
    added, runs, cursor, skip = tick(instance, fleet, cursor)
    assert runs == [] and f"down: engine identity unknown (http://127.0.0.1:{port}/version did not answer" in skip


def test_invalid_fleet_file_is_a_skip_reason(home, instance):
    bad = home / "bad.yaml"
    bad.write_text("schema_version: 1\ndeployments:\n  - name: x\n    colour: red\n")
    _, runs, _, skip = tick(instance, bad)
    assert runs == [] and "unknown key 'colour'" in skip


def test_weekly_schedule_measures_last_complete_week_per_engine_group(home):
    assert WEEKLY_CRON == "0 3 * * 1" and weekly_acceptance_schedule.execution_timezone == "UTC"
    fleet = write_fleet(home, [deployment_dict("a"), deployment_dict("b"),
                               deployment_dict("c", engine_group="gpu-box-2")])
    # Fleet engine groups: a and b have no engine_group -> their own names; c -> gpu-box-2.
    monday = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc)
    from tabletune_pipelines.definitions import defs

    ctx = dg.build_schedule_context(scheduled_execution_time=monday, repository_def=defs().get_repository_def(),
                                    resources={"fleet": FleetResource(path=str(fleet))})
    reqs = list(weekly_acceptance_schedule.evaluate_tick(ctx).run_requests)
    assert {r.partition_key for r in reqs} == {"2026-11-16"}
    by_tag = {r.tags["tabletune/engine"]: r for r in reqs}
    assert set(by_tag) == {"a", "b", "gpu-box-2"}
    assert by_tag["gpu-box-2"].run_config["ops"]["acceptance_prior"]["config"]["deployments"] == ["c"]
    assert by_tag["a"].run_key == "acceptance:2026-11-16:a"


def test_definitions_load_and_instance_config(home, tmp_path, monkeypatch):
    from pathlib import Path

    from tabletune_pipelines.definitions import defs

    repo = Path(__file__).resolve().parents[2]
    jobs = {j.name for j in defs().get_repository_def().get_all_jobs()}
    assert {"profile_and_publish", "retune_and_publish", "weekly_acceptance", "rollback_published_table"} <= jobs
    graph = defs().resolve_asset_graph()
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert parents["published_table"] == {"draft_length_table"}
    assert parents["draft_length_table"] == {"step_time_profile", "acceptance_prior", "live_acceptance_counters"}
    assert parents["acceptance_prior"] == {"logged_prompts"}
    # dagster.yaml: queued runs, one run per engine tag value, SQLite under DAGSTER_HOME, no telemetry.
    dh = tmp_path / "dh"
    dh.mkdir()
    (dh / "dagster.yaml").write_text((repo / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(dh))
    with dg.DagsterInstance.get() as inst:
        cfg = inst.run_coordinator.get_run_queue_config()
        assert cfg.tag_concurrency_limits == [{"key": "tabletune/engine",
                                               "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]
        assert type(inst.run_storage).__name__ == "SqliteRunStorage"
        assert not inst.telemetry_enabled


CHECKOUT = str(Path(__file__).resolve().parents[2])
"""The checkout, on the subprocesses' PYTHONPATH: the package under test (an installed copy may be another checkout's)."""

IMPORT_DEFINITIONS = """
import os, sys
import tabletune_pipelines.formats.fleet as fleet
calls = []
real = fleet.load_fleet
fleet.load_fleet = lambda *a, **kw: calls.append(a) or real(*a, **kw)
reads = []
environ_get = os.environ.get
os.environ.get = lambda key, *d: reads.append(key) or environ_get(key, *d)
from tabletune_pipelines.definitions import defs
os.environ.get = environ_get
at_import = (len(calls), sorted(k for k in reads if k.startswith("TABLETUNE")))
assert defs().resolve_asset_graph().get_all_asset_keys()
print(at_import[0], len(calls), ",".join(at_import[1]) or "-")
"""


def test_importing_the_definitions_reads_nothing_and_loading_them_reads_the_fleet_once(tmp_path):
    home = tmp_path / "not_created"
    env = {"PATH": "/usr/bin:/bin", "TABLETUNE_HOME": str(home), "HOME": str(tmp_path), "PYTHONPATH": CHECKOUT}
    out = subprocess.run([sys.executable, "-c", IMPORT_DEFINITIONS], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.split()
    assert out[-3:] == ["0", "1", "-"]  # import: no fleet read, no TABLETUNE_* variable; loading: one read
    assert list(tmp_path.iterdir()) == []  # no TABLETUNE_HOME, no store file, nothing under HOME or the cwd


LOAD_WITHOUT_FLEET = """
from tabletune_pipelines.definitions import defs
d = defs()
print(d.resolve_job_def("rollback_published_table").tags["tabletune/engine"],
      d.resolve_sensor_def("engine_upgrade_sensor").minimum_interval_seconds)
"""


def test_the_definitions_load_with_the_fleet_file_missing(tmp_path):
    """``TABLETUNE_FLEET`` naming a file that is not there: the definitions import and load (the jobs'
    default engine tag is "manual"; runs report the missing file); a bad sensor interval fails the
    load with its message, never the import."""
    env = {"PATH": "/usr/bin:/bin", "TABLETUNE_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
           "TABLETUNE_FLEET": str(tmp_path / "missing" / "fleet.yaml"), "PYTHONPATH": CHECKOUT}
    out = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_FLEET], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["manual", "300"]
    env["TABLETUNE_SENSOR_INTERVAL_S"] = "soon"
    imported = subprocess.run([sys.executable, "-c", "import tabletune_pipelines.definitions"],
                              env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert imported.returncode == 0, imported.stderr[-3000:]
    loaded = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_FLEET], env=env, capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert loaded.returncode != 0 and "TABLETUNE_SENSOR_INTERVAL_S = 'soon' must be a whole number" in loaded.stderr


def test_retune_after_weekly_acceptance_requests_one_run_per_running_identity(home, instance):
    from tabletune_pipelines.definitions import ASSETS

    fleet = write_fleet(home, [deployment_dict("a"), deployment_dict("b")])  # same engine identity
    write_prompts(load_fleet(fleet).deployment("a").prompts_file(WEEK))
    engine = ScriptedEngine()
    key = identity_for(load_fleet(fleet).deployment("a"), engine.vllm_version).key
    register_identity(instance, key)
    res = dg.materialize(ASSETS, selection=["acceptance_prior"], partition_key=WEEK, instance=instance,
                         resources=make_resources(home, fleet, engine=engine))
    (success,) = instance.all_logs(res.run_id, of_type=dg.DagsterEventType.RUN_SUCCESS)
    ctx = dg.build_run_status_sensor_context(sensor_name="retune_after_acceptance", dagster_instance=instance,
                                             dagster_run=res.dagster_run, dagster_event=success.dagster_event,
                                             resources={"fleet": FleetResource(path=str(fleet)), "engine": engine})
    reqs = sensor("retune_after_acceptance")(ctx)
    assert [r.partition_key for r in reqs] == [key]

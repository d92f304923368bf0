"""Engine identities of publications, rollbacks and live counters through Dagster (in process,
scripted engine): the rollback job re-publishes the old version with its engine identity and prior
and carries the engine tag; the live counters of another engine in the deployment's file are left
out of its live prior and reported."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import dagster as dg
import duckdb
import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import CounterWindow, window_line
from tabletune_pipelines.definitions import ASSETS, defs, jobs
from tabletune_pipelines.orchestration.partitions import register_identity
from tabletune_pipelines.orchestration.tags import ENGINE_TAG, manual_run_tags, try_load_fleet
from tabletune_pipelines.formats.published import read_published_table
from tests.pipeline.helpers import WEEK, make_resources, write_prompts

IDENTITY_ASSETS = ["step_time_profile", "draft_length_table", "published_table"]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def sql(home, query, params=None):
    with duckdb.connect(str(home / "tabletune_store.duckdb"), read_only=True) as conn:
        return conn.execute(query, params or []).fetchall()


def test_the_rollback_job_carries_the_engine_tag():
    rollback = defs().resolve_job_def("rollback_published_table")
    assert rollback.tags[ENGINE_TAG] == manual_run_tags(try_load_fleet())[ENGINE_TAG]


def test_rollback_republishes_the_old_version_with_its_identity_and_prior(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    dep = load_fleet(one_fleet).deployment("local-cpu")
    key = identity_for(dep, "0.32.0+cpu").key
    write_prompts(dep.prompts_file(WEEK), 24)
    assert dg.materialize(ASSETS, selection=["acceptance_prior"], resources=resources, instance=instance,
                          partition_key=WEEK).success
    register_identity(instance, key)
    assert dg.materialize(ASSETS, selection=IDENTITY_ASSETS, resources=resources, instance=instance,
                          partition_key=key).success
    v1 = read_published_table(dep.published_table)
    assert v1["identity"]["model"] == "tiny:small" and v1["prior"]["rates"]
    lenient = make_resources(home, one_fleet, max_predicted_loss=0.05)
    assert dg.materialize(ASSETS, selection=IDENTITY_ASSETS, resources=lenient, instance=instance, partition_key=key,
                          run_config={"ops": {"published_table": {"config": {"force": True}},
                                              "draft_length_table": {"config": {"allowed_ks": [1, 3]}}}}).success
    assert read_published_table(dep.published_table)["version"] == 2
    rb = jobs({}).rollback.execute_in_process(
        run_config={"ops": {"rollback_published_table_op": {"config": {"deployment": "local-cpu"}}}},
        resources={k: resources[k] for k in ("duckdb", "fleet", "engine")}, instance=instance,
        tags={ENGINE_TAG: dep.group})
    assert rb.success
    v3 = read_published_table(dep.published_table)
    assert v3["version"] == 3 and v3["table"]["ranges"] == v1["table"]["ranges"]
    assert v3["identity"] == v1["identity"] and v3["prior"] == v1["prior"]  # before: neither was there
    assert json.loads(dep.speculative_config_path.read_text())["num_speculative_tokens_per_batch_size"] == \
        v1["table"]["ranges"]
    rows = sql(home, "SELECT version, identity_json IS NOT NULL, prior_json IS NOT NULL FROM publications "
                     "ORDER BY version")
    assert rows == [(1, True, True), (2, True, True), (3, True, True)]
    (mat,) = [e for e in rb.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    md = mat.event_specific_data.materialization.metadata
    assert md["identity_key"].value == key and md["prior_id"].value == v1["prior"]["prior_id"]


def test_counters_of_another_engine_in_the_file_are_left_out_and_reported(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    dep = load_fleet(one_fleet).deployment("local-cpu")
    now, before = identity_for(dep, "0.32.0+cpu").key, identity_for(dep, "0.31.0+cpu").key  # an upgrade mid-week
    dep.live_counters.parent.mkdir(parents=True, exist_ok=True)

    def line(hour, key, drafted, accepted):
        return window_line(CounterWindow(
            deployment="local-cpu", window_start=datetime(2026, 11, 17, hour, tzinfo=timezone.utc),
            window_end=datetime(2026, 11, 17, hour, 5, tzinfo=timezone.utc), num_drafts=drafted[0],
            drafted_per_pos=drafted, accepted_per_pos=accepted, identity_key=key, source=f"{key[:8]}:1:1", seq=hour))

    dep.live_counters.write_text("\n".join([
        line(1, before, [4000, 4000, 4000], [0, 0, 0]),
        line(2, before, [4000, 4000, 4000], [0, 0, 0]),
        line(3, now, [1000, 1000, 500], [900, 750, 200]),
    ]) + "\n")
    res = dg.materialize(ASSETS, selection=["live_acceptance_counters"], resources=resources, instance=instance,
                         partition_key=WEEK)
    assert res.success
    (row,) = sql(home, "SELECT num_drafts, prior_json, identity_key FROM acceptance_priors WHERE source = 'live'")
    prior = json.loads(row[1])
    assert row[0] == 1000 and prior["drafted_per_pos"] == [1000, 1000, 500] and row[2] == now
    assert prior["rates"] == pytest.approx([0.9, 0.75, 0.4])  # the 8000 drafts of 0.31 would have made a_1 0.1
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert md["windows_left_out"].value == 2 and md["windows_left_out_by_engine"].value == {"local-cpu": {before: 2}}
    assert md["live_priors"].value.splitlines()[-1].endswith("| 2 |")
    warnings = [e.user_message for e in instance.all_logs(res.run_id) if e.level == logging.WARNING]
    assert [m for m in warnings if "left out" in m] == \
        [f"local-cpu: 2 window(s) of other engines left out (only {now} is counted): {before} (2)"]

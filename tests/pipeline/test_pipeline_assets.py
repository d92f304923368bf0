"""Assets in process (dg.materialize, ephemeral instance) with a scripted engine: DuckDB contents,
metadata, checks, and every bad input of the issue. The real CPU engine runs in
test_pipeline_real_engine.py."""

from __future__ import annotations

import base64
import json

import dagster as dg
import duckdb
import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import CounterWindow, window_line
from tabletune_pipelines.definitions import ASSETS, jobs
from tabletune_pipelines.orchestration.jobs import PROFILE_AND_PUBLISH_ASSETS
from tabletune_pipelines.orchestration.partitions import register_identity
from tabletune_pipelines.formats.published import read_published_table
from tests.pipeline.helpers import (
    RATES,
    WEEK,
    ScriptedEngine,
    deployment_dict,
    make_resources,
    scripted_ms,
    write_fleet,
    write_prompts,
)

IDENTITY_ASSETS = list(PROFILE_AND_PUBLISH_ASSETS)


def identity_key(fleet_path, name="local-cpu", version="0.32.0+cpu"):
    return identity_for(load_fleet(fleet_path).deployment(name), version).key


def materialize(selection, resources, instance, partition_key, run_config=None, raise_on_error=True):
    return dg.materialize(ASSETS, selection=selection, resources=resources, instance=instance,
                          partition_key=partition_key, run_config=run_config, raise_on_error=raise_on_error)


def sql(home, query, params=None):
    with duckdb.connect(str(home / "tabletune_store.duckdb"), read_only=True) as conn:
        return conn.execute(query, params or []).fetchall()


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def run_week(home, fleet_path, resources, instance, n_prompts=24, raise_on_error=True):
    dep = load_fleet(fleet_path).deployment("local-cpu")
    write_prompts(dep.prompts_file(WEEK), n_prompts)
    return materialize(["acceptance_prior"], resources, instance, WEEK, raise_on_error=raise_on_error)


def run_identity(resources, instance, key, run_config=None, raise_on_error=True):
    register_identity(instance, key)
    return materialize(IDENTITY_ASSETS, resources, instance, key, run_config, raise_on_error)


def test_full_chain_writes_duckdb_metadata_and_publishes(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    key = identity_key(one_fleet)
    res = run_week(home, one_fleet, resources, instance)
    assert res.success
    rows = sql(home, "SELECT deployment, week, source, rates, identity_key FROM acceptance_priors")
    assert rows == [("local-cpu", WEEK, "measured", list(RATES), key)]
    (check,) = res.get_asset_check_evaluations()
    assert check.check_name == "prior_sane" and check.passed

    res = run_identity(resources, instance, key)
    assert res.success
    cells = sql(home, "SELECT count(*), count(DISTINCT k), count(*) FILTER (WHERE k IS NULL) FROM step_time_cells "
                      "WHERE identity_key = ?", [key])[0]
    assert cells == (6 * 5, 4, 6)  # 6 batch sizes × (k 0..3 + no-spec)
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    assert set(checks) == {"profile_complete", "valid_for_vllm", "predicted_loss_under_threshold",
                           "table_supported_by_evidence", "engine_dependence_trap", "k0_costs_vs_no_spec",
                           "cuda_graph_headroom", "served_goodput_verified"}
    assert checks["cuda_graph_headroom"].passed  # a CPU identity has no CUDA graphs
    for name in ("profile_complete", "valid_for_vllm", "predicted_loss_under_threshold", "table_supported_by_evidence",
                 "served_goodput_verified"):
        assert checks[name].passed, checks[name].description
    # No launch with K = k was profiled: the trap check says so instead of guessing.
    assert checks["engine_dependence_trap"].passed
    assert "NOT MEASURED" in checks["engine_dependence_trap"].description

    mats = {m.asset_key.to_user_string(): m for m in res.get_asset_materialization_events()}
    table_md = mats["draft_length_table"].materialization.metadata
    assert table_md["identity_key"].value == key
    assert "| batch sizes | k |" in table_md["table"].value
    png = table_md["goodput_plot"].value
    assert png.startswith("![goodput vs batch size](data:image/png;base64,")
    assert base64.b64decode(png.split(",", 1)[1].rstrip(")"))[:8] == b"\x89PNG\r\n\x1a\n"
    assert (home / "plots").glob("*.png")
    assert 0.0 <= table_md["predicted_worst_loss"].value < 0.03
    assert table_md["prior_week"].value == WEEK

    ranges = json.loads(sql(home, "SELECT ranges_json FROM draft_length_tables WHERE identity_key = ?", [key])[0][0])
    # The scripted medium-model step times cross over: k = 3 at small B, shorter k at B = 16.
    assert ranges[0][0] == 1 and ranges[-1][1] == 16 and ranges[0][2] == 3 and ranges[-1][2] < 3

    dep = load_fleet(one_fleet).deployment("local-cpu")
    doc = read_published_table(dep.published_table)
    assert doc["version"] == 1 and doc["table"]["ranges"] == ranges
    # The served verification the table passed (scripted windows, the real verdict) and its plot beside it.
    sv = doc["served_verification"]
    assert sv["passed"] and sv["candidate"] == ranges and sv["loads"] == [1, 8, 16]
    assert (dep.published_table.parent / sv["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    spec = json.loads(dep.speculative_config_path.read_text())
    assert spec["num_speculative_tokens_per_batch_size"] == ranges and spec["num_speculative_tokens"] == 3
    assert spec["method"] == "draft_model" and spec["model"] == "/models/tiny-small-draft"
    assert sql(home, "SELECT deployment, version FROM publications") == [("local-cpu", 1)]
    pub_md = mats["published_table"].materialization.metadata
    assert pub_md["published"].value == [{"deployment": "local-cpu", "version": 1, "path": str(dep.published_table)}]

    # Re-running with the same table publishes no new version; force does; rollback goes back.
    assert run_identity(resources, instance, key).success
    assert sql(home, "SELECT count(*) FROM publications")[0][0] == 1
    lenient = make_resources(home, one_fleet, max_predicted_loss=0.05)
    res = run_identity(lenient, instance, key, {"ops": {"published_table": {"config": {"force": True}},
                                                          "draft_length_table": {"config": {"allowed_ks": [1, 3]}}}})
    assert res.success
    assert read_published_table(dep.published_table)["version"] == 2
    rb = jobs({}).rollback.execute_in_process(
        run_config={"ops": {"rollback_published_table_op": {"config": {"deployment": "local-cpu"}}}},
        resources={k: resources[k] for k in ("duckdb", "fleet", "engine")}, instance=instance)
    assert rb.success
    doc = read_published_table(dep.published_table)
    assert doc["version"] == 3 and doc["table"]["ranges"] == ranges
    assert sql(home, "SELECT note FROM publications WHERE version = 3")[0][0] == "rollback of v2 to v1"


def test_week_without_prompts_fails_clearly(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    res = materialize(["acceptance_prior"], resources, instance, WEEK, raise_on_error=False)
    assert not res.success
    (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    msg = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
    assert f"no logged prompts for the week of {WEEK}" in msg and "does not exist" in msg
    assert sql(home, "SELECT count(*) FROM acceptance_priors")[0][0] == 0


def test_week_with_prompts_for_one_of_two_deployments(home, instance):
    fleet = write_fleet(home, [deployment_dict("a"), deployment_dict("b", engine_group="other")])
    resources = make_resources(home, fleet)
    write_prompts(load_fleet(fleet).deployment("a").prompts_file(WEEK))
    res = materialize(["acceptance_prior"], resources, instance, WEEK)
    assert res.success
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert any("b: no logged prompts" in s for s in md["deployments_without_prompts"].value)
    assert sql(home, "SELECT deployment FROM acceptance_priors") == [("a",)]


def test_engine_failure_in_a_partition_keeps_other_partitions(home, instance):
    fleet = write_fleet(home, [deployment_dict("local-cpu")])
    ok = make_resources(home, fleet)
    assert run_week(home, fleet, ok, instance).success
    key_a = identity_key(fleet)
    assert run_identity(ok, instance, key_a).success
    pub = load_fleet(fleet).deployment("local-cpu").published_table
    before_pub = pub.read_text()
    cells_a = sql(home, "SELECT k, batch_size, median_ms FROM step_time_cells WHERE identity_key = ? ORDER BY ALL",
                  [key_a])

    # The deployment is upgraded; profiling its new engine crashes after 5 cells.
    crashing = make_resources(home, fleet, engine=ScriptedEngine(vllm_version="0.33.0+cpu", fail_after_cells=5))
    key_b = identity_key(fleet, version="0.33.0+cpu")
    res = run_identity(crashing, instance, key_b, raise_on_error=False)
    assert not res.success
    (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "step_time_profile"
    text = failure.step_failure_data.user_failure_data.description
    assert f"profiling engine identity {key_b} failed" in text and "scripted crash" in text
    assert "re-running the partition resumes" in text
    started = {e.step_key for e in res.all_events if e.event_type_value == "STEP_START"}
    assert started == {"step_time_profile"}  # downstream steps never ran
    # Partial cells of B are kept for resuming; partition A and the published table are untouched.
    assert sql(home, "SELECT count(*) FROM step_time_cells WHERE identity_key = ?", [key_b])[0][0] == 5
    assert sql(home, "SELECT k, batch_size, median_ms FROM step_time_cells WHERE identity_key = ? ORDER BY ALL",
               [key_a]) == cells_a
    assert pub.read_text() == before_pub

    # Resume: the next attempt measures only the missing cells and then publishes v2.
    resumed = make_resources(home, fleet, engine=ScriptedEngine(vllm_version="0.33.0+cpu"))
    res = run_identity(resumed, instance, key_b)
    assert res.success
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert md["cells_measured_this_run"].value == 30 - 5
    assert read_published_table(pub)["table"]["identity_key"] == key_b


def test_blocked_check_prevents_publishing(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    key = identity_key(one_fleet)
    assert run_week(home, one_fleet, resources, instance).success
    assert run_identity(resources, instance, key).success
    dep = load_fleet(one_fleet).deployment("local-cpu")
    before = dep.published_table.read_text()
    before_spec = dep.speculative_config_path.read_text()

    # Only k = 0 allowed: the predicted loss vs the best fixed k is huge -> blocking check fails.
    res = run_identity(resources, instance, key, {"ops": {"draft_length_table": {"config": {"allowed_ks": [0]}}}},
                       raise_on_error=False)
    assert not res.success
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    assert not checks["predicted_loss_under_threshold"].passed
    assert "predicted worst loss" in checks["predicted_loss_under_threshold"].description
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert failure.step_key == "draft_length_table"
    assert "blocking asset check" in failure.step_failure_data.error.message
    assert "published_table" not in {e.step_key for e in res.all_events if e.event_type_value == "STEP_START"}
    assert dep.published_table.read_text() == before and dep.speculative_config_path.read_text() == before_spec

    # A later publish-only run also refuses the blocked table (the gate runs again before writing).
    res = materialize(["published_table"], resources, instance, key, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "refusing to publish" in failure.step_failure_data.user_failure_data.description
    assert dep.published_table.read_text() == before
    assert sql(home, "SELECT count(*) FROM publications")[0][0] == 1


def test_insane_prior_is_blocked_and_skipped(home, one_fleet, instance):
    resources = make_resources(home, one_fleet, min_prior_drafts=10_000)
    res = run_week(home, one_fleet, resources, instance, n_prompts=3, raise_on_error=False)  # 300 < 10 000 drafts
    assert not res.success
    (check,) = res.get_asset_check_evaluations()
    assert not check.passed and "rests on 300 drafts" in check.description
    key = identity_key(one_fleet)
    res = run_identity(resources, instance, key, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert failure.step_key == "draft_length_table"
    assert "no sane acceptance prior" in failure.step_failure_data.user_failure_data.description


def test_k0_warning_and_trap_with_fixed_k_cells(home, one_fleet, instance):
    """Warn checks with figures: k = 0 much slower than no-spec, and fixed-K launches faster than the table."""
    from tabletune_pipelines.formats.documents import StepTimeCell
    from tabletune_pipelines.store import TableTuneStore

    # Low acceptance: the table runs k = 0 at large B, where k = 0 costs 12% more than no speculation.
    resources = make_resources(home, one_fleet, engine=ScriptedEngine(rates=[0.2, 0.05, 0.01]))
    assert run_week(home, one_fleet, resources, instance).success
    key = identity_key(one_fleet)
    assert run_identity(resources, instance, key).success
    store = TableTuneStore(home / "tabletune_store.duckdb")
    ident = store.identity(key)
    # Fixed launches with K = k run 30% faster than the same k under K = 3 (the engine-dependence trap).
    cells = [StepTimeCell(k=k, batch_size=b, median_ms=scripted_ms(k, b) * 0.7, repetitions_ms=(1.0,), launch_k=k)
             for k in (1, 2, 3) for b in (1, 4, 16)]
    store.write_profile_cells(ident, cells, mode="fixed_k")
    res = materialize(["draft_length_table"], resources, instance, key)
    assert res.success  # WARN checks never block
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    trap = checks["engine_dependence_trap"]
    assert not trap.passed and trap.severity == dg.AssetCheckSeverity.WARN
    assert "slower at B =" in trap.description and "K = k" in trap.description
    k0 = checks["k0_costs_vs_no_spec"]
    assert not k0.passed and k0.severity == dg.AssetCheckSeverity.WARN
    assert "no speculation beats the table" in k0.description and "the table runs k = 0" in k0.description
    assert "consider turning speculation off above B =" in k0.description


def test_live_counters_feed_the_next_prior(home, one_fleet, instance):
    from datetime import datetime, timezone

    resources = make_resources(home, one_fleet)
    assert run_week(home, one_fleet, resources, instance).success
    dep = load_fleet(one_fleet).deployment("local-cpu")
    dep.live_counters.parent.mkdir(parents=True, exist_ok=True)
    t0 = datetime(2026, 11, 17, 10, tzinfo=timezone.utc)
    t1 = datetime(2026, 11, 17, 10, 5, tzinfo=timezone.utc)
    key = identity_key(one_fleet)  # the engine the deployment runs: the controller names it in every window
    lines = [window_line(CounterWindow(
                 deployment="local-cpu", window_start=t0, window_end=t1, num_drafts=4000,
                 drafted_per_pos=[4000, 4000, 2000], accepted_per_pos=[3600, 3000, 1000], identity_key=key)),
             window_line(CounterWindow(
                 deployment="local-cpu", window_start=datetime(2026, 11, 30, tzinfo=timezone.utc),
                 window_end=datetime(2026, 11, 30, 0, 5, tzinfo=timezone.utc), num_drafts=10,
                 drafted_per_pos=[10, 10, 10], accepted_per_pos=[0, 0, 0],
                 identity_key=key))]  # another week: ignored
    dep.live_counters.write_text("\n".join(lines) + '\n{"schema": "tabletune.live_co')  # torn last line
    res = materialize(["live_acceptance_counters"], resources, instance, WEEK)
    assert res.success
    (row,) = sql(home, "SELECT rates, num_drafts, week FROM acceptance_priors WHERE source = 'live'")
    # â_i = (2000·a_i + accepted_i) / (2000 + drafted_i): (1400+3600)/6000, (1000+3000)/6000, (600+1000)/4000
    assert row[0] == pytest.approx([5000 / 6000, 4000 / 6000, 1600 / 4000])
    assert row[1:] == (4000, WEEK)
    # The table of this week now starts from the live prior.
    res = run_identity(resources, instance, key)
    md = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    assert md["draft_length_table"]["prior_source"].value == "live"


def test_bad_live_counters_line_is_named(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    dep = load_fleet(one_fleet).deployment("local-cpu")
    dep.live_counters.parent.mkdir(parents=True, exist_ok=True)
    dep.live_counters.write_text(json.dumps({"schema": "tabletune.live_counters", "schema_version": 1,
                                             "deployment": "local-cpu", "window_start": "2026-11-17T00:00:00Z",
                                             "window_end": "2026-11-17T00:05:00Z", "num_drafts": 5,
                                             "drafted_per_pos": [5, 5], "accepted_per_pos": [6, 1]}) + "\n")
    res = materialize(["live_acceptance_counters"], resources, instance, WEEK, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert f"{dep.live_counters}:1: position 1 accepted 6 > drafted 5" in \
        failure.step_failure_data.user_failure_data.description

"""orchestration/metadata.py: each library result becomes the metadata and checks the UI shows, with
the keys users know (the ones the assets wrote before they were thinned), the keys that
``draft_length_table`` and ``published_table`` share written once, and ``PipelineFailure`` as the
step's ``dg.Failure``. Library results from a scripted engine; no materialization."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import dagster as dg
import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import NotFoundError, PipelineFailure
from tabletune_pipelines.orchestration.metadata import (
    describe_acceptance,
    describe_live_priors,
    describe_profile,
    describe_publication,
    describe_rollback,
    describe_table,
    failures,
    served_check,
    table_metadata,
)
from tabletune_pipelines.formats.published import load_published
from tabletune_pipelines.tuning.publishing import publish_table, rollback_table
from tabletune_pipelines.tuning.run_report import measured_lines
from tabletune_pipelines.tuning.build import build_table
from tabletune_pipelines.tuning.feedback import ingest_live_counters
from tabletune_pipelines.tuning.measure import measure_week, profile_identity
from tests.tuning.runs import SETTINGS, WEEK, FakeEngine, Log, fleet, store, write_prompts

SHARED = {"table", "table_ranges", "table_json", "table_id", "identity_key", "prior_id", "predicted_worst_loss",
          "predicted_worst_loss_lcb", "predicted_worst_loss_ucb", "predicted_loss", "ranges", "boundaries",
          "k_within_noise", "cells_remeasured"}
TABLE_KEYS = SHARED | {
    "one_batch_size_ranges", "search_policy", "wall_timed_cells", "has_error_estimates",
    "accepted_work_fit", "warnings", "identity", "prior_week", "prior_source", "acceptance_rates",
    "accepted_work_corrected", "dagster/row_count", "profile_cells", "speculative_config", "goodput_plot",
    "goodput_plot_path"}
PUBLISHED_KEYS = SHARED | {
    "publications", "published", "unchanged", "dagster/row_count", "speculative_config", "rollback",
    "skipped_deployments", "served_verification", "served_goodput", "served_goodput_plot", "served_goodput_plot_path",
    "what_was_measured"}


@pytest.fixture
def world(home):
    """A fleet, a store, a scripted engine, one week's prior and the identity's profile."""
    f, s, engine = fleet(home), store(home), FakeEngine()
    write_prompts(f.deployments[0].prompts_file(WEEK))
    key = identity_for(f.deployments[0], engine.vllm_version).key
    return SimpleNamespace(fleet=f, store=s, engine=engine, key=key,
                           week=measure_week(s, f, WEEK, engine, min_drafts=200, log=Log()),
                           profile=profile_identity(s, f, key, engine, log=Log()))


def test_profile_and_acceptance_keep_their_keys_and_checks(world):
    md = describe_profile(world.profile)
    assert set(md.metadata) == {"identity", "identity_key", "deployment", "dagster/row_count",
                                "cells_measured_this_run", "step_ms", "median_spread", "max_spread",
                                "cells_remeasured", "wall_timed_cells", "mode"}
    assert md.metadata["identity_key"] == world.key and md.metadata["cells_measured_this_run"] == 30
    assert [c.check_name for c in md.check_results] == ["profile_complete"]
    acc = describe_acceptance(world.week)
    assert set(acc.metadata) == {"priors", "dagster/row_count", "week", "identities", "deployments_without_prompts",
                                 "samples"}
    (check,) = acc.check_results
    assert check.check_name == "prior_sane" and check.passed and check.description == "1 prior(s) sane"
    assert set(acc.metadata["samples"].value) == {"local-cpu"}


def test_live_priors_keep_their_keys(world, home):
    start = datetime(2026, 11, 16, tzinfo=timezone.utc)
    live = ingest_live_counters(world.store, world.fleet, WEEK, (start, start + timedelta(days=7)), world.engine,
                                prior_weight=2000, log=Log())
    md = describe_live_priors(live)
    assert set(md.metadata) == {"live_priors", "dagster/row_count", "week", "notes", "windows_left_out",
                                "windows_left_out_by_engine"}
    assert md.metadata["dagster/row_count"] == 0 and "does not exist yet" in md.metadata["notes"].value[0]
    assert md.metadata["live_priors"].value.startswith("| deployment | windows |")


def test_table_and_publication_keep_their_keys_and_share_one_description_of_the_table(world, home):
    built = build_table(world.store, world.key, SETTINGS, log=Log())
    table_md = describe_table(built)
    assert set(table_md.metadata) == TABLE_KEYS
    assert [c.check_name for c in table_md.check_results] == [g.name for g in built.gates]
    pub = publish_table(world.store, world.fleet, world.key, world.engine,
                        max_predicted_loss=SETTINGS.gates().max_predicted_loss, log=Log())
    pub_md = describe_publication(pub)
    assert set(pub_md.metadata) == PUBLISHED_KEYS
    # what was measured: the run report's lines (run_report.measured_lines, as run and show print them)
    dep = world.fleet.deployment(pub.targets[0].deployment)
    report = measured_lines(load_published(dep.published_table), dep, world.store)
    assert report[0].startswith("  table       B 1") and f"  file        {dep.published_table}" in report
    assert pub_md.metadata["what_was_measured"].value == "```\n" + "\n".join(report) + "\n```"
    assert set(table_metadata(built.table)) == SHARED
    for k in SHARED:  # the same table, described once
        assert table_md.metadata[k] == pub_md.metadata[k], k
    # The table on one line each: as a person reads it and as vLLM's JSON (not one number per line).
    ranges = [list(r) for r in built.table.ranges]
    assert isinstance(table_md.metadata["table_json"], dg.TextMetadataValue)
    assert json.loads(table_md.metadata["table_json"].value) == ranges
    assert "\n" not in table_md.metadata["table_json"].value
    line = table_md.metadata["table_ranges"].value
    assert "\n" not in line and line.startswith(f"B {ranges[0][0]}")
    assert line.count("k=") == len(ranges) and line.endswith(f"k={ranges[-1][2]}")
    # The goodput plot is on the table asset as an inline image the UI renders, and as a file.
    assert table_md.metadata["goodput_plot"].value.startswith("![goodput vs batch size](data:image/png;base64,")
    assert table_md.metadata["goodput_plot_path"].value.endswith(".png")
    assert pub_md.metadata["published"].value == [
        {"deployment": "local-cpu", "version": 1, "path": str(world.fleet.deployments[0].published_table)}]
    (check,) = pub_md.check_results
    assert check.check_name == "served_goodput_verified" and check.passed
    assert check.metadata["served_goodput_plot"].value.startswith("![served goodput vs load](data:image/png;base64,")
    assert (home / "plots").is_dir()

    again = describe_publication(publish_table(world.store, world.fleet, world.key, world.engine,
                                               max_predicted_loss=SETTINGS.gates().max_predicted_loss, log=Log()))
    assert again.metadata["unchanged"].value == ["local-cpu"] and again.metadata["dagster/row_count"] == 0
    assert "served_goodput_plot" not in again.metadata and "(unchanged)" in again.metadata["publications"].value


def test_a_refused_publication_still_describes_its_check(world, home):
    build_table(world.store, world.key, SETTINGS, log=Log())
    pub = publish_table(world.store, world.fleet, world.key, FakeEngine(verification_crashes=True),
                        max_predicted_loss=SETTINGS.gates().max_predicted_loss, log=Log())
    check = served_check(pub)
    assert pub.refusal and not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "could not run" in check.description and "served_goodput_plot" not in check.metadata


def test_a_rollback_is_a_materialization_of_the_published_table(world, home):
    engine = FakeEngine(served_verification={"enabled": False})
    build_table(world.store, world.key, SETTINGS, log=Log())
    publish_table(world.store, world.fleet, world.key, engine, max_predicted_loss=0.5, log=Log())
    build_table(world.store, world.key, SETTINGS, allowed_ks=[1, 3], log=Log())
    publish_table(world.store, world.fleet, world.key, engine, max_predicted_loss=0.5, log=Log())
    done = rollback_table(world.store, lambda: world.fleet, "local-cpu", engine, log=Log())
    mat = describe_rollback(done, [world.key])
    assert mat.partition == world.key and mat.description == "rollback of local-cpu"
    assert set(mat.metadata) == {"deployment", "version", "path", "identity_key", "prior_id", "table", "rollback"}
    assert describe_rollback(done, []).partition is None


def test_failures_turn_a_pipeline_failure_into_the_steps_failure():
    with pytest.raises(dg.Failure) as err:
        with failures():
            raise PipelineFailure("nothing to do", {"week": WEEK, "measured": ["a"], "failures": 1})
    assert err.value.description == "nothing to do"
    assert err.value.metadata["measured"].value == ["a"] and err.value.metadata["failures"].value == 1
    assert isinstance(err.value.__cause__, PipelineFailure)
    with pytest.raises(NotFoundError):  # any other error stays what it is
        with failures():
            raise NotFoundError("not a pipeline failure")

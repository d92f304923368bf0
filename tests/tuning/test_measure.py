"""tuning/measure.py without Dagster: what ``step_time_profile`` and ``acceptance_prior`` do, called
with a scripted engine, a fleet and a store (the assets add only their metadata)."""

from __future__ import annotations

import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import PipelineFailure
from tabletune_pipelines.tuning.measure import measure_week, profile_identity
from tests.tuning.runs import WEEK, FakeEngine, Log, fleet, store, write_prompts
from tests.tuning.samples import RATES


def test_profile_identity_measures_stores_and_resumes(tmp_path):
    f, s, engine = fleet(tmp_path), store(tmp_path), FakeEngine()
    key = identity_for(f.deployments[0], engine.vllm_version).key
    log = Log()
    run = profile_identity(s, f, key, engine, log=log)
    assert run.identity.key == key and run.deployment == "local-cpu"
    assert run.cells_before == 0 and run.cells_measured == len(run.profile.cells) == 6 * 5
    assert run.gate.name == "profile_complete" and run.gate.passed
    assert s.has_identity(key) and len(s.profile_cells(key)) == 30
    assert log.of("info") == [f"profiling {key} (0 cells already in the store are kept and skipped)"]
    again = profile_identity(s, f, key, engine, log=Log())
    assert again.cells_before == 30 and again.cells_measured == 0


def test_profile_identity_of_an_unknown_partition_is_a_pipeline_failure(tmp_path):
    with pytest.raises(PipelineFailure, match="is not an engine identity TableTune knows") as err:
        profile_identity(store(tmp_path), fleet(tmp_path), "cpu-nothing-runs-this", FakeEngine(), log=Log())
    assert err.value.details == {}


def test_a_crashed_profile_keeps_its_cells_and_says_so(tmp_path):
    f, s = fleet(tmp_path), store(tmp_path)
    engine = FakeEngine(fail_after_cells=7)
    key = identity_for(f.deployments[0], engine.vllm_version).key
    with pytest.raises(PipelineFailure, match="scripted crash") as err:
        profile_identity(s, f, key, engine, log=Log())
    assert err.value.details == {"identity": key, "cells_kept": 7}
    assert "re-running the partition resumes from them" in str(err.value)
    assert len(s.profile_cells(key)) == 7


def test_measure_week_stores_a_prior_per_deployment_with_prompts(tmp_path):
    f, s, engine = fleet(tmp_path, "a", "b"), store(tmp_path), FakeEngine()
    write_prompts(f.deployment("a").prompts_file(WEEK), 24)
    log = Log()
    week = measure_week(s, f, WEEK, engine, min_drafts=200, log=log)
    (m,) = week.measured
    assert m.deployment == "a" and m.prior.rates == RATES and m.gate.name == "prior_sane" and m.gate.passed
    assert m.identity_key == identity_for(f.deployment("a"), engine.vllm_version).key
    assert m.sample["prompt_count"] == 24 and m.sample["num_drafts"] == 2400 and len(m.sample["a"]) == 3
    assert week.sane and week.sanity == "1 prior(s) sane"
    assert len(week.without_prompts) == 1 and week.without_prompts[0].startswith("b: no logged prompts")
    assert log.of("warning") == list(week.without_prompts)
    assert s.latest_acceptance_prior("a").prior_id == m.prior.prior_id


def test_measure_week_names_a_prior_that_is_not_sane(tmp_path):
    f, s = fleet(tmp_path), store(tmp_path)
    write_prompts(f.deployments[0].prompts_file(WEEK), 1)  # 100 drafts
    week = measure_week(s, f, WEEK, FakeEngine(), min_drafts=200, log=Log())
    assert not week.sane and week.sanity.startswith("local-cpu: ")


def test_measure_week_without_any_prompts_fails_with_its_figures(tmp_path):
    with pytest.raises(PipelineFailure, match="no acceptance prior measured for the week of") as err:
        measure_week(store(tmp_path), fleet(tmp_path), WEEK, FakeEngine(), min_drafts=200, log=Log())
    assert err.value.details == {"week": WEEK, "deployments_without_prompts": 1, "failures": 0}
    assert "previous priors and published tables are unchanged" in str(err.value)


def test_a_failed_measurement_fails_the_week_but_keeps_the_others(tmp_path):
    f, s = fleet(tmp_path, "a", "b"), store(tmp_path)
    for name in ("a", "b"):
        write_prompts(f.deployment(name).prompts_file(WEEK))
    log = Log()
    with pytest.raises(PipelineFailure, match=r"failed for 1 deployment\(s\)") as err:
        measure_week(s, f, WEEK, FakeEngine(fail_acceptance_for=("b",)), min_drafts=200, log=log)
    assert err.value.details == {"week": WEEK, "measured": ["a"]}
    assert s.latest_acceptance_prior("a") is not None and s.latest_acceptance_prior("b") is None
    assert log.of("error") == ["b: acceptance measurement failed: scripted crash while measuring acceptance of b"]


def test_measure_week_only_for_the_deployments_asked(tmp_path):
    f, s = fleet(tmp_path, "a", "b"), store(tmp_path)
    for name in ("a", "b"):
        write_prompts(f.deployment(name).prompts_file(WEEK))
    week = measure_week(s, f, WEEK, FakeEngine(), deployments=["b"], min_drafts=200, log=Log())
    assert [m.deployment for m in week.measured] == ["b"] and week.without_prompts == ()

"""tuning.feedback.ingest_live_counters without Dagster: a week's counters files of a fleet → stored
live priors (what ``live_acceptance_counters`` does), with what was left out and why."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import PipelineFailure
from tabletune_pipelines.formats.live_counters import CounterWindow, window_line
from tabletune_pipelines.tuning.feedback import ingest_live_counters
from tests.tuning.runs import WEEK, FakeEngine, Log, fleet, store
from tests.tuning.samples import prior

START = datetime(2026, 11, 16, tzinfo=timezone.utc)
BOUNDS = (START, START + timedelta(days=7))


def line(dep, hour, key, drafted, accepted, seq=None):
    return window_line(CounterWindow(
        deployment=dep, window_start=START + timedelta(days=1, hours=hour),
        window_end=START + timedelta(days=1, hours=hour, minutes=5), num_drafts=drafted[0],
        drafted_per_pos=drafted, accepted_per_pos=accepted, identity_key=key,
        source=f"{key[:8]}:1:1", seq=hour if seq is None else seq))


def test_the_current_engines_windows_become_a_stored_live_prior(tmp_path):
    f, s, engine = fleet(tmp_path, "a", "b", "c"), store(tmp_path), FakeEngine()
    a = f.deployment("a")
    now, before = identity_for(a, "0.32.0+cpu").key, identity_for(a, "0.31.0+cpu").key
    measured = prior(deployment="a")
    s.write_acceptance_prior(measured, now)
    a.live_counters.parent.mkdir(parents=True)
    a.live_counters.write_text("\n".join([line("a", 1, before, [4000, 4000, 4000], [0, 0, 0]),
                                          line("a", 2, now, [1000, 1000, 500], [900, 750, 200])]) + "\n")
    f.deployment("c").live_counters.write_text(line("c", 1, before, [10, 10, 10], [5, 5, 5]) + "\n")
    log = Log()
    week = ingest_live_counters(s, f, WEEK, BOUNDS, engine, prior_weight=2000, log=log)
    (got,) = week.ingested
    assert got.deployment == "a" and got.live.windows == 1 and got.left_out == 1
    assert got.live.blended_with == measured.prior_id and got.live.drafted == (1000, 1000, 500)
    assert s.acceptance_prior(got.prior_id).source == "live"
    assert week.left_out == {"a": {before: 1}, "c": {before: 1}} and week.windows_left_out == 2
    key_c = identity_for(f.deployment("c"), "0.32.0+cpu").key
    assert week.notes == (f"b: {f.deployment('b').live_counters} does not exist yet (no controller export)",
                          f"c: no counter windows of {key_c} ending in the week of {WEEK} "
                          "(1 of other engines left out)")
    assert [m for m in log.of("warning") if "left out" in m] == [
        f"a: 1 window(s) of other engines left out (only {now} is counted): {before} (1)",
        f"c: 1 window(s) of other engines left out (only {key_c} is counted): {before} (1)"]
    assert log.of("info") == list(week.notes)


def test_a_deployment_whose_engine_cannot_be_named_is_noted_not_counted(tmp_path):
    f, s = fleet(tmp_path), store(tmp_path)
    dep = f.deployments[0]
    dep.live_counters.parent.mkdir(parents=True)
    dep.live_counters.write_text(line("local-cpu", 1, "k", [10, 10, 10], [5, 5, 5]) + "\n")
    week = ingest_live_counters(s, f, WEEK, BOUNDS, FakeEngine(unreachable=("local-cpu",)), prior_weight=2000,
                                log=Log())
    assert week.ingested == () and "the engine it runs could not be learned" in week.notes[0]


def test_unreadable_counters_are_a_pipeline_failure(tmp_path):
    f, s = fleet(tmp_path), store(tmp_path)
    dep = f.deployments[0]
    key = identity_for(dep, "0.32.0+cpu").key
    dep.live_counters.parent.mkdir(parents=True)
    dep.live_counters.write_text(line("local-cpu", 1, key, [10, 10, 10, 10], [5, 5, 5, 5]) + "\n")  # 4 > max_k
    with pytest.raises(PipelineFailure, match="local-cpu: unreadable live counters: "):
        ingest_live_counters(s, f, WEEK, BOUNDS, FakeEngine(), prior_weight=2000, log=Log())
    assert s.latest_acceptance_prior("local-cpu") is None

"""publishing.py without Dagster: the one entry point the ``published_table`` asset calls
(``publish_table``), the rollback (``rollback_table``) and what a publication writes besides the table."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.errors import PipelineFailure, PublishedTableError
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.tuning.publishing import (
    publication_kwargs,
    publish_table,
    rollback_table,
    serving_speculative_config,
    write_speculative_config,
)
from tabletune_pipelines.tuning.build import build_table
from tests.tuning.runs import SETTINGS, FakeEngine, Log, fleet, store
from tests.tuning.samples import prior, scripted_profile

OFF = {"enabled": False}


def setup(tmp_path, *names, engine=None, allowed_ks=None):
    """A fleet, a store with the first deployment's profile, prior and table, and the engine."""
    f, s = fleet(tmp_path, *names), store(tmp_path)
    engine = engine or FakeEngine()
    ident = identity_for(f.deployments[0], engine.vllm_version)
    s.upsert_identity(ident)
    scripted_profile(ident, s)  # k = 3 at small B, a shorter k at B = 16: verified by served goodput
    s.write_acceptance_prior(prior(), ident.key)
    build_table(s, ident.key, SETTINGS, allowed_ks=allowed_ks, log=Log())
    return f, s, engine, ident.key


def publish(s, f, key, engine, **kw):
    kw.setdefault("max_predicted_loss", SETTINGS.gates().max_predicted_loss)
    return publish_table(s, f, key, engine, log=kw.pop("log", Log()), **kw)


def test_serving_config_of_the_embedded_default_is_paste_able(tmp_path):
    dep = fleet(tmp_path).deployments[0]
    cfg = serving_speculative_config(dep, lambda name, drafter=False, dtype=None: f"/models/{name}")
    assert cfg == {"method": "draft_model", "model": "/models/tiny:small"}
    dep.published_table.parent.mkdir(parents=True)
    path = write_speculative_config(dep, {"speculative_config": {**cfg, "num_speculative_tokens": 3}})
    assert path == dep.speculative_config_path and json.loads(path.read_text())["num_speculative_tokens"] == 3


def test_publication_kwargs_carry_the_tables_engine_prior_and_controller(tmp_path):
    f, s, engine, key = setup(tmp_path)
    dep = f.deployments[0]
    kw = publication_kwargs(dep, engine, s.latest_table(key), s)
    assert kw["base_speculative_config"] == {"method": "draft_model", "model": "/models/tiny-small-draft"}
    fields = kw["document_fields"]
    assert fields["identity"]["vllm_version"] == "0.32.0+cpu" and fields["prior"]["rates"] == [0.7, 0.5, 0.3]
    assert fields["controller"] == {"export_path": str(dep.live_counters)}
    assert set(publication_kwargs(dep, engine)["document_fields"]) == {"controller"}
    assert kw["context_schedule"] is False  # the CPU build's vLLM 0.32 takes no 5-item entries


def test_publish_verifies_publishes_and_then_leaves_an_unchanged_table_alone(tmp_path):
    f, s, engine, key = setup(tmp_path)
    dep = f.deployments[0]
    log = Log()
    pub = publish(s, f, key, engine, log=log)
    assert pub.refusal == "" and pub.gate.name == "served_goodput_verified" and pub.gate.passed
    assert [(t.deployment, t.version, t.unchanged) for t in pub.targets] == [("local-cpu", 1, False)]
    assert pub.published == pub.targets and pub.unchanged == () and pub.skipped == ()
    assert pub.served_plot[:8] == b"\x89PNG\r\n\x1a\n"
    assert pub.speculative_config["num_speculative_tokens_per_batch_size"] == [list(r) for r in pub.table.ranges]
    doc = read_published_table(dep.published_table)
    assert doc["version"] == 1 and doc["served_verification"]["passed"]
    assert (dep.published_table.parent / doc["served_verification"]["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert doc["identity"]["model"] == "tiny:small" and doc["controller"]["export_path"] == str(dep.live_counters)
    assert log.of("info")[-1] == f"published {pub.table.table_id} to local-cpu as v1: {dep.published_table}"
    assert len(log.of("info")) == 2 and log.of("info")[0].startswith(f"kept a served calibration of {key} (12 ")

    again = publish(s, f, key, engine)
    assert [(t.version, t.unchanged) for t in again.targets] == [(1, True)] and again.published == ()
    assert again.gate.passed and "already holds table" in again.gate.description
    assert engine.calls.count(("verify_served", "local-cpu", pub.table.table_id)) == 1
    forced = publish(s, f, key, engine, force=True)
    assert [(t.version, t.unchanged) for t in forced.targets] == [(2, False)]


def test_a_failed_served_verification_publishes_nothing(tmp_path):
    f, s, engine, key = setup(tmp_path, engine=FakeEngine(verification_crashes=True))
    dep = f.deployments[0]
    pub = publish(s, f, key, engine)
    assert not pub.gate.passed and "could not run" in pub.gate.description
    assert pub.refusal.startswith(f"refusing to publish table {pub.table.table_id} of {key}: ")
    assert pub.refusal.endswith("the previously published tables stay (local-cpu: none yet).")
    assert pub.targets == () and pub.speculative_config == {}
    assert not dep.published_table.exists() and s.publications("local-cpu") == []


def test_verification_off_publishes_on_the_predicted_figures(tmp_path):
    f, s, engine, key = setup(tmp_path, engine=FakeEngine(served_verification=OFF))
    pub = publish(s, f, key, engine)
    assert pub.gate.passed and pub.gate.description.startswith("NOT MEASURED: served verification is off")
    assert pub.served_plot is None and [t.version for t in pub.published] == [1]
    assert "served_verification" not in read_published_table(f.deployments[0].published_table)


def test_what_is_refused_before_anything_is_written(tmp_path):
    f, s, engine, key = setup(tmp_path, engine=FakeEngine(served_verification=OFF))
    with pytest.raises(PipelineFailure, match="no draft_length_table for other; materialize it first"):
        publish(s, f, "other", engine)
    with pytest.raises(PipelineFailure, match=f"refusing to publish table .* of {key}: .*untouched"):
        publish(s, f, key, engine, max_predicted_loss=-1.0)
    with pytest.raises(PipelineFailure, match=f"no deployment of .* runs engine identity {key} now"):
        publish(s, f, key, FakeEngine(vllm_version="0.31.0+cpu"))
    with pytest.raises(PipelineFailure, match=r"served_verification: unknown key\(s\) \['budget'\]"):
        publish(s, f, key, FakeEngine(served_verification={"budget": 1}))
    dep = f.deployments[0]
    dep.published_table.parent.mkdir(parents=True)
    dep.published_table.write_text("not mine\n")
    with pytest.raises(PublishedTableError, match="refusing to replace"):
        publish(s, f, key, engine)
    assert dep.published_table.read_text() == "not mine\n" and s.publications("local-cpu") == []


def test_publish_to_the_deployments_running_the_engine_and_note_the_unreachable(tmp_path):
    engine = FakeEngine(served_verification=OFF, unreachable=("b",))
    f, s, engine, key = setup(tmp_path, "a", "b", "c", engine=engine)
    log = Log()
    pub = publish(s, f, key, engine, log=log)
    assert [t.deployment for t in pub.published] == ["a", "c"]
    assert pub.skipped == ("b: unreachable (b: scripted: no answer)",)
    assert log.of("warning") == ["not publishing to b: unreachable (b: scripted: no answer)"]
    only = publish(s, f, key, engine, deployments=["b"], force=True)
    assert [t.deployment for t in only.published] == ["b"] and only.skipped == ()


def test_rollback_republishes_the_previous_version_and_says_when_the_engine_moved_on(tmp_path):
    f, s, engine, key = setup(tmp_path, engine=FakeEngine(served_verification=OFF))
    first = publish(s, f, key, engine)
    with pytest.raises(PipelineFailure, match="cannot roll back local-cpu: .*rollback needs a previous version"):
        rollback_table(s, lambda: f, "local-cpu", engine, log=Log())
    build_table(s, key, SETTINGS, allowed_ks=[1, 3], log=Log())
    publish(s, f, key, engine, max_predicted_loss=0.5)
    log = Log()
    upgraded = FakeEngine(vllm_version="0.33.0+cpu")
    done = rollback_table(s, lambda: f, "local-cpu", upgraded, log=log)
    assert done.version == 3 and done.deployment == "local-cpu" and done.group == f.deployments[0].group
    assert [list(r) for r in done.ranges] == [list(r) for r in first.table.ranges] and done.identity_key == key
    assert done.prior_id == first.table.prior_id and done.path == f.deployments[0].published_table
    assert read_published_table(done.path)["version"] == 3
    assert log.of("info") == [f"local-cpu: rolled back; now v3 ({done.ranges})"]
    (warning,) = log.of("warning")
    assert warning.startswith(f"local-cpu: v3 was made for engine {key}, not the one it runs now")
    with pytest.raises(PipelineFailure, match="cannot roll back nobody: "):
        rollback_table(s, lambda: f, "nobody", engine, log=Log())


def test_a_verification_keeps_a_served_calibration_that_the_next_derive_uses(tmp_path):
    import dataclasses

    from tabletune_pipelines.core.stepcost import Workload

    f, s, engine, key = setup(tmp_path)
    log = Log()
    pub = publish(s, f, key, engine, log=log)
    cal = s.latest_served_calibration(key)
    assert cal is not None and {p.k for p in cal.points} == {0, 1, 2, 3}
    assert {p.load for p in cal.points} == {1, 8, 16} and len(cal.points) == 12  # every fixed k at every load
    assert all(p.ms == pytest.approx(20.0) for p in cal.points)  # scripted windows: 100 steps in 2 s
    assert any("kept a served calibration" in m for m in log.of("info"))
    # The prior of setup carries no workload: the next derive says the calibration is not used.
    log2 = Log()
    build_table(s, key, SETTINGS, log=log2)
    assert any("not used" in m for m in log2.of("info"))
    # With a workload the next derive prices served steps with it, and the table says so.
    s.write_acceptance_prior(dataclasses.replace(prior(), workload=Workload(24, 60, "logged").to_dict()), key)
    log3 = Log()
    built = build_table(s, key, SETTINGS, log=log3)
    assert built.table.served_cost["calibration"]["source"].startswith("served verification of table")
    assert any("served price corrected by" in m for m in log3.of("info"))

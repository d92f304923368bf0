"""The evidence behind a table in the Dagster layer: the table and publishing assets report the predicted loss
with its uncertainty, the k within noise of the chosen one, the number of ranges and the cells
re-measured, in their metadata and in the published file; and a table whose boundary is not backed
by evidence fails ``table_supported_by_evidence`` and does not publish (the previous table stays).

The scripted engine writes a noisy profile (5 % noise, 3 repetitions, seeded) in which a few cells
carry more repetitions, as the adaptive re-measurement leaves them.
"""

from __future__ import annotations

import dataclasses

import dagster as dg
import numpy as np
import pytest

from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.definitions import ASSETS
from tabletune_pipelines.formats.published import read_published_table
from tests.pipeline.helpers import WEEK, ScriptedEngine, make_resources, write_prompts
from tests.pipeline.test_pipeline_assets import identity_key, run_identity, sql
from tests.tuning.samples import noisy_profile

BATCH_SIZES = (1, 2, 4, 8, 12, 16)
REMEASURED = {(1, 4), (2, 4), (1, 8), (2, 8), (3, 8)}
"""(k, B) cells that get three more repetitions."""


class NoisyEngine(ScriptedEngine):
    """Cells of ``tests.tuning.samples.noisy_profile(0.05, seed=2)``; the cells in ``REMEASURED``
    carry six repetitions instead of three."""

    def profile(self, identity, dep, store, log):
        rng = np.random.default_rng(11)
        cells = []
        for c in noisy_profile(0.05, seed=2, batch_sizes=BATCH_SIZES, identity=identity).cells:
            if c.acceptance == "reject" and (c.k, c.batch_size) in REMEASURED:
                reps = c.repetitions_ms + tuple(float(x) for x in c.median_ms * (1 + 0.05 * rng.standard_normal(3)))
                c = dataclasses.replace(c, repetitions_ms=reps, median_ms=float(np.median(reps)), stderr_ms=None)
            cells.append(c)
        store.write_profile_cells(identity, cells)
        return store.load_profile(identity.key)


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _materialize(selection, resources, instance, key):
    return dg.materialize(ASSETS, selection=selection, resources=resources, instance=instance, partition_key=key,
                          raise_on_error=False)


def _with_prior(home, one_fleet, instance):
    """Resources on the noisy engine, the identity key and the deployment, with that week's prior materialized."""
    resources = make_resources(home, one_fleet, engine=NoisyEngine())
    dep = load_fleet(one_fleet).deployment("local-cpu")
    write_prompts(dep.prompts_file(WEEK), 24)
    assert dg.materialize(ASSETS, selection=["acceptance_prior"], resources=resources, instance=instance,
                          partition_key=WEEK).success
    return resources, identity_key(one_fleet), dep


def test_table_and_publishing_metadata_and_the_published_file_carry_the_evidence(home, one_fleet, instance):
    resources, key, dep = _with_prior(home, one_fleet, instance)
    res = run_identity(resources, instance, key)
    assert res.success
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    assert checks["table_supported_by_evidence"].passed and checks["predicted_loss_under_threshold"].passed
    mats = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}

    prof = mats["step_time_profile"]
    assert prof["cells_remeasured"].value == len(REMEASURED) and prof["wall_timed_cells"].value == 0
    assert checks["profile_complete"].metadata["cells_remeasured"].value == len(REMEASURED)

    md = mats["draft_length_table"]
    lcb, loss, ucb = (md[f].value for f in ("predicted_worst_loss_lcb", "predicted_worst_loss",
                                            "predicted_worst_loss_ucb"))
    assert 0.0 <= lcb <= loss <= ucb and ucb > lcb  # the loss with its uncertainty
    assert "95% bounds" in md["predicted_loss"].value
    assert md["has_error_estimates"].value is True and md["search_policy"].value == "evidence"
    n_ranges = md["ranges"].value
    assert n_ranges >= 2 and md["one_batch_size_ranges"].value == 0
    assert md["cells_remeasured"].value == len(REMEASURED)
    assert "| batch sizes | chosen k | k within noise |" in md["k_within_noise"].value
    assert "| B | k from → to | gain | lower bound |" in md["boundaries"].value
    assert "extra ms per accepted draft" in md["accepted_work_fit"].value or "no all-accepted" in \
        md["accepted_work_fit"].value

    pub = mats["published_table"]
    assert pub["ranges"].value == n_ranges and pub["cells_remeasured"].value == len(REMEASURED)
    assert pub["predicted_loss"].value == md["predicted_loss"].value
    assert (pub["predicted_worst_loss_lcb"].value, pub["predicted_worst_loss_ucb"].value) == (lcb, ucb)
    assert "k_within_noise" in pub and "| batch sizes | chosen k | k within noise |" in pub["k_within_noise"].value

    doc = read_published_table(dep.published_table)
    ev = doc["evidence"]
    assert doc["table"]["predicted_worst_loss"] == pytest.approx(loss)
    assert ev["predicted_worst_loss_lcb"] == pytest.approx(lcb) and ev["predicted_worst_loss_ucb"] == pytest.approx(ucb)
    assert ev["ranges"] == n_ranges == len(doc["table"]["ranges"])
    assert ev["cells_remeasured"] == len(REMEASURED)
    assert set(ev["within_noise"]) == {str(b) for b in range(1, 17)}
    for s, e, k in doc["table"]["ranges"]:  # the chosen k is always among the k within noise of itself
        assert all(k in ev["within_noise"][str(b)] for b in range(s, e + 1))
    assert all(b["supported"] for b in ev["boundaries"]) and len(ev["boundaries"]) == n_ranges - 1


def test_an_unsupported_boundary_blocks_publishing_and_the_previous_table_stays(home, one_fleet, instance):
    resources, key, dep = _with_prior(home, one_fleet, instance)
    assert run_identity(resources, instance, key).success  # the evidence table: published as v1
    before = dep.published_table.read_text()

    # The method's 0.5 % rule on the same noisy cells switches k on noise: its boundaries are not
    # supported, the blocking check fails, nothing is published.
    sticky = make_resources(home, one_fleet, engine=NoisyEngine(), search_policy="stickiness")
    res = run_identity(sticky, instance, key, raise_on_error=False)
    assert not res.success
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    gate = checks["table_supported_by_evidence"]
    assert not gate.passed and "within noise" in gate.description and "previous table stays" in gate.description
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert failure.step_key == "draft_length_table"
    assert "published_table" not in {e.step_key for e in res.all_events if e.event_type_value == "STEP_START"}
    assert dep.published_table.read_text() == before

    # A publish-only run re-checks the latest (unsupported) table and refuses it too.
    res = _materialize(["published_table"], sticky, instance, key)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    text = failure.step_failure_data.user_failure_data.description
    assert "refusing to publish" in text and "within noise" in text
    assert dep.published_table.read_text() == before
    assert sql(home, "SELECT count(*) FROM publications")[0][0] == 1

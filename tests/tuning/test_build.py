"""tuning/build.py without Dagster: the table of one engine identity from the store (what
``draft_length_table`` does), its gates and plot, and the failures that name what to materialize first."""

from __future__ import annotations

import pytest

from tabletune_pipelines.errors import PipelineFailure
from tabletune_pipelines.tuning.build import build_table
from tests.tuning.runs import SETTINGS, Log, store
from tests.tuning.samples import IDENT, noisy_profile, prior


def seeded(tmp_path, *priors):
    s = store(tmp_path)
    s.upsert_identity(IDENT)
    s.write_profile_cells(IDENT, list(noisy_profile().cells))
    for p in priors:
        s.write_acceptance_prior(p, IDENT.key)
    return s


def test_build_table_derives_stores_and_judges_the_table(tmp_path):
    good = prior()
    s = seeded(tmp_path, good)
    built = build_table(s, IDENT.key, SETTINGS, log=Log())
    assert built.prior == good and built.table.prior_id == good.prior_id and built.table.identity_key == IDENT.key
    assert s.latest_table(IDENT.key).table_id == built.table_id == built.table.table_id
    assert [g.name for g in built.gates] == ["valid_for_vllm", "predicted_loss_under_threshold",
                                             "table_supported_by_evidence", "engine_dependence_trap",
                                             "k0_costs_vs_no_spec", "cuda_graph_headroom"]
    assert built.plot[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(built.profile.cells) == len(noisy_profile().cells)


def test_build_table_keeps_to_the_allowed_ks(tmp_path):
    built = build_table(seeded(tmp_path, prior()), IDENT.key, SETTINGS, allowed_ks=[1, 3], log=Log())
    assert {k for _, _, k in built.table.ranges} <= {1, 3}


def test_a_prior_that_is_not_sane_is_skipped_and_logged(tmp_path):
    good, thin = prior(), prior(drafts=10, week="2026-11-23")
    log = Log()
    built = build_table(seeded(tmp_path, good, thin), IDENT.key, SETTINGS, log=log)
    assert built.prior == good
    assert [m for m in log.of("warning") if m.startswith("skipping prior: ")]


def test_without_profile_or_prior_the_failure_says_what_to_materialize(tmp_path):
    with pytest.raises(PipelineFailure, match="has no step_time_profile yet; materialize it first"):
        build_table(store(tmp_path), IDENT.key, SETTINGS, log=Log())
    with pytest.raises(PipelineFailure, match="no sane acceptance prior for tiny:small / tiny:small / draft_model"):
        build_table(seeded(tmp_path), IDENT.key, SETTINGS, log=Log())


def test_a_table_that_cannot_be_derived_is_a_pipeline_failure(tmp_path):
    with pytest.raises(PipelineFailure, match=f"cannot derive a table for {IDENT.key}"):
        build_table(seeded(tmp_path, prior()), IDENT.key, SETTINGS, allowed_ks=[7], log=Log())

"""Tables derived with the evidence rule from noisy profiles: their evidence, its gate, its report."""

from __future__ import annotations

import dataclasses

import pytest

from tabletune_pipelines.formats.documents import DraftLengthTable
from tabletune_pipelines.formats.published import load_published
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.derive import NO_ERROR_WARNING, DeriveOptions, derive_table
from tabletune_pipelines.tuning.gates import blocking_table_gates, evidence_gate, loss_gate, profile_gate
from tabletune_pipelines.tuning.report import evidence_markdown, goodput_markdown
from tests.tuning.samples import IDENT, noisy_profile, prior, profile


def test_a_noisy_profile_gives_an_evidence_backed_table_with_its_bounds():
    tuned = derive_table(noisy_profile(0.05, seed=1), prior())
    t = tuned.table
    assert t.search_policy == "evidence" and t.confidence == 0.95 and t.has_error_estimates
    assert t.ranges[0][2] == 3 and t.ranges[-1][2] < 3  # the scripted crossover survives the noise
    assert t.boundaries and all(b.supported for b in t.boundaries) and t.evidence_supported
    assert 0.0 <= t.predicted_worst_loss_lcb <= t.predicted_worst_loss <= t.predicted_worst_loss_ucb
    assert set(t.within_noise) == {str(b) for b in range(1, 17)}
    assert all(k in t.within_noise[str(b)] for b, k in ((1, t.ranges[0][2]), (16, t.ranges[-1][2])))
    assert not tuned.warnings
    assert all(g.passed for g in blocking_table_gates(t, 0.03)), [g.description for g in blocking_table_gates(t, .03)]
    assert DraftLengthTable.from_json(t.to_json()) == t


def test_the_point_rule_on_the_same_noise_fragments_and_fails_the_evidence_gate():
    prof = noisy_profile(0.10, seed=3)
    sticky = derive_table(prof, prior(), DeriveOptions(policy="stickiness")).table
    evidence = derive_table(prof, prior()).table
    assert len(sticky.ranges) > len(evidence.ranges)
    gate = evidence_gate(sticky)
    assert gate.blocking and not gate.passed and "within noise" in gate.description
    assert "previous table stays" in gate.description
    assert evidence_gate(evidence).passed


def test_a_profile_without_repetitions_builds_a_table_and_says_it_has_no_error_estimates():
    tuned = derive_table(profile(), prior())
    assert NO_ERROR_WARNING in tuned.warnings and not tuned.table.has_error_estimates
    gate = evidence_gate(tuned.table)
    assert gate.passed and gate.description.startswith("NOT MEASURED")
    assert "no error estimates" in evidence_markdown(tuned)


def test_old_tables_without_recorded_evidence():
    one = DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key="i", prior_id="p")
    two = DraftLengthTable(ranges=((1, 8, 3), (9, 16, 1)), max_num_seqs=16, max_k=3, identity_key="i", prior_id="p")
    assert evidence_gate(one).passed and not evidence_gate(two).passed
    assert "derive it again" in evidence_gate(two).description


def test_the_loss_gate_judges_the_lower_bound_when_there_are_errors():
    t = derive_table(noisy_profile(0.05, seed=1), prior()).table
    noisy_loss = dataclasses.replace(t, predicted_worst_loss=0.05, predicted_worst_loss_lcb=0.01,
                                     predicted_worst_loss_ucb=0.12)
    g = loss_gate(noisy_loss, 0.03)
    assert g.passed and "bounds 1.00%–12.00%" in g.description
    real = dataclasses.replace(noisy_loss, predicted_worst_loss_lcb=0.04)
    assert not loss_gate(real, 0.03).passed and "the loss is real" in loss_gate(real, 0.03).description
    point = dataclasses.replace(noisy_loss, has_error_estimates=False)
    assert not loss_gate(point, 0.03).passed


def test_a_significant_accepted_work_fit_is_applied_and_shown():
    prof = noisy_profile(0.01, seed=2, accept_extra_ms_per_token=1.5)
    tuned = derive_table(prof, prior())
    fit = tuned.table.accepted_work_fit
    assert tuned.corrected and fit["significant"] and fit["cells"] == 9
    assert fit["alpha_ms"] + 8 * fit["beta_ms"] == pytest.approx(1.5, abs=0.3)
    plain = derive_table(prof, prior(), DeriveOptions(correct_accepted_work=False))
    assert not plain.corrected and plain.table.accepted_work_fit == {}
    assert tuned.step_ms_dense[3, 7] > plain.step_ms_dense[3, 7]  # k = 3 pays for its kept drafts
    assert "applied" in evidence_markdown(tuned)


def test_noise_only_all_accepted_cells_add_no_correction():
    prof = noisy_profile(0.15, seed=4, accept_extra_ms_per_token=0.0)
    tuned = derive_table(prof, prior())
    assert not tuned.corrected and tuned.table.accepted_work_fit["significant"] is False
    assert any("not significant" in w for w in tuned.warnings)
    plain = derive_table(prof, prior(), DeriveOptions(correct_accepted_work=False))
    assert (tuned.step_ms_dense == plain.step_ms_dense).all()


def test_report_shows_within_noise_and_errors():
    tuned = derive_table(noisy_profile(0.05, seed=1), prior())
    md = goodput_markdown(tuned)
    assert "k within noise" in md.splitlines()[0] and " ± " in md.splitlines()[2]
    text = evidence_markdown(tuned)
    for words in ("search policy: evidence", "predicted worst loss vs best fixed k:", "95% bounds", "ranges:",
                  "cells re-measured", "| B | k from → to | gain | lower bound |"):
        assert words in text


def test_the_published_file_carries_the_evidence(tmp_path):
    t = derive_table(noisy_profile(0.05, seed=1), prior()).table
    s = TableTuneStore(tmp_path / "tt.duckdb")
    doc = s.publish("local", t, tmp_path / "pub" / "local.json")
    ev = doc["evidence"]
    assert ev["ranges"] == len(t.ranges) and ev["search_policy"] == "evidence" and ev["confidence"] == 0.95
    assert ev["predicted_worst_loss_ucb"] == t.predicted_worst_loss_ucb and len(ev["boundaries"]) == len(t.boundaries)
    assert ev["within_noise"]["1"] == t.within_noise["1"] and ev["cells_remeasured"] == 0
    assert set(doc["table"]) <= {"schema", "schema_version", "ranges", "max_num_seqs", "max_k", "identity_key",
                                 "prior_id", "acceptance_rates", "predicted_worst_loss", "step_ms"}
    on_disk = load_published(tmp_path / "pub" / "local.json")
    assert on_disk.ranges == tuple(tuple(r) for r in t.ranges) and on_disk.document["evidence"]["ranges"] == len(t.ranges)
    assert IDENT.key == t.identity_key


def test_wall_timed_cells_are_counted_and_reported():
    """Wall timing stays a fallback that is counted and reported (the table, its
    warnings, the report, the profile check and the published file)."""
    prof = noisy_profile(0.05, seed=1)
    wall = {(1, 12), (3, 12), (3, 16)}
    prof = dataclasses.replace(prof, cells=tuple(
        dataclasses.replace(c, timing="wall") if c.acceptance == "reject" and (c.k, c.batch_size) in wall else c
        for c in prof.cells))
    tuned = derive_table(prof, prior())
    assert tuned.table.wall_timed_cells == 3
    assert any("3 cell(s) fell back to wall timing" in w and "B = [12, 16]" in w for w in tuned.warnings)
    assert "wall-timed cells: 3" in evidence_markdown(tuned)
    gate = profile_gate(prof)
    assert gate.passed and gate.figures["wall_timed_cells"] == 3 and gate.figures["wall_timed_batch_sizes"] == [12, 16]
    assert "3 cell(s) fell back to wall timing" in gate.description
    assert tuned.table.published_parts()[1]["wall_timed_cells"] == 3


def test_re_measured_cells_are_counted_in_the_table_and_its_published_evidence():
    prof = noisy_profile(0.05, seed=1)
    more = {(1, 8), (3, 8), (1, 9)}
    prof = dataclasses.replace(prof, cells=tuple(
        dataclasses.replace(c, repetitions_ms=c.repetitions_ms * 2, stderr_ms=None)
        if c.acceptance == "reject" and (c.k, c.batch_size) in more else c for c in prof.cells))
    assert {(c.k, c.batch_size) for c in prof.remeasured()} == more
    t = derive_table(prof, prior()).table
    assert t.cells_remeasured == 3 and t.published_parts()[1]["cells_remeasured"] == 3
    assert profile_gate(prof).figures["cells_remeasured"] == 3

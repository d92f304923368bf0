"""The publish gates as plain functions: every verdict and the figures behind it, no Dagster."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tabletune_pipelines.formats.documents import StepTimeCell, StepTimeProfile
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table
from tabletune_pipelines.tuning.gates import (
    BLOCKING_GATES,
    GATE_NAMES,
    NOT_MEASURED,
    engine_dependence_gate,
    first_sane_prior,
    fixed_launch_cells,
    k0_gate,
    prior_gate,
    profile_gate,
    table_gates,
)
from tests.tuning.samples import IDENT, prior, profile, scripted_ms


@pytest.mark.parametrize("module", ["tabletune_pipelines.tuning.derive", "tabletune_pipelines.tuning.gates",
                                    "tabletune_pipelines.tuning.feedback", "tabletune_pipelines.tuning.report",
                                    "tabletune_pipelines.tuning.measure", "tabletune_pipelines.tuning.build",
                                    "tabletune_pipelines.tuning.deployments", "tabletune_pipelines.tuning.publishing"])
def test_library_modules_import_without_dagster_duckdb_pandas(module):
    code = (f"import sys, {module}\n"
            "print(','.join(m for m in ('dagster', 'duckdb', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} pulled in {out}"


def test_blocking_gates_are_gate_names():
    assert set(BLOCKING_GATES) < set(GATE_NAMES)


def test_profile_gate_passes_a_complete_profile_and_names_missing_k():
    ok = profile_gate(profile())
    assert ok.passed and ok.blocking and ok.name == "profile_complete"
    assert ok.figures["ks_measured"] == [0, 1, 2, 3] and ok.figures["batch_sizes"] == [1, 2, 4, 8, 12, 16]
    missing = profile_gate(profile(ks=(0, 1, 3)))
    assert not missing.passed and "misses k = [2]" in missing.description and IDENT.key in missing.description


def test_profile_gate_fails_when_the_grid_does_not_reach_max_num_seqs():
    gate = profile_gate(profile(batch_sizes=(1, 4, 8)))
    assert not gate.passed and "incomplete" in gate.description


@pytest.mark.parametrize("kwargs, max_k, min_drafts, passed, words", [
    ({}, 3, 200, True, "from 2400 drafts"),
    ({"rates": (0.7, 0.5)}, 3, 200, False, "has 2 rates; the engine drafts up to k = 3"),
    ({"drafts": 100}, 3, 200, False, "rests on 100 drafts; at least 200"),
])
def test_prior_gate(kwargs, max_k, min_drafts, passed, words):
    gate = prior_gate(prior(**kwargs), max_k, min_drafts)
    assert gate.passed is passed and words in gate.description
    assert gate.figures["num_drafts"] == prior(**kwargs).num_drafts


def test_first_sane_prior_skips_in_order_and_says_why():
    few, short, good = prior(drafts=10, week="2026-11-23"), prior(rates=(0.6,), week="2026-11-16"), prior()
    chosen, skipped = first_sane_prior([few, short, good], 3, 200)
    assert chosen == good and len(skipped) == 2
    assert "rests on 10 drafts" in skipped[0] and "has 1 rates" in skipped[1]
    assert first_sane_prior([few], 3, 200)[0] is None


def test_table_gates_check_vllm_validity_and_the_loss_threshold():
    table = derive_table(profile(), prior()).table
    valid, loss = table_gates(table, 0.03)
    assert valid.passed and loss.passed and loss.figures["threshold"] == 0.03
    assert not table_gates(table, 0.0)[1].passed  # loss 0 is not < 0
    # DraftLengthTable refuses such ranges itself; the gate is the defence for one that got past it.
    gappy = dataclasses.replace(table)
    object.__setattr__(gappy, "ranges", ((1, 4, 3), (6, 16, 1)))
    valid, _ = table_gates(gappy, 0.03)
    assert not valid.passed and "vLLM would reject the table" in valid.description


def test_only_k0_allowed_is_a_large_predicted_loss():
    table = derive_table(profile(), prior(), DeriveOptions(allowed_ks=(0,))).table
    _, loss = table_gates(table, 0.03)
    assert not loss.passed and ">= threshold" in loss.description


def test_engine_dependence_gate():
    prof = profile()
    table = derive_table(prof, prior()).table
    reject = prof.reject_cells()
    not_measured = engine_dependence_gate(table, {}, 0.03, reject)
    assert not_measured.passed and not_measured.description.startswith(NOT_MEASURED)
    # Launches with K = k run 30% faster than the same k under K = 3: the table is slower everywhere.
    fast = {k: {b: scripted_ms(k, b) * 0.7 for b in (1, 4, 16)} for k in (1, 2, 3)}
    trap = engine_dependence_gate(table, fast, 0.03, reject)
    assert not trap.passed and not trap.blocking and "slower at B =" in trap.description
    assert trap.figures["worst_slowdown"] == pytest.approx(0.3, abs=1e-9)
    assert all(f"| {b} |" in trap.comparison for b in (1, 4, 16))
    # One launched k (``fixed_k_ks``): the table [[1, 6, 3], [7, 16, 2]] against K = 3 alone, named in
    # the description. Where the table runs k = 3 (B = 1, 4) it is the same k at 0.7x the time: 30 %
    # slower; at B = 16 it runs k = 2: 1 - (2.2 / 53.45) / (2.5 / (0.7 * 64.6)) = 25.5 % slower.
    one = engine_dependence_gate(table, {3: fast[3]}, 0.03, reject)
    assert [list(r) for r in table.ranges] == [[1, 6, 3], [7, 16, 2]]
    assert one.figures["fixed_k"] == [3] and "the best fixed k of [3]" in one.description
    assert one.figures["worst_slowdown"] == pytest.approx(0.3, abs=1e-9) and one.figures["at_batch_size"] == 1
    assert "| 16 | 3 |" in one.comparison and "+25.5% |" in one.comparison
    # The same step times under K = k: no slowdown.
    same = {k: {b: scripted_ms(k, b) for b in (1, 4, 16)} for k in (1, 2, 3)}
    assert engine_dependence_gate(table, same, 0.03, reject).passed


def test_fixed_launch_cells_take_every_k_with_rejected_drafts():
    cells = [StepTimeCell(k=k, batch_size=4, median_ms=float(k), repetitions_ms=(float(k),), launch_k=k)
             for k in (1, 3)]
    assert fixed_launch_cells(cells) == {1: {4: 1.0}, 3: {4: 3.0}}
    assert fixed_launch_cells(cells[:1]) == {1: {4: 1.0}}  # one launched k (fixed_k_ks) is compared with
    accepted = [dataclasses.replace(c, acceptance="accept") for c in cells]
    assert fixed_launch_cells(accepted) == {}


def test_k0_gate_warns_where_no_speculation_wins():
    low = prior(rates=(0.2, 0.05, 0.01))
    prof = profile()
    table = derive_table(prof, low).table
    gate = k0_gate(table, prof.no_spec_ms(), prof.reject_cells()[0], 0.10)
    assert not gate.passed and not gate.blocking
    assert "no speculation beats the table" in gate.description and "the table runs k = 0" in gate.description
    assert "consider turning speculation off above B =" in gate.description
    assert gate.figures["k0_worst_overhead"] == pytest.approx(0.12)
    assert gate.figures["batch_sizes_where_table_runs_costly_k0"]
    # With good acceptance the table stays ahead of no speculation.
    good_table = derive_table(prof, prior()).table
    assert k0_gate(good_table, prof.no_spec_ms(), prof.reject_cells()[0], 0.10).passed


def test_k0_gate_without_a_baseline_says_not_measured():
    prof = profile(no_spec=False)
    gate = k0_gate(derive_table(prof, prior()).table, prof.no_spec_ms(), prof.reject_cells()[0], 0.10)
    assert gate.passed and gate.description.startswith(NOT_MEASURED)


def test_empty_profile_is_incomplete():
    empty = StepTimeProfile(identity=IDENT, cells=())
    assert not profile_gate(empty).passed

"""``tabletune show``: a summary for people by default (the table as ranges, version, engine, prior
with intervals, predicted loss with bounds, served verdict, file), the document with ``--json``; a
note when the file at the deployment's path is another deployment's or another engine's table."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tabletune_pipelines.cli import main
from tabletune_pipelines.formats.fleet import default_store_path, load_fleet
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.tuning.derive import derive_table
from tabletune_pipelines.tuning.report import ranges_line
from tabletune_pipelines.tuning.run_report import served_verdict
from tests.cli.test_cli_evidence import IDENT, noisy_store


def _section(ranges, statuses, **extra):
    """A served-verification section of ``ranges`` with one load per status."""
    loads = list(range(1, len(statuses) + 1))
    per_load = [{"load": load, "status": st, "best_fixed_k": 1,
                 "ratio": None if st == "inconclusive" else (0.9 if st == "fail" else 0.99),
                 "ratio_se": None if st == "inconclusive" else 0.01, "rounds": 3, "t": None,
                 "goodput": {"k=1": [100.0, 1.0, 3], "table": [99.0, 1.0, 3]}}
                for load, st in zip(loads, statuses)]
    return {"passed": "fail" not in statuses, "rule": "r", "tolerance": 0.03, "candidate": [list(r) for r in ranges],
            "candidate_is": None, "loads": loads, "rounds": 3, "window_s": 1.5, "budget_s": 75.0, "elapsed_s": 60.0,
            "budget_cut": False, "launch_s": None, "device": "cpu", "acceptance": "real", "excluded_windows": 0,
            "client_errors": 0, "plot": None, "per_load": per_load, **extra}


def publish(deployment=None, identity=IDENT, served=None, store=None):
    """The noisy store's table published at the default deployment's path (as ``deployment``'s)."""
    store = store or noisy_store(default_store_path())
    dep = load_fleet().deployments[0]
    prior = store.latest_acceptance_prior()
    table = derive_table(store.load_profile(IDENT.key), prior).table
    fields = controller_fields(identity=identity, prior=prior)
    if served is not None:
        fields["served_verification"] = served(table.ranges)
    store.publish(deployment or dep.name, table, dep.published_table, document_fields=fields)
    return dep, table, prior


def summary(capsys, *args):
    assert main([*args, "show"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_ranges_line():
    assert ranges_line([[1, 16, 3], [17, 64, 2], [65, 128, 1]]) == "B 1-16: k=3 · 17-64: k=2 · 65-128: k=1"
    assert ranges_line([[1, 1, 2], [2, 8, 1]]) == "B 1: k=2 · 2-8: k=1"


def test_the_summary_of_a_table_not_verified_yet(home, capsys):
    dep, table, prior = publish()
    out = summary(capsys)
    lines = out.splitlines()
    published_at = read_published_table(dep.published_table)["published_at"]
    assert lines[0] == f"local-cpu: draft-length table v1, published {published_at}"
    assert not any(line.startswith("NOTE") for line in lines)
    table_line = next(line for line in lines if line.strip().startswith("table "))
    assert ranges_line(table.ranges) in table_line and "K = 3, max_num_seqs = 16" in table_line
    assert f"key {IDENT.key}" in out and f"vLLM {IDENT.vllm_version}" in out and IDENT.model in out
    # The prior: its id, the sample behind it (from the store) and each a_i with its interval.
    assert f"prior       {prior.prior_id} (measured): 160 prompts, 5000 drafts, no week (ad hoc)" in out
    assert "a_1 0.700 [0.687, 0.713] · a_2 0.500 [" in out and "(95% intervals)" in out
    # The predicted loss with its bounds, and against vLLM docs' table with its standard error.
    assert "worst loss against the best fixed k at any B: " in out and "(95% bounds " in out
    docs_line = next(line for line in lines if "against vLLM docs' table [[1, 16, 3]]: " in line)
    assert "goodput ratio " in docs_line and docs_line.endswith("(this table / the docs', mean over B 1-16, ± s.e.)")
    assert lines[lines.index(docs_line) + 1].strip().startswith("where the k differ: ")
    assert "  served      not verified yet" in lines
    assert f"  file        {dep.published_table}" in lines
    assert "not measured where k changes" not in out  # every batch size of the profile measured


def test_the_summary_says_verified_unverified_or_failed(home, capsys):
    store = noisy_store(default_store_path())
    dep, *_ = publish(store=store, served=lambda r: _section(r, ["pass", "inconclusive"]))
    out = summary(capsys)
    assert "  served      unverified: no verdict at load 2\n" in out
    assert "up to 3 round(s) of 1.5 s per policy at load 1, 2 on cpu, acceptance real\n" in out
    assert "load 1: pass: table / best fixed k (k=1) = 0.990 ± 0.010 (3 paired round(s))" in out
    assert "load 2: inconclusive (3 paired round(s))" in out
    publish(store=store, served=lambda r: _section(r, ["pass", "pass"]))
    assert "  served      verified\n" in summary(capsys)
    publish(store=store, served=lambda r: _section(r, ["pass", "fail"]))
    out = summary(capsys)
    assert "  served      failed\n" in out and "load 2: fail: table / best fixed k (k=1) = 0.900 ± 0.010" in out


def test_windows_of_fixed_work_are_named_with_the_batch_each_load_ran(home, capsys):
    def fixed_work(r):
        sec = _section(r, ["pass", "pass"], window="requests", requests_per_client=2, window_s=7.5)
        sec["per_load"][1]["mean_batch"] = 1.62
        return sec
    publish(served=fixed_work)
    out = summary(capsys)
    assert "up to 3 round(s) of windows of 2 request(s) a client (~7.5 s at the largest load) per policy" in out
    assert "load 1: pass: table" in out and "load 2 (mean batch 1.6): pass: table" in out


def test_a_stated_verdict_is_shown_as_it_is_else_judged_from_the_loads():
    assert served_verdict(None) == ("not verified yet", [])
    assert served_verdict({**_section([[1, 16, 1]], ["pass"]), "verdict": "unverified"})[0] == "unverified"
    assert served_verdict(_section([[1, 16, 1]], ["pass"]))[0] == "verified"
    assert served_verdict(_section([[1, 16, 1]], ["pass", "inconclusive"]))[0] == "unverified"
    assert served_verdict(_section([[1, 16, 1]], ["inconclusive"]))[0] == "unverified"
    assert served_verdict(_section([[1, 16, 1]], ["fail", "inconclusive"]))[0] == "failed"


def test_the_summary_says_how_many_rounds_each_load_ran_and_what_cut_them(home, capsys):
    """The section's ``rounds`` is the most a load may run; what ran is each load's own count, and a
    budget that stopped a load is said (a float32 CPU run: 1, 0 and 1 of up to 8 rounds)."""
    def cut(r):
        sec = _section(r, ["inconclusive", "inconclusive"], rounds=8, budget_cut=True, budget_s=90.0)
        sec["per_load"][0].update(rounds=1, stop="budget", ratio=0.13)
        sec["per_load"][1].update(rounds=0, stop="budget")
        return sec
    publish(served=cut)
    out = summary(capsys)
    assert ("up to 8 round(s) of 1.5 s per policy at load 1, 2 on cpu, acceptance real; "
            "the 90 s budget cut it short") in out
    assert "load 1: inconclusive: table / best fixed k (k=1) = 0.130 (1 paired round(s), stopped by the budget)" in out
    assert "load 2: inconclusive (0 paired round(s), stopped by the budget)" in out


def test_json_prints_the_document(home, capsys):
    dep, table, _ = publish()
    assert main(["show", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out) == read_published_table(dep.published_table)
    assert json.loads(out)["table"]["ranges"] == [list(r) for r in table.ranges]


def test_without_a_store_the_summary_says_what_it_cannot_tell(home, capsys, tmp_path):
    store = noisy_store(tmp_path / "elsewhere.duckdb")
    publish(store=store)
    out = summary(capsys)  # the default store path: nothing there, and show does not create it
    assert not default_store_path().exists()
    assert f"sample size and date: no store at {default_store_path()}" in out
    assert "a_1 0.700 [0.687, 0.713]" in out  # the intervals come from the file's counts
    assert f"not computed (no store at {default_store_path()})" in out


def test_another_deployments_table_at_this_path_gets_a_note(home, capsys):
    dep, *_ = publish(deployment="gpu-east")
    lines = summary(capsys).splitlines()
    assert lines[1] == ("NOTE: this table was published for deployment 'gpu-east', not 'local-cpu', whose "
                        "published_table it sits at: a controller run with TABLETUNE_DEPLOYMENT=local-cpu refuses "
                        "it, one without that setting serves it; publish the table of 'local-cpu' with the pipeline")
    assert main(["show", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["deployment"] == "gpu-east"
    assert err.startswith("note: this table was published for deployment 'gpu-east'") and len(err.splitlines()) == 1


@pytest.mark.parametrize("change,said", [
    ({"gpu": "H200"}, "GPU 'H200' != the deployment's 'cpu'"),
    ({"model": "/models/other"}, "model '/models/other' != the deployment's"),
    ({"vllm_version": "0.1.0"}, "vLLM '0.1.0' != the deployment's"),
])
def test_another_engines_table_gets_a_note(home, capsys, change, said):
    publish(identity=dataclasses.replace(IDENT, **change))
    note = summary(capsys).splitlines()[1]
    assert note.startswith("NOTE: it was made for another engine than deployment 'local-cpu' runs: ")
    assert said in note and note.endswith("; the deployment's controller refuses it")


def test_a_table_without_an_identity_gets_a_note(home, capsys):
    store = noisy_store(default_store_path())
    dep = load_fleet().deployments[0]
    table = derive_table(store.load_profile(IDENT.key), store.latest_acceptance_prior()).table
    store.publish(dep.name, table, dep.published_table)
    out = summary(capsys)
    assert "NOTE: it records no engine identity" in out and "  engine      not recorded" in out


def test_a_store_that_cannot_be_read_or_lacks_the_profile_leaves_the_summary_whole(home, capsys, tmp_path):
    from tabletune_pipelines.store import TableTuneStore

    publish(store=noisy_store(tmp_path / "elsewhere.duckdb"))
    default_store_path().write_bytes(b"not a database\n" * 512)
    out = summary(capsys)
    assert "sample size and date: the store could not be read (" in out and "a_1 0.700 [0.687, 0.713]" in out
    assert "  served      not verified yet" in out
    default_store_path().unlink()
    TableTuneStore(default_store_path())  # a store, empty
    out = summary(capsys)
    assert f"not computed (the store at {default_store_path()} lacks the table's profile or prior: " in out
    assert "sample size and date: the store does not hold it" in out


def test_odd_values_in_the_evidence_section_are_not_a_traceback(home, run_cli):
    from tabletune_pipelines.formats.documents import DraftLengthTable
    from tabletune_pipelines.formats.published_build import published_document
    from tabletune_pipelines.formats.published_files import write_published_table
    from tabletune_pipelines.formats.published_schema import PublishedVersion

    dep = load_fleet().deployments[0]
    table = DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key="id", prior_id="p",
                             acceptance_rates=(0.7, 0.5, 0.3), predicted_worst_loss=0.01)
    doc = published_document(
        PublishedVersion(deployment=dep.name, version=2, table=table.to_dict(),
                         speculative_config=table.speculative_config(), published_at="2026-11-23T03:00:00Z"),
        evidence={"has_error_estimates": True, "confidence": "high", "predicted_worst_loss_ucb": [1],
                  "predicted_worst_loss_lcb": {"a": 1}})
    write_published_table(dep.published_table, doc)
    proc = run_cli("show")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "worst loss against the best fixed k at any B: 1.00% (no error estimates)" in proc.stdout


def test_show_opens_the_store_read_only(home, run_cli):
    from tests.readers.conftest import snapshot

    publish()
    before = snapshot(home)
    proc = run_cli("show")
    assert proc.returncode == 0 and "goodput ratio " in proc.stdout, proc.stderr
    assert snapshot(home) == before  # same bytes, same mtime


def test_the_summary_names_a_load_where_the_table_is_a_fixed_k_and_the_docs_tables_ratio(home, capsys):
    def judged(r):
        sec = _section(r, ["pass", "inconclusive"])
        sec["per_load"][0].update(candidate_is="k=2", references={"docs' table": {
            "ratio": None, "ratio_se": None, "rounds": 0, "same_as": "table"}})
        sec["per_load"][1].update(references={"docs' table": {"ratio": 1.234, "ratio_se": 0.05, "rounds": 4,
                                                              "same_as": "k=1"}})
        return sec
    publish(served=judged)
    out = summary(capsys)
    assert ("load 1: pass: table / best fixed k (k=1) = 0.990 ± 0.010 (3 paired round(s)); the table is k=2 here, "
            "judged against the other fixed k; vs docs' table: A/A (the same k here)") in out
    assert "load 2: inconclusive (3 paired round(s)); vs docs' table: 1.234 ± 0.050 (4 paired round(s))" in out


def test_run_show_and_the_ui_print_the_same_run_report(home, capsys):
    """One renderer (``run_report.measured_lines``): for the same stored run, ``tabletune run``'s
    "what was measured" block, ``tabletune show``'s summary between its head line and its --json
    hint, and the ``published_table`` metadata are the same lines."""
    pytest.importorskip("dagster")
    from types import SimpleNamespace

    from tabletune_pipelines.embedded import print_published
    from tabletune_pipelines.formats.published import load_published
    from tabletune_pipelines.tuning.run_report import measured_lines

    store = noisy_store(default_store_path())
    dep, table, prior = publish(store=store, served=lambda r: _section(r, ["pass", "inconclusive"]))
    shown = summary(capsys).splitlines()
    resources = {"duckdb": SimpleNamespace(database=str(default_store_path())),
                 "engine": SimpleNamespace(acceptance_options={})}
    print_published(dep, resources, IDENT.key)
    out, err = capsys.readouterr()
    assert err == ""
    run = out.splitlines()
    run = run[run.index(f"[tabletune] {dep.name}: what was measured") + 1:]
    assert run == shown[1:-1]
    # the block holds every figure: the no-verdict note, the a_i intervals, the docs' table, the ties, the verdict
    assert run[0].startswith("NOTE: served verification reached NO VERDICT at load 2")
    assert any("a_1 0.700 [0.687, 0.713]" in line for line in run)
    assert any("against vLLM docs' table" in line for line in run)
    assert any(line.lstrip().startswith(("ties:", "tied within")) for line in run)
    assert "  served      unverified: no verdict at load 2" in run
    # the UI's metadata renders the same lines from the same store
    ui = measured_lines(load_published(dep.published_table), dep, store)
    assert ui == run


def test_a_table_with_a_context_axis_shows_its_grid(home, capsys):
    import numpy as np

    from tabletune_pipelines.core.steptime import StepTimes
    from tabletune_pipelines.tuning.derive import DeriveOptions, judged_step_times
    from tabletune_pipelines.tuning.derive_context import derive_context_table

    store = noisy_store(default_store_path())
    dep = load_fleet().deployments[0]
    prior = store.latest_acceptance_prior()
    profile = store.load_profile(IDENT.key)
    short = judged_step_times(profile, prior, DeriveOptions())
    # At the long level every k >= 1 costs 3 times the step of k = 0: tau(k) <= 2.5 never pays for it.
    long = StepTimes(short.ks, short.ms * np.where(np.array(short.ks) >= 1, 3.0, 1.0)[:, None])
    table = derive_context_table(profile, prior, {256: short, 4096: long}).table
    assert table.full_table.axes.context == ((1, 1024), (1025, 4096))
    assert {e[-1] for e in table.context_entries if e[2] == 1025} == {0}
    store.publish(dep.name, table, dep.published_table, document_fields=controller_fields(identity=IDENT, prior=prior))
    out = summary(capsys)
    grid = out.split("  (B, ctx)    k by batch size and context (a step's context: the mean over its requests)", 1)[1]
    lines = grid.splitlines()[1:2 + len(table.full_table.axes.batch)]
    assert lines[0].split() == ["B", "\\", "ctx", "|", "1-1024", "|", "1025-4096"]
    assert [line.split()[-3:] for line in lines[1:]] == [[str(row[0]), "|", str(row[1])] for row in table.full_table.ks]
    assert f"  table       {ranges_line(table.ranges)}" in out  # the first bucket's batch-only table
    a = ", ".join(f"{x:.3f}" for x in prior.rates)
    assert (f"the controller corrects each bucket from its own level: 1-1024 from 256 tokens, a = {a} (pooled); "
            f"1025-4096 from 4096 tokens, a = {a} (pooled)") in out
    # the published file carries a column per bucket, and a controller on this engine corrects each one
    from tabletune_pipelines.controller.loader import EngineFacts, load_start

    launch = ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, IDENT.max_num_seqs, 3))  # a launch table listing every k
    facts = EngineFacts(max_k=IDENT.max_k, max_num_seqs=IDENT.max_num_seqs, launch_ranges=launch, model=IDENT.model,
                        method=IDENT.method, drafter=IDENT.drafter, vllm_version=IDENT.vllm_version, gpu=IDENT.gpu)
    start = load_start(dep.published_table, facts)
    assert not isinstance(start, str), start
    assert start.columns is not None and [c.bucket for c in start.columns] == [(1, 1024), (1025, 4096)]
    assert np.allclose(start.columns[1].profile_ms, long.ms[[long.ks.index(k) for k in start.allowed_k]])


def test_the_summary_names_a_change_of_k_the_profile_did_not_measure_where(home, capsys):
    """A profile measured at B = 1, 5, 9 and 16 only (the adaptive plan's coarse pass and one
    bisection): each change of k between two of them is named with its unmeasured batch sizes and
    what its other placements predict; the full profile has no such line."""
    from tabletune_pipelines.core.table import DraftTable

    measured = (1, 5, 9, 16)
    dep, table, _ = publish(store=noisy_store(default_store_path(), batch_sizes=measured))
    dense = DraftTable.from_entries([list(r) for r in table.ranges]).dense(16).tolist()
    gaps = [(lo, hi) for lo, hi in zip(measured, measured[1:]) if len(set(dense[lo - 1:hi])) > 1]
    assert gaps, f"the derived table {table.ranges} changes k only at measured batch sizes: no case here"
    out = summary(capsys)
    line = next(x for x in out.splitlines() if "not measured where k changes" in x)
    for lo, hi in gaps:
        assert f"B = {lo + 1}-{hi - 1} (k {dense[lo - 1]} at B = {lo}, k {dense[hi - 1]} at B = {hi};" in line
    assert "of this table's goodput (s.e. up to " in line

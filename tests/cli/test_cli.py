"""The ``tabletune`` CLI on a seeded store (the engine-facing subcommands are covered by the
real-engine tests through the same ``tabletune_pipelines.tuning.deployments`` functions)."""

import json

from tabletune_pipelines.cli import main
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.store import TableTuneStore


def test_table_as_vllm_json(seeded, capsys):
    assert main(["table", "--format", "vllm"]) == 0
    table = json.loads(capsys.readouterr().out)
    DraftTable.from_entries(table, max_num_seqs=16, max_k=3)
    assert table[0][2] == 3 and table[-1][2] == 1


def test_table_text_plot_and_save(seeded, tmp_path, capsys):
    png = tmp_path / "g.png"
    assert main(["--db", str(seeded), "table", "--plot", str(png), "--save"]) == 0
    out = capsys.readouterr().out
    assert "| batch sizes | k |" in out and "chosen k" in out
    spec_line = next(line for line in out.splitlines() if line.startswith("vLLM --speculative-config: "))
    spec = json.loads(spec_line.split(": ", 1)[1])
    assert spec["num_speculative_tokens"] == 3
    DraftTable.from_entries(spec["num_speculative_tokens_per_batch_size"], max_num_seqs=16, max_k=3)
    assert spec["method"] == "ngram"  # the deployment's own speculative config is kept
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert TableTuneStore(seeded).query("SELECT count(*) FROM draft_length_tables") == [(1,)]


def test_table_with_an_explicit_prior_and_identity(seeded, capsys):
    store = TableTuneStore(seeded)
    prior = store.latest_acceptance_prior()
    (key,) = store.identity_keys()
    assert main(["table", "--format", "vllm", "--prior", prior.prior_id, "--identity", key]) == 0
    DraftTable.from_entries(json.loads(capsys.readouterr().out), max_num_seqs=16, max_k=3)


def test_table_without_a_store_does_not_create_one(home, capsys):
    assert main(["table"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no TableTune store at ") and "tabletune profile" in err
    assert not any(home.iterdir())


def test_table_without_profile_is_a_clear_error(home, tmp_path, capsys):
    db = tmp_path / "empty.duckdb"
    TableTuneStore(db)
    assert main(["--db", str(db), "table"]) == 2
    assert "no step-time profile for deployment 'local-cpu'" in capsys.readouterr().err


def test_show_prints_the_published_document(home, capsys):
    from tabletune_pipelines.formats.documents import DraftLengthTable
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.formats.published_build import published_document
    from tabletune_pipelines.formats.published_files import write_published_table
    from tabletune_pipelines.formats.published_schema import PublishedVersion

    dep = load_fleet().deployments[0]
    table = DraftLengthTable(ranges=((1, 8, 3), (9, 16, 1)), max_num_seqs=16, max_k=3, identity_key="id",
                             prior_id="prior-adhoc-0", acceptance_rates=(0.7, 0.5, 0.3))
    doc = published_document(PublishedVersion(deployment=dep.name, version=3, table=table.to_dict(),
                                              speculative_config=table.speculative_config({"method": "ngram"}),
                                              published_at="2026-11-23T03:00:00Z"))
    write_published_table(dep.published_table, doc)
    assert main(["show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["deployment"] == "local-cpu" and shown["version"] == 3
    assert shown["table"]["ranges"] == [[1, 8, 3], [9, 16, 1]]
    # By default, a summary: a file of an old pipeline (no identity, prior counts or evidence) still shows.
    assert main(["show"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("local-cpu: draft-length table v3, published 2026-11-23T03:00:00Z\n")
    assert "  table       B 1-8: k=3 · 9-16: k=1   (K = 3, max_num_seqs = 16)" in out
    assert "a_1 0.700 · a_2 0.500 · a_3 0.300  (no counts: no intervals)" in out
    assert "(no error estimates)" in out and "  served      not verified yet" in out
    assert "NOTE: it records no engine identity" in out


def test_multi_line_errors_keep_one_error_line(home, tmp_path, capsys):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("schema_version: 1\ndeployments:\n  - name: a\n    max_k: 0\n    bogus: 1\n")
    assert main(["--fleet", str(bad), "show"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: fleet file ") and len(lines) > 2
    assert all(line.startswith("  fleet file ") for line in lines[1:])


def test_table_takes_the_prior_the_pipeline_takes(seeded, capsys):
    """One rule for which prior builds a table (``tuning.gates.prior_for_table``): ``tabletune table``
    skips a newer prior that fails the prior gate, as the ``draft_length_table`` asset does (through
    ``tuning.build.build_table``)."""
    from tabletune_pipelines.formats.documents import AcceptancePrior
    from tabletune_pipelines.tuning import build, gates

    assert build.prior_for_table is gates.prior_for_table
    store = TableTuneStore(seeded)
    (key,) = store.identity_keys()
    good = store.latest_acceptance_prior()
    thin = AcceptancePrior(rates=(0.9, 0.8, 0.7), num_drafts=10, drafted_per_pos=(10,) * 3,
                           accepted_per_pos=(9, 8, 7), prompt_fingerprint="e" * 64, prompt_count=1,
                           week="2026-11-30", deployment="local-cpu")
    store.write_acceptance_prior(thin, key)
    assert store.latest_acceptance_prior().prior_id == thin.prior_id  # the newest, but it rests on 10 drafts
    profile = store.load_profile(key)
    chosen, skipped = gates.prior_for_table(store, profile.identity)
    assert chosen == good and len(skipped) == 1 and "rests on 10 drafts" in skipped[0]
    del store
    assert main(["table"]) == 0
    captured = capsys.readouterr()
    assert f"# prior {good.prior_id}:" in captured.out
    assert f"warning: skipping prior: prior {thin.prior_id} rests on 10 drafts" in captured.err

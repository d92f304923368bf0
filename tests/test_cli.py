"""The ``tabletune`` CLI on a seeded store (the engine-facing subcommands are covered by the
real-engine tests through the same pipeline_ops functions)."""

import json

import pytest

from tabletune_pipelines.cli import main
from tabletune_pipelines.core.table import validate_table
from tabletune_pipelines.documents import AcceptancePrior, EngineIdentity, StepTimeCell
from tabletune_pipelines.store import TableTuneStore

# DESIGN §4, medium target on CPU: the best k moves from 3 to 1 near B = 16.
MEDIUM = {None: {1: 14.1, 4: 15.3, 16: 25.6}, 0: {1: 15.0, 4: 16.5, 16: 27.0},
          1: {1: 16.9, 4: 22.6, 16: 42.3}, 3: {1: 17.4, 4: 28.1, 16: 64.6}}


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    db = tmp_path / "tt.duckdb"
    store = TableTuneStore(db)
    ident = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="tiny:small", drafter=None, method="ngram",
                           max_k=3, max_num_seqs=16)
    store.write_profile_cells(ident, [StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms,), launch_k=3)
                                      for k, row in MEDIUM.items() for b, ms in row.items()])
    store.write_acceptance_prior(AcceptancePrior(rates=(0.7, 0.5, 0.3), num_drafts=5000,
                                                 drafted_per_pos=(5000,) * 3, accepted_per_pos=(3500, 2500, 1500),
                                                 prompt_fingerprint="f" * 64, prompt_count=160, deployment="local-cpu"),
                                 ident.key)
    return db


def test_table_as_vllm_json(seeded, capsys):
    assert main(["--db", str(seeded), "table", "--format", "vllm"]) == 0
    table = json.loads(capsys.readouterr().out)
    validate_table(table, 16, 3)
    assert table[0][2] == 3 and table[-1][2] == 1


def test_table_text_plot_and_save(seeded, tmp_path, capsys):
    png = tmp_path / "g.png"
    assert main(["--db", str(seeded), "table", "--plot", str(png), "--save"]) == 0
    out = capsys.readouterr().out
    assert "| batch sizes | k |" in out and "chosen k" in out
    spec_line = next(line for line in out.splitlines() if line.startswith("vLLM --speculative-config: "))
    spec = json.loads(spec_line.split(": ", 1)[1])
    assert spec["num_speculative_tokens"] == 3
    validate_table(spec["num_speculative_tokens_per_batch_size"], 16, 3)
    assert spec["method"] == "ngram"  # the deployment's own speculative config is kept
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert TableTuneStore(seeded).query("SELECT count(*) FROM draft_length_tables") == [(1,)]


def test_table_without_profile_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit, match="no step-time profile"):
        main(["--db", str(tmp_path / "empty.duckdb"), "table"])

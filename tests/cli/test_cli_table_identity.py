"""`tabletune table` picks the profile of the engine the deployment runs — its
full engine identity (GPU, vLLM, model, drafter, method, K, max_num_seqs, dtype, graphs) — never
another engine's profile of the same model, and refuses with one `error:` line listing the
identities the store holds when it has none of that engine.

Worked example: the store holds the embedded default's profile (cpu, K = 3, max_num_seqs 16) and,
measured later, a profile of the same model on an H200 with K = 5 and max_num_seqs 64. Picking by
model name alone printed the H200 engine's table, with "num_speculative_tokens": 5."""

from __future__ import annotations

import json

from tabletune_pipelines.cli import main
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell
from tabletune_pipelines.store import TableTuneStore
from tests.cli.conftest import embedded_identity
from tests.readers.conftest import assert_one_error, snapshot


def other_engine() -> EngineIdentity:
    """The same model on another GPU, with another K and max_num_seqs."""
    import dataclasses

    return dataclasses.replace(embedded_identity(), gpu="H200", max_k=5, max_num_seqs=64, cudagraph_mode="default")


def add_other_profile(db) -> str:
    ident = other_engine()
    cells = [StepTimeCell(k=k, batch_size=b, median_ms=10.0 + (k or 0) * 0.1 + b * 0.01, repetitions_ms=(10.0,),
                          launch_k=5) for k in [None, 0, 1, 2, 3, 4, 5] for b in (1, 8, 64)]
    TableTuneStore(db).write_profile_cells(ident, cells)  # measured last
    return ident.key


def test_table_uses_the_profile_of_the_engine_the_deployment_runs(seeded, capsys):
    mine = embedded_identity().key
    other = add_other_profile(seeded)
    assert TableTuneStore(seeded).latest_profiled_identity_key(embedded_identity().model) == other  # what the old pick chose
    assert main(["table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# draft-length table for {mine}\n") and other not in out
    spec = json.loads(out.split("vLLM --speculative-config: ", 1)[1].splitlines()[0])
    assert spec["num_speculative_tokens"] == 3 and spec["num_speculative_tokens_per_batch_size"][-1][1] == 16
    assert main(["table", "--format", "vllm"]) == 0
    assert json.loads(capsys.readouterr().out)[-1][1] == 16  # covers max_num_seqs 16, not 64


def test_a_store_without_the_deployments_engine_is_one_error_listing_what_it_holds(home, run_cli):
    db = home / "tabletune_store.duckdb"
    other = add_other_profile(db)
    before = snapshot(home)
    err = assert_one_error(run_cli("table"),
                           f"no step-time profile for deployment 'local-cpu' (engine {embedded_identity().key})",
                           f"the store holds 1 engine identity: {other}", "run `tabletune profile`", "--identity KEY")
    assert len(err.splitlines()) == 1
    assert snapshot(home) == before  # read-only: the store is byte-identical, nothing else written


def test_the_error_lists_every_identity_the_store_holds(home, run_cli):
    import dataclasses

    db = home / "tabletune_store.duckdb"
    add_other_profile(db)
    third = dataclasses.replace(other_engine(), max_num_seqs=32)
    TableTuneStore(db).write_profile_cells(third, [StepTimeCell(k=0, batch_size=1, median_ms=1.0,
                                                                repetitions_ms=(1.0,))])
    keys = TableTuneStore(db, read_only=True).identity_keys()
    assert len(keys) == 2
    assert_one_error(run_cli("table"), f"the store holds 2 engine identities: {keys[0]}, {keys[1]}")


def test_an_unknown_identity_lists_the_stored_keys(seeded, run_cli):
    other = add_other_profile(seeded)
    keys = TableTuneStore(seeded, read_only=True).identity_keys()
    assert sorted(keys) == sorted([embedded_identity().key, other])
    before = snapshot(seeded.parent)
    assert_one_error(run_cli("table", "--identity", "NOSUCH"), "--identity 'NOSUCH': no engine identity with that key",
                     f"the store holds 2 engine identities: {', '.join(keys)} ({seeded})", "omit --identity")
    assert snapshot(seeded.parent) == before

"""The graph envelope in the engine identity: a change of the capture ceiling (or the
token budget) is a new engine, identities recorded before the envelope keep their keys, and stores
written before the mixed-step samples existed still load and migrate."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import duckdb
import pytest

from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell, StepTimeProfile
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.identity import engine_identity
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.schema import SCHEMA_SQL

H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200"


def _gpu(**kw) -> EngineIdentity:
    cfg = ServerConfig(model="/m/qwen3-4b", drafter="/m/eagle3", method="eagle3", num_speculative_tokens=3,
                       max_num_seqs=128, device="gpu", dtype="bfloat16", **kw)
    return engine_identity(cfg, vllm_version="0.26.0", gpu="H200")


def test_changing_the_capture_ceiling_changes_the_engine_identity():
    default, wider = _gpu(), _gpu(max_cudagraph_capture_size=1024)
    assert default.capture_ceiling == 512  # vLLM 0.26: min(128·4·2, 512)
    assert wider.capture_ceiling == 1024
    assert default.key != wider.key
    assert _gpu(max_num_batched_tokens=4096).key != default.key
    assert _gpu(max_cudagraph_capture_size=512).key == default.key  # the same envelope, said explicitly
    assert default.graph_envelope().transition(512, 1) == "full>none"


def test_cpu_identities_and_identities_recorded_before_the_envelope_keep_their_keys():
    cpu = engine_identity(ServerConfig(model="/m/t", drafter="/m/d", method="draft_model", num_speculative_tokens=3,
                                       device="cpu"), vllm_version="0.32.0+cpu", gpu="cpu")
    assert cpu.capture_ceiling is None and cpu.graph_envelope().has_graphs is False
    # The committed H200 profiles were stored before the envelope: same key as their file name says.
    for path in H200.glob("*.one_launch.json"):
        prof = StepTimeProfile.from_json(path.read_text())
        assert prof.identity.capture_ceiling is None
        assert path.name.startswith(prof.identity.key)


def test_the_launch_asks_vllm_for_the_envelope_it_records():
    from tabletune_pipelines.engine.command import build_command

    cfg = ServerConfig(model="/m/t", drafter="/m/d", method="eagle3", num_speculative_tokens=3, device="gpu",
                       dtype="bfloat16", max_cudagraph_capture_size=1024, max_num_batched_tokens=4096)
    argv = build_command(cfg, 8000, "gpu")
    assert argv[argv.index("--compilation-config") + 1] == '{"max_cudagraph_capture_size":1024}'
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "4096"
    assert "--compilation-config" not in build_command(dataclasses.replace(cfg, device="cpu"), 8000, "cpu")


IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m/target", drafter="/m/draft",
                       method="draft_model", max_k=3, max_num_seqs=16)


def old_store(path):
    """A store as TableTune wrote it before the step_samples table, with one cell."""
    sql = re.sub(r"-- Steps timed with prefill.*?\);\n", "", SCHEMA_SQL, flags=re.S)
    assert "step_samples" not in sql
    conn = duckdb.connect(str(path))
    conn.execute(sql)
    conn.execute("INSERT INTO engine_identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                 [IDENT.key, IDENT.gpu, IDENT.vllm_version, IDENT.model, IDENT.drafter, IDENT.method, IDENT.max_k,
                  IDENT.max_num_seqs, IDENT.to_json()])
    conn.execute("INSERT INTO step_time_cells (identity_key, mode, acceptance, k, batch_size, median_ms, spread, "
                 "repetitions_ms, launch_k, timing, measured_at, stderr_ms) VALUES (?, 'one_launch', 'reject', 1, 4, "
                 "5.0, 0.14, ?, 3, 'engine', now(), NULL)", [IDENT.key, [5.0, 5.4, 4.7]])
    conn.close()


def _tables(path) -> set[str]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        conn.close()


def test_an_old_store_loads_read_only_and_migrates_when_opened_for_writing(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    ro = TableTuneStore(path, read_only=True)
    prof = ro.load_profile(IDENT.key)
    assert len(prof.cells) == 1 and prof.samples == ()
    assert "step_samples" not in _tables(path)  # read-only means untouched
    rw = TableTuneStore(path)
    assert rw.load_profile(IDENT.key).samples == ()
    assert "step_samples" in _tables(path)
    samples = [StepSample(4, 1, 8, 0, 5.0), StepSample(4, 1, 8, 64, 9.5)]
    rw.write_step_samples(IDENT, samples)
    assert list(rw.load_profile(IDENT.key).samples) == samples
    rw.write_step_samples(IDENT, samples[:1])  # a new measurement replaces the old one
    assert list(TableTuneStore(path, read_only=True).step_samples(IDENT.key)) == samples[:1]


def test_a_stored_sample_no_measurement_writes_is_refused(tmp_path):
    from tabletune_pipelines.errors import StoredDataError

    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=5.0, repetitions_ms=(5.0, 5.1)))
    s.write_step_samples(IDENT, [StepSample(4, 1, 8, 64, 9.5)])
    s.query("UPDATE step_samples SET ms = 'nan'::DOUBLE")
    with pytest.raises(StoredDataError, match="mixed-step sample"):
        s.load_profile(IDENT.key)


def test_the_published_file_carries_the_serving_envelope_the_table_assumes():
    from tabletune_pipelines.errors import PublishedTableError
    from tabletune_pipelines.formats.published import parse_published
    from tabletune_pipelines.formats.published_build import published_document
    from tabletune_pipelines.formats.published_schema import PublishedVersion

    ident = dataclasses.replace(_gpu(max_cudagraph_capture_size=1024), model_runner="v2")
    table = {"ranges": [[1, 128, 3]], "max_num_seqs": 128, "max_k": 3, "identity_key": ident.key, "prior_id": "p",
             "acceptance_rates": [0.7, 0.5, 0.3], "predicted_worst_loss": 0.0, "step_ms": {},
             "schema": "tabletune.draft_length_table", "schema_version": 1}
    spec = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 128, 3]]}
    doc = published_document(PublishedVersion(deployment="d", version=1, table=table,
                                              published_at="2026-12-01T00:00:00Z", speculative_config=spec),
                             identity=ident.to_dict())
    assert doc["serving"] == {"flags": ["--max-num-seqs", "128", "--compilation-config",
                                        '{"max_cudagraph_capture_size":1024}'],
                              "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}
    bad = dict(doc, serving={"flags": "--max-num-seqs 128", "env": {}})
    with pytest.raises(PublishedTableError, match="'serving' must be"):
        parse_published(bad, "test")

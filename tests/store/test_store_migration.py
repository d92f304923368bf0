"""The standard-error column of a step-time cell: stored beside the median, and stores written before it
existed still load (opened for writing they are migrated; opened read-only they read NULL and the
cells recompute their error from the repetitions)."""

from __future__ import annotations

import re

import duckdb
import pytest

from tabletune_pipelines.core.steptime import median_standard_error
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell, StepTimeProfile
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.schema import SCHEMA_SQL

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m/target", drafter="/m/draft",
                       method="draft_model", max_k=3, max_num_seqs=16)
REPS = (5.0, 5.4, 4.7)


def old_store(path):
    """A store as TableTune wrote it before the stderr_ms column (and the context_tokens column after it),
    with one cell."""
    sql = re.sub(r",\n\s*stderr_ms\s+DOUBLE[^\n]*\n\s*context_tokens[^\n]*\n", "\n", SCHEMA_SQL)
    assert "stderr_ms" not in sql and "context_tokens" not in sql
    conn = duckdb.connect(str(path))
    conn.execute(sql)
    conn.execute("INSERT INTO engine_identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                 [IDENT.key, IDENT.gpu, IDENT.vllm_version, IDENT.model, IDENT.drafter, IDENT.method, IDENT.max_k,
                  IDENT.max_num_seqs, IDENT.to_json()])
    conn.execute("INSERT INTO step_time_cells VALUES (?, 'one_launch', 'reject', 1, 4, 5.0, 0.14, ?, 3, 'engine', "
                 "now())", [IDENT.key, list(REPS)])
    conn.close()


def test_the_standard_error_is_stored_beside_the_median(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=5.0, repetitions_ms=REPS))
    s.write_profile_cell(IDENT, StepTimeCell(k=0, batch_size=4, median_ms=4.0, repetitions_ms=(4.0,)))
    rows = s.query("SELECT k, median_ms, stderr_ms FROM step_time_cells ORDER BY k")
    assert rows[0] == (0, 4.0, None)  # one repetition: no estimate
    assert rows[1][2] == pytest.approx(median_standard_error(REPS))
    cells = {c.k: c for c in s.profile_cells(IDENT.key)}
    assert cells[1].stderr_ms == pytest.approx(median_standard_error(REPS)) and cells[0].stderr_ms is None


def test_an_old_store_opened_read_only_loads_and_recomputes_the_error(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    ro = TableTuneStore(path, read_only=True)
    (cell,) = ro.profile_cells(IDENT.key)
    assert cell.stderr_ms == pytest.approx(median_standard_error(REPS))
    # Read-only means untouched: still no column.
    conn = duckdb.connect(str(path), read_only=True)
    cols = {r[0] for r in conn.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = "
                                       "'step_time_cells'").fetchall()}
    conn.close()
    assert "stderr_ms" not in cols


def test_an_old_store_opened_for_writing_is_migrated(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    s = TableTuneStore(path)
    assert s.query("SELECT stderr_ms FROM step_time_cells") == [(None,)]  # old rows: NULL ...
    assert s.profile_cells(IDENT.key)[0].stderr_ms == pytest.approx(median_standard_error(REPS))  # ... recomputed
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=8, median_ms=6.0, repetitions_ms=(6.0, 6.2)))
    assert s.query("SELECT stderr_ms FROM step_time_cells WHERE batch_size = 8")[0][0] == pytest.approx(
        median_standard_error((6.0, 6.2)))
    profile = s.load_profile(IDENT.key)
    assert isinstance(profile, StepTimeProfile) and profile.has_error_estimates


def test_old_profile_documents_without_the_field_load():
    cell = StepTimeCell(k=1, batch_size=4, median_ms=5.0, repetitions_ms=REPS)
    body = StepTimeProfile(identity=IDENT, cells=(cell,)).to_dict()
    del body["cells"][0]["stderr_ms"]
    loaded = StepTimeProfile.from_dict(body)
    assert loaded.cells[0].stderr_ms == pytest.approx(median_standard_error(REPS))

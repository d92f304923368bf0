"""Step-time cells per context level in the store: a real DuckDB file round-trips cells of several
levels, a store written before cells carried a level is migrated (its rows get the default
prompt_tokens, 32) and still loads read-only, and ``step_time_surface`` gives level → StepTimes."""

from __future__ import annotations

import re

import duckdb
import pytest

from tabletune_pipelines.errors import NotFoundError
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell
from tabletune_pipelines.formats.profile_levels import at_context, context_levels, level_step_times
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.schema import SCHEMA_SQL

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m/target", drafter=None,
                       method="ngram", max_k=1, max_num_seqs=4)


def cell(k, b, ms, level):
    return StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms - 0.1, ms, ms + 0.1), launch_k=1,
                        context_tokens=level)


def old_store(path):
    """A store as TableTune wrote it before the context_tokens column, with the cells of k 0 and 1 at B 1 and 4."""
    sql = re.sub(r"(stderr_ms\s+DOUBLE),([^\n]*)\n\s*context_tokens[^\n]*\n", r"\1 \2\n", SCHEMA_SQL)
    assert "context_tokens" not in sql
    conn = duckdb.connect(str(path))
    conn.execute(sql)
    conn.execute("INSERT INTO engine_identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                 [IDENT.key, IDENT.gpu, IDENT.vllm_version, IDENT.model, IDENT.drafter, IDENT.method, IDENT.max_k,
                  IDENT.max_num_seqs, IDENT.to_json()])
    for k, b, ms in ((0, 1, 10.0), (1, 1, 12.0), (0, 4, 11.0), (1, 4, 14.0)):
        conn.execute("INSERT INTO step_time_cells VALUES (?, 'one_launch', 'reject', ?, ?, ?, 0.02, ?, 1, 'engine', "
                     "now(), NULL)", [IDENT.key, k, b, ms, [ms - 0.1, ms, ms + 0.1]])
    conn.close()


def test_cells_of_two_levels_round_trip_and_a_cell_replaces_only_its_own_level(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.write_profile_cells(IDENT, [cell(0, 1, 10.0, 32), cell(1, 1, 12.0, 32), cell(0, 1, 15.0, 1024),
                                  cell(1, 1, 16.0, 1024)])
    s.write_profile_cell(IDENT, cell(1, 1, 17.0, 1024))  # replaces (k 1, B 1, 1024), not (k 1, B 1, 32)
    got = {(c.k, c.batch_size, c.context_tokens): c.median_ms for c in s.profile_cells(IDENT.key)}
    assert got == {(0, 1, 32): 10.0, (1, 1, 32): 12.0, (0, 1, 1024): 15.0, (1, 1, 1024): 17.0}
    assert s.context_levels(IDENT.key) == [32, 1024]
    profile = s.load_profile(IDENT.key)
    assert context_levels(profile) == [32, 1024]
    # the per-(k, B) views read the lowest level; at_context gives another
    assert profile.reject_cells() == {0: {1: 10.0}, 1: {1: 12.0}}
    assert at_context(profile, 1024).reject_cells() == {0: {1: 15.0}, 1: {1: 17.0}}


def test_the_surface_is_level_to_step_times(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.write_profile_cells(IDENT, [cell(0, 1, 10.0, 32), cell(1, 1, 12.0, 32), cell(0, 4, 11.0, 32),
                                  cell(1, 4, 14.0, 32), cell(0, 1, 20.0, 2048), cell(1, 1, 21.0, 2048),
                                  cell(0, 4, 26.0, 2048), cell(1, 4, 27.0, 2048)])
    surface = s.step_time_surface(IDENT.key)
    assert sorted(surface) == [32, 2048]
    assert surface[32].ks == (0, 1) and surface[32].ms.shape == (2, 4)
    # B 1..4 interpolated linearly between the measured B 1 and 4
    assert surface[32].ms[1].tolist() == pytest.approx([12.0, 12.6667, 13.3333, 14.0], abs=1e-3)
    assert surface[2048].ms[0].tolist() == pytest.approx([20.0, 22.0, 24.0, 26.0])
    assert surface[2048].at(1, 4)[0] == pytest.approx(27.0)
    with pytest.raises(NotFoundError):
        s.step_time_surface("no-such-identity-key")


def test_an_old_store_is_migrated_its_cells_at_the_default_prompt_tokens(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    ro = TableTuneStore(path, read_only=True)  # read-only: no column, every cell at level 32
    assert {c.context_tokens for c in ro.profile_cells(IDENT.key)} == {32}
    ro_surface = ro.step_time_surface(IDENT.key)
    s = TableTuneStore(path)  # a writing open adds the column, 32 in every old row
    assert s.query("SELECT DISTINCT context_tokens FROM step_time_cells") == [(32,)]
    surface = s.step_time_surface(IDENT.key)
    assert list(surface) == [32] and surface[32].ms.tolist() == ro_surface[32].ms.tolist()
    # the single-level loader gives what it gave before levels: the one surface
    assert surface[32].ms.tolist() == level_step_times(s.load_profile(IDENT.key)).ms.tolist()
    assert surface[32].ms[:, 0].tolist() == [10.0, 12.0] and surface[32].ms[:, 3].tolist() == [11.0, 14.0]
    s.write_profile_cell(IDENT, cell(1, 4, 30.0, 512))  # a new level beside the migrated rows
    assert s.context_levels(IDENT.key) == [32, 512]
    assert {c.median_ms for c in s.profile_cells(IDENT.key) if c.k == 1 and c.batch_size == 4} == {14.0, 30.0}

"""The DuckDB store under hostile input: files that are not DuckDB databases,
DuckDB databases of something else or with other columns, and read-only commands, which must never
create or alter the store. Each case is one StoreError (or NotFoundError) naming the path and what
is wrong, and the file is byte-identical afterwards."""

from __future__ import annotations

import sqlite3

import duckdb
import pytest

from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell
from tabletune_pipelines.errors import NotFoundError, StoreCorruptError, StoreError, TableTuneError
from tabletune_pipelines.store import TableTuneStore
from tests.cli.conftest import seed_store
from tests.readers.conftest import assert_one_error, snapshot

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m", drafter=None, method="ngram",
                       max_k=3, max_num_seqs=16)


def refused(path, error=StoreError, read_only=False):
    """Open ``path`` as the store: the error it raises (whose message names the path); nothing changed."""
    before = snapshot(path.parent)
    with pytest.raises(error) as err:
        TableTuneStore(path, read_only=read_only)
    assert snapshot(path.parent) == before
    assert str(path) in str(err.value) and isinstance(err.value, TableTuneError)
    return str(err.value)


def _sqlite(path):
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE publications (x)")
    c.commit()
    c.close()


def _duckdb(path, *sql):
    c = duckdb.connect(str(path))
    for q in sql:
        c.execute(q)
    c.close()


NOT_DUCKDB = [
    ("text", lambda p: p.write_text("schema_version: 1\ndeployments: []\n"), "it looks like text"),
    ("sqlite", _sqlite, "it looks like a SQLite database"),
    ("parquet", lambda p: p.write_bytes(b"PAR1" + b"\0" * 200), "it looks like a Parquet file"),
    ("binary", lambda p: p.write_bytes(bytes(range(256)) * 4), "it looks like another binary file"),
    ("short", lambda p: p.write_bytes(b"DU"), "is not a DuckDB database"),
]


@pytest.mark.parametrize("name,make,message", NOT_DUCKDB, ids=[c[0] for c in NOT_DUCKDB])
@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_a_file_that_is_not_a_duckdb_database_is_never_opened(tmp_path, name, make, message, read_only):
    path = tmp_path / "store.duckdb"
    make(path)
    msg = refused(path, StoreCorruptError, read_only)
    assert message in msg and "It was left untouched" in msg
    assert not (tmp_path / "store.duckdb.wal").exists()


FOREIGN = [
    ("another program's tables", ["CREATE TABLE users (id INTEGER, email VARCHAR)"],
     "is a DuckDB database of something else (tables: users); TableTune adds nothing to it"),
    ("same table name, other columns", ["CREATE TABLE publications (deployment VARCHAR, v DOUBLE)"],
     "table 'publications' does not have TableTune's columns (unexpected: v DOUBLE; missing: "),
    ("same column names, other types", ["CREATE TABLE engine_identities (identity_key INTEGER)"],
     "table 'engine_identities' does not have TableTune's columns (unexpected: identity_key INTEGER"),
    ("a view where a table belongs", ["CREATE TABLE t (x INTEGER)", "CREATE VIEW publications AS SELECT * FROM t"],
     "publications"),
]


@pytest.mark.parametrize("name,sql,message", FOREIGN, ids=[c[0] for c in FOREIGN])
def test_a_duckdb_database_of_something_else_is_refused_and_left_as_it_was(tmp_path, name, sql, message):
    path = tmp_path / "store.duckdb"
    _duckdb(path, *sql)
    msg = refused(path)
    assert message in msg, msg
    # Nothing was added: the database still has only its own tables.
    with duckdb.connect(str(path), read_only=True) as c:
        tables = {r[0] for r in c.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "step_time_cells" not in tables


def test_read_only_on_a_foreign_database_says_it_is_not_a_store(tmp_path):
    path = tmp_path / "store.duckdb"
    _duckdb(path, "CREATE TABLE users (id INTEGER)")
    assert "is not a TableTune store: it has no table(s) acceptance_priors" in refused(path, read_only=True)


def test_read_only_never_creates_or_alters_the_store(tmp_path):
    path = tmp_path / "tt.duckdb"
    with pytest.raises(NotFoundError, match=f"no TableTune store at {path}"):
        TableTuneStore(path, read_only=True)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    TableTuneStore(path).write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=1, median_ms=5.0,
                                                                 repetitions_ms=(5.0,)))
    before = snapshot(tmp_path)
    ro = TableTuneStore(path, read_only=True)
    assert ro.identity_keys() == [IDENT.key] and len(ro.profile_cells(IDENT.key)) == 1
    with pytest.raises(StoreError, match="was opened read-only"):
        ro.write_profile_cell(IDENT, StepTimeCell(k=2, batch_size=1, median_ms=6.0, repetitions_ms=(6.0,)))
    assert snapshot(tmp_path) == before


def test_an_older_store_read_only_is_named_not_a_binder_error(tmp_path):
    path = tmp_path / "tt.duckdb"
    TableTuneStore(path)
    _duckdb(path, "ALTER TABLE publications DROP COLUMN note")  # as if written before the column existed
    msg = refused(path, read_only=True)
    assert "table 'publications' does not have TableTune's columns (missing: note VARCHAR)" in msg
    assert "open it once with a writing command" in msg


# -- the read-only commands ----------------------------------------------------------------------------

def test_table_and_show_do_not_create_or_alter_the_store(run_cli, home):
    db = home / "tabletune_store.duckdb"
    assert_one_error(run_cli("table"), f"no TableTune store at {db}")
    assert_one_error(run_cli("show"), "does not exist; publish one")
    assert not db.exists()
    seed_store(db)
    before = snapshot(home)
    for args in (["table"], ["table", "--format", "vllm"]):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr
    assert_one_error(run_cli("show"), "does not exist; publish one")
    assert snapshot(home) == before  # same bytes, same mtime: opened read-only


@pytest.mark.parametrize("name,make,message", [NOT_DUCKDB[0], NOT_DUCKDB[1]], ids=["text", "sqlite"])
def test_the_cli_names_a_foreign_store_without_a_traceback(run_cli, home, name, make, message):
    db = home / "foreign.db"
    make(db)
    before = snapshot(home)
    assert_one_error(run_cli("--db", db, "table"), str(db), message)
    assert snapshot(home) == before


def test_the_cli_names_a_duckdb_file_of_something_else(run_cli, home):
    db = home / "other.duckdb"
    _duckdb(db, "CREATE TABLE users (id INTEGER)")
    before = snapshot(home)
    assert_one_error(run_cli("--db", db, "table"), str(db), "is not a TableTune store")
    assert snapshot(home) == before

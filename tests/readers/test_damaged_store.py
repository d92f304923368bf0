"""A DuckDB store file that is truncated or damaged past its header.

Before: a store cut to 20-70 % of its size opened fine and failed at the first query that reached a
lost block, as a ``duckdb.IOException`` traceback; a writing command could even extend the damaged
file. Now opening checks that every block the database uses lies inside the file (DuckDB's own
pragmas say which), and any DuckDB error that says the file cannot be read back becomes a
``StoreCorruptError`` naming the file. Reading or writing, the file is byte-identical afterwards."""

from __future__ import annotations

import duckdb
import pytest

from tabletune_pipelines.formats.documents import StepTimeCell
from tabletune_pipelines.errors import StoreCorruptError, TableTuneError
from tabletune_pipelines.store import TableTuneStore
from tests.cli.conftest import seed_store
from tests.readers.conftest import assert_one_error, snapshot

FRACTIONS = [0.05, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99]


@pytest.fixture(scope="module")
def seeded_bytes(tmp_path_factory):
    """The bytes of a seeded store (one profile, one prior) and its identity key."""
    import os

    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("TABLETUNE_HOME")
    os.environ["TABLETUNE_HOME"] = str(home)
    try:
        db = home / "tt.duckdb"
        key = seed_store(db)
    finally:
        if old is None:
            del os.environ["TABLETUNE_HOME"]
        else:
            os.environ["TABLETUNE_HOME"] = old
    return db.read_bytes(), key


def everything(store: TableTuneStore, key: str) -> None:
    """Every read a command makes of the seeded store."""
    store.identity_keys()
    store.load_profile(key)
    store.latest_acceptance_prior()
    store.acceptance_prior_ids()
    store.publications("local-cpu")
    store.table_ids()


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_a_truncated_store_is_refused_naming_the_file_and_left_as_it_was(tmp_path, seeded_bytes, fraction, read_only):
    raw, key = seeded_bytes
    db = tmp_path / "tt.duckdb"
    db.write_bytes(raw[: int(len(raw) * fraction)])
    before = snapshot(tmp_path)
    with pytest.raises(StoreCorruptError) as err:
        store = TableTuneStore(db, read_only=read_only)
        everything(store, key)
        store.write_profile_cell(store.identity(key), StepTimeCell(k=1, batch_size=2, median_ms=5.0,
                                                                   repetitions_ms=(5.0,)))
    msg = str(err.value)
    assert isinstance(err.value, TableTuneError)
    assert msg.startswith(f"{db} is damaged (truncated"), msg
    assert "It was left untouched" in msg
    assert snapshot(tmp_path) == before  # not extended, no .wal beside it


def test_the_whole_file_still_opens(tmp_path, seeded_bytes):
    raw, key = seeded_bytes
    db = tmp_path / "tt.duckdb"
    db.write_bytes(raw)
    everything(TableTuneStore(db, read_only=True), key)
    TableTuneStore(db)  # and for writing


def test_a_block_that_fails_its_checksum_is_refused_on_reading(tmp_path, seeded_bytes):
    raw, key = seeded_bytes
    db = tmp_path / "tt.duckdb"
    db.write_bytes(raw)
    with duckdb.connect(str(db), read_only=True) as c:  # the block the acceptance priors are in
        (block_id,) = c.execute("SELECT max(block_id) FROM pragma_storage_info('acceptance_priors')").fetchone()
        (size,) = c.execute("SELECT block_size FROM pragma_database_size()").fetchone()
    damaged = bytearray(raw)
    block = 3 * 4096 + block_id * size
    damaged[block + 100: block + 164] = bytes(64)
    db.write_bytes(bytes(damaged))
    before = snapshot(tmp_path)
    with pytest.raises(StoreCorruptError, match=f"{db} is damaged \\(truncated or corrupt\\): DuckDB cannot read it "
                                                "back .*Corrupt database file"):
        everything(TableTuneStore(db, read_only=True), key)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.7])
def test_the_cli_prints_one_error_line(run_cli, home, seeded_bytes, fraction):
    raw, key = seeded_bytes
    db = home / "tt.duckdb"
    db.write_bytes(raw[: int(len(raw) * fraction)])
    before = snapshot(home)
    err = assert_one_error(run_cli("--db", db, "table", "--identity", key, "--format", "vllm"),
                           f"error: {db} is damaged (truncated)")
    assert "IOException" not in err
    assert snapshot(home) == before

"""DuckDB store: profile cells, acceptance priors, tables and publications.

Every write is one transaction, and re-measuring a cell replaces it (delete + insert of the
cell's key inside the transaction), so a writer killed mid-way leaves the previous committed
state. With a file path, connections are short-lived so other processes can use the file between
writes; a lock held by another process is retried for ``lock_timeout_s`` and then reported with
the holder's details. Tables live in the default ``main`` schema (a schema named like the file
would be ambiguous in DuckDB).

Opening checks the file before using it: a file that is not a DuckDB database (its header lacks
DuckDB's magic bytes: a text file, a SQLite or Parquet file) is a ``StoreCorruptError`` and is
never opened by DuckDB (which would attach SQLite files through an extension, or read a Parquet
file as an empty database); a DuckDB database whose tables are not TableTune's (another program's,
or tables of the same names with other columns) is a ``StoreError`` naming the table and columns,
and TableTune adds nothing to it. ``TableTuneStore(path, read_only=True)`` never creates or alters
the file: read-only commands use it, and a missing file is a ``NotFoundError``.


``TableTuneStore`` owns the connection: it opens the file, creates and checks the schema
(``store/schema.py``) and runs every read and every transaction. Its methods come from one group of
tables each: engine identities and served calibrations (``store/identities.py``), step-time profiles
(``store/profiles.py``), acceptance priors (``store/priors.py``), draft-length tables and publications
(``store/publications.py``).

``store/`` holds every SQL statement of the project: callers ask for what they need by a method
whose name says what it returns. A lookup of something that is not there (an identity key, a
prior id, a table id, a profile) raises ``NotFoundError`` naming what was asked for and what the
store does have; "latest ..." queries return None when there is nothing yet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tabletune_pipelines.errors import NotFoundError, StoreError, StoreLockedError, UnwritablePathError
from tabletune_pipelines.store.identities import IdentityTables
from tabletune_pipelines.store.priors import PriorTables
from tabletune_pipelines.store.profiles import ProfileTables
from tabletune_pipelines.store.publications import PublicationTables
from tabletune_pipelines.store.schema import (
    CONNECT_CONFIG,
    check_duckdb_file,
    check_not_truncated,
    check_schema,
    create_schema,
    damaged_store_error,
    quiet,
    refuse_foreign,
    translate_duckdb_error,
)


def _writable_folder(folder: Path) -> None:
    """Create the store's folder where missing; ``UnwritablePathError`` when that fails or it cannot be
    written (DuckDB writes the store and its ``.wal`` file there)."""
    fix = ("make it writable, or point TABLETUNE_DUCKDB / --db (or TABLETUNE_HOME, where the store lives by "
           "default) at a writable folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnwritablePathError(f"cannot create the store's folder {folder} ({exc.strerror or exc}); {fix}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UnwritablePathError(f"the store's folder {folder} is not writable; {fix}")


class TableTuneStore(ProfileTables, PublicationTables, IdentityTables, PriorTables):
    """Reads and writes TableTune's tables in one DuckDB database.

    ``TableTuneStore(path)`` opens a short-lived connection per operation.
    ``TableTuneStore.on(connection_factory)`` uses connections from elsewhere, e.g. Dagster's
    ``DuckDBResource.get_connection``.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout_s: float = 10.0, read_only: bool = False) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.read_only = read_only
        """Opened read-only: the file is never created or altered, and writing methods raise StoreError."""
        self._factory: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]] | None = None
        if read_only and not self.path.exists():
            raise NotFoundError(f"no TableTune store at {self.path}: nothing is measured yet (or pass --db / set "
                                "TABLETUNE_DUCKDB to the store)")
        check_duckdb_file(self.path)
        if not read_only:
            _writable_folder(self.path.parent)
        with self._connect() as conn:
            self._prepare(conn)

    @classmethod
    def on(
        cls, connection_factory: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]],
        path: str = "<resource>",
    ) -> TableTuneStore:
        store = cls.__new__(cls)
        store.path = Path(path)
        store.lock_timeout_s = 0.0
        store.read_only = False
        store._factory = connection_factory
        if path != "<resource>":
            check_duckdb_file(store.path)
        with store._connect() as conn:
            store._prepare(conn)
        return store

    def _prepare(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Check the schema, creating TableTune's tables first unless read-only. Creation and the
        check are one transaction, so a refused database is left exactly as it was; DuckDB's own
        errors (a view where a table belongs, a type clash) become a StoreError."""
        try:
            if self.path != Path("<resource>"):
                check_not_truncated(self.path, conn)  # before anything is written to it
            if self.read_only:
                check_schema(self.path, conn, read_only=True)
                return
            conn.execute("BEGIN TRANSACTION")
            try:
                refuse_foreign(self.path, conn)
                create_schema(conn)
                check_schema(self.path, conn, read_only=False)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except duckdb.Error as exc:
            damaged = damaged_store_error(self.path, exc)
            if damaged is not None:
                raise damaged from None
            raise StoreError(f"{self.path} is a DuckDB database TableTune cannot use: {exc}. It was left as it was; "
                             "point TABLETUNE_DUCKDB / --db at TableTune's own store file") from None

    # -- connections -----------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._factory is not None:
            with self._factory() as conn:
                try:
                    quiet(conn)
                    yield conn
                except duckdb.Error as exc:
                    damaged = damaged_store_error(self.path, exc)
                    if damaged is None:
                        raise
                    raise damaged from None
            return
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                conn = duckdb.connect(str(self.path), read_only=getattr(self, "read_only", False),
                                      config=CONNECT_CONFIG)
                break
            except duckdb.Error as exc:
                err = translate_duckdb_error(self.path, exc)
                if isinstance(err, StoreLockedError) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise err from None
        try:
            quiet(conn)
            yield conn
        except duckdb.Error as exc:  # a file truncated or damaged past its header fails only when read
            damaged = damaged_store_error(self.path, exc)
            if damaged is None:
                raise
            raise damaged from None
        finally:
            conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if getattr(self, "read_only", False):
            raise StoreError(f"the store {self.path} was opened read-only; this command cannot write to it")
        with self._connect() as conn:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read query (plain SQL) and return all rows: for tests and ad-hoc inspection; the
        project's own reads are the named methods below."""
        with self._connect() as conn:
            return conn.execute(sql, params or []).fetchall()

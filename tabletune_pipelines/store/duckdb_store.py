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

This module holds every SQL statement of the project: callers ask for what they need by a method
whose name says what it returns. A lookup of something that is not there (an identity key, a
prior id, a table id, a profile) raises ``NotFoundError`` naming what was asked for and what the
store does have; "latest ..." queries return None when there is nothing yet.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb

from tabletune_pipelines.core.served_calibration import ServedCalibration
from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.errors import (
    DocumentError,
    NotFoundError,
    StoreCorruptError,
    StoredDataError,
    StoreError,
    StoreLockedError,
    TableTuneError,
    UnwritablePathError,
)
from tabletune_pipelines.formats.documents import (
    AcceptancePrior,
    DraftLengthTable,
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
    check_sample,
    check_samples,
)
from tabletune_pipelines.formats.published import (
    VERSION,
    PublishedVersion,
    check_publish_targets,
    controller_fields,
    publication_lock,
    published_document,
    speculative_config_path,
    write_published_table,
    write_speculative_config_companion,
)
from tabletune_pipelines.formats.strict_io import NotRegularFileError, atomic_write_bytes, open_regular
from tabletune_pipelines.vocab import DEFAULT_PROFILE_MODE, PROFILE_MODES, is_profile_mode

#: How many existing ids a NotFoundError lists.
_LISTED = 10
#: How often ``publish`` tries the next version when other publishers keep taking it.
_PUBLISH_ATTEMPTS = 5

@dataclass(frozen=True)
class _PublicationRow:
    """The ``publications`` row of one publication."""

    deployment: str
    version: int
    table_id: str
    path: Path
    published_at: datetime
    note: str | None


def _previous_bytes(path: Path) -> bytes | None:
    """What a publication replaces at ``path`` (None: nothing is there). Publishing has checked that it
    is TableTune's own file, a regular file of bounded size."""
    try:
        with open_regular(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _restore(path: Path, data: bytes | None) -> None:
    """Put ``path`` back as it was before a publication that failed (best effort: the failure is
    what the user is told about)."""
    try:
        if data is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_bytes(path, data)
    except OSError:
        pass


SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS engine_identities (
    identity_key   VARCHAR PRIMARY KEY,
    gpu            VARCHAR NOT NULL,
    vllm_version   VARCHAR NOT NULL,
    model          VARCHAR NOT NULL,
    drafter        VARCHAR,
    method         VARCHAR NOT NULL,
    max_k          INTEGER NOT NULL,
    max_num_seqs   INTEGER NOT NULL,
    identity_json  VARCHAR NOT NULL,
    first_seen     TIMESTAMP NOT NULL
);
-- One row per measured cell; k IS NULL is the no-speculation baseline.
CREATE TABLE IF NOT EXISTS step_time_cells (
    identity_key   VARCHAR NOT NULL,
    mode           VARCHAR NOT NULL,
    acceptance     VARCHAR NOT NULL,
    k              INTEGER,
    batch_size     INTEGER NOT NULL,
    median_ms      DOUBLE NOT NULL,
    spread         DOUBLE NOT NULL,
    repetitions_ms DOUBLE[] NOT NULL,
    launch_k       INTEGER,
    timing         VARCHAR NOT NULL,
    measured_at    TIMESTAMP NOT NULL,
    stderr_ms      DOUBLE          -- standard error of median_ms (NULL: < 2 repetitions, or an older store)
);
-- Steps timed with prefill in them (the served step-cost fit, core/stepcost.py); one row a step.
CREATE TABLE IF NOT EXISTS step_samples (
    identity_key   VARCHAR NOT NULL,
    mode           VARCHAR NOT NULL,
    batch_size     INTEGER NOT NULL,
    k              INTEGER NOT NULL,
    decode_tokens  INTEGER NOT NULL,
    prefill_tokens INTEGER NOT NULL,
    ms             DOUBLE NOT NULL,
    measured_at    TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS acceptance_priors (
    prior_id           VARCHAR PRIMARY KEY,
    deployment         VARCHAR,
    week               VARCHAR,
    identity_key       VARCHAR,
    source             VARCHAR NOT NULL,
    rates              DOUBLE[] NOT NULL,
    num_drafts         BIGINT NOT NULL,
    prompt_fingerprint VARCHAR NOT NULL,
    prompt_count       INTEGER NOT NULL,
    temperature        DOUBLE NOT NULL,
    prior_json         VARCHAR NOT NULL,
    measured_at        TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS draft_length_tables (
    table_id             VARCHAR PRIMARY KEY,
    identity_key         VARCHAR NOT NULL,
    prior_id             VARCHAR NOT NULL,
    ranges_json          VARCHAR NOT NULL,
    max_num_seqs         INTEGER NOT NULL,
    max_k                INTEGER NOT NULL,
    predicted_worst_loss DOUBLE NOT NULL,
    table_json           VARCHAR NOT NULL,
    created_at           TIMESTAMP NOT NULL
);
-- Served wall time per step of fixed k from a served verification (core/stepcost.py, ServedCalibration):
-- the next derive of the identity corrects its served price with the newest row.
CREATE TABLE IF NOT EXISTS served_calibrations (
    identity_key     VARCHAR NOT NULL,
    measured_at      TIMESTAMP NOT NULL,
    calibration_json VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS publications (
    deployment    VARCHAR NOT NULL,
    version       INTEGER NOT NULL,
    table_id      VARCHAR NOT NULL,
    path          VARCHAR NOT NULL,
    published_at  TIMESTAMP NOT NULL,
    note          VARCHAR,
    identity_json VARCHAR,         -- the published file's "identity" (NULL: none, or an older store)
    prior_json    VARCHAR,         -- the published file's "prior" (NULL: none, or an older store)
    PRIMARY KEY (deployment, version)
);
"""


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _listing(what: str, ids: list[str], how: str) -> str:
    """``"; the store has: a, b, ... (N in all)"`` or what to do when it has none."""
    if not ids:
        return f"; the store has no {what} yet ({how})"
    more = f", ... ({len(ids)} in all)" if len(ids) > _LISTED else ""
    return f"; the store has: {', '.join(ids[:_LISTED])}{more}"


#: DuckDB's file header: an 8-byte checksum, then these magic bytes.
_DUCKDB_MAGIC, _MAGIC_AT = b"DUCK", 8
#: No extension is downloaded or loaded behind the store's back (DuckDB would otherwise fetch
#: sqlite_scanner to open a SQLite file given as the store).
_CONNECT_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False}


def _quiet(conn: duckdb.DuckDBPyConnection) -> None:
    """No progress bar: DuckDB draws one on stdout for any query over 2 s (a loaded machine), which
    would land in ``tabletune table --format vllm``'s JSON or a caller's line protocol."""
    conn.execute("SET enable_progress_bar = false")


#: Columns added after the first stores were written: (table, column, type). Opening a store for
#: writing adds them (NULL in old rows); a read-only open of an older store reads NULL for them.
#: Tables added after the first stores were written: a writing open creates them (``SCHEMA_SQL``), a
#: read-only open of an older store finds them absent and reads nothing from them.
MIGRATED_TABLES: frozenset[str] = frozenset({"step_samples", "served_calibrations"})
MIGRATED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step_time_cells", "stderr_ms", "DOUBLE"),
    ("publications", "identity_json", "VARCHAR"),
    ("publications", "prior_json", "VARCHAR"),
)


def _create_schema(conn: duckdb.DuckDBPyConnection) -> None:
    """Create TableTune's tables where missing. Migrations of older stores go here too, so the
    schema check after it (and ``_expected_schema``) sees the current schema."""
    conn.execute(SCHEMA_SQL)
    tables = {r[0] for r in conn.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                         "current_database() AND schema_name = 'main'").fetchall()}
    for table, column, typ in MIGRATED_COLUMNS:
        if table in tables:  # a view of that name is not altered: the schema check names it
            conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {typ}")


def _columns(conn: duckdb.DuckDBPyConnection) -> dict[str, set[tuple[str, str]]]:
    """Every table of the current database's ``main`` schema → its (column, type) pairs."""
    out: dict[str, set[tuple[str, str]]] = {}
    for (name,) in conn.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                                "AND schema_name = 'main'").fetchall():
        out[name] = set()
    for name, col, typ in conn.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE "
                                       "database_name = current_database() AND schema_name = 'main'").fetchall():
        out.setdefault(name, set()).add((col, typ))
    for (name,) in conn.execute("SELECT view_name FROM duckdb_views() WHERE database_name = current_database() "
                                "AND schema_name = 'main' AND NOT internal").fetchall():
        out.setdefault(name, {("<a view>", "")})
    return out


@functools.cache
def _expected_schema() -> dict[str, frozenset[tuple[str, str]]]:
    """TableTune's tables and columns, as DuckDB itself reports them for ``_create_schema``."""
    conn = duckdb.connect(":memory:", config=_CONNECT_CONFIG)
    try:
        _create_schema(conn)
        return {t: frozenset(cols) for t, cols in _columns(conn).items()}
    finally:
        conn.close()


def refuse_foreign(path: str | os.PathLike[str], conn: duckdb.DuckDBPyConnection) -> None:
    """Before creating anything: a database with tables of which none is TableTune's belongs to
    something else, and TableTune adds nothing to it (``StoreError``)."""
    have, want = _columns(conn), _expected_schema()
    if have and not set(have) & set(want):
        raise StoreError(
            f"{path} is a DuckDB database of something else (tables: {', '.join(sorted(have)[:10])}); TableTune "
            "adds nothing to it. Point TABLETUNE_DUCKDB / --db at TableTune's own store file")


def check_schema(path: str | os.PathLike[str], conn: duckdb.DuckDBPyConnection, *, read_only: bool) -> None:
    """``StoreError`` unless each of TableTune's tables is there with exactly TableTune's columns and
    types (in any order), so no query of the store can fail with a binder error."""
    want, have = _expected_schema(), _columns(conn)
    missing = sorted(set(want) - set(have))
    if read_only:  # an older store opened read-only lacks tables added later; reads find nothing there
        missing = [t for t in missing if t not in MIGRATED_TABLES]
    if missing:
        raise StoreError(
            f"{path} is not a TableTune store: it has no table(s) {', '.join(missing)}. Point TABLETUNE_DUCKDB / --db "
            "at TableTune's store" + (", or create one with a writing command (tabletune profile / acceptance)"
                                      if read_only else ""))
    for table in sorted(set(want) & set(have)):
        extra, lacking = sorted(have[table] - want[table]), sorted(want[table] - have[table])
        if read_only:  # an older store opened read-only lacks the migrated columns; reads give NULL there
            lacking = [(c, t) for c, t in lacking if (table, c, t) not in MIGRATED_COLUMNS]
        if not (extra or lacking):
            continue
        what = "; ".join(part for part in (
            f"unexpected: {', '.join(f'{c} {t}'.strip() for c, t in extra)}" if extra else "",
            f"missing: {', '.join(f'{c} {t}' for c, t in lacking)}" if lacking else "") if part)
        hint = ("it may be a store of an older TableTune: open it once with a writing command (tabletune profile or "
                "acceptance, or a pipeline run) to upgrade it" if read_only and lacking and not extra
                else "it was not written by this TableTune; point TABLETUNE_DUCKDB / --db at another file")
        raise StoreError(f"{path}: table {table!r} does not have TableTune's columns ({what}). It was left as it "
                         f"was; {hint}")


def check_duckdb_file(path: str | os.PathLike[str]) -> None:
    """``StoreCorruptError`` unless ``path`` is absent, empty, or a regular file that starts with
    DuckDB's header (a named pipe or device is never opened: ``strict_io.open_regular``)."""
    try:
        with open_regular(path) as fh:
            head = fh.read(16)
    except (FileNotFoundError, NotADirectoryError):  # absent (a folder above it may be a file: named on creation)
        return
    except IsADirectoryError:
        raise StoreError(f"the store path {path} is a directory; pass a DuckDB file "
                         "(--db or TABLETUNE_DUCKDB)") from None
    except NotRegularFileError as exc:
        raise StoreError(f"the store path {path} is {exc.kind}, not a DuckDB file; it was not opened. Pass a "
                         "DuckDB file (--db or TABLETUNE_DUCKDB)") from None
    except OSError as exc:
        raise StoreError(f"cannot read the store {path}: {exc.strerror or exc}") from None
    if head and head[_MAGIC_AT:_MAGIC_AT + len(_DUCKDB_MAGIC)] != _DUCKDB_MAGIC:
        kind = ("a SQLite database" if head.startswith(b"SQLite format") else "a Parquet file"
                if head.startswith(b"PAR1") else "text" if head.isascii() and head.decode("ascii").isprintable()
                else "another binary file")
        raise StoreCorruptError(
            f"{path} exists but is not a DuckDB database (it looks like {kind}). It was left untouched; point "
            "TableTune at another file (--db or TABLETUNE_DUCKDB) or move this one aside.")


#: DuckDB's words for a file it cannot read back: truncated (short reads) or damaged (checksums).
_DAMAGED = ("could not read enough bytes", "corrupt database file", "does not match stored checksum")


def damaged_store_error(path: str | os.PathLike[str], exc: BaseException) -> StoreError | None:
    """The store error for a DuckDB error that says the file itself cannot be read (None otherwise):
    a truncated or damaged file is a ``StoreCorruptError``, another I/O error a ``StoreError``;
    both name the file. Errors of any other kind are TableTune's or DuckDB's own, and stay raised."""
    msg = " ".join(str(exc).split())
    if any(word in msg.lower() for word in _DAMAGED):
        return StoreCorruptError(
            f"{path} is damaged (truncated or corrupt): DuckDB cannot read it back ({msg:.300}). It was left "
            "untouched; restore it from a backup, or move it aside (a writing command then starts a new store)")
    if isinstance(exc, duckdb.IOException):
        return StoreError(f"cannot use the store {path}: {msg:.300}")
    return None


def translate_duckdb_error(path: str | os.PathLike[str], exc: BaseException) -> StoreError:
    """Turn DuckDB's open errors into actionable store errors."""
    msg = str(exc)
    damaged = damaged_store_error(path, exc)
    if damaged is not None and not ("Could not set lock" in msg or "Conflicting lock" in msg):
        return damaged
    if "Could not set lock" in msg or "Conflicting lock" in msg:
        return StoreLockedError(
            f"DuckDB file {path} is locked by another process ({msg.split(':', 1)[-1].strip()}). "
            "Wait for that writer to finish (a running profile or Dagster run), or stop it; "
            "readers outside the pipeline should read the published export, not the live database."
        )
    if "not a valid DuckDB database" in msg or "invalid" in msg.lower() and "database" in msg.lower():
        return StoreCorruptError(
            f"{path} exists but is not a DuckDB database ({msg}). It was left untouched; point "
            "TableTune at another file or move this one aside."
        )
    return StoreError(f"cannot open DuckDB file {path}: {msg}")


#: DuckDB's file layout: three 4 kB headers, then the blocks, block i at ``_BLOCK_START + i * block size``.
_BLOCK_START = 3 * 4096


def check_not_truncated(path: str | os.PathLike[str], conn: duckdb.DuckDBPyConnection) -> None:
    """``StoreCorruptError`` when the file ends before the last block TableTune's tables use.

    A file cut short past the blocks DuckDB reads on connecting opens fine, and its lost blocks fail
    only when a query reaches them (a read) or are silently overwritten (a write: the store would
    then hold garbage). DuckDB's own pragmas say how many blocks are in use and which each table's
    data is in; all of them must lie inside the file (free blocks do not count: DuckDB trims those
    off the end itself). A DuckDB version without these pragmas
    is not checked here; its queries still fail as ``StoreCorruptError`` (``damaged_store_error``).
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    tables = sorted(set(_columns(conn)) & set(_expected_schema()))
    try:
        block_size, used = conn.execute("SELECT block_size, used_blocks FROM pragma_database_size() "
                                        "WHERE database_name = current_database()").fetchone() or (0, 0)
        top = -1
        for table in tables:  # names from DuckDB's own catalog that are TableTune's: no quoting needed
            for block, extra in conn.execute("SELECT block_id, additional_block_ids FROM "
                                             f"pragma_storage_info('{table}') WHERE block_id >= 0").fetchall():
                top = max(top, int(block), *(int(b) for b in extra or ()))
    except (duckdb.BinderException, duckdb.CatalogException, duckdb.NotImplementedException):
        return  # another DuckDB's pragmas: not checked here
    # Every block in use lies inside the file: at least ``used`` of them, and the highest a table names.
    blocks = max(top + 1, int(used or 0))
    need = _BLOCK_START + blocks * int(block_size or 0)
    if blocks and size < need:
        raise StoreCorruptError(
            f"{path} is damaged (truncated): it has {size} bytes, but the {blocks} blocks its database uses end at "
            f"byte {need}. It was left untouched; restore it from a backup, or move it aside (a writing command then "
            "starts a new store)")


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


class TableTuneStore:
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
        cls,
        connection_factory: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]],
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
                _create_schema(conn)
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
                    _quiet(conn)
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
                                      config=_CONNECT_CONFIG)
                break
            except duckdb.Error as exc:
                err = translate_duckdb_error(self.path, exc)
                if isinstance(err, StoreLockedError) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise err from None
        try:
            _quiet(conn)
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

    # -- identities --------------------------------------------------------------------------
    def upsert_identity(self, identity: EngineIdentity) -> str:
        with self._transaction() as conn:
            self._insert_identity(conn, identity)
        return identity.key

    @staticmethod
    def _insert_identity(conn: duckdb.DuckDBPyConnection, identity: EngineIdentity) -> None:
        key = identity.key
        if not conn.execute("SELECT 1 FROM engine_identities WHERE identity_key = ?", [key]).fetchone():
            conn.execute(
                "INSERT INTO engine_identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [key, identity.gpu, identity.vllm_version, identity.model, identity.drafter, identity.method,
                 identity.max_k, identity.max_num_seqs, identity.to_json(), _now()],
            )

    def find_identity(self, identity_key: str) -> EngineIdentity | None:
        """The stored identity with this key, or None."""
        row = self.query("SELECT identity_json FROM engine_identities WHERE identity_key = ?", [identity_key])
        return EngineIdentity.from_json(row[0][0]) if row else None

    def identity(self, identity_key: str) -> EngineIdentity:
        """The stored identity with this key; NotFoundError lists the stored keys."""
        ident = self.find_identity(identity_key)
        if ident is None:
            raise NotFoundError(f"engine identity {identity_key!r} is not in {self.path}"
                                + _listing("engine identities", self.identity_keys(), "profile one first"))
        return ident

    def has_identity(self, identity_key: str) -> bool:
        return self.find_identity(identity_key) is not None

    def identity_keys(self) -> list[str]:
        """Every stored identity key, sorted."""
        return [r[0] for r in self.query("SELECT identity_key FROM engine_identities ORDER BY identity_key")]

    def latest_profiled_identity_key(self, model: str) -> str | None:
        """Key of the identity of ``model`` whose step-time cells were measured last, or None."""
        rows = self.query(
            "SELECT c.identity_key FROM step_time_cells c JOIN engine_identities i USING (identity_key) "
            "WHERE i.model = ? GROUP BY c.identity_key ORDER BY max(c.measured_at) DESC LIMIT 1", [model])
        return rows[0][0] if rows else None

    # -- step-time cells ---------------------------------------------------------------------
    def write_profile_cell(self, identity: EngineIdentity, cell: StepTimeCell, mode: str = "one_launch") -> None:
        """Store one measured cell, replacing an earlier measurement of the same cell."""
        self.write_profile_cells(identity, [cell], mode)

    def write_profile_cells(self, identity: EngineIdentity, cells: list[StepTimeCell],
                            mode: str = "one_launch") -> None:
        with self._transaction() as conn:
            self._insert_identity(conn, identity)
            for cell in cells:
                self._insert_cell(conn, identity.key, mode, cell)

    @staticmethod
    def _insert_cell(conn: duckdb.DuckDBPyConnection, key: str, mode: str, cell: StepTimeCell) -> None:
        conn.execute(
            "DELETE FROM step_time_cells WHERE identity_key = ? AND mode = ? AND acceptance = ? "
            "AND k IS NOT DISTINCT FROM ? AND batch_size = ?",
            [key, mode, cell.acceptance, cell.k, cell.batch_size],
        )
        conn.execute(
            "INSERT INTO step_time_cells (identity_key, mode, acceptance, k, batch_size, median_ms, spread, "
            "repetitions_ms, launch_k, timing, measured_at, stderr_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [key, mode, cell.acceptance, cell.k, cell.batch_size, cell.median_ms, cell.spread,
             list(cell.repetitions_ms), cell.launch_k, cell.timing, _now(), cell.stderr_ms],
        )

    def profile_cells(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> list[StepTimeCell]:
        """The measured cells of one identity in one profile mode (empty if none)."""
        # A store opened read-only may predate the stderr_ms column: NULL there, and the cell
        # recomputes the standard error from its repetitions.
        stderr = "stderr_ms" if self._has_column("step_time_cells", "stderr_ms") else "NULL"
        rows = self.query(
            f"SELECT k, batch_size, median_ms, repetitions_ms, acceptance, launch_k, timing, {stderr} FROM "
            "step_time_cells WHERE identity_key = ? AND mode = ? ORDER BY acceptance, k NULLS FIRST, batch_size",
            [identity_key, mode],
        )
        cells = []
        for r in rows:
            try:
                cells.append(StepTimeCell(k=r[0], batch_size=r[1], median_ms=r[2], repetitions_ms=tuple(r[3]),
                                          acceptance=r[4], launch_k=r[5], timing=r[6], stderr_ms=r[7]))
            except TableTuneError as exc:  # a row no measurement writes (edited or damaged): never used
                raise StoredDataError(
                    f"{self.path}: the stored step-time cell k={r[0]}, B={r[1]} ({r[4]}, mode {mode!r}) of identity "
                    f"{identity_key!r} cannot be a measurement: {exc} (`tabletune profile "
                    f"{'' if r[0] is None else f'--ks {r[0]} '}--batch-sizes {r[1]}` replaces the row; nothing was "
                    "derived from it)") from None
        return cells

    def _has_column(self, table: str, column: str) -> bool:
        return bool(self.query("SELECT 1 FROM duckdb_columns() WHERE database_name = current_database() AND "
                               "schema_name = 'main' AND table_name = ? AND column_name = ?", [table, column]))

    def profile_modes(self, identity_key: str) -> list[str]:
        """The profile modes with at least one cell of this identity."""
        return [r[0] for r in self.query("SELECT DISTINCT mode FROM step_time_cells WHERE identity_key = ? "
                                         "ORDER BY mode", [identity_key])]

    def write_step_samples(self, identity: EngineIdentity, samples: list[StepSample], mode: str = "one_launch") -> None:
        """Replace the stored mixed-step samples of one identity and mode with ``samples`` (checked by
        ``documents.check_samples`` first, the rule every reader applies: a bad sample writes nothing)."""
        samples = list(check_samples(samples, where=f"mixed-step samples of {identity.key}"))
        self.upsert_identity(identity)
        with self._transaction() as conn:
            self._replace_samples(conn, identity.key, mode, samples)

    @staticmethod
    def _replace_samples(conn: duckdb.DuckDBPyConnection, key: str, mode: str, samples: list[StepSample]) -> None:
        """Replace one identity's samples in ``mode``; each row's ``measured_at`` is a microsecond after the
        one before, so they are read back in the order given (the order the profiler logged them)."""
        conn.execute("DELETE FROM step_samples WHERE identity_key = ? AND mode = ?", [key, mode])
        now = _now()
        for i, s in enumerate(samples):
            conn.execute(
                "INSERT INTO step_samples (identity_key, mode, batch_size, k, decode_tokens, prefill_tokens, ms, "
                "measured_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [key, mode, int(s.batch), int(s.k), int(s.decode_tokens), int(s.prefill_tokens), float(s.ms),
                 now + timedelta(microseconds=i)])

    def write_profiles(self, profiles: list[StepTimeProfile], sources: list[str] | None = None) -> int:
        """Store whole profiles (identity, cells and mixed-step samples) in one transaction: imported
        profiles are all there or none is. A profile replaces the identity's profile in its mode
        whole: every stored cell and sample of that (identity, mode) is deleted and the profile's
        own are written, so the table derived afterwards comes from one measurement, never a mix of
        two (docs/usage.md, "Moving profiles between stores"). Two profiles of one (identity, mode)
        in one call are refused (``DocumentError`` naming both by ``sources``, e.g. the files they were
        read from), and nothing is written. Returns the cells written."""
        names = sources if sources is not None else [f"profiles[{i}]" for i in range(len(profiles))]
        seen: dict[tuple[str, str], int] = {}
        for i, profile in enumerate(profiles):
            where = seen.setdefault((profile.identity.key, profile.mode), i)
            if where != i:
                raise DocumentError(f"{names[where]} and {names[i]} are both the profile of "
                                    f"{profile.identity.key!r} in mode {profile.mode!r}; an import replaces a "
                                    "profile whole, so import one of them; nothing was imported")
        with self._transaction() as conn:
            for profile in profiles:
                key, mode = profile.identity.key, profile.mode
                self._insert_identity(conn, profile.identity)
                conn.execute("DELETE FROM step_time_cells WHERE identity_key = ? AND mode = ?", [key, mode])
                for cell in profile.cells:
                    self._insert_cell(conn, key, mode, cell)
                self._replace_samples(conn, key, mode, list(profile.samples))
        return sum(len(p.cells) for p in profiles)

    def step_samples(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> list[StepSample]:
        """The stored mixed-step samples (empty if none, or an older store opened read-only)."""
        if not self.query("SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND "
                          "schema_name = 'main' AND table_name = 'step_samples'"):
            return []
        rows = self.query("SELECT batch_size, k, decode_tokens, prefill_tokens, ms FROM step_samples WHERE "
                          "identity_key = ? AND mode = ? ORDER BY measured_at, batch_size, k, prefill_tokens, "
                          "decode_tokens, ms", [identity_key, mode])
        out = []
        for b, k, d, p, ms in rows:
            try:
                out.append(check_sample(StepSample(batch=b, k=k, decode_tokens=d, prefill_tokens=p, ms=ms),
                                        where=f"mixed-step sample B={b}, k={k}, P={p}"))
            except TableTuneError as exc:
                raise StoredDataError(f"{self.path}: a stored mixed-step sample of {identity_key!r} cannot be a "
                                      f"measurement: {exc} (profile again to replace it)") from None
        return out

    def load_profile(self, identity_key: str, mode: str = DEFAULT_PROFILE_MODE) -> StepTimeProfile:
        """The step-time profile of one identity in one mode; NotFoundError when it has no cells there."""
        identity = self.identity(identity_key)
        cells = self.profile_cells(identity_key, mode)
        if not cells:
            modes = self.profile_modes(identity_key)
            raise NotFoundError(
                f"engine identity {identity_key!r} has no step-time cells in mode {mode!r} in {self.path}"
                + (f"; it has cells in mode(s) {modes}" if modes else "; profile it first"))
        if not is_profile_mode(mode):  # the check StepTimeProfile makes, here where it narrows the type
            raise DocumentError(f"step-time profile: mode = {mode!r} must be one of {PROFILE_MODES}")
        return StepTimeProfile(identity=identity, cells=tuple(cells), mode=mode,
                               samples=tuple(self.step_samples(identity_key, mode)))

    # -- acceptance priors -------------------------------------------------------------------
    def write_acceptance_prior(self, prior: AcceptancePrior, identity_key: str | None = None) -> str:
        pid = prior.prior_id
        with self._transaction() as conn:
            conn.execute("DELETE FROM acceptance_priors WHERE prior_id = ?", [pid])
            conn.execute(
                "INSERT INTO acceptance_priors VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [pid, prior.deployment, prior.week, identity_key, prior.source, list(prior.rates), prior.num_drafts,
                 prior.prompt_fingerprint, prior.prompt_count, prior.temperature, prior.to_json(), _now()],
            )
        return pid

    def acceptance_prior(self, prior_id: str) -> AcceptancePrior:
        """The prior with this id; NotFoundError lists the newest stored ids."""
        row = self.query("SELECT prior_json FROM acceptance_priors WHERE prior_id = ?", [prior_id])
        if not row:
            raise NotFoundError(f"acceptance prior {prior_id!r} is not in {self.path}"
                                + _listing("acceptance priors", self.acceptance_prior_ids(), "measure one first"))
        return AcceptancePrior.from_json(row[0][0])

    def acceptance_prior_ids(self) -> list[str]:
        """Every stored prior id, newest measurement first."""
        return [r[0] for r in self.query("SELECT prior_id FROM acceptance_priors ORDER BY measured_at DESC, prior_id")]

    def latest_acceptance_prior(self, deployment: str | None = None) -> AcceptancePrior | None:
        """The newest prior (of ``deployment``, if given; of any source), or None."""
        row = self.query(
            "SELECT prior_json FROM acceptance_priors WHERE (? IS NULL OR deployment = ?) "
            "ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
            [deployment, deployment],
        )
        return AcceptancePrior.from_json(row[0][0]) if row else None

    def latest_measured_prior(self, deployment: str, up_to_week: str) -> AcceptancePrior | None:
        """The deployment's newest ``measured`` prior of ``up_to_week`` or earlier (or without a week), or None."""
        rows = self.query("SELECT prior_json FROM acceptance_priors WHERE deployment = ? AND source = 'measured' "
                          "AND (week IS NULL OR week <= ?) ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
                          [deployment, up_to_week])
        return AcceptancePrior.from_json(rows[0][0]) if rows else None

    def applicable_priors(self, identity: EngineIdentity) -> list[AcceptancePrior]:
        """Priors that apply to ``identity``: its own, and those of identities with the same model,
        drafter and method (acceptance does not depend on the GPU or the vLLM version). Newest week
        first; within a week a live (controller-fed) prior before a measured one."""
        rows = self.query(
            """SELECT p.prior_json FROM acceptance_priors p
               LEFT JOIN engine_identities e ON p.identity_key = e.identity_key
               WHERE p.identity_key = ? OR (e.model = ? AND e.drafter IS NOT DISTINCT FROM ? AND e.method = ?)
               ORDER BY p.week DESC NULLS LAST, CASE p.source WHEN 'live' THEN 0 ELSE 1 END, p.measured_at DESC""",
            [identity.key, identity.model, identity.drafter, identity.method],
        )
        return [AcceptancePrior.from_json(text) for (text,) in rows]

    # -- tables and publications -------------------------------------------------------------
    def write_table(self, table: DraftLengthTable) -> str:
        with self._transaction() as conn:
            return self._insert_table(conn, table)

    @staticmethod
    def _insert_table(conn: duckdb.DuckDBPyConnection, table: DraftLengthTable) -> str:
        tid = table.table_id
        conn.execute("DELETE FROM draft_length_tables WHERE table_id = ?", [tid])
        conn.execute(
            "INSERT INTO draft_length_tables VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [tid, table.identity_key, table.prior_id, json.dumps(table.as_vllm()), table.max_num_seqs,
             table.max_k, table.predicted_worst_loss, table.to_json(), _now()],
        )
        return tid

    def table(self, table_id: str) -> DraftLengthTable:
        """The table with this id; NotFoundError lists the newest stored ids."""
        row = self.query("SELECT table_json FROM draft_length_tables WHERE table_id = ?", [table_id])
        if not row:
            raise NotFoundError(f"draft-length table {table_id!r} is not in {self.path}"
                                + _listing("draft-length tables", self.table_ids(), "derive one first"))
        return DraftLengthTable.from_json(row[0][0])

    def table_ids(self) -> list[str]:
        """Every stored table id, newest first."""
        return [r[0] for r in self.query("SELECT table_id FROM draft_length_tables ORDER BY created_at DESC, table_id")]

    def write_served_calibration(self, identity_key: str, calibration: ServedCalibration) -> None:
        """Keep a served verification's fixed-k measurements as the identity's newest calibration."""
        with self._transaction() as conn:
            conn.execute("INSERT INTO served_calibrations (identity_key, measured_at, calibration_json) "
                         "VALUES (?, ?, ?)", [identity_key, _now(), json.dumps(calibration.to_dict())])

    def latest_served_calibration(self, identity_key: str) -> ServedCalibration | None:
        """The identity's newest served calibration (None: none yet, or an older store opened read-only)."""
        if not self.query("SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND "
                          "schema_name = 'main' AND table_name = 'served_calibrations'"):
            return None
        rows = self.query("SELECT calibration_json FROM served_calibrations WHERE identity_key = ? "
                          "ORDER BY measured_at DESC LIMIT 1", [identity_key])
        if not rows:
            return None
        try:
            return ServedCalibration.from_dict(json.loads(rows[0][0]))
        except (TableTuneError, ValueError, TypeError) as exc:
            raise StoredDataError(f"{self.path}: the stored served calibration of {identity_key!r} cannot be read: "
                                  f"{exc} (run the served verification again to replace it)") from None

    def latest_table(self, identity_key: str) -> DraftLengthTable | None:
        """The table derived last for this identity, or None."""
        rows = self.query("SELECT table_json FROM draft_length_tables WHERE identity_key = ? "
                          "ORDER BY created_at DESC LIMIT 1", [identity_key])
        return DraftLengthTable.from_json(rows[0][0]) if rows else None

    def publications(self, deployment: str) -> list[dict[str, Any]]:
        """The deployment's publication rows, oldest version first (empty if none): ``version``,
        ``table_id``, ``path``, ``published_at``, ``note``, and the published file's ``identity`` and
        ``prior`` (dicts; None when the file had none or the row predates their columns)."""
        # A store opened read-only may predate the two columns: NULL there.
        extra = [c if self._has_column("publications", c) else "NULL" for c in ("identity_json", "prior_json")]
        rows = self.query(
            f"SELECT version, table_id, path, published_at, note, {extra[0]}, {extra[1]} FROM publications "
            "WHERE deployment = ? ORDER BY version", [deployment])
        return [dict(zip(("version", "table_id", "path", "published_at", "note"), r[:5], strict=True),
                     identity=json.loads(r[5]) if r[5] else None, prior=json.loads(r[6]) if r[6] else None)
                for r in rows]

    def latest_publication_version(self, deployment: str) -> int:
        """The deployment's highest published version (0: none)."""
        row = self.query("SELECT max(version) FROM publications WHERE deployment = ?", [deployment])
        return int(row[0][0] or 0)

    def publish(
        self,
        deployment: str,
        table: DraftLengthTable,
        export_path: str | os.PathLike[str],
        *,
        base_speculative_config: dict[str, Any] | None = None,
        note: str | None = None,
        document_fields: Mapping[str, Any] | None = None,
        companion: bool = True,
        beside: Mapping[Path, bytes] | None = None,
    ) -> dict[str, Any]:
        """Record a new publication version and atomically export the file the controller reads
        (and, with ``companion``, its ``<stem>.speculative-config.json``).

        ``document_fields``: further keyword arguments of ``published.published_document``; the
        identity and prior among them are recorded with the version (``rollback`` re-publishes them).
        ``beside``: further files the document refers to (the served verification's plot), written
        with the others inside the transaction and put back with them when it fails; the caller has
        checked that each may be replaced. Before anything is written (to the store or the files),
        ``export_path`` and its speculative-config companion must be free or TableTune's own files of
        this deployment (``published.check_publish_targets``): a PublishedTableError leaves both
        untouched.

        One publication of a file at a time: the publication lock beside it
        (``published.publication_lock``) is held from the version allocation to the version row, so
        the file's version and the store's row of that version hold the same table. The version is
        one above both the store's last and the file's (a publish killed after writing the file leaves
        a version the store lacks; the next one must still be newer for the controller), and within
        ``published.VERSION`` (beyond it nothing is written). Everything is checked and built before
        anything is written; then the table row, the version row and the files go in one
        transaction: the files are written inside it, and when a file cannot be written or the commit
        fails, the rows are rolled back and the files put back as they were, so a failed publication
        leaves file and store as they were and a rerun publishes as a first run would. Only a kill
        between the rename and the commit leaves a file ahead of the store (never a recorded version
        without its file). Should another publisher that the lock does not reach (another host on a
        file system without flock) take the version first, the publication is repeated with the next.
        """
        check_publish_targets(export_path, deployment)  # a refusal creates nothing, not even the lock file
        with publication_lock(export_path):
            on_disk = check_publish_targets(export_path, deployment)  # again: what is there now
            # The table's evidence (bounds, boundaries, k within noise) goes beside the table, whose
            # fields stay the ones every reader of the published file knows.
            table_fields, evidence = table.published_parts()
            fields = {"evidence": evidence, **dict(document_fields or {})}
            for _ in range(_PUBLISH_ATTEMPTS):
                version = self._next_version(deployment, on_disk, export_path)
                published_at = _now()
                doc = published_document(
                    PublishedVersion(deployment=deployment, version=version, table=table_fields,
                                     speculative_config=table.speculative_config(base_speculative_config),
                                     published_at=published_at.isoformat() + "Z"),
                    **fields,
                )
                row = _PublicationRow(deployment, version, table.table_id, Path(export_path), published_at, note)
                if self._publish_once(table, row, doc, companion, dict(beside or {})):
                    return doc
                on_disk = version  # taken by another publisher: the file is rewritten with a higher one
        raise StoreError(
            f"publishing {table.table_id} to deployment {deployment!r}: {_PUBLISH_ATTEMPTS} versions in a row were "
            f"taken by other publishers at the same time; {export_path} and the store were left as they were. Stop "
            "the other publishers of this deployment and publish again")

    def _next_version(self, deployment: str, on_disk: int, export_path: str | os.PathLike[str]) -> int:
        """One above both the store's last version and the file's, within ``published.VERSION`` (else
        ``StoreError``: nothing is written)."""
        stored = self.latest_publication_version(deployment)
        version = max(stored, on_disk) + 1
        if VERSION.problem(version) is not None:
            raise StoreError(
                f"publishing to deployment {deployment!r}: the next version would be {version} ({export_path} holds "
                f"v{on_disk}, the store's last is v{stored}), beyond the largest version the store keeps "
                f"({int(VERSION.high)}); nothing was written. Move {export_path} away (the controller then loads the "
                "next file published) and publish again")
        return version

    def _publish_once(self, table: DraftLengthTable, row: _PublicationRow, doc: Mapping[str, Any],
                      companion: bool, beside: dict[Path, bytes]) -> bool:
        """The table row, the version row and the files in one transaction: the files are written
        inside it, and a failure anywhere (a file that cannot be written, a commit that fails) rolls
        the rows back and puts every file back as it was, ``beside`` included. False when the version
        was taken."""
        files = [row.path] + ([speculative_config_path(row.path)] if companion else []) + list(beside)
        before = {p: _previous_bytes(p) for p in files}
        try:
            with self._transaction() as conn:
                self._insert_table(conn, table)
                if not self._insert_publication(conn, row, doc):
                    return False
                for path, data in beside.items():  # first: the published file then refers to what is there
                    atomic_write_bytes(path, data)
                write_published_table(row.path, dict(doc))
                if companion:
                    write_speculative_config_companion(row.path, doc)
        except BaseException:
            for p, old in before.items():
                _restore(p, old)
            raise
        return True

    def _insert_publication(self, conn: duckdb.DuckDBPyConnection, row: _PublicationRow,
                            doc: Mapping[str, Any]) -> bool:
        """Insert the version row; False when that version already exists (another publisher took it)."""
        identity, prior = doc.get("identity"), doc.get("prior")
        if conn.execute("SELECT 1 FROM publications WHERE deployment = ? AND version = ?",
                        [row.deployment, row.version]).fetchone():
            return False
        try:
            conn.execute(
                "INSERT INTO publications (deployment, version, table_id, path, published_at, note, identity_json, "
                "prior_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [row.deployment, row.version, row.table_id, str(row.path), row.published_at, row.note,
                 None if identity is None else json.dumps(identity, sort_keys=True),
                 None if prior is None else json.dumps(prior, sort_keys=True)])
        except (duckdb.ConstraintException, duckdb.TransactionException):
            return False
        except duckdb.Error as exc:
            raise StoreError(f"{self.path} could not record v{row.version} of deployment {row.deployment!r} ({exc}); "
                             f"nothing was published. Publish again once the store can be written") from None
        return True

    def rollback(self, deployment: str, export_path: str | os.PathLike[str],
                 base_speculative_config: dict[str, Any] | None = None,
                 document_fields: Mapping[str, Any] | None = None, *, companion: bool = True) -> dict[str, Any]:
        """Re-publish the table of the version before the current one, as a new version, with the
        engine identity and the prior that version was published with (``document_fields`` supply
        the rest: the deployment's controller settings now). A version recorded before the store kept
        them gets them from the store (the table's identity and prior ids); one whose identity cannot
        be had is refused (StoreError), since the controller refuses a file without one."""
        pubs = self.publications(deployment)
        if len(pubs) < 2:
            raise StoreError(
                f"deployment {deployment!r} has {len(pubs)} publication(s); rollback needs a previous version"
            )
        current, previous = pubs[-1], pubs[-2]
        table = self.table(previous["table_id"])
        fields = {**dict(document_fields or {}), **self._published_engine(deployment, previous, table)}
        return self.publish(deployment, table, export_path, base_speculative_config=base_speculative_config,
                            document_fields=fields, companion=companion,
                            note=f"rollback of v{current['version']} to v{previous['version']}")

    def _published_engine(self, deployment: str, pub: Mapping[str, Any], table: DraftLengthTable) -> dict[str, Any]:
        """``identity`` and ``prior`` document fields of an earlier publication."""
        identity, prior = pub.get("identity"), pub.get("prior")
        if identity is None:
            stored = self.find_identity(table.identity_key)
            if stored is None:
                raise StoreError(
                    f"cannot roll deployment {deployment!r} back to v{pub['version']}: its table {table.table_id} was "
                    f"made for engine identity {table.identity_key!r}, which neither that publication nor "
                    f"{self.path} records, and the controller refuses a file without an engine identity. Nothing "
                    "was published; publish a table of the deployment's current engine instead")
            identity = stored.to_dict()
        if prior is None:
            try:
                prior = self.acceptance_prior(table.prior_id)
            except NotFoundError:
                prior = None  # the file then carries the table's acceptance rates only
        fields = controller_fields(identity=identity, prior=prior)
        return {k: fields[k] for k in ("identity", "prior") if k in fields}

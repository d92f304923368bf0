"""The store's schema and the checks that come before using a file: TableTune's tables
(``SCHEMA_SQL``) and their migrations, the check that a file is a DuckDB database and that its tables
are TableTune's (``check_duckdb_file``, ``refuse_foreign``, ``check_schema``, ``check_not_truncated``),
and DuckDB's errors turned into store errors that name the file (``translate_duckdb_error``,
``damaged_store_error``). ``store/duckdb_store.py`` runs them when it opens the file."""

from __future__ import annotations

import functools
import os

import duckdb

from tabletune_pipelines.errors import StoreCorruptError, StoreError, StoreLockedError
from tabletune_pipelines.formats.strict_io import NotRegularFileError, open_regular
from tabletune_pipelines.vocab import DEFAULT_PROMPT_TOKENS

SCHEMA_SQL = f"""
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
    stderr_ms      DOUBLE,         -- standard error of median_ms (NULL: < 2 repetitions, or an older store)
    context_tokens INTEGER DEFAULT {DEFAULT_PROMPT_TOKENS}  -- the context level (older stores' rows: this default)
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
-- A prior's acceptance per context bucket (core/context_acceptance.py); no rows: one bucket, the prior's rates.
CREATE TABLE IF NOT EXISTS acceptance_prior_buckets (
    prior_id       VARCHAR NOT NULL,
    context_level  INTEGER NOT NULL,
    ctx_lo         INTEGER NOT NULL,
    ctx_hi         INTEGER NOT NULL,
    prompt_count   INTEGER NOT NULL,
    num_drafts     BIGINT NOT NULL,
    rates          DOUBLE[] NOT NULL,  -- the bucket's own rates, pooled or not
    pooled         BOOLEAN NOT NULL,   -- true: the bucket serves the prior's (pooled) rates
    reason         VARCHAR NOT NULL,   -- why it is pooled ('' when not)
    PRIMARY KEY (prior_id, context_level)
);
CREATE TABLE IF NOT EXISTS draft_length_tables (
    table_id             VARCHAR PRIMARY KEY,
    identity_key         VARCHAR NOT NULL,
    prior_id             VARCHAR NOT NULL,
    ranges_json          VARCHAR NOT NULL,  -- vLLM's entries of the full table: 5-item with a context axis
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


#: DuckDB's file header: an 8-byte checksum, then these magic bytes.
_DUCKDB_MAGIC, _MAGIC_AT = b"DUCK", 8
#: No extension is downloaded or loaded behind the store's back (DuckDB would otherwise fetch
#: sqlite_scanner to open a SQLite file given as the store).
CONNECT_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False}


def quiet(conn: duckdb.DuckDBPyConnection) -> None:
    """No progress bar: DuckDB draws one on stdout for any query over 2 s (a loaded machine), which
    would land in ``tabletune table --format vllm``'s JSON or a caller's line protocol."""
    conn.execute("SET enable_progress_bar = false")


#: Columns added after the first stores were written: (table, column, type). Opening a store for
#: writing adds them (NULL in old rows); a read-only open of an older store reads NULL for them.
#: Tables added after the first stores were written: a writing open creates them (``SCHEMA_SQL``), a
#: read-only open of an older store finds them absent and reads nothing from them.
MIGRATED_TABLES: frozenset[str] = frozenset({"step_samples", "served_calibrations", "acceptance_prior_buckets"})
MIGRATED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step_time_cells", "stderr_ms", "DOUBLE"),
    ("step_time_cells", "context_tokens", "INTEGER"),
    ("publications", "identity_json", "VARCHAR"),
    ("publications", "prior_json", "VARCHAR"),
)

#: What the rows written before a migrated column get in it, where not NULL: every step-time cell
#: stored before cells carried a context level was timed at the default ``prompt_tokens``.
MIGRATED_DEFAULTS: dict[tuple[str, str], int] = {("step_time_cells", "context_tokens"): DEFAULT_PROMPT_TOKENS}


def create_schema(conn: duckdb.DuckDBPyConnection) -> None:
    """Create TableTune's tables where missing. Migrations of older stores go here too, so the
    schema check after it (and ``_expected_schema``) sees the current schema."""
    conn.execute(SCHEMA_SQL)
    tables = {r[0] for r in conn.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                         "current_database() AND schema_name = 'main'").fetchall()}
    for table, column, typ in MIGRATED_COLUMNS:
        if table in tables:  # a view of that name is not altered: the schema check names it
            default = f" DEFAULT {MIGRATED_DEFAULTS[(table, column)]}" if (table, column) in MIGRATED_DEFAULTS else ""
            conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {typ}{default}")


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
    """TableTune's tables and columns, as DuckDB itself reports them for ``create_schema``."""
    conn = duckdb.connect(":memory:", config=CONNECT_CONFIG)
    try:
        create_schema(conn)
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
            rows = conn.execute(f"SELECT block_id, additional_block_ids FROM pragma_storage_info('{table}') "
                                "WHERE block_id >= 0").fetchall()
            for block, extra in rows:
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

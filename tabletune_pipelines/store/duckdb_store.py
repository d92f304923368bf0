"""DuckDB store: profile cells, acceptance priors, tables and publications.

Every write is one transaction, and re-measuring a cell replaces it (delete + insert of the
cell's key inside the transaction), so a writer killed mid-way leaves the previous committed
state. With a file path, connections are short-lived so other processes can use the file between
writes; a lock held by another process is retried for ``lock_timeout_s`` and then reported with
the holder's details. Tables live in the default ``main`` schema (a schema named like the file
would be ambiguous in DuckDB).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from tabletune_pipelines.errors import StoreCorruptError, StoreError, StoreLockedError
from tabletune_pipelines.documents import (
    AcceptancePrior,
    DraftLengthTable,
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
)
from tabletune_pipelines.published import published_document, write_published_table

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
CREATE TABLE IF NOT EXISTS publications (
    deployment    VARCHAR NOT NULL,
    version       INTEGER NOT NULL,
    table_id      VARCHAR NOT NULL,
    path          VARCHAR NOT NULL,
    published_at  TIMESTAMP NOT NULL,
    note          VARCHAR,
    PRIMARY KEY (deployment, version)
);
"""


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def translate_duckdb_error(path: str | os.PathLike[str], exc: BaseException) -> StoreError:
    """Turn DuckDB's open errors into actionable store errors."""
    msg = str(exc)
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


class TableTuneStore:
    """Reads and writes TableTune's tables in one DuckDB database.

    ``TableTuneStore(path)`` opens a short-lived connection per operation.
    ``TableTuneStore.on(connection_factory)`` uses connections from elsewhere, e.g. Dagster's
    ``DuckDBResource.get_connection``.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self._factory: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]] | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute(SCHEMA_SQL)

    @classmethod
    def on(
        cls, connection_factory: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]], path: str = "<resource>"
    ) -> "TableTuneStore":
        store = cls.__new__(cls)
        store.path = Path(path)
        store.lock_timeout_s = 0.0
        store._factory = connection_factory
        with store._connect() as conn:
            conn.execute(SCHEMA_SQL)
        return store

    # -- connections -----------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._factory is not None:
            with self._factory() as conn:
                yield conn
            return
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                conn = duckdb.connect(str(self.path))
                break
            except duckdb.Error as exc:
                err = translate_duckdb_error(self.path, exc)
                if isinstance(err, StoreLockedError) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise err from None
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._connect() as conn:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read query (plain SQL) and return all rows."""
        with self._connect() as conn:
            return conn.execute(sql, params or []).fetchall()

    # -- identities --------------------------------------------------------------------------
    def upsert_identity(self, identity: EngineIdentity) -> str:
        key = identity.key
        with self._transaction() as conn:
            exists = conn.execute("SELECT 1 FROM engine_identities WHERE identity_key = ?", [key]).fetchone()
            if not exists:
                conn.execute(
                    "INSERT INTO engine_identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [key, identity.gpu, identity.vllm_version, identity.model, identity.drafter, identity.method,
                     identity.max_k, identity.max_num_seqs, identity.to_json(), _now()],
                )
        return key

    def identity(self, identity_key: str) -> EngineIdentity:
        row = self.query("SELECT identity_json FROM engine_identities WHERE identity_key = ?", [identity_key])
        if not row:
            raise KeyError(f"engine identity {identity_key!r} is not in {self.path}")
        return EngineIdentity.from_json(row[0][0])

    def identity_keys(self) -> list[str]:
        return [r[0] for r in self.query("SELECT identity_key FROM engine_identities ORDER BY identity_key")]

    # -- step-time cells ---------------------------------------------------------------------
    def write_profile_cell(self, identity: EngineIdentity, cell: StepTimeCell, mode: str = "one_launch") -> None:
        """Store one measured cell, replacing an earlier measurement of the same cell."""
        self.write_profile_cells(identity, [cell], mode)

    def write_profile_cells(self, identity: EngineIdentity, cells: list[StepTimeCell], mode: str = "one_launch") -> None:
        self.upsert_identity(identity)
        key = identity.key
        with self._transaction() as conn:
            for cell in cells:
                conn.execute(
                    "DELETE FROM step_time_cells WHERE identity_key = ? AND mode = ? AND acceptance = ? "
                    "AND k IS NOT DISTINCT FROM ? AND batch_size = ?",
                    [key, mode, cell.acceptance, cell.k, cell.batch_size],
                )
                conn.execute(
                    "INSERT INTO step_time_cells VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [key, mode, cell.acceptance, cell.k, cell.batch_size, cell.median_ms, cell.spread,
                     list(cell.repetitions_ms), cell.launch_k, cell.timing, _now()],
                )

    def profile_cells(self, identity_key: str, mode: str = "one_launch") -> list[StepTimeCell]:
        rows = self.query(
            "SELECT k, batch_size, median_ms, repetitions_ms, acceptance, launch_k, timing FROM step_time_cells "
            "WHERE identity_key = ? AND mode = ? ORDER BY acceptance, k NULLS FIRST, batch_size",
            [identity_key, mode],
        )
        return [
            StepTimeCell(k=r[0], batch_size=r[1], median_ms=r[2], repetitions_ms=tuple(r[3]), acceptance=r[4],
                         launch_k=r[5], timing=r[6])
            for r in rows
        ]

    def load_profile(self, identity_key: str, mode: str = "one_launch") -> StepTimeProfile:
        return StepTimeProfile(identity=self.identity(identity_key), cells=tuple(self.profile_cells(identity_key, mode)),
                               mode=mode)

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
        row = self.query("SELECT prior_json FROM acceptance_priors WHERE prior_id = ?", [prior_id])
        if not row:
            raise KeyError(f"acceptance prior {prior_id!r} is not in {self.path}")
        return AcceptancePrior.from_json(row[0][0])

    def latest_acceptance_prior(self, deployment: str | None = None) -> AcceptancePrior | None:
        row = self.query(
            "SELECT prior_json FROM acceptance_priors WHERE (? IS NULL OR deployment = ?) "
            "ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
            [deployment, deployment],
        )
        return AcceptancePrior.from_json(row[0][0]) if row else None

    # -- tables and publications -------------------------------------------------------------
    def write_table(self, table: DraftLengthTable) -> str:
        tid = table.table_id
        with self._transaction() as conn:
            conn.execute("DELETE FROM draft_length_tables WHERE table_id = ?", [tid])
            conn.execute(
                "INSERT INTO draft_length_tables VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [tid, table.identity_key, table.prior_id, json.dumps(table.as_vllm()), table.max_num_seqs,
                 table.max_k, table.predicted_worst_loss, table.to_json(), _now()],
            )
        return tid

    def table(self, table_id: str) -> DraftLengthTable:
        row = self.query("SELECT table_json FROM draft_length_tables WHERE table_id = ?", [table_id])
        if not row:
            raise KeyError(f"draft-length table {table_id!r} is not in {self.path}")
        return DraftLengthTable.from_json(row[0][0])

    def publications(self, deployment: str) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT version, table_id, path, published_at, note FROM publications WHERE deployment = ? ORDER BY version",
            [deployment],
        )
        return [dict(zip(("version", "table_id", "path", "published_at", "note"), r)) for r in rows]

    def publish(
        self,
        deployment: str,
        table: DraftLengthTable,
        export_path: str | os.PathLike[str],
        *,
        base_speculative_config: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> dict[str, Any]:
        """Record a new publication version and atomically export the file the controller reads.

        The file is written first and the version row committed after: a crash in between leaves
        a valid file that is simply not yet recorded, never a recorded version without a file.
        """
        tid = self.write_table(table)
        previous = self.publications(deployment)
        version = (previous[-1]["version"] + 1) if previous else 1
        published_at = _now()
        doc = published_document(
            deployment=deployment, version=version, table=table.to_dict(),
            speculative_config=table.speculative_config(base_speculative_config),
            published_at=published_at.isoformat() + "Z",
        )
        path = write_published_table(export_path, doc)
        with self._transaction() as conn:
            conn.execute("INSERT INTO publications VALUES (?, ?, ?, ?, ?, ?)",
                         [deployment, version, tid, str(path), published_at, note])
        return doc

    def rollback(self, deployment: str, export_path: str | os.PathLike[str],
                 base_speculative_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Re-publish the table of the version before the current one, as a new version."""
        pubs = self.publications(deployment)
        if len(pubs) < 2:
            raise StoreError(
                f"deployment {deployment!r} has {len(pubs)} publication(s); rollback needs a previous version"
            )
        current, previous = pubs[-1], pubs[-2]
        return self.publish(deployment, self.table(previous["table_id"]), export_path,
                            base_speculative_config=base_speculative_config,
                            note=f"rollback of v{current['version']} to v{previous['version']}")

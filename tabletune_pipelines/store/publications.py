"""The store's draft-length tables and publications (tables ``draft_length_tables`` and
``publications``): derived tables, and each deployment's published versions, written with the
published file and its companion in one transaction (``publish``, ``rollback``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from tabletune_pipelines.errors import NotFoundError, StoreError
from tabletune_pipelines.formats.documents import DraftLengthTable
from tabletune_pipelines.formats.published_build import controller_fields, published_document
from tabletune_pipelines.formats.published_files import (
    check_publish_targets,
    publication_lock,
    speculative_config_path,
    write_published_table,
    write_speculative_config_companion,
)
from tabletune_pipelines.formats.published_schema import VERSION, PublishedVersion
from tabletune_pipelines.formats.strict_io import atomic_write_bytes, open_regular
from tabletune_pipelines.store.group import listing, now
from tabletune_pipelines.store.identities import IdentityTables
from tabletune_pipelines.store.priors import PriorTables

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


class PublicationTables(IdentityTables, PriorTables):
    """Draft-length tables and the deployments' publications of them (a rollback re-publishes an earlier
    table with the engine identity and prior it was published with)."""

    def write_table(self, table: DraftLengthTable) -> str:
        with self._transaction() as conn:
            return self._insert_table(conn, table)

    @staticmethod
    def _insert_table(conn: duckdb.DuckDBPyConnection, table: DraftLengthTable) -> str:
        tid = table.table_id
        conn.execute("DELETE FROM draft_length_tables WHERE table_id = ?", [tid])
        conn.execute(
            "INSERT INTO draft_length_tables VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [tid, table.identity_key, table.prior_id, json.dumps(table.full_table.entries()), table.max_num_seqs,
             table.max_k, table.predicted_worst_loss, table.to_json(), now()],
        )
        return tid

    def table(self, table_id: str) -> DraftLengthTable:
        """The table with this id; NotFoundError lists the newest stored ids."""
        row = self.query("SELECT table_json FROM draft_length_tables WHERE table_id = ?", [table_id])
        if not row:
            raise NotFoundError(f"draft-length table {table_id!r} is not in {self.path}"
                                + listing("draft-length tables", self.table_ids(), "derive one first"))
        return DraftLengthTable.from_json(row[0][0])

    def table_ids(self) -> list[str]:
        """Every stored table id, newest first."""
        return [r[0] for r in self.query("SELECT table_id FROM draft_length_tables ORDER BY created_at DESC, table_id")]

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
        context_schedule: bool = False,
    ) -> dict[str, Any]:
        """Record a new publication version and atomically export the file the controller reads
        (and, with ``companion``, its ``<stem>.speculative-config.json``).

        ``context_schedule``: the engine's vLLM accepts 5-item entries (``engine.installed``), so a table
        with a context axis goes into ``speculative_config`` as its (B, ctx) schedule
        (``DraftLengthTable.speculative_config``); the file's ``table`` always carries the full table.
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
                published_at = now()
                doc = published_document(
                    PublishedVersion(deployment=deployment, version=version, table=table_fields,
                                     speculative_config=table.speculative_config(
                                         base_speculative_config, context_schedule=context_schedule),
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
                 document_fields: Mapping[str, Any] | None = None, *, companion: bool = True,
                 context_schedule: bool = False) -> dict[str, Any]:
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
                            document_fields=fields, companion=companion, context_schedule=context_schedule,
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

"""The store's engine identities and served calibrations (tables ``engine_identities`` and
``served_calibrations``): an identity is written with the first measurement of it, and a served
verification's fixed-k measurements are kept as the identity's newest calibration."""

from __future__ import annotations

import json

import duckdb

from tabletune_pipelines.core.served_calibration import ServedCalibration
from tabletune_pipelines.errors import NotFoundError, StoredDataError, TableTuneError
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.store.group import TableGroup, listing, now


class IdentityTables(TableGroup):
    """Engine identities and their served calibrations."""

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
                 identity.max_k, identity.max_num_seqs, identity.to_json(), now()],
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
                                + listing("engine identities", self.identity_keys(), "profile one first"))
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


    def write_served_calibration(self, identity_key: str, calibration: ServedCalibration) -> None:
        """Keep a served verification's fixed-k measurements as the identity's newest calibration."""
        with self._transaction() as conn:
            conn.execute("INSERT INTO served_calibrations (identity_key, measured_at, calibration_json) "
                         "VALUES (?, ?, ?)", [identity_key, now(), json.dumps(calibration.to_dict())])

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

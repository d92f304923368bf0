"""The served calibration a verification keeps: stored per engine identity, newest first, and stores
written before it existed still load and migrate."""

from __future__ import annotations

import re

import duckdb
import pytest

from tabletune_pipelines.core.served_calibration import ServedCalibration, ServedPoint
from tabletune_pipelines.errors import StoredDataError
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.schema import SCHEMA_SQL
from tests.store.test_graph_envelope_migration import IDENT, _tables

CAL = ServedCalibration(points=(ServedPoint(k=1, batch=7.5, ms=12.0, se_ms=0.3, rounds=3, load=8,
                                            per_round=(("r0", 11.7), ("r1", 12.0), ("r2", 12.3))),),
                        source="a served verification")


def test_the_newest_calibration_of_an_identity_comes_back(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    assert s.latest_served_calibration(IDENT.key) is None
    s.write_served_calibration(IDENT.key, CAL)
    newer = ServedCalibration(points=(ServedPoint(k=2, batch=7.0, ms=14.0, se_ms=0.5, rounds=2),), source="later")
    s.write_served_calibration(IDENT.key, newer)
    assert s.latest_served_calibration(IDENT.key) == newer
    assert s.latest_served_calibration("another-engine") is None
    s.query("UPDATE served_calibrations SET calibration_json = '{\"points\": [{\"k\": 1}]}'")
    with pytest.raises(StoredDataError, match="served calibration .* cannot be read"):
        s.latest_served_calibration(IDENT.key)


def test_a_store_from_before_calibrations_loads_read_only_and_migrates(tmp_path):
    path = tmp_path / "old.duckdb"
    sql = re.sub(r"-- Served wall time.*?\);\n", "", SCHEMA_SQL, flags=re.S)
    assert "served_calibrations" not in sql
    conn = duckdb.connect(str(path))
    conn.execute(sql)
    conn.close()
    assert TableTuneStore(path, read_only=True).latest_served_calibration(IDENT.key) is None
    assert "served_calibrations" not in _tables(path)  # read-only means untouched
    rw = TableTuneStore(path)
    rw.write_served_calibration(IDENT.key, CAL)
    assert "served_calibrations" in _tables(path)
    assert TableTuneStore(path, read_only=True).latest_served_calibration(IDENT.key) == CAL

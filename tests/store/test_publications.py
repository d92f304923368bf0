"""Publications in the store: what a publication records, what a rollback re-publishes,
and publishing one deployment from two processes at once.

* A publication row keeps the published file's engine identity and prior; rollback re-publishes an
  old version WITH them (the controller refuses a file without an identity). Stores written before
  those columns are migrated when opened for writing, read as NULL when opened read-only, and a
  rollback to one of their rows takes the identity and prior from the store.
* Two publishers of one deployment never leave the store's version and the file's version holding
  different tables: the publication lock (``published_files.publication_lock``) serialises them, and a
  version taken behind the lock's back is retried, never a raw DuckDB constraint error.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import textwrap
import time

import duckdb
import pytest

from tabletune_pipelines.formats import published_files
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity
from tabletune_pipelines.errors import PublishedTableError, StoreError, TableTuneError
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.formats.published_files import (
    publication_lock,
    publication_lock_path,
    speculative_config_path,
)
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store import publications
from tabletune_pipelines.store.schema import SCHEMA_SQL
from tests.readers.conftest import snapshot

IDENT = EngineIdentity(gpu="H200", vllm_version="0.26.0", model="/models/qwen3-4b", drafter="/models/eagle3",
                       method="eagle3", max_k=3, max_num_seqs=16)


def prior(rates=(0.7, 0.5, 0.3), week="2026-11-16") -> AcceptancePrior:
    n = 1000
    return AcceptancePrior(rates=rates, num_drafts=n, drafted_per_pos=(n,) * 3,
                           accepted_per_pos=tuple(int(r * n) for r in rates), prompt_fingerprint="f" * 64,
                           prompt_count=160, week=week, deployment="h200")


def table(ranges, prior_id: str) -> DraftLengthTable:
    return DraftLengthTable(ranges=ranges, max_num_seqs=16, max_k=3, identity_key=IDENT.key, prior_id=prior_id)


def publish(store, out, tbl, p):
    """What the published_table asset does: the table's identity and prior go with it."""
    return store.publish("h200", tbl, out, document_fields=controller_fields(
        identity=store.find_identity(tbl.identity_key), prior=p, controller={"hysteresis": 3}))


# -- rollback re-publishes the old version's identity and prior --------------------------------------

def test_rollback_republishes_the_old_versions_identity_and_prior(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.upsert_identity(IDENT)
    # v1's prior is not in the store (a synthetic one, as `tabletune table --rates` makes): only the
    # publication row can give it back.
    p1, p2 = prior((0.9, 0.8, 0.7)), prior((0.3, 0.1, 0.05), week="2026-11-23")
    s.write_acceptance_prior(p2, IDENT.key)
    out = tmp_path / "pub" / "h200.json"
    d1 = publish(s, out, table(((1, 16, 3),), p1.prior_id), p1)
    publish(s, out, table(((1, 4, 1), (5, 16, 0)), p2.prior_id), p2)
    d3 = s.rollback("h200", out, document_fields=controller_fields(controller={"hysteresis": 5}))
    doc = read_published_table(out)
    assert doc == json.loads(json.dumps(d3)) and doc["version"] == 3 and doc["table"]["ranges"] == [[1, 16, 3]]
    assert doc["identity"] == d1["identity"] and doc["identity"]["gpu"] == "H200"
    assert doc["prior"] == d1["prior"] and doc["prior"]["rates"] == [0.9, 0.8, 0.7]
    assert doc["controller"] == {"hysteresis": 5}  # the deployment's settings now, not v1's
    pubs = s.publications("h200")
    assert [p["version"] for p in pubs] == [1, 2, 3] and pubs[2]["identity"] == d1["identity"]
    assert pubs[2]["prior"]["rates"] == [0.9, 0.8, 0.7] and pubs[1]["prior"]["rates"] == [0.3, 0.1, 0.05]
    # The companion is written with the table, under the same lock.
    assert json.loads(speculative_config_path(out).read_text())["num_speculative_tokens_per_batch_size"] == \
        [[1, 16, 3]]


def old_store(path, *rows):
    """A store as TableTune wrote it before publications kept identity and prior."""
    sql = re.sub(r"\n\s*identity_json VARCHAR,[^\n]*\n\s*prior_json\s+VARCHAR,[^\n]*", "", SCHEMA_SQL)
    assert "prior_json    VARCHAR," not in sql and "identity_json VARCHAR," not in sql
    with duckdb.connect(str(path)) as conn:
        conn.execute(sql)
        for deployment, version, tid in rows:
            conn.execute("INSERT INTO publications VALUES (?, ?, ?, 'x.json', now(), NULL)", [deployment, version, tid])


def test_an_old_store_read_only_reads_null_and_is_not_altered(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path, ("h200", 1, "t1"))
    ro = TableTuneStore(path, read_only=True)
    (row,) = ro.publications("h200")
    assert row["version"] == 1 and row["identity"] is None and row["prior"] is None
    with duckdb.connect(str(path), read_only=True) as conn:
        cols = {r[0] for r in conn.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = "
                                           "'publications'").fetchall()}
    assert "identity_json" not in cols


def test_an_old_store_is_migrated_and_its_rows_roll_back_with_the_stores_identity_and_prior(tmp_path):
    path = tmp_path / "old.duckdb"
    t1, t2 = table(((1, 16, 3),), "p-old"), table(((1, 16, 1),), "p-new")
    old_store(path)
    s = TableTuneStore(path)  # opened for writing: migrated
    assert s.query("SELECT identity_json, prior_json FROM publications") == []
    s.upsert_identity(IDENT)
    pid = s.write_acceptance_prior(prior(), IDENT.key)
    s.write_table(dataclasses_replace(t1, prior_id=pid))
    s.write_table(t2)
    with duckdb.connect(str(path)) as conn:  # rows as the old TableTune wrote them: no identity, no prior
        conn.execute("INSERT INTO publications (deployment, version, table_id, path, published_at) VALUES "
                     "('h200', 1, ?, 'x', now()), ('h200', 2, ?, 'x', now())",
                     [dataclasses_replace(t1, prior_id=pid).table_id, t2.table_id])
    out = tmp_path / "h200.json"
    s.rollback("h200", out)
    doc = read_published_table(out)
    assert doc["version"] == 3 and doc["table"]["ranges"] == [[1, 16, 3]]
    assert doc["identity"]["model"] == IDENT.model and doc["identity"]["gpu"] == "H200"
    assert doc["prior"]["prior_id"] == pid and doc["prior"]["rates"] == [0.7, 0.5, 0.3]


def dataclasses_replace(t, **kw):
    import dataclasses

    return dataclasses.replace(t, **kw)


def test_a_rollback_to_a_version_whose_identity_nobody_knows_is_refused_and_changes_nothing(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    s = TableTuneStore(path)
    t1, t2 = table(((1, 16, 3),), "p1"), table(((1, 16, 1),), "p2")
    s.write_table(t1)
    s.write_table(t2)
    out = tmp_path / "pub" / "h200.json"
    out.parent.mkdir()
    with duckdb.connect(str(path)) as conn:
        conn.execute("INSERT INTO publications (deployment, version, table_id, path, published_at) VALUES "
                     "('h200', 1, ?, 'x', now()), ('h200', 2, ?, 'x', now())", [t1.table_id, t2.table_id])
    out.write_text(json.dumps({"schema": "tabletune.published_table", "deployment": "h200", "version": 2}))
    before = snapshot(out.parent)
    with pytest.raises(StoreError, match=rf"cannot roll deployment 'h200' back to v1: its table {t1.table_id} was "
                                         rf"made for engine identity '{re.escape(IDENT.key)}', which neither"):
        s.rollback("h200", out)
    assert snapshot(out.parent) == before  # not even the lock file
    assert [p["version"] for p in s.publications("h200")] == [1, 2]


# -- one publication at a time -----------------------------------------------------------------------

PUBLISHER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tabletune_pipelines.formats.documents import DraftLengthTable, EngineIdentity
    from tabletune_pipelines.formats.published_build import controller_fields
    from tabletune_pipelines.store import TableTuneStore
    db, export, ident_json, who, n, go = sys.argv[1:7]
    ident = EngineIdentity.from_json(ident_json)
    s = TableTuneStore(db, lock_timeout_s=60)
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.001)
    for i in range(int(n)):
        w = int(who)
        t = DraftLengthTable(ranges=((1, 4 + w, 1 + i % 3), (5 + w, 16, 0)), max_num_seqs=16, max_k=3,
                             identity_key=ident.key, prior_id=f"p{w}-{i}")
        doc = s.publish("h200", t, export, document_fields=controller_fields(identity=ident))
        print(doc["version"], t.table_id, flush=True)
""")


@pytest.mark.parametrize("round_", range(3))
def test_two_processes_publishing_at_once_leave_store_and_file_agreeing(tmp_path, round_):
    """Two processes publish 30 tables each to one deployment, released at the same instant. Before
    the publication lock every round of 5 we ran ended with a raw DuckDB constraint error ("Duplicate
    key ... violates primary key constraint") in one of the two processes, after both had written
    the file with the same version."""
    n = 30
    db, export, go = tmp_path / "tt.duckdb", tmp_path / "pub" / "h200.json", tmp_path / "go"
    TableTuneStore(db).upsert_identity(IDENT)
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, str(db), str(export), IDENT.to_json(), str(w),
                               str(n), str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in (0, 1)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "Traceback" not in err, err
    acked = [tuple(line.split()) for out, _ in outs for line in out.splitlines()]
    assert len(acked) == 2 * n
    s = TableTuneStore(db)
    rows = {p["version"]: p["table_id"] for p in s.publications("h200")}
    # Every acknowledged version is in the store with the table that process published.
    assert {int(v): tid for v, tid in acked} == rows and len(rows) == 2 * n
    # The file holds the newest version, and the store's row of that version holds the file's table.
    doc = read_published_table(export)
    assert doc["version"] == max(rows)
    stored = s.table(rows[doc["version"]])
    assert doc["table"]["ranges"] == [list(r) for r in stored.ranges] and doc["table"]["prior_id"] == stored.prior_id
    companion = json.loads(speculative_config_path(export).read_text())
    assert companion["num_speculative_tokens_per_batch_size"] == doc["table"]["ranges"]


def test_a_version_taken_behind_the_locks_back_is_retried_not_a_duckdb_error(tmp_path, monkeypatch):
    """Another host publishing on a file system where flock does not reach: simulated by a lock that
    locks nothing and a version counter that is one step behind."""
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.upsert_identity(IDENT)
    out = tmp_path / "h200.json"
    theirs = table(((1, 16, 1),), "theirs")
    s.publish("h200", theirs, tmp_path / "elsewhere.json", companion=False)  # v1, "on the other host"
    monkeypatch.setattr(publications, "publication_lock", lambda path: contextlib.nullcontext())
    real, calls = s.latest_publication_version, []

    def one_step_behind_once(deployment):
        calls.append(deployment)
        return 0 if len(calls) == 1 else real(deployment)

    monkeypatch.setattr(s, "latest_publication_version", one_step_behind_once)
    ours = table(((1, 16, 3),), "ours")
    doc = s.publish("h200", ours, out)
    assert doc["version"] == 2 and read_published_table(out)["version"] == 2
    rows = {p["version"]: p["table_id"] for p in s.publications("h200")}
    assert rows == {1: theirs.table_id, 2: ours.table_id} and len(calls) == 2  # v1 refused by the key, v2 taken


def test_versions_taken_again_and_again_end_in_one_clear_error(tmp_path, monkeypatch):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.upsert_identity(IDENT)
    for i in range(8):
        s.publish("h200", table(((1, 16, 1 + i % 3),), f"theirs-{i}"), tmp_path / "elsewhere.json")
    monkeypatch.setattr(publications, "publication_lock", lambda path: contextlib.nullcontext())
    monkeypatch.setattr(s, "latest_publication_version", lambda d: 0)  # always behind
    with pytest.raises(TableTuneError, match=r"publishing .* to deployment 'h200': 5 versions in a row were taken by "
                                             r"other publishers at the same time"):
        s.publish("h200", table(((1, 16, 3),), "ours"), tmp_path / "h200.json")


def test_the_version_is_above_the_files_after_a_publish_that_crashed_before_its_row(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.upsert_identity(IDENT)
    out = tmp_path / "h200.json"
    s.publish("h200", table(((1, 16, 1),), "a"), out)
    doc = read_published_table(out)
    doc["version"] = 7  # written by a publish killed before it recorded v7
    published_files.write_published_table(out, doc)
    assert s.publish("h200", table(((1, 16, 3),), "b"), out)["version"] == 8  # the controller must see it as newer
    assert [p["version"] for p in s.publications("h200")] == [1, 8]


def test_the_lock_file_beside_the_table_and_a_publisher_that_holds_it_too_long(tmp_path):
    out = tmp_path / "pub" / "h200.json"
    assert publication_lock_path(out) == tmp_path / "pub" / ".h200.json.lock"
    with publication_lock(out):
        t0 = time.monotonic()
        with pytest.raises(PublishedTableError, match=r"another publication of .*h200.json has held "
                                                      r".*\.h200\.json\.lock for more than 0.2 s; nothing was written"):
            with publication_lock(out, timeout_s=0.2):
                pass
        assert time.monotonic() - t0 >= 0.2
    with publication_lock(out, timeout_s=0.2):  # released
        pass
    assert not out.exists()
    (tmp_path / "pub" / ".x.json.lock").mkdir()
    with pytest.raises(PublishedTableError, match=r"cannot open the publication lock .*\.x\.json\.lock"):
        with publication_lock(tmp_path / "pub" / "x.json"):
            pass

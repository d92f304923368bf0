"""DuckDB store: idempotent writes, plain-SQL reads, locked/corrupt files, crash safety, exports."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeCell
from tabletune_pipelines.errors import (
    NotFoundError,
    PublishedTableError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    TableTuneError,
)
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.store import TableTuneStore

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m/target", drafter="/m/draft",
                       method="draft_model", max_k=3, max_num_seqs=16)


def table(ranges=((1, 8, 3), (9, 16, 1))):
    return DraftLengthTable(ranges=ranges, max_num_seqs=16, max_k=3, identity_key=IDENT.key, prior_id="prior-x")


def test_remeasuring_a_cell_replaces_it(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=5.0, repetitions_ms=(5.0, 5.1, 4.9)))
    s.write_profile_cell(IDENT, StepTimeCell(k=None, batch_size=4, median_ms=3.0, repetitions_ms=(3.0,)))
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=5.5, repetitions_ms=(5.5,)))
    rows = s.query("SELECT k, batch_size, median_ms FROM step_time_cells ORDER BY k NULLS FIRST")
    assert rows == [(None, 4, 3.0), (1, 4, 5.5)]
    assert s.identity(IDENT.key) == IDENT
    # A cell of another mode is a separate measurement.
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=6.0, repetitions_ms=(6.0,)), "launch_per_k")
    assert len(s.profile_cells(IDENT.key)) == 2 and len(s.profile_cells(IDENT.key, "launch_per_k")) == 1


def test_priors_tables_publish_and_rollback(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    p = AcceptancePrior(rates=(0.7, 0.5, 0.3), num_drafts=10, drafted_per_pos=(10, 10, 10),
                        accepted_per_pos=(7, 5, 3), prompt_fingerprint="f", prompt_count=3, week="2026-11-23",
                        deployment="local")
    s.write_acceptance_prior(p)
    s.write_acceptance_prior(p)  # idempotent
    assert s.query("SELECT count(*) FROM acceptance_priors") == [(1,)]
    assert s.latest_acceptance_prior("local") == p
    s.upsert_identity(IDENT)  # rollback re-publishes the table's engine identity (from the store for bare publishes)
    out = tmp_path / "pub" / "local.json"
    d1 = s.publish("local", table(), out)
    d2 = s.publish("local", table(((1, 16, 1),)), out)
    assert (d1["version"], d2["version"]) == (1, 2)
    assert read_published_table(out)["table"]["ranges"] == [[1, 16, 1]]
    d3 = s.rollback("local", out)
    assert d3["version"] == 3 and read_published_table(out)["table"]["ranges"] == [[1, 8, 3], [9, 16, 1]]
    assert "rollback of v2 to v1" in s.publications("local")[-1]["note"]
    with pytest.raises(StoreError, match="needs a previous version"):
        s.rollback("other", tmp_path / "o.json")


def test_not_a_duckdb_file_is_reported_and_left_untouched(tmp_path):
    bad = tmp_path / "tt.duckdb"
    bad.write_bytes(b"definitely not a database" * 100)
    before = bad.read_bytes()
    with pytest.raises(StoreCorruptError, match="not a DuckDB database"):
        TableTuneStore(bad)
    assert bad.read_bytes() == before


HOLDER = textwrap.dedent("""
    import sys, time, duckdb
    c = duckdb.connect(sys.argv[1])
    print("holding", flush=True)
    time.sleep(60)
""")


def test_locked_file_is_reported_and_nothing_is_lost(tmp_path):
    path = tmp_path / "tt.duckdb"
    s = TableTuneStore(path)
    s.write_profile_cell(IDENT, StepTimeCell(k=0, batch_size=1, median_ms=4.0, repetitions_ms=(4.0,)))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        locked = TableTuneStore.__new__(TableTuneStore)
        locked.path, locked.lock_timeout_s, locked._factory = path, 0.5, None
        with pytest.raises(StoreLockedError, match=f"{path}.*locked by another process"):
            locked.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=1, median_ms=5.0, repetitions_ms=(5.0,)))
    finally:
        holder.kill()
        holder.wait()
    assert [c.k for c in TableTuneStore(path).profile_cells(IDENT.key)] == [0]


WRITER = textwrap.dedent("""
    import sys
    from tabletune_pipelines.formats.documents import DraftLengthTable, EngineIdentity, StepTimeCell
    from tabletune_pipelines.store import TableTuneStore
    ident = EngineIdentity.from_json(sys.argv[3])
    s = TableTuneStore(sys.argv[1])
    i = 0
    while True:
        i += 1
        cells = [StepTimeCell(k=k, batch_size=1 + (i % 16), median_ms=float(i), repetitions_ms=(float(i),) * 3)
                 for k in range(4)]
        s.write_profile_cells(ident, cells)
        k = 1 + i % 3
        t = DraftLengthTable(ranges=((1, 8, k), (9, 16, 0)), max_num_seqs=16, max_k=3,
                             identity_key=ident.key, prior_id=f"p{i}")
        s.publish("local", t, sys.argv[2])
        print(i, flush=True)
""")


@pytest.mark.parametrize("kill_after", [3, 7, 12])
def test_store_and_export_survive_a_writer_killed_mid_way(tmp_path, kill_after):
    path, export = tmp_path / "tt.duckdb", tmp_path / "pub" / "local.json"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(export), IDENT.to_json()],
                            stdout=subprocess.PIPE, text=True)
    acked = 0
    try:
        while acked < kill_after:
            line = proc.stdout.readline()
            assert line, "writer died early"
            acked = int(line)
        time.sleep(0.013 * kill_after)  # land somewhere inside a later write
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    s = TableTuneStore(path)
    cells = s.profile_cells(IDENT.key)
    # Every acknowledged write is there, every cell whole (4 ks per batch size, same value).
    assert max(c.median_ms for c in cells) >= acked
    by_b = {}
    for c in cells:
        by_b.setdefault(c.batch_size, set()).add(c.median_ms)
    assert all(len(v) == 1 for v in by_b.values()), by_b
    assert len(cells) == 4 * len(by_b)
    doc = read_published_table(export)
    assert doc["version"] >= acked
    pubs = s.publications("local")
    assert [p["version"] for p in pubs] == list(range(1, len(pubs) + 1))
    assert doc["version"] in (pubs[-1]["version"], pubs[-1]["version"] + 1)
    # No temp files promoted or left visible as the export.
    assert json.loads(export.read_text())["schema"] == "tabletune.published_table"


def test_export_reader_errors(tmp_path):
    with pytest.raises(PublishedTableError, match="does not exist"):
        read_published_table(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PublishedTableError, match="not valid JSON"):
        read_published_table(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"schema": "x"}')
    with pytest.raises(PublishedTableError, match="not a TableTune published table"):
        read_published_table(tmp_path / "other.json")


READER = textwrap.dedent("""
    import sys, time
    from tabletune_pipelines.formats.published import read_published_table
    path, final = sys.argv[1], int(sys.argv[2])
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        v = read_published_table(path)["version"]  # raises (exit 1) on a torn or invalid file
        if not seen or v != seen[-1]:
            seen.append(v)
            print(v, flush=True)
        if v == final:
            sys.exit(0)
    sys.exit(3)  # never saw the final version
""")


def test_concurrent_reader_never_sees_a_torn_export(tmp_path):
    """A reader polls the export while a writer publishes FINAL versions. Counts, not durations: the
    writer starts once the reader has read version 1, and the reader runs until it sees FINAL."""
    final = 40
    path, export = tmp_path / "tt.duckdb", tmp_path / "local.json"
    s = TableTuneStore(path)
    s.publish("local", table(), export)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(export), str(final)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert reader.stdout.readline().strip() == "1"
        for i in range(2, final + 1):
            s.publish("local", table(((1, 8, 1 + i % 3), (9, 16, 0))), export)
        out, _ = reader.communicate(timeout=180)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, "reader saw a torn or invalid file" if reader.returncode == 1 else reader.returncode
    seen = [1, *map(int, out.split())]
    assert seen == sorted(seen) and seen[-1] == final  # versions only ever move forward


def test_lookups_of_missing_things_raise_not_found_naming_what_exists(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    with pytest.raises(NotFoundError, match=r"acceptance prior 'NOSUCH' is not in .*no acceptance priors yet"):
        s.acceptance_prior("NOSUCH")
    with pytest.raises(NotFoundError, match=r"engine identity 'x' is not in .*no engine identities yet"):
        s.identity("x")
    with pytest.raises(NotFoundError, match="draft-length table 't' is not in"):
        s.table("t")
    p = prior()
    s.write_acceptance_prior(p)
    s.write_profile_cell(IDENT, StepTimeCell(k=1, batch_size=4, median_ms=5.0, repetitions_ms=(5.0,)), "fixed_k")
    with pytest.raises(NotFoundError, match=f"the store has: {p.prior_id}"):
        s.acceptance_prior("NOSUCH")
    with pytest.raises(NotFoundError, match=f"the store has: {IDENT.key}"):
        s.identity("x")
    with pytest.raises(NotFoundError, match=r"no step-time cells in mode 'one_launch'.*mode\(s\) \['fixed_k'\]"):
        s.load_profile(IDENT.key)
    assert s.load_profile(IDENT.key, "fixed_k").mode == "fixed_k"
    assert isinstance(NotFoundError("m"), TableTuneError) and str(NotFoundError("m")) == "m"


def prior(week="2026-11-16", source="measured", deployment="local", rates=(0.7, 0.5, 0.3)):
    return AcceptancePrior(rates=rates, num_drafts=10, drafted_per_pos=(10,) * len(rates),
                           accepted_per_pos=tuple(int(r * 10) for r in rates), prompt_fingerprint=f"{week}{source}",
                           prompt_count=3, week=week, deployment=deployment, source=source)


def test_applicable_priors_newest_week_first_live_before_measured(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    upgraded = dataclasses.replace(IDENT, vllm_version="0.33.0")
    other_model = dataclasses.replace(IDENT, model="/m/other")
    for ident in (IDENT, upgraded, other_model):
        s.upsert_identity(ident)
    old = prior(week="2026-11-09")
    measured, live = prior(), prior(source="live", rates=(0.8, 0.6, 0.4))
    foreign = prior(week="2026-11-23", rates=(0.9, 0.8, 0.7))
    s.write_acceptance_prior(old, IDENT.key)
    s.write_acceptance_prior(measured, upgraded.key)  # same model/drafter/method on another vLLM: applies
    s.write_acceptance_prior(live, IDENT.key)
    s.write_acceptance_prior(foreign, other_model.key)  # another model: does not apply
    assert [p.prior_id for p in s.applicable_priors(IDENT)] == [live.prior_id, measured.prior_id, old.prior_id]
    assert s.latest_measured_prior("local", up_to_week="2026-11-16") == measured
    assert s.latest_measured_prior("local", up_to_week="2026-11-10") == old
    assert s.latest_measured_prior("nobody", up_to_week="2026-11-16") is None


def test_latest_table_and_latest_profiled_identity(tmp_path):
    s = TableTuneStore(tmp_path / "tt.duckdb")
    assert s.latest_table(IDENT.key) is None and s.latest_profiled_identity_key("/m/target") is None
    s.write_table(table())
    s.write_table(table(((1, 16, 2),)))
    assert s.latest_table(IDENT.key).ranges == ((1, 16, 2),)
    assert s.table_ids()[0] == table(((1, 16, 2),)).table_id
    s.write_profile_cell(IDENT, StepTimeCell(k=0, batch_size=1, median_ms=4.0, repetitions_ms=(4.0,)))
    assert s.latest_profiled_identity_key("/m/target") == IDENT.key
    assert s.has_identity(IDENT.key) and s.find_identity("nope") is None and s.profile_modes(IDENT.key) == ["one_launch"]


def test_the_store_never_draws_a_progress_bar_on_stdout(tmp_path):
    """DuckDB draws a progress bar on stdout for a query over 2 s; on a loaded machine that lands in
    ``tabletune table --format vllm``'s JSON or a caller's line protocol. Every store connection,
    read-only ones included, turns it off."""
    db = tmp_path / "tt.duckdb"
    TableTuneStore(db).upsert_identity(IDENT)
    for store in (TableTuneStore(db), TableTuneStore(db, read_only=True)):
        assert store.query("SELECT current_setting('enable_progress_bar')") == [(False,)]

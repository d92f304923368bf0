"""Where the controller appends its counters.

The export path (the fleet's ``live_counters``, the published file's ``export_path``) is written by
others, so it may name a file TableTune did not write. Before: the controller appended JSON lines to
whatever was there (a copied system file and a DuckDB store both grew). Now it appends only to a file
that is absent (it creates it) or already a live counters file: a regular file whose first line is a
``tabletune.live_counters`` window. Anything else is one ``LiveCountersError`` naming the file and
what it is, the file is byte-identical afterwards, the controller counts a failed export, logs one
line and serves on; the fleet loader and the publish gate refuse such a path up front."""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest
import yaml

from tabletune_pipelines.errors import FleetError, LiveCountersError, TableTuneError
from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
from tabletune_pipelines.evaluation.synthetic import linear_profile, publish
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import (
    MAX_LINE_BYTES,
    CounterWindow,
    append_line,
    check_live_counters_target,
    read_live_counters,
    window_line,
)
from tabletune_pipelines.formats.published_build import controller_fields
from tests.readers.conftest import assert_one_error, snapshot

T0 = datetime(2026, 11, 17, 10, tzinfo=timezone.utc)
T1 = datetime(2026, 11, 17, 10, 5, tzinfo=timezone.utc)
LINE = window_line(CounterWindow(deployment="local-cpu", window_start=T0, window_end=T1, num_drafts=10,
                                 drafted_per_pos=[10, 5, 2], accepted_per_pos=[6, 2, 1]))
PROFILE = linear_profile()


@functools.cache
def _duckdb_bytes() -> bytes:
    """The bytes of a small DuckDB database, built once outside every test's folder (no DuckDB side
    file can appear where a test compares snapshots). Its header starts with a random checksum, which
    holds a newline before its first NUL byte in ~3% of files: the binary check must not depend on it."""
    with tempfile.TemporaryDirectory() as tmp:
        with duckdb.connect(str(Path(tmp) / "db.duckdb")) as c:
            c.execute("CREATE TABLE t (x INTEGER)")
            c.execute("INSERT INTO t VALUES (1)")
        gc.collect()
        return (Path(tmp) / "db.duckdb").read_bytes()


def _duckdb(path):
    path.write_bytes(_duckdb_bytes())  # a copied DuckDB store


# (name, how to make it at PATH, what the refusal says it is)
FOREIGN = [
    ("a copied system file", lambda p: p.write_text("127.0.0.1 localhost\n::1 localhost\n"),
     "does not start with a JSON line"),
    ("a DuckDB database", _duckdb, "is a binary file (it holds NUL bytes)"),
    ("a DuckDB header whose checksum holds a newline",
     lambda p: p.write_bytes(b"\x9d\x11\n\xcc\xea\x1a\xd2XDUCK\xe7\x03\x00\x00" + _duckdb_bytes()[16:]),
     "is a binary file"),
    ("another JSON lines file", lambda p: p.write_text('{"event": "login", "user": 7}\n'),
     "does not start with a line of schema 'tabletune.live_counters'"),
    ("a JSON array", lambda p: p.write_text("[1, 2, 3]\n"), "does not start with a line of schema"),
    ("counters of a newer format", lambda p: p.write_text(LINE.replace('"schema_version":1', '"schema_version":2')
                                                         + "\n"), "holds schema_version 2 counters"),
    # An emptied file (log rotation, a crash) is the deployment's counters file: appended to
    # (tests/cli/test_torn_counters_file.py).
    ("a first line longer than a window", lambda p: p.write_bytes(b"x" * (MAX_LINE_BYTES + 10)),
     f"has a first line longer than {MAX_LINE_BYTES} bytes"),
    ("a folder", lambda p: p.mkdir(), "is a folder"),
    ("a named pipe", lambda p: os.mkfifo(p), "is not a regular file"),
    ("a symlink to a counters file", lambda p: (p.with_name("real.jsonl").write_text(LINE + "\n"),
                                                p.symlink_to(p.with_name("real.jsonl"))), "is a symbolic link"),
    ("a dangling symlink", lambda p: p.symlink_to(p.with_name("nowhere.jsonl")), "is a symbolic link"),
]
IDS = [c[0] for c in FOREIGN]


def _refused_message(path, reason):
    return f"refusing to append live counters to {path}: it {reason}"


@pytest.mark.parametrize("name,make,reason", FOREIGN, ids=IDS)
def test_append_line_writes_nothing_to_a_file_tabletune_did_not_write(tmp_path, name, make, reason):
    target = tmp_path / "live.jsonl"
    make(target)
    before = snapshot(tmp_path)
    for attempt in (lambda: append_line(target, LINE), lambda: check_live_counters_target(target)):
        with pytest.raises(LiveCountersError) as err:
            attempt()
        assert isinstance(err.value, TableTuneError)
        assert _refused_message(target, reason) in str(err.value), str(err.value)
    assert snapshot(tmp_path) == before  # bytes and mtime of every file, the link's target included
    assert not (tmp_path / "nowhere.jsonl").exists()  # a dangling link is not followed into a new file


def test_a_device_is_refused_before_it_is_opened():
    with pytest.raises(LiveCountersError, match="/dev/null: it is not a regular file"):
        append_line("/dev/null", LINE)


def test_absent_and_its_own_files_are_appended_to(tmp_path):
    target = tmp_path / "live.jsonl"
    check_live_counters_target(target)  # nothing there: fine, and nothing created by the check
    assert not target.exists()
    append_line(target, LINE)
    later = window_line(CounterWindow(deployment="local-cpu", window_start=T1, window_end=T1.replace(minute=9),
                                      num_drafts=4, drafted_per_pos=[4, 2, 1], accepted_per_pos=[2, 1, 0]))
    append_line(target, later)
    assert len(read_live_counters(target).windows) == 2
    # A torn last line (a writer killed mid-append) does not make it someone else's file.
    with open(target, "ab") as fh:
        fh.write(b'{"schema": "tabletune.live_co')
    check_live_counters_target(target)
    append_line(target, window_line(CounterWindow(deployment="local-cpu", window_start=T1.replace(minute=9),
                                                  window_end=T1.replace(minute=12), num_drafts=1,
                                                  drafted_per_pos=[1, 0, 0], accepted_per_pos=[1, 0, 0])))
    read = read_live_counters(target)
    assert len(read.windows) == 3 and read.skipped_partial_last_line


def test_a_first_write_that_fails_leaves_no_file_behind(tmp_path, monkeypatch):
    target = tmp_path / "live.jsonl"

    def short_write(fd, data):
        return len(data) // 2

    monkeypatch.setattr(os, "write", short_write)
    with pytest.raises(OSError, match="short write"):
        append_line(target, LINE)
    monkeypatch.undo()
    assert not target.exists()  # no torn first line left for readers to skip and commands to note
    append_line(target, LINE)
    assert len(read_live_counters(target).windows) == 1


# -- the controller: no write, one line, a failed export, serving goes on ------------------------------

@pytest.mark.parametrize("name,make,reason", [FOREIGN[0], FOREIGN[1], FOREIGN[10]], ids=IDS[:2] + IDS[10:11])
def test_the_controller_serves_on_and_never_writes_there(tmp_path, caplog, name, make, reason):
    target = tmp_path / "victim"
    make(target)
    before = snapshot(tmp_path)
    clock = [1000.0]
    pub = publish(tmp_path / "pub" / "p.json", ranges=((1, 8, 3), (9, 16, 1)), rates=(0.7, 0.5, 0.3),
                  controller={"export_path": str(target), "export_every_steps": 10, "rebuild_every_steps": 10})
    with caplog.at_level(logging.WARNING, logger="tabletune.controller"):
        c = fake_controller(pub, clock)
        assert c.controlling
        FakeEngine(c, (0.7, 0.5, 0.3), lambda b, k: PROFILE[k][b], clock=clock).run(100, 8)
        c.close()
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("pub")} == \
        {k: v for k, v in before.items() if not k.startswith("pub")}  # the victim (and its link target) untouched
    assert c.exports == 0 and c.export_failures >= 1 and c.errors == 0 and c.rebuilds >= 5
    refusals = [r.getMessage() for r in caplog.records if "live counters" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert _refused_message(target, reason) in refusals[0] and "serving goes on" in refusals[0]


def test_the_fleet_loader_refuses_such_a_live_counters_path(tmp_path, home):
    victim = tmp_path / "hosts"
    victim.write_text("127.0.0.1 localhost\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"schema_version": 1, "deployments": [{
        "name": "a", "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": None, "method": "ngram",
        "max_k": 3, "max_num_seqs": 16, "logged_prompts": "prompts/a", "published_table": "published/a.json",
        "live_counters": str(victim)}]}))
    before = snapshot(tmp_path)
    with pytest.raises(FleetError) as err:
        load_fleet(fleet)
    (msg,) = str(err.value).splitlines()
    assert msg.startswith(f"fleet file {fleet}, deployment 'a': 'live_counters': ") and \
        _refused_message(victim, "does not start with a JSON line") in msg, msg
    assert snapshot(tmp_path) == before


def test_the_cli_names_it_in_one_error_line(tmp_path, home, run_cli):
    victim = home / "store-copy.duckdb"
    _duckdb(victim)
    fleet = home / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"schema_version": 1, "deployments": [{
        "name": "a", "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": None, "method": "ngram",
        "max_k": 3, "max_num_seqs": 16, "logged_prompts": "prompts/a", "published_table": "published/a.json",
        "live_counters": str(victim)}]}))
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", fleet, "show"), "deployment 'a'", "'live_counters'", str(victim))
    assert snapshot(home) == before


def test_the_publish_gate_refuses_it_before_anything_is_published(tmp_path):
    victim = tmp_path / "hosts"
    victim.write_text("127.0.0.1 localhost\n")
    before = snapshot(tmp_path)
    with pytest.raises(LiveCountersError, match="does not start with a JSON line"):
        controller_fields(controller={}, live_counters=victim)
    with pytest.raises(LiveCountersError, match="is a folder"):
        controller_fields(controller={"export_path": str(tmp_path)})
    assert snapshot(tmp_path) == before
    good = tmp_path / "live.jsonl"
    assert controller_fields(live_counters=good)["controller"] == {"export_path": str(good)}
    append_line(good, LINE)
    assert controller_fields(live_counters=good)["controller"]["export_path"] == str(good)
    assert json.loads(good.read_text())["schema"] == "tabletune.live_counters"

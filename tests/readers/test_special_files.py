"""Paths that are not regular files, in every reader: a named pipe blocked each
reader forever (opening a FIFO for reading waits for a writer), and a device such as /dev/zero
never ends. Every reader now stats the path first and opens only regular files, with O_NONBLOCK
(``strict_io.open_regular``): each case is one TableTuneError naming the path and what it is, the
pipe is still a pipe afterwards, nothing else changed, the CLI prints one ``error:`` line, and the
controller keeps the engine's table with one log line.

Every test here would hang if a reader opened the pipe for a blocking read: the timeout mark turns
that into a failure."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from tabletune_pipelines.formats.control_protocol import ControlReader, ControlWriter, ack_path
from tabletune_pipelines.engine.acceptance import FINGERPRINT_KEY_FILE, fingerprint_key
from tabletune_pipelines.errors import (
    DocumentError,
    FleetError,
    InvalidValueError,
    LiveCountersError,
    PromptFileError,
    PublishedTableError,
    StoreError,
    TableTuneError,
)
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import read_live_counters
from tabletune_pipelines.formats.prompts import count_prompts, load_prompts
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.export import import_profiles
from tests.readers.conftest import assert_one_error, snapshot

pytestmark = pytest.mark.timeout(120)

KINDS = {"fifo": "a named pipe (FIFO)", "device": "a character device"}


def make(path: Path, kind: str) -> Path:
    """A named pipe, or a link to /dev/zero (a character device that never ends), at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        os.symlink("/dev/zero", path)
    return path


def still_there(path: Path, kind: str) -> bool:
    mode = os.stat(path).st_mode
    return stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


READERS = [
    ("published table", PublishedTableError, lambda p: read_published_table(p), "published table {p} is {what}"),
    ("fleet file", FleetError, lambda p: load_fleet(p), "fleet file {p} is {what}"),
    ("prompt file (load)", PromptFileError, lambda p: load_prompts(p), "prompt file {p} is {what}"),
    ("prompt file (count)", PromptFileError, lambda p: count_prompts(p), "prompt file {p} is {what}"),
    ("live counters", LiveCountersError, lambda p: read_live_counters(p), "live counters file {p} is {what}"),
    ("store, read-only", StoreError, lambda p: TableTuneStore(p, read_only=True), "the store path {p} is {what}"),
    ("store, read-write", StoreError, lambda p: TableTuneStore(p), "the store path {p} is {what}"),
    ("exported profile", DocumentError, lambda p: import_profiles(None, [p]), "profile file {p}: it is {what}"),
]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name,error,read,message", READERS, ids=[r[0] for r in READERS])
def test_every_reader_refuses_what_is_not_a_regular_file(tmp_path, home, kind, name, error, read, message):
    path = make(tmp_path / "input", kind)
    (tmp_path / "other.txt").write_text("untouched\n")
    before = snapshot(tmp_path)
    with pytest.raises(error) as err:
        read(path)
    msg = str(err.value)
    assert isinstance(err.value, TableTuneError)
    assert msg.startswith(message.format(p=path, what=KINDS[kind])), msg
    assert still_there(path, kind) and snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "input", "other.txt"]  # no .wal, no temp file


def test_the_control_file_reader_acknowledges_a_pipe_with_an_error(tmp_path):
    ctl = make(tmp_path / "ctl.json", "fifo")
    reader = ControlReader(str(ctl))
    assert reader.poll() is None  # does not block, does not raise into the engine
    ack = json.loads(ack_path(ctl).read_text())
    assert ack["ack"] is None and "named pipe (FIFO), not a regular file" in ack["error"]
    assert still_there(ctl, "fifo")
    writer = ControlWriter(tmp_path / "other.json")  # the writer side reads the channel's seq and ack
    os.mkfifo(writer.ack_path)
    assert writer.read_ack() is None and ControlWriter(tmp_path / "other.json").last_seq == 0


def test_a_fingerprint_key_that_is_a_pipe_is_refused(home):
    make(home / FINGERPRINT_KEY_FILE, "fifo")
    with pytest.raises(InvalidValueError, match=f"fingerprint key {home / FINGERPRINT_KEY_FILE} is not a regular file"):
        fingerprint_key(home)
    assert still_there(home / FINGERPRINT_KEY_FILE, "fifo")


# -- the CLI: one error line, exit 2 --------------------------------------------------------------

def test_the_cli_names_a_pipe_given_as_any_input(run_cli, home):
    from tests.readers.test_published_reader import FLEET_TEXT

    fifo = make(home / "pipe", "fifo")
    assert_one_error(run_cli("--fleet", fifo, "show"), f"fleet file {fifo} is a named pipe (FIFO)")
    assert_one_error(run_cli("acceptance", "--prompts", fifo), f"prompt file {fifo} is a named pipe (FIFO)")
    assert_one_error(run_cli("--db", fifo, "table"), f"the store path {fifo} is a named pipe (FIFO)")
    fleet = home / "fleet.yaml"
    fleet.write_text(FLEET_TEXT)
    (home / "published").mkdir()
    make(home / "published" / "a.json", "fifo")
    assert_one_error(run_cli("--fleet", fleet, "show"), f"published table {home / 'published' / 'a.json'} is a named "
                                                        "pipe (FIFO)")
    assert still_there(fifo, "fifo") and still_there(home / "published" / "a.json", "fifo")
    assert not (home / "tabletune_store.duckdb").exists()


# -- the controller keeps serving on the engine's own table ----------------------------------------

def test_the_controller_falls_back_with_one_line_when_the_published_file_is_a_pipe(tmp_path, caplog):
    from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
    from tabletune_pipelines.evaluation.synthetic import linear_profile

    clock = [1000.0]
    pub = make(tmp_path / "pub.json", "fifo")
    with caplog.at_level(logging.INFO, logger="tabletune.controller"):
        c = fake_controller(pub, clock)
    assert c.start is None and c.next_lookup() is None  # the engine's configured table stays in force
    assert f"published table {pub} is a named pipe (FIFO)" in c.fallback_reason
    (line,) = [r.getMessage() for r in caplog.records]
    assert "using the engine's configured table" in line and "named pipe" in line
    profile = linear_profile()
    FakeEngine(c, (0.5, 0.3, 0.1), lambda b, k: profile[k][b], clock=clock).run(50, 4)
    assert c.steps == 50 and c.errors == 0

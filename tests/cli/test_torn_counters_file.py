"""Hostile input, fourth round, class 4: a half-written counters file does not lock out read-only commands.

A ``live_counters`` file emptied to 0 bytes (log rotation, a crash) or whose only line is a window cut
off by a writer killed mid-append is still the deployment's counters file: the fleet loads, ``show``
and ``table`` work and print one note naming the file, and the controller's next export recovers by
appending (nothing truncated or moved; readers skip the torn line by number). A file that was never a
counters file is still refused."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tabletune_pipelines.cli import main
from tabletune_pipelines.errors import FleetError, LiveCountersError
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import (
    CounterWindow,
    append_line,
    counters_damage,
    read_live_counters,
    window_line,
)
from tests.cli.test_cli_evidence import IDENT
from tests.cli.test_cli_show import publish


def window() -> CounterWindow:
    return CounterWindow(deployment="local-cpu", window_start=datetime(2026, 12, 6, 10, tzinfo=timezone.utc),
                         window_end=datetime(2026, 12, 6, 10, 5, tzinfo=timezone.utc), num_drafts=100,
                         drafted_per_pos=(100, 80, 60), accepted_per_pos=(70, 40, 20), source="host:1", seq=0)


WHOLE = window_line(window()).encode()

#: name -> (file bytes, what the note says, line numbers the reader skips after the next export)
DAMAGED = {
    "emptied": (b"", "is empty (0 bytes", ()),
    "torn only line": (WHOLE[:57], "has a half-written first line (57 bytes", (1,)),
    "torn in a UTF-8 sequence": (WHOLE[:30] + "é".encode()[:1],
                                 "has a half-written first line", (1,)),
    "torn after one byte": (b"{", "has a half-written first line (1 bytes", (1,)),
    "torn schema-first line": (b'{"schema": "tabletune.live_co', "has a half-written first line", (1,)),
}


@pytest.fixture
def counters(home):
    path = load_fleet().deployments[0].live_counters
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("name", list(DAMAGED))
def test_show_and_table_work_and_name_the_damaged_file_in_one_note(counters, capsys, name):
    data, said, _ = DAMAGED[name]
    counters.write_bytes(data)
    publish()
    capsys.readouterr()
    for args in (["show"], ["table", "--format", "vllm", "--identity", IDENT.key]):
        assert main(args) == 0, args
        out, err = capsys.readouterr()
        assert out.strip()
        assert err.count("\n") == 1 and err.startswith(f"note: live counters file {counters} {said}"), err
    assert counters.read_bytes() == data  # read-only commands wrote nothing


@pytest.mark.parametrize("name", list(DAMAGED))
def test_the_controllers_export_recovers_and_loses_nothing(tmp_path, name):
    data, _, skipped = DAMAGED[name]
    path = tmp_path / "live.jsonl"
    path.write_bytes(data)
    append_line(path, WHOLE.decode())  # what the controller's window.write calls
    assert path.read_bytes().startswith(data)  # nothing truncated
    read = read_live_counters(path, max_k=3)
    assert len(read.windows) == 1 and read.skipped_lines == skipped
    assert read.windows[0].accepted_per_pos == (70, 40, 20)
    note = counters_damage(path)
    assert note is None if not skipped else note.endswith(
        "the windows after it are read; the controller's next export appends after it and readers skip the torn "
        "line (docs/operations.md)"), note


def test_a_whole_file_gets_no_note(tmp_path):
    path = tmp_path / "live.jsonl"
    append_line(path, WHOLE.decode())
    assert counters_damage(path) is None
    assert counters_damage(tmp_path / "absent.jsonl") is None


@pytest.mark.parametrize("data", [b"hello\n", b'{"colour": "bl', b"\x00\x01binary", b"[1, 2"])
def test_a_file_that_was_never_a_counters_file_is_still_refused(home, counters, data):
    counters.write_bytes(data)
    with pytest.raises(FleetError, match="'live_counters': refusing to append live counters to"):
        load_fleet()
    with pytest.raises(LiveCountersError, match="not a live counters file TableTune wrote"):
        append_line(counters, WHOLE.decode())
    assert counters.read_bytes() == data
    assert counters_damage(counters) is None

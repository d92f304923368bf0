"""Two messages that say where: a live-counters line that is neither a window nor the start of one cut
off is an error naming its line, wherever it is; a torn line (a writer killed mid-append) is skipped
and reported by its number, in the middle of the file too. And fleet paths whose variables climb out
of the folder they name (``${WHO:-../..}``) or out of ``${TABLETUNE_HOME}`` are refused by key."""

from __future__ import annotations

import pytest

from tabletune_pipelines.errors import FleetError, LiveCountersError
from tabletune_pipelines.formats.fleet import parse_fleet
from tabletune_pipelines.formats.live_counters import is_torn, read_live_counters
from tests.readers.test_fleet_reader import dep
from tests.readers.test_live_counters_reader import line, write


@pytest.mark.parametrize("garbage", [b"hello world", b"{garbage}", b'{"a": 1} trailing', b"]", b"42 and more",
                                     b'{"a": x', b"\x00\x01binary"])
@pytest.mark.parametrize("where", ["middle", "last"])
def test_garbage_is_an_error_naming_its_line(tmp_path, garbage, where):
    lines = [line(0, 1), garbage, line(1, 2)] if where == "middle" else [line(0, 1), line(1, 2), garbage]
    p = write(tmp_path, *lines)
    no = 2 if where == "middle" else 3
    with pytest.raises(LiveCountersError) as err:
        read_live_counters(p)
    assert f"live.jsonl:{no}:" in str(err.value) and "half-written" not in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_torn_lines_are_skipped_and_reported_by_number(tmp_path):
    torn = line(1, 2)[:57]
    p = write(tmp_path, line(0, 1), torn, line(1, 2), line(2, 3)[:30])
    read = read_live_counters(p)
    assert len(read.windows) == 2 and read.skipped_lines == (2, 4) and read.skipped_partial_last_line


@pytest.mark.parametrize("text,torn", [('{"schema": "tabletune.live_co', True), ('{"a": 1,', True), ('{"a": tru', True),
                                       ('{"a": [1, 2', True), ('{"controller":{"a":1}', True), ("{garbage}", False),
                                       ("hello", False), ('{"a":1}}', False), ('{"a": 1x', False)])
def test_what_counts_as_torn(text, torn):
    assert is_torn(text) is torn


@pytest.mark.parametrize("value,needle", [
    ("${TABLETUNE_HOME}/prompts/${WHO:-../..}", "${WHO:-../..} expands to '../..', which climbs folders"),
    ("${TABLETUNE_HOME}/../../etc/tabletune", "leaves the TableTune home folder"),
    ("/data/${SUB:-../../etc}/prompts", "climbs folders"),
])
def test_a_path_that_climbs_out_of_what_it_names_is_flagged(tmp_path, monkeypatch, value, needle):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WHO", raising=False)
    monkeypatch.delenv("SUB", raising=False)
    with pytest.raises(FleetError) as err:
        parse_fleet({"schema_version": 1, "deployments": [dep(logged_prompts=value)]}, source="F.yaml")
    assert needle in str(err.value) and "logged_prompts" in str(err.value), str(err.value)


def test_paths_inside_the_home_and_plain_absolute_paths_load(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WHO", "team-a")
    fleet = parse_fleet({"schema_version": 1, "deployments": [dep(
        logged_prompts="${TABLETUNE_HOME}/prompts/${WHO:-x}/../b", published_table="/data/tabletune/a.json")]},
        source="F.yaml")
    assert fleet.deployments[0].logged_prompts == tmp_path / "home" / "prompts" / "team-a" / ".." / "b"

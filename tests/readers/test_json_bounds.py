"""Deeply nested JSON and integers with thousands of digits, in every reader.

Before: ``RecursionError`` (nesting past Python's recursion limit) or ``ValueError`` (an integer of
more than 4300 digits) escaped as tracebacks, a control file like that made the engine's reader
raise without writing an ack, and the controller's loader raised instead of falling back. Now the
one strict parser (``strict_io.loads``) refuses nesting past 64 levels and integers of more than
32 digits, and each reader names the file (and line); the file is byte-identical afterwards.
Worked examples sit just past the bounds and far past Python's own limits."""

from __future__ import annotations

import json
import logging

import pytest

from tabletune_pipelines.formats.control_protocol import ControlReader, ControlWriter, ack_path
from tabletune_pipelines.formats.documents import DraftLengthTable, StepTimeProfile
from tabletune_pipelines.errors import (
    FleetError,
    LiveCountersError,
    PromptFileError,
    PublishedTableError,
    SchemaVersionError,
)
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.formats.live_counters import read_live_counters
from tabletune_pipelines.formats.prompts import count_prompts
from tabletune_pipelines.formats.published import load_published
from tests.readers.conftest import assert_one_error, snapshot

pytestmark = pytest.mark.timeout(120)

DEEP_65 = "[" * 65 + "]" * 65  # one level past the bound
DEEP_100K = "[" * 100_000 + "]" * 100_000  # far past Python's recursion limit (was a RecursionError)
INT_33 = "7" * 33  # one digit past the bound
INT_5000 = "7" * 5000  # past Python's 4300-digit limit (was a ValueError)
INT_400 = "7" * 400  # parsed by Python, then an OverflowError as a float

VALUES = [("nested 65 deep", DEEP_65, "arrays or objects nested more than 64 levels deep"),
          ("nested 100000 deep", DEEP_100K, "arrays or objects nested more than 64 levels deep"),
          ("33-digit integer", INT_33, "an integer of 33 digits"),
          ("400-digit integer", INT_400, "an integer of 400 digits"),
          ("5000-digit integer", INT_5000, "an integer of 5000 digits")]
IDS = [v[0] for v in VALUES]


# -- the published table (the controller's reader) --------------------------------------------------

def published_text(tmp_path, value: str) -> str:
    from tabletune_pipelines.evaluation.synthetic import publish

    p = publish(tmp_path / "good.json", ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3))
    text = p.read_text()
    p.unlink()
    assert '"predicted_worst_loss": 0.0' in text
    return text.replace('"predicted_worst_loss": 0.0', f'"predicted_worst_loss": {value}')


@pytest.mark.parametrize("name,value,message", VALUES, ids=IDS)
def test_the_published_reader_names_the_file(tmp_path, name, value, message):
    path = tmp_path / "pub.json"
    path.write_text(published_text(tmp_path, value))
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError) as err:
        load_published(path)
    assert str(err.value).startswith(f"published table {path} is not valid JSON: {message}"), str(err.value)
    assert snapshot(tmp_path) == before


def test_published_values_that_used_to_escape_as_other_exceptions(tmp_path):
    """Keys that are digits only to ``str.isdigit`` (a ValueError from ``int``), and speculative-config
    ranges of mixed types (a TypeError from sorting) are named like any other bad value."""
    from tabletune_pipelines.evaluation.synthetic import publish

    good = json.loads(publish(tmp_path / "g.json", ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3)).read_text())
    for mutate, message in (
            (lambda d: d["table"]["step_ms"].update({"²": {"1": 1.0}}), "table.step_ms key '²' must be a k"),
            (lambda d: d["table"]["step_ms"]["1"].update({"9" * 5000: 1.0}), "must be a batch size >= 1"),
            (lambda d: d["speculative_config"].update(num_speculative_tokens_per_batch_size=[[1, 16, "x"], [{}]]),
             "differs from table.ranges"),
            (lambda d: d["table"]["step_ms"]["1"].update({"1": 1e300}), "1e+300 must be a finite number >= 0.001 and <= 1e+07")):
        doc = json.loads(json.dumps(good))
        mutate(doc)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(PublishedTableError, match=message.replace("+", r"\+").replace("[", r"\[")):
            load_published(path)


@pytest.mark.parametrize("name,value,message", VALUES, ids=IDS)
def test_the_controller_keeps_the_engines_table_and_logs_one_line(tmp_path, caplog, name, value, message):
    from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
    from tabletune_pipelines.evaluation.synthetic import linear_profile

    path = tmp_path / "pub.json"
    path.write_text(published_text(tmp_path, value))
    clock = [1000.0]
    with caplog.at_level(logging.INFO, logger="tabletune.controller"):
        c = fake_controller(path, clock)
    assert c.start is None and c.next_lookup() is None and message in c.fallback_reason
    (line,) = [r.getMessage() for r in caplog.records]
    assert "using the engine's configured table" in line and str(path) in line and message in line
    profile = linear_profile()
    FakeEngine(c, (0.5, 0.3, 0.1), lambda b, k: profile[k][b], clock=clock).run(50, 4)
    assert c.steps == 50 and c.errors == 0


def test_the_loader_never_raises_even_on_a_reader_bug(tmp_path, monkeypatch):
    """A hostile file that slipped past the reader as some other exception is still a fallback."""
    from tabletune_pipelines.controller import loader
    from tabletune_pipelines.evaluation.synthetic import ENGINE

    def broken(path):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(loader, "load_published", broken)
    reason = loader.load_start(tmp_path / "pub.json", ENGINE)
    assert reason == f"published table {tmp_path / 'pub.json'} could not be read (RecursionError: maximum recursion " \
                     "depth exceeded)"


# -- live counters, prompts, control files, the fleet file, stored documents ------------------------

@pytest.mark.parametrize("name,value,message", VALUES, ids=IDS)
def test_the_live_counters_reader_names_the_line(tmp_path, name, value, message):
    from tests.readers.test_live_counters_reader import line

    bad = json.loads(line(1, 2))
    bad["controller"] = {"x": "__V__"}
    path = tmp_path / "live.jsonl"
    path.write_text(line(0, 1) + "\n" + json.dumps(bad).replace('"__V__"', value) + "\n" + line(2, 3) + "\n")
    before = snapshot(tmp_path)
    with pytest.raises(LiveCountersError) as err:
        read_live_counters(path)
    assert str(err.value).startswith(f"{path}:2: not valid JSON ({message}"), str(err.value)
    assert snapshot(tmp_path) == before


SECRET = "Patient 4711 diabetes mellitus"


@pytest.mark.parametrize("name,value,message", VALUES, ids=IDS)
def test_the_prompt_reader_names_the_line_and_never_quotes_it(tmp_path, name, value, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + f'{{"prompt": "{SECRET}", "meta": {value}}}\n')
    before = snapshot(tmp_path)
    with pytest.raises(PromptFileError) as err:
        count_prompts(path)
    msg = str(err.value)
    assert msg.startswith(f"prompt file {path}, line 2: not strict JSON ({message}"), msg
    assert "Patient" not in msg and snapshot(tmp_path) == before


def test_a_prompt_line_with_any_key_twice_is_refused_without_naming_the_key(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(f'{{"prompt": "x", "{SECRET}": 1, "{SECRET}": 2}}\n')
    with pytest.raises(PromptFileError, match=r"line 1: the object has a key \(of length 30\) more than once") as err:
        count_prompts(path)
    assert "Patient" not in str(err.value)


@pytest.mark.parametrize("name,value,message", VALUES, ids=IDS)
def test_the_control_reader_acknowledges_with_the_error_and_applies_nothing(tmp_path, name, value, message):
    path = tmp_path / "ctl.json"
    path.write_text(f'{{"seq": 1, "k": {value}}}')
    reader = ControlReader(str(path))
    assert reader.poll() is None and reader.last_seq == 0  # never raises into the engine
    ack = json.loads(ack_path(path).read_text())
    assert ack["ack"] is None and f"unreadable command: {message}" in ack["error"]
    assert ControlWriter(path).last_seq == 0  # the writer side reads the same file without raising


def test_a_control_file_whose_seq_has_5000_digits(tmp_path):
    path = tmp_path / "ctl.json"
    path.write_text(f'{{"seq": {INT_5000}}}')
    assert ControlReader(str(path)).poll() is None
    assert "an integer of 5000 digits" in json.loads(ack_path(path).read_text())["error"]


def test_the_fleet_file_names_the_line_of_a_huge_integer(tmp_path, home):
    from tests.readers.test_fleet_reader import GOOD

    for digits in (33, 5000):
        path = tmp_path / "fleet.yaml"
        path.write_text(GOOD.replace("max_k: 3", f"max_k: {'7' * digits}"))
        before = snapshot(tmp_path)
        with pytest.raises(FleetError) as err:
            load_fleet(path)
        assert str(err.value) == f"fleet file {path}, line 9: an integer of {digits} digits (at most 32 are allowed)"
        assert snapshot(tmp_path) == before


def test_stored_documents_are_bounded_too():
    with pytest.raises(SchemaVersionError, match="arrays or objects nested more than 64 levels deep"):
        DraftLengthTable.from_json('{"x": ' + DEEP_100K + "}")
    with pytest.raises(SchemaVersionError, match="an integer of 5000 digits"):
        StepTimeProfile.from_json('{"schema": "tabletune.step_time_profile", "n": ' + INT_5000 + "}")


# -- the CLI ------------------------------------------------------------------------------------------

def test_the_cli_prints_one_error_line(run_cli, home):
    from tests.readers.test_fleet_reader import GOOD
    from tests.readers.test_published_reader import FLEET_TEXT

    fleet = home / "fleet.yaml"
    fleet.write_text(FLEET_TEXT)
    pub = home / "published" / "a.json"
    pub.parent.mkdir()
    pub.write_text(published_text(home, DEEP_100K))
    prompts = home / "p.jsonl"
    prompts.write_text(f'{{"prompt": "{SECRET}", "n": {INT_5000}}}\n')
    big = home / "big.yaml"
    big.write_text(GOOD.replace("max_k: 3", f"max_k: {INT_5000}"))
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", fleet, "show"), f"published table {pub} is not valid JSON: "
                                                        "arrays or objects nested more than 64 levels deep")
    err = assert_one_error(run_cli("acceptance", "--prompts", prompts), f"prompt file {prompts}, line 1: not strict "
                                                                        "JSON (an integer of 5000 digits")
    assert "Patient" not in err
    assert_one_error(run_cli("--fleet", big, "show"), f"fleet file {big}, line 9: an integer of 5000 digits")
    assert snapshot(home) == before

"""The live-counters format the controller writes and the pipeline reads."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.errors import LiveCountersError
from tabletune_pipelines.formats.live_counters import (
    CounterWindow,
    append_line,
    parse_window,
    read_live_counters,
    window_line,
)

T0 = datetime(2026, 11, 23, 10, tzinfo=timezone.utc)


def line(**kw):
    base = dict(deployment="d", window_start=T0, window_end=T0 + timedelta(seconds=5), num_drafts=10,
                drafted_per_pos=[10, 8, 8], accepted_per_pos=[7, 4, 2])
    base.update(kw)
    return window_line(CounterWindow(**base))


def test_new_fields_round_trip(tmp_path):
    text = line(tokens=123, busy_s=0.75, estimate=[0.7, 0.5, 0.25], source="h:1:2", seq=4,
                controller={"table": [[1, 16, 3]]}, steps=40, table_version=3, identity_key="id")
    w = parse_window(json.loads(text), "x")
    assert (w.tokens, w.busy_s, w.estimate, w.source, w.seq, w.steps, w.table_version) == \
        (123, 0.75, (0.7, 0.5, 0.25), "h:1:2", 4, 40, 3)
    assert w.controller == {"table": [[1, 16, 3]]}
    assert w.window_end - w.window_start == timedelta(seconds=5)
    assert text.count("\n") == 0


@pytest.mark.parametrize("kw,message", [
    (dict(num_drafts=5), "num_drafts = 5 < drafted_per_pos[1] = 10"),
    (dict(estimate=[0.5, 0.7, 0.2]), "non-increasing"),
    (dict(estimate=[0.5, 0.2]), "must be 3 rates"),
    (dict(busy_s=-1.0), "'busy_s' = -1.0"),
    (dict(drafted_per_pos=[10] * 65, accepted_per_pos=[1] * 65), "at most 64"),
])
def test_bad_windows_are_refused(kw, message):
    with pytest.raises(LiveCountersError) as err:
        line(**kw)
    assert message in str(err.value)


def test_nan_and_huge_lines_are_refused(tmp_path):
    p = tmp_path / "c.jsonl"
    obj = json.loads(line())
    obj["busy_s"] = float("nan")
    p.write_text(json.dumps(obj) + "\n" + line() + "\n")
    with pytest.raises(LiveCountersError, match=r"c.jsonl:1: not valid JSON .*NaN"):
        read_live_counters(p)
    p.write_text(line() + "\n" + "{" + " " * 300_000 + "}\n")
    with pytest.raises(LiveCountersError, match="c.jsonl:2: line of 300002 bytes"):
        read_live_counters(p)


def test_a_writer_killed_mid_line_does_not_poison_the_file(tmp_path):
    p = tmp_path / "c.jsonl"
    append_line(p, line())
    with open(p, "a") as fh:
        fh.write(line()[:40])  # killed mid-append
    append_line(p, line(num_drafts=11, source="h:2:3"))  # the restarted controller starts a fresh line
    read = read_live_counters(p)
    assert [w.num_drafts for w in read.windows] == [10, 11]
    assert read.skipped_partial_last_line
    assert p.read_text().count("\n") == 3


def test_non_utf8_line_is_named(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(line().encode() + b"\n\xff\xfe{}\n" + line().encode() + b"\n")
    with pytest.raises(LiveCountersError, match="c.jsonl:2: not UTF-8"):
        read_live_counters(p)

"""The live-counters reader under hostile input: the file read as a
sequence (a window exported twice counts once, overlapping or out-of-order windows of one writer
are refused), bounded sizes (line length, draft positions <= max_k), and bytes that are not UTF-8.
Each refusal is one LiveCountersError naming the file and line; reading writes nothing."""

from __future__ import annotations

import json
import tracemalloc
from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.errors import InvalidValueError, LiveCountersError, TableTuneError
from tabletune_pipelines.formats.live_counters import MAX_LINE_BYTES, CounterWindow, read_live_counters, window_line
from tabletune_pipelines.tuning.feedback import live_prior, unique_windows
from tests.readers.conftest import snapshot

T0 = datetime(2026, 11, 17, 10, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)


def line(start=0, end=1, source="h:1:1", seq=None, drafts=100, **kw):
    base = dict(deployment="local-cpu", window_start=T0 + start * MIN, window_end=T0 + end * MIN, num_drafts=drafts,
                drafted_per_pos=[drafts, drafts // 2, drafts // 4], accepted_per_pos=[drafts // 2, drafts // 4, 1],
                source=source, seq=seq)
    base.update(kw)
    return window_line(CounterWindow(**base))


def write(tmp_path, *lines: str | bytes):
    p = tmp_path / "live.jsonl"
    p.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return p


def refused(path, match, **kw):
    before = snapshot(path.parent)
    with pytest.raises(LiveCountersError) as err:
        read_live_counters(path, **kw)
    assert snapshot(path.parent) == before
    assert isinstance(err.value, TableTuneError) and str(err.value).startswith(f"{path}:"), str(err.value)
    assert match in str(err.value), str(err.value)
    return str(err.value)


# -- the file as a sequence -------------------------------------------------------------------------

def test_a_window_exported_twice_is_counted_once(tmp_path):
    once = read_live_counters(write(tmp_path, line(0, 1), line(1, 2)))
    twice = read_live_counters(write(tmp_path, line(0, 1), line(1, 2), line(0, 1)))
    again = read_live_counters(write(tmp_path, line(0, 1), line(1, 2), line(0, 1), line(1, 2)))  # file appended to itself
    assert [w.window_start for w in twice.windows] == [w.window_start for w in once.windows]
    assert (once.duplicates, twice.duplicates, again.duplicates) == (0, 1, 2)
    assert once.fingerprint == twice.fingerprint == again.fingerprint  # the prior id follows the counts
    live = [live_prior("local-cpu", "2026-11-16", r.windows, max_k=3, measured=None, prior_weight=2000,
                       counters_fingerprint=r.fingerprint) for r in (once, twice)]
    assert live[0].prior == live[1].prior and live[1].windows == 2 and live[1].prior.num_drafts == 200


def test_live_prior_counts_a_duplicated_window_once_even_from_a_list():
    from tabletune_pipelines.formats.live_counters import parse_window

    w = parse_window(json.loads(line(0, 1)), "x")
    assert unique_windows([w, w]) == [w]
    a = live_prior("d", "2026-11-16", [w], max_k=3, measured=None, prior_weight=1, counters_fingerprint="f")
    b = live_prior("d", "2026-11-16", [w, w], max_k=3, measured=None, prior_weight=1, counters_fingerprint="f")
    assert a.prior == b.prior and b.windows == 1


SEQUENCE_CASES = [
    ("overlap", [line(0, 2), line(1, 3)], "line 2", "overlaps the window"),
    ("out of order", [line(5, 6), line(0, 1)], "line 2", "starts before the window"),
    ("inside the previous", [line(0, 10), line(2, 3)], "line 2", "overlaps"),
    ("same window, other counts", [line(0, 1), line(1, 2), line(0, 1, drafts=400)], "line 3",
     "is also on line 1 with other counts"),
    ("overlap without a source", [line(0, 2, source=None), line(1, 3, source=None)], "line 2", "overlaps"),
]


@pytest.mark.parametrize("name,lines,where,message", SEQUENCE_CASES, ids=[c[0] for c in SEQUENCE_CASES])
def test_overlapping_and_out_of_order_windows_of_one_writer_are_refused(tmp_path, name, lines, where, message):
    path = write(tmp_path, *lines)
    assert refused(path, message).startswith(f"{path}:{where.split()[-1]}:")


def test_two_writers_may_overlap_and_adjacent_windows_are_fine(tmp_path):
    read = read_live_counters(write(tmp_path, line(0, 2, source="a:1:1"), line(1, 3, source="b:2:2"),
                                   line(2, 4, source="a:1:1"), line(4, 4, source="a:1:1")))
    assert len(read.windows) == 4 and read.duplicates == 0


COUNT_CASES = [
    ("num_drafts below position 1", dict(num_drafts=5, drafted_per_pos=[10, 5, 1], accepted_per_pos=[1, 1, 1]),
     "num_drafts = 5 < drafted_per_pos[1] = 10"),
    ("later position drafted more", dict(drafted_per_pos=[10, 20, 1], accepted_per_pos=[1, 1, 1]),
     "drafted_per_pos[2] = 20 > drafted_per_pos[1] = 10"),
    ("accepted above drafted", dict(drafted_per_pos=[10, 5, 1], accepted_per_pos=[11, 1, 1]),
     "position 1 accepted 11 > drafted 10"),
    ("negative", dict(drafted_per_pos=[10, 5, -1], accepted_per_pos=[1, 1, 0]), "non-negative integers"),
    ("end before start", dict(window_start="2026-11-17T10:05:00Z", window_end="2026-11-17T10:00:00Z"),
     "is before window_start"),
    ("bool count", dict(num_drafts=True), "'num_drafts' = True"),
]


@pytest.mark.parametrize("name,over,message", COUNT_CASES, ids=[c[0] for c in COUNT_CASES])
def test_counts_that_cannot_be_are_refused_naming_the_line(tmp_path, name, over, message):
    obj = json.loads(line(0, 1))
    obj.update(over)
    path = write(tmp_path, line(-2, -1), json.dumps(obj))
    assert refused(path, message).startswith(f"{path}:2:")


# -- bounded sizes ----------------------------------------------------------------------------------

def test_more_positions_than_max_k_are_refused(tmp_path):
    four = line(0, 1, drafted_per_pos=[8, 4, 2, 1], accepted_per_pos=[4, 2, 1, 0], drafts=8)
    path = write(tmp_path, line(-1, 0), four)
    refused(path, "4 draft positions, but the deployment's max_k is 3", max_k=3)
    assert len(read_live_counters(path, max_k=4).windows) == 2
    w = read_live_counters(path).windows[1]
    with pytest.raises(InvalidValueError, match="has 4 draft positions, but the deployment's max_k is 3"):
        live_prior("local-cpu", "2026-11-16", [w], max_k=3, measured=None, prior_weight=1, counters_fingerprint="f")


def test_a_50_mb_line_is_refused_without_being_held_in_memory(tmp_path):
    path = tmp_path / "live.jsonl"
    with path.open("wb") as fh:
        fh.write(line(0, 1).encode() + b"\n")
        fh.write(b'{"schema": "' + b"x" * (50 * 1024 * 1024) + b'"}\n')
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(LiveCountersError) as err:
            read_live_counters(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(f"{path}:2: line of {50 * 1024 * 1024 + 14} bytes is longer than {MAX_LINE_BYTES}")
    assert peak < 8 * 1024 * 1024  # a few line-sized buffers, never the 50 MB line
    assert path.stat().st_size == size


def test_a_50_mb_line_without_a_newline_is_refused_too(tmp_path):
    path = tmp_path / "live.jsonl"
    path.write_bytes(line(0, 1).encode() + b"\n" + b"{" * (3 * MAX_LINE_BYTES))
    refused(path, f"line of {3 * MAX_LINE_BYTES} bytes")


# -- encoding and JSON ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,message", [
    (b'{"schema": "tabletune.\xff"}', "line 2: not UTF-8 (byte 22)"),
    (line(0, 1).replace('"num_drafts":100', '"num_drafts":NaN').encode(), "not valid JSON"),
    (line(0, 1).replace('"num_drafts":100', '"num_drafts":Infinity').encode(), "not valid JSON"),
    (b"[1, 2]", "each line must be a JSON object"),
], ids=["not-utf8", "nan", "infinity", "not-an-object"])
def test_bytes_and_json_that_are_not_a_window(tmp_path, raw, message):
    path = write(tmp_path, line(-2, -1), raw, line(5, 6))
    msg = refused(path, message.removeprefix("line 2: "))
    assert msg.startswith(f"{path}:2:")


# -- through the feedback asset -------------------------------------------------------------------

def test_the_feedback_asset_counts_a_twice_exported_window_once(home):
    import dagster as dg
    import duckdb

    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.definitions import ASSETS
    from tests.pipeline.helpers import deployment_dict, make_resources, write_fleet

    from tabletune_pipelines.tuning.deployments import identity_for

    fleet_path = write_fleet(home, [deployment_dict("local-cpu")])
    dep = load_fleet(fleet_path).deployment("local-cpu")
    dep.live_counters.parent.mkdir(parents=True)
    key = identity_for(dep, "0.32.0+cpu").key  # the engine it runs (ScriptedEngine): only its windows count
    first = line(0, 5, drafts=4000, identity_key=key)
    dep.live_counters.write_text(first + "\n" + line(5, 10, drafts=1000, identity_key=key) + "\n" + first + "\n")
    with dg.DagsterInstance.ephemeral() as instance:
        res = dg.materialize(ASSETS, selection=["live_acceptance_counters"], resources=make_resources(home, fleet_path),
                             instance=instance, partition_key="2026-11-16")
    assert res.success
    with duckdb.connect(str(home / "tabletune_store.duckdb"), read_only=True) as c:
        (row,) = c.execute("SELECT num_drafts, prior_json FROM acceptance_priors WHERE source = 'live'").fetchall()
    assert row[0] == 5000  # 4000 + 1000, not 9000
    assert json.loads(row[1])["drafted_per_pos"] == [5000, 2500, 1250]  # the counts of the two distinct windows
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert "| local-cpu | 2 | 5000 |" in md["live_priors"].value


def test_the_feedback_asset_fails_on_overlapping_windows_naming_the_line(home):
    import dagster as dg

    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.definitions import ASSETS
    from tests.pipeline.helpers import deployment_dict, make_resources, write_fleet

    fleet_path = write_fleet(home, [deployment_dict("local-cpu")])
    dep = load_fleet(fleet_path).deployment("local-cpu")
    dep.live_counters.parent.mkdir(parents=True)
    dep.live_counters.write_text(line(0, 5) + "\n" + line(3, 8) + "\n")
    with dg.DagsterInstance.ephemeral() as instance:
        res = dg.materialize(ASSETS, selection=["live_acceptance_counters"], resources=make_resources(home, fleet_path),
                             instance=instance, partition_key="2026-11-16", raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert f"{dep.live_counters}:2: window" in failure.step_failure_data.user_failure_data.description

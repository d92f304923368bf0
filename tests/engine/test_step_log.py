"""Reading the step log: records of a time window from a byte offset on, a half-written last line skipped."""

from __future__ import annotations

from tabletune_pipelines.engine.step_log import StepLog


def test_read_filters_by_time_and_offset(tmp_path):
    log = StepLog(tmp_path / "steps.jsonl")
    log.path.write_text('{"t": 1.0, "b": 1}\n{"t": 2.0, "b": 2}\n{"t": 3.0, "b"')  # last line being written
    assert [r["b"] for r in log.read()] == [1, 2]
    assert [r["b"] for r in log.read(since=1.5)] == [2]
    assert [r["b"] for r in log.read(until=1.5)] == [1]
    offset = len('{"t": 1.0, "b": 1}\n')
    assert [r["b"] for r in log.read(offset=offset)] == [2]


def test_offset_is_the_size_so_far_and_reads_only_newer_records(tmp_path):
    log = StepLog(tmp_path / "steps.jsonl")
    log.path.write_text('{"t": 1.0, "b": 1}\n')
    offset = log.offset()
    assert offset == log.path.stat().st_size
    with open(log.path, "a") as fh:
        fh.write('{"t": 2.0, "b": 2}\n')
    assert [r["b"] for r in log.read(offset=offset)] == [2]


def test_no_launch_or_no_file_yet_is_an_empty_log(tmp_path):
    for log in (StepLog(None), StepLog(tmp_path / "not-written-yet.jsonl")):
        assert log.offset() == 0 and log.read() == [] and log.read(since=0.0, offset=10) == []

"""The scheduler mixin's logic on stand-in scheduler objects: control, gate, step records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tabletune_pipelines.formats.control_protocol import ControlWriter, ack_path

pytest.importorskip("vllm")

from tabletune_pipelines.engine import timing_scheduler as ss  # noqa: E402


def stand_in_scheduler():
    """The timing mixin on a stand-in scheduler (K = 3, max_num_seqs 8), initialised from the
    environment the caller set (``ss.K_CONTROL_ENV``, ``ss.STEP_LOG_ENV``)."""

    class Fake(ss.TimingHooks):
        num_spec_tokens = 3
        scheduler_config = SimpleNamespace(max_num_seqs=8)
        dynamic_sd_lookup = [0] + [3] * 8

    f = Fake()
    f._tt_init()
    return f


@pytest.fixture
def sched(tmp_path, monkeypatch):
    monkeypatch.setenv(ss.K_CONTROL_ENV, str(tmp_path / "ctl.json"))
    monkeypatch.setenv(ss.STEP_LOG_ENV, str(tmp_path / "steps.jsonl"))
    return stand_in_scheduler(), ControlWriter(tmp_path / "ctl.json"), tmp_path


def test_k_and_table_commands_rewrite_the_lookup(sched):
    f, w, _ = sched
    seq = w.send({"k": 1})
    f._tt_poll_control()
    assert f.dynamic_sd_lookup[1:] == [1] * 8
    assert w.wait_ack(seq, timeout=1.0)["table"] == [[1, 8, 1]]
    seq = w.send({"table": [[1, 4, 3], [5, 8, 0]]})
    f._tt_poll_control()
    assert f.dynamic_sd_lookup[1:] == [3] * 4 + [0] * 4 and f._tt_ctl_seq == seq


def test_a_launch_without_a_table_refuses_k_switching(sched):
    f, w, _ = sched
    f.dynamic_sd_lookup = None
    seq = w.send({"k": 1})
    f._tt_poll_control()
    ack = w.read_ack()
    assert ack["ack"] == seq and "no num_speculative_tokens_per_batch_size" in ack["error"]


def test_admission_gate_holds_then_admits_together(sched):
    f, w, _ = sched
    added = []
    w.send({"gate": 3})
    for i in range(3):
        f._tt_add_request(SimpleNamespace(request_id=str(i)), added.append)
        assert len(added) == (0 if i < 2 else 3)
    f._tt_add_request(SimpleNamespace(request_id="x"), added.append)  # the gate is one-shot
    assert [r.request_id for r in added] == ["0", "1", "2", "x"]
    # A request finished (aborted) while held is dropped from the gate.
    w.send({"gate": 2})
    f._tt_add_request(SimpleNamespace(request_id="y"), added.append)
    f._tt_drop_held(["y"])
    assert f._tt_held == []


def test_malformed_commands_are_refused_without_raising(sched):
    f, w, tmp_path = sched
    (tmp_path / "ctl.json").write_text("{not json")
    f._tt_update(SimpleNamespace(num_scheduled_tokens={}, scheduled_spec_decode_tokens={}), None)
    assert "error" in json.loads(ack_path(tmp_path / "ctl.json").read_text())
    seq = w.send({"table": [[2, 8, 1]]})  # vLLM's validator rejects it inside build_lookup
    f._tt_poll_control()
    ack = w.read_ack()
    assert ack["ack"] == seq and ack["error"]
    assert f.dynamic_sd_lookup[1:] == [3] * 8  # unchanged


def test_one_record_per_step(sched):
    f, _, tmp_path = sched
    so = SimpleNamespace(num_scheduled_tokens={"a": 4, "b": 4},
                         scheduled_spec_decode_tokens={"a": [1, 2, 3], "b": [4, 5, 6]},
                         num_spec_tokens_to_schedule=3, scheduled_new_reqs=[], total_num_scheduled_tokens=8)
    mro = SimpleNamespace(req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[9, 9, 9], [9]])
    f._tt_update(so, mro)
    f._tt_update(so, mro)
    recs = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and recs[0]["dt"] is None
    assert recs[-1]["b"] == 2 and recs[-1]["d"] == 6 and recs[-1]["a"] == 2 and recs[-1]["k"] == 3
    assert recs[-1]["dp"] == [2, 2, 2] and recs[-1]["ap"] == [1, 1, 0]
    assert recs[-1]["dt"] is not None and recs[-1]["dt"] >= 0
    f._tt_update(None, None)  # broken inputs are swallowed (never crash the engine)


def test_auto_scheduler_follows_vllms_async_decision(monkeypatch):
    made = []
    monkeypatch.setattr(ss.TimingScheduler, "__init__", lambda self, *a, **k: made.append("sync"))
    monkeypatch.setattr(ss.TimingAsyncScheduler, "__init__", lambda self, *a, **k: made.append("async"))
    on = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True))
    off = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    assert isinstance(ss.AutoTimingScheduler(vllm_config=on, kv_cache_config=None), ss.TimingAsyncScheduler)
    assert isinstance(ss.AutoTimingScheduler(vllm_config=off, kv_cache_config=None), ss.TimingScheduler)
    assert made == ["async", "sync"]
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert issubclass(ss.TimingAsyncScheduler, AsyncScheduler)


def test_the_step_log_counts_drafts_as_the_controller_does(sched):
    """``a``, ``dp``, ``ap`` follow ``controller.step.count_drafts``: a request finished or aborted in the
    step (empty output) counts nothing; ``d`` stays the drafts verified, that request's too."""
    f, _, tmp_path = sched
    so = SimpleNamespace(num_scheduled_tokens={"a": 4, "b": 4, "c": 2},
                         scheduled_spec_decode_tokens={"a": [1, 2, 3], "b": [4, 5, 6], "c": [7]},
                         num_spec_tokens_to_schedule=3, scheduled_new_reqs=[], total_num_scheduled_tokens=10)
    mro = SimpleNamespace(req_id_to_index={"a": 0, "b": 1, "c": 2}, sampled_token_ids=[[9, 9], [], [9, 9]])
    f._tt_update(so, mro)
    (rec,) = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert rec["d"] == 7 and rec["a"] == 2 and rec["dp"] == [2, 1, 1] and rec["ap"] == [2, 0, 0]


# -- a (batch size x context) table: the column of the running requests' context, step by step -----------

GRID = [[1, 4, 1, 64, 3], [1, 4, 65, 512, 1], [5, 8, 1, 64, 2], [5, 8, 65, 512, 0]]
"""k per (batch-size range, context bucket): columns [3, 3, 3, 3, 2, 2, 2, 2] (1..64) and
[1, 1, 1, 1, 0, 0, 0, 0] (65..512)."""


def grid_scheduler():
    """The timing mixin on a stand-in scheduler whose ``schedule`` runs two requests at the k its
    lookup gives B = 2 (K = 3, max_num_seqs 8); ``running`` is set by the test."""

    class Base:
        def schedule(self):
            return SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 1}, scheduled_spec_decode_tokens={},
                                   num_spec_tokens_to_schedule=self.dynamic_sd_lookup[2], scheduled_new_reqs=[],
                                   total_num_scheduled_tokens=2)

    class Fake(ss.TimingHooks, Base):
        num_spec_tokens = 3
        scheduler_config = SimpleNamespace(max_num_seqs=8)
        dynamic_sd_lookup = [0] + [3] * 8
        running: list = []

    f = Fake()
    f._tt_init()
    return f


def step(f, *lengths):
    """One scheduled and recorded step with running requests of KV ``lengths``; returns (lookup, record)."""
    f.running = [SimpleNamespace(num_computed_tokens=n) for n in lengths]
    out = f.schedule()
    lookup = list(f.dynamic_sd_lookup)
    f._tt_update(out, SimpleNamespace(req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[9], [9]]))
    return lookup, f._tt_log_records()[-1]


@pytest.fixture
def grid_sched(tmp_path, monkeypatch):
    monkeypatch.setenv(ss.K_CONTROL_ENV, str(tmp_path / "ctl.json"))
    monkeypatch.setenv(ss.STEP_LOG_ENV, str(tmp_path / "steps.jsonl"))
    f = grid_scheduler()
    f._tt_log_records = lambda: [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    return f, ControlWriter(tmp_path / "ctl.json")


def test_a_context_table_serves_each_step_the_column_of_its_running_requests_mean_context(grid_sched):
    f, w = grid_sched
    seq = w.send({"table": GRID})
    f._tt_poll_control()
    assert w.wait_ack(seq, timeout=1.0)["table"] == GRID
    assert f.dynamic_sd_lookup == [0, 3, 3, 3, 3, 2, 2, 2, 2]  # the first column until a step is scheduled
    col0, col1 = [0, 3, 3, 3, 3, 2, 2, 2, 2], [0, 1, 1, 1, 1, 0, 0, 0, 0]
    # mean (30 + 40) / 2 = 35 -> bucket 1..64; (30 + 200) / 2 = 115 -> 65..512; (64 + 65) / 2 = 64.5 rounds to 65
    for lengths, ctx, lookup, k in (((30, 40), 35, col0, 3), ((30, 200), 115, col1, 1), ((64, 65), 65, col1, 1),
                                    ((), 1, col0, 3)):
        got, rec = step(f, *lengths)
        assert (got, rec["x"], rec["k"]) == (lookup, ctx, k), lengths


def test_the_context_aggregate_of_the_command_picks_the_column(grid_sched):
    f, w = grid_sched
    w.request({"table": GRID, "ctx_agg": "max"}, timeout=1.0, poke=f._tt_poll_control)
    _, rec = step(f, 10, 10, 100)  # mean 40 would be the first column; max 100 is the second
    assert (rec["x"], rec["k"]) == (100, 1)


def test_a_batch_only_table_or_a_k_ends_the_context_columns(grid_sched):
    f, w = grid_sched
    w.request({"table": GRID}, timeout=1.0, poke=f._tt_poll_control)
    assert step(f, 300)[1]["k"] == 1
    w.request({"k": 2}, timeout=1.0, poke=f._tt_poll_control)
    lookup, rec = step(f, 300)
    assert lookup == [0] + [2] * 8 and rec["k"] == 2 and "x" not in rec
    w.request({"table": [[1, 1, 0], [2, 8, 3]]}, timeout=1.0, poke=f._tt_poll_control)
    lookup, rec = step(f, 300)
    assert lookup == [0, 0] + [3] * 7 and rec["k"] == 3 and "x" not in rec

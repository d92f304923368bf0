"""The writer side of a launch's control channels, against an in-process reader standing in for the engine."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.formats.control_protocol import ControlReader
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.runtime_control import NUDGE_PROMPT, RuntimeControl
from tabletune_pipelines.errors import EngineConfigError, EngineError

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, table=((1, 8, 3),),
                   synthetic_acceptance_rates=(0.5, 0.5, 0.5), device="cpu")


class Engine:
    """Acts on each nudge like the timing scheduler / CPU plugin: reads the channels, acks or rejects."""

    def __init__(self, tmp_path, refuse: str | None = None) -> None:
        self.k_path, self.rates_path = tmp_path / "k.json", tmp_path / "rates.json"
        self.readers = [ControlReader(str(self.k_path)), ControlReader(str(self.rates_path))]
        self.refuse = refuse
        self.seen: list[dict] = []
        self.nudges: list[tuple] = []

    def complete(self, prompt, **kw):
        self.nudges.append((prompt, kw))
        for r in self.readers:
            cmd = r.poll()
            if cmd is not None:
                self.seen.append(cmd.body)
                r.reject(cmd.seq, self.refuse) if self.refuse else r.ack(cmd.seq)
        return {"choices": []}


def control(engine: Engine, config: ServerConfig = CFG) -> RuntimeControl:
    ctl = RuntimeControl(config, "cpu", complete=engine.complete, log_tail=lambda n: f"last {n} lines")
    ctl.open(engine.k_path, engine.rates_path)
    return ctl


def test_set_k_and_a_table_are_acknowledged_after_a_nudge(tmp_path):
    engine = Engine(tmp_path)
    ctl = control(engine)
    ctl.set_k(2, timeout=5.0)
    ctl.set_k(table=[[1, 4, 3], [5, 8, 0]], timeout=5.0)
    assert engine.seen == [{"k": 2}, {"table": [[1, 4, 3], [5, 8, 0]]}]
    assert engine.nudges[0] == (NUDGE_PROMPT, {"max_tokens": 1})


def test_synthetic_rates_are_checked_then_sent(tmp_path):
    engine = Engine(tmp_path)
    ctl = control(engine)
    # One check of a rates command, control_protocol's, on both sides of the channel.
    with pytest.raises(EngineConfigError, match=r"rates\[2\] = 0.9 > rates\[1\] = 0.5: a_i is the chance"):
        ctl.set_synthetic_rates([0.5, 0.9, 0.1])
    with pytest.raises(EngineConfigError, match=r"'rates' has 2 values; the launch drafts 3 positions"):
        ctl.set_synthetic_rates([0.5, 0.4])
    with pytest.raises(EngineConfigError, match=r"rates\[1\] = 1.5 must be a finite number in \[0, 1\]"):
        ctl.set_synthetic_rates([1.5, 0.4, 0.1])
    assert engine.seen == []
    ctl.set_synthetic_rates([0.7, 0.5, 0.3], timeout=5.0)
    assert engine.seen == [{"rates": [0.7, 0.5, 0.3]}]
    assert engine.nudges[-1] == (NUDGE_PROMPT, {"max_tokens": 4, "ignore_eos": True})
    assert RuntimeControl(CFG, "gpu", complete=engine.complete, log_tail=str).can_switch_synthetic_rates
    untimed = dataclasses.replace(CFG, step_timing=False)
    assert not RuntimeControl(untimed, "gpu", complete=engine.complete, log_tail=str).can_switch_synthetic_rates


def test_a_refused_command_is_an_engine_error_with_the_log_tail(tmp_path):
    ctl = control(Engine(tmp_path, refuse="no such k"))
    with pytest.raises(EngineError, match="no such k") as err:
        ctl.set_k(1, timeout=5.0)
    assert "last 10 lines" in str(err.value)


def test_arm_gate_sends_without_waiting_and_only_for_a_batch(tmp_path):
    engine = Engine(tmp_path)
    ctl = RuntimeControl(CFG, "cpu", complete=engine.complete, log_tail=str)
    ctl.arm_gate(4)  # no channel yet: nothing to arm
    with pytest.raises(EngineError, match="not started"):
        ctl.set_k(1)
    ctl.open(engine.k_path, engine.rates_path)
    ctl.arm_gate(1)
    assert not engine.k_path.exists()
    ctl.arm_gate(4, timeout=2.5)
    assert {k: v for k, v in json.loads(engine.k_path.read_text()).items() if k != "seq"} == {
        "gate": 4, "gate_timeout": 2.5}
    assert engine.nudges == []


class DraftingEngine(Engine):
    """Reads the synthetic-rates channel only in a step that drafts, like vLLM: the CPU plugin and the
    GPU sampler wrap see the rates only when drafts are verified. A gate command makes the next step
    a batch of n; otherwise each nudge runs alone (B = 1). The k in force follows the k channel."""

    def __init__(self, tmp_path, table) -> None:
        super().__init__(tmp_path)
        self.table, self.batch = [list(r) for r in table], 1
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def complete(self, prompt, **kw):
        with self._lock:
            self.nudges.append((prompt, kw))
            cmd = self.readers[0].poll()
            if cmd is not None:
                self.seen.append(cmd.body)
                if "gate" in cmd.body:
                    self.batch = int(cmd.body["gate"])
                else:
                    self.table = cmd.body.get("table") or [[1, 8, cmd.body["k"]]]
                    self.readers[0].ack(cmd.seq)
            self.batches.append(self.batch)
            if DraftTable.from_entries(self.table).vllm_lookup(8, 3)[self.batch] > 0:
                rates = self.readers[1].poll()
                if rates is not None:
                    self.seen.append(rates.body)
                    self.readers[1].ack(rates.seq)
        return {"choices": []}


def test_synthetic_rates_reach_an_engine_whose_launch_table_starts_at_k_0(tmp_path):
    # Every launch table that lists k = 0 opens with [1, 1, 0]: a lone nudge there never drafts, so
    # the engine never reads the rates and the switch timed out (the GPU flow's warm launch, 2026-12-05).
    launch = ((1, 1, 0), (2, 2, 1), (3, 8, 3))
    engine = DraftingEngine(tmp_path, launch)
    ctl = control(engine, dataclasses.replace(CFG, table=launch, max_num_seqs=8))
    assert ctl.nudge_batch() == 2
    ctl.set_synthetic_rates([0.7, 0.5, 0.3], timeout=3.0)
    assert {"rates": [0.7, 0.5, 0.3]} in engine.seen and {"gate": 2, "gate_timeout": 10.0} in engine.seen
    assert 2 in engine.batches
    ctl.set_k(table=[[1, 4, 0], [5, 8, 2]], timeout=3.0)
    assert ctl.nudge_batch() == 5
    ctl.set_synthetic_rates([0.6, 0.4, 0.2], timeout=5.0)
    assert engine.seen[-1] == {"rates": [0.6, 0.4, 0.2]}
    ctl.set_k(0, timeout=3.0)
    assert ctl.nudge_batch() == 1  # k = 0 everywhere: a lone nudge (the CPU build reads rates anyway)
    with pytest.raises(EngineError, match="did not acknowledge synthetic rates"):
        ctl.set_synthetic_rates([0.7, 0.5, 0.3], timeout=1.0)  # this engine, like a GPU, never reads them
    ctl.set_k(3, timeout=3.0)
    assert ctl.nudge_batch() == 1

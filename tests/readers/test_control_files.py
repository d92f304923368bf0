"""Control files inside the engine under hostile input: every command is
validated before it is applied and refused with an error in its ack (the state in force stays);
the control file is parsed as strict JSON; the patched sampling path falls back to vLLM's stock
kernel on any exception (counted, logged once). Unit tests without vLLM where possible; the one
real-engine check is marked ``engine``."""

from __future__ import annotations

import json
import logging
import math

import pytest

from tabletune_pipelines.formats.control_protocol import (
    MAX_COMMAND_BYTES,
    ControlReader,
    ControlWriter,
    ack_path,
    check_k_command,
    check_rates_command,
)
from tabletune_pipelines.errors import ControlProtocolError, InvalidCommand, TableTuneError

RATE_CASES = [
    ({"rates": [0.7, 1.5, 0.3]}, "rates[2] = 1.5 must be a finite number in [0, 1]"),
    ({"rates": [0.7, -0.1, 0.0]}, "rates[2] = -0.1 must be a finite number in [0, 1]"),
    ({"rates": [0.5, 0.7, 0.1]}, "rates[2] = 0.7 > rates[1] = 0.5"),
    ({"rates": [0.7, 0.5]}, "'rates' has 2 values; the launch drafts 3 positions"),
    ({"rates": [0.7, 0.5, 0.3, 0.1]}, "'rates' has 4 values"),
    ({"rates": [True, 0.5, 0.3]}, "rates[1] = True must be a finite number"),
    ({"rates": ["0.7", 0.5, 0.3]}, "rates[1] = '0.7' must be a finite number"),
    ({"rates": [math.nan, 0.5, 0.3]}, "rates[1] = nan must be a finite number"),
    ({"rates": [math.inf, 0.5, 0.3]}, "rates[1] = inf must be a finite number"),
    ({"rates": "all"}, "'rates' must be a non-empty list"),
    ({"rates": []}, "'rates' must be a non-empty list"),
    ({}, "'rates' must be a non-empty list"),
    ({"rates": [0.7, 0.5, 0.3], "k": 1}, "unknown key(s) ['k']"),
]


@pytest.mark.parametrize("body,message", RATE_CASES, ids=[str(c[0])[:40] for c in RATE_CASES])
def test_rates_commands_are_validated(body, message):
    with pytest.raises(InvalidCommand) as err:
        check_rates_command(body, 3)
    assert message in str(err.value) and isinstance(err.value, TableTuneError)


def test_a_good_rates_command_passes():
    assert check_rates_command({"rates": [1, 0.5, 0.5]}, 3) == (1.0, 0.5, 0.5)
    assert check_rates_command({"rates": [0.2]}) == (0.2,)


K_CASES = [
    ({"k": 4}, "'k' = 4 must be an integer in 0..3"),
    ({"k": -1}, "'k' = -1 must be an integer in 0..3"),
    ({"k": 1.5}, "'k' = 1.5 must be an integer"),
    ({"k": True}, "'k' = True must be an integer"),
    ({"k": "2"}, "'k' = '2' must be an integer"),
    ({"table": [[1, 8, 4]]}, "ask for k > 3"),
    ({"table": [[2, 8, 1]]}, "'table': "),
    ({"table": [[1, 8, 1], [5, 8, 2]]}, "'table': "),
    ({"table": "k=1"}, "'table': "),
    ({"gate": 0}, "'gate' = 0 must be an integer in 1..8"),
    ({"gate": 9}, "'gate' = 9 must be an integer in 1..8"),
    ({"gate": 2, "gate_timeout": math.nan}, "'gate_timeout' = nan must be a number of seconds"),
    ({"gate": 2, "gate_timeout": -1}, "'gate_timeout' = -1"),
    ({"gate": 2, "gate_timeout": 1e9}, "'gate_timeout' = 1000000000.0"),
    ({"kk": 1}, "unknown key(s) ['kk']"),
    ({"table": [[1, 8, 1, 64, 3], [1, 8, 65, 512, 4]]}, "range(s) [[1, 8, 65, 512, 4]] ask for k > 3"),
    ({"table": [[1, 8, 2, 64, 3]]}, "'table': "),  # the context buckets must start at 1
    ({"table": [[1, 8, 1, 64, 3], [9, 16, 1]]}, "'table': "),  # 3- and 5-item entries mixed
    ({"table": [[1, 8, 1, 64, 3]], "ctx_agg": "p99"}, "'ctx_agg' = 'p99' must be one of ['mean', 'median', 'max']"),
    ({"table": [[1, 8, 3]], "ctx_agg": "mean"}, "'ctx_agg' = 'mean' is given with a 3-item table"),
    ({"k": 2, "ctx_agg": "max"}, "'ctx_agg' = 'max' is given without a 'table'"),
]


@pytest.mark.parametrize("body,message", K_CASES, ids=[str(c[0])[:40] for c in K_CASES])
def test_k_commands_are_validated(body, message):
    with pytest.raises(InvalidCommand) as err:
        check_k_command(body, max_k=3, max_num_seqs=8)
    assert message in str(err.value)


def test_good_k_commands_pass():
    for body in ({"k": 0}, {"k": 3}, {"table": [[1, 4, 3], [5, 8, 0]]}, {"gate": 8, "gate_timeout": 10.0},
                 {"table": [[1, 8, 1, 64, 3], [1, 8, 65, 512, 1]]},
                 {"table": [[1, 8, 1, 64, 3], [1, 8, 65, 512, 1]], "ctx_agg": "max"}):
        check_k_command(body, max_k=3, max_num_seqs=8)


# -- the file itself -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw,message", [
    (b'{"seq": 1, "rates": [NaN, 0.5]}', "NaN is not a number JSON allows"),
    (b'{"seq": 1, "rates": [Infinity]}', "Infinity is not a number JSON allows"),
    (b'{"seq": 1, "seq": 2}', "duplicate key 'seq'"),
    (b'{"seq": 1, "x": "\xff"}', "codec can't decode byte 0xff"),
    (b'{"seq": true}', "integer 'seq'"),
    (b" " * (MAX_COMMAND_BYTES + 1), "larger than"),
], ids=["nan", "infinity", "duplicate", "not-utf8", "bool-seq", "huge"])
def test_a_file_that_is_not_strict_json_is_acknowledged_with_an_error(tmp_path, raw, message):
    path = tmp_path / "ctl.json"
    path.write_bytes(raw)
    reader = ControlReader(str(path))
    assert reader.poll() is None
    ack = json.loads(ack_path(path).read_text())
    assert ack["ack"] is None and message in ack["error"]


def test_the_writer_refuses_to_send_what_the_reader_would_refuse(tmp_path):
    w = ControlWriter(tmp_path / "ctl.json")
    with pytest.raises(ControlProtocolError, match="is not strict JSON"):
        w.send({"rates": [math.nan]})
    assert not (tmp_path / "ctl.json").exists() and w.last_seq == 0


# -- the CPU plugin: validate before applying, fall back on any exception ---------------------------

torch = pytest.importorskip("torch")
from tabletune_pipelines.engine import cpu_plugin  # noqa: E402


@pytest.fixture
def channel(tmp_path, monkeypatch):
    path = tmp_path / "rates.json"
    monkeypatch.setenv(cpu_plugin.SYNTHETIC_CONTROL_ENV, str(path))
    monkeypatch.setattr(cpu_plugin, "_state", {"channel": None, "rates": None, "fallbacks": 0})
    return ControlWriter(path)


@pytest.mark.parametrize("body,message", RATE_CASES[:5] + RATE_CASES[9:], ids=[str(c[0])[:40] for c in
                                                                                 RATE_CASES[:5] + RATE_CASES[9:]])
def test_the_plugin_refuses_bad_rates_and_keeps_the_ones_in_force(channel, body, message):
    launch = torch.tensor(cpu_plugin.conditional_rates([0.7, 0.5, 0.3]))
    seq = channel.send({"rates": [0.9, 0.8, 0.1]})
    applied = cpu_plugin._runtime_rates(launch).tolist()
    assert channel.wait_ack(seq, timeout=1.0)["rates"] == [0.9, 0.8, 0.1]
    seq = channel.send(body)
    assert cpu_plugin._runtime_rates(launch).tolist() == applied  # nothing applied
    ack = channel.read_ack()
    assert ack["ack"] == seq and message in ack["error"]


def test_the_patched_kernel_falls_back_to_the_stock_kernel_on_any_exception(channel, monkeypatch, caplog):
    calls = []

    def stock(*args):
        calls.append(args)

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(cpu_plugin, "synthetic_rejection", broken)
    greedy, random_ = cpu_plugin._make_greedy(stock), cpu_plugin._make_random(stock)
    out = torch.full((2, 4), -1)
    with caplog.at_level(logging.WARNING, logger="tabletune.cpu_plugin"):
        greedy(out, torch.tensor([3, 6]), torch.ones(6), torch.ones(6), torch.ones(2), torch.ones(2, dtype=bool), 3,
               torch.rand(6), torch.ones(3), SYNTHETIC_MODE=True)
        random_(out, torch.tensor([3, 6]), torch.ones(6), None, torch.ones(6, 5), torch.ones(2), torch.ones(6),
                torch.rand(6), torch.zeros(2, dtype=bool), 3, 5, torch.ones(3), NO_DRAFT_PROBS=True,
                SYNTHETIC_MODE=True)
    assert len(calls) == 2 and calls[0][-1] is False and calls[1][-1] is False  # stock, without synthetic mode
    assert calls[1][-2] is True  # NO_DRAFT_PROBS passed through
    assert cpu_plugin.fallback_count() == 2
    warnings = [r for r in caplog.records if "synthetic rejection failed" in r.getMessage()]
    assert len(warnings) == 1 and "shape mismatch" in warnings[0].getMessage()  # logged once


def test_without_synthetic_mode_the_stock_kernel_runs_unchanged(channel):
    calls = []
    greedy = cpu_plugin._make_greedy(lambda *a: calls.append(a))
    greedy("o", "cu", "d", "t", "b", "g", 3)
    assert calls == [("o", "cu", "d", "t", "b", "g", 3, None, None, False)] and cpu_plugin.fallback_count() == 0


# -- the timing scheduler refuses a bad k command before changing its lookup -----------------------

def test_the_timing_scheduler_refuses_bad_k_commands(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from tabletune_pipelines.engine import timing_scheduler as ss
    from tests.engine.test_timing_scheduler import stand_in_scheduler

    monkeypatch.setenv(ss.K_CONTROL_ENV, str(tmp_path / "ctl.json"))
    monkeypatch.delenv(ss.STEP_LOG_ENV, raising=False)
    f = stand_in_scheduler()
    w = ControlWriter(tmp_path / "ctl.json")
    for body, message in (({"k": 7}, "must be an integer in 0..3"), ({"k": 1.9}, "must be an integer"),
                          ({"gate": 2, "gate_timeout": 1e12}, "'gate_timeout'"), ({"table": [[1, 8, 9]]}, "k > 3")):
        seq = w.send(body)
        f._tt_poll_control()
        ack = w.read_ack()
        assert ack["ack"] == seq and message in ack["error"], ack
        assert f.dynamic_sd_lookup == [0] + [3] * 8 and f._tt_gate is None


# -- one real engine ---------------------------------------------------------------------------------

@pytest.mark.engine
def test_a_running_cpu_engine_refuses_bad_rates_and_keeps_serving(shared_server):
    """On the suite's shared server (tests/conftest.py; its rates are put back at the end)."""
    from tabletune_pipelines.errors import ControlRejected
    from tabletune_pipelines.engine.installed import is_cpu_build

    if not is_cpu_build():
        pytest.skip("the synthetic-rates channel exists on vLLM's CPU build")
    server = shared_server
    writer = server.control.rates_channel
    try:
        for body, message in (({"rates": [0.5, 0.9, 0.1]}, "> rates[1]"), ({"rates": [0.5, 0.4]}, "has 2 values"),
                              ({"rates": [1.5, 0.4, 0.1]}, "in [0, 1]")):
            with pytest.raises(ControlRejected, match=message.replace("[", r"\[")):
                writer.request(body, timeout=60.0, what="bad rates",
                               poke=lambda: server.complete("a b a b", max_tokens=4, ignore_eos=True), pause=0.02)
        server.set_synthetic_rates([1.0, 1.0, 1.0])  # a good command is still applied
        out = server.complete("a b a b", max_tokens=8, ignore_eos=True)
        assert out["choices"][0]["text"] is not None
    finally:
        server.set_synthetic_rates(list(server.config.synthetic_acceptance_rates))

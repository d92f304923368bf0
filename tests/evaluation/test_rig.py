"""evaluation.rig without an engine: the rig's closed-loop load against a scripted server (its
prompts, seeds, request settings, counting, restart), and the rig's publications and read-back
of the windows the production controller exports (driven by the fake engine of the tests)."""

from __future__ import annotations

import math
import random
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.evaluation.rig import SCHEDULER, Rig, closed_loop, drafting_requests_per_step
from tabletune_pipelines.tuning.served_load import LoadGenerator
from tabletune_pipelines.evaluation.simulator import FakeEngine, fake_controller
from tabletune_pipelines.evaluation.synthetic import IDENTITY, linear_profile
from tabletune_pipelines.formats.live_counters import CounterWindow
from tabletune_pipelines.formats.published import load_published

RATES = (0.7, 0.5, 0.3)


class ScriptedServer:
    """``complete`` records each request and answers ``answer`` (or raises it when it is an exception)."""

    def __init__(self, answer=None, pause_s: float = 0.002) -> None:
        self.answer = {"choices": [{"text": "x"}]} if answer is None else answer
        self.pause_s = pause_s
        self.calls: list[tuple[str, object, dict]] = []
        self._lock = threading.Lock()

    def complete(self, prompt, **kw):
        with self._lock:
            self.calls.append((threading.current_thread().name, prompt, kw))
        time.sleep(self.pause_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _run(gen: LoadGenerator, more: int = 5) -> LoadGenerator:
    gen.start()
    try:
        gen.wait_completed(more, timeout=30.0)
    finally:
        gen.stop()
    return gen


def test_the_rig_load_sends_16_random_ids_from_seed_1000_at_temperature_0():
    srv = ScriptedServer()
    gen = _run(closed_loop(srv, 1))
    rng = random.Random(1000)
    first = [rng.randrange(3, 2000) for _ in range(16)]
    (_, prompt, kw) = srv.calls[0]
    assert prompt == first
    assert kw == {"max_tokens": rng.randint(32, 64), "ignore_eos": True, "temperature": 0.0, "timeout": 300.0}
    assert gen.errors == [] and gen.completed == gen.sent == len(srv.calls) >= 5


def test_client_i_of_the_rig_load_is_seeded_1000_plus_i():
    srv = ScriptedServer()
    _run(closed_loop(srv, 3, max_tokens=(96, 128), ignore_eos=False), more=6)
    firsts = {}
    for name, prompt, kw in srv.calls:
        firsts.setdefault(name, (prompt, kw))
    expected = []
    for i in range(3):
        rng = random.Random(1000 + i)
        expected.append(([rng.randrange(3, 2000) for _ in range(16)], rng.randint(96, 128)))
    got = sorted((p, kw["max_tokens"]) for p, kw in firsts.values())
    assert got == sorted(expected)
    assert all(kw["ignore_eos"] is False for _, _, kw in srv.calls)


def test_an_answer_without_exactly_one_choice_is_an_error_not_a_completion():
    srv = ScriptedServer(answer={"choices": []})
    gen = closed_loop(srv, 1).start()
    deadline = time.monotonic() + 30
    while len(gen.errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    gen.stop()
    assert gen.completed == 0 and gen.errors[0] == "answer without a choice: {'choices': []}"
    assert gen.sent >= 2


def test_a_failed_request_is_kept_cut_to_300_characters():
    srv = ScriptedServer(answer=RuntimeError("x" * 1000))
    gen = closed_loop(srv, 1).start()
    deadline = time.monotonic() + 30
    while not gen.errors and time.monotonic() < deadline:
        time.sleep(0.01)
    gen.stop()
    assert gen.errors and len(gen.errors[0]) == 300 and gen.errors[0].startswith("RuntimeError('xxx")
    with pytest.raises(AssertionError, match="stalled"):
        gen.start().wait_completed(1, timeout=0.3)
    gen.stop()


def test_the_load_restarts_with_a_new_prompt_and_the_same_seeds():
    srv = ScriptedServer()
    gen = _run(closed_loop(srv, 1), more=2)
    before = len(srv.calls)
    gen.prompt = lambda rng: ["p", rng.randrange(10)]
    _run(gen, more=2)
    rng = random.Random(1000)
    assert srv.calls[before][1] == ["p", rng.randrange(10)]
    assert all(p[0] == "p" for _, p, _ in srv.calls[before:])
    assert gen.errors == [] and gen.completed == gen.sent


def test_the_served_load_generator_keeps_its_own_defaults():
    srv = ScriptedServer()
    _run(LoadGenerator(srv, 1, 50, prompt_tokens=4, output_tokens=(8, 9), seed=2), more=2)
    rng = random.Random(2 * 100_003)
    (_, prompt, kw) = srv.calls[0]
    assert prompt == [rng.randrange(3, 50) for _ in range(4)]
    assert kw == {"max_tokens": rng.randint(8, 9), "ignore_eos": True, "timeout": 600.0}  # no temperature sent
    # any answer counts (a scripted server may answer nothing)
    srv2 = ScriptedServer(answer={})
    assert _run(LoadGenerator(srv2, 1, 50), more=2).errors == []


def test_rig_publishes_versions_and_reads_back_the_controllers_windows(tmp_path):
    rig = Rig(ScriptedServer(), tmp_path / "local.json", tmp_path / "local.live.jsonl")
    assert rig.windows() == [] and rig.steps() == 0  # no export yet
    assert rig.publish(ranges=[(1, 16, 3)], rates=RATES, identity=IDENTITY) == 1
    t = load_published(rig.published)
    assert t.version == 1 and t.allowed_k == (0, 1, 2, 3) and t.identity == IDENTITY
    assert t.controller["export_every_steps"] == 100 and t.controller["export_every_s"] == 1.0
    clock = [0.0]
    c = fake_controller(rig.published, clock)
    FakeEngine(c, RATES, lambda b, k: linear_profile()[k][b], clock=clock).run(450, 8)
    ws = rig.windows()
    assert ws and all(w.table_version == 1 for w in ws)
    assert rig.steps() == ws[-1].controller["steps"] >= 400
    hit, mine = rig.wait(lambda w: True, version=1, max_steps=10)
    assert hit is not None and hit == mine[0]
    assert Rig.steps_into(mine[-1], mine) == rig.steps() - (mine[0].controller["steps"] - mine[0].steps)
    assert Rig.seconds_into(mine[-1], mine) > 0
    none, mine = rig.wait(lambda w: False, version=1, max_steps=100)
    assert none is None and mine
    assert rig.publish(ranges=[(1, 16, 2)], rates=RATES, identity=IDENTITY, controller={"mode": "observe"}) == 2
    t = load_published(rig.published)
    assert t.version == 2 and t.controller["mode"] == "observe" and t.controller["export_every_steps"] == 100


def test_server_config_turns_the_controller_on_as_an_operator_would(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
    from tabletune_pipelines.evaluation import rig

    monkeypatch.setattr(rig, "tiny", lambda: SimpleNamespace(target_dir=tmp_path / "t", draft_dir=tmp_path / "d"))
    cfg = rig.server_config(tmp_path / "w", tmp_path / "pub.json", extra_env={"X": "1"})
    assert cfg.extra_args == ("--scheduler-cls", SCHEDULER + "ControllerScheduler")
    assert SCHEDULER == "tabletune_pipelines.controller.scheduler."
    assert cfg.extra_env == {PUBLISHED_ENV: str(tmp_path / "pub.json"), "X": "1"}
    assert cfg.table == ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 16, 3)) and cfg.step_timing is False
    assert cfg.drafter == str(tmp_path / "d") and tuple(cfg.synthetic_acceptance_rates) == RATES
    other = rig.server_config(tmp_path / "w", tmp_path / "pub.json", method="ngram", rates=None,
                              cls="tabletune_pipelines.evaluation.scheduler.EvaluationScheduler")
    assert other.extra_args[1] == "tabletune_pipelines.evaluation.scheduler.EvaluationScheduler"
    assert other.drafter is None and other.synthetic_acceptance_rates is None
    assert rig.identity() == dict(IDENTITY, model=str(tmp_path / "t"), drafter=str(tmp_path / "d"))
    assert rig.identity("ngram")["drafter"] is None


class _Clock:
    """A fake ``time`` for ``Rig.wait_steps``: ``sleep`` advances ``monotonic``."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def test_wait_steps_guards_a_stall_not_the_length_of_a_phase(tmp_path, monkeypatch):
    import tabletune_pipelines.evaluation.rig as rig_module

    clock = _Clock()
    monkeypatch.setattr(rig_module, "time", clock)
    server = ScriptedServer()
    server.log_tail = lambda n: "log"
    rig = Rig(server, tmp_path / "local.json", tmp_path / "local.live.jsonl")
    # A slow machine: one step exported every 100 s. 20 steps take 2000 s, far past a 150-s timeout,
    # and the phase still completes, because no wait between steps reaches 150 s.
    monkeypatch.setattr(rig, "steps", lambda: int(clock.t // 100))
    assert rig.wait_steps(20, timeout=150.0) == 20 and clock.t >= 2000.0
    # A stall: the count stops at 25. The guard fires once 150 s pass with no new step, not before.
    monkeypatch.setattr(rig, "steps", lambda: min(25, int(clock.t // 100)))
    start = clock.t
    with pytest.raises(AssertionError, match="25 of 40 controller steps, none new for 150.0 s"):
        rig.wait_steps(20, timeout=150.0)
    assert 2500.0 + 150.0 < clock.t <= 2500.0 + 151.0 and clock.t - start > 500.0


def _counted(num_drafts, steps):
    t = datetime(2026, 12, 4, tzinfo=timezone.utc)
    return CounterWindow(deployment="d", window_start=t, window_end=t + timedelta(seconds=1), num_drafts=num_drafts,
                         drafted_per_pos=(num_drafts,), accepted_per_pos=(0,), steps=steps)


def test_drafting_requests_per_step_pools_the_windows():
    # 8 clients in a full batch for 100 steps (800 drafts), then a spell of one request for 300 steps:
    # pooled, (800 + 300) / 400 = 2.75, not the mean of the windows' 8 and 1.
    assert drafting_requests_per_step([_counted(800, 100), _counted(300, 300)]) == 2.75
    assert drafting_requests_per_step([_counted(0, 50)]) == 0.0  # steps ran, nothing drafted (k = 0)
    assert math.isnan(drafting_requests_per_step([]))
    assert math.isnan(drafting_requests_per_step([_counted(0, None)]))  # a window with no step count

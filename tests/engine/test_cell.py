"""One measurement of one cell: step analysis, engine vs wall timing, late admissions, warm-up."""

from __future__ import annotations

import time

import pytest

from tabletune_pipelines.engine.cell import (
    WARMUP_MAX_TOKENS,
    analyse_steps,
    measure_cell_once,
    steady_steps,
    timing_prompts,
    warm_up,
)
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.errors import EngineError
from tests.engine.fakes import FakeServer, step_ms

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, table=((1, 8, 3),),
                   synthetic_acceptance_rates=(0.0, 0.0, 0.0), max_num_seqs=8)


def test_analyse_steps_filters_batch_and_detects_late_admission():
    steps = [{"b": 1, "new": 1, "dt": 30.0, "d": 0, "k": 1}, {"b": 4, "new": 3, "dt": 25.0, "d": 1, "k": 1}]
    steps += [{"b": 4, "new": 0, "dt": 5.0 + i * 0.01, "d": 4, "k": 1} for i in range(10)]
    intervals, together = analyse_steps(steps, 4, 1)
    assert not together
    assert len(intervals) == 10 and min(intervals) >= 5.0
    steps = [{"b": 4, "new": 4, "dt": 30.0, "d": 0}] + [{"b": 4, "new": 0, "dt": 6.0, "d": 0} for _ in range(5)]
    intervals, together = analyse_steps(steps, 4, None)
    assert together and intervals == [6.0] * 5


def test_analyse_steps_skips_steps_with_other_draft_counts():
    # A step that verified fewer drafts than B·k (a request near its end) is not a k-step.
    steps = [{"b": 2, "new": 2, "dt": 9.0, "d": 0}, {"b": 2, "new": 0, "dt": 5.0, "d": 6, "k": 3},
             {"b": 2, "new": 0, "dt": 4.0, "d": 3, "k": 3}, {"b": 2, "new": 0, "dt": 5.5, "d": 6, "k": 2}]
    assert analyse_steps(steps, 2, 3) == ([5.0], True)


def test_timing_prompts_are_seeded_token_ids_inside_the_vocabulary():
    a = timing_prompts(4, 32, 100, seed=1)
    assert a == timing_prompts(4, 32, 100, seed=1) != timing_prompts(4, 32, 100, seed=2)
    assert len(a) == 4 and all(len(p) == 32 and all(3 <= t < 100 for t in p) for p in a)


def test_measurement_uses_engine_timing():
    srv = FakeServer(CFG)
    srv.set_k(1)
    m = measure_cell_once(srv, 1, 4, seed=3, vocab_size=100)
    assert m.timing == "engine" and m.step_ms == step_ms(1, 4) and m.admitted_together and m.attempts == 1
    assert [c for c in srv.calls if c[0] == "gate"] == [("gate", 4), ("gate", 4)]  # each batch admitted at once
    assert [c[:2] for c in srv.completes()] == [(4, 1), (4, 65)]


def test_a_repetition_times_the_decode_steps_it_is_asked_for():
    srv = FakeServer(CFG)
    srv.set_k(1)
    m = measure_cell_once(srv, 1, 4, seed=3, vocab_size=100, decode_steps=32)
    assert [c[:2] for c in srv.completes()] == [(4, 1), (4, 33)]  # 1 + 32 tokens: 32 decode steps
    assert m.timing == "engine" and m.step_ms == step_ms(1, 4)


class LateServer(FakeServer):
    """Admits the batch over two steps every time; its steady steps still run at exactly B."""

    def read_steps(self, since=None, until=None, offset=0):
        steps = super().read_steps()
        b = self._b
        return [{"b": 1, "new": 1, "dt": 30.0, "d": 0}, {"b": b, "new": b - 1, "dt": 30.0, "d": 0}] + steps[1:]


def test_a_late_admission_timed_by_the_engine_is_kept_at_once():
    srv = LateServer(CFG)
    srv.set_k(1)
    m = measure_cell_once(srv, 1, 4, seed=3, vocab_size=100, max_attempts=3)
    assert m.attempts == 1 and not m.admitted_together  # no second batch: its steady steps time it
    assert m.timing == "engine" and m.step_ms == step_ms(1, 4)  # filtered by batch size: the same value


def test_a_step_that_carries_prompt_tokens_is_not_steady():
    # B = 4 admitted in two steps, the second prompt's last chunk (300 tokens) riding in a step that
    # admits nobody and runs all four requests: its 80 ms is prefill, not a decode step.
    steps = [{"b": 1, "new": 1, "dt": 30.0, "d": 0, "tok": 512}, {"b": 4, "new": 3, "dt": 60.0, "d": 0, "tok": 512},
             {"b": 4, "new": 0, "dt": 80.0, "d": 4, "tok": 305, "k": 1}]
    steps += [{"b": 4, "new": 0, "dt": 5.0, "d": 4, "tok": 8, "k": 1} for _ in range(10)]
    assert analyse_steps(steps, 4, 1) == ([5.0] * 10, False)
    assert steady_steps(steps, 4, 1) == [(5.0, 4)] * 10
    assert steady_steps([{**s, "tok": None} if s["dt"] == 80.0 else s for s in steps], 4, 1)[0] == (80.0, 4)


class SilentServer(FakeServer):
    """Keeps no step records, and its 1-token batch takes longer than its 65-token one, so the
    wall estimate (t65 - t1) / 64 is not a step time either."""

    def complete(self, prompts, *, max_tokens, **kw):
        if max_tokens == 1:
            time.sleep(0.05)
        return super().complete(prompts, max_tokens=max_tokens, **kw)

    def read_steps(self, since=None, until=None, offset=0):
        return []


class WallOnlyServer(SilentServer):
    """No step records, but the long batch takes longer: the wall estimate is used."""

    def complete(self, prompts, *, max_tokens, **kw):
        if max_tokens > 1:
            time.sleep(0.1)
        return FakeServer.complete(self, prompts, max_tokens=max_tokens, **kw)


def test_wall_timing_when_the_engine_kept_too_few_steps():
    m = measure_cell_once(WallOnlyServer(CFG), 1, 2, seed=0, vocab_size=100)
    assert m.timing == "wall" and m.engine_ms is None and m.step_ms == m.wall_ms > 0


def test_no_usable_timing_raises():
    with pytest.raises(EngineError, match="no usable step time at k=1, B=2 after 2 attempts"):
        measure_cell_once(SilentServer(CFG), 1, 2, seed=0, vocab_size=100, max_attempts=2)


def test_warm_up_runs_one_gated_untimed_batch():
    srv = FakeServer(CFG)
    warm_up(srv, 8, prompt_tokens=16, vocab_size=100)
    assert srv.calls[0] == ("gate", 8)
    assert [c[:2] for c in srv.completes()] == [(8, WARMUP_MAX_TOKENS)]


class LateWallServer(WallOnlyServer):
    """No step records (wall timing only) and a batch admitted over two steps every time."""

    def read_steps(self, since=None, until=None, offset=0):
        return [{"b": 1, "new": 1, "dt": 30.0, "d": 0}, {"b": 2, "new": 1, "dt": 30.0, "d": 0}]


def test_a_late_admission_timed_by_the_wall_clock_is_measured_again_then_kept():
    m = measure_cell_once(LateWallServer(CFG), 1, 2, seed=0, vocab_size=100, max_attempts=3)
    assert m.attempts == 3 and not m.admitted_together and m.timing == "wall" and m.step_ms > 0

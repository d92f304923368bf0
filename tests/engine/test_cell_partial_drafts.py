"""Engine timing when the drafter proposes fewer than k drafts (n-gram drafting without a match):
the cause of the wall-clock fallbacks at B >= 9 on the embedded default, and its fix."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune_pipelines.engine.cell import engine_step_ms, measure_cell_once, steady_steps
from tabletune_pipelines.engine.config import ServerConfig
from tests.engine.fakes import FakeServer

CFG = ServerConfig(model="/m", drafter=None, method="ngram", num_speculative_tokens=3, table=((1, 16, 3),),
                   synthetic_acceptance_rates=(0.0, 0.0, 0.0), max_num_seqs=16)


def ngram_steps(b, k, *, base=6.0, per_draft=0.05, full_share=0.05, seed=0, n=64):
    """Steps like the embedded default's step log: the admission step, then decode steps of which
    only ``full_share`` verify all B·k drafts (the rest drafted less); interval = base + per_draft·d."""
    rng = np.random.default_rng(seed)
    steps = [{"b": b, "new": b, "dt": 30.0, "d": 0, "k": k}]
    for _ in range(n):
        d = b * k if rng.random() < full_share else int(rng.integers(b * k // 2, b * k))
        steps.append({"b": b, "new": 0, "dt": base + per_draft * d + 0.01 * rng.standard_normal(), "d": d, "k": k})
    return steps


def test_too_few_full_draft_steps_used_to_mean_wall_timing_and_now_mean_the_draft_count_fit():
    steps = ngram_steps(12, 3)
    full = [s for s in steps[1:] if s["d"] == 36]
    assert len(full) < 8  # what made the old rule fall back to (t65 - t1)/64
    ms, how = engine_step_ms(steady_steps(steps, 12, 3), 12, 3)
    assert how == "fit" and ms == pytest.approx(6.0 + 0.05 * 36, abs=0.05)
    # Many full-draft steps: their median, as before.
    ms, how = engine_step_ms(steady_steps(ngram_steps(4, 3, full_share=0.6), 4, 3), 4, 3)
    assert how == "exact" and ms == pytest.approx(6.0 + 0.05 * 12, abs=0.05)


def test_when_even_the_fit_is_impossible_the_reason_is_given():
    few = ngram_steps(12, 3, n=5)
    assert engine_step_ms(steady_steps(few, 12, 3), 12, 3) == (None, "5 steady steps at B=12 (< 8)")
    low = [{"b": 8, "new": 8, "dt": 30.0, "d": 0, "k": 3}] + [
        {"b": 8, "new": 0, "dt": 6.0 + 0.1 * d, "d": d, "k": 3} for d in [1, 2, 3] * 10]
    ms, why = engine_step_ms(steady_steps(low, 8, 3), 8, 3)
    assert ms is None and "reach only 3 of 24" in why


class NgramServer(FakeServer):
    """A server whose drafter drafts all B·k only in a few steps."""

    def read_steps(self, since=None, until=None, offset=0):
        b, k = self._b, self.k_at(self._b)
        return ngram_steps(b, k or 0, seed=b)


def test_a_measurement_with_an_ngram_like_drafter_stays_engine_timed():
    srv = NgramServer(CFG).start()
    srv.set_k(3)
    m = measure_cell_once(srv, 3, 12, seed=1)
    assert m.timing == "engine" and m.engine_method == "fit"
    assert m.step_ms == pytest.approx(6.0 + 0.05 * 36, abs=0.05)

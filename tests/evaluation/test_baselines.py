"""The two adaptive baselines on worked examples (evaluation/baselines.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune_pipelines.evaluation.baselines import NightjarPolicy, TurboSpecPolicy, linear_step_model
from tabletune_pipelines.controller.step import StepOutcome

# T(B, k) = 3 + 0.5·k + 0.05·B·k: exactly linear, so the fitted model is the profile itself.
PROFILE = {k: {b: 3 + 0.5 * k + 0.05 * b * k for b in (1, 2, 4, 8, 16, 32)} for k in (1, 3)}


def test_linear_model_is_a_least_squares_fit():
    assert linear_step_model(PROFILE) == pytest.approx([3.0, 0.0, 0.5, 0.05], abs=1e-9)
    with pytest.raises(ValueError, match="at least 4"):
        linear_step_model({1: {1: 3.0, 2: 4.0}})


def test_turbospec_worked_example():
    # alpha = 0.7: tau(1) = 1.7, tau(3) = (1 - 0.7^4) / 0.3 = 2.533. k = 3 wins while
    # 2.533 / (3.5 + 0.05 B) > 1.7 / (4.5 + 0.15 B), i.e. B < 9.48: k = 3 up to B = 9, k = 1 from 10.
    p = TurboSpecPolicy(PROFILE, 32, (1, 3), initial_alpha=0.7)
    assert p.tau() == pytest.approx([1.7, (1 - 0.7 ** 4) / 0.3])
    lk = p.next_lookup()
    assert len(lk) == 33 and lk[1] == 3 and lk[9] == 3 and lk[10] == 1 and lk[32] == 1
    # every draft rejected for a while: alpha falls and k = 1 takes over everywhere
    ids = [f"r{i}" for i in range(4)]
    for t in range(400):
        p.on_step(StepOutcome({r: 1 for r in ids}, {r: [0, 0, 0] for r in ids}, {r: i for i, r in enumerate(ids)},
                              [[1]] * 4, 3, 0, 16, 1.0 + t))
    assert p.alpha < 0.05 and set(p.next_lookup()[1:]) == {1}


def test_turbospec_counts_tried_positions():
    p = TurboSpecPolicy(PROFILE, 8, (1, 3), initial_alpha=0.5, prior_tokens=0.0001, forget=1.0)
    # a drafted 3 kept 1 (tried 2), b drafted 3 kept 3 (tried 3): alpha = 4 / 5
    p.on_step(StepOutcome({"a": 1, "b": 1}, {"a": [0] * 3, "b": [0] * 3}, {"a": 0, "b": 1}, [[1, 1], [1, 1, 1, 1]],
                          3, 0, 8, 1.0))
    assert p.alpha == pytest.approx(4 / 5, abs=1e-3)


def test_nightjar_ucb_finds_the_better_k_at_its_batch_size():
    nj = NightjarPolicy(8, (0, 1), c=0.5)
    assert nj.next_lookup()[3] == 1  # untried: the largest k first
    now, ks = 0.0, []
    for _ in range(300):
        k = nj.next_lookup()[2]
        ks.append(k)
        now += 0.010  # both k take 10 ms; k = 1 keeps both drafts: twice the tokens
        spec = {"a": [0], "b": [0]} if k else {}
        sampled = [[1, 1], [1, 1]] if k else [[1], [1]]
        nj.on_step(StepOutcome({"a": 1, "b": 1}, spec, {"a": 0, "b": 1}, sampled, k, 0, 2 + 2 * k, now))
    assert np.mean(np.array(ks[50:]) == 1) > 0.8
    assert nj.count[2].sum() == 299 and nj.count[2, 0] >= 1  # k = 0 was tried
    assert nj.next_lookup()[3] == 1 and nj.count[3].sum() == 0  # other batch sizes learn on their own

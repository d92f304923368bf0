"""The benchmark's table helpers (benchmarks/evaluate.py): the docs' tables scaled and cut to
max_num_seqs, the quartered table of the repair experiment, and the baselines' verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tabletune_pipelines.evaluation import simulator as sim

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "evaluate.py"


@pytest.fixture(scope="module")
def ev():
    spec = importlib.util.spec_from_file_location("tt_evaluate", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_docs_tables_fitted_to_max_num_seqs(ev):
    assert ev.scaled(ev.DOCS_DENSE, 512) == ev.DOCS_DENSE
    assert ev.scaled(ev.DOCS_DENSE, 128) == [[1, 16, 3], [17, 32, 1], [33, 128, 0]]
    assert ev.cut(ev.DOCS_DENSE, 128, 3) == [[1, 64, 3], [65, 128, 1]]
    assert ev.cut(ev.DOCS_EAGLE3, 512, 3) == ev.DOCS_DENSE  # k capped at K = 3: the same table


def test_quartered_table(ev):
    assert sim.quartered(ev.DOCS_DENSE, 512) == [[1, 16, 3], [17, 32, 1], [33, 512, 0]]
    assert sim.quartered([[1, 64, 3], [65, 128, 1]], 128) == [[1, 16, 3], [17, 32, 1], [33, 128, 0]]


def test_verdict_wording(ev):
    loss = {"tuned (evidence)": {1: 0.01}, "docs dense": {1: 0.20}, "TurboSpec-style": {1: 0.10},
            "Nightjar-style": {1: 0.201}}
    v = ev.between(loss, ["docs dense"])
    assert "TurboSpec-style 10.0% (between" in v and "Nightjar-style 20.1% (as bad as the docs'" in v


def test_recovery_time_is_when_the_goodput_reaches_the_target(ev):
    import numpy as np

    tokens = np.array([10] * 100 + [20] * 900)
    res = ev.sim.SimResult(load=10, steps=1000, tokens=int(tokens.sum()), seconds=10.0, ks=np.zeros(1000, int),
                           step_tokens=tokens, step_ms=np.full(1000, 10.0))
    assert ev.recovery_time(res, 0, 19.99 / 0.01) == pytest.approx(1.0)  # step 100 at 10 ms a step
    assert ev.recovery_time(res, 50, 19.99 / 0.01) == pytest.approx(0.5)
    assert ev.recovery_time(res, 0, 25.0 / 0.01) is None

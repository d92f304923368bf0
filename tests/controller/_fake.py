"""Fakes for the pure-logic tests: a scheduler-output stand-in and the robust-choice references.

The synthetic inputs (the test engine's launch table and identity, ``linear_profile``, ``true_table``,
``publish``) live in ``tabletune_pipelines.evaluation.synthetic`` (the benchmarks use them too) and are
re-exported here.

``FakeEngine`` drives ``Controller`` the way the vLLM adapter does (``next_lookup`` before a step,
``on_step(StepOutcome(...))`` after it) with requests whose kept drafts follow known survival rates and whose step
takes a known time: the ground truth the tests compare the controller with. No vLLM.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.controller.logic import Controller
from tabletune_pipelines.controller.step import StepOutcome
from tabletune_pipelines.core.table import goodput_matrix
from tabletune_pipelines.evaluation.synthetic import (  # noqa: F401 - the tests import them from here
    IDENTITY,
    LAUNCH,
    REBUILD_BUDGET_MS,
    K,
    N,
    dense,
    linear_profile,
    publish,
    true_table,
)

ENGINE = EngineFacts(max_k=K, max_num_seqs=N, launch_ranges=LAUNCH, model="/m/target", method="draft_model",
                     vllm_version="0.32.0")


def near_best(profile, rates, ks=(0, 1, 2, 3), n: int = N, stickiness: float = 0.005) -> list[set[int]]:
    """Per B, every k whose goodput is within ``stickiness`` of the best k there: what a table may
    keep under the stickiness rule, whether its search walks B (the tuner's first search) or revises
    the table in force (the controller's)."""
    g = goodput_matrix(dense(profile, ks, n), ks, rates)
    best = g.max(axis=0)
    return [{int(k) for i, k in enumerate(ks) if best[b] <= g[i, b] * (1.0 + stickiness)} for b in range(n)]


def robust_choices(profile, rates, tol, ks=(0, 1, 2, 3), n: int = N) -> list[set[int]]:
    """Per B, every k within the stickiness of the best for some rates within ``tol`` of ``rates``
    (the box's corners and mid-points): a controller whose â is within ``tol`` must pick one of these."""
    out: list[set[int]] = [set() for _ in range(n)]
    for signs in itertools.product((-1, 0, 1), repeat=len(rates)):
        r = np.minimum.accumulate(np.clip([a + s * t for a, s, t in zip(rates, signs, tol)], 0, 1))
        for b, ks_b in enumerate(near_best(profile, r, ks, n)):
            out[b] |= ks_b
    return out


def quartered(ranges, n: int = N) -> list[list[int]]:
    """The repair experiment's wrong table (``evaluation.simulator.quartered``) for the fake engine's N."""
    from tabletune_pipelines.evaluation.simulator import quartered as _quartered

    return _quartered(ranges, n)


def table_dense(ranges, n: int = N) -> list[int]:
    out = [0] * n
    for s, e, k in ranges:
        for b in range(int(s), int(e) + 1):
            out[b - 1] = int(k)
    return out


def on_robust_table(ranges, choices) -> bool:
    return all(k in choices[b] for b, k in enumerate(table_dense(ranges, len(choices))))


class FakeEngine:
    """Runs ``steps`` engine steps of ``batch`` requests against ``controller``.

    ``rates``: true survival a_i (request keeps m drafts with P(m >= i) = a_i); ``step_ms(b, k)``:
    the true step time. The clock is simulated (monotonic seconds).
    """

    def __init__(self, controller: Controller, rates: Sequence[float], step_ms: Callable[[int, int], float],
                 *, seed: int = 0, clock: list[float] | None = None) -> None:
        self.c = controller
        self.rates = list(rates)
        self.step_ms = step_ms
        self.rng = random.Random(seed)
        self.clock = clock if clock is not None else [0.0]
        self.ks_run: list[int] = []
        self.tamper: Callable[[list[list[int]]], None] | None = None

    def kept(self, k: int) -> int:
        m, prev = 0, 1.0
        while m < k:
            p = self.rates[m] / prev if prev > 0 else 0.0
            if self.rng.random() >= p:
                break
            prev = self.rates[m]
            m += 1
        return m

    def run(self, steps: int, batch: int, default_k: int = K, *, output_tokens: int | None = None,
            prompt_tokens: int = 0, extra_ms: Callable[[int, int, int], float] | None = None) -> float:
        """``steps`` steps at ``batch`` requests. With ``output_tokens``, a closed loop: a request ends
        after that many tokens and a new one takes its place the next step, bringing
        ``prompt_tokens`` of prefill; such a step costs ``extra_ms(B, k, prefill tokens)`` more than
        the decode step. Returns the tokens produced per second."""
        c = self.c
        ids = [f"r{i}" for i in range(batch)]
        idx = {r: i for i, r in enumerate(ids)}
        nst = {r: 1 for r in ids}
        left = [self.rng.randint(1, output_tokens) for _ in ids] if output_tokens else []
        new = 0
        t0, made = self.clock[0], 0
        for _ in range(steps):
            lookup = c.next_lookup()
            k = lookup[batch] if lookup is not None else default_k
            spec = {r: [0] * k for r in ids} if k else {}
            sampled = [[1] * (self.kept(k) + 1) for _ in ids]
            if self.tamper is not None:
                self.tamper(sampled)
            prefill = new * prompt_tokens
            ms = self.step_ms(batch, k) + (extra_ms(batch, k, prefill) if extra_ms is not None and prefill else 0.0)
            self.clock[0] += ms / 1000.0
            self.ks_run.append(k)
            made += sum(len(x) for x in sampled)
            c.on_step(StepOutcome(nst, spec, idx, sampled, k, new, batch + batch * k + prefill, self.clock[0]))
            new = 0
            if output_tokens:
                for i, x in enumerate(sampled):
                    left[i] -= len(x)
                    if left[i] <= 0:
                        left[i] = output_tokens
                        new += 1
        return made / max(self.clock[0] - t0, 1e-12)


def controller(path: Path | None, clock: list[float], engine: EngineFacts = ENGINE, **kw: Any) -> Controller:
    return Controller(engine, path, clock=lambda: clock[0], wall=lambda: 1_764_000_000.0 + clock[0], **kw)

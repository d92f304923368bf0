"""Fakes for the pure-logic tests: a published file builder and a scheduler-output stand-in.

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
from tabletune_pipelines.core.table import choose_draft_lengths, compact_ranges, goodput_matrix
from tabletune_pipelines.published import published_document, write_published_table

N, K = 16, 3
LAUNCH = ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, N, 3))
ENGINE = EngineFacts(max_k=K, max_num_seqs=N, launch_ranges=LAUNCH, model="/m/target", method="draft_model",
                     vllm_version="0.32.0")
IDENTITY = {"gpu": "cpu", "vllm_version": "0.32.0+cpu", "model": "/m/target", "drafter": "/m/draft",
            "method": "draft_model", "max_k": K, "max_num_seqs": N, "dtype": "bfloat16", "cudagraph_mode": "none"}


def linear_profile(n: int = N, k_max: int = K, c0=4.0, c1=0.6, d0=0.1, d1=0.1) -> dict[int, dict[int, float]]:
    """T(B, k) = c0 + c1·k + B·(d0 + d1·k) ms: k costs a fixed part and a part per request."""
    return {k: {b: c0 + c1 * k + b * (d0 + d1 * k) for b in range(1, n + 1)} for k in range(k_max + 1)}


def dense(profile: dict[int, dict[int, float]], ks: Sequence[int], n: int = N) -> np.ndarray:
    return np.array([[profile[k][b] for b in range(1, n + 1)] for k in ks])


def true_table(profile, rates, ks=(0, 1, 2, 3), n: int = N, stickiness: float = 0.005) -> list[list[int]]:
    """The table core.table's search builds from ``profile`` and ``rates`` (the reference)."""
    return compact_ranges(choose_draft_lengths(dense(profile, ks, n), ks, rates, stickiness=stickiness).chosen)


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


#: Tests publish a rebuild budget no busy machine reaches: a rebuild the 20 ms default would abandon on a
#: preempted core would leave the table a test expects unchanged. The budget itself is tested on its own
#: (test_logic: ``rebuild_budget_ms: 1e-6``); its cost is a benchmark's (controller_overhead.py).
REBUILD_BUDGET_MS = 60_000.0


def publish(path: Path, *, ranges, rates, profile=None, version: int = 1, controller: dict | None = None,
            identity: dict | None = IDENTITY, prior_count: int = 0, allowed_k=None, n: int = N, k_max: int = K,
            over_junk: bool = False, served_cost: dict | None = None) -> Path:
    """Publish a table for the fake engine. ``over_junk``: the test left a deliberately broken file
    there, which publishing refuses to replace (issue 12): remove it first."""
    if over_junk:
        path.unlink(missing_ok=True)
    profile = linear_profile(n, k_max) if profile is None else profile
    table = {"schema": "tabletune.draft_length_table", "schema_version": 1, "ranges": [list(r) for r in ranges],
             "max_num_seqs": n, "max_k": k_max, "identity_key": "cpu__test", "prior_id": "prior-test",
             "acceptance_rates": list(rates), "predicted_worst_loss": 0.0,
             "step_ms": {str(k): {str(b): float(v) for b, v in row.items()} for k, row in profile.items()}}
    if served_cost:
        table["served_cost"] = served_cost
    doc = published_document(
        deployment="test", version=version, table=table,
        speculative_config={"method": "draft_model", "num_speculative_tokens": k_max,
                            "num_speculative_tokens_per_batch_size": [list(r) for r in ranges]},
        published_at="2026-11-23T10:00:00Z", identity=identity,
        prior={"rates": list(rates), "num_drafts": prior_count, "prior_id": "prior-test", "source": "synthetic"},
        allowed_k=allowed_k, controller={"rebuild_budget_ms": REBUILD_BUDGET_MS, **(controller or {})})
    return write_published_table(path, doc)


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

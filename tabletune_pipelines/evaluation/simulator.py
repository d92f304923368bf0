"""The simulated engine: the closed-loop replay simulator (``simulate``, docs/evaluation.md) and the
fake engine of the controller's pure-logic tests (``FakeEngine``), two drivers of one engine model.

The model: a step of B running requests with k drafts each keeps m drafts per request with
P(m >= i) = a_i (the unconditional survival of docs/method.md, "Goodput") and gains m + 1 tokens;
it takes T(B, k) ms (a ``Surface``, or any ``(B, k) -> ms``), more when it carries prefill; the
policy's hooks are called as the vLLM adapter calls them (below). ``simulate`` draws a whole batch
at once and ``FakeEngine`` one request at a time (its own section below).

The load is closed-loop: L clients, each sending its next request the moment the last one ends,
so L requests are running at every step (B = L). Request lengths are drawn uniformly from
``Workload.lengths`` so requests do not end in lockstep; a request that just arrived spends its
first step in prefill: it produces one token and drafts nothing (that step counts it in
``num_new`` and its prompt in the scheduled tokens, as vLLM's scheduler output does). Prefill
*cost*: by default a step takes the surface's T(B, k) whatever it carries; with ``step_cost`` (the
one step-cost model, ``core.stepcost.StepCost``: the surface's decode times plus a graph envelope and
mixed-step fits, ``served_step_cost``) a step that carries prefill takes ``StepCost.step_ms(B, k, P)``,
the price the tuner and the controller use, capture-ceiling cliff included.

Acceptance is stochastic per request and step: with k drafts a request keeps its first m drafts
with P(m >= i) = a_i, drawn with one uniform u per request and step as m = #{i <= k : u < a_i}
(``_kept_together``); it then gains m + 1 tokens (capped at what the request has left). The
uniforms come from their own seeded stream, one vector per step, so every policy sees the same
draws (common random numbers: differences between policies are not sampling noise of separate
runs). ``Workload.switch_at`` changes the true rates mid-run.

Two kinds of policy:

* ``TablePolicy``: a fixed k per batch size (no speculation, each fixed k, a table).
* An engine-side policy with the controller's hooks, ``next_lookup()`` / ``on_step(step)``: the
  production ``controller.logic.Controller`` (built on a real published file, ``published_for``)
  or a baseline of ``evaluation.baselines``. The simulator calls them exactly as the vLLM adapter
  (``controller/scheduler.py``) does: ``next_lookup()`` before the step (None leaves the engine's
  launch table in force), the step's k = lookup[B], then ``on_step(StepOutcome(num_scheduled_tokens,
  scheduled_spec_decode_tokens, req_id_to_index, sampled_token_ids, k, num_new, total_tokens,
  now))`` (``controller.step.StepOutcome``) with ``now`` the simulated monotonic clock after the step.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.controller.logic import Controller
from tabletune_pipelines.controller.step import StepOutcome
from tabletune_pipelines.core.stepcost import GraphEnvelope, PrefillFit, StepCost
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.evaluation.surfaces import Surface
from tabletune_pipelines.evaluation.synthetic import ENGINE, REBUILD_BUDGET_MS
from tabletune_pipelines.formats.published_build import published_document
from tabletune_pipelines.formats.published_files import write_published_table
from tabletune_pipelines.formats.published_schema import PublishedVersion

PROMPT_TOKENS = 32
"""Prompt length of every request (only enters the scheduled-token count of its first step)."""


class EnginePolicy(Protocol):
    def next_lookup(self) -> list[int] | None: ...

    def on_step(self, step: StepOutcome) -> None: ...


@dataclass(frozen=True)
class TablePolicy:
    """A fixed k per batch size; ``ks`` None is the engine launched without speculation."""

    name: str
    """Report name."""
    ks: tuple[int, ...] | None
    """k for B = 1..max_num_seqs (index B − 1); None = no speculation."""

    @classmethod
    def fixed(cls, k: int, n: int) -> TablePolicy:
        return cls(f"fixed k={k}", (int(k),) * n)

    @classmethod
    def from_ranges(cls, name: str, ranges: Sequence[Sequence[int]], n: int, max_k: int) -> TablePolicy:
        """The table ``ranges`` (covering 1..n) over B = 1..n, k capped at ``max_k``
        (``core.table.DraftTable.dense``)."""
        return cls(name, tuple(int(k) for k in DraftTable.from_entries([list(r) for r in ranges]).dense(n, max_k)))


@dataclass(frozen=True)
class Workload:
    """The traffic: true acceptance, request lengths, an optional mid-run switch."""

    rates: tuple[float, ...]
    """True a_1..a_K (non-increasing)."""
    lengths: tuple[int, int] = (64, 512)
    """Output tokens per request, uniform in [lo, hi]."""
    switch_at: int | None = None
    """Step at which the true rates become ``switch_rates`` (None: never)."""
    switch_rates: tuple[float, ...] | None = None
    """The rates after the switch."""


@dataclass
class SimResult:
    """One simulated run."""

    load: int
    """L, concurrent requests."""
    steps: int
    """Steps simulated (including warm-up)."""
    tokens: int
    """Tokens kept after warm-up."""
    seconds: float
    """Simulated time after warm-up."""
    ks: np.ndarray
    """k run at every step."""
    step_tokens: np.ndarray
    """Tokens kept at every step."""
    step_ms: np.ndarray
    """Duration of every step, ms."""

    @property
    def goodput(self) -> float:
        """Tokens kept per second after warm-up."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def window_goodput(self, window: int) -> tuple[np.ndarray, np.ndarray]:
        """(end time s, goodput tok/s) per window of ``window`` steps."""
        n = len(self.step_ms) // window
        tok = self.step_tokens[: n * window].reshape(n, window).sum(1)
        sec = self.step_ms[: n * window].reshape(n, window).sum(1) / 1000.0
        return np.cumsum(sec), tok / sec


def _survival(rates: Sequence[float], k_max: int) -> np.ndarray:
    """The true a_1..a_K as an array of ``k_max`` (0 past the rates given)."""
    a = np.zeros(k_max)
    r = np.asarray(rates, dtype=float)[:k_max]
    a[: r.size] = r
    return a


def _kept_together(u: np.ndarray, a: np.ndarray, k: int) -> np.ndarray:
    """Drafts each request keeps of ``k``, one uniform ``u`` per request: m = #{i <= k : u < a_i}."""
    return (u[:, None] < a[None, :k]).sum(axis=1)


def _kept_one_by_one(a: Sequence[float], k: int, uniform: Callable[[], float]) -> int:
    """Drafts one request keeps of ``k``, drawn position by position: draft i is kept with
    probability a_i / a_(i-1) once draft i - 1 was (a_0 = 1), one ``uniform()`` per position tried,
    the first refusal ends the run. P(m >= i) = a_i, as ``_kept_together``'s draw."""
    m, prev = 0, 1.0
    while m < k:
        p = a[m] / prev if prev > 0 else 0.0
        if uniform() >= p:
            break
        prev = a[m]
        m += 1
    return m


def _requests(n: int) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """``n`` running requests: their ids, their batch index (``req_id_to_index``) and one scheduled
    token each (``num_scheduled_tokens`` of a decode step)."""
    ids = [f"r{i}" for i in range(n)]
    return ids, {r: i for i, r in enumerate(ids)}, {r: 1 for r in ids}


def _step_k(lookup: Sequence[int] | None, batch: int, launch_k: int) -> int:
    """The k a step of ``batch`` requests runs: the policy's ``lookup[batch]``, or the launch table's
    ``launch_k`` when ``next_lookup()`` returned None."""
    return int(lookup[batch]) if lookup is not None else int(launch_k)


def served_step_cost(surface: Surface, envelope: GraphEnvelope, fits: dict[str, PrefillFit]) -> StepCost:
    """The surface's decode times (rows k = 0..K) as a ``StepCost`` with a graph envelope and
    mixed-step fits (e.g. the ones the tuner measured on the GPU), for ``simulate(step_cost=...)``."""
    return StepCost(ks=tuple(range(surface.max_k + 1)), decode_ms=surface.ms, envelope=envelope, fits=fits)


def simulate(surface: Surface, policy: TablePolicy | EnginePolicy, load: int, steps: int, workload: Workload, *,
             seed: int = 0, warmup: int = 0, launch_k: Sequence[int] | None = None,
             trace: list[tuple[Any, ...]] | None = None, step_cost: StepCost | None = None) -> SimResult:
    """Run ``steps`` steps at ``load`` concurrent requests (module docstring).

    ``launch_k``: k per B (index B − 1) of the engine's launch table, used when an engine-side
    policy's ``next_lookup()`` returns None (default: K everywhere). ``trace``: if given, every
    ``on_step`` call's fields are appended (with the lookup first), for replaying them elsewhere.
    """
    L = int(load)
    n, K = surface.max_num_seqs, surface.max_k
    if not 1 <= L <= n:
        raise InvalidValueError(f"load {L} is outside 1..{n} (the surface's max_num_seqs)")
    acc_rng = np.random.default_rng([seed, 1])
    len_rng = np.random.default_rng([seed, 2])
    lo, hi = workload.lengths
    remaining = len_rng.integers(lo, hi + 1, size=L)
    # Clients start staggered (a request part-way through), so ends are spread from the first step.
    remaining = np.maximum(1, (remaining * len_rng.random(L)).astype(np.int64))
    new = np.zeros(L, dtype=bool)
    a = _survival(workload.rates, K)
    nospec = isinstance(policy, TablePolicy) and policy.ks is None
    ids, index, scheduled = _requests(L)
    launch = list(launch_k) if launch_k is not None else [K] * n
    ks_run = np.zeros(steps, dtype=np.int64)
    tok_run = np.zeros(steps, dtype=np.int64)
    ms_run = np.zeros(steps)
    now = 1000.0
    for step in range(steps):
        if workload.switch_at is not None and step == workload.switch_at:
            a = _survival(workload.switch_rates or workload.rates, K)
        if isinstance(policy, TablePolicy):
            k = 0 if policy.ks is None else policy.ks[L - 1]
            lookup = None
        else:
            lookup = policy.next_lookup()
            k = min(_step_k(lookup, L, launch[L - 1]), K)
        u = acc_rng.random(L)
        if k:
            m = _kept_together(u, a, k)
            m[new] = 0
        else:
            m = np.zeros(L, dtype=np.int64)
        gained = np.minimum(m + 1, remaining)
        n_new = int(new.sum())
        if nospec:
            dt = surface.t(L, None)
        elif step_cost is not None and n_new:
            dt = float(step_cost.step_ms(L, k, PROMPT_TOKENS * n_new))
        else:
            dt = surface.t(L, k)
        now += dt / 1000.0
        if not isinstance(policy, TablePolicy):
            draft = [] if not k else [0] * k
            spec = {ids[i]: draft for i in np.flatnonzero(~new)} if k else {}
            sampled = [[0] * (int(x) + 1) for x in m]
            total = L + k * (L - n_new) + (PROMPT_TOKENS - 1) * n_new
            if trace is not None:
                trace.append((None if lookup is None else list(lookup), dict(scheduled),
                              {r: list(v) for r, v in spec.items()}, dict(index),
                              [list(s) for s in sampled], k, n_new, total, now))
            policy.on_step(StepOutcome(scheduled, spec, index, sampled, k, n_new, total, now))
        remaining -= gained
        done = remaining <= 0
        new = done
        if done.any():
            remaining[done] = len_rng.integers(lo, hi + 1, size=int(done.sum()))
        ks_run[step] = k
        tok_run[step] = int(gained.sum())
        ms_run[step] = dt
    w = min(int(warmup), steps)
    return SimResult(load=L, steps=steps, tokens=int(tok_run[w:].sum()), seconds=float(ms_run[w:].sum()) / 1000.0,
                     ks=ks_run, step_tokens=tok_run, step_ms=ms_run)


# ---------------------------------------------------------------------------- the controller
def quartered(ranges, n: int) -> list[list[int]]:
    """A deliberately wrong table: every range of ``ranges`` shrunk to a quarter (ends divided by
    4, rounded up), no speculation above (k = 0), as in the method's repair experiment."""
    out: list[list[int]] = []
    start = 1
    for _, e, k in ranges:
        end = min(n, -(-int(e) // 4))
        if end >= start:
            out.append([start, end, int(k)])
            start = end + 1
    if start <= n:
        if out and out[-1][2] == 0:
            out[-1][1] = n
        else:
            out.append([start, n, 0])
    return out


def all_k_launch(n: int, K: int) -> tuple[tuple[int, int, int], ...]:
    """A launch table that lists every k 0..K (the controller may only use launch-table k values:
    docs/controller.md), K from B = K + 1 on."""
    out = [(k + 1, k + 1, k) for k in range(K)]
    out.append((K + 1, n, K))
    return tuple(out)


def published_for(path: str | os.PathLike[str], *, ranges: Sequence[Sequence[int]],
                  step_ms: dict[str, dict[str, float]], prior: Sequence[float], max_num_seqs: int, max_k: int,
                  prior_drafts: int = 4800,
                  version: int = 1, controller: dict[str, Any] | None = None,
                  deployment: str = "simulated") -> Path:
    """Write a real published file (``tabletune_pipelines.formats.published``) for the simulated engine.

    ``step_ms``: the tuner's T(B, k), ``{k: {B: ms}}`` with string keys (``DraftLengthTable.step_ms``).
    """
    rng = [[int(s), int(e), int(k)] for s, e, k in ranges]
    table = {"schema": "tabletune.draft_length_table", "schema_version": 1, "ranges": rng,
             "max_num_seqs": int(max_num_seqs), "max_k": int(max_k), "identity_key": f"sim__{deployment}",
             "prior_id": "prior-sim", "acceptance_rates": [float(x) for x in prior], "predicted_worst_loss": 0.0,
             "step_ms": step_ms}
    doc = published_document(
        PublishedVersion(deployment=deployment, version=version, table=table,
                         speculative_config={"method": "eagle3", "num_speculative_tokens": int(max_k),
                                             "num_speculative_tokens_per_batch_size": rng},
                         published_at="2026-12-01T00:00:00Z"),
        # The simulated engine's identity (a published file must carry one; the controller compares
        # the fields its engine knows: here K and max_num_seqs).
        identity={"gpu": "simulated", "vllm_version": "simulated", "model": "simulated-target", "drafter": None,
                  "method": "eagle3", "max_k": int(max_k), "max_num_seqs": int(max_num_seqs)},
        prior={"rates": [float(x) for x in prior], "num_drafts": int(prior_drafts), "prior_id": "prior-sim",
               "source": "synthetic"},
        # Simulated time: the production rebuild budget (wall clock) must not decide, or the figures
        # depend on how busy the machine is (at max_num_seqs 512 a rebuild passed 20 ms under load and
        # was skipped: two runs of one commit differed in a repair table).
        allowed_k=list(range(int(max_k) + 1)),
        controller={"rebuild_budget_ms": REBUILD_BUDGET_MS, **(controller or {})})
    return write_published_table(path, doc)


@dataclass
class ControllerFactory:
    """Builds a fresh production ``Controller`` on a published file, with the simulated clock."""

    path: Path
    """The published file."""
    max_num_seqs: int
    """max_num_seqs of the simulated engine."""
    max_k: int
    """K of the simulated engine."""
    clock: list[float] = field(default_factory=lambda: [1000.0])
    """The clock the controller reads (the simulator's ``now`` is passed to on_step)."""

    def engine(self) -> EngineFacts:
        return EngineFacts(max_k=self.max_k, max_num_seqs=self.max_num_seqs,
                           launch_ranges=all_k_launch(self.max_num_seqs, self.max_k))

    def __call__(self) -> Controller:
        import logging

        log = logging.getLogger("tabletune.evaluation.controller")
        log.setLevel(logging.ERROR)
        return Controller(self.engine(), self.path, clock=lambda: self.clock[0],
                          wall=lambda: 1_764_000_000.0 + self.clock[0], log=log)


# ---------------------------------------------------------------------------- the fake engine
class FakeEngine:
    """The fake engine: ``batch`` requests run step by step against ``controller``, the fast
    stand-in engine of the controller's pure-logic tests (no vLLM).

    Each step calls ``next_lookup()`` and ``on_step(StepOutcome(...))`` as the vLLM adapter does;
    each request keeps ``_kept_one_by_one`` drafts of the step's k (true survival ``rates``) and
    the step takes ``step_ms(B, k)`` ms of a simulated monotonic clock (``clock[0]``, seconds). All
    draws come from one ``random.Random(seed)`` stream, in a fixed order (request lengths first,
    then each step's requests in batch order): the seeded tests count on that stream.

    After a run, ``ks_run`` holds the k of every step; ``tamper``, if set, may edit each step's
    sampled tokens (one list per request) before the controller sees them.
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
        """Drafts one request keeps of ``k`` (the next draw of the stream)."""
        return _kept_one_by_one(self.rates, k, self.rng.random)

    def run(self, steps: int, batch: int, default_k: int = ENGINE.max_k, *, output_tokens: int | None = None,
            prompt_tokens: int = 0, extra_ms: Callable[[int, int, int], float] | None = None) -> float:
        """``steps`` steps at ``batch`` requests; ``default_k`` runs when the controller's
        ``next_lookup()`` is None. With ``output_tokens``, a closed loop: a request ends after that
        many tokens and a new one takes its place the next step, bringing ``prompt_tokens`` of
        prefill; such a step costs ``extra_ms(B, k, prefill tokens)`` more than the decode step.
        Returns the tokens produced per second."""
        c = self.c
        ids, idx, nst = _requests(batch)
        left = [self.rng.randint(1, output_tokens) for _ in ids] if output_tokens else []
        new = 0
        t0, made = self.clock[0], 0
        for _ in range(steps):
            k = _step_k(c.next_lookup(), batch, default_k)
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


def fake_controller(path: Path | None, clock: list[float], engine: EngineFacts = ENGINE, **kw: Any) -> Controller:
    """A production ``Controller`` of ``engine`` (default: the test engine of ``evaluation.synthetic``)
    on the published file ``path``, reading the fake engine's clock ``clock[0]`` (``kw``: the
    controller's other arguments)."""
    return Controller(engine, path, clock=lambda: clock[0], wall=lambda: 1_764_000_000.0 + clock[0], **kw)

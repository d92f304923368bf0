"""One measurement of one cell T(B, k) on a running server (docs/method.md, "Step time T(B, k)").

A repetition sends B prompts of token ids in one ``/v1/completions`` request, once with
``max_tokens = 1`` and once with ``max_tokens = 65`` (``ignore_eos``), after arming the engine's
admission gate so all B are scheduled in one step. The step time is the median of the
engine-side intervals of the steady decode steps at exactly B with B·k drafts
(``timing = "engine"``). A drafter that proposes fewer than k tokens in some steps (n-gram
drafting finds no match for part of the batch: at B = 4, k = 3 only 3-9 of 64 steps of the
embedded default carry all B·k drafts, at B >= 9 almost none) leaves too few such steps; the
step time at B·k drafts is then read off a robust straight-line fit of the step interval against
the drafts verified in it, over every steady step at B (``engine_method = "fit"``; verification
cost grows with the tokens verified). Only when that is impossible too (too few steady steps,
drafts that never vary or stay far below B·k) does it fall back to ``(t65 - t1) / 64``
(``timing = "wall"``, with the reason in ``engine_method``) — which for such a drafter
under-states T(B, k), because the wall clock also counts the steps that drafted less.

A batch the engine admits over several steps (its prompts exceed the step's token budget: 16
prompts of 512 tokens on the CPU build, 128 of 2,048 on an H100) still has steady steps at exactly
B once the last prompt is in, its requests' KV lengths apart by the few admission steps: an engine
timing from them is kept. Only a wall timing, which assumes every request started together, makes
a late admission be measured again. A step that carries prompt tokens (more scheduled tokens than
its requests' one token and drafts each) is never steady.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tabletune_pipelines.core.stats import theil_sen
from tabletune_pipelines.core.steptime import DEFAULT_DECODE_STEPS, SHORT_MAX_TOKENS, step_time_from_pair
from tabletune_pipelines.errors import EngineError, TableTuneError
from tabletune_pipelines.vocab import TimingSource

logger = logging.getLogger("tabletune.profiler")

MIN_ENGINE_STEPS = 8
"""Fewest engine-side steps at exactly batch size B for an engine timing to count."""
MIN_FIT_REACH = 0.5
"""The draft-count fit is used only if some steady step verified at least this fraction of B·k."""
WARMUP_MAX_TOKENS = 4
"""Output tokens of a warm-up batch: enough decode steps to run the batch's decode shapes once."""


class TimingServer(Protocol):
    """What a measurement needs of a server (``VLLMServer`` has it)."""

    def arm_gate(self, n: int) -> None: ...
    def complete(self, prompt: Any, *, max_tokens: int, **kwargs: Any) -> dict[str, Any]: ...
    def step_log_offset(self) -> int: ...
    def read_steps(self, since: float | None = None, until: float | None = None,
                   offset: int = 0) -> list[dict[str, Any]]: ...
    def log_tail(self, lines: int = 40) -> str: ...


@dataclass(frozen=True)
class Measurement:
    """One repetition of one cell: a 1-token and a 65-token batch of B requests."""

    k: int | None
    """Draft length the server ran (None: the no-speculation server)."""
    batch_size: int
    """Requests in the batch."""
    step_ms: float
    """The value used: engine median if available, else the wall estimate."""
    timing: TimingSource
    """``engine`` or ``wall``."""
    engine_ms: float | None
    """Median engine interval over steps at exactly batch size B (None if too few)."""
    wall_ms: float | None
    """(t65 - t1) / decode steps, None if not computable."""
    engine_steps: int
    """Steps that entered the engine median."""
    admitted_together: bool
    """All B requests of the long batch were first scheduled in one step."""
    attempts: int
    """Attempts made (a late admission is measured again when only the wall clock timed it)."""
    t1_s: float
    """Wall seconds of the 1-token batch."""
    t65_s: float
    """Wall seconds of the 65-token batch."""
    engine_method: str = "exact"
    """How the value was obtained: ``exact`` (median over steps with all B·k drafts), ``fit``
    (line fit over drafts, see the module docstring), else why engine timing failed."""


def timing_prompts(batch_size: int, prompt_tokens: int, vocab_size: int, seed: int) -> list[list[int]]:
    """B prompts of ``prompt_tokens`` random token ids (seeded): token ids skip the tokenizer, so
    they fit any model of ``vocab_size``."""
    rng = random.Random(seed)
    lo = 3  # skip <s>, </s>, <pad> of the tiny tokenizer; harmless for others
    hi = max(lo + 1, vocab_size - 1)
    return [[rng.randint(lo, hi) for _ in range(prompt_tokens)] for _ in range(batch_size)]


def run_batch(server: TimingServer, prompts: list[list[int]], max_tokens: int,
              timeout: float) -> tuple[float, float, float]:
    """Send the B prompts as one request (after arming the engine's admission gate so all B are
    scheduled in one step); returns (wall seconds, t_start, t_end) in time.monotonic()."""
    server.arm_gate(len(prompts))
    t0 = time.monotonic()
    out = server.complete(prompts, max_tokens=max_tokens, ignore_eos=True, temperature=0.0, timeout=timeout)
    t1 = time.monotonic()
    got = len(out.get("choices", []))
    if got != len(prompts):
        raise EngineError(f"asked for {len(prompts)} completions, got {got}")
    return t1 - t0, t0, t1


def warm_up(server: TimingServer, batch_size: int, *, prompt_tokens: int, vocab_size: int,
            request_timeout: float = 600.0) -> float:
    """Run one untimed batch of B requests at the k in force; returns its wall seconds.

    On a GPU the first pass over a new batch shape JIT-compiles kernels (MoE above all), which
    would land in the first repetition's 1-token run and make ``t1`` wrong.
    """
    prompts = timing_prompts(batch_size, prompt_tokens, vocab_size, seed=7)
    return run_batch(server, prompts, WARMUP_MAX_TOKENS, request_timeout)[0]


def analyse_steps(steps: Sequence[dict[str, Any]], batch_size: int, k: int | None) -> tuple[list[float], bool]:
    """Engine intervals (ms) of steady decode steps at exactly ``batch_size`` with ``k`` drafts,
    and whether all requests were admitted in one step.

    A step counts if it ran B requests, admitted none, carried no prompt tokens, verified B·k drafts
    (0 without speculation), and the step before it also ran B requests (so its interval is one full step).
    """
    admits = [s.get("new", 0) for s in steps if s.get("new", 0) > 0]
    together = len(admits) == 1 and admits[0] == batch_size
    want_d = batch_size * (k or 0)
    out: list[float] = []
    prev_b = None
    for s in steps:
        ok = (s.get("b") == batch_size and s.get("new", 0) == 0 and prev_b == batch_size
              and s.get("dt") is not None and s.get("d", 0) == want_d and _decode_only(s)
              and (k is None or s.get("k") in (None, k)))
        if ok:
            out.append(float(s["dt"]))
        prev_b = s.get("b")
    return out, together


def steady_steps(steps: Sequence[dict[str, Any]], batch_size: int, k: int | None) -> list[tuple[float, int]]:
    """(interval ms, drafts verified) of every steady decode step at exactly ``batch_size``: it ran
    B requests, admitted none, carried no prompt tokens, ran k (or the engine did not say), and the
    step before it also ran B requests (so its interval is one full step)."""
    out: list[tuple[float, int]] = []
    prev_b = None
    for s in steps:
        if (s.get("b") == batch_size and s.get("new", 0) == 0 and prev_b == batch_size and s.get("dt") is not None
                and _decode_only(s) and (k is None or s.get("k") in (None, k))):
            out.append((float(s["dt"]), int(s.get("d", 0) or 0)))
        prev_b = s.get("b")
    return out


def _decode_only(step: dict[str, Any]) -> bool:
    """Whether a step record scheduled no prompt tokens: at most one token and its drafts per request
    (``tok`` <= ``b`` + ``d``). A record without ``tok`` (an older step log) counts as decode only."""
    tok = step.get("tok")
    return tok is None or int(tok) <= int(step.get("b", 0) or 0) + int(step.get("d", 0) or 0)


def engine_step_ms(steady: Sequence[tuple[float, int]], batch_size: int, k: int | None,
                   min_steps: int = MIN_ENGINE_STEPS) -> tuple[float | None, str]:
    """Engine-side step time at B·k drafts from ``steady_steps``, and how it was obtained.

    The median over steps with exactly B·k drafts when there are ``min_steps`` of them
    (``"exact"``); else the Theil-Sen line of interval against drafts over every steady step,
    evaluated at B·k (``"fit"``), when there are ``min_steps`` steady steps with at least two draft
    counts, one of them reaching ``MIN_FIT_REACH`` of B·k; else None and the reason.
    """
    want = batch_size * (k or 0)
    exact = [dt for dt, d in steady if d == want]
    if len(exact) >= min_steps:
        return float(statistics.median(exact)), "exact"
    if len(steady) < min_steps:
        return None, f"{len(steady)} steady steps at B={batch_size} (< {min_steps})"
    counts = sorted({d for _, d in steady})
    if want == 0 or len(counts) < 2:
        return None, f"{len(exact)} steps with all {want} drafts and draft counts that do not vary"
    if counts[-1] < MIN_FIT_REACH * want:
        return None, f"drafts per step reach only {counts[-1]} of {want}"
    # verifying more tokens cannot be cheaper: the slope is at least 0
    intercept, slope = theil_sen(((d, dt) for dt, d in steady), min_slope=0.0)
    return intercept + slope * want, "fit"


def measure_cell_once(
    server: TimingServer,
    k: int | None,
    batch_size: int,
    *,
    seed: int,
    prompt_tokens: int = 32,
    vocab_size: int = 2048,
    all_accepted: bool = False,
    max_attempts: int = 3,
    request_timeout: float = 300.0,
    decode_steps: int = DEFAULT_DECODE_STEPS,
) -> Measurement:
    """One repetition at (k, B) on a server already switched to k: ``decode_steps`` decode steps
    after the first token (fewer with every draft accepted). Measures again when nothing timed it,
    or when only the wall clock did and the batch was admitted late."""
    long_tokens = SHORT_MAX_TOKENS + decode_steps
    if all_accepted and k:
        decode_steps = math.ceil(decode_steps / (k + 1))
    min_steps = min(MIN_ENGINE_STEPS, max(2, decode_steps // 2))
    last: Measurement | None = None
    steps: list[dict[str, Any]] = []
    for attempt in range(1, max_attempts + 1):
        prompts = timing_prompts(batch_size, prompt_tokens, vocab_size, seed * 1000 + attempt)
        t1, _, _ = run_batch(server, prompts, SHORT_MAX_TOKENS, request_timeout)
        prompts = timing_prompts(batch_size, prompt_tokens, vocab_size, seed * 1000 + 500 + attempt)
        offset = server.step_log_offset()
        t65, a, b = run_batch(server, prompts, long_tokens, request_timeout)
        steps = server.read_steps(since=a, until=b + 0.5, offset=offset)
        intervals, together = analyse_steps(steps, batch_size, k)
        steady = steady_steps(steps, batch_size, k)
        engine_ms, how = engine_step_ms(steady, batch_size, k, min_steps)
        try:
            wall_ms: float | None = step_time_from_pair(t1, t65, decode_steps)
        except TableTuneError:
            wall_ms = None
        timing: TimingSource
        if engine_ms is not None:
            value, timing = engine_ms, "engine"
        elif wall_ms is not None:
            value, timing = wall_ms, "wall"
        else:
            value, timing = float("nan"), "wall"
        last = Measurement(k=k, batch_size=batch_size, step_ms=value, timing=timing, engine_ms=engine_ms,
                           wall_ms=wall_ms, engine_steps=len(intervals) if how == "exact" else len(steady),
                           admitted_together=together, attempts=attempt, t1_s=t1, t65_s=t65, engine_method=how)
        if math.isfinite(value) and (together or timing == "engine"):
            return last  # steady steps at exactly B time a late admission as well as a prompt one
        logger.info("late admission or no timing at k=%s B=%d (attempt %d): %d admission steps; re-measuring",
                    k, batch_size, attempt, sum(1 for s in steps if s.get("new", 0) > 0))
    assert last is not None
    if not math.isfinite(last.step_ms):
        raise EngineError(f"no usable step time at k={k}, B={batch_size} after {max_attempts} attempts",
                          server.log_tail(10))
    return last  # timed by the wall clock only, admitted late every time: the best there is

"""One engine step as the controller's hooks see it, and the one per-request count of drafted and
kept tokens. Stdlib only: ``engine.timing_scheduler`` imports it inside vLLM's engine core too.

``StepOutcome`` is built once per step by the vLLM adapter (``controller/scheduler.py``) from
``update_from_output``'s arguments and handed to every ``on_step`` (``logic.Controller``, the
evaluation baselines, the simulator's policies).

``count_drafts`` is the rule every counter of acceptance follows, vLLM's own
(``Scheduler.update_from_output`` counts a request's drafts only when it generated tokens): per
request that verified n > 0 drafts and produced a non-empty output of m + 1 tokens, one increment
of ``hist_d[n]`` and of ``hist_a[m]``; a request finished or aborted in the step (empty output, or
no row in the output) counts nothing; m > n or n > K is an anomaly, clamped to n = min(n, K),
m = min(m, n).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one engine step did: the scheduler's output and the model runner's, as counted."""

    num_scheduled_tokens: Mapping[str, int]
    """``SchedulerOutput.num_scheduled_tokens``: request id -> tokens scheduled in the step; its
    length is the step's batch size B."""
    spec_tokens: Mapping[str, Sequence[Any]] | None
    """``SchedulerOutput.scheduled_spec_decode_tokens``: request id -> the draft tokens verified in
    the step (None or empty when nothing was drafted)."""
    req_id_to_index: Mapping[str, int]
    """``ModelRunnerOutput.req_id_to_index``: request id -> its row of ``sampled``."""
    sampled: Sequence[Sequence[int]] | None
    """``ModelRunnerOutput.sampled_token_ids``: per row, the tokens the step produced (the kept
    drafts and one more; empty for a request finished or aborted in the step)."""
    k_next: int | None
    """``SchedulerOutput.num_spec_tokens_to_schedule``: the k of the step (None on an engine whose
    output lacks the field: then the longest draft verified stands for it)."""
    num_new: int
    """``len(SchedulerOutput.scheduled_new_reqs)``: requests admitted in the step."""
    total_tokens: int
    """``SchedulerOutput.total_num_scheduled_tokens``: decode, draft and prefill tokens scheduled."""
    now: float
    """``time.monotonic()`` after ``update_from_output``: the end of the step."""
    column: int = 0
    """The context bucket whose lookup the step was scheduled with (0 without a context axis;
    ``logic.Controller.next_lookup``)."""

    def decode_only(self, drafted: int) -> bool:
        """Whether the step only decoded: nothing admitted and no prefill tokens, so its
        ``total_tokens`` are one per request plus the ``drafted`` tokens it verified."""
        return self.num_new == 0 and self.total_tokens == len(self.num_scheduled_tokens) + drafted


def count_drafts(spec_tokens: Mapping[str, Sequence[Any]] | None, req_id_to_index: Mapping[str, int],
                 sampled: Sequence[Sequence[int]] | None, max_k: int, hist_d: list[int], hist_a: list[int],
                 on_anomaly: Callable[[int, int], None] | None = None) -> tuple[int, int, int]:
    """Count one step's requests into the histograms ``hist_d`` (drafted n) and ``hist_a`` (kept m),
    both of length ``max_k + 1`` (module docstring for the rule). ``on_anomaly(n, m)`` gets each
    request-step that reported m > n or n > ``max_k`` (as reported, before clamping).

    Returns (drafted, kept, rejections): the drafts and kept drafts counted, and the request-steps
    that rejected a draft (m < n). No allocation per request (the longest draft counted, where a
    caller needs it, is the last non-zero slot of a histogram of this step alone: ``longest``)."""
    drafted = kept = rejections = 0
    if not spec_tokens or not sampled:
        return 0, 0, 0
    ns = len(sampled)
    for rid, toks in spec_tokens.items():
        n = len(toks)
        if not n:
            continue
        i = req_id_to_index.get(rid)
        if i is None or i >= ns:
            continue
        out = sampled[i]
        if not len(out):
            continue  # finished or aborted in this step: vLLM counts nothing either
        m = len(out) - 1
        if m > n or n > max_k:
            if on_anomaly is not None:
                on_anomaly(n, m)
            n = min(n, max_k)
            m = min(m, n)
        hist_d[n] += 1
        hist_a[m] += 1
        drafted += n
        kept += m
        if m < n:
            rejections += 1
    return drafted, kept, rejections


def longest(hist_d: Sequence[int]) -> int:
    """The longest draft counted in a histogram of drafted n (0 when none)."""
    for n in range(len(hist_d) - 1, 0, -1):
        if hist_d[n]:
            return n
    return 0


def fold(hist_d: list[int], hist_a: list[int]) -> tuple[list[int], list[int]]:
    """Per-position counts from the histograms, which it empties: (drafted_i, accepted_i) for
    i = 1..K, drafted_i = request-steps that drafted at least i, accepted_i = those that kept at
    least i (a variable k then does not bias later positions)."""
    K = len(hist_d) - 1
    d, a = [0] * K, [0] * K
    sd = sa = 0
    for i in range(K, 0, -1):
        sd += hist_d[i]
        sa += hist_a[i]
        d[i - 1], a[i - 1] = sd, sa
    for i in range(K + 1):
        hist_d[i] = 0
        hist_a[i] = 0
    return d, a


def running_context(scheduler: Any) -> list[int]:
    """The running requests' context lengths before a step is scheduled: each request's
    ``num_computed_tokens``, the tokens whose KV is in the cache (prompt and output so far; the
    token the step feeds and its drafts are not counted). These are the lengths the step's attention
    reads; vLLM's 5-item schedule aggregates the same per-request context."""
    return [r.num_computed_tokens for r in scheduler.running]

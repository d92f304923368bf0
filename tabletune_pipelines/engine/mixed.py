"""Mixed steps on the serving path: decode batches that also carry prefill (docs/method.md, "What a
served step costs").

One measurement at (k, B): a batch of B requests (token-id prompts, ``decode_tokens`` output tokens,
admitted together through the engine's admission gate) decodes at k, every draft rejected; while
it decodes, single prompts of P tokens for each P of ``prefill_tokens`` (in turn, one at a time,
``max_tokens = 1``: prefilled, sampled once and gone) land in the running batch. The step that
admits one is a mixed step of B decoding requests plus P prefill tokens; the steps between are pure
decode steps of the same batch. Every step of the batch is read back from the engine's step log
(``core.stepcost.samples_from_step_log``): the mixed steps feed the prefill fit, the pure ones show
what the decode cell costs in the same seconds. On a GPU a mixed step runs piecewise or, above the
capture ceiling, without graphs: include a P that crosses the ceiling to measure that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from tabletune_pipelines.core.stepcost import StepSample, attribute_mixed_steps, samples_from_step_log
from tabletune_pipelines.core.steptime import DEFAULT_DECODE_STEPS
from tabletune_pipelines.engine.cell import TimingServer, run_batch, timing_prompts
from tabletune_pipelines.errors import EngineError

logger = logging.getLogger("tabletune.mixed")



def mixed_decode_tokens(decode_steps: int) -> int:
    """Output tokens of the decoding batch of a profile whose repetitions time ``decode_steps``
    steps: twice as many steps, plus the first token (129 for the default 64)."""
    return 1 + 2 * int(decode_steps)


#: Output tokens of the decoding batch by default: long enough for several injected prompts on a slow CPU.
MIXED_DECODE_TOKENS = mixed_decode_tokens(DEFAULT_DECODE_STEPS)

#: Prompt length of the decoding batch's requests, in tokens.
BATCH_PROMPT_TOKENS = 32
#: Decode steps between two injected prompts (so each mixed step has decode steps around it).
QUIET_STEPS = 3


def _wait_decoding(server: TimingServer, offset: int, batch_size: int, thread: threading.Thread,
                   timeout: float) -> bool:
    """Until the step log shows the batch decoding (a step of B requests admitting none)."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        steps = server.read_steps(offset=offset)
        if any(s.get("b") == batch_size and not s.get("new") for s in steps):
            return True
        time.sleep(0.005)
    return False


def measure_mixed_steps(
    server: TimingServer,
    k: int,
    batch_size: int,
    prefill_tokens: Sequence[int],
    *,
    vocab_size: int,
    seed: int,
    decode_tokens: int = MIXED_DECODE_TOKENS,
    request_timeout: float = 300.0,
) -> list[StepSample]:
    """Every timed step of one decoding batch at (k, B) with prompts of ``prefill_tokens`` injected
    (module docstring), as samples of B decoding requests at k. Raises ``EngineError`` when the
    batch's requests fail."""
    if not prefill_tokens:
        return []
    prompts = timing_prompts(batch_size, BATCH_PROMPT_TOKENS, vocab_size, seed)
    offset = server.step_log_offset()
    result: dict[str, Any] = {}

    def decode() -> None:
        try:
            result["span"] = run_batch(server, prompts, decode_tokens, request_timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=decode, name="tabletune-mixed-batch", daemon=True)
    t0 = time.monotonic()
    thread.start()
    injected = 0
    if _wait_decoding(server, offset, batch_size, thread, request_timeout):
        i = 0
        while thread.is_alive():
            # At least QUIET_STEPS steps between injections: a mixed step's cost is read with its
            # neighbours (``core.stepcost.attribute_mixed_steps``), which must be decode steps. On a
            # slow engine (an MoE on a GPU, 20+ ms a step) prompts would otherwise land every step.
            since = server.step_log_offset()  # only the lines logged from here on are read while waiting
            while thread.is_alive() and len(server.read_steps(offset=since)) < QUIET_STEPS:
                time.sleep(0.002)
            if not thread.is_alive():
                break
            p = int(prefill_tokens[i % len(prefill_tokens)])
            i += 1
            prompt = timing_prompts(1, p, vocab_size, seed * 7919 + i)[0]
            try:
                server.complete([prompt], max_tokens=1, ignore_eos=True, temperature=0.0, timeout=request_timeout)
                injected += 1
            except Exception as exc:  # noqa: BLE001 - a failed injection loses one sample, not the batch
                logger.info("mixed steps: an injected prompt of %d tokens failed at k=%d B=%d: %s", p, k,
                            batch_size, exc)
    thread.join(request_timeout)
    if "error" in result:
        raise EngineError(f"the decoding batch of {batch_size} requests at k = {k} failed: {result['error']}",
                          server.log_tail(10))
    steps = server.read_steps(since=t0, offset=offset)
    samples = batch_samples(steps, batch_size, k)
    logger.info("mixed steps at k=%d B=%d: %d prompts injected, %d samples (%d mixed)", k, batch_size, injected,
                len(samples), sum(1 for s in samples if s.prefill_tokens > 0))
    return samples


def batch_samples(steps: Sequence[dict[str, Any]], batch_size: int, k: int) -> list[StepSample]:
    """The step log of one decoding batch at (k, B) as samples (``core.stepcost.attribute_mixed_steps``):
    the steps in which every request verified k drafts; where no mixed step is among those (a drafter
    that proposes fewer than k tokens for part of the batch in most steps: n-gram lookup on the
    profile's random-token prompts at B = 15 leaves none), the steps of every draft count, each
    carrying its own decode tokens (``core.stepcost.fit_prefill_costs`` prices their base at them)."""
    def of(full: bool) -> list[StepSample]:
        return attribute_mixed_steps([s for s in samples_from_step_log(steps, full_drafts=full)
                                      if s.batch == batch_size and s.k == k])

    full = of(True)
    return full if any(s.prefill_tokens > 0 for s in full) else of(False)


def default_mixed_batch_sizes(grid: Sequence[int], max_num_seqs: int) -> list[int]:
    """Smallest, middle and largest of the profile's grid (the fit needs D spread over B), the
    largest below ``max_num_seqs``: at max_num_seqs no request can join a running batch (in serving,
    arrivals join a batch that is one short of full)."""
    g = sorted({min(int(b), max(1, max_num_seqs - 1)) for b in grid})
    return sorted({g[0], g[len(g) // 2], g[-1]})


def default_mixed_prefill_tokens(max_model_len: int, capture_ceiling: int | None, prompt_tokens: int = 32) -> list[int]:
    """A spread of prompt lengths around the workload's (``prompt_tokens``): ½×, 2×, 8×, and on a GPU
    one that crosses the capture ceiling, each fitting the context (``max_model_len``)."""
    ps = {max(1, prompt_tokens // 2), 2 * prompt_tokens, 8 * prompt_tokens}
    if capture_ceiling is not None:
        ps.add(capture_ceiling)
    return sorted(p for p in ps if p + 1 <= max_model_len)

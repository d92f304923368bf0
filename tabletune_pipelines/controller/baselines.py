"""Two adaptive baselines as controller variants: the same hooks as ``logic.Controller``
(``next_lookup()`` before a step, ``on_step(...)`` after it, ``close()``), so the vLLM adapter or
the replay simulator (``tabletune_pipelines.evaluation.simulator``) drives them unchanged. Stdlib +
numpy, no vLLM. What each implements from its paper is in docs/evaluation.md, "Baselines".

* ``TurboSpecPolicy`` (SmartSpec/TurboSpec, arXiv 2406.14066, "Optimizing Speculative Decoding for
  Serving Large Language Models Using Goodput"): every step, for every batch size B, the k that
  maximises the predicted goodput B·τ̂(k) / T_lin(B, k). T_lin is a *linear* least-squares model
  of the profile, T ≈ c0 + c1·B + c2·k + c3·B·k (the paper models batch time as linear in the
  batched tokens B·(k+1) and the drafter's time as linear per proposal step). τ̂ follows the
  paper's acceptance model: one per-token acceptance rate α̂, estimated from live counts with an
  exponential forgetting, and τ̂(k) = (1 − α̂^(k+1)) / (1 − α̂).
* ``NightjarPolicy`` ("Nightjar: Dynamic Adaptive Speculative Decoding for Large Language Models
  Serving", arXiv 2512.22420): an independent multi-armed bandit per batch size choosing k from
  the observed goodput of its own steps. The paper's planner is a MAB per batch size; the exact
  bandit rule is not reproduced here: this is UCB1 (Auer et al. 2002) with exploration constant
  ``c`` on rewards normalised by the largest seen. Its offloading of the drafter under memory
  pressure is out of scope (no KV-cache model here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def linear_step_model(step_ms: Mapping[int, Mapping[int, float]]) -> np.ndarray:
    """Least-squares (c0, c1, c2, c3) of T ≈ c0 + c1·B + c2·k + c3·B·k over a profile ``{k: {B: ms}}``."""
    rows, y = [], []
    for k, cells in step_ms.items():
        for b, ms in cells.items():
            rows.append((1.0, float(b), float(k), float(b) * float(k)))
            y.append(float(ms))
    if len(rows) < 4:
        raise ValueError(f"a linear step-time model needs at least 4 profile cells, got {len(rows)}")
    coef, *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(y), rcond=None)
    return coef


def _counts(spec_tokens: Mapping[str, Sequence[Any]] | None, req_id_to_index: Mapping[str, int],
            sampled: Sequence[Sequence[int]] | None) -> tuple[int, int, int]:
    """(kept drafts, positions tried, request-steps that drafted) of one step; a position is
    tried when it was drafted and every draft before it was kept."""
    kept = tried = n_req = 0
    if not spec_tokens or not sampled:
        return 0, 0, 0
    ns = len(sampled)
    for rid, toks in spec_tokens.items():
        n = len(toks)
        i = req_id_to_index.get(rid)
        if not n or i is None or i >= ns or not len(sampled[i]):
            continue
        m = min(len(sampled[i]) - 1, n)
        kept += m
        tried += m + (1 if m < n else 0)
        n_req += 1
    return kept, tried, n_req


class TurboSpecPolicy:
    """k per step from a linear step-time model and a live per-token acceptance rate (module docstring)."""

    def __init__(self, step_ms: Mapping[int, Mapping[int, float]], max_num_seqs: int, allowed_k: Sequence[int], *,
                 initial_alpha: float = 0.5, forget: float = 0.995, prior_tokens: float = 50.0) -> None:
        self.ks = np.asarray(sorted(int(k) for k in allowed_k), dtype=np.int64)
        self.n = int(max_num_seqs)
        self.coef = linear_step_model(step_ms)
        b = np.arange(1, self.n + 1, dtype=float)
        # T_lin for every (k, B); floored so an extrapolated fit never predicts a free step.
        t = self.coef[0] + self.coef[1] * b[None, :] + (self.coef[2] + self.coef[3] * b[None, :]) * self.ks[:, None]
        self.t_lin = np.maximum(t, 1e-3)
        self.forget = float(forget)
        self.kept = float(initial_alpha) * prior_tokens
        self.tried = float(prior_tokens)
        self.steps = 0
        self._lookup = self._build()

    @property
    def alpha(self) -> float:
        return min(0.999, self.kept / self.tried) if self.tried > 0 else 0.0

    def tau(self) -> np.ndarray:
        a = self.alpha
        return (1.0 - a ** (self.ks + 1)) / (1.0 - a)

    def _build(self) -> list[int]:
        best = np.argmax(self.tau()[:, None] / self.t_lin, axis=0)  # B cancels at a fixed B
        return [0, *self.ks[best].tolist()]

    def next_lookup(self) -> list[int]:
        return self._lookup

    def on_step(self, num_scheduled_tokens: Mapping[str, int], spec_tokens: Mapping[str, Sequence[Any]] | None,
                req_id_to_index: Mapping[str, int], sampled: Sequence[Sequence[int]] | None, k_next: int | None,
                num_new: int, total_tokens: int, now: float) -> None:
        if not num_scheduled_tokens:
            return
        self.steps += 1
        kept, tried, _ = _counts(spec_tokens, req_id_to_index, sampled)
        if tried:
            self.kept = self.kept * self.forget + kept
            self.tried = self.tried * self.forget + tried
            self._lookup = self._build()

    def close(self) -> None:
        pass


class NightjarPolicy:
    """UCB1 per batch size over the allowed k, rewarded with the step's goodput (module docstring)."""

    def __init__(self, max_num_seqs: int, allowed_k: Sequence[int], *, c: float = 1.0) -> None:
        self.ks = [int(k) for k in sorted(allowed_k)]
        self.n = int(max_num_seqs)
        self.c = float(c)
        arms = len(self.ks)
        self.count = np.zeros((self.n + 1, arms))
        self.total = np.zeros((self.n + 1, arms))
        self.r_max = 0.0
        self.steps = 0
        # Untried arms go first, the largest k first (index = batch size, vLLM's layout).
        self._lookup = [0] + [self.ks[-1]] * self.n
        self._last_t: float | None = None
        self._pending: tuple[int, int] | None = None

    def _choose(self, b: int) -> int:
        cnt, tot = self.count[b], self.total[b]
        untried = np.flatnonzero(cnt == 0)
        if untried.size:
            return self.ks[int(untried[-1])]
        scale = self.r_max if self.r_max > 0 else 1.0
        ucb = tot / cnt / scale + self.c * np.sqrt(2.0 * math.log(cnt.sum()) / cnt)
        return self.ks[int(np.argmax(ucb))]

    def next_lookup(self) -> list[int]:
        return self._lookup

    def on_step(self, num_scheduled_tokens: Mapping[str, int], spec_tokens: Mapping[str, Sequence[Any]] | None,
                req_id_to_index: Mapping[str, int], sampled: Sequence[Sequence[int]] | None, k_next: int | None,
                num_new: int, total_tokens: int, now: float) -> None:
        b = len(num_scheduled_tokens)
        last, self._last_t = self._last_t, now
        if b == 0 or b > self.n:
            return
        self.steps += 1
        k = self._lookup[b] if k_next is None else int(k_next)
        if last is None or k not in self.ks:
            return
        dt = now - last
        if dt <= 0:
            return
        kept, _, _ = _counts(spec_tokens, req_id_to_index, sampled)
        reward = (b + kept) / (b * dt)  # tokens per request per second: the step's goodput over B
        arm = self.ks.index(k)
        self.count[b, arm] += 1
        self.total[b, arm] += reward
        self.r_max = max(self.r_max, reward)
        self._lookup[b] = self._choose(b)

    def close(self) -> None:
        pass

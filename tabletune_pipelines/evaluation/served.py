"""The measuring harness on top of the served verification (``tuning.served_verification``): every
policy at every load in one launch (``run_closed_loop``), the loss of each policy against the best
fixed k (``loss_table``), and whether raising the CUDA-graph capture ceiling beats lowering k
(``compare_envelopes``, one judged launch per envelope). The benchmarks use it; publishing does not.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabletune_pipelines.core.stats import t_quantile
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.tuning.served_load import LoadGenerator, rotated
from tabletune_pipelines.tuning.served_windows import (
    PolicySummary,
    Window,
    fixed_k_windows,
    measure_window,
    summarize,
    window_progress_line,
)

__all__ = ["EnvelopeAnswer", "compare_envelopes", "loss_table", "run_closed_loop", "same_k_reached"]


def run_closed_loop(server: Any, policies: Mapping[str, Sequence[Sequence[int]]], loads: Sequence[int], *,
                    vocab_size: int, max_num_seqs: int, max_k: int, rounds: int = 2, window_s: float = 4.0,
                    settle_s: float = 0.5, warmup_s: float = 3.0, prompt_tokens: int = 32,
                    output_tokens: tuple[int, int] = (32, 128), progress: Callable[[str], None] = print,
                    prompt: Callable[[random.Random], Any] | None = None, min_steps: int = 0) -> list[Window]:
    """Every policy at every load, ``rounds`` rounds in rotating order, in one launch; with ``min_steps``
    a window goes on until it holds that many steps (up to 4 × ``window_s``: ``counted_window``)."""
    names = list(policies)
    out: list[Window] = []
    for load in loads:
        gen = LoadGenerator(server, load, vocab_size, prompt_tokens, output_tokens, seed=load, prompt=prompt).start()
        try:
            time.sleep(warmup_s)
            for r in range(rounds):
                for name in rotated(names, r):
                    w = measure_window(server, name, policies[name], load=load, round_=r, window_s=window_s,
                                       settle_s=settle_s, max_num_seqs=max_num_seqs, max_k=max_k, min_steps=min_steps)
                    out.append(w)
                    progress(window_progress_line(w))
        finally:
            gen.stop()
        if gen.errors:
            progress(f"load {load}: {len(gen.errors)} client errors, first: {gen.errors[0]}")
    return out


def same_k_reached(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], *, load: int, max_num_seqs: int,
                   max_k: int, context: tuple[int, int]) -> bool:
    """Whether tables ``a`` and ``b`` (3- or 5-item entries) run the same k in every cell a closed loop
    of ``load`` clients reaches: every batch size 1..min(load, max_num_seqs) at every context length of
    ``context`` (inclusive tokens: the running requests' KV lengths, prompt to prompt plus the longest
    output). Such a pair is an A/A comparison there: its ratio measures noise, not the tables."""
    lo, hi = int(context[0]), int(context[1])
    if not 1 <= lo <= hi:
        raise InvalidValueError(f"context {list(context)} must be 1 <= lo <= hi tokens")
    tables = [DraftTable.from_entries([list(r) for r in t], allow_context=True) for t in (a, b)]
    edges = {lo} | {c0 for t in tables if t.axes.context is not None for c0, _ in t.axes.context if lo < c0 <= hi}
    n = max(1, min(int(load), int(max_num_seqs)))
    for ctx in sorted(edges):  # each table's k is constant between its bucket edges
        ka, kb = (t.dense(n, max_k) if t.axes.context is None else t.dense(n, max_k)[:, t.axes.context_column(ctx)]
                  for t in tables)
        if (ka != kb).any():
            return False
    return True


def loss_table(summary: Mapping[tuple[str, int], PolicySummary], fixed: Sequence[str], policies: Sequence[str],
               loads: Sequence[int]) -> dict[str, dict[int, float]]:
    """Loss(policy, load) = 1 - goodput / best fixed k at that load (docs/method.md, evaluation)."""
    out: dict[str, dict[int, float]] = {}
    for load in loads:
        best = max((summary[(f, load)].goodput for f in fixed if (f, load) in summary), default=float("nan"))
        for p in policies:
            if (p, load) in summary and best > 0:
                out.setdefault(p, {})[load] = 1.0 - summary[(p, load)].goodput / best
    return out


@dataclass(frozen=True)
class EnvelopeAnswer:
    """Whether raising the CUDA-graph capture ceiling beats lowering k at one load
    (``compare_envelopes``): the best fixed k in each envelope's launch, and the best over all
    against the best in the default envelope."""

    load: int
    default: str
    """The label of the default envelope."""
    best: Mapping[str, tuple[int, float, float, int]]
    """Envelope label -> (best fixed k, its goodput, s.e. across rounds, rounds) in that envelope's launch."""
    winner: str
    """The envelope whose best fixed k served most."""
    ratio: float
    """Goodput of the winner's best fixed k / the default envelope's best fixed k."""
    ratio_se: float
    """Its standard error, unpaired (two launches): the relative s.e.s added in quadrature."""
    anchor: tuple[int, float, float] | None
    """The default's best k measured in the winner's launch too: (k, its goodput there / in the
    default's launch, s.e.); launch-to-launch drift plus what the envelope did to that k."""

    @property
    def finding(self) -> bool:
        """The winner beats the default beyond the noise: ratio − t·s.e. > 1, t Student's quantile
        (``t_quantile``) at the fewer rounds of the two launches less one."""
        rounds = min(self.best[self.default][3], self.best[self.winner][3])
        return rounds >= 2 and self.ratio - t_quantile(rounds - 1) * self.ratio_se > 1.0

    def sentence(self) -> str:
        default = self.default
        ks = "; ".join(f"{e}: k = {k} at {g:.0f} ± {se:.0f} tok/s ({n} rounds)"
                       for e, (k, g, se, n) in self.best.items())
        if self.winner == default:
            return f"load {self.load}: keep {default} ({ks})"
        verdict = "raise the ceiling" if self.finding else "within the launch-to-launch noise: not a finding"
        extra = "" if self.anchor is None else (f"; k = {self.anchor[0]} in both launches: "
                                                f"{self.anchor[1]:.3f} ± {self.anchor[2]:.3f}")
        return (f"load {self.load}: {self.winner} / {default} = {self.ratio:.3f} ± {self.ratio_se:.3f} "
                f"(unpaired): {verdict} ({ks}{extra})")


def compare_envelopes(launches: Sequence[tuple[str, Mapping[str, Any]]], default: str) -> list[EnvelopeAnswer]:
    """Raise the ceiling or lower k (docs/method.md, "The graph envelope"): ``launches`` are
    ``(envelope label, judge document)`` pairs, one launch per envelope (``benchmarks/gpu_served.py
    judge``: ``policies`` and ``windows``), ``default`` the label of the default envelope. At every
    load all launches measured, the best fixed k of each (``summarize``: pooled goodput, s.e. across
    rounds), and the best of all against the default's. Two launches cannot be paired by round, so
    the ratio's s.e. is unpaired; launch-to-launch drift enters it only through ``anchor``."""
    labels = [label for label, _ in launches]
    if default not in labels:
        raise InvalidValueError(f"default envelope {default!r} is not one of the launches {labels}")
    per = {label: summarize(fixed_k_windows(doc)) for label, doc in launches}  # (fixed_k<k>, load) -> summary
    loads = sorted(set.intersection(*({load for _, load in p} for p in per.values())))
    out = []
    for load in loads:
        best = {}
        for label in labels:
            v = max((v for (_, at), v in per[label].items() if at == load), key=lambda v: v.goodput)
            best[label] = (int(v.policy.removeprefix("fixed_k")), v.goodput, v.stderr, v.rounds)
        winner = max(labels, key=lambda e: best[e][1])
        (_, g0, s0, _), (_, g1, s1, _) = best[default], best[winner]
        ratio = g1 / g0
        se = ratio * math.hypot(s0 / g0, s1 / g1)
        anchor = None
        k0 = best[default][0]
        there = per[winner].get((f"fixed_k{k0}", load))
        if winner != default and there is not None:
            a = there.goodput / g0
            anchor = (k0, a, a * math.hypot(s0 / g0, there.stderr / there.goodput))
        out.append(EnvelopeAnswer(load, default, best, winner, ratio, se, anchor))
    return out

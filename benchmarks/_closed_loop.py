"""Closed-loop goodput of several tables inside ONE launch (the evaluation protocol).

Launch-to-launch drift is larger than the differences between good tables (docs/engine-facts.md,
"Noise on 2 cores"), so every table policy is measured in the same server: the table is hot-swapped
between windows through the step scheduler's k control, the order of policies rotates from round
to round, and the kept tokens are counted on the engine side from the step log (one record per
``update_from_output``: a step keeps ``b + a`` tokens — every request its target token plus its
accepted drafts). Each window is checked against the step log: every step must have run the k the
window's table gives for that step's batch size (a check that can fail; a window that fails it is
reported and excluded).

Load: ``L`` client threads in a closed loop, each sending one request at a time with a prompt of
``prompt_tokens`` random token ids (or whatever ``prompt(rng)`` returns) and a ``max_tokens`` drawn
uniformly from ``output_tokens`` (so clients do not finish in lockstep), ``ignore_eos``.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tabletune_pipelines.core.table import expand_table


@dataclass
class Window:
    """One measured window: a policy at a load in a round."""

    policy: str
    load: int
    round: int
    kept_tokens: int
    seconds: float
    steps: int
    mean_batch: float
    mismatched_steps: int
    mismatch_examples: list = field(default_factory=list)
    """Up to five mismatched steps as [b, k run, k the table gives, new requests in the step]."""

    @property
    def goodput(self) -> float:
        return self.kept_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def table_verified(self) -> bool:
        # The first step after a swap may still run the previous lookup (async scheduling plans one
        # step ahead): allow one mismatch per window, nothing more.
        return self.steps > 0 and self.mismatched_steps <= 1


@dataclass
class LoadGenerator:
    """``load`` closed-loop clients against ``server`` until ``stop()``."""

    server: Any
    load: int
    vocab_size: int
    prompt_tokens: int = 32
    output_tokens: tuple[int, int] = (32, 128)
    seed: int = 0
    prompt: Callable[[random.Random], Any] | None = None
    """Makes each request's prompt from the client's generator; None = ``prompt_tokens`` random ids."""
    errors: list[str] = field(default_factory=list)
    completed: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.load)]

    def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 100_003 + i)
        while not self._stop.is_set():
            prompt = (self.prompt(rng) if self.prompt is not None
                      else [rng.randrange(3, self.vocab_size) for _ in range(self.prompt_tokens)])
            try:
                self.server.complete(prompt, max_tokens=rng.randint(*self.output_tokens), ignore_eos=True,
                                     timeout=600.0)
                with self._lock:
                    self.completed += 1
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                with self._lock:
                    self.errors.append(repr(exc)[:200])
                time.sleep(0.5)

    def start(self) -> "LoadGenerator":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: a rotation (A B C, B C A, ...) so slow drift hits every policy alike."""
    r %= max(1, len(names))
    return list(names[r:]) + list(names[:r])


def measure_window(server: Any, policy: str, table: Sequence[Sequence[int]], *, load: int, round_: int,
                   window_s: float, settle_s: float, max_num_seqs: int, max_k: int) -> Window:
    """Swap to ``table``, let it settle, then count kept tokens over ``window_s`` from the step log."""
    server.set_k(table=table)
    time.sleep(settle_s)
    lookup = expand_table(table, max_num_seqs, max_k)
    steps, w = counted_window(server, policy, load=load, round_=round_, window_s=window_s)
    bad = [[int(s["b"]), s.get("k"), want, int(s.get("new", 0))] for s in steps
           if int(s.get("k", -1)) != (want := min(max_k, lookup[min(int(s["b"]), max_num_seqs) - 1]))]
    w.mismatched_steps, w.mismatch_examples = len(bad), bad[:5]
    return w


def counted_window(server: Any, policy: str, *, load: int, round_: int, window_s: float) -> tuple[list[dict], Window]:
    """The step-log records of the next ``window_s`` seconds (steps that ran requests) and the window
    they make: kept tokens = Σ(b + a), seconds = Σ dt (no table check: ``mismatched_steps`` 0)."""
    offset = server.step_log_offset()
    t0 = time.monotonic()
    time.sleep(window_s)
    t1 = time.monotonic()
    steps = [s for s in server.read_steps(since=t0, until=t1, offset=offset) if s.get("b", 0) > 0]
    kept = sum(int(s["b"]) + int(s.get("a", 0)) for s in steps)
    seconds = sum(float(s["dt"] or 0.0) for s in steps) / 1000.0
    mean_b = statistics.fmean(int(s["b"]) for s in steps) if steps else 0.0
    return steps, Window(policy, load, round_, kept, seconds, len(steps), mean_b, 0)


def run_closed_loop(server: Any, policies: Mapping[str, Sequence[Sequence[int]]], loads: Sequence[int], *,
                    vocab_size: int, max_num_seqs: int, max_k: int, rounds: int = 2, window_s: float = 4.0,
                    settle_s: float = 0.5, warmup_s: float = 3.0, prompt_tokens: int = 32,
                    output_tokens: tuple[int, int] = (32, 128), progress: Callable[[str], None] = print,
                    ) -> list[Window]:
    """Every policy at every load, ``rounds`` rounds in rotating order, in one launch."""
    names = list(policies)
    out: list[Window] = []
    for load in loads:
        gen = LoadGenerator(server, load, vocab_size, prompt_tokens, output_tokens, seed=load).start()
        try:
            time.sleep(warmup_s)
            for r in range(rounds):
                for name in rotated(names, r):
                    w = measure_window(server, name, policies[name], load=load, round_=r, window_s=window_s,
                                       settle_s=settle_s, max_num_seqs=max_num_seqs, max_k=max_k)
                    out.append(w)
                    progress(f"load {load:>3} round {r} {name:<14} {w.goodput:9.1f} tok/s  mean B {w.mean_batch:5.1f}  "
                             f"steps {w.steps}{'' if w.table_verified else f'  TABLE MISMATCH {w.mismatched_steps} {w.mismatch_examples}'}")
        finally:
            gen.stop()
        if gen.errors:
            progress(f"load {load}: {len(gen.errors)} client errors, first: {gen.errors[0]}")
    return out


@dataclass(frozen=True)
class PolicySummary:
    """A policy at a load: pooled goodput over rounds and its standard error across rounds."""

    policy: str
    load: int
    goodput: float
    stderr: float
    rounds: int


def summarize(windows: Sequence[Window]) -> dict[tuple[str, int], PolicySummary]:
    """Pool verified windows per (policy, load)."""
    groups: dict[tuple[str, int], list[Window]] = {}
    for w in windows:
        if w.table_verified:
            groups.setdefault((w.policy, w.load), []).append(w)
    out = {}
    for key, ws in groups.items():
        g = sum(w.kept_tokens for w in ws) / sum(w.seconds for w in ws)
        vals = [w.goodput for w in ws]
        se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else float("nan")
        out[key] = PolicySummary(key[0], key[1], g, se, len(ws))
    return out


def paired_ratio(windows: Sequence[Window], a: str, b: str, load: int) -> tuple[float, float, int]:
    """Mean of per-round goodput ratios a/b at ``load`` (paired inside a round) and its standard error."""
    by_round: dict[int, dict[str, float]] = {}
    for w in windows:
        if w.load == load and w.table_verified and w.policy in (a, b):
            by_round.setdefault(w.round, {})[w.policy] = w.goodput
    ratios = [d[a] / d[b] for d in by_round.values() if a in d and b in d and d[b] > 0]
    if not ratios:
        return float("nan"), float("nan"), 0
    se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
    return statistics.fmean(ratios), se, len(ratios)


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

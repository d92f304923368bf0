"""Served goodput in one launch: the closed-loop load generator, the window measurement, the step-log
verification of each window, and the served verification of a candidate table before it is published.

The one copy of the closed-loop machinery (the benchmarks and ``tuning.served_verification``, the measuring
harness, import it from here). No Dagster, no vLLM
import: ``server`` is anything with ``set_k(table=...)``, ``step_log_offset()``, ``read_steps(...)``
and ``complete(...)``, i.e. ``engine.process.VLLMServer`` launched with TableTune's timing scheduler
(``engine/timing_scheduler.py``) and a launch table (runtime k switching).

**Protocol** (docs/evaluation.md, "Served verification"). Launch-to-launch drift is larger than the
differences between good tables, so every policy is measured in the same server: a policy's table
is hot-swapped between windows through the timing scheduler's k control, the order of the policies
rotates from round to round (so slow drift hits every policy alike), and kept tokens are counted on
the engine side from the step log (one record per ``update_from_output``; a step keeps ``b + a``
tokens, every request its target token plus its accepted drafts): goodput of a window =
Σ(b + a) / Σ dt over the steps that ran requests. Each window is checked against the step log:
every step must have run the k the window's table gives for that step's batch size (one step of
slack for the swap); a window that fails the check is reported and left out.

**Load**: ``L`` client threads in a closed loop, each sending one request at a time (``prompt(rng)``
or ``prompt_tokens`` random token ids) with ``max_tokens`` drawn uniformly from ``output_tokens``
(so clients do not finish in lockstep) and ``ignore_eos``.

**Verdict** (``judge_load``): at each load, the best fixed k is the fixed k with the highest mean
goodput; the candidate is paired with it round by round (ratio of the two windows of one round),
giving a mean ratio r and its standard error s over n rounds, and the interval ``r ± t(n-1)·s`` (t:
Student's one-sided 97.5% quantile, 12.71 / 4.30 / 3.18 / 2.78 for 2 / 3 / 4 / 5 rounds, 1.96 for
many). The loss the gate must detect is the tolerance (3% by default). A load **passes** when the
whole interval lies above ``1 - tolerance`` (the loss is smaller than the tolerance, with that
confidence), **fails** when the whole interval lies below it (a fixed k beats the table by more than
the tolerance), and is **inconclusive** otherwise, or with fewer than 2 paired rounds (no noise
estimate). Noise never passes a table: a wide interval is inconclusive, not a pass.

**Sequential rounds**: each load (largest first) runs rounds until its verdict is decided, its
``rounds`` (the most per load) are spent or its share of the budget is (what is left, split among
the loads still to measure); after 2 rounds the window-to-window spread of the paired ratio says
how many rounds a decision needs, and that figure is printed. Each load's stop reason is kept:
``decided``, ``rounds`` or ``budget``.

**Outcome** (``ServedVerification.verdict``): ``verified`` when every load passes; ``failed`` when
any load fails (publishing is refused and the previous table kept); ``unverified`` otherwise: the
table publishes with the check as a warning that carries its figures, and nothing calls it verified.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tabletune_pipelines.core.noise import units_to_detect
from tabletune_pipelines.core.served_calibration import ServedCalibration, ServedPoint
from tabletune_pipelines.core.stats import mean_se, t_quantile
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.options import Bound, check_bounds, options_from_mapping

logger = logging.getLogger("tabletune.served")

__all__ = [
    "DEFAULTS", "LoadGenerator", "LoadVerdict", "PolicyGoodput", "PolicySummary",
    "ServedVerification", "ServedVerificationOptions", "VerificationPlan", "Window",
    "counted_window", "default_loads", "first_warmup", "fixed_name",
    "judge", "judge_load", "mean_se", "measure_window", "paired_ratio", "plan_verification", "rotated",
    "summarize", "t_quantile", "table_mismatches", "verify_served", "window_progress_line",
]

CANDIDATE = "table"
"""The candidate's policy name in a verification."""


def fixed_name(k: int) -> str:
    """The policy name of fixed ``k`` in a verification (``k=2``)."""
    return f"k={int(k)}"


# ============================================================================ closed loop
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
    t_start: float = 0.0
    """time.monotonic() at the window's start, the step log's clock (0: not recorded)."""
    t_end: float = 0.0
    """time.monotonic() at the window's end: the steps of ``[t_start, t_end]`` in a kept step log are this window's."""

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
    """``load`` closed-loop clients against ``server`` until ``stop()`` (threads; each client sends
    one request at a time through ``server.complete``). The one closed-loop load generator: the
    served verification, the benchmarks and the engine tests' rig (``evaluation.rig.closed_loop``)
    all run this one. ``start()`` again after ``stop()`` restarts the clients (same seeds)."""

    server: Any
    load: int
    vocab_size: int
    prompt_tokens: int = 32
    output_tokens: tuple[int, int] = (32, 128)
    seed: int = 0
    prompt: Callable[[random.Random], Any] | None = None
    """Makes each request's prompt from the client's generator; None = ``prompt_tokens`` random ids."""
    first_seed: int | None = None
    """Client i's generator is seeded ``first_seed + i``; None: ``seed * 100_003 + i``."""
    ignore_eos: bool = True
    """False for a real model on real prompts: it stops where it would in service."""
    temperature: float | None = None
    """Sent with each request; None: the server's default."""
    one_choice: bool = False
    """Count a request completed only when its answer has exactly one choice (otherwise an error);
    False: every answer counts (a scripted stand-in server may answer nothing)."""
    request_timeout_s: float = 600.0
    """Per request, and per client on ``stop()``."""
    retry_pause_s: float = 0.5
    """A client pauses this long after a failed request."""
    error_chars: int = 200
    """Each failed request's exception is kept as its repr cut to this many characters."""
    errors: list[str] = field(default_factory=list)
    completed: int = 0
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 100_003 + i if self.first_seed is None else self.first_seed + i)
        while not self._stop.is_set():
            with self._lock:
                self.sent += 1
            try:
                prompt = (self.prompt(rng) if self.prompt is not None
                          else [rng.randrange(3, self.vocab_size) for _ in range(self.prompt_tokens)])
                kw = {} if self.temperature is None else {"temperature": self.temperature}
                out = self.server.complete(prompt, max_tokens=rng.randint(*self.output_tokens),
                                           ignore_eos=self.ignore_eos, timeout=self.request_timeout_s, **kw)
                ok = not self.one_choice or len(out.get("choices", [])) == 1
                with self._lock:
                    self.completed += int(ok)
                    if not ok:
                        self.errors.append(f"answer without a choice: {str(out)[:200]}")
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                with self._lock:
                    self.errors.append(repr(exc)[:self.error_chars])
                time.sleep(self.retry_pause_s)

    def start(self) -> "LoadGenerator":
        self._stop.clear()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.load)]
        for t in self._threads:
            t.start()
        return self

    def wait_completed(self, more: int, timeout: float = 180.0) -> int:
        """Block until ``more`` further requests completed (progress, not seconds: a machine 3x slower
        takes 3x longer); ``timeout`` only bounds a stalled engine. Returns the count reached."""
        target = self.completed + more
        deadline = time.monotonic() + timeout
        while self.completed < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.completed} of {target} requests completed after {timeout} s: the engine "
                                     f"stalled (errors: {self.errors[:3]})")
            time.sleep(0.1)
        return self.completed

    def stop(self, wait: bool = True) -> None:
        """Stop sending. ``wait``: until every client's request in flight has finished (so the next
        load starts from an empty engine); without, the clients end on their own (daemon threads)."""
        self._stop.set()
        if wait:
            for t in self._threads:
                t.join(timeout=self.request_timeout_s)

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rotated(names: Sequence[Any], r: int) -> list[Any]:
    """Round ``r``'s order: a balanced Latin square (Williams), so that slow drift hits every policy
    alike (each takes each position once per n rounds) and so does what a window carries over from
    the one before it: every policy follows every other equally often (once per n rounds for an
    even n; twice per 2n for an odd n, whose second n rounds run the first n backwards). A plain
    rotation (A B C, B C A, ...) puts the same predecessor before a policy in every round: on the
    H200 a k = 3 window served ~10 % less after a k = 1 window than after a k = 2 one, so a table
    that follows the docs' table in every round looked ~12 % worse than the identical fixed k
    (docs/engine-facts.md, "A window carries over")."""
    n = len(names)
    if n < 2:
        return list(names)
    seq, lo, hi = [0], 1, n - 1
    while len(seq) < n:  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
        seq.append(lo)
        lo += 1
        if len(seq) < n:
            seq.append(hi)
            hi -= 1
    period = n if n % 2 == 0 else 2 * n
    r %= period
    order = [names[(x + r) % n] for x in seq]
    return order[::-1] if r >= n else order


def counted_window(server: Any, policy: str, *, load: int, round_: int, window_s: float, min_steps: int = 0,
                   max_window_s: float | None = None) -> tuple[list[dict], Window]:
    """The step-log records of the next ``window_s`` seconds (steps that ran requests) and the window
    they make: kept tokens = Σ(b + a), seconds = Σ dt (no table check: ``mismatched_steps`` 0).
    With ``min_steps``, the window goes on until it holds that many steps (a slow engine gets a
    longer window, not a thinner one), up to ``max_window_s`` (default 4 × ``window_s``)."""
    offset = server.step_log_offset()
    t0 = time.monotonic()
    time.sleep(window_s)
    t1 = time.monotonic()
    steps = [s for s in server.read_steps(since=t0, until=t1, offset=offset) if s.get("b", 0) > 0]
    limit = t0 + (max_window_s if max_window_s is not None else 4.0 * window_s)
    while len(steps) < min_steps and t1 < limit:
        time.sleep(min(limit - t1, max(0.05, window_s * (min_steps - len(steps)) / max(1, min_steps))))
        t1 = time.monotonic()
        steps = [s for s in server.read_steps(since=t0, until=t1, offset=offset) if s.get("b", 0) > 0]
    kept = sum(int(s["b"]) + int(s.get("a", 0)) for s in steps)
    seconds = sum(float(s.get("dt") or 0.0) for s in steps) / 1000.0
    mean_b = statistics.fmean(int(s["b"]) for s in steps) if steps else 0.0
    return steps, Window(policy, load, round_, kept, seconds, len(steps), mean_b, 0, t_start=t0, t_end=t1)


def table_mismatches(steps: Sequence[Mapping[str, Any]], table: Sequence[Sequence[int]], max_num_seqs: int,
                     max_k: int) -> list[list[int]]:
    """The steps that did not run the k ``table`` gives for their batch size, as
    [b, k run, k the table gives, new requests in the step] (the step-log verification)."""
    lookup = DraftTable.from_entries([list(r) for r in table]).vllm_lookup(max_num_seqs, max_k)[1:]
    bad = []
    for s in steps:
        b = int(s["b"])
        want = min(max_k, lookup[min(b, max_num_seqs) - 1])
        if int(s.get("k", -1)) != want:
            bad.append([b, s.get("k"), want, int(s.get("new", 0))])
    return bad


@dataclass(frozen=True)
class StepMix:
    """What the served steps of a window carried (from the step log): the arrivals per step that the
    served pricing takes as Poisson (``core.stepcost``), and the steps above a capture ceiling."""

    steps: int
    arrivals_mean: float
    """Mean new requests scheduled per step."""
    arrivals_dispersion: float
    """Variance / mean of the arrivals per step: 1 for Poisson, below 1 for arrivals more regular than that."""
    over_ceiling: float
    """Fraction of steps whose scheduled tokens exceed the ceiling (runs without CUDA graphs)."""
    ms_over: float
    """Mean step interval (ms) of those steps; nan if none. With async scheduling (the GPU default) the
    step log puts much of a mixed step's cost on the step before it (docs/engine-facts.md, "Mixed steps
    on the H200"), so read this beside ``ms_under``, not as the crossing's cost."""
    ms_under: float
    """Mean step interval (ms) of the others; nan if none."""


def step_mix(steps: Sequence[Mapping[str, Any]], ceiling: int) -> StepMix:
    """``StepMix`` of step-log records (``engine/timing_scheduler.py``: ``new``, ``tok``, ``dt``)
    against a capture ceiling of ``ceiling`` tokens."""
    if ceiling < 1:
        raise InvalidValueError(f"step_mix: ceiling = {ceiling!r} must be >= 1 token")
    steps = [s for s in steps if s.get("b", 0) > 0]
    new = [int(s.get("new", 0)) for s in steps]
    mean = statistics.fmean(new) if new else float("nan")
    disp = statistics.pvariance(new) / mean if len(new) > 1 and mean > 0 else float("nan")
    over = [float(s["dt"]) for s in steps if s.get("dt") is not None and int(s.get("tok", 0)) > ceiling]
    under = [float(s["dt"]) for s in steps if s.get("dt") is not None and int(s.get("tok", 0)) <= ceiling]
    n_over = sum(1 for s in steps if int(s.get("tok", 0)) > ceiling)
    return StepMix(len(steps), mean, disp, n_over / len(steps) if steps else float("nan"),
                   statistics.fmean(over) if over else float("nan"), statistics.fmean(under) if under else float("nan"))


def measure_window(server: Any, policy: str, table: Sequence[Sequence[int]], *, load: int, round_: int,
                   window_s: float, settle_s: float, max_num_seqs: int, max_k: int, min_steps: int = 0) -> Window:
    """Swap to ``table``, let it settle, then count kept tokens over ``window_s`` (extended to
    ``min_steps`` steps, see ``counted_window``) from the step log and check every step against the table."""
    server.set_k(table=table)
    time.sleep(settle_s)
    steps, w = counted_window(server, policy, load=load, round_=round_, window_s=window_s, min_steps=min_steps)
    bad = table_mismatches(steps, table, max_num_seqs, max_k)
    w.mismatched_steps, w.mismatch_examples = len(bad), bad[:5]
    return w


def window_progress_line(w: Window) -> str:
    """One measured window as the progress line the verification and the harness print."""
    return (f"load {w.load:>3} round {w.round} {w.policy:<14} {w.goodput:9.1f} tok/s  mean B {w.mean_batch:5.1f}  "
            f"steps {w.steps}" + ("" if w.table_verified
                                  else f"  TABLE MISMATCH {w.mismatched_steps} {w.mismatch_examples}"))


@dataclass(frozen=True)
class PolicySummary:
    """A policy at a load: pooled goodput over rounds and its standard error across rounds."""

    policy: str
    load: int
    goodput: float
    stderr: float
    rounds: int


def summarize(windows: Sequence[Window]) -> dict[tuple[str, int], PolicySummary]:
    """Pool verified windows per (policy, load): Σ kept / Σ seconds, s.e. of the window goodputs."""
    groups: dict[tuple[str, int], list[Window]] = {}
    for w in windows:
        if w.table_verified:
            groups.setdefault((w.policy, w.load), []).append(w)
    out = {}
    for key, ws in groups.items():
        g = sum(w.kept_tokens for w in ws) / sum(w.seconds for w in ws)
        _, se = mean_se(w.goodput for w in ws)
        out[key] = PolicySummary(key[0], key[1], g, se, len(ws))
    return out


def fixed_k_of(table: Sequence[Sequence[int]]) -> int | None:
    """The k of a table that runs one k at every batch size it covers from 1 (None otherwise)."""
    ks = {int(r[2]) for r in table}
    return ks.pop() if len(ks) == 1 and table and int(table[0][0]) == 1 else None


def served_points(windows: Sequence[Window], policies: Mapping[str, Sequence[Sequence[int]]],
                  min_rounds: int = 2, launch: Callable[[Window], str] | None = None) -> list[ServedPoint]:
    """The wall time per step that serving measured for each fixed-k policy at each load: the mean
    over verified windows of ``1000·seconds / steps`` (every step counted, stalls included), its s.e.
    across rounds, and the windows' mean batch. Input to ``core.served_calibration.ServedCalibration``.
    ``launch`` names the launch a window came from (pooling several): a round is (launch, round)."""
    groups: dict[tuple[int, int], list[tuple[str, Window]]] = {}
    for w in windows:
        k = fixed_k_of(policies.get(w.policy, ()))
        if k is not None and w.table_verified and w.seconds > 0:
            groups.setdefault((k, w.load), []).append((f"{launch(w) if launch else ''}r{w.round}", w))
    out = []
    for (k, load), ws in sorted(groups.items()):
        if len(ws) < min_rounds:
            continue
        per = {}
        for key, w in ws:  # two windows of one k in one round (a duplicate policy) count as one
            per.setdefault(key, []).append(1000.0 * w.seconds / w.steps)
        vals = [statistics.fmean(v) for v in per.values()]
        if len(vals) < min_rounds:
            continue
        ms, se = mean_se(vals)
        out.append(ServedPoint(k=k, batch=max(1.0, statistics.fmean(w.mean_batch for _, w in ws)), ms=ms, se_ms=se,
                               rounds=len(vals), load=load,
                               per_round=tuple((key, statistics.fmean(v)) for key, v in sorted(per.items()))))
    return out


def fixed_k_windows(doc: Mapping[str, Any]) -> list[Window]:
    """The windows of a judge document (``policies`` and ``windows``: ``benchmarks/gpu_served.py
    judge``) whose policy runs one k everywhere, named ``fixed_k<k>`` whatever the document called
    the policy (a copy such as ``control_k3`` is the same policy)."""
    out = []
    for w in doc["windows"]:
        k = fixed_k_of(doc["policies"][w["policy"]])
        if k is not None:
            out.append(dataclasses.replace(Window(**w), policy=f"fixed_k{k}"))
    return out


def calibration_from_judges(judges: Sequence[tuple[str, Mapping[str, Any]]]) -> ServedCalibration:
    """One ``ServedCalibration`` from judged launches, ``(name, document)`` each with the document's
    ``policies`` and ``windows`` (``benchmarks/gpu_served.py judge``): the fixed-k windows of every
    launch (``fixed_k_windows``), pooled per k and load, a round being (launch, round)
    (launch-to-launch drift then counts as round-to-round spread only within a launch)."""
    windows: list[Window] = []
    fixed: dict[str, Sequence[Sequence[int]]] = {}
    launch: dict[int, str] = {}
    for n, (_, doc) in enumerate(judges):
        for table in doc["policies"].values():
            k = fixed_k_of(table)
            if k is not None:
                fixed[f"fixed_k{k}"] = table
        for w in fixed_k_windows(doc):
            windows.append(w)
            launch[id(w)] = f"L{n}"
    points = served_points(windows, fixed, launch=lambda w: launch[id(w)])
    return ServedCalibration(points=tuple(points), source="served wall time per step of fixed k, closed loop: "
                             + ", ".join(name for name, _ in judges))


def _by_round(windows: Sequence[Window], load: int) -> dict[str, dict[int, float]]:
    """policy -> round -> goodput of the verified windows at ``load``."""
    out: dict[str, dict[int, float]] = {}
    for w in windows:
        if w.load == load and w.table_verified and w.seconds > 0:
            out.setdefault(w.policy, {})[w.round] = w.goodput
    return out


def _ratios(a: Mapping[int, float], b: Mapping[int, float]) -> list[float]:
    return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r] > 0]


def paired_ratio(windows: Sequence[Window], a: str, b: str, load: int) -> tuple[float, float, int]:
    """Mean of per-round goodput ratios a/b at ``load`` (paired inside a round) and its standard error."""
    by = _by_round(windows, load)
    ratios = _ratios(by.get(a, {}), by.get(b, {}))
    m, se = mean_se(ratios)
    return m, se, len(ratios)


# ============================================================================ the verdict (pure)
Status = Literal["pass", "fail", "inconclusive"]
ServedVerdict = Literal["verified", "unverified", "failed"]
"""A verification's outcome (``ServedVerification.verdict``)."""
StopReason = Literal["decided", "rounds", "budget"]
"""Why a load's rounds stopped."""


@dataclass(frozen=True)
class PolicyGoodput:
    """One policy at one load: mean goodput over its verified windows (one per round) and its s.e."""

    policy: str
    load: int
    goodput: float
    """Mean of the windows' goodputs (tokens kept / s); NaN when no window verified."""
    stderr: float
    """Standard error of that mean across rounds (NaN with fewer than 2 windows)."""
    rounds: int
    """Verified windows behind it."""


@dataclass(frozen=True)
class LoadVerdict:
    """The candidate against the best fixed k at one load (``judge_load``)."""

    load: int
    status: Status
    reason: str
    """One sentence with the figures."""
    best_fixed: str | None = None
    """The fixed-k policy with the highest mean goodput (``k=2``); None when none was measured."""
    ratio: float | None = None
    """Mean over rounds of candidate / best fixed k, paired by round."""
    ratio_se: float | None = None
    """Standard error of ``ratio`` (None with fewer than 2 paired rounds)."""
    rounds: int = 0
    """Paired rounds."""
    t: float | None = None
    """The Student-t quantile used (None with fewer than 2 paired rounds)."""
    candidate_is: str | None = None
    """The fixed-k policy the candidate equals over this load's batch sizes (``load_batch_sizes``): its
    windows are that policy's, and it is judged against the best *other* fixed k (an A/A pair is no
    evidence)."""
    references: tuple["ReferenceRatio", ...] = ()
    """The candidate against each reference table (e.g. the docs' table) at this load; not gating."""

    @property
    def loss(self) -> float | None:
        """1 - ratio: how much less the candidate served than the best fixed k."""
        return None if self.ratio is None else 1.0 - self.ratio

    @property
    def best_fixed_k(self) -> int | None:
        return None if self.best_fixed is None else int(self.best_fixed.split("=", 1)[1])


@dataclass(frozen=True)
class ReferenceRatio:
    """The candidate against one reference table at one load, paired by round."""

    name: str
    ratio: float | None
    """Mean over rounds of candidate / reference (None: no paired round, or A/A)."""
    ratio_se: float | None
    rounds: int
    same_as: str | None = None
    """``candidate`` when the reference gives the candidate's k at every batch size of the load (A/A:
    not measured), or the fixed-k policy whose windows stand for it."""

    def line(self) -> str:
        if self.same_as == CANDIDATE:
            return f"vs {self.name}: A/A (the same k at this load's batch sizes; not measured)"
        if self.ratio is None:
            return f"vs {self.name}: no paired round"
        se = "" if self.ratio_se is None or not math.isfinite(self.ratio_se) else f" ± {self.ratio_se:.3f}"
        via = f", {self.name} is {self.same_as} here" if self.same_as else ""
        return f"vs {self.name}: {self.ratio:.3f}{se} ({self.rounds} paired rounds{via})"


def judge_load(load: int, candidate: Mapping[int, float], fixed: Mapping[str, Mapping[int, float]], *,
               tolerance: float) -> LoadVerdict:
    """The rule of the module docstring at one load. ``candidate``: round -> goodput of the candidate's
    verified windows; ``fixed``: fixed-k policy name -> round -> goodput."""
    means = {name: statistics.fmean(v.values()) for name, v in fixed.items() if v}
    if not means or not candidate:
        what = "any fixed k" if not means else "the candidate"
        return LoadVerdict(load, "inconclusive", f"load {load}: no verified window of {what}", None)
    best = max(means, key=lambda n: (means[n], n))
    ratios = _ratios(candidate, fixed[best])
    if not ratios:
        return LoadVerdict(load, "inconclusive", f"load {load}: no round measured both the candidate and {best}",
                           best)
    r, se = mean_se(ratios)
    n = len(ratios)
    if n < 2:
        return LoadVerdict(load, "inconclusive", f"load {load}: candidate / best fixed {best} = {r:.3f} from one "
                                                 "paired round: no noise estimate", best, r, None, n)
    t = t_quantile(n - 1)
    lower, upper = r - t * se, r + t * se
    floor = 1.0 - tolerance
    figures = (f"candidate / best fixed {best} = {r:.3f} ± {se:.3f} (paired over {n} rounds; loss "
               f"{1.0 - r:+.1%}, interval [{lower:.3f}, {upper:.3f}] with t = {t:.2f})")
    if lower >= floor:
        return LoadVerdict(load, "pass", f"load {load}: {figures}; the loss is below the tolerance "
                                         f"{tolerance:.1%} (the interval lies above {floor:.3f})", best, r, se, n, t)
    if upper < floor:
        return LoadVerdict(load, "fail", f"load {load}: {figures}; the loss exceeds the tolerance {tolerance:.1%} "
                                         f"beyond the paired noise (the interval lies below {floor:.3f})",
                           best, r, se, n, t)
    return LoadVerdict(load, "inconclusive", f"load {load}: {figures}; undecided: the interval straddles "
                                             f"{floor:.3f}", best, r, se, n, t)


def rounds_to_decide(ratios_sd: float, ratio: float, tolerance: float, *, t: float = 1.96) -> int | None:
    """Paired rounds a decision needs at this spread: the n at which ``t·sd/sqrt(n)`` is smaller than
    the distance between the mean ratio and ``1 - tolerance`` (None when the mean sits on it)."""
    return units_to_detect(ratios_sd, ratio - (1.0 - tolerance), z_alpha=t)


def judge(windows: Sequence[Window], loads: Sequence[int], fixed: Sequence[str], *, candidate: str = CANDIDATE,
          tolerance: float, same: Mapping[int, str | None] | None = None,
          references: Mapping[int, Mapping[str, str | None]] | None = None
          ) -> tuple[list[PolicyGoodput], list[LoadVerdict]]:
    """Per load: every policy's mean goodput ± s.e. and the candidate's verdict (``judge_load``).
    ``same``: per load, the fixed-k policy the candidate equals there (its windows are the candidate's,
    and the candidate is judged against the best other fixed k). ``references``: per load, reference
    name -> ``candidate`` (A/A), a fixed-k policy that stands for it, or None (measured as itself)."""
    goodput, verdicts = [], []
    same = same or {}
    for load in loads:
        by = _by_round(windows, load)
        here = same.get(load)
        cand = by.get(here, {}) if here else by.get(candidate, {})
        refs = dict((references or {}).get(load, {}))
        names = [candidate, *[f for f in fixed if f != candidate], *[r for r, via in refs.items() if via is None]]
        for name in names:
            vals = list((cand if name == candidate else by.get(name, {})).values())
            m, se = mean_se(vals)
            if vals or name in (candidate, *fixed):
                goodput.append(PolicyGoodput(name, load, m, se, len(vals)))
        v = judge_load(load, cand, {f: by.get(f, {}) for f in fixed if f != here}, tolerance=tolerance)
        if here:
            v = dataclasses.replace(v, candidate_is=here, reason=v.reason + f" (the table is {here} at this load: "
                                    f"judged against the other fixed k)")
        ratios = []
        for name, via in refs.items():
            if via == CANDIDATE:
                ratios.append(ReferenceRatio(name, None, None, 0, CANDIDATE))
                continue
            rs = _ratios(cand, by.get(via or name, {}))
            m, se = mean_se(rs)
            ratios.append(ReferenceRatio(name, m if rs else None, se if len(rs) > 1 else None, len(rs), via))
        verdicts.append(dataclasses.replace(v, references=tuple(ratios)))
    return goodput, verdicts


# ============================================================================ options and budget
Device = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class _Defaults:
    budget_s: float
    rounds: int
    window_s: float
    settle_s: float
    warmup_s: float
    min_steps: int
    first_warmup_s: float


DEFAULTS: dict[str, _Defaults] = {
    # CPU build (2 cores, tiny models): steps of a few ms, so 1.5 s windows hold hundreds of steps.
    "cpu": _Defaults(budget_s=90.0, rounds=8, window_s=1.5, settle_s=0.4, warmup_s=1.5, min_steps=20,
                     first_warmup_s=1.5),
    # GPU (H200): 3 s windows gave 20-50% round-to-round spreads at loads 64-128, so longer ones. The
    # MoE compiles kernels for new batch shapes in its first ~30 s at high load: after a 5 s warm-up
    # the first three windows of a launch at load 128 served 0.56-0.76 of the same policies'
    # later rounds (the H200 MoE, 2026-12-04).
    "gpu": _Defaults(budget_s=300.0, rounds=8, window_s=5.0, settle_s=1.0, warmup_s=5.0, min_steps=100,
                     first_warmup_s=30.0),
}
"""Per device: the time budget of the measurement (the launch and the first warm-up not included) and
the plan it starts from."""

PLANNED_ROUNDS = 3
"""Windows are sized so that this many rounds of every load fit the budget; more rounds run while the
budget lasts and the verdict is open (up to ``rounds``)."""
SWAP_OVERHEAD_S = 0.2
"""What a table swap costs beyond settle + window (the k-control acknowledgement), for planning."""
MIN_WINDOW_S = 1.0

FixedKChoice = Literal["all", "plausible"]
"""Which fixed k a load serves (``ServedVerificationOptions.fixed_k``): every k 0..K, or the k the
profile cannot rule out there (``plausible_fixed_ks``)."""


AcceptanceSource = Literal["auto", "real", "prior"]
"""Where served verification's acceptance comes from (``ServedVerificationOptions.acceptance``):
drafts verified for real, synthetic acceptance at the prior's rates, or ``auto`` (chosen by the
deployment's weights)."""


@dataclass(frozen=True)
class ServedVerificationOptions:
    """How a table is verified by served goodput before it is published (EngineResource
    ``served_verification``; docs/evaluation.md, "Served verification"). None = the device default
    (``DEFAULTS``)."""

    enabled: bool = True
    """Off: the check passes as NOT MEASURED and the table publishes on the predicted figures alone."""
    budget_s: float | None = None
    """Seconds the measurement may take once the server is up (the launch and ``first_warmup_s`` are not
    counted)."""
    loads: tuple[int, ...] | None = None
    """Closed-loop concurrencies; None = 1, max_num_seqs/2, max_num_seqs."""
    rounds: int | None = None
    """The most rotating rounds per load: a load stops earlier once its verdict is decided (fewer also
    when 1 s windows do not fit the budget)."""
    window_s: float | None = None
    """Seconds counted per window (shorter when the budget is tight, not under 1 s)."""
    settle_s: float | None = None
    """Seconds after a table swap before counting."""
    warmup_s: float | None = None
    """Seconds of load before the first window of each load."""
    first_warmup_s: float | None = None
    """Seconds of load at the launch's first (largest) load before anything is counted, spent in equal
    parts on every policy's table, so that each k's step shapes have run before its first window (a
    cold engine compiles kernels for new shapes; the first window must not pay for them). Not charged
    to ``budget_s``, like the launch."""
    min_steps: int | None = None
    """A window goes on until it holds this many steps (up to 4 × window_s): a slow engine gets longer
    windows, not thinner ones."""
    tolerance: float = 0.03
    """The loss the gate must detect: a load passes when its loss vs the best fixed k is below this with
    confidence, and fails when it is above this with confidence."""
    output_tokens: tuple[int, int] = (32, 128)
    """max_tokens of each request, uniform in this range."""
    acceptance: AcceptanceSource = "auto"
    """``real``: the launch verifies drafts for real on the workload's prompts; ``prior``: synthetic
    acceptance at the table's prior rates (needed with dummy weights); ``auto``: ``prior`` when the
    deployment loads dummy weights, else ``real``."""
    startup_timeout: float | None = None
    """Server start-up timeout of the verification launch; None = the ServerConfig's."""
    fixed_k: FixedKChoice = "all"
    """``all``: every k 0..K at every load (each fixed k's windows then feed the served calibration);
    ``plausible``: each load serves only the fixed k the profile cannot rule out there
    (``plausible_fixed_ks``: the table's k at the load's batch sizes, the k within noise of it, and
    their neighbours), fewer windows where time is short (a GPU call)."""
    compare_docs_table: bool = True
    """Also compare the table with vLLM docs' example table at each load (paired ratio, not gating;
    measured only where no served policy runs the same k)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {  # every number of these options (``options.Bound``)
        "budget_s": Bound(0.0, 86_400.0, low_open=True, optional=True, why="seconds once the server is up; at most a day"),
        "loads": Bound(1, 4096, integer=True, optional=True, why="concurrent requests; 4096 is the largest max_num_seqs a fleet has"),
        "rounds": Bound(1, 1000, integer=True, optional=True, why="rounds per load"),
        "window_s": Bound(0.0, 3600.0, low_open=True, optional=True, why="seconds per window; at most an hour"),
        "settle_s": Bound(0.0, 3600.0, optional=True, why="seconds after a table swap; at most an hour"),
        "warmup_s": Bound(0.0, 3600.0, optional=True, why="seconds of load before a load's first window"),
        "first_warmup_s": Bound(0.0, 3600.0, optional=True, why="seconds of load before the first window"),
        "min_steps": Bound(0, 10_000_000, integer=True, optional=True, why="steps per window"),
        "tolerance": Bound(0.0, 1.0, high_open=True, why="a fraction of goodput"),
        "output_tokens": Bound(1, 1_000_000, integer=True, why="max_tokens of a request"),
        "startup_timeout": Bound(1.0, 3600.0, optional=True, why="seconds a launch may take to become healthy"),
    }
    """The range of every number (``check_bounds``: NaN, infinity and a bool are refused by name)."""

    def __post_init__(self) -> None:
        for name in ("loads", "output_tokens"):  # a JSON/YAML list is a tuple here
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        if self.loads is not None and (not isinstance(self.loads, tuple) or not self.loads):
            raise InvalidValueError(f"served verification loads = {self.loads!r:.80} must be a non-empty list of loads")
        if not isinstance(self.output_tokens, tuple) or len(self.output_tokens) != 2:
            raise InvalidValueError(f"served verification output_tokens = {self.output_tokens!r:.80} must be [lo, hi]")
        check_bounds(self, where="served verification", error=InvalidValueError)
        lo, hi = self.output_tokens
        if not lo <= hi:
            raise InvalidValueError(f"served verification output_tokens = {self.output_tokens!r} must be 1 <= lo <= hi")
        if self.acceptance not in ("auto", "real", "prior"):
            raise InvalidValueError(f"served verification acceptance = {self.acceptance!r}: auto, real or prior")
        if self.fixed_k not in ("all", "plausible"):
            raise InvalidValueError(f"served verification fixed_k = {self.fixed_k!r:.80}: all or plausible")
        for name in ("compare_docs_table",):
            if not isinstance(getattr(self, name), bool):
                raise InvalidValueError(f"served verification {name} = {getattr(self, name)!r:.80} must be true or false")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "served verification options"
                     ) -> "ServedVerificationOptions":
        """Options from a dict (a Dagster resource config; ``options.options_from_mapping``); an unknown
        key is named with ``where``."""
        return options_from_mapping(cls, data, where=where, error=InvalidValueError)


def default_loads(max_num_seqs: int) -> tuple[int, ...]:
    """1, max_num_seqs / 2 and max_num_seqs (fewer when they coincide)."""
    return tuple(sorted({1, max(1, max_num_seqs // 2), max_num_seqs}))


@dataclass(frozen=True)
class VerificationPlan:
    """What will be measured, fitted into the budget (``plan_verification``)."""

    loads: tuple[int, ...]
    rounds: int
    window_s: float
    settle_s: float
    warmup_s: float
    budget_s: float
    estimated_s: float
    """Predicted measuring time of this plan."""
    note: str = ""
    """What the budget changed ('' when nothing)."""
    first_warmup_s: float = 0.0
    """Load on every policy in turn before the first load's windows, outside the budget."""


def _estimate(n_loads: int, n_policies: int, rounds: int, window_s: float, settle_s: float, warmup_s: float) -> float:
    return n_loads * (warmup_s + rounds * n_policies * (window_s + settle_s + SWAP_OVERHEAD_S))


def plan_verification(n_policies: int, loads: Sequence[int], *, budget_s: float, rounds: int, window_s: float,
                      settle_s: float, warmup_s: float) -> VerificationPlan:
    """Fit the plan into ``budget_s``: the most rounds (up to ``rounds``) whose windows, shortened to
    fit, are still at least ``MIN_WINDOW_S`` long (more rounds buy a smaller t quantile, which matters
    more than window length). What cannot fit even with one round of 1 s windows is measured until the
    budget is spent (largest load first)."""
    loads = tuple(loads)
    n = len(loads)
    want = (rounds, window_s)
    est = _estimate(n, n_policies, rounds, window_s, settle_s, warmup_s)
    if est > budget_s:
        for r in range(rounds, 0, -1):
            fit = (budget_s / n - warmup_s) / (r * n_policies) - settle_s - SWAP_OVERHEAD_S
            w = min(want[1], math.floor(fit * 10 + 1e-9) / 10)
            rounds, window_s = r, max(MIN_WINDOW_S, w)
            if w >= MIN_WINDOW_S:
                break
        est = _estimate(n, n_policies, rounds, window_s, settle_s, warmup_s)
    note = ""
    if (rounds, window_s) != want:
        note = (f"budget {budget_s:.0f} s: {rounds} round(s) of {window_s:g} s windows instead of {want[0]} of "
                f"{want[1]:g} s")
    if est > budget_s:
        note += ("; " if note else "") + (f"even that needs ~{est:.0f} s: measuring until the budget is spent "
                                          "(largest load first)")
    return VerificationPlan(loads, rounds, window_s, settle_s, warmup_s, budget_s, est, note)


# ============================================================================ sizing from the profile
RATIO_SD_PRIOR: dict[str, float] = {"cpu": 0.2, "gpu": 0.07}
"""Per-round standard deviation of the paired ratio candidate / fixed k at the device's default
window, before a launch has measured its own: the CPU build on 2 cores gave 0.03-0.35 at loads 1-16
with 1.5 s windows (median about 0.2; 2026-12-03..06), the H200 0.045-0.23 at loads 32-128 with 5 s
windows (2026-12-03/04). A window w times longer is taken to scale it by 1/sqrt(w)."""
STEP_MARGIN = 1.5
"""Served steps are slower than the profile's decode steps (prefill joins them): a window is sized
for this many times the profile's slowest decode step at the load."""
BUDGET_CAP = 2.0
"""The sized budget is at most this many times the device's default budget."""


@dataclass(frozen=True)
class LoadNeed:
    """What a load's verdict needs, predicted from the profile before anything is served."""

    load: int
    predicted_ratio: float | None
    """The profile's goodput of the table over the best fixed k it is judged against at this load's
    batch sizes (None: no fixed k to judge against)."""
    rounds: int | None
    """Paired rounds a verdict needs at the expected spread (None: more than the most allowed, or the
    predicted ratio sits on the ``1 - tolerance`` line)."""


@dataclass(frozen=True)
class VerificationSizing:
    """Windows, rounds and budget sized from the profile's step times and the loss to detect
    (``size_verification``)."""

    window_s: float
    rounds: int
    budget_s: float
    ratio_sd: float
    """The per-round spread of the paired ratio expected at ``window_s``."""
    needs: tuple[LoadNeed, ...]

    @property
    def unreachable(self) -> list[LoadNeed]:
        """Loads where no verdict is expected within the most rounds."""
        return [n for n in self.needs if n.predicted_ratio is not None and n.rounds is None]

    def lines(self, tolerance: float, most: int) -> list[str]:
        """What the sizing expects, one line per load where no verdict is expected."""
        return [f"load {n.load}: the profile predicts table / best fixed k = {n.predicted_ratio:.3f}, "
                f"{abs(n.predicted_ratio - (1 - tolerance)):.3f} from the {1 - tolerance:.2f} line; at a per-round "
                f"spread of {self.ratio_sd:.2f} a verdict needs more than {most} rounds: none is expected"
                for n in self.unreachable]


def _load_goodput(step_ms: Mapping[str, Mapping[str, float]], taus: Sequence[float], table: Sequence[Sequence[int]],
                  load: int, max_num_seqs: int, max_k: int) -> float:
    """Mean over the load's batch sizes of B·tau(k) / T(B, k) with ``table``'s k (the profile's decode steps)."""
    ks = k_over_load(table, load, max_num_seqs, max_k)
    bs = load_batch_sizes(min(load, max_num_seqs))
    return statistics.fmean(b * taus[k] / float(step_ms[str(k)][str(b)]) for b, k in zip(bs, ks))


def size_verification(step_ms: Mapping[str, Mapping[str, float]], rates: Sequence[float],
                      per_load: Mapping[int, "LoadPolicies"], *, max_k: int, max_num_seqs: int, device: str,
                      tolerance: float, most_rounds: int, min_steps: int | None = None) -> VerificationSizing:
    """Windows long enough for ``min_steps`` of the slowest served k's steps at each load (the profile's
    decode step times, ``STEP_MARGIN`` for prefill), the rounds each load's verdict needs to tell the
    profile's predicted ratio from ``1 - tolerance`` at the expected per-round spread
    (``RATIO_SD_PRIOR``, scaled to the window), and the budget those rounds take (at most
    ``BUDGET_CAP`` times the device default). A load whose verdict needs more than ``most_rounds`` gets
    two rounds (its measured spread may be smaller than expected) and is named (``unreachable``)."""
    from tabletune_pipelines.core.goodput import tau_curve

    d = DEFAULTS.get(device, DEFAULTS["gpu"])
    steps = d.min_steps if min_steps is None else min_steps
    taus = tau_curve(rates)
    slowest = max(float(step_ms[str(k)][str(min(ld, max_num_seqs))])
                  for ld, lp in per_load.items() for k in range(max_k + 1) if str(k) in step_ms)
    window = max(d.window_s, math.ceil(steps * STEP_MARGIN * slowest / 100.0) / 10.0)
    sd = RATIO_SD_PRIOR.get(device, RATIO_SD_PRIOR["gpu"]) * math.sqrt(d.window_s / window)
    needs = []
    for load, lp in sorted(per_load.items()):
        cand = _load_goodput(step_ms, taus, lp.policies.get(CANDIDATE, lp.policies.get(lp.same or "", [])),
                             load, max_num_seqs, max_k) if (CANDIDATE in lp.policies or lp.same) else None
        others = [_load_goodput(step_ms, taus, lp.policies[f], load, max_num_seqs, max_k)
                  for f in lp.fixed if f != lp.same]
        if cand is None or not others:
            needs.append(LoadNeed(load, None, None))
            continue
        ratio = cand / max(others)
        n = next((r for r in range(2, most_rounds + 1)
                  if t_quantile(r - 1) * sd / math.sqrt(r) < abs(ratio - (1.0 - tolerance))), None)
        needs.append(LoadNeed(load, ratio, n))
    rounds = max([PLANNED_ROUNDS] + [n.rounds for n in needs if n.rounds is not None])
    per_window = window + d.settle_s + SWAP_OVERHEAD_S
    # verify_served splits what is left equally among the loads still to measure: every load's share
    # must hold the neediest load's rounds
    neediest = max(d.warmup_s + min(n.rounds or 2, most_rounds) * len(per_load[n.load].policies) * per_window
                   for n in needs)
    budget = min(max(len(needs) * neediest, d.budget_s), BUDGET_CAP * d.budget_s)
    return VerificationSizing(window_s=window, rounds=min(rounds, most_rounds), budget_s=math.ceil(budget),
                              ratio_sd=sd, needs=tuple(needs))


# ============================================================================ the result
@dataclass(frozen=True)
class ServedVerification:
    """A candidate table against every fixed k at a few loads, in one launch (``verify_served``)."""

    candidate: tuple[tuple[int, int, int], ...]
    max_k: int
    max_num_seqs: int
    plan: VerificationPlan
    goodput: tuple[PolicyGoodput, ...]
    verdicts: tuple[LoadVerdict, ...]
    tolerance: float
    elapsed_s: float
    """Measuring time (the launch and the first warm-up not included)."""
    budget_cut: bool
    """True when the budget ran out before every planned window was measured."""
    candidate_is: str | None = None
    """The fixed-k policy the candidate equals (its windows are that policy's), or None."""
    windows: tuple[Window, ...] = ()
    client_errors: int = 0
    first_client_error: str = ""
    device: str = ""
    acceptance: str = ""
    """How drafts were accepted in the launch (``real`` or ``prior [rates]``)."""
    launch_s: float | None = None
    """Seconds the verification launch took to become healthy (set by the caller that launched it)."""
    stop_reasons: tuple[tuple[int, str], ...] = ()
    """(load, why its rounds stopped): ``decided``, ``rounds`` (the most per load) or ``budget``; a load
    the budget never reached is not listed."""
    expected_open: tuple[str, ...] = ()
    """Loads where the sizing expected no verdict within the most rounds, one line each (``size_verification``)."""

    @property
    def passed(self) -> bool:
        """No load failed: the table may be published (``verdict`` says whether it was verified)."""
        return not any(v.status == "fail" for v in self.verdicts)

    @property
    def verdict(self) -> ServedVerdict:
        """``verified``: every load passed; ``failed``: a load failed; ``unverified``: neither."""
        if not self.passed:
            return "failed"
        return "verified" if self.verdicts and all(v.status == "pass" for v in self.verdicts) else "unverified"

    @property
    def failed_loads(self) -> list[int]:
        return [v.load for v in self.verdicts if v.status == "fail"]

    @property
    def inconclusive_loads(self) -> list[int]:
        return [v.load for v in self.verdicts if v.status == "inconclusive"]

    @property
    def excluded_windows(self) -> int:
        """Windows left out because the step log showed another table than the window's."""
        return sum(1 for w in self.windows if not w.table_verified)

    @property
    def worst_loss(self) -> float | None:
        losses = [v.loss for v in self.verdicts if v.loss is not None]
        return max(losses) if losses else None

    @property
    def rule(self) -> str:
        return (f"at every load, candidate / best fixed k paired by round, interval ratio ± t·s.e. (t: Student "
                f"one-sided 97.5%, n - 1 dof): pass above 1 - {self.tolerance:g}, fail below it, else "
                "inconclusive (also with < 2 paired rounds); rounds go on until decided")

    def summary(self) -> str:
        """One paragraph: verdict, the figures per load, what the budget did."""
        head = {"verified": f"served goodput verified: the table's loss against the best fixed k is below "
                            f"{self.tolerance:.0%} at every checked load",
                "unverified": f"served goodput UNVERIFIED: no load failed, but load(s) {self.inconclusive_loads} "
                              f"reached no verdict (the table publishes with this warning)",
                "failed": f"served goodput NOT verified: a fixed k serves more than the table by over "
                          f"{self.tolerance:.0%} at load(s) {self.failed_loads}"}[self.verdict]
        parts = [head, *[v.reason + "".join(f"; {r.line()}" for r in v.references) for v in self.verdicts]]
        if self.stop_reasons:
            parts.append("rounds stopped: " + ", ".join(f"load {ld} {why}" for ld, why in self.stop_reasons))
        if self.budget_cut:
            parts.append(f"the budget ({self.plan.budget_s:.0f} s) cut the measurement short")
        parts += [f"expected before measuring: {line}" for line in self.expected_open]
        if self.plan.note:
            parts.append(self.plan.note)
        if self.excluded_windows:
            parts.append(f"{self.excluded_windows} window(s) left out by the step-log check")
        if self.client_errors:
            parts.append(f"{self.client_errors} client error(s), first: {self.first_client_error}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The published file's ``served_verification`` section (plain JSON; undefined figures are null)."""

        def num(x: float | None, nd: int = 4) -> float | None:
            return None if x is None or not math.isfinite(x) else round(float(x), nd)

        per_load = []
        for v in self.verdicts:
            per_load.append({
                "load": v.load, "status": v.status, "best_fixed_k": v.best_fixed_k, "ratio": num(v.ratio),
                "ratio_se": num(v.ratio_se), "rounds": v.rounds, "t": num(v.t, 3), "candidate_is": v.candidate_is,
                "references": {r.name: {"ratio": num(r.ratio), "ratio_se": num(r.ratio_se), "rounds": r.rounds,
                                        "same_as": r.same_as} for r in v.references},
                "goodput": {g.policy: [num(g.goodput, 2), num(g.stderr, 2), g.rounds]
                            for g in self.goodput if g.load == v.load},
            })
        stops = dict(self.stop_reasons)
        for row in per_load:
            if row["load"] in stops:
                row["stop"] = stops[row["load"]]
        return {
            "passed": self.passed, "verdict": self.verdict, "rule": self.rule, "tolerance": self.tolerance,
            "candidate": [list(r) for r in self.candidate], "candidate_is": self.candidate_is,
            "loads": sorted(self.plan.loads), "rounds": self.plan.rounds, "window_s": self.plan.window_s,
            "budget_s": self.plan.budget_s, "elapsed_s": round(self.elapsed_s, 1), "budget_cut": self.budget_cut,
            "launch_s": num(self.launch_s, 1), "device": self.device or None, "acceptance": self.acceptance or None,
            "excluded_windows": self.excluded_windows, "client_errors": self.client_errors, "per_load": per_load,
            **({"no_verdict_expected": list(self.expected_open)} if self.expected_open else {}),
        }


# ============================================================================ verification
def first_warmup(server: Any, tables: Sequence[Sequence[Sequence[int]]], seconds: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Run the load already flowing on each of ``tables`` in turn for an equal share of ``seconds``
    (the launch's first warm-up: every policy's step shapes before anything is counted)."""
    share = seconds / max(1, len(tables))
    for table in tables:
        server.set_k(table=table)
        sleep(share)


def load_batch_sizes(load: int) -> range:
    """The batch sizes a closed loop of ``load`` requests runs at, for telling policies apart: from
    ``load - load // 4`` to ``load`` (between an answer and the next request's prefill a client is
    out of the batch: mean B 121 at load 128 on the H100, 2026-12-05)."""
    return range(max(1, load - load // 4), load + 1)


def k_over_load(table: Sequence[Sequence[int]], load: int, max_num_seqs: int, max_k: int) -> tuple[int, ...]:
    """The k ``table`` runs at each of ``load_batch_sizes(load)``."""
    lookup = DraftTable.from_entries([list(r) for r in table]).vllm_lookup(max_num_seqs, max_k)[1:]
    return tuple(lookup[b - 1] for b in load_batch_sizes(min(load, max_num_seqs)))


def plausible_fixed_ks(candidate: Sequence[Sequence[int]], load: int, *, max_k: int, max_num_seqs: int,
                       within_noise: Mapping[int, Sequence[int]] | None = None) -> tuple[int, ...]:
    """The fixed k worth serving at ``load``: the k the candidate runs at the load's batch sizes, the k
    the profile found within noise of them there (``within_noise``: batch size -> k, the table's
    evidence), and each of those k's neighbours (goodput is unimodal in k, so the runner-up to the
    best k is a neighbour). The rest lose beyond the profile's noise and are not served."""
    ks = set(k_over_load(candidate, load, max_num_seqs, max_k))
    for b in load_batch_sizes(min(load, max_num_seqs)):
        ks |= {int(k) for k in (within_noise or {}).get(b, ())}
    ks |= {k + d for k in ks for d in (-1, 1)}
    return tuple(sorted(k for k in ks if 0 <= k <= max_k))


@dataclass(frozen=True)
class LoadPolicies:
    """What one load serves and how its policies stand for each other (``load_policies``)."""

    load: int
    policies: dict[str, list[list[int]]]
    """Served here, by name: the candidate (unless it equals a fixed k here), the fixed k, and the
    references no served policy stands for."""
    fixed: tuple[str, ...]
    """The fixed-k policies served here."""
    same: str | None
    """The fixed-k policy the candidate equals at this load's batch sizes (it is not served itself)."""
    references: dict[str, str | None]
    """Reference name -> ``CANDIDATE`` (A/A), the fixed-k policy that stands for it, or None (served)."""


def load_policies(candidate: Sequence[Sequence[int]], load: int, *, max_k: int, max_num_seqs: int,
                  fixed_ks: Sequence[int], references: Mapping[str, Sequence[Sequence[int]]] | None = None
                  ) -> LoadPolicies:
    """The policies of one load: a pair that runs the same k at every batch size of the load
    (``load_batch_sizes``) is one policy, measured once (an A/A pair is no evidence)."""
    M, K = max_num_seqs, max_k
    fixed = {fixed_name(k): [[1, M, int(k)]] for k in sorted(set(fixed_ks))}
    ks = k_over_load(candidate, load, M, K)
    same = next((n for n, t in fixed.items() if k_over_load(t, load, M, K) == ks), None)
    policies = dict(fixed) if same else {CANDIDATE: [list(map(int, r)) for r in candidate], **fixed}
    refs: dict[str, str | None] = {}
    for name, table in (references or {}).items():
        rk = k_over_load(table, load, M, K)
        if rk == ks:
            refs[name] = CANDIDATE
            continue
        refs[name] = next((n for n, t in fixed.items() if k_over_load(t, load, M, K) == rk), None)
        if refs[name] is None:
            policies[name] = [list(map(int, r)) for r in table]
    return LoadPolicies(load, policies, tuple(fixed), same, refs)


def verify_served(server: Any, candidate_table: Sequence[Sequence[int]], *, K: int, max_num_seqs: int,
                  loads: Sequence[int] | None = None, rounds: int | None = None, window_s: float | None = None,
                  budget_s: float | None = None, settle_s: float | None = None, warmup_s: float | None = None,
                  first_warmup_s: float | None = None, min_steps: int | None = None, tolerance: float = 0.03,
                  device: str | None = None, vocab_size: int = 2048,
                  prompt: Callable[[random.Random], Any] | None = None, output_tokens: tuple[int, int] = (32, 128),
                  acceptance: str = "", progress: Callable[[str], None] | None = None,
                  fixed_k: FixedKChoice = "all", within_noise: Mapping[int, Sequence[int]] | None = None,
                  references: Mapping[str, Sequence[Sequence[int]]] | None = None,
                  profile_steps: tuple[Mapping[str, Mapping[str, float]], Sequence[float]] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> ServedVerification:
    """Run ``candidate_table`` against the fixed k at ``loads`` inside one launch (``server``), in
    rotating rounds until each load's verdict is decided, and judge it (module docstring). ``fixed_k``:
    every k 0..K at every load, or the ``plausible_fixed_ks`` of each load (``within_noise``: the
    table's evidence). ``references``: tables the candidate is compared with at each load (paired
    ratios, not gating), served only where no served policy runs the same k. ``profile_steps``: the
    table's decode step times ``{k: {B: ms}}`` measured in this launch's profile and the acceptance
    rates; with them the windows, rounds and budget not given are sized by ``size_verification`` (the
    loss to detect is ``tolerance``), and the loads where no verdict is expected are named up front.
    Other ``None`` options take the device's ``DEFAULTS`` (``device``: ``server.device`` when not given). Loads are measured
    largest first, each with its share of the budget left, so a budget that runs out leaves the
    smallest loads inconclusive."""
    say = progress or logger.info
    device = device or getattr(server, "device", None) or "cpu"
    d = DEFAULTS.get(device, DEFAULTS["gpu"])
    loads = tuple(sorted({min(int(x), max_num_seqs) for x in (loads or default_loads(max_num_seqs))}, reverse=True))
    per_load = {}
    for load in loads:
        ks = (range(K + 1) if fixed_k == "all" else
              plausible_fixed_ks(candidate_table, load, max_k=K, max_num_seqs=max_num_seqs, within_noise=within_noise))
        per_load[load] = load_policies(candidate_table, load, max_k=K, max_num_seqs=max_num_seqs, fixed_ks=ks,
                                       references=references)
    every = {n: t for lp in per_load.values() for n, t in lp.policies.items()}
    lookup = DraftTable.from_entries([list(r) for r in candidate_table]).vllm_lookup(max_num_seqs, K)[1:]
    same = fixed_name(lookup[0]) if len(set(lookup)) == 1 else None
    most = rounds or d.rounds
    sizing = None
    if profile_steps is not None:
        sizing = size_verification(profile_steps[0], profile_steps[1], per_load, max_k=K, max_num_seqs=max_num_seqs,
                                   device=device, tolerance=tolerance, most_rounds=most, min_steps=min_steps)
        budget_s, window_s = budget_s or sizing.budget_s, window_s or sizing.window_s
        say(f"[served] sized from the profile's step times and the {tolerance:.0%} loss to detect: "
            f"{window_s:g} s windows, a {budget_s:.0f} s budget, up to {sizing.rounds} planned rounds per load "
            f"(expected per-round spread {sizing.ratio_sd:.2f}; "
            + ", ".join(f"load {n.load}: " + ("no fixed k to judge against" if n.predicted_ratio is None else
                                              f"predicted {n.predicted_ratio:.3f}, "
                                              + (f"~{n.rounds} rounds" if n.rounds else "no verdict expected"))
                        for n in sizing.needs) + ")")
    planned = min(most, sizing.rounds if sizing is not None else PLANNED_ROUNDS)
    plan = plan_verification(max(len(lp.policies) for lp in per_load.values()), loads, budget_s=budget_s or d.budget_s,
                             rounds=planned, window_s=window_s or d.window_s,
                             settle_s=d.settle_s if settle_s is None else settle_s,
                             warmup_s=d.warmup_s if warmup_s is None else warmup_s)
    if sizing is not None and (budget_s, window_s) == (sizing.budget_s, sizing.window_s):
        # sized per load: the windows stay as sized; a load stops when decided or its share is spent
        plan = dataclasses.replace(plan, window_s=sizing.window_s, budget_s=sizing.budget_s,
                                   estimated_s=sizing.budget_s, note="")
    plan = dataclasses.replace(plan, rounds=most,
                               first_warmup_s=d.first_warmup_s if first_warmup_s is None else first_warmup_s)
    say(f"served verification of {[list(r) for r in candidate_table]}"
        + (f" (= fixed {same})" if same else "") + f" at loads {list(plan.loads)}: "
        f"up to {plan.rounds} rounds (until decided) of {plan.window_s:g} s windows, "
        f"~{plan.estimated_s:.0f} s for {planned} rounds "
        f"of a {plan.budget_s:.0f} s budget" + (f" ({plan.note})" if plan.note else "")
        + (f", after a {plan.first_warmup_s:g} s warm-up on every policy in turn" if plan.first_warmup_s else ""))
    for load, lp in per_load.items():
        skipped = sorted(set(range(K + 1)) - {int(f.split("=")[1]) for f in lp.fixed})
        say(f"[served] load {load} serves {list(lp.policies)}"
            + (f"; the table is {lp.same} at B = {load_batch_sizes(load).start}..{load}, judged against the other "
               f"fixed k" if lp.same else "")
            + (f"; fixed k = {skipped} lose beyond the profile's noise here, not served" if skipped else "")
            + "".join(f"; {r} is " + ("the table here (A/A, not measured)" if via == CANDIDATE else f"{via} here")
                      for r, via in lp.references.items() if via is not None))
    t0 = clock()
    fixed = [fixed_name(k) for k in range(K + 1)]
    windows: list[Window] = []
    errors: list[str] = []
    stops: list[tuple[int, str]] = []
    min_steps = d.min_steps if min_steps is None else min_steps
    per_window = plan.window_s + plan.settle_s + SWAP_OVERHEAD_S
    spent: list[float] = []  # wall seconds per window so far (swaps and extended windows included)
    for li, load in enumerate(plan.loads):
        lp = per_load[load]
        names = list(lp.policies)
        left = plan.budget_s - (clock() - t0)
        if left < plan.warmup_s + len(names) * per_window:
            break
        share = left / (len(plan.loads) - li)  # what is left, split among the loads still to measure
        t_load = clock()
        gen = LoadGenerator(server, load, vocab_size, output_tokens=output_tokens, seed=load, prompt=prompt).start()
        last = li == len(plan.loads) - 1
        why: StopReason = "rounds"
        try:
            if li == 0 and plan.first_warmup_s > 0:  # every k's shapes once, off the budget's clock
                tw = clock()
                first_warmup(server, list(every.values()), plan.first_warmup_s)
                t0 += clock() - tw
                t_load += clock() - tw
            time.sleep(plan.warmup_s)
            for r in range(plan.rounds):
                round_s = len(names) * max(per_window, statistics.fmean(spent) if spent else 0.0)
                if clock() - t_load + round_s > share:
                    why = "budget"
                    break
                for name in rotated(names, r + li):
                    tw = clock()
                    w = measure_window(server, name, lp.policies[name], load=load, round_=r, window_s=plan.window_s,
                                       settle_s=plan.settle_s, max_num_seqs=max_num_seqs, max_k=K,
                                       min_steps=min_steps)
                    spent.append(clock() - tw)
                    windows.append(w)
                    say(f"[served] {clock() - t0:5.0f}/{plan.budget_s:.0f} s  " + window_progress_line(w))
                if r >= 1 and _progress(windows, lp, fixed, tolerance, say).status != "inconclusive":
                    why = "decided"
                    break
        finally:
            gen.stop(wait=not (why == "budget" or last))  # the next load starts from an empty engine
        stops.append((load, why))
        say(f"[served] load {load}: rounds stopped ({why})")
        errors += gen.errors
        if gen.errors:
            say(f"[served] load {load}: {len(gen.errors)} client errors, first: {gen.errors[0]}")
    cut = len(stops) < len(plan.loads) or any(why == "budget" for _, why in stops)
    elapsed = clock() - t0
    goodput, verdicts = judge(windows, sorted(plan.loads), fixed, tolerance=tolerance,
                              same={ld: lp.same for ld, lp in per_load.items()},
                              references={ld: lp.references for ld, lp in per_load.items()})
    result = ServedVerification(
        candidate=tuple(tuple(int(x) for x in r) for r in candidate_table), max_k=K, max_num_seqs=max_num_seqs,
        plan=plan, goodput=tuple(goodput), verdicts=tuple(verdicts), tolerance=tolerance, elapsed_s=elapsed,
        budget_cut=cut, candidate_is=same, windows=tuple(windows), client_errors=len(errors),
        first_client_error=errors[0] if errors else "", device=device, acceptance=acceptance,
        stop_reasons=tuple(stops), expected_open=tuple(sizing.lines(tolerance, most)) if sizing else ())
    say(f"[served] {elapsed:.0f} s: {result.summary()}")
    return result


def _progress(windows: Sequence[Window], lp: LoadPolicies, fixed: Sequence[str], tolerance: float,
              say: Callable[[str], None]) -> LoadVerdict:
    """The load's verdict so far, printed with the rounds a decision needs at the spread measured."""
    _, (v,) = judge(windows, [lp.load], fixed, tolerance=tolerance, same={lp.load: lp.same})
    need = ""
    if v.status == "inconclusive" and v.ratio_se is not None and v.rounds >= 2:
        n = rounds_to_decide(v.ratio_se * math.sqrt(v.rounds), v.ratio, tolerance)
        need = f"; at this spread a verdict needs ~{n} rounds" if n is not None else "; the ratio sits on the line"
    say(f"[served] load {lp.load} after {v.rounds} round(s): {v.status}: {v.reason.split(': ', 1)[-1]}{need}")
    return v

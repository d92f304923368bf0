"""What one served window counted: the policy names of a verification, the window (``Window``), its
measurement from the step log (``measure_window``: a span of time under a running load;
``measure_requests_window``: a fixed set of requests; ``counted_window``), the step-log check that
every step ran the window's table (``table_mismatches``), what the steps carried (``step_mix``), and
what windows add up to: per-policy goodput (``summarize``), the paired ratio of two policies
(``policy_ratio``) and the served wall time per step of each fixed k (``served_points``,
``calibration_from_judges``).

Kept tokens are counted on the engine side from the step log (one record per
``update_from_output``; a step keeps ``b + a`` tokens, every request its target token plus its
accepted drafts): goodput of a window = Σ(b + a) / Σ dt over the steps that ran requests. Each
window is checked against the step log: every step must have run the k the window's table gives for
that step's batch size (and, under a (batch size x context) table, the step's context column), with
one step of slack for the swap; a window that fails the check is reported and left out. No Dagster,
no vLLM import: ``server`` is anything with ``set_k(table=...)``, ``step_log_offset()`` and
``read_steps(...)`` (``engine.process.VLLMServer`` launched with TableTune's
timing scheduler, ``engine/timing_scheduler.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabletune_pipelines.core.served_calibration import ServedCalibration, ServedPoint
from tabletune_pipelines.core.stats import mean_se, paired_ratio
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError

__all__ = [
    "CANDIDATE", "PolicySummary", "StepMix", "Window", "by_round", "calibration_from_judges", "counted_window",
    "fixed_k_of", "fixed_k_windows", "fixed_name", "measure_requests_window", "measure_window", "policy_ratio",
    "served_points", "step_mix",
    "summarize", "table_mismatches", "window_progress_line",
]

CANDIDATE = "table"
"""The candidate's policy name in a verification."""


def fixed_name(k: int) -> str:
    """The policy name of fixed ``k`` in a verification (``k=2``)."""
    return f"k={int(k)}"


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
    """Up to five mismatched steps as [b, k run, k the table gives, new requests in the step] (and the
    step's context length under a (batch size x context) table: ``table_mismatches``)."""
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
    return steps, _window(steps, policy, load, round_, t0, t1)


def _window(steps: Sequence[Mapping[str, Any]], policy: str, load: int, round_: int, t0: float, t1: float) -> Window:
    """The window the step-log records ``steps`` (of ``[t0, t1]``) make: kept tokens = Σ(b + a),
    seconds = Σ dt (no table check: ``mismatched_steps`` 0)."""
    kept = sum(int(s["b"]) + int(s.get("a", 0)) for s in steps)
    seconds = sum(float(s.get("dt") or 0.0) for s in steps) / 1000.0
    mean_b = statistics.fmean(int(s["b"]) for s in steps) if steps else 0.0
    return Window(policy, load, round_, kept, seconds, len(steps), mean_b, 0, t_start=t0, t_end=t1)


def table_mismatches(steps: Sequence[Mapping[str, Any]], table: Sequence[Sequence[int]], max_num_seqs: int,
                     max_k: int) -> list[list[int | None]]:
    """The steps that did not run the k ``table`` gives for their batch size, as
    [b, k run, k the table gives, new requests in the step] (the step-log verification). A table of
    5-item entries gives the k of the cell of the step's batch size and context column: the column
    of the context length the timing scheduler picked it at (the record's ``x``), appended to the
    step's entry; a step without ``x`` did not run under the table's columns (its k given: None)."""
    grid = DraftTable.from_entries([list(r) for r in table], allow_context=True)
    dense = grid.dense(max_num_seqs, max_k)
    bad = []
    for s in steps:
        b = int(s["b"])
        row = min(b, max_num_seqs) - 1
        if grid.axes.context is None:
            want: int | None = int(dense[row])
            extra: list[int | None] = []
        else:
            x = s.get("x")
            want = None if x is None else int(dense[row, grid.axes.context_column(int(x))])
            extra = [x]
        if want is None or int(s.get("k", -1)) != want:
            bad.append([b, s.get("k"), want, int(s.get("new", 0)), *extra])
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


def measure_requests_window(server: Any, policy: str, table: Sequence[Sequence[int]], load_generator: Any, *,
                            load: int, round_: int, requests: int, settle_s: float, max_num_seqs: int,
                            max_k: int) -> Window:
    """A window of fixed work: swap to ``table`` on an idle engine, let it settle, then serve round
    ``round_``'s requests (``LoadGenerator.serve_requests``: each of ``load`` clients its first
    ``requests`` of the round's sequence) until every one is answered, and count that span's steps
    from the step log as ``counted_window`` does, checking every step against the table. Every
    policy of a round serves the same requests, so its goodput differs from theirs only by how long
    the same work took; the span includes the drain at its end (the batch falls from ``load`` to 1
    as clients finish), whose mean batch the window records."""
    server.set_k(table=table)
    time.sleep(settle_s)
    offset = server.step_log_offset()
    t0 = time.monotonic()
    load_generator.serve_requests(round_, requests)
    t1 = time.monotonic()
    steps = [s for s in server.read_steps(since=t0, until=t1, offset=offset) if s.get("b", 0) > 0]
    w = _window(steps, policy, load, round_, t0, t1)
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
    """The k of a table that runs one k at every batch size (and context) it covers from 1 (None otherwise)."""
    ks = {int(r[-1]) for r in table}
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
        per: dict[str, list[float]] = {}
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


def by_round(windows: Sequence[Window], load: int) -> dict[str, dict[int, float]]:
    """policy -> round -> goodput of the verified windows at ``load``."""
    out: dict[str, dict[int, float]] = {}
    for w in windows:
        if w.load == load and w.table_verified and w.seconds > 0:
            out.setdefault(w.policy, {})[w.round] = w.goodput
    return out


def policy_ratio(windows: Sequence[Window], a: str, b: str, load: int) -> tuple[float, float, int]:
    """Policy ``a`` over policy ``b`` at ``load``: the mean of per-round goodput ratios a/b (paired
    inside a round; ``core.stats.paired_ratio``), its standard error and the paired rounds."""
    by = by_round(windows, load)
    return paired_ratio(by.get(a, {}), by.get(b, {}))

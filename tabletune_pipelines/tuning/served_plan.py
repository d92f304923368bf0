"""What a served verification measures, before anything is served: its options
(``ServedVerificationOptions``) and device defaults (``DEFAULTS``), the loads, the policies each load
serves (``load_policies``: the fixed k, the candidate unless it equals one, the references), the plan
fitted into the budget (``plan_verification``), and the windows, rounds and budget sized from the
profile's step times (``size_verification``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tabletune_pipelines.core.stats import t_quantile
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.options import Bound, check_bounds, options_from_mapping
from tabletune_pipelines.tuning.served_windows import CANDIDATE, fixed_name
from tabletune_pipelines.vocab import WINDOW_KINDS, WindowKind

__all__ = [
    "BUDGET_CAP", "DEFAULTS", "MIN_WINDOW_S", "PLANNED_ROUNDS", "RATIO_SD_PRIOR", "RATIO_SD_PRIOR_REQUESTS",
    "STEP_MARGIN", "SWAP_OVERHEAD_S",
    "AcceptanceSource", "Device", "FixedKChoice", "WindowKind", "LoadNeed", "LoadPolicies", "ServedVerificationOptions",
    "VerificationPlan", "VerificationSizing", "default_loads", "k_over_load", "load_batch_sizes", "load_policies",
    "plan_verification", "plausible_fixed_ks", "size_verification",
]


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
    window: WindowKind = "time"
    requests_per_client: int = 2


DEFAULTS: dict[str, _Defaults] = {
    # CPU build (2 cores, tiny models): steps of a few ms, so 1.5 s windows hold hundreds of steps.
    # Windows of fixed work: on the embedded default at load 8 (real prompts) the paired ratio's
    # per-round spread was 0.043 with 2 requests a client (7.9 s windows) and 0.052 with 3 (11.7 s),
    # against 0.186 with 5 s windows of a running loop (benchmarks/served_windows.py, 2026-12-07).
    "cpu": _Defaults(budget_s=120.0, rounds=8, window_s=1.5, settle_s=0.4, warmup_s=1.5, min_steps=20,
                     first_warmup_s=1.5, window="requests", requests_per_client=2),
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
    window: WindowKind | None = None
    """``requests``: every policy of a round serves the same requests (each client its first
    ``requests_per_client`` of the round's sequence, from an idle engine, until all are answered), so
    two policies differ only in how long the same work took; ``time``: ``window_s`` seconds of a
    closed loop that runs across windows. None = the device default (``requests`` on the CPU build,
    ``time`` on a GPU)."""
    requests_per_client: int | None = None
    """Requests each client sends in a ``requests`` window; None = the device default (2)."""
    window_s: float | None = None
    """Seconds counted per ``time`` window (shorter when the budget is tight, not under 1 s)."""
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
        "budget_s": Bound(0.0, 86_400.0, low_open=True, optional=True,
                          why="seconds once the server is up; at most a day"),
        "loads": Bound(1, 4096, integer=True, optional=True,
                       why="concurrent requests; 4096 is the largest max_num_seqs a fleet has"),
        "rounds": Bound(1, 1000, integer=True, optional=True, why="rounds per load"),
        "window_s": Bound(0.0, 3600.0, low_open=True, optional=True, why="seconds per window; at most an hour"),
        "requests_per_client": Bound(1, 10_000, integer=True, optional=True,
                                     why="requests each client sends in a window"),
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
        if self.window is not None and self.window not in WINDOW_KINDS:
            raise InvalidValueError(f"served verification window = {self.window!r:.80}: one of {list(WINDOW_KINDS)}")
        if self.fixed_k not in ("all", "plausible"):
            raise InvalidValueError(f"served verification fixed_k = {self.fixed_k!r:.80}: all or plausible")
        for name in ("compare_docs_table",):
            if not isinstance(getattr(self, name), bool):
                raise InvalidValueError(
                    f"served verification {name} = {getattr(self, name)!r:.80} must be true or false")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "served verification options"
                     ) -> ServedVerificationOptions:
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


# ============================================================================ the policies of a load
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


# ============================================================================ sizing from the profile
RATIO_SD_PRIOR: dict[str, float] = {"cpu": 0.2, "gpu": 0.07}
"""Per-round standard deviation of the paired ratio candidate / fixed k at the device's default
window, before a launch has measured its own: the CPU build on 2 cores gave 0.03-0.35 at loads 1-16
with 1.5 s windows (median about 0.2; 2026-12-03..06), the H200 0.045-0.23 at loads 32-128 with 5 s
windows (2026-12-03/04). A window w times longer is taken to scale it by 1/sqrt(w)."""
RATIO_SD_PRIOR_REQUESTS: dict[str, float] = {"cpu": 0.05, "gpu": 0.07}
"""The same for windows of fixed work (``window = "requests"``), not scaled by their length: on the
CPU build at load 8 on real prompts, 6 rounds each (2026-12-07, benchmarks/served_windows.py), 0.043
with 2 requests a client and 0.052 with 3. Not measured on a GPU: the time windows' figure stands in."""
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
    """Seconds a window counts (windows of fixed work: what one is expected to take at the largest load)."""
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
                for n in self.unreachable if n.predicted_ratio is not None]


def _load_goodput(step_ms: Mapping[str, Mapping[str, float]], taus: Sequence[float], table: Sequence[Sequence[int]],
                  load: int, max_num_seqs: int, max_k: int) -> float:
    """Mean over the load's batch sizes of B·tau(k) / T(B, k) with ``table``'s k (the profile's decode steps)."""
    ks = k_over_load(table, load, max_num_seqs, max_k)
    bs = load_batch_sizes(min(load, max_num_seqs))
    return statistics.fmean(b * taus[k] / float(step_ms[str(k)][str(b)]) for b, k in zip(bs, ks, strict=True))


def size_verification(step_ms: Mapping[str, Mapping[str, float]], rates: Sequence[float],
                      per_load: Mapping[int, LoadPolicies], *, max_k: int, max_num_seqs: int, device: str,
                      tolerance: float, most_rounds: int, min_steps: int | None = None, window: WindowKind = "time",
                      requests: int = 2, output_tokens: tuple[int, int] = (32, 128)) -> VerificationSizing:
    """Windows long enough for ``min_steps`` of the slowest served k's steps at each load (the profile's
    decode step times, ``STEP_MARGIN`` for prefill), the rounds each load's verdict needs to tell the
    profile's predicted ratio from ``1 - tolerance`` at the expected per-round spread
    (``RATIO_SD_PRIOR``, scaled to the window), and the budget those rounds take (at most
    ``BUDGET_CAP`` times the device default). A load whose verdict needs more than ``most_rounds`` gets
    two rounds (its measured spread may be smaller than expected) and is named (``unreachable``).
    Windows of fixed work (``window = "requests"``) last as long as ``requests`` requests of the mean
    of ``output_tokens`` take each client at the slowest served k of the largest load (its decode
    steps times ``STEP_MARGIN``, tau(k) tokens a step); their spread is ``RATIO_SD_PRIOR_REQUESTS``."""
    from tabletune_pipelines.core.goodput import tau_curve

    d = DEFAULTS.get(device, DEFAULTS["gpu"])
    steps = d.min_steps if min_steps is None else min_steps
    taus = [float(t) for t in tau_curve(rates)]
    slowest = max(float(step_ms[str(k)][str(min(ld, max_num_seqs))])
                  for ld, lp in per_load.items() for k in range(max_k + 1) if str(k) in step_ms)
    if window == "requests":
        top = max(per_load)
        per_token = max(float(step_ms[str(k)][str(min(top, max_num_seqs))]) / taus[k]
                        for k in range(max_k + 1) if str(k) in step_ms)
        window_s = math.ceil(requests * statistics.fmean(output_tokens) * per_token * STEP_MARGIN / 100.0) / 10.0
        sd = RATIO_SD_PRIOR_REQUESTS.get(device, RATIO_SD_PRIOR_REQUESTS["gpu"])
    else:
        window_s = max(d.window_s, math.ceil(steps * STEP_MARGIN * slowest / 100.0) / 10.0)
        sd = RATIO_SD_PRIOR.get(device, RATIO_SD_PRIOR["gpu"]) * math.sqrt(d.window_s / window_s)
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
    per_window = window_s + d.settle_s + SWAP_OVERHEAD_S
    # verify_on_server splits what is left equally among the loads still to measure: every load's share
    # must hold the neediest load's rounds
    neediest = max(d.warmup_s + min(n.rounds or 2, most_rounds) * len(per_load[n.load].policies) * per_window
                   for n in needs)
    budget = min(max(len(needs) * neediest, d.budget_s), BUDGET_CAP * d.budget_s)
    return VerificationSizing(window_s=window_s, rounds=min(rounds, most_rounds), budget_s=math.ceil(budget),
                              ratio_sd=sd, needs=tuple(needs))

"""The controller's settings: every parameter of the online method, with its default.

Stdlib only. A deployment overrides any of them in the fleet file (``controller:`` mapping), the
pipeline copies that mapping into the published file (``"controller": {...}``), and the
controller reads it from there at start-up and on every newly published version. Unknown keys,
wrong types, booleans where numbers belong, NaN and values outside their range (``BOUNDS``: every
numeric setting has a lower and an upper bound that mean something) are refused with a message
that names the key and the value (docs/controller.md, "Settings"). This is the one validation of
these settings: the fleet loader, the publish gate (``published.parse_published``) and the
controller all go through ``ControllerSettings.from_mapping``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from tabletune_pipelines.errors import SettingsError
from tabletune_pipelines.options import options_from_mapping
from tabletune_pipelines.vocab import CONTROLLER_MODES, ControllerMode

ControllerPolicy = Literal["tabletune", "turbospec", "nightjar"]
"""Who chooses k per step inside the engine: ``tabletune`` (the table of the published file,
rebuilt online in ``control`` mode), ``turbospec`` (the TurboSpec-style baseline: a linear
step-time model of the published profile and a live per-token acceptance rate) or ``nightjar``
(the Nightjar-style baseline: a UCB1 bandit per batch size). Both baselines are
``evaluation/baselines.py``; they exist to be compared with (docs/evaluation.md, "Baselines"), not
to serve production, and run only under ``evaluation.scheduler.EvaluationScheduler`` (the
production plugin observes them)."""

CONTROLLER_POLICIES: tuple[str, ...] = get_args(ControllerPolicy)

#: The env var naming the published file inside the serving process (the plugin's one setting).
PUBLISHED_ENV = "TABLETUNE_PUBLISHED_TABLE"


@dataclass(frozen=True)
class Bound:
    """The range of one numeric setting, and why it ends where it does (docs/controller.md, "Settings")."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    """True: ``low`` itself is not allowed."""
    why: str = ""

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is allowed, else what it must be (the message after ``name = value``)."""
        if self.integer:
            ok = type(value) is int
        else:  # a bool is not a number; an int too large for a float is compared exactly
            ok = type(value) is int or (type(value) is float and math.isfinite(value))
        if ok:
            ok = (value > self.low if self.low_open else value >= self.low) and value <= self.high
        if ok:
            return None
        kind = "an integer" if self.integer else "a finite number"
        rel = ">" if self.low_open else ">="
        return f"must be {kind} {rel} {_num(self.low)} and <= {_num(self.high)} ({self.why})"

    def doc(self) -> str:
        """The range as docs/controller.md's settings table writes it: ``1..100000``, ``(1, 1000]``."""
        if self.integer:
            return f"{_num(self.low)}..{_num(self.high)}"
        return f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"


def _num(x: float) -> str:
    """A bound as written: ``100000``, ``0.5``, ``1e+12``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e7 else f"{x:g}"


def _show(value: Any) -> str:
    """``repr`` of a value for a message, shortened (a YAML integer can have hundreds of digits)."""
    r = repr(value)
    return r if len(r) <= 40 else f"{r[:24]}... ({len(r)} characters)"


#: Counts of drafts (prior weight, halving floor): a week of serving at 1000 steps/s and 1024 requests
#: a step drafts ~6e11 times; a weight beyond that is not a number of observations anyone has.
MAX_DRAFTS = 1e12
#: Counts of steps (step-time weights and caps): ~a year of steps at 30 steps/s.
MAX_STEPS = 1e9
#: The smallest weight that is still a weight: a thousandth of one observation.
MIN_WEIGHT = 1e-3
#: PATH_MAX on Linux.
MAX_EXPORT_PATH_CHARS = 4096

#: Every numeric setting's range (one home: the fleet loader, the publish gate and the controller
#: all validate through ``ControllerSettings``). A value outside is refused by name; inside, the
#: controller can be built with it and it means something.
BOUNDS: dict[str, Bound] = {
    "turbospec_forget": Bound(0.5, 1.0, why="the counts remember about 1/(1-f) steps; below 0.5 not even two"),
    "nightjar_exploration": Bound(0.0, 10.0, why="rewards are normalised to at most 1; beyond 10 the bonus "
                                                 "outweighs any reward difference and the bandit only explores"),
    "rebuild_every_steps": Bound(1, 100_000, integer=True, why="steps between rebuilds; 100000 steps are hours "
                                                                "of serving, a rarer rebuild never follows traffic"),
    "prior_weight": Bound(MIN_WEIGHT, MAX_DRAFTS, why="drafts the prior counts as"),
    "live_count_floor": Bound(0.0, MAX_DRAFTS, why="drafts per position kept when halving; 0 halves everything"),
    "min_prior_weight": Bound(MIN_WEIGHT, MAX_DRAFTS, why="drafts; the floor of the decayed prior weight"),
    "exploration_every_steps": Bound(0, 100_000, integer=True, why="0 turns exploration off; rarer than every "
                                                                    "100000 steps is off in all but name"),
    "exploration_run_steps": Bound(1, 64, integer=True, why="a few steps suffice to observe the explored k"),
    "hysteresis": Bound(0, 4096, integer=True, why="batch sizes; 4096 is the largest max_num_seqs a fleet may "
                                                   "have, and an h of max_num_seqs already keeps any k in use"),
    "hysteresis_hold_steps": Bound(1, 1_000_000, integer=True, why="steps; at 1 the table's k is taken every "
                                                                   "other step, and a hold of 1000000 steps is "
                                                                   "hours of serving (no release in practice)"),
    "evidence_confidence": Bound(0.5, 0.999999, why="0.5 is a point-estimate decision (z = 0); at 1 no bound is "
                                                    "finite and the table never changes"),
    "flap_backoff_rebuilds": Bound(0, 1_000_000, integer=True, why="rebuilds; 0 turns the backoff off"),
    "stickiness": Bound(0.0, 10.0, why="a fraction of goodput; at 10 another k must be 11 times better, so the "
                                       "table never changes"),
    "step_time_prior_weight": Bound(MIN_WEIGHT, MAX_STEPS, why="steps a profiled cell counts as"),
    "step_time_min_prior_weight": Bound(MIN_WEIGHT, MAX_STEPS, why="steps; the floor of the decayed weight"),
    "step_time_max_count": Bound(1.0, MAX_STEPS, why="live steps kept per cell"),
    "step_time_outlier_ratio": Bound(1.0, 1000.0, low_open=True, why="1 would refuse every interval; at 1000 "
                                                                     "every interval of a running engine counts"),
    "rebuild_budget_ms": Bound(1e-6, 60_000.0, why="1e-6 ms is below any clock's resolution (every rebuild is "
                                                   "over it); rebuilds take well under 1 ms, and one of a minute "
                                                   "would have stalled the engine for that minute"),
    "export_every_steps": Bound(1, 1_000_000, integer=True, why="export_every_s bounds a window's length anyway"),
    "export_every_s": Bound(1.0, 3600.0, why="seconds; a window of at most an hour loses at most an hour of "
                                             "counts at a crash"),
    "poll_every_s": Bound(1.0, 300.0, why="seconds; a newly published or rolled-back table is in force within "
                                          "five minutes"),
    "log_unchanged_every_s": Bound(0.0, 86_400.0, why="seconds; at least one line a day says the controller runs"),
}


@dataclass(frozen=True)
class ControllerSettings:
    """Parameters of the online controller (docs/method.md, "Online controller")."""

    mode: ControllerMode = "control"
    """``control`` rebuilds the table and rewrites vLLM's lookup; ``observe`` serves the published
    table as it is and only counts, estimates and exports (a shadow run, or a baseline)."""
    policy: ControllerPolicy = "tabletune"
    """Who chooses k per step (``ControllerPolicy``). With ``turbospec`` or ``nightjar`` the
    TableTune controller only observes (counts, estimates and exports as in ``observe`` mode)
    while the baseline writes vLLM's lookup; if the baseline cannot be built or raises, the
    published table is served as it is."""
    turbospec_forget: float = 0.995
    """TurboSpec-style policy: per-step forgetting factor of its acceptance counts (0.5 <= f <= 1;
    1 = plain cumulative counts)."""
    nightjar_exploration: float = 1.0
    """Nightjar-style policy: UCB1 exploration constant c (0..10; 0 = greedy after one try per k)."""
    rebuild_every_steps: int = 100
    """N: rebuild the table every this many engine steps that ran requests."""
    prior_weight: float = 2000.0
    """w: the prior counts as this many observations, â_i = (w·a_i + accepted_i) / (w + drafted_i).
    Capped at the prior's own draft count when the published file records one (a prior measured on
    500 drafts is not worth 2000)."""
    halve_after_rebuild: bool = True
    """Halve the live acceptance counters after each rebuild, so recent traffic dominates."""
    live_count_floor: float = 256.0
    """Halving stops at this many drafts per position: a position drafted only in exploration steps
    (a few dozen per rebuild) keeps enough draws for its estimate instead of halving them away."""
    prior_decay: bool = True
    """Halve the prior's weight at each rebuild too, so a stale prior fades (the stuck-short fix)."""
    min_prior_weight: float = 1.0
    """Floor of the decayed prior weight (keeps never-drafted positions defined)."""
    exploration_every_steps: int = 50
    """Every this many steps, run ``exploration_run_steps`` steps at the largest allowed k so every
    position keeps being observed; with ``step_time_correction`` each run is followed by as many steps
    at the next other allowed k in turn, so every k's step time is observed (0 turns exploration off)."""
    exploration_run_steps: int = 3
    """Steps in a row at the largest allowed k per exploration (1..64). A step's interval counts as an
    observation of its k only when the step before ran the same k (docs/controller.md, "Live step-time
    correction"), so with a run of one the explored k's step time would never be observed and would
    keep its profile however wrong; from the second step of a run on it is observed."""
    hysteresis: int = 2
    """h: keep the current k while the batch size is within h of a batch size that uses it, for at most
    ``hysteresis_hold_steps`` steps in a row at batch sizes the table gives another k."""
    hysteresis_hold_steps: int = 32
    """The longest hysteresis hold: after this many consecutive steps served at a k the table does not
    give their batch size, one step takes the table's k (a load that crosses a boundary back and forth
    keeps its k; one that stays inside a range, even one narrower than h, gets the range's k)."""
    stickiness: float = 0.005
    """Keep the k a batch size has unless another is better by more than this fraction, with the
    confidence below (the offline tuner's evidence rule, ``core.evidence``, revising the table in force)."""
    evidence_confidence: float = 0.95
    """Confidence of the evidence rule at a rebuild: a k changes at a batch size only when the lower
    bound of its gain (Bonferroni over the other k) clears ``stickiness``. 0.5 decides on point
    estimates (z = 0)."""
    merge_islands: bool = True
    """Let a narrow island (a range narrower than the served pool whose two neighbours share one k)
    take its neighbours' k when no allowed k beats that k at the lower confidence bound and the
    served traffic does not pay for the island (docs/controller.md, "The control loop"); false: the
    point test alone decides, as the offline tuner does."""
    flap_backoff_rebuilds: int = 1024
    """The longest hold of the flap backoff (0 turns it off): after a table change that returns some
    batch size to a k it had had, no batch size changes k for 8 rebuilds, then 64, 512, ... as the
    returns repeat, up to this many (about 17 minutes at 100 steps of 10 ms per rebuild), unless the
    change's gain clears 10 % at the lower confidence bound in 8 held rebuilds in a row
    (docs/controller.md, "Flapping")."""
    step_time_correction: bool = True
    """Blend observed step durations per (B, k) into the profiled T(B, k) (docs/method.md,
    "Limitations" 2: the profile cannot see work that grows with accepted tokens)."""
    step_time_prior_weight: float = 50.0
    """A profiled cell counts as this many observed steps when blended with live step times."""
    step_time_min_prior_weight: float = 2.0
    """Floor of the profiled cells' weight after decay (it halves at each rebuild, like w)."""
    step_time_max_count: float = 2000.0
    """Live step-time observations per cell are capped at this count (older ones are scaled down):
    the estimate follows drift, and cells no longer visited keep their last estimate."""
    step_time_outlier_ratio: float = 4.0
    """A step interval more than this factor away from the profiled T(B, k) is not used (a pause
    of the process, not a step)."""
    rebuild_budget_ms: float = 20.0
    """A rebuild that takes longer is abandoned (counted): the last good table stays."""
    export_path: str | None = None
    """Live-counters file (JSONL, ``tabletune_pipelines.formats.live_counters``); relative paths are taken
    from the published file's folder; None = ``<published stem>.live.jsonl`` beside it. The pipeline
    writes the fleet's ``live_counters`` path here so what is exported is what is ingested."""
    export_every_steps: int = 5000
    """Append one counter window at least every this many steps ..."""
    export_every_s: float = 60.0
    """... or every this many seconds, whichever comes first (checked at rebuilds)."""
    poll_every_s: float = 1.0
    """Check the published file's mtime this often (1..300 s) for a newer version."""
    log_unchanged_every_s: float = 60.0
    """A rebuild that changes the table logs one INFO line; unchanged rebuilds log one summary
    line at most this often."""

    def __post_init__(self) -> None:
        if self.mode not in CONTROLLER_MODES:
            raise SettingsError(f"controller setting mode = {self.mode!r} must be one of {CONTROLLER_MODES}")
        if not isinstance(self.policy, str) or self.policy not in CONTROLLER_POLICIES:
            raise SettingsError(f"controller setting policy = {self.policy!r} must be one of {CONTROLLER_POLICIES}")
        for name in ("halve_after_rebuild", "prior_decay", "merge_islands", "step_time_correction"):
            if type(getattr(self, name)) is not bool:
                raise SettingsError(f"controller setting {name} = {getattr(self, name)!r} must be true or false")
        for name, bound in BOUNDS.items():
            problem = bound.problem(getattr(self, name))
            if problem:
                raise SettingsError(f"controller setting {name} = {_show(getattr(self, name))} {problem}")
        if self.min_prior_weight > self.prior_weight:
            raise SettingsError(f"controller setting min_prior_weight = {self.min_prior_weight!r} must be <= "
                                f"prior_weight = {self.prior_weight!r}")
        if self.step_time_min_prior_weight > self.step_time_prior_weight:
            raise SettingsError(f"controller setting step_time_min_prior_weight = {self.step_time_min_prior_weight!r} "
                                f"must be <= step_time_prior_weight = {self.step_time_prior_weight!r}")
        if 0 < self.exploration_every_steps <= self.exploration_run_steps:
            raise SettingsError(f"controller setting exploration_every_steps = {self.exploration_every_steps!r} must "
                                f"be 0 (off) or more than exploration_run_steps = {self.exploration_run_steps!r} "
                                "(else every step explores)")
        p = self.export_path
        if p is not None and (not isinstance(p, str) or not p.strip() or len(p) > MAX_EXPORT_PATH_CHARS
                              or any(ord(c) < 32 or ord(c) == 127 for c in p)):
            raise SettingsError(f"controller setting export_path = {p!r:.200} must be a non-empty path of at most "
                                f"{MAX_EXPORT_PATH_CHARS} characters without control characters")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "controller settings") -> ControllerSettings:
        """Settings from a JSON/YAML mapping (``options.options_from_mapping``): unknown keys and wrong
        types are errors naming ``where``; an integral float (3.0) is an integer setting's integer and
        an integer a float setting's float, when the conversion is exact (JSON has one number type)."""
        return options_from_mapping(cls, data, where=where, error=SettingsError, noun="setting", exact_numbers=True)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

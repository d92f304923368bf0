"""The controller's settings: every parameter of the online method, with its default.

Stdlib only. A deployment overrides any of them in the fleet file (``controller:`` mapping), the
pipeline copies that mapping into the published file (``"controller": {...}``), and the
controller reads it from there at start-up and on every newly published version. Unknown keys,
wrong types, booleans where numbers belong, NaN and out-of-range values are refused with a message
that names the key (docs/controller.md, "Settings").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.vocab import CONTROLLER_MODES, ControllerMode

ControllerPolicy = Literal["tabletune", "turbospec", "nightjar"]
"""Who chooses k per step inside the engine: ``tabletune`` (the table of the published file,
rebuilt online in ``control`` mode), ``turbospec`` (the TurboSpec-style baseline: a linear
step-time model of the published profile and a live per-token acceptance rate) or ``nightjar``
(the Nightjar-style baseline: a UCB1 bandit per batch size). Both baselines are
``controller/baselines.py``; they exist to be compared with (issue 10), not to serve production."""

CONTROLLER_POLICIES: tuple[str, ...] = get_args(ControllerPolicy)

#: The env var naming the published file inside the serving process (the plugin's one setting).
PUBLISHED_ENV = "TABLETUNE_PUBLISHED_TABLE"


class SettingsError(TableTuneError, ValueError):
    """A controller setting with an unknown key, a wrong type or a value outside its range."""


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
    """TurboSpec-style policy: per-step forgetting factor of its acceptance counts (0 < f <= 1;
    1 = plain cumulative counts)."""
    nightjar_exploration: float = 1.0
    """Nightjar-style policy: UCB1 exploration constant c (>= 0; 0 = greedy after one try per k)."""
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
    position keeps being observed (0 turns exploration off)."""
    exploration_run_steps: int = 3
    """Steps in a row at the largest allowed k per exploration (1..64). A step's interval counts as an
    observation of its k only when the step before ran the same k (docs/controller.md, "Live step-time
    correction"), so with a run of one the explored k's step time would never be observed and would
    keep its profile however wrong; from the second step of a run on it is observed."""
    hysteresis: int = 2
    """h: keep the current k while the batch size is within h of a batch size that uses it."""
    stickiness: float = 0.005
    """Keep the previous batch size's k unless another is better by more than this fraction."""
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
    """Live-counters file (JSONL, ``tabletune_pipelines.live_counters``); relative paths are taken
    from the published file's folder; None = ``<published stem>.live.jsonl`` beside it. The pipeline
    writes the fleet's ``live_counters`` path here so what is exported is what is ingested."""
    export_every_steps: int = 5000
    """Append one counter window at least every this many steps ..."""
    export_every_s: float = 60.0
    """... or every this many seconds, whichever comes first (checked at rebuilds)."""
    poll_every_s: float = 1.0
    """Check the published file's mtime at most this often (>= 1 s) for a newer version."""
    log_unchanged_every_s: float = 60.0
    """A rebuild that changes the table logs one INFO line; unchanged rebuilds log one summary
    line at most this often."""

    def __post_init__(self) -> None:
        if self.mode not in CONTROLLER_MODES:
            raise SettingsError(f"controller setting mode = {self.mode!r} must be one of {CONTROLLER_MODES}")
        if not isinstance(self.policy, str) or self.policy not in CONTROLLER_POLICIES:
            raise SettingsError(f"controller setting policy = {self.policy!r} must be one of {CONTROLLER_POLICIES}")
        f = self.turbospec_forget
        if type(f) not in (int, float) or not math.isfinite(f) or not 0.0 < f <= 1.0:
            raise SettingsError(f"controller setting turbospec_forget = {f!r} must be a number in (0, 1]")
        for name, lo in (("rebuild_every_steps", 1), ("exploration_every_steps", 0), ("hysteresis", 0),
                         ("export_every_steps", 1), ("exploration_run_steps", 1)):
            v = getattr(self, name)
            if type(v) is not int or v < lo:
                raise SettingsError(f"controller setting {name} = {v!r} must be an integer >= {lo}")
        if self.exploration_run_steps > 64:
            raise SettingsError(f"controller setting exploration_run_steps = {self.exploration_run_steps!r} must be "
                                "at most 64 (a few steps suffice to observe the explored k)")
        for name, lo, strict in (("prior_weight", 0.0, True), ("min_prior_weight", 0.0, True),
                                 ("nightjar_exploration", 0.0, False),
                                 ("stickiness", 0.0, False), ("live_count_floor", 0.0, False),
                                 ("step_time_prior_weight", 0.0, True),
                                 ("step_time_min_prior_weight", 0.0, True), ("step_time_max_count", 1.0, False),
                                 ("rebuild_budget_ms", 0.0, True), ("export_every_s", 0.0, True),
                                 ("poll_every_s", 1.0, False), ("log_unchanged_every_s", 0.0, False)):
            v = getattr(self, name)
            if type(v) not in (int, float) or not math.isfinite(v) or v < lo or (strict and v == lo):
                rel = ">" if strict else ">="
                raise SettingsError(f"controller setting {name} = {v!r} must be a finite number {rel} {lo:g}")
        if self.step_time_outlier_ratio is None or type(self.step_time_outlier_ratio) not in (int, float) \
                or not math.isfinite(self.step_time_outlier_ratio) or self.step_time_outlier_ratio <= 1.0:
            raise SettingsError(f"controller setting step_time_outlier_ratio = {self.step_time_outlier_ratio!r} "
                                "must be a finite number > 1")
        if self.min_prior_weight > self.prior_weight:
            raise SettingsError(f"controller setting min_prior_weight = {self.min_prior_weight!r} must be <= "
                                f"prior_weight = {self.prior_weight!r}")
        if self.step_time_min_prior_weight > self.step_time_prior_weight:
            raise SettingsError(f"controller setting step_time_min_prior_weight = {self.step_time_min_prior_weight!r} "
                                f"must be <= step_time_prior_weight = {self.step_time_prior_weight!r}")
        for name in ("halve_after_rebuild", "prior_decay", "step_time_correction"):
            if type(getattr(self, name)) is not bool:
                raise SettingsError(f"controller setting {name} = {getattr(self, name)!r} must be true or false")
        if self.export_path is not None and (not isinstance(self.export_path, str) or not self.export_path.strip()
                                             or "\n" in self.export_path or "\x00" in self.export_path):
            raise SettingsError(f"controller setting export_path = {self.export_path!r} must be a non-empty path")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "controller settings") -> "ControllerSettings":
        """Settings from a JSON/YAML mapping: unknown keys and wrong types are errors naming ``where``."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SettingsError(f"{where} must be a mapping of setting names to values, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise SettingsError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
        body = dict(data)
        # JSON has one number type: accept 3.0 for an integer setting only when it is integral.
        for f in fields(cls):
            if f.name in body and f.type in ("int",) and type(body[f.name]) is float and body[f.name].is_integer():
                body[f.name] = int(body[f.name])
            if f.name in body and f.type in ("float",) and type(body[f.name]) is int:
                body[f.name] = float(body[f.name])
        try:
            return cls(**body)
        except SettingsError as exc:
            raise SettingsError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

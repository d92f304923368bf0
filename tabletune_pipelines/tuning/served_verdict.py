"""The served verification's verdict and its result: per load, the candidate against the best fixed k
(``judge_load``, ``judge``), and what a verification reports and publishes (``ServedVerification``).
Pure: windows in, verdicts out.

**Verdict** (``judge_load``): at each load, the best fixed k is the fixed k with the highest mean
goodput; the candidate is paired with it round by round (ratio of the two windows of one round),
giving a mean ratio r and its standard error s over n rounds, and the interval ``r ± t(n-1)·s`` (t:
Student's one-sided 97.5% quantile, ``core.stats.t_quantile``: 12.71 / 4.30 / 3.18 / 2.78 for
2 / 3 / 4 / 5 rounds, 1.96 for many). The loss the gate must detect is the tolerance (3% by
default). A load **passes** when the whole interval lies above ``1 - tolerance`` (the loss is smaller
than the tolerance, with that confidence), **fails** when the whole interval lies below it (a fixed k
beats the table by more than the tolerance), and is **inconclusive** otherwise, or with fewer than 2
paired rounds (no noise estimate). Noise never passes a table: a wide interval is inconclusive, not a
pass.

**Outcome** (``ServedVerification.verdict``): ``verified`` when every load passes; ``failed`` when
any load fails (publishing is refused and the previous table kept); ``unverified`` otherwise: the
table publishes with the check as a warning that carries its figures, and nothing calls it verified.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tabletune_pipelines.core.noise import units_to_detect
from tabletune_pipelines.core.stats import mean_se, paired_ratios, t_quantile
from tabletune_pipelines.tuning.served_plan import VerificationPlan
from tabletune_pipelines.tuning.served_windows import CANDIDATE, Window, by_round
from tabletune_pipelines.vocab import WindowKind

__all__ = [
    "LoadVerdict", "PolicyGoodput", "ReferenceRatio", "ServedVerdict", "ServedVerification", "Status", "StopReason",
    "judge", "judge_load", "rounds_to_decide",
]

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
    references: tuple[ReferenceRatio, ...] = ()
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
    ratios = paired_ratios(candidate, fixed[best])
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
          references: Mapping[int, Mapping[str, str | None]] | None = None,
          dropped: Mapping[int, Collection[str]] | None = None
          ) -> tuple[list[PolicyGoodput], list[LoadVerdict]]:
    """Per load: every policy's mean goodput ± s.e. and the candidate's verdict (``judge_load``).
    ``same``: per load, the fixed-k policy the candidate equals there (its windows are the candidate's,
    and the candidate is judged against the best other fixed k). ``references``: per load, reference
    name -> ``candidate`` (A/A), a fixed-k policy that stands for it, or None (measured as itself).
    ``dropped``: per load, fixed-k policies that stopped being served once the best fixed k out-served
    them beyond the paired noise (``served_verification.outserved``): listed with their goodput, never
    the best the candidate is judged against (their means come from the early rounds only, which
    round-to-round drift makes incomparable with the others')."""
    goodput, verdicts = [], []
    same = same or {}
    for load in loads:
        by = by_round(windows, load)
        here = same.get(load)
        cand = by.get(here, {}) if here else by.get(candidate, {})
        refs = dict((references or {}).get(load, {}))
        names = [candidate, *[f for f in fixed if f != candidate], *[r for r, via in refs.items() if via is None]]
        for name in names:
            vals = list((cand if name == candidate else by.get(name, {})).values())
            m, se = mean_se(vals)
            if vals or name in (candidate, *fixed):
                goodput.append(PolicyGoodput(name, load, m, se, len(vals)))
        out = set((dropped or {}).get(load, ()))
        v = judge_load(load, cand, {f: by.get(f, {}) for f in fixed if f != here and f not in out},
                       tolerance=tolerance)
        if here:
            v = dataclasses.replace(v, candidate_is=here, reason=v.reason + f" (the table is {here} at this load: "
                                    f"judged against the other fixed k)")
        ratios = []
        for name, via in refs.items():
            if via == CANDIDATE:
                ratios.append(ReferenceRatio(name, None, None, 0, CANDIDATE))
                continue
            rs = paired_ratios(cand, by.get(via or name, {}))
            m, se = mean_se(rs)
            ratios.append(ReferenceRatio(name, m if rs else None, se if len(rs) > 1 else None, len(rs), via))
        verdicts.append(dataclasses.replace(v, references=tuple(ratios)))
    return goodput, verdicts


@dataclass(frozen=True)
class ServedVerification:
    """A candidate table against every fixed k at a few loads, in one launch.

    Made by ``served_verification.verify_on_server``."""

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
    window: WindowKind = "time"
    """What a window counts (``vocab.WindowKind``): ``time`` (a span of a running load) or
    ``requests`` (a fixed set of requests, ``requests_per_client`` a client, served to the last answer)."""
    requests_per_client: int | None = None
    """Requests each client sends in a ``requests`` window (None for ``time`` windows)."""

    def mean_batch(self, load: int) -> float | None:
        """Mean requests per step over the load's verified windows: a ``requests`` window ends with its
        drain, so it sits below the load (None: no window)."""
        got = [w.mean_batch for w in self.windows if w.load == load and w.table_verified]
        return statistics.fmean(got) if got else None

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

        per_load: list[dict[str, Any]] = []
        for v in self.verdicts:
            per_load.append({
                "load": v.load, "status": v.status, "best_fixed_k": v.best_fixed_k, "ratio": num(v.ratio),
                "ratio_se": num(v.ratio_se), "rounds": v.rounds, "t": num(v.t, 3), "candidate_is": v.candidate_is,
                "references": {r.name: {"ratio": num(r.ratio), "ratio_se": num(r.ratio_se), "rounds": r.rounds,
                                        "same_as": r.same_as} for r in v.references},
                "goodput": {g.policy: [num(g.goodput, 2), num(g.stderr, 2), g.rounds]
                            for g in self.goodput if g.load == v.load},
                "mean_batch": num(self.mean_batch(v.load), 2),
            })
        stops = dict(self.stop_reasons)
        for row in per_load:
            if row["load"] in stops:
                row["stop"] = stops[row["load"]]
        return {
            "passed": self.passed, "verdict": self.verdict, "rule": self.rule, "tolerance": self.tolerance,
            "candidate": [list(r) for r in self.candidate], "candidate_is": self.candidate_is,
            "loads": sorted(self.plan.loads), "rounds": self.plan.rounds, "window_s": self.plan.window_s,
            "window": self.window, "requests_per_client": self.requests_per_client,
            "budget_s": self.plan.budget_s, "elapsed_s": round(self.elapsed_s, 1), "budget_cut": self.budget_cut,
            "launch_s": num(self.launch_s, 1), "device": self.device or None, "acceptance": self.acceptance or None,
            "excluded_windows": self.excluded_windows, "client_errors": self.client_errors, "per_load": per_load,
            **({"no_verdict_expected": list(self.expected_open)} if self.expected_open else {}),
        }

"""What the controller records of itself: its counters (exported in every window's controller
state) and its log lines (each warning once, one line per rebuild that changes the table, a summary
of unchanged rebuilds at most every ``log_unchanged_every_s``). Owned by ``logic.Controller``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: At most this many distinct warnings are logged once each; past it the rest are only counted.
MAX_NOTES = 256


def fmt_table(ranges: Sequence[Sequence[int]]) -> str:
    """A table as one compact log token: ``[[1,8,3],[9,16,1]]``."""
    return "[" + ",".join(f"[{s},{e},{k}]" for s, e, k in ranges) + "]"


def fmt_rates(xs: Sequence[float] | np.ndarray, nd: int = 3) -> str:
    """Rates as a log token: ``(0.700, 0.500)``."""
    return "(" + ", ".join(f"{float(x):.{nd}f}" for x in xs) + ")"


@dataclass(slots=True)
class Counters:
    """The controller's cumulative counters (steps are counted on the controller itself, on the
    per-step path). Exported in this order after ``steps`` (``exported``)."""

    rebuilds: int = 0
    table_changes: int = 0
    skipped_rebuilds: int = 0
    exploration_steps: int = 0
    errors: int = 0
    anomalies: int = 0
    exports: int = 0
    export_failures: int = 0
    reloads: int = 0
    last_rebuild_ms: float = 0.0
    max_rebuild_ms: float = 0.0

    def rebuilt(self, ms: float, *, changed: bool) -> None:
        """One rebuild done in ``ms`` milliseconds (``changed``: it changed the table)."""
        self.rebuilds += 1
        self.table_changes += changed
        self.last_rebuild_ms = ms
        self.max_rebuild_ms = max(self.max_rebuild_ms, ms)

    def exported(self) -> dict[str, Any]:
        """The counters as the controller state exports them (times rounded to 0.1 µs)."""
        return {"rebuilds": self.rebuilds, "table_changes": self.table_changes,
                "skipped_rebuilds": self.skipped_rebuilds, "exploration_steps": self.exploration_steps,
                "errors": self.errors, "anomalies": self.anomalies, "exports": self.exports,
                "export_failures": self.export_failures, "reloads": self.reloads,
                "last_rebuild_ms": round(self.last_rebuild_ms, 4), "max_rebuild_ms": round(self.max_rebuild_ms, 4)}


class Notes:
    """The controller's warnings, each kind logged once (``once``; a bounded set of kinds: past
    ``MAX_NOTES`` the rest are counted in ``suppressed``), and the time of the last summary line."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.seen: set[str] = set()
        self.suppressed = 0
        self.last_summary = float("-inf")
        """Clock time of the last rebuild line (changed table or summary of unchanged ones)."""

    def first(self, key: str, *, bounded: bool = True) -> bool:
        """Whether ``key`` is new (then it is remembered); with ``bounded``, False past the bound
        (counted). Hook failures are not bounded: their kinds are few (a hook and an exception type)."""
        if key in self.seen:
            return False
        if bounded and len(self.seen) >= MAX_NOTES:  # a bounded set: past it, stay quiet rather than log every time
            self.suppressed += 1
            return False
        self.seen.add(key)
        return True

    def once(self, key: str, msg: str, *args: Any) -> None:
        """Log ``msg % args`` as a warning the first time ``key`` is seen."""
        if self.first(key):
            self.log.warning(msg, *args)

    def failure(self, where: str, exc: BaseException, table: Sequence[Sequence[int]]) -> None:
        """A hook failed: the first failure of each kind (hook and exception type) is logged with its
        traceback, naming the ``table`` that stays in force."""
        if self.first(f"error:{where}:{type(exc).__name__}", bounded=False):
            self.log.warning("TableTune controller: %s failed (%r); serving goes on with table %s (further "
                             "failures of this kind are only counted)", where, exc, fmt_table(table), exc_info=exc)

    def skipped(self, ms: float, budget_ms: float, table: Sequence[Sequence[int]]) -> None:
        """A rebuild over its budget was skipped (the first one is logged)."""
        self.once("budget", "TableTune controller: a rebuild took %.2f ms, over rebuild_budget_ms = %g; skipped, "
                  "keeping table %s (further skips are only counted)", ms, budget_ms, fmt_table(table))

    def summary_due(self, now: float, every_s: float) -> bool:
        """Whether a summary line is due at clock time ``now`` (then its time is taken)."""
        if now - self.last_summary < every_s:
            return False
        self.last_summary = now
        return True

    def rebuilt(self, counters: Counters, steps: int, version: Any, tables: tuple[Sequence[Sequence[int]], ...],
                rates: Sequence[float] | np.ndarray, live: tuple[Any, Any, float], model: Any,
                now: float, where: str = "") -> None:
        """The line of a rebuild (``version``: the ``version.Installed`` in force; ``tables``: the
        table before and after; ``live``: the live drafted and kept counts and the prior weight it
        used; ``model``: the step-time model) at clock time ``now``: one per change of the table, a
        summary of unchanged ones at most every ``log_unchanged_every_s``; ``where``: which table
        (a grid's context bucket), after the step."""
        (old, new), (drafted, accepted, w), s = tables, live, version.settings
        if old != new:
            ratios = model.ratios()
            corr = ", ".join(f"k{k} x{float(np.median(ratios[i])):.2f}" for i, k in enumerate(model.ks)
                             if np.any(model.count[i] > 0))
            self.log.info("TableTune controller: rebuild %d at step %d%s%s: table %s -> %s; a = %s; live drafted %s "
                          "kept %s; prior weight %g; step-time correction %s; %.2f ms", counters.rebuilds, steps, where,
                          "" if version.controlling else " (observing: not applied)", fmt_table(old), fmt_table(new),
                          fmt_rates(rates), [int(x) for x in drafted], [int(x) for x in accepted], w,
                          (corr or "none observed") if s.step_time_correction else "off", counters.last_rebuild_ms)
            self.last_summary = now
        elif self.summary_due(now, float(s.log_unchanged_every_s)):
            self.log.info("TableTune controller: rebuild %d at step %d%s: table %s unchanged; a = %s; prior weight %g; "
                          "%.2f ms", counters.rebuilds, steps, where, fmt_table(new), fmt_rates(rates), w,
                          counters.last_rebuild_ms)

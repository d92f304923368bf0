"""The export window: what the controller counted since its last exported line of live counters
(docs/controller.md, "Live counters"), and when the next line is due.

Owned by ``logic.Controller`` (one for its life: a window outlives a published version, whose last
window is written before the next version is installed). The per-step path adds to ``tokens``,
``busy``, ``steps``, ``hook_s`` and ``hook_max`` in place (plain floats and ints); the per-position
counts come in at rebuilds and exports (``add_counts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tabletune_pipelines.controller.loader import StartPoint
from tabletune_pipelines.controller.record import Counters, Notes
from tabletune_pipelines.core.acceptance_estimate import rates_from_counts
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.formats.live_counters import CounterWindow, append_line, window_line


class ExportWindow:
    """Counts of one export window. ``max_k``: the engine's K (positions counted); ``wall``: UTC
    seconds for the window's bounds; ``source``: the writer named in every line."""

    def __init__(self, max_k: int, now: float, *, wall: Callable[[], float], source: str) -> None:
        self.K = int(max_k)
        self.wall = wall
        self.source = source
        self.last_wall_end = float("-inf")
        """UTC end of the last window written: one writer's windows follow each other in time."""
        self.reset(now)

    def reset(self, now: float) -> None:
        """Start an empty window at clock time ``now``."""
        self.drafted = [0] * self.K
        """Per position i = 1..K: request-steps that drafted at least i."""
        self.accepted = [0] * self.K
        """... and that kept at least i."""
        self.steps = 0
        self.tokens = 0
        """Tokens produced (one per request-step plus the drafts kept)."""
        self.busy = 0.0
        """Seconds between consecutive steps of a busy engine."""
        self.hook_s = 0.0
        """Time spent in the per-step hook (its counting), and its longest single step."""
        self.hook_max = 0.0
        self.t0 = now
        self.wall0 = self.wall()
        self.next_try = now

    def add_counts(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Per-position counts folded from the step histograms (``step.fold``)."""
        for i in range(self.K):
            self.drafted[i] += drafted[i]
            self.accepted[i] += accepted[i]

    def rates(self) -> np.ndarray:
        """The window's acceptance rates (monotone; 0 where nothing was drafted)."""
        return rates_from_counts(self.accepted, self.drafted)

    def due(self, now: float, settings: ControllerSettings, force: bool) -> bool:
        """Whether a line is due at clock time ``now``: never for an empty window; with ``force``
        always; else after ``export_every_steps`` steps or ``export_every_s`` seconds, and not before
        the retry time of a failed attempt."""
        if self.steps == 0:
            return False
        if force:
            return True
        s = settings
        return (self.steps >= s.export_every_steps or now - self.t0 >= s.export_every_s) and now >= self.next_try

    def hook_state(self) -> dict[str, Any]:
        """The per-step hook's cost in this window, as the controller state exports it."""
        return {"hook_us_mean": round(1e6 * self.hook_s / self.steps, 3) if self.steps else None,
                "hook_us_max": round(1e6 * self.hook_max, 3)}

    def line(self, start: StartPoint, estimate: Callable[[], tuple[float, ...]],
             state: Callable[[], dict[str, Any]], seq: int) -> tuple[str, float]:
        """The live-counters line of this window for the version ``start``, with its end (UTC
        seconds) for ``write``; ``estimate`` and ``state`` give the controller's â and state."""
        w0 = max(self.wall0, self.last_wall_end)
        w1 = max(self.wall(), w0)
        pub = start.published
        return window_line(CounterWindow(
            deployment=pub.deployment,
            window_start=datetime.fromtimestamp(w0, timezone.utc),
            window_end=datetime.fromtimestamp(w1, timezone.utc),
            num_drafts=self.drafted[0] if self.K else 0, drafted_per_pos=tuple(self.drafted),
            accepted_per_pos=tuple(self.accepted), identity_key=pub.identity_key,
            table_version=pub.version, steps=self.steps, tokens=self.tokens,
            busy_s=round(self.busy, 6), estimate=estimate(), source=self.source, seq=seq,
            controller=state())), w1

    def write(self, now: float, start: StartPoint, estimate: Callable[[], tuple[float, ...]],
              state: Callable[[], dict[str, Any]], counters: Counters, notes: Notes) -> bool:
        """Append this window's line to ``start``'s export path and start a new window at ``now``;
        True when written. A failure is counted (``counters``), noted once per kind (``notes``) and
        keeps the counts for the next attempt, ``export_every_s`` later (1 s at least)."""
        try:
            line, end = self.line(start, estimate, state, counters.exports)
            append_line(start.export_path, line)
        except (OSError, ValueError) as exc:
            # ValueError: LiveCountersError, a line the format refuses or a file at export_path that is
            # not a live counters file (append_line writes nothing to it). One line for the disk's
            # failures, one for the format's and the file's.
            counters.export_failures += 1
            self.next_try = now + max(1.0, float(start.settings.export_every_s))
            notes.once("export" if isinstance(exc, OSError) else "export:refused", "TableTune controller: cannot "
                       "write live counters to %s (%s); serving goes on, counts are kept for the next attempt "
                       "(further failures are only counted)", start.export_path, getattr(exc, "strerror", None) or exc)
            return False
        counters.exports += 1
        self.last_wall_end = end
        self.reset(now)
        return True

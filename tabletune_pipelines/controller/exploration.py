"""Exploration: runs of steps at a k the table may not use, so every k keeps being observed
(docs/controller.md, "The control loop").

Every ``exploration_every_steps`` steps a run of ``exploration_run_steps`` steps at the largest
allowed k; with step-time correction each run at K is followed by as many steps at the next other
allowed k in turn (the cycle), since a k never run keeps its profile however wrong. Every other run
explores the open decision at the batch size in service instead, when there is one (``focus``: a k
whose gain over the table's k there has an upper confidence bound above the stickiness).

Owned by ``logic.Controller``: one per published version that controls (``version.prepare`` builds
it). The lookups are precomputed; handing one out allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tabletune_pipelines.core.table import vllm_layout
from tabletune_pipelines.formats.controller_settings import ControllerSettings

Run = list[tuple[int, list[int]]]
"""One exploration run: per step, (k, the lookup that runs it)."""


class Exploration:
    """The exploration of one version. ``n``: max_num_seqs; ``ks``: the allowed k; ``with_others``:
    follow each run at K by the next other k (step-time correction on); ``steps``: the step count
    at install (the first run is due ``exploration_every_steps`` later)."""

    def __init__(self, n: int, ks: Sequence[int], settings: ControllerSettings, *, with_others: bool,
                 steps: int) -> None:
        self.n = int(n)
        self.every = int(settings.exploration_every_steps)
        self.run = int(settings.exploration_run_steps)
        self.ks = tuple(int(k) for k in ks)
        self.kmax = max(self.ks)
        self.top = vllm_layout(np.full(self.n, self.kmax))
        """The lookup of the largest allowed k."""
        others = [k for k in sorted(ks, reverse=True) if k != self.kmax] if with_others else []
        self.cycle: list[Run] = ([[(self.kmax, self.top)] * self.run + [(k, vllm_layout(np.full(self.n, k)))] * self.run
                                  for k in others] or [[(self.kmax, self.top)] * self.run])
        self.seq: Run = self.cycle[0]
        """The run in progress."""
        self.i = 0
        """Runs started."""
        self.left = 0
        """Lookups of the run in progress still to hand out."""
        self.pending = 0
        """Exploration steps handed out whose outcome has not come yet (``logic.Controller.on_step``:
        such a step leaves the k in force for hysteresis alone)."""
        self.k = self.kmax
        """The k of the last exploration lookup handed out."""
        self.next_at = int(steps) + self.every
        """The step count at which the next run starts."""
        self.focus: Run | None = None
        """The run for the open decision at the batch size in service (``refocus``), or None."""

    @classmethod
    def plan(cls, n: int, ks: Sequence[int], settings: ControllerSettings, *, controlling: bool, correcting: bool,
             steps: int) -> Exploration | None:
        """The exploration of a version, or None when it does not explore (observing, exploration off,
        or no k above 0 allowed). ``correcting``: step times are corrected (a profile is published and
        ``step_time_correction`` is on), so the other k are explored too."""
        if not (controlling and settings.exploration_every_steps and ks and max(ks)):
            return None
        return cls(n, ks, settings, with_others=correcting, steps=steps)

    def due(self, steps: int) -> bool:
        """Whether the next lookup is an exploration step (a run is in progress or one is due)."""
        return self.left > 0 or steps >= self.next_at

    def next(self, steps: int) -> list[int]:
        """The next exploration lookup (``due`` is true). Steps after a run's first follow a step of
        the same k, so they are clean observations of that k's step time."""
        if self.left > 0:
            self.left -= 1
        else:
            self.next_at = steps + self.every
            # Every other run explores the open decision at the batch size in service, if any (the
            # evidence rule moves only on observations, and the cycle alone visits each other k
            # once per len(cycle) runs); the others follow the cycle, so every k stays observed.
            focus = self.focus
            if focus is not None and self.i % 2:
                self.seq = focus
            else:
                self.seq = self.cycle[(self.i // 2 if focus is not None else self.i) % len(self.cycle)]
            self.i += 1
            self.left = len(self.seq) - 1
        self.k, lookup = self.seq[len(self.seq) - 1 - self.left]
        self.pending = min(self.pending + 1, len(self.seq) + 1)  # idle schedules hand out steps that never come
        return lookup

    def refocus(self, ev: Any, chosen: np.ndarray, b: int, settings: ControllerSettings) -> None:
        """After a search (``ev``: ``core.evidence.EvidenceTable``, ``chosen``: its k per batch size),
        point the focus at the open decision at batch size ``b`` (the one in service), if any."""
        best = (open_decision(ev, chosen, b, self.ks, float(settings.stickiness))
                if settings.step_time_correction and 1 <= b <= self.n else None)
        self.focus = (None if best is None else
                      [(self.kmax, self.top)] * self.run + [(best, vllm_layout(np.full(self.n, best)))] * self.run)


def open_decision(ev: Any, chosen: np.ndarray, b: int, allowed_k: Sequence[int], stickiness: float) -> int | None:
    """The allowed k other than the largest and the chosen one whose gain over the chosen k at batch size ``b``
    has the largest upper confidence bound above ``stickiness`` in the search's evidence ``ev``
    (None when no such k is open there)."""
    ks, c, kmax = ev.choice.ks, b - 1, max(allowed_k)
    j = ks.index(int(chosen[c]))
    lim = float(np.log1p(stickiness))
    best, best_up = None, lim
    for k in allowed_k:
        if k == kmax or k == int(chosen[c]):
            continue
        i = ks.index(k)
        up = float(ev.log_ratio[i, j, c] + ev.z * ev.log_sd[i, j, c])
        if up > best_up:
            best, best_up = k, up
    return best

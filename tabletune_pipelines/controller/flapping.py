"""Flap counting and backoff: the switches of k per batch size between tables in force, and the
holds that stop a batch size switching back and forth (docs/controller.md, "Flapping").

Owned by ``logic.Controller`` (one per published version: a new version starts its own flap
history, the switch counts stay cumulative for the export); numpy only, testable alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A batch size that switches again within this many rebuilds of its last switch is flapping.
FLAP_WINDOW_REBUILDS = 16


class FlapCounter:
    """Switches of k at batch sizes 1..``n`` (arrays indexed by B, index 0 unused): how many, how
    many went back to the k the batch size had before its last change (``reversals``), and which
    batch sizes are held. ``cap``: the longest hold in rebuilds (``flap_backoff_rebuilds``; 0 = no
    backoff). Rebuilds are numbered by the caller (``Controller.rebuilds``)."""

    FLAP_WINDOW_REBUILDS = FLAP_WINDOW_REBUILDS

    def __init__(self, n: int, cap: int = 0, *, switches: np.ndarray | None = None, reversals: int = 0) -> None:
        self.n = int(n)
        self.cap = int(cap)
        self.switches = np.zeros(n + 1, dtype=np.int64) if switches is None else switches
        """Changes of k per batch size (cumulative)."""
        self.reversals = int(reversals)
        """Changes back to the k a batch size had before its last change (cumulative)."""
        self.k_before = np.full(n + 1, -1, dtype=np.int64)
        """The k each batch size had before its last change (-1: none yet)."""
        self.backoff_level = np.zeros(n + 1, dtype=np.int64)
        """Repeated switches in a row: the r of the next hold, 2^r rebuilds."""
        self.held_until = np.zeros(n + 1, dtype=np.int64)
        """The rebuild until which each batch size keeps its k (held while > the rebuild number)."""
        self.last_switch = np.full(n + 1, -(1 << 40), dtype=np.int64)
        """The rebuild of each batch size's last switch (or the end of its hold, once held)."""

    def restarted(self, cap: int) -> FlapCounter:
        """A new flap history (a new published version), with this one's switch counts (copied)."""
        return FlapCounter(self.n, cap, switches=self.switches.copy(), reversals=self.reversals)

    def count(self, old: np.ndarray, new: np.ndarray, rebuild: int) -> None:
        """Count each batch size whose k changes from ``old`` to ``new`` (k per B, index B - 1) at
        rebuild number ``rebuild`` (and the reversals: back to the k it had before its last change).
        A batch size that switches again within ``FLAP_WINDOW_REBUILDS`` rebuilds of its last switch
        (back and forth, or round three ks) is held for 2, 4, 8, ... rebuilds, up to ``cap``; a switch
        after a quiet spell resets the hold to nothing."""
        changed = np.flatnonzero(old != new)
        if not changed.size:
            return
        b = changed + 1
        self.switches[b] += 1
        self.reversals += int((self.k_before[b] == new[changed]).sum())
        self.k_before[b] = old[changed]
        repeat = rebuild - self.last_switch[b] <= self.FLAP_WINDOW_REBUILDS
        self.last_switch[b] = rebuild
        self.backoff_level[b] = np.where(repeat, self.backoff_level[b] + 1, 0)
        if self.cap > 0 and repeat.any():
            fb = b[repeat]
            hold = np.minimum(np.left_shift(1, np.minimum(self.backoff_level[fb], 40)), self.cap)
            self.held_until[fb] = rebuild + 1 + hold
            # The quiet spell that forgives a batch size starts when its hold ends, not at its switch (a
            # hold longer than the window would otherwise reset the level it was earned by).
            self.last_switch[fb] = self.held_until[fb]

    def held(self, rebuild: int) -> np.ndarray:
        """Whether each batch size keeps its k at rebuild number ``rebuild`` (bool, index B - 1)."""
        return self.held_until[1:] > rebuild

    def summary(self, rebuild: int, hours: float) -> dict[str, Any]:
        """Switches of k (table changes at a batch size): total, per hour over ``hours``, flips back,
        the batch sizes that switched most and how many are held at rebuild number ``rebuild``."""
        total = int(self.switches.sum())
        top = np.argsort(-self.switches, kind="stable")[:8]
        return {
            "switches": total, "switches_per_hour": round(total / max(hours, 1e-9 / 3600.0), 3),
            "reversals": self.reversals,
            "switches_by_batch_size": {str(int(b)): int(self.switches[b]) for b in sorted(top) if self.switches[b]},
            "held_batch_sizes": int(np.count_nonzero(self.held(rebuild))),
        }

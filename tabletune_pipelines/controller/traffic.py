"""The served traffic as the island rule weighs it (``core.evidence``, ``visits``): numpy only.

The island rule merges a narrow island (a range whose two neighbours share one k) that the served
traffic does not pay for. Weighed by the steps served so far alone, an island that carried the load
looked unpaid as soon as the load spent a while elsewhere: on the CPU build the engine runs spells of
thousands of steps with one request while the clients have eight in flight, and in one of them the
controller merged the k = 1 island it had just put at B = 8 (true lead 20 %) back into k = 2, and the
flap backoff then held the wrong k (docs/controller.md, "The control loop"). Load that moves between
batch sizes for a minute does the same in service. So each batch size counts at least the largest
share of all served steps it has had since the version was installed: a batch size the load once
ran at for a while keeps that claim, and an island the traffic never paid for is merged as before.
"""

from __future__ import annotations

import numpy as np

MIN_STEPS = 1000
"""Served steps before a batch size's share counts towards its peak: ten rebuilds at the default
``rebuild_every_steps``, so a ramp-up's first steps (a few at each batch size up to the load) do not
stake claims; a 5 % share is then known to within 0.7 %."""


class TrafficMemory:
    """Steps served per batch size (index B - 1), each raised to the largest share of all steps it
    has held at any rebuild of this version with ``MIN_STEPS`` or more served (``weigh``)."""

    def __init__(self, n: int) -> None:
        self.peak = np.zeros(int(n))
        """Largest share of all served steps each batch size has had (0 until ``MIN_STEPS``)."""

    def weigh(self, visits: np.ndarray) -> np.ndarray:
        """``visits`` (steps served per batch size, all since the version began) with each batch size
        at least at its peak share of their total. Updates the peak first."""
        v = np.asarray(visits, dtype=float)
        total = float(v.sum())
        if total >= MIN_STEPS:
            np.maximum(self.peak, v / total, out=self.peak)
        return np.maximum(v, self.peak * total)

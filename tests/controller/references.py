"""The robust-choice references the controller's tests compare its tables with (test oracles; the
reference table itself, ``true_table``, is ``evaluation.synthetic``'s). The fake engine that drives
the controller in these tests is ``evaluation.simulator.FakeEngine``."""

from __future__ import annotations

import itertools

import numpy as np

from tabletune_pipelines.core.table import DraftTable, goodput_matrix
from tabletune_pipelines.evaluation.synthetic import N, dense


def near_best(profile, rates, ks=(0, 1, 2, 3), n: int = N, stickiness: float = 0.005) -> list[set[int]]:
    """Per B, every k whose goodput is within ``stickiness`` of the best k there: what a table may
    keep under the stickiness rule, whether its search walks B (the tuner's first search) or revises
    the table in force (the controller's)."""
    g = goodput_matrix(dense(profile, ks, n), ks, rates)
    best = g.max(axis=0)
    return [{int(k) for i, k in enumerate(ks) if best[b] <= g[i, b] * (1.0 + stickiness)} for b in range(n)]


def robust_choices(profile, rates, tol, ks=(0, 1, 2, 3), n: int = N) -> list[set[int]]:
    """Per B, every k within the stickiness of the best for some rates within ``tol`` of ``rates``
    (the box's corners and mid-points): a controller whose â is within ``tol`` must pick one of these."""
    out: list[set[int]] = [set() for _ in range(n)]
    for signs in itertools.product((-1, 0, 1), repeat=len(rates)):
        r = np.minimum.accumulate(np.clip([a + s * t for a, s, t in zip(rates, signs, tol)], 0, 1))
        for b, ks_b in enumerate(near_best(profile, r, ks, n)):
            out[b] |= ks_b
    return out


def table_dense(ranges, n: int = N) -> list[int]:
    """k per B = 1..n (index B - 1) of a table's ranges, as a list (``core.table.DraftTable.dense``)."""
    return [int(k) for k in DraftTable.from_entries([list(r) for r in ranges]).dense(n)]


def on_robust_table(ranges, choices) -> bool:
    """Whether every B of the table ``ranges`` runs one of the k ``choices`` allows there."""
    return all(k in choices[b] for b, k in enumerate(table_dense(ranges, len(choices))))

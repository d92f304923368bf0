"""The lookups the controller hands vLLM, and the table's dense/range forms, sized for the rebuild budget.

The table search itself is the offline tuner's (``core.evidence.search_with_evidence``, revising
the table in force; vectorised over B).

Lookups use vLLM's layout (``Scheduler.dynamic_sd_lookup``): a list indexed by batch size, index 0
unused, length max_num_seqs + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def compact(chosen: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """Dense k per batch size (index B - 1) → vLLM's ranges ``((start, end, k), ...)``."""
    arr = np.asarray(chosen, dtype=np.int64)
    if arr.size == 0:
        return ()
    cuts = np.flatnonzero(np.diff(arr)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [arr.size]])
    return tuple((int(s) + 1, int(e), int(arr[s])) for s, e in zip(starts, ends))


def dense_from_ranges(ranges: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """k per batch size (index B - 1) of contiguous ranges covering 1..n."""
    out = np.zeros(n, dtype=np.int64)
    for s, e, k in ranges:
        out[int(s) - 1:min(int(e), n)] = int(k)
    return out


def vllm_lookup(dense: np.ndarray) -> list[int]:
    """vLLM's lookup list (index = batch size, index 0 unused) from dense k (index B - 1)."""
    return [0, *np.asarray(dense, dtype=np.int64).tolist()]


def hysteresis_lookups(dense: np.ndarray, ks: Sequence[int], h: int) -> dict[int, list[int]]:
    """For each current k: the lookup that keeps it while B is within ``h`` of a batch size that
    uses it (``core.acceptance.BoundaryHysteresis.select`` for every B at once). Empty for h = 0."""
    if h <= 0:
        return {}
    out: dict[int, list[int]] = {}
    n = dense.size
    lo = np.clip(np.arange(n) - h, 0, n)
    hi = np.clip(np.arange(n) + h + 1, 0, n)
    for k in ks:
        # near[j]: some batch size within h of B = j + 1 uses k (a windowed count via a cumulative sum)
        cs = np.concatenate([[0], np.cumsum(dense == k)])
        near = cs[hi] - cs[lo] > 0
        out[int(k)] = vllm_lookup(np.where(near, k, dense))
    return out

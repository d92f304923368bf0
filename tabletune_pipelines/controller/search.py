"""The table search and the lookups the controller hands vLLM, sized for the rebuild budget.

``sticky_choice`` returns exactly what ``core.table.choose_draft_lengths`` returns (tests compare
both on random inputs), without its per-batch-size Python loop: the stickiness walk only changes
k where the current k stops being within ``stickiness`` of the best, so with the "next batch size
where row r stops being acceptable" precomputed for every row, the walk takes one step per range.
At max_num_seqs 1024 that is tens of microseconds instead of milliseconds.

Lookups use vLLM's layout (``Scheduler.dynamic_sd_lookup``): a list indexed by batch size, index 0
unused, length max_num_seqs + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tabletune_pipelines.core.table import goodput_matrix


def sticky_choice(step_ms_dense: np.ndarray, ks: Sequence[int], rates: Sequence[float], stickiness: float) -> np.ndarray:
    """Chosen k for B = 1..n (array of k values), same rule as ``choose_draft_lengths``.

    ``step_ms_dense[i, B-1]`` is T(B, ks[i]); every row is a candidate.
    """
    g = goodput_matrix(step_ms_dense, ks, rates)
    rows, n = g.shape
    best = g.argmax(axis=0)  # first maximum, like max() over the rows in order
    gmax = g[best, np.arange(n)]
    # ok[r, c]: keeping row r at column c is allowed (the best is not better by more than stickiness).
    ok = gmax[None, :] <= g * (1.0 + stickiness)
    idx = np.broadcast_to(np.arange(n), (rows, n))
    # next_bad[r, c]: first column >= c where row r is not acceptable (n if none).
    next_bad = np.minimum.accumulate(np.where(ok, n, idx)[:, ::-1], axis=1)[:, ::-1]
    ks_arr = np.asarray(ks, dtype=np.int64)
    chosen = np.empty(n, dtype=np.int64)
    col, cur = 0, int(best[0])
    while True:
        end = int(next_bad[cur, col + 1]) if col + 1 < n else n
        chosen[col:end] = ks_arr[cur]
        if end >= n:
            return chosen
        col, cur = end, int(best[end])


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

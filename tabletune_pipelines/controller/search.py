"""The lookups the controller hands vLLM, sized for the rebuild budget.

The table's dense and range forms are ``core.table``'s (``dense_from_ranges``, vectorised;
``compact_ranges``); ``dense_from_ranges`` is re-exported here and ``compact`` gives the ranges as
tuples.

The table search itself is the offline tuner's (``core.evidence.search_with_evidence``, revising
the table in force; vectorised over B).

Lookups use vLLM's layout (``Scheduler.dynamic_sd_lookup``): a list indexed by batch size, index 0
unused, length max_num_seqs + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tabletune_pipelines.core.table import compact_ranges, dense_from_ranges

__all__ = ["compact", "dense_from_ranges", "hysteresis_lookups", "vllm_lookup"]


def compact(chosen: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """``core.table.compact_ranges`` as tuples ``((start, end, k), ...)``, the form the controller
    compares and stores (a published file's ranges); () for no batch size."""
    return tuple((s, e, k) for s, e, k in compact_ranges(chosen)) if len(chosen) else ()


def vllm_lookup(dense: np.ndarray) -> list[int]:
    """vLLM's lookup list (index = batch size, index 0 unused) from dense k (index B - 1)."""
    return [0, *np.asarray(dense, dtype=np.int64).tolist()]


def hysteresis_lookups(dense: np.ndarray, ks: Sequence[int], h: int) -> dict[int, list[int]]:
    """For each current k: the lookup that keeps it while B is within ``h`` of a batch size that
    uses it (``core.acceptance_estimate.BoundaryHysteresis.select`` for every B at once). Empty for h = 0."""
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

"""The lookups the controller hands vLLM, sized for the rebuild budget, and the table in force
(``TableInForce``: its lookup, its hysteresis variants and the hold that limits them).

The table's dense and range forms are ``core.table.DraftTable``'s (``dense``, vectorised;
``from_dense``); ``compact`` gives the ranges as tuples, and vLLM's layout is
``core.table.vllm_layout``.

The table search itself is the offline tuner's (``core.evidence.search_with_evidence``, revising
the table in force; vectorised over B).

Lookups use vLLM's layout (``Scheduler.dynamic_sd_lookup``): a list indexed by batch size, index 0
unused, length max_num_seqs + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tabletune_pipelines.core.table import ContextLookups, DraftTable, vllm_layout

if TYPE_CHECKING:  # columns imports this module
    from tabletune_pipelines.controller.columns import Columns

__all__ = ["ContextInForce", "Lookups", "Ranges", "TableInForce", "compact", "context_state", "dense_of",
           "hysteresis_lookups", "lookups_of", "put_in_force"]

Ranges = tuple[tuple[int, int, int], ...]
"""A table as ``((start, end, k), ...)``, the form the controller compares and stores."""

Lookups = tuple[list[int] | None, dict[int, list[int]]]
"""A table's vLLM lookup and its hysteresis variants per current k (None, {}: k cannot change)."""


def compact(chosen: Sequence[int] | np.ndarray) -> Ranges:
    """``core.table.DraftTable.from_dense`` as tuples ``((start, end, k), ...)``, the form the
    controller compares and stores (a published file's ranges); () for no batch size."""
    if not len(chosen):
        return ()
    return tuple((lo, hi, k) for lo, hi, k in DraftTable.from_dense(chosen).entries())


def dense_of(ranges: Ranges, n: int) -> np.ndarray:
    """k per batch size B = 1..n (index B - 1) of the controller's ranges: ``DraftTable.dense``."""
    return DraftTable.from_entries(list(ranges)).dense(n)


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
        out[int(k)] = vllm_layout(np.where(near, k, dense))
    return out


def lookups_of(ranges: Ranges, n: int, ks: Sequence[int], h: int, *, applying: bool, controlling: bool) -> Lookups:
    """vLLM's lookup of ``ranges`` (max_num_seqs ``n``) and, while controlling, its hysteresis
    variants for the allowed ``ks`` and hysteresis ``h``; (None, {}) when k cannot change."""
    if not applying:
        return None, {}
    dense = dense_of(ranges, n)
    return vllm_layout(dense), (hysteresis_lookups(dense, ks, int(h)) if controlling else {})


class ContextInForce:
    """The (batch size x context) table in force (``lookups``; None: a batch-only table), its columns
    while they are corrected (``cols``, ``columns.Columns``; None: served as published) and the
    context bucket of the step being scheduled (``column``). Owned by ``logic.Controller``."""

    __slots__ = ("lookups", "cols", "column")

    def __init__(self) -> None:
        self.lookups: ContextLookups | None = None
        self.cols: Columns | None = None
        self.column = 0

    def install(self, lookups: ContextLookups | None, cols: Columns | None = None) -> None:
        """A new version's grid (None: batch-only) and its columns under correction (None: none)."""
        self.lookups, self.cols, self.column = lookups, cols, 0

    def locate(self, lengths: Sequence[int] | None) -> None:
        """The bucket of the running requests' KV ``lengths`` becomes the step's, without picking its
        lookup: an exploration step's drafts and time go to that bucket's column (no grid: nothing)."""
        if self.lookups is not None:
            self.column = self.lookups.column(lengths or ())

    def pick(self, lengths: Sequence[int] | None) -> list[int] | None:
        """The lookup of the bucket of the running requests' KV ``lengths`` (``lookups`` is set): the
        published column's, or the corrected column's table in force with its hysteresis."""
        assert self.lookups is not None
        col = self.column = self.lookups.column(lengths or ())  # the adapter keeps it with its SchedulerOutput
        return self.lookups.columns[col] if self.cols is None else self.cols.columns[col].table.pick()


def context_state(start: Any, served: ContextLookups | None) -> dict[str, Any]:
    """The exported state's part about a (batch size x context) table: its entries, its aggregate and
    whether it is served (``start``: the ``loader.StartPoint`` in force, or None); empty without one."""
    if start is None or start.grid is None:
        return {}
    return {"context_entries": start.grid.entries(), "ctx_agg": start.published.ctx_agg,
            "context_served": served is not None}


class TableInForce:
    """The table in force and the lookup handed to vLLM for it, with boundary hysteresis: while B is
    within h of a range that uses the current k, the current k stays (``hyst``), for at most
    ``hold`` steps in a row at batch sizes the table gives another k (docs/controller.md, "The
    control loop"). ``candidate`` is the last rebuild's table (in force only while controlling).

    Owned by ``logic.Controller`` for its life: the k in force (``cur_k``) carries over a new
    version, which ``install``s its table. ``pick`` and ``served`` run every step, allocating nothing."""

    def __init__(self, ranges: Ranges) -> None:
        self.ranges = ranges
        self.candidate = ranges
        self.lookup: list[int] | None = None
        self.hyst: dict[int, list[int]] = {}
        self.hold = 32
        """``hysteresis_hold_steps``."""
        self.cur_k: int | None = None
        """The k of the last step served outside exploration."""
        self.off_table = 0
        """Consecutive steps served at a k the table in force does not give their B."""

    def install(self, ranges: Ranges, lookups: Lookups, hold: int) -> None:
        """A new version's table (plain assignments)."""
        self.ranges = self.candidate = ranges
        self.lookup, self.hyst = lookups
        self.hold = int(hold)
        self.off_table = 0

    def revise(self, ranges: Ranges, lookups: Lookups | None) -> None:
        """A rebuild's table: the candidate, and with its ``lookups_of`` (built while controlling) the
        table in force."""
        self.candidate = ranges
        if lookups is not None:
            self.ranges, (self.lookup, self.hyst) = ranges, lookups

    def pick(self) -> list[int] | None:
        """The lookup for the next step: the hysteresis variant of the current k until the hold is
        spent, then the table's own (None: leave vLLM's as it is)."""
        if self.hyst and self.cur_k is not None:
            if self.off_table < self.hold:
                return self.hyst.get(self.cur_k, self.lookup)
            # The hold is spent: B has stayed off the k in force for hysteresis_hold_steps steps (a load
            # that sits inside a range, not one that crosses its boundary). One step of the table as it
            # is makes the table's k the current one.
            self.off_table = 0
        return self.lookup

    def served(self, b: int, k: int | None) -> None:
        """A step of ``b`` requests ran at ``k`` (not an exploration step): ``k`` becomes the current
        one; the hold counts on while the table's lookup (which vLLM consulted at ``b``) gives another."""
        self.cur_k = k
        lk = self.lookup
        if lk is not None and b < len(lk):
            self.off_table = self.off_table + 1 if k != lk[b] else 0


def put_in_force(t: TableInForce, incumbent: np.ndarray, chosen: np.ndarray, evidence: Any, flaps: Any,
                 settings: Any, allowed_k: Sequence[int], n: int, rebuild: int, rates: np.ndarray, *,
                 controlling: bool) -> tuple[Ranges, Ranges, tuple[Any, Any, float]]:
    """A rebuild's chosen k per batch size (``chosen``, revising ``incumbent``) into the table ``t``:
    a change is counted by ``flaps`` (``FlapCounter.count``) and, ``controlling``, put in force with
    its hysteresis lookups; the ``evidence`` settles (``Evidence.settle``: the step times of the k a
    batch size left are dropped only when the change is in force). The one place a search's result
    enters a table, for a batch-only table and for each column of a grid (``columns.Columns``).
    Returns (old ranges, new ranges, what ``settle`` returned)."""
    new, old = compact(chosen), t.candidate
    changed = new != old
    if changed:
        flaps.count(incumbent, chosen, rebuild)
    control = controlling and changed
    # The lookups first: if building them failed, nothing below (halving, decay) has happened.
    lookups = lookups_of(new, n, allowed_k, settings.hysteresis, applying=True, controlling=True) if control else None
    live = evidence.settle(settings, rates, (incumbent, chosen) if control and settings.step_time_correction else None)
    t.revise(new, lookups)
    return old, new, live

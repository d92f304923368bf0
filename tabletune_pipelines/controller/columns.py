"""The per-bucket correction of a (batch size x context) table in force (docs/controller.md, "A
(batch size x context) table").

Each context bucket of the published grid is one **column**: a batch-only table corrected exactly
as the controller corrects a batch-only table, from that bucket's own evidence. A column holds

* its evidence (``evidence.Evidence``): the acceptance estimator started from the rates its context
  level was searched under and the step-time model started from that level's decode surface
  (``table.context_columns`` of the published file, ``formats.context_columns``), fed only by the
  steps scheduled with that column's lookup;
* its table in force with boundary hysteresis (``search.TableInForce``);
* its flap history (``flapping.FlapCounter``).

At every rebuild each column is searched with the offline tuner's evidence rule, revising its own
table; the column's k at a batch size changes only on that column's evidence, held by its own
hysteresis and flap bounds. A k = 0 cell is judged as every other k: a lookup entry of 0, costed
against the cells at k >= 1 of the same column. Exploration runs over a grid as over a batch-only
table (one k at every batch size whatever the context), and each exploration step counts in the
column of its context bucket, so every column observes every k at the contexts it serves. A rebuild
over its budget leaves the columns it did not reach to the next rebuild, which searches them first.

Counting without a second histogram pass: drafts of every step go to the controller's one pair of
step histograms (the pooled counts, the Prometheus series); when a step's column differs from the
last step's, what the histograms gained since the last snapshot goes to the column before
(``move``, K + 1 additions, nothing allocated), as ``metrics.CellCounts`` does per cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import numpy as np

from tabletune_pipelines.controller.evidence import Evidence
from tabletune_pipelines.controller.flapping import FlapCounter
from tabletune_pipelines.controller.search import Ranges, TableInForce, dense_of, put_in_force
from tabletune_pipelines.controller.step import fold
from tabletune_pipelines.core.table import ContextLookups, DraftTable
from tabletune_pipelines.errors import InvalidTableError
from tabletune_pipelines.formats.controller_settings import ControllerSettings

Revision = tuple[Ranges, Ranges, np.ndarray, tuple[Any, Any, float]]
"""One column's rebuild: (old ranges, new ranges, the rates it was searched under, ``Evidence.settle``'s return)."""


class Column:
    """One context bucket under correction (module docstring)."""

    __slots__ = ("bucket", "evidence", "table", "flaps", "pend_d", "pend_a")

    def __init__(self, bucket: tuple[int, int], evidence: Evidence, table: TableInForce, flaps: FlapCounter) -> None:
        self.bucket = bucket
        self.evidence = evidence
        self.table = table
        self.flaps = flaps
        k = evidence.K
        self.pend_d = [0] * (k + 1)
        """Request-steps by drafts verified in this column since its last fold."""
        self.pend_a = [0] * (k + 1)


class Columns:
    """The columns of a (batch size x context) table in force. ``lookups``: the published grid's (the
    buckets and their aggregate); ``columns`` one per bucket, in bucket order. Which bucket a step
    uses is ``search.ContextInForce``'s (its ``column``)."""

    __slots__ = ("lookups", "columns", "n", "cur", "snap_d", "snap_a", "first")

    def __init__(self, lookups: ContextLookups, columns: Sequence[Column]) -> None:
        if len(columns) != len(lookups.columns):
            raise InvalidTableError(f"{len(columns)} column(s) for a grid of {len(lookups.columns)} context bucket(s)")
        self.lookups = lookups
        self.columns = tuple(columns)
        self.n = len(lookups.columns[0]) - 1
        """max_num_seqs (vLLM's lookup has index 0 unused)."""
        self.cur = 0
        """The bucket whose drafts the step histograms gather now."""
        k = columns[0].evidence.K
        self.snap_d = [0] * (k + 1)
        self.snap_a = [0] * (k + 1)
        self.first = 0
        """The column the next rebuild searches first: the one a rebuild over its budget stopped at."""

    # -- per step (the step's bucket and its lookup: ``search.ContextInForce``) -----------------------
    def enter(self, column: int, hist_d: Sequence[int], hist_a: Sequence[int]) -> None:
        """A step of bucket ``column`` is about to be counted into the step histograms: when it is
        another bucket than the last step's, the histograms' gains so far go to that one."""
        if column != self.cur:
            self.move(hist_d, hist_a)
            self.cur = column

    def move(self, hist_d: Sequence[int], hist_a: Sequence[int]) -> None:
        """What the histograms gained since the snapshot goes to the current bucket's column."""
        c = self.columns[self.cur]
        pd, pa, sd, sa = c.pend_d, c.pend_a, self.snap_d, self.snap_a
        for i in range(len(sd)):
            pd[i] += hist_d[i] - sd[i]
            pa[i] += hist_a[i] - sa[i]
            sd[i] = hist_d[i]
            sa[i] = hist_a[i]

    def before_fold(self, hist_d: Sequence[int], hist_a: Sequence[int]) -> None:
        """The step histograms are about to be folded and emptied: their gains go to the current
        column and the snapshot restarts from zero."""
        self.move(hist_d, hist_a)
        for i in range(len(self.snap_d)):
            self.snap_d[i] = self.snap_a[i] = 0

    # -- rebuild -------------------------------------------------------------------------------
    def take_counts(self) -> None:
        """Each column's pending counts into its estimator (``step.fold`` empties them)."""
        for c in self.columns:
            d, a = fold(c.pend_d, c.pend_a)
            if c.evidence.estimator is not None:
                c.evidence.estimator.observe_counts(d, a)
            c.evidence.hand_over_costs()

    def search(self, settings: ControllerSettings, allowed_k: tuple[int, ...], n: int, rebuild: int, *,
               over: Callable[[], bool]) -> tuple[list[tuple[int, Revision]], bool]:
        """Each column's evidence rule revising its table (``Evidence.search``), restrained by its flap
        history and put in force with its hysteresis lookups (``search.put_in_force``, which settles
        the column's evidence), while ``over()`` (the rebuild budget) is False, in bucket order from
        ``first``: the column a search over its budget stopped at is the next search's first, so every
        column is searched in turn however tight the budget. Returns per column searched its index and
        (old ranges, new ranges, the rates it was searched under, what its evidence's ``settle``
        returned), and whether every column was searched."""
        out: list[tuple[int, Revision]] = []
        m = len(self.columns)
        for j in range(m):
            i = (self.first + j) % m
            if j and over():  # the first column is always searched: a tight budget still moves on
                self.first = i
                return out, False
            c = self.columns[i]
            ev = c.evidence
            assert ev.estimator is not None and ev.model is not None  # prepare builds columns only with both
            rates = ev.estimator.estimate()
            incumbent = dense_of(c.table.candidate, n)
            found = ev.search(settings, allowed_k, rates, incumbent)
            chosen = c.flaps.restrain(incumbent, np.asarray(found.choice.chosen, dtype=np.int64), rebuild, found)
            old, new, live = put_in_force(c.table, incumbent, chosen, ev, c.flaps, settings, allowed_k, n, rebuild,
                                          rates, controlling=True)
            out.append((i, (old, new, rates, live)))
        self.first = 0
        return out, True

    def rebuild(self, t0: float, v: Any, counters: Any, notes: Any, steps: int, now: float, table: Ranges) -> None:
        """A rebuild of the grid (``logic.Controller.rebuild``; ``v``: the ``version.Installed`` in
        force): each column's counts and step times taken in (``take_counts``), then ``search`` within
        ``rebuild_budget_ms`` of ``t0`` (the columns not reached in it wait for the next rebuild, which
        starts with them; the skip counted once;
        ``table``: what the skip's note names), then the rebuild counted and each column's line
        (``record.Notes.rebuilt``, its bucket named)."""
        self.take_counts()
        s = v.settings
        budget = float(s.rebuild_budget_ms) / 1000.0
        results, done = self.search(s, v.allowed_k, self.n, counters.rebuilds,
                                    over=lambda: perf_counter() - t0 > budget)
        if not done:
            counters.skipped_rebuilds += 1
            notes.skipped((perf_counter() - t0) * 1000.0, s.rebuild_budget_ms, table)
        counters.rebuilt((perf_counter() - t0) * 1000.0, changed=any(r[0] != r[1] for _, r in results))
        for i, (old, new, rates, live) in results:
            c = self.columns[i]
            notes.rebuilt(counters, steps, v, (old, new), rates, live, c.evidence.model, now,
                          where=f" (context {c.bucket[0]}-{c.bucket[1]})")

    # -- what is in force ------------------------------------------------------------------------
    def grid(self, n: int) -> DraftTable:
        """The (batch size x context) table the columns hold now (equal neighbouring buckets merged)."""
        return DraftTable.from_columns([dense_of(c.table.ranges, n) for c in self.columns],
                                       [c.bucket for c in self.columns])

    def state(self, n: int) -> dict[str, Any]:
        """The exported state's part about the columns: the grid in force, and per column its bucket,
        table, acceptance estimate and step-time correction's weight."""
        cols = []
        for c in self.columns:
            est, model = c.evidence.estimator, c.evidence.model
            cols.append({"ctx": list(c.bucket), "table": [list(r) for r in c.table.ranges],
                         "rates": [round(float(x), 4) for x in est.estimate()] if est else [],
                         "live_drafted": [round(float(x), 1) for x in est.drafted] if est else [],
                         "step_time_weight": round(model.weight, 4) if model is not None else None,
                         "switches": int(c.flaps.switches.sum())})
        return {"context_table": self.grid(n).entries(), "columns": cols}

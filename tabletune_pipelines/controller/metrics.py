"""The controller's series in the Prometheus registry vLLM's ``/metrics`` serves (docs/metrics.md).

Two parts:

* ``CellCounts`` (stdlib only): what the per-step path adds. Steps are counted per cell and k, and
  the drafted and kept tokens the controller counts (``step.count_drafts``, into the evidence's
  histograms) are attributed to cells by a snapshot of those histograms taken whenever the batch size
  enters another cell. A cell is a batch-size bin (1, 2, 3-4, 5-8, ... up to max_num_seqs: at most
  13 at 4096) times a context bucket (``all`` for a batch-only table; the buckets of a (batch size x
  context) table in force, labelled ``lo-hi``), so the series stay bounded whatever the batch sizes and
  requests are. Per step: one list lookup, one comparison and one increment.
* ``PromSink``: pushes the counts and the controller's state into ``prometheus_client`` series at
  rebuilds, exports and installs (never per step). ``prometheus_client`` ships with vLLM; it is
  imported here lazily, and any failure (import, registration, a write) is logged once and turns
  the series off: it never reaches the engine.

Where the series go: vLLM serves ``/metrics`` from its API server process. When
``PROMETHEUS_MULTIPROC_DIR`` is set (vLLM sets it itself with ``--api-server-count`` > 1; set it to
an empty folder for one API server), ``prometheus_client`` writes every value to that folder and
vLLM's API server serves them through ``multiprocess.MultiProcessCollector``: the engine core
process, where the controller runs, is covered. Without it the series are registered in the
process's default registry, which vLLM serves only when the engine core runs in the API server's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); otherwise one line says how to export them.
``TABLETUNE_METRICS=0`` turns the series off.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tabletune_pipelines.controller.step import fold
from tabletune_pipelines.core.table import DraftTable

METRICS_ENV = "TABLETUNE_METRICS"
"""``0`` turns the controller's series off (default: on whenever the controller runs)."""

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTEXT_ALL = "all"
"""The context label of a batch-only table's cells: every context length."""
SOURCES = ("published", "corrected", "launch")
"""``tabletune_table_source``: the published table as published, corrected online by the
controller, or the engine's launch table (no published version in force)."""
SWITCH_REASONS = ("evidence", "published", "rollback")
REBUILD_OUTCOMES = ("changed", "unchanged", "skipped")
PREFIX = "tabletune_"


def batch_cells(n: int) -> list[tuple[int, int]]:
    """The batch-size bins of max_num_seqs ``n``: 1, 2, 3-4, 5-8, ..., the last one ending at n."""
    cells, lo, hi = [], 1, 1
    while lo <= n:
        cells.append((lo, min(hi, n)))
        lo, hi = hi + 1, hi * 2
    return cells


def cell_label(lo: int, hi: int) -> str:
    """A bin's ``batch`` label: ``"1"``, ``"3-4"``."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


class CellCounts:
    """Counts per cell since the last ``take`` (module docstring). ``max_k``: K; ``n``: max_num_seqs."""

    __slots__ = ("K", "cells", "labels", "of_b", "cur", "snap_d", "snap_a", "pend_d", "pend_a", "steps", "context",
                 "ctx_labels", "ncol")

    def __init__(self, max_k: int, n: int) -> None:
        self.K = int(max_k)
        self.cells = batch_cells(int(n))
        self.labels = [cell_label(lo, hi) for lo, hi in self.cells]
        self.of_b = [0] * (int(n) + 1)
        """Cell index per batch size (index B; 0 unused)."""
        for i, (lo, hi) in enumerate(self.cells):
            for b in range(lo, hi + 1):
                self.of_b[b] = i
        w = self.K + 1
        self.snap_d, self.snap_a = [0] * w, [0] * w
        self.set_context(None)

    def set_context(self, buckets: Sequence[tuple[int, int]] | None) -> None:
        """The context buckets of the table in force (None: batch-only, one column ``all``); the
        counts start empty (``take`` them first)."""
        self.context = None if buckets is None else tuple((int(lo), int(hi)) for lo, hi in buckets)
        self.ctx_labels = [CONTEXT_ALL] if self.context is None else [f"{lo}-{hi}" for lo, hi in self.context]
        self.ncol = len(self.ctx_labels)
        """Context buckets per batch-size bin: cell index = bin * ncol + bucket."""
        self.cur = 0
        """The cell of the steps counted since the last snapshot."""
        w, cells = self.K + 1, len(self.cells) * self.ncol
        self.pend_d = [[0] * w for _ in range(cells)]
        self.pend_a = [[0] * w for _ in range(cells)]
        self.steps = [[0] * (w + 1) for _ in range(cells)]
        """Steps per cell and k applied (the last slot: k unknown), since the last ``take``."""

    def label(self, cell: int) -> tuple[str, str]:
        """A cell's ``batch`` and ``context`` labels."""
        return self.labels[cell // self.ncol], self.ctx_labels[cell % self.ncol]

    def enter(self, b: int, k: int | None, hist_d: Sequence[int], hist_a: Sequence[int], column: int = 0) -> None:
        """A step at batch size ``b``, k ``k`` (None: the engine did not say) and context bucket
        ``column`` is about to be counted into the histograms: it is counted in its cell, and when that
        cell is another than the last step's, the histograms' gains so far go to the cell before (``move``)."""
        cell = self.of_b[b] * self.ncol + column
        if cell != self.cur:
            self.move(cell, hist_d, hist_a)
        self.steps[cell][self.K + 1 if k is None else k] += 1

    def move(self, cell: int, hist_d: Sequence[int], hist_a: Sequence[int]) -> None:
        """The next step falls in ``cell``: what the histograms gained since the snapshot belongs to
        the cell before."""
        pd, pa, sd, sa = self.pend_d[self.cur], self.pend_a[self.cur], self.snap_d, self.snap_a
        for i in range(self.K + 1):
            pd[i] += hist_d[i] - sd[i]
            pa[i] += hist_a[i] - sa[i]
            sd[i] = hist_d[i]
            sa[i] = hist_a[i]
        self.cur = cell

    def take(self, hist_d: Sequence[int], hist_a: Sequence[int]) -> tuple[list[tuple[int, list[int], list[int]]],
                                                                            list[list[int]]]:
        """Just before the histograms are folded and emptied (``Evidence.take_counts``): per cell with
        counts, (cell, drafted per position, kept per position), and the steps per cell and k; all of
        it emptied here."""
        self.move(self.cur, hist_d, hist_a)
        for i in range(self.K + 1):
            self.snap_d[i] = self.snap_a[i] = 0
        out = []
        for c in range(len(self.pend_d)):
            if any(self.pend_d[c]) or any(self.pend_a[c]):
                d, a = fold(self.pend_d[c], self.pend_a[c])  # empties the pending histograms
                out.append((c, d, a))
        steps, self.steps = self.steps, [[0] * (self.K + 2) for _ in self.steps]
        return out, steps

    def drop(self) -> None:
        """The histograms were replaced (a new version's evidence): their untaken counts are gone."""
        for c in range(len(self.pend_d)):
            for i in range(self.K + 1):
                self.pend_d[c][i] = self.pend_a[c][i] = 0
        for i in range(self.K + 1):
            self.snap_d[i] = self.snap_a[i] = 0


def table_k_per_cell(ranges: Sequence[Sequence[int]], cells: Sequence[tuple[int, int]]) -> list[int]:
    """The k a table gives most often over each cell's batch sizes (ties: the larger k)."""
    ks = DraftTable.from_entries(list(ranges)).dense(cells[-1][1]) if cells else np.zeros(0, dtype=np.int64)
    out = []
    for lo, hi in cells:
        counts = np.bincount(ks[lo - 1:hi])
        out.append(int(len(counts) - 1 - np.argmax(counts[::-1])))  # the last maximum: the larger k
    return out


class Series:
    """The metric families, built once per registry (``series_for``)."""

    def __init__(self, registry: Any, labels: Sequence[str]) -> None:
        from prometheus_client import Counter, Gauge

        base = list(labels)
        cell = [*base, "batch", "context"]
        kw = {"registry": registry}
        g = {"multiprocess_mode": "mostrecent", **kw}
        self.version = Gauge(PREFIX + "table_version", "Published table version in force (0: none, the "
                             "engine's launch table)", base, **g)
        self.source = Gauge(PREFIX + "table_source", "1 for where the table in force comes from: published "
                            "(as published), corrected (changed online by the controller), launch (the "
                            "engine's own table); 0 for the others", [*base, "source"], **g)
        self.k = Gauge(PREFIX + "k", "k the table in force gives in the cell (most common over its batch "
                       "sizes)", cell, **g)
        self.steps = Counter(PREFIX + "steps", "Engine steps counted by the controller, by cell and the k "
                             "applied (exploration and hysteresis included)", [*cell, "k"], **kw)
        self.drafted = Counter(PREFIX + "drafted_tokens", "Draft tokens verified at this position (request-"
                               "steps that drafted at least this many)", [*cell, "position"], **kw)
        self.accepted = Counter(PREFIX + "accepted_tokens", "Draft tokens kept at this position (request-"
                                "steps that kept at least this many)", [*cell, "position"], **kw)
        self.switches = Counter(PREFIX + "switches", "Batch sizes whose k changed in the table in force, "
                                "by reason: evidence (a rebuild), published (a newer published version), "
                                "rollback (a newer version re-publishing an earlier one's table and prior)",
                                [*base, "reason"], **kw)
        self.reversals = Counter(PREFIX + "reversals", "Evidence switches back to a k the batch size had "
                                 "had (flips)", base, **kw)
        self.rebuilds = Counter(PREFIX + "rebuilds", "Table rebuilds, by outcome: changed, unchanged, skipped "
                                "(over rebuild_budget_ms)", [*base, "outcome"], **kw)
        self.exploration = Counter(PREFIX + "exploration_steps", "Steps the exploration ran at a k other "
                                   "than the table's", base, **kw)
        self.refused = Counter(PREFIX + "refused_files", "Changed published files not installed (invalid, "
                               "another engine's, not newer, not installable); the table in force stayed",
                               base, **kw)
        self.errors = Counter(PREFIX + "errors", "Failures in the controller's hooks; the last good table "
                              "stayed in force", base, **kw)
        self.step_s = Gauge(PREFIX + "step_seconds", "Mean clean decode step the controller measured in the "
                            "cell at k", [*cell, "k"], **g)
        self.profile_s = Gauge(PREFIX + "profile_step_seconds", "The published profile's step over the same "
                               "batch sizes, weighted as the measured steps", [*cell, "k"], **g)


_SERIES: dict[int, Series] = {}


def series_for(registry: Any, labels: Sequence[str]) -> Series:
    """The families of ``registry`` (built at the first call; a process builds each name once)."""
    key = id(registry)
    if key not in _SERIES:
        _SERIES[key] = Series(registry, labels)
    return _SERIES[key]


class PromSink:
    """Pushes the controller's counts and state into ``Series`` (``publish``). ``labels``: vLLM's
    engine labels (``model_name``, ``engine``); ``registry``: None for the process's default one."""

    def __init__(self, labels: Mapping[str, str], cells: CellCounts, *, registry: Any = None,
                 log: logging.Logger | None = None) -> None:
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self.labels = dict(labels)
        self.lv = tuple(self.labels.values())
        self.cells = cells
        self.s = series_for(registry, tuple(self.labels))
        self.log = log or logging.getLogger("tabletune.controller")
        self.pushed: dict[str, float] = {}
        """Cumulative controller counts already pushed (counters go up by the difference)."""
        self.table: Sequence[Sequence[int]] | None = None
        """The table in force at the last ``state`` or ``installed``."""
        self.seen_tables: set[tuple[Any, ...]] = set()
        """(table, prior id) of every version installed in this process: a newer one repeating them is a rollback."""
        self.children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.k_keys: set[tuple[str, str]] = set()
        """(batch cell, context bucket) labels of the ``tabletune_k`` series in force."""
        s, lv = self.s, self.lv
        for src in SOURCES:
            s.source.labels(*lv, src)
        for r in SWITCH_REASONS:
            s.switches.labels(*lv, r)
        for o in REBUILD_OUTCOMES:
            s.rebuilds.labels(*lv, o)
        for m in (s.reversals, s.exploration, s.refused, s.errors):
            m.labels(*lv)
        s.version.labels(*lv).set(0)

    def _bump(self, key: str, total: float, child: Any) -> None:
        d = total - self.pushed.get(key, 0)
        if d > 0:
            child.inc(d)
        self.pushed[key] = max(total, self.pushed.get(key, 0))

    def counts(self, per_cell: Sequence[tuple[int, list[int], list[int]]], steps: Sequence[Sequence[int]]) -> None:
        """The counts ``CellCounts.take`` handed over."""
        s, label = self.s, self.cells.label
        for cell, drafted, kept in per_cell:
            for pos, (n_d, n_a) in enumerate(zip(drafted, kept, strict=True), start=1):
                if n_d:
                    self._child(s.drafted, (*label(cell), str(pos))).inc(n_d)
                    self._child(s.accepted, (*label(cell), str(pos))).inc(n_a)
        for c, row in enumerate(steps):
            for k, x in enumerate(row):
                if x:
                    self._child(s.steps, (*label(c), str(k) if k <= self.cells.K else "unknown")).inc(x)

    def installed(self, ctl: Any) -> None:
        """``ctl`` (a ``logic.Controller``) put a published version in force: the batch sizes whose k
        it changed are switches, of reason ``rollback`` when the version repeats the table and prior
        of a version installed before in this process, else ``published``."""
        n = len(self.cells.of_b) - 1
        old = self.table or ctl.engine.launch_ranges or ((1, n, self.cells.K),)
        new = ctl.version.table
        key = (tuple(map(tuple, new)), ctl.version.start.published.prior.prior_id)
        changed = len(DraftTable.from_entries(list(old)).diff(DraftTable.from_entries(list(new)), n))
        reason = "rollback" if key in self.seen_tables else "published"
        self.seen_tables.add(key)
        if changed:
            self.s.switches.labels(*self.lv, reason).inc(changed)

    def state(self, ctl: Any) -> None:
        """The controller's state: version, source, k per cell, cumulative counts, step times."""
        s, lv, cells = self.s, self.lv, self.cells
        v = ctl.version
        ranges = self.table = ctl.table.ranges
        s.version.labels(*lv).set(v.start.published.version if v is not None else 0)
        grid = v.start.grid if v is not None and ctl.grid.lookups is not None else None
        n = len(cells.of_b) - 1
        published = [ranges] if grid is None else [DraftTable.from_dense(grid.dense(n)[:, j]).entries()
                                                   for j in range(grid.axes.shape[1])]
        # a grid's columns under correction: each bucket's table in force (columns.Columns)
        columns = published if ctl.grid.cols is None else [c.table.ranges for c in ctl.grid.cols.columns]
        if v is None:
            src = "launch"
        else:  # in force against the file's: its batch-only table, or its grid's columns
            base = [v.table] if grid is None else published
            same = [tuple(map(tuple, c)) for c in columns] == [tuple(map(tuple, c)) for c in base]
            src = "published" if same else "corrected"
        for x in SOURCES:
            s.source.labels(*lv, x).set(1 if x == src else 0)
        k_keys: set[tuple[str, str]] = set()
        for j, column in enumerate(columns):
            for c, k in enumerate(table_k_per_cell(column, cells.cells)):
                cell = (cells.labels[c], cells.ctx_labels[j] if grid is not None else CONTEXT_ALL)
                self._child(s.k, cell).set(k)
                k_keys.add(cell)
        for cell in self.k_keys - k_keys:  # cells of another context axis are not in force: no k series
            if os.environ.get(MULTIPROC_ENV):  # the series live in files vLLM's API server reads: no removal
                # there, so the cell's k reads NaN (PromQL's max and min skip NaN)
                self._child(s.k, cell).set(math.nan)
            else:
                self.children.pop((id(s.k), cell), None)
                s.k.remove(*lv, *cell)
        self.k_keys = k_keys
        cn = ctl.counters
        self._bump("evidence", int(ctl.flaps.switches.sum()), s.switches.labels(*lv, "evidence"))
        self._bump("reversals", int(ctl.flaps.reversals), s.reversals.labels(*lv))
        self._bump("changed", cn.table_changes, s.rebuilds.labels(*lv, "changed"))
        self._bump("unchanged", cn.rebuilds - cn.table_changes, s.rebuilds.labels(*lv, "unchanged"))
        self._bump("skipped", cn.skipped_rebuilds, s.rebuilds.labels(*lv, "skipped"))
        self._bump("exploration", cn.exploration_steps, s.exploration.labels(*lv))
        self._bump("refused", ctl.watch.refused, s.refused.labels(*lv))
        self._bump("errors", cn.errors, s.errors.labels(*lv))
        model = ctl.evidence.model
        if model is not None:  # per k and cell with measured steps: sums over each cell's batch sizes at once
            starts = [lo - 1 for lo, _ in cells.cells]
            cnt = np.add.reduceat(model.count, starts, axis=1)
            live = np.add.reduceat(model.sum_ms, starts, axis=1)
            prof = np.add.reduceat(model.profile * model.count, starts, axis=1)
            for i, c in zip(*np.nonzero(cnt > 0), strict=True):
                key = (cells.labels[c], CONTEXT_ALL, str(model.ks[i]))
                self._child(s.step_s, key).set(float(live[i, c] / cnt[i, c]) / 1000.0)
                self._child(s.profile_s, key).set(float(prof[i, c] / cnt[i, c]) / 1000.0)

    def _child(self, metric: Any, key: tuple[str, ...]) -> Any:
        """``metric.labels(engine labels..., *key)``, kept (a lookup instead of the label checks)."""
        ck = (id(metric), key)
        child = self.children.get(ck)
        if child is None:
            child = self.children[ck] = metric.labels(*self.lv, *key)
        return child


class Metrics:
    """What ``logic.Controller`` drives: the per-step ``cells`` and the sink, behind one guard (the
    first failure is logged and turns the series off; serving goes on)."""

    def __init__(self, cells: CellCounts, sink: PromSink | None, log: logging.Logger) -> None:
        self.cells = cells
        self.sink = sink
        self.log = log

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        if self.sink is None:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - the series must never reach the engine
            self.sink = None
            self.log.warning("TableTune controller: its Prometheus series are off from now on: %s failed (%r); "
                             "serving goes on", what, exc)

    def take(self, hist_d: Sequence[int], hist_a: Sequence[int]) -> None:
        per_cell, steps = self.cells.take(hist_d, hist_a)
        self._guard("counting", self.sink.counts if self.sink else None, per_cell, steps)

    def state(self, ctl: Any) -> None:
        self._guard("the state", self.sink.state if self.sink else None, ctl)

    def installed(self, ctl: Any) -> None:
        self.cells.drop()  # the version before's histograms are gone with its evidence
        grid = ctl.version.start.grid if ctl.grid.lookups is not None else None
        buckets = None if grid is None else grid.axes.context
        if self.cells.context != buckets:  # other context buckets: the steps so far go out under the old ones
            per_cell, steps = self.cells.take(ctl.evidence.hist_d, ctl.evidence.hist_a)
            self._guard("counting", self.sink.counts if self.sink else None, per_cell, steps)
            self.cells.set_context(buckets)
        self._guard("an install", self.sink.installed if self.sink else None, ctl)
        self.state(ctl)


# What ``logic.Controller`` calls (``metrics`` None: no series).
def take_counts(evidence: Any, metrics: Metrics | None, *, always: bool = True) -> tuple[list[int], list[int]]:
    """``Evidence.take_counts``, the series taking the same counts per cell first."""
    if metrics is not None:
        metrics.take(evidence.hist_d, evidence.hist_a)
    return evidence.take_counts(always=always)


def note_state(metrics: Metrics | None, ctl: Any) -> None:
    """After a rebuild: the controller's state into the series."""
    if metrics is not None:
        metrics.state(ctl)


def note_install(metrics: Metrics | None, ctl: Any) -> None:
    """After a version was put in force."""
    if metrics is not None:
        metrics.installed(ctl)


def engine_labels(vllm_config: Any) -> dict[str, str]:
    """vLLM's labels of its own series: ``model_name`` (the served model name) and ``engine``
    (the data-parallel rank of this engine core)."""
    mc = getattr(vllm_config, "model_config", None)
    pc = getattr(vllm_config, "parallel_config", None)
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", "")
    if isinstance(name, (list, tuple)):
        name = name[0] if name else ""
    return {"model_name": str(name), "engine": str(int(getattr(pc, "data_parallel_rank", 0) or 0))}


def metrics_for(vllm_config: Any, max_k: int, n: int, log: logging.Logger) -> Metrics | None:
    """The series of an engine core's controller, or None (``TABLETUNE_METRICS=0``, or
    ``prometheus_client`` unusable: one line says why). Never raises."""
    if os.environ.get(METRICS_ENV, "1").strip() == "0":
        return None
    try:
        cells = CellCounts(max_k, n)
        sink = PromSink(engine_labels(vllm_config), cells, log=log)
    except Exception as exc:  # noqa: BLE001
        log.warning("TableTune controller: no Prometheus series (%r); serving goes on", exc)
        return None
    if not os.environ.get(MULTIPROC_ENV):
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            log.warning("TableTune controller: its Prometheus series stay in the engine core process, which "
                        "vLLM's /metrics does not read; start vllm with %s set to an empty folder to serve "
                        "them (docs/metrics.md)", MULTIPROC_ENV)
    return Metrics(cells, sink, log)

"""The draft-length table (``DraftTable``, on its ``Axes``), table search and stickiness
(docs/method.md, "Table search"; docs/engine-facts.md, "vLLM interfaces").

vLLM's format (``speculative_config.num_speculative_tokens_per_batch_size``) is a list of
inclusive ranges ``[[start, end, k], ...]``, or, in the vLLM versions with context buckets,
``[[bs_lo, bs_hi, ctx_lo, ctx_hi, k], ...]``. ``DraftTable.from_entries`` is the one validator: it
accepts and rejects a 3-item table exactly as
``vllm.v1.spec_decode.dynamic.utils.validate_and_normalize_dynamic_sd_schedule`` does (tests
compare both), with messages that name the bad entry, and with ``max_num_seqs`` and ``max_k``
applies the stricter check TableTune applies before publishing: no gaps, coverage of
1..max_num_seqs, and every k within the launch's ``num_speculative_tokens``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.steptime import StepTimeSurface
from tabletune_pipelines.errors import (
    EmptyProfileError,
    InvalidAcceptanceError,
    InvalidStepTimeError,
    InvalidTableError,
    InvalidValueError,
)
from tabletune_pipelines.vocab import CONTEXT_AGGREGATES, ContextAggregate

#: Keep the previous batch size's k unless another k is better by more than this fraction.
DEFAULT_STICKINESS = 0.005

def _as_int(value: Any, what: str, entry: object) -> int:
    try:
        return int(value)  # vLLM applies int() to each field, so "3" and 3.0 are accepted too
    except (TypeError, ValueError):
        raise InvalidTableError(f"table entry {entry!r}: {what} {value!r} is not an integer") from None


def _span(lo: int, hi: int) -> list[int]:
    return [lo, hi]


def vllm_layout(dense: np.ndarray | Sequence[int]) -> list[int]:
    """vLLM's lookup layout (``Scheduler.dynamic_sd_lookup``) of dense k per batch size (index
    B - 1): a list indexed by batch size, index 0 unused. The one place that writes the layout
    (``DraftTable.vllm_lookup``, and the controller's hysteresis and exploration lookups, which are
    dense k of their own)."""
    return [0, *np.asarray(dense, dtype=np.int64).tolist()]


@dataclass(frozen=True)
class Axes:
    """The grid a draft table's cells lie on: batch-size ranges, and optionally context buckets.

    Batch-size ranges are inclusive ``(lo, hi)`` pairs, sorted, non-overlapping, the first starting
    at 1; a batch size between two ranges or past the last gets the k of the range before it, as
    vLLM's lookup does. Context buckets are inclusive ``(lo, hi)`` pairs, contiguous from 1; a context
    past the last bucket falls in the last one."""

    batch: tuple[tuple[int, int], ...]
    """Inclusive ``(lo, hi)`` batch-size range of each row of the table, ascending."""
    context: tuple[tuple[int, int], ...] | None = None
    """Inclusive ``(lo, hi)`` context-length bucket of each column, contiguous from 1; None: one column
    that holds for every context (vLLM's 3-item entries)."""

    def __post_init__(self) -> None:
        if not self.batch:
            raise InvalidTableError("the table is empty; it needs at least one [start, end, k] range")
        for lo, hi in self.batch:
            if lo <= 0 or hi <= 0:
                raise InvalidTableError(f"batch-size range {_span(lo, hi)}: batch sizes must be positive")
            if lo > hi:
                raise InvalidTableError(f"batch-size range {_span(lo, hi)}: start {lo} is after end {hi}")
        for prev, cur in zip(self.batch, self.batch[1:], strict=False):
            if cur[0] <= prev[1]:
                raise InvalidTableError(f"batch-size ranges {_span(*prev)} and {_span(*cur)} overlap or are "
                                        "not ascending")
        if self.batch[0][0] != 1:
            raise InvalidTableError(f"the first batch-size range {_span(*self.batch[0])} starts at "
                                    f"{self.batch[0][0]}; it must start at 1 so every batch size has a k")
        if self.context is None:
            return
        if not self.context:
            raise InvalidTableError("the context axis is empty; it needs at least one [ctx_lo, ctx_hi] bucket")
        expect = 1
        for lo, hi in self.context:
            if lo > hi:
                raise InvalidTableError(f"context bucket {_span(lo, hi)}: start {lo} is after end {hi}")
            if lo != expect:
                raise InvalidTableError(f"context bucket {_span(lo, hi)} starts at {lo}; the buckets must be "
                                        f"contiguous from 1, so it must start at {expect}")
            expect = hi + 1

    @property
    def shape(self) -> tuple[int, int]:
        """(batch-size ranges, context buckets); a table without a context axis has one column."""
        return len(self.batch), 1 if self.context is None else len(self.context)

    def batch_row(self, b: int) -> int:
        """The row that holds batch size ``b`` (the range with the largest start <= b)."""
        if int(b) < 1:
            raise InvalidTableError(f"batch size {b!r} must be >= 1")
        return int(np.searchsorted([lo for lo, _ in self.batch], int(b), side="right")) - 1

    def context_column(self, ctx: int | None) -> int:
        """The column that holds context length ``ctx`` (the last bucket past its end); 0 without a
        context axis, where ``ctx`` is not read."""
        if self.context is None:
            return 0
        if ctx is None:
            raise InvalidTableError(f"the table has context buckets {[list(c) for c in self.context]}; "
                                    "a lookup needs the context length")
        if int(ctx) < 1:
            raise InvalidTableError(f"context length {ctx!r} must be >= 1")
        return min(int(np.searchsorted([lo for lo, _ in self.context], int(ctx), side="right")) - 1,
                   len(self.context) - 1)


def context_buckets(levels: Sequence[int], max_context: int) -> tuple[tuple[int, int], ...]:
    """The context buckets of a table measured at context ``levels`` (tokens, ascending): one bucket
    per level, contiguous from 1, split at the geometric mean of neighbouring levels (rounded down),
    the last ending at ``max_context``. Levels 256, 1024, 4096 up to 8192 give
    ``(1, 512), (513, 2048), (2049, 8192)``; one level gives ``((1, max_context),)``."""
    lv = [int(x) for x in levels]
    if not lv:
        raise InvalidTableError("no context levels: a context axis needs at least one level")
    if any(x < 1 for x in lv) or any(b <= a for a, b in zip(lv, lv[1:], strict=False)):
        raise InvalidTableError(f"context levels {lv} must be positive and strictly ascending")
    if int(max_context) < lv[-1]:
        raise InvalidTableError(f"max_context {max_context!r} is below the last context level {lv[-1]}")
    edges = [math.isqrt(a * b) for a, b in zip(lv, lv[1:], strict=False)] + [int(max_context)]
    los = [1] + [e + 1 for e in edges[:-1]]
    return tuple(zip(los, edges, strict=True))


def aggregate_context(lengths: Sequence[int] | np.ndarray, how: ContextAggregate = "mean") -> int:
    """One step's context length from its running requests' context lengths (tokens): their mean,
    median or max, rounded to the nearest token; 1 for an empty batch (the first bucket)."""
    if how not in CONTEXT_AGGREGATES:
        raise InvalidValueError(f"context aggregate {how!r} is not one of {list(CONTEXT_AGGREGATES)}")
    n = len(lengths)
    if n == 0:
        return 1
    if how == "max":
        return max(1, int(max(lengths)))
    v = float(np.median(lengths)) if how == "median" else float(sum(lengths)) / n
    return max(1, int(v + 0.5))


@dataclass(frozen=True)
class TableChange:
    """One cell where two tables give different k (``DraftTable.diff``)."""

    batch_size: int
    """The batch size."""
    context: tuple[int, int] | None
    """The inclusive context bucket (None: neither table has a context axis)."""
    before: int
    """The k of the table ``diff`` is called on."""
    after: int
    """The k of the other table."""


@dataclass(frozen=True)
class DraftTable:
    """A draft-length table: k per (batch-size range, context bucket), the one home of the table's
    shape. Read from and written to vLLM's entries (``from_entries``, ``entries``): 3-item
    ``[bs_lo, bs_hi, k]`` (every context) or 5-item ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]``, never
    both in one table; expanded into vLLM's dense lookup (``dense``, ``vllm_lookup``)."""

    axes: Axes
    """The batch-size ranges and context buckets."""
    ks: tuple[tuple[int, ...], ...]
    """``ks[i][j]``: k of batch-size range i and context bucket j (one column without a context axis)."""

    def __post_init__(self) -> None:
        rows, cols = self.axes.shape
        if len(self.ks) != rows or any(len(r) != cols for r in self.ks):
            raise InvalidTableError(f"the table's k grid {[list(r) for r in self.ks]} is not {rows} x {cols} "
                                    "(one k per batch-size range and context bucket)")
        for row, (lo, hi) in zip(self.ks, self.axes.batch, strict=True):
            for k in row:
                if k < 0:
                    raise InvalidTableError(f"range {_span(lo, hi)}: k = {k} must be >= 0")

    # -- the wire form ---------------------------------------------------------------------------

    @classmethod
    def from_entries(cls, entries: object, *, max_num_seqs: int | None = None, max_k: int | None = None,
                     allow_context: bool = False) -> DraftTable:
        """The one table validator. vLLM's rules always: accepts and rejects a 3-item table exactly as
        ``vllm.v1.spec_decode.dynamic.utils.validate_and_normalize_dynamic_sd_schedule`` does (tests
        compare both), with messages that name the bad entry. With ``allow_context``, 5-item entries
        too: a rectangular grid of batch-size ranges by context buckets contiguous from 1, the two
        forms never mixed. With ``max_num_seqs`` and ``max_k``, TableTune's stricter rules before
        publishing: no gaps, coverage of exactly 1..max_num_seqs, and every k <= max_k."""
        if entries is None:
            raise InvalidTableError("the table is missing (num_speculative_tokens_per_batch_size is None)")
        if not isinstance(entries, list):
            raise InvalidTableError(f"the table must be a non-empty list of [start, end, k] entries, got "
                                    f"{type(entries).__name__}: {entries!r}")
        if not entries:
            raise InvalidTableError("the table is empty; it needs at least one [start, end, k] range")
        widths = (3, 5) if allow_context else (3,)
        parsed: list[tuple[int, ...]] = []
        for entry in entries:
            if not isinstance(entry, list | tuple) or len(entry) not in widths:
                raise InvalidTableError(
                    f"table entry {entry!r} must be a 3-item [start, end, k] sequence"
                    + (" or a 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, k] one" if allow_context else ""))
            names = ("start", "end", "k") if len(entry) == 3 else ("start", "end", "ctx_lo", "ctx_hi", "k")
            row = tuple(_as_int(v, what, entry) for v, what in zip(entry, names, strict=True))
            start, end, k = row[0], row[1], row[-1]
            if start <= 0 or end <= 0:
                raise InvalidTableError(f"table entry {list(entry)!r}: batch sizes must be positive")
            if start > end:
                raise InvalidTableError(f"table entry {list(entry)!r}: start {start} is after end {end}")
            if len(row) == 5 and (row[2] <= 0 or row[2] > row[3]):
                raise InvalidTableError(f"table entry {list(entry)!r}: context bucket {row[2]}..{row[3]} must be "
                                        "positive and ascending")
            if k < 0:
                raise InvalidTableError(f"table entry {list(entry)!r}: k = {k} must be >= 0")
            if parsed and len(row) != len(parsed[0]):
                raise InvalidTableError(f"table entries {list(parsed[0])} and {list(entry)!r} mix 3-item and 5-item "
                                        "forms; a table uses one")
            parsed.append(row)
        parsed.sort(key=lambda e: e[0])
        table = cls._from_parsed(parsed)
        if max_num_seqs is not None and max_k is not None:
            table._check_publishable(max_num_seqs, max_k)
        return table

    @classmethod
    def _from_parsed(cls, parsed: list[tuple[int, ...]]) -> DraftTable:
        """Sorted entries (all 3-item or all 5-item) → the table; overlaps, the start at 1, the
        rectangular grid and the context buckets checked with messages naming the entries."""
        if len(parsed[0]) == 3:
            for prev, cur in zip(parsed, parsed[1:], strict=False):
                if cur[0] <= prev[1]:
                    raise InvalidTableError(f"table ranges {list(prev)} and {list(cur)} overlap")
            if parsed[0][0] != 1:
                raise InvalidTableError(f"the first range {list(parsed[0])} starts at {parsed[0][0]}; it must start "
                                        "at 1 so every batch size has a k")
            return cls(Axes(tuple((s, e) for s, e, _ in parsed)), tuple((k,) for _, _, k in parsed))
        rows: dict[tuple[int, int], dict[tuple[int, int], int]] = {}
        for s, e, c0, c1, k in parsed:
            cells = rows.setdefault((s, e), {})
            if (c0, c1) in cells:
                raise InvalidTableError(f"table entry {[s, e, c0, c1, k]} repeats the cell "
                                        f"{[s, e, c0, c1, cells[(c0, c1)]]}")
            cells[(c0, c1)] = k
        batch = sorted(rows)
        buckets = sorted(rows[batch[0]])
        for b in batch[1:]:
            if sorted(rows[b]) != buckets:
                raise InvalidTableError(f"batch-size range {list(b)} has context buckets "
                                        f"{[list(c) for c in sorted(rows[b])]}, range {list(batch[0])} has "
                                        f"{[list(c) for c in buckets]}: the grid must be rectangular")
        return cls(Axes(tuple(batch), tuple(buckets)), tuple(tuple(rows[b][c] for c in buckets) for b in batch))

    def _check_publishable(self, max_num_seqs: int, max_k: int) -> None:
        """TableTune's rules on top of vLLM's: contiguous ranges covering exactly 1..max_num_seqs, k <= max_k."""
        rows = self._rows()
        for i, (prev, cur) in enumerate(zip(self.axes.batch, self.axes.batch[1:], strict=False)):
            if cur[0] != prev[1] + 1:
                raise InvalidTableError(
                    f"gap between ranges {rows[i]} and {rows[i + 1]}: batch sizes {prev[1] + 1}..{cur[0] - 1} "
                    "have no k (vLLM would silently carry the previous k forward)")
        last = self.axes.batch[-1]
        if last[1] != max_num_seqs:
            raise InvalidTableError(f"the last range {rows[-1]} ends at {last[1]}, but the table must end at "
                                    f"max_num_seqs = {max_num_seqs}")
        for entry in self.entries():
            if entry[-1] > max_k:
                raise InvalidTableError(f"range {entry} asks for k = {entry[-1]} but the launch allows at most "
                                        f"num_speculative_tokens = {max_k}")

    def _rows(self) -> list[list[int]]:
        """Each batch-size range as it is named in messages: ``[start, end, k]`` without a context
        axis, ``[start, end]`` with one."""
        if self.axes.context is None:
            return [[lo, hi, row[0]] for (lo, hi), row in zip(self.axes.batch, self.ks, strict=True)]
        return [[lo, hi] for lo, hi in self.axes.batch]

    def entries(self) -> list[list[int]]:
        """vLLM's entries, sorted: ``[bs_lo, bs_hi, k]`` without a context axis, else
        ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]`` per cell (batch-size range first)."""
        if self.axes.context is None:
            return [[lo, hi, row[0]] for (lo, hi), row in zip(self.axes.batch, self.ks, strict=True)]
        return [[lo, hi, c0, c1, k] for (lo, hi), row in zip(self.axes.batch, self.ks, strict=True)
                for (c0, c1), k in zip(self.axes.context, row, strict=True)]

    def entry_tuples(self) -> tuple[tuple[int, ...], ...]:
        """``entries`` as tuples (the form the controller compares and stores)."""
        return tuple(tuple(e) for e in self.entries())

    # -- cells and lookups -----------------------------------------------------------------------

    def cell(self, row: int, column: int = 0) -> int:
        """The k of batch-size range ``row`` and context bucket ``column``."""
        rows, cols = self.axes.shape
        if not (0 <= row < rows and 0 <= column < cols):
            raise InvalidTableError(f"cell ({row}, {column}) is outside the table's {rows} x {cols} grid")
        return self.ks[row][column]

    def k_at(self, b: int, ctx: int | None = None) -> int:
        """The k vLLM runs at batch size ``b`` and context length ``ctx`` (read only with a context
        axis): the range with the largest start <= b, so a gap or the tail past the last range carries
        the previous k forward."""
        return self.ks[self.axes.batch_row(b)][self.axes.context_column(ctx)]

    def allowed_ks(self) -> list[int]:
        """The k values the table uses, ascending: the controller's candidates by default (V2 captures
        CUDA graphs only for those)."""
        return sorted({k for row in self.ks for k in row})

    def dense(self, n: int, max_k: int | None = None) -> np.ndarray:
        """k per batch size B = 1..n (index B - 1), one column per context bucket with a context axis
        (shape (n,) without one, (n, buckets) with one): ``k_at`` for every B, vectorised (the
        controller's rebuilds call it); k capped at ``max_k`` when given."""
        cols = self.axes.shape[1]
        if n <= 0:
            return np.zeros((0,) if self.axes.context is None else (0, cols), dtype=np.int64)
        starts = np.asarray([lo for lo, _ in self.axes.batch], dtype=np.int64)
        idx = np.searchsorted(starts, np.arange(1, n + 1), side="right") - 1
        out = np.asarray(self.ks, dtype=np.int64)[idx]
        out = out[:, 0] if self.axes.context is None else out
        return out if max_k is None else np.minimum(out, max_k)

    def vllm_lookup(self, max_num_seqs: int, max_k: int | None = None) -> list:
        """vLLM's dense lookup: a list indexed by batch size, index 0 unused, length max_num_seqs + 1
        (``Scheduler.dynamic_sd_lookup``; equal to vLLM's ``build_dynamic_sd_schedule_lookup``, tests
        compare both); with a context axis each item is the list of k per context bucket. k capped at
        ``max_k`` when given."""
        if max_num_seqs <= 0 or (max_k is not None and max_k <= 0):
            raise InvalidTableError(f"max_num_seqs = {max_num_seqs} and max_k = {max_k} must both be > 0")
        d = self.dense(max_num_seqs, max_k)
        return vllm_layout(d) if self.axes.context is None else [[0] * self.axes.shape[1], *d.tolist()]

    @classmethod
    def from_dense(cls, ks: Sequence[int] | np.ndarray,
                   context: Sequence[tuple[int, int]] | None = None) -> DraftTable:
        """Dense k per batch size (index B - 1; with ``context``, one column per bucket) → the table
        with one range per run of equal k: the one compaction of the dense form (vectorised)."""
        arr = np.asarray(ks, dtype=np.int64)
        arr = arr.reshape(-1) if context is None else arr.reshape(arr.shape[0], -1) if arr.size else arr
        if arr.shape[0] == 0:
            raise InvalidTableError("cannot build a table for zero batch sizes")
        if context is None:
            starts, ends = range_bounds(arr)
        else:
            cuts = np.flatnonzero(np.any(np.diff(arr, axis=0) != 0, axis=1)) + 1
            starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts, [arr.shape[0]]])
        batch = tuple((int(s) + 1, int(e)) for s, e in zip(starts, ends, strict=True))
        ctx = None if context is None else tuple((int(a), int(b)) for a, b in context)
        rows = tuple((int(arr[s]),) if context is None else tuple(int(x) for x in arr[s]) for s in starts)
        return cls(Axes(batch, ctx), rows)

    @classmethod
    def from_columns(cls, columns: Sequence[Sequence[int] | np.ndarray],
                     buckets: Sequence[tuple[int, int]]) -> DraftTable:
        """Dense k per batch size of each context bucket (``columns[j][B - 1]``: the k of bucket j at
        batch size B) → the table, adjacent buckets whose k agree at every batch size merged into one
        bucket that spans both. One bucket left: a table without a context axis (vLLM's 3-item form),
        exactly ``from_dense`` of that column."""
        if len(columns) != len(buckets) or not columns:
            raise InvalidTableError(f"{len(columns)} column(s) of k for {len(buckets)} context bucket(s) "
                                    f"{[list(b) for b in buckets]}: a table needs one column per bucket, at least one")
        cols = [np.asarray(c, dtype=np.int64).reshape(-1) for c in columns]
        if any(c.shape != cols[0].shape for c in cols):
            raise InvalidTableError(f"the context buckets' columns cover {[int(c.size) for c in cols]} batch sizes; "
                                    "every bucket needs k at the same batch sizes")
        kept: list[np.ndarray] = []
        spans: list[tuple[int, int]] = []
        for col, (lo, hi) in zip(cols, buckets, strict=True):
            if kept and np.array_equal(kept[-1], col):
                spans[-1] = (spans[-1][0], int(hi))
            else:
                kept.append(col)
                spans.append((int(lo), int(hi)))
        if len(kept) == 1:
            Axes(((1, max(1, int(kept[0].size))),), tuple(spans))  # the buckets are still checked
            return cls.from_dense(kept[0])
        return cls.from_dense(np.stack(kept, axis=1), spans)

    def diff(self, other: DraftTable, n: int | None = None) -> tuple[TableChange, ...]:
        """Every (batch size, context bucket) where ``other`` gives another k, over batch sizes
        1..n (default: to the end of the longer table) and the buckets both tables' edges cut
        (a table without a context axis gives its k in every bucket); ascending by batch size."""
        n = max(self.axes.batch[-1][1], other.axes.batch[-1][1]) if n is None else int(n)
        edges = sorted({lo for t in (self, other) if t.axes.context is not None for lo, _ in t.axes.context})
        highs = {lo: hi for t in (self, other) if t.axes.context is not None for lo, hi in t.axes.context}
        buckets: list[tuple[int, int] | None] = [None] if not edges else [
            (lo, (edges[i + 1] - 1) if i + 1 < len(edges) else max(highs[lo], *highs.values()))
            for i, lo in enumerate(edges)]

        def grid(t: DraftTable) -> np.ndarray:
            d = t.dense(n)
            if t.axes.context is None:
                return np.repeat(d.reshape(-1, 1), len(buckets), axis=1)
            # t has a context axis, so its buckets' lows are among ``edges``: no bucket is None here
            columns = np.array([t.axes.context_column(c[0]) for c in buckets if c is not None], dtype=np.intp)
            return d[:, columns]

        a, b = grid(self), grid(other)
        return tuple(TableChange(int(i) + 1, buckets[j], int(a[i, j]), int(b[i, j]))
                     for i, j in zip(*np.nonzero(a != b), strict=True))



@dataclass(frozen=True)
class ContextLookups:
    """A (batch size x context) table as an engine serves it: one vLLM lookup per context bucket,
    built once per table (``context_lookups``), and the rule that picks a step's bucket. The one
    column picker: the controller's scheduler and the timing scheduler both serve a grid with it."""

    axes: Axes
    """The table's batch-size ranges and context buckets."""
    agg: ContextAggregate
    """How a step's context length is taken from its running requests' (``aggregate_context``)."""
    columns: tuple[list[int], ...]
    """vLLM's lookup (``vllm_layout``) of each context bucket's column, in bucket order."""

    def step(self, lengths: Sequence[int]) -> tuple[int, int]:
        """(context length, bucket) of a step whose running requests hold ``lengths`` tokens of KV
        cache: their aggregate and its ``axes.context_column`` (context 1, the first bucket, for no request)."""
        ctx = aggregate_context(lengths, self.agg)
        return ctx, self.axes.context_column(ctx)

    def column(self, lengths: Sequence[int]) -> int:
        """The bucket of a step whose running requests hold ``lengths`` tokens of KV cache (``step``)."""
        return self.step(lengths)[1]


def context_lookups(grid: DraftTable, n: int, max_k: int, agg: ContextAggregate) -> ContextLookups:
    """The lookups of ``grid`` (a table with a context axis) for max_num_seqs ``n``, k capped at ``max_k``."""
    dense = grid.dense(n, max_k)
    return ContextLookups(grid.axes, agg, tuple(vllm_layout(dense[:, j]) for j in range(dense.shape[1])))


def range_bounds(ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense k per batch size (a non-empty 1-d array) → (first index, index past the last) of each
    range of equal k, as arrays: the one place that finds a table's ranges (``compact_ranges`` and
    the evidence search's merge of narrow ranges read them from here)."""
    cuts = np.flatnonzero(np.diff(ks)) + 1
    return np.concatenate([[0], cuts]), np.concatenate([cuts, [ks.size]])


def goodput_matrix(step_ms_dense: np.ndarray, ks: Sequence[int], rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """G[i, B-1] = B * tau(ks[i]) / T[i, B-1] in tokens per second."""
    taus = tau_curve(rates)
    if max(ks) >= len(taus):
        raise InvalidAcceptanceError(f"k = {max(ks)} needs {max(ks)} acceptance rates, only {len(taus) - 1} given")
    t = np.asarray(step_ms_dense, dtype=float)
    if t.shape[0] != len(ks):
        raise InvalidStepTimeError(f"step times have {t.shape[0]} rows for {len(ks)} k values")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise InvalidStepTimeError("step times must be finite and positive")
    b = np.arange(1, t.shape[1] + 1, dtype=float)
    return b[None, :] * taus[list(ks)][:, None] / (t / 1000.0)


@dataclass(frozen=True)
class TableChoice:
    """The outcome of a table search: chosen k per batch size and the goodput behind it."""

    ks: tuple[int, ...]
    """Candidate k values (rows of ``goodput``)."""
    chosen: tuple[int, ...]
    """Chosen k for B = 1..max_num_seqs."""
    goodput: np.ndarray
    """Predicted tokens/s, shape (len(ks), max_num_seqs)."""

    @property
    def ranges(self) -> list[list[int]]:
        """The chosen k as vLLM's ``[[start, end, k], ...]`` (``DraftTable.from_dense``)."""
        return DraftTable.from_dense(self.chosen).entries()

    def loss_vs_best(self) -> np.ndarray:
        """Per batch size, 1 - G(chosen) / max_k G: what stickiness gave away (≤ 0.5%)."""
        idx = [self.ks.index(k) for k in self.chosen]
        cols = np.arange(len(self.chosen))
        return 1.0 - self.goodput[idx, cols] / self.goodput.max(axis=0)

    def worst_loss_vs_fixed(self) -> float:
        """Predicted worst loss over B against the best *fixed* k for that B (docs/method.md, "Table search")."""
        return float(self.loss_vs_best().max())


def choose_draft_lengths(
    step_ms_dense: np.ndarray,
    ks: Sequence[int],
    rates: Sequence[float] | np.ndarray,
    *,
    allowed_ks: Iterable[int] | None = None,
    stickiness: float = DEFAULT_STICKINESS,
) -> TableChoice:
    """Pick the goodput-best k per batch size with the stickiness rule.

    ``step_ms_dense[i, B-1]`` is T(B, ks[i]). Walking B upwards, the previous B's k is kept
    unless another allowed k beats it by more than ``stickiness`` (0.5%), so near-ties do not
    fragment the table into many ranges.
    """
    ks = tuple(int(k) for k in ks)
    if stickiness < 0:
        raise InvalidValueError(f"stickiness = {stickiness!r} must be >= 0")
    allowed = set(ks) if allowed_ks is None else {int(k) for k in allowed_ks}
    rows = [i for i, k in enumerate(ks) if k in allowed]
    if not rows:
        raise EmptyProfileError(f"none of the allowed k values {sorted(allowed)} was profiled (profiled: {list(ks)})")
    g = goodput_matrix(step_ms_dense, ks, rates)
    chosen: list[int] = []
    prev: int | None = None
    for col in range(g.shape[1]):
        best = max(rows, key=lambda i: g[i, col])
        if prev is not None and g[best, col] <= g[prev, col] * (1.0 + stickiness):
            pick = prev
        else:
            pick = best
        chosen.append(ks[pick])
        prev = pick
    return TableChoice(ks=ks, chosen=tuple(chosen), goodput=g)


def build_table(
    surface: StepTimeSurface,
    rates: Sequence[float],
    max_num_seqs: int,
    *,
    allowed_ks: Iterable[int] | None = None,
    stickiness: float = DEFAULT_STICKINESS,
    step_ms_dense: np.ndarray | None = None,
) -> TableChoice:
    """Table search on a measured surface (interpolated to every B in 1..max_num_seqs).

    ``step_ms_dense`` overrides the interpolated times, e.g. with the accepted-work correction.
    """
    dense = surface.dense(max_num_seqs) if step_ms_dense is None else step_ms_dense
    return choose_draft_lengths(dense, surface.ks, rates, allowed_ks=allowed_ks, stickiness=stickiness)

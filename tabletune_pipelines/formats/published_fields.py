"""The published-table reader's field checks: each raises ``PublishedTableError`` naming the file
(``where``) and the key. The strict reader (``formats.published``) and the readers of its larger
sections use them; stdlib, numpy-only ``core.table`` and ``options`` only, as the reader itself.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import InvalidTableError, PublishedTableError
from tabletune_pipelines.options import STEP_MS, Bound, check_value


def fail(where: str, msg: str) -> PublishedTableError:
    return PublishedTableError(f"published table {where}: {msg}")


def int_field(where: str, key: str, v: Any, lo: int | None = None) -> int:
    if type(v) is not int:
        raise fail(where, f"{key} = {v!r} must be an integer")
    if lo is not None and v < lo:
        raise fail(where, f"{key} = {v} must be >= {lo}")
    return v


def num_field(where: str, key: str, v: Any) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise fail(where, f"{key} = {v!r} must be a finite number")
    return float(v)


def bounded_field(where: str, bound: Bound, key: str, v: Any) -> Any:
    """``v`` within ``bound`` (``options.Bound``, the one rule of every number), else a ``PublishedTableError``."""
    return check_value(bound, key, v, where=f"published table {where}", error=PublishedTableError)


@overload
def str_field(where: str, key: str, v: Any, *, allow_none: Literal[False] = False) -> str: ...


@overload
def str_field(where: str, key: str, v: Any, *, allow_none: bool) -> str | None: ...


def str_field(where: str, key: str, v: Any, *, allow_none: bool = False) -> str | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or not v or "\n" in v:
        raise fail(where, f"{key} = {v!r} must be a non-empty one-line string")
    return v


def obj_field(where: str, key: str, v: Any, allowed: set[str] | frozenset[str] | None = None) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise fail(where, f"{key} must be a JSON object, got {type(v).__name__}")
    if allowed is not None:
        unknown = sorted(set(v) - allowed)
        if unknown:
            raise fail(where, f"{key} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return v


def rates_field(where: str, key: str, v: Any) -> tuple[float, ...]:
    if not isinstance(v, list):
        raise fail(where, f"{key} must be a list of acceptance rates, got {type(v).__name__}")
    out = tuple(num_field(where, f"{key}[{i}]", x) for i, x in enumerate(v))
    for i, a in enumerate(out):
        if not 0.0 <= a <= 1.0:
            raise fail(where, f"{key}[{i}] = {a!r} is outside [0, 1]")
        if i and a > out[i - 1] + 1e-9:
            raise fail(where, f"{key}[{i}] = {a!r} > {key}[{i - 1}] = {out[i - 1]!r}; survival rates must be "
                               "non-increasing with position")
    return out


def _integer_entries(where: str, key: str, entries: Any, width: int, shape: str) -> list[list[int]]:
    """The strict JSON shape of a table's entries at ``key``: a non-empty list of ``width``-item lists
    of integers (no booleans, floats or strings, which vLLM's ``int()`` would accept)."""
    if not isinstance(entries, list) or not entries:
        raise fail(where, f"{key} must be a non-empty list of {shape}, got {entries!r:.80}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, list) or len(entry) != width:
            raise fail(where, f"{key}[{i}] = {entry!r:.80} must be a {shape} list")
        for j, x in enumerate(entry):
            int_field(where, f"{key}[{i}][{j}]", x)
    return entries


def _table(where: str, key: str, entries: list[list[int]], max_num_seqs: int, max_k: int, *,
           context: bool) -> DraftTable:
    """``entries`` by the publish gate's rules (``core.table.DraftTable.from_entries``, the one table
    validator), its finding one line naming ``key``."""
    try:
        return DraftTable.from_entries(entries, max_num_seqs=max_num_seqs, max_k=max_k, allow_context=context)
    except InvalidTableError as exc:
        raise fail(where, f"{key}: {exc}") from None


def validate_ranges(where: str, ranges: Any, max_num_seqs: int, max_k: int) -> tuple[tuple[int, int, int], ...]:
    """``table.ranges`` of a file: ``[start, end, k]`` lists of integers, by the publish gate's rules."""
    key = "table.ranges"
    table = _table(where, key, _integer_entries(where, key, ranges, 3, "[start, end, k]"), max_num_seqs, max_k,
                   context=False)
    return tuple((lo, hi, k) for lo, hi, k in table.entries())  # 3-item entries: no context axis


Buckets = tuple[tuple[int, int], ...]
"""Context buckets, inclusive tokens, contiguous from 1."""


def validate_context_entries(where: str, entries: Any, max_num_seqs: int,
                             max_k: int) -> tuple[tuple[tuple[int, int, int, int, int], ...], Buckets]:
    """``table.context_entries`` of a file: 5-item ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]`` lists of
    integers, a rectangular grid with context buckets contiguous from 1 and the publish gate's
    batch-size rules. Returns the entries sorted as ``entries()`` and the grid's context buckets."""
    key = "table.context_entries"
    shape = "[bs_lo, bs_hi, ctx_lo, ctx_hi, k]"
    table = _table(where, key, _integer_entries(where, key, entries, 5, shape), max_num_seqs, max_k, context=True)
    return tuple((a, b, c, d, k) for a, b, c, d, k in table.entries()), tuple(table.axes.context or ())


def key_int(key: Any) -> int | None:
    """A JSON key that spells a small non-negative integer in ASCII digits (``"²"`` is a digit to
    ``str.isdigit`` but not to ``int``), else None."""
    return int(key) if isinstance(key, str) and 0 < len(key) <= 9 and key.isascii() and key.isdigit() else None


def step_ms_field(where: str, v: Any, max_k: int, key: str = "table.step_ms") -> dict[int, dict[int, float]]:
    """A step-time surface ``{k: {B: ms}}`` (string keys) at ``key``: k in 0..max_k, B >= 1, every
    time positive and inside ``options.STEP_MS``."""
    out: dict[int, dict[int, float]] = {}
    for ks, row in obj_field(where, key, v).items():
        k = key_int(ks)
        if k is None or k > max_k:
            raise fail(where, f"{key} key {ks!r:.40} must be a k in 0..{max_k}")
        cells: dict[int, float] = {}
        for bs, ms in obj_field(where, f"{key}[{ks}]", row).items():
            b = key_int(bs)
            if b is None or b < 1:
                raise fail(where, f"{key}[{ks}] key {bs!r:.40} must be a batch size >= 1")
            t = num_field(where, f"{key}[{ks}][{bs}]", ms)
            if t <= 0:
                raise fail(where, f"{key}[{ks}][{bs}] = {t!r} ms must be positive")
            bounded_field(where, STEP_MS, f"{key}[{ks}][{bs}]", t)  # near zero or beyond any step: refused
            cells[b] = t
        out[k] = cells
    return out


def counts_field(where: str, key: str, v: Any, n: int) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise fail(where, f"{key} must be a list of counts")
    out = tuple(int_field(where, f"{key}[{i}]", x, 0) for i, x in enumerate(v))
    if out and len(out) != n:
        raise fail(where, f"{key} has {len(out)} entries; the rates have {n}")
    return out


def bool_field(where: str, key: str, v: Any) -> bool:
    if type(v) is not bool:
        raise fail(where, f"{key} = {v!r:.40} must be true or false")
    return v


def opt_num_field(where: str, key: str, v: Any, lo: float | None = None) -> float | None:
    if v is None:
        return None
    x = num_field(where, key, v)
    if lo is not None and x < lo:
        raise fail(where, f"{key} = {x!r} must be >= {lo:g}")
    return x

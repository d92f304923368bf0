"""Table search, stickiness, compaction to vLLM's ranges, and validation (docs/method.md, "Table search";
docs/engine-facts.md, "vLLM interfaces").

vLLM's format (``speculative_config.num_speculative_tokens_per_batch_size``) is a list of
inclusive ranges ``[[start, end, k], ...]``. ``validate_vllm_schedule`` accepts and rejects
exactly what ``vllm.v1.spec_decode.dynamic.utils.validate_and_normalize_dynamic_sd_schedule``
does (tests compare both), with messages that name the bad entry. ``validate_table`` is the
stricter check TableTune applies before publishing: no gaps, coverage of 1..max_num_seqs, and
every k within the launch's ``num_speculative_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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

#: Keep the previous batch size's k unless another k is better by more than this fraction.
DEFAULT_STICKINESS = 0.005

Schedule = list[tuple[int, int, int]]


def _as_int(value: object, what: str, entry: object) -> int:
    try:
        return int(value)  # vLLM applies int() to each field, so "3" and 3.0 are accepted too
    except (TypeError, ValueError):
        raise InvalidTableError(f"table entry {entry!r}: {what} {value!r} is not an integer") from None


def validate_vllm_schedule(table: object) -> Schedule:
    """Accept/reject exactly like vLLM's validator; return the entries sorted by start."""
    if table is None:
        raise InvalidTableError("the table is missing (num_speculative_tokens_per_batch_size is None)")
    if not isinstance(table, list):
        raise InvalidTableError(
            f"the table must be a non-empty list of [start, end, k] entries, got {type(table).__name__}: {table!r}"
        )
    if not table:
        raise InvalidTableError("the table is empty; it needs at least one [start, end, k] range")
    parsed: Schedule = []
    for entry in table:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise InvalidTableError(f"table entry {entry!r} must be a 3-item [start, end, k] sequence")
        start = _as_int(entry[0], "start", entry)
        end = _as_int(entry[1], "end", entry)
        k = _as_int(entry[2], "k", entry)
        if start <= 0 or end <= 0:
            raise InvalidTableError(f"table entry {list(entry)!r}: batch sizes must be positive")
        if start > end:
            raise InvalidTableError(f"table entry {list(entry)!r}: start {start} is after end {end}")
        if k < 0:
            raise InvalidTableError(f"table entry {list(entry)!r}: k = {k} must be >= 0")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous = None
    for entry in parsed:
        if previous is not None and entry[0] <= previous[1]:
            raise InvalidTableError(f"table ranges {list(previous)} and {list(entry)} overlap")
        previous = entry
    if parsed[0][0] != 1:
        raise InvalidTableError(
            f"the first range {list(parsed[0])} starts at {parsed[0][0]}; it must start at 1 so every "
            "batch size has a k"
        )
    return parsed


def validate_table(table: object, max_num_seqs: int, max_k: int) -> Schedule:
    """vLLM's rules plus TableTune's: contiguous ranges covering exactly 1..max_num_seqs, k <= max_k."""
    parsed = validate_vllm_schedule(table)
    for prev, cur in zip(parsed, parsed[1:]):
        if cur[0] != prev[1] + 1:
            raise InvalidTableError(
                f"gap between ranges {list(prev)} and {list(cur)}: batch sizes {prev[1] + 1}..{cur[0] - 1} "
                "have no k (vLLM would silently carry the previous k forward)"
            )
    last = parsed[-1]
    if last[1] != max_num_seqs:
        raise InvalidTableError(
            f"the last range {list(last)} ends at {last[1]}, but the table must end at max_num_seqs = {max_num_seqs}"
        )
    for entry in parsed:
        if entry[2] > max_k:
            raise InvalidTableError(
                f"range {list(entry)} asks for k = {entry[2]} but the launch allows at most "
                f"num_speculative_tokens = {max_k}"
            )
    return parsed


def dense_from_ranges(ranges: Sequence[Sequence[int]], n: int, max_k: int | None = None) -> np.ndarray:
    """k per batch size B = 1..n (index B - 1) of ranges ``[[start, end, k], ...]``: the one expansion
    of a table's range form into its dense form (vectorised; the controller's rebuilds call it).

    B gets the k of the range with the largest start <= B, so a gap or the tail past the last range
    carries the previous k forward, as vLLM's ``build_dynamic_sd_schedule_lookup`` does; k is capped
    at ``max_k`` when given; a B below every start gets 0. The ranges are not validated here
    (``expand_table`` validates first).
    """
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    arr = np.asarray([[int(r[0]), int(r[2])] for r in ranges], dtype=np.int64).reshape(-1, 2)
    if arr.shape[0] == 0:
        return np.zeros(n, dtype=np.int64)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    idx = np.searchsorted(arr[:, 0], np.arange(1, n + 1), side="right") - 1
    out = np.where(idx >= 0, arr[np.maximum(idx, 0), 1], 0)
    return out if max_k is None else np.minimum(out, max_k)


def expand_table(table: object, max_num_seqs: int, max_k: int) -> list[int]:
    """Dense k per batch size, index B - 1, of a table vLLM accepts, exactly as vLLM's
    ``build_dynamic_sd_schedule_lookup`` builds it (tests compare both): ``validate_vllm_schedule``,
    then ``dense_from_ranges`` capped at ``max_k``."""
    if max_num_seqs <= 0 or max_k <= 0:
        raise InvalidTableError(f"max_num_seqs = {max_num_seqs} and max_k = {max_k} must both be > 0")
    parsed = validate_vllm_schedule(table)
    return [int(k) for k in dense_from_ranges(parsed, max_num_seqs, max_k)]


def range_bounds(ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense k per batch size (a non-empty 1-d array) → (first index, index past the last) of each
    range of equal k, as arrays: the one place that finds a table's ranges (``compact_ranges`` and
    the evidence search's merge of narrow ranges read them from here)."""
    cuts = np.flatnonzero(np.diff(ks)) + 1
    return np.concatenate([[0], cuts]), np.concatenate([cuts, [ks.size]])


def compact_ranges(ks: Sequence[int]) -> list[list[int]]:
    """Dense k per batch size (index B - 1) → vLLM's ``[[start, end, k], ...]``: the one compaction
    of a table's dense form into its range form (vectorised)."""
    arr = np.asarray(ks, dtype=np.int64).reshape(-1)
    if arr.size == 0:
        raise InvalidTableError("cannot build a table for zero batch sizes")
    starts, ends = range_bounds(arr)
    return [[int(s) + 1, int(e), int(arr[s])] for s, e in zip(starts, ends)]


def allowed_ks_from_table(table: object) -> list[int]:
    """The k values a table uses: the controller's candidates by default (V2 captures CUDA
    graphs only for those)."""
    return sorted({k for _, _, k in validate_vllm_schedule(table)})


def goodput_matrix(step_ms_dense: np.ndarray, ks: Sequence[int], rates: Sequence[float]) -> np.ndarray:
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
        return compact_ranges(self.chosen)

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
    rates: Sequence[float],
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

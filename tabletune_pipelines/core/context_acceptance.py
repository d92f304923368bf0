"""Acceptance per context bucket, and the rule that pools a bucket whose sample is too small.

A prompt belongs to the context bucket (``core.table.context_buckets``) that holds its length in
tokens: the KV length its decode starts at. Each bucket's prompts are measured as one group, so
each has its own drafted and kept counts per position. A bucket keeps its own rates a_1..a_K when
its sample supports them (``PoolingRule``): at least ``min_prompts`` prompts (drafts of one prompt
are not independent, ``core.acceptance_ci``), and a Wilson interval no wider than ``max_width`` at
every position. Otherwise it serves the pooled rates (every bucket's counts summed: the prior's own
rates), and ``BucketAcceptance.reason`` says why. The result a caller reads is
``rates_by_context``: context level → rates. Stdlib and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tabletune_pipelines.core.acceptance_ci import DEFAULT_CONFIDENCE, wilson
from tabletune_pipelines.core.acceptance_estimate import rates_from_counts
from tabletune_pipelines.core.goodput import validate_acceptance
from tabletune_pipelines.core.table import Axes
from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidTableError, InvalidValueError

DEFAULT_MIN_BUCKET_PROMPTS = 20
"""Fewest prompts a bucket needs for rates of its own."""
DEFAULT_MAX_BUCKET_WIDTH = 0.10
"""Widest 95 % interval (hi - lo) of any a_i a bucket with rates of its own may have."""


@dataclass(frozen=True)
class PoolingRule:
    """When a context bucket gets rates of its own (module docstring)."""

    min_prompts: int = DEFAULT_MIN_BUCKET_PROMPTS
    """Fewest prompts of the bucket."""
    max_width: float = DEFAULT_MAX_BUCKET_WIDTH
    """Widest Wilson interval (hi - lo) of any position's rate."""
    confidence: float = DEFAULT_CONFIDENCE
    """Confidence of the intervals."""

    def __post_init__(self) -> None:
        if isinstance(self.min_prompts, bool) or not isinstance(self.min_prompts, int) or self.min_prompts < 1:
            raise InvalidValueError(f"pooling rule: min_prompts = {self.min_prompts!r} must be an integer >= 1")
        if not 0.0 < float(self.max_width) <= 1.0:
            raise InvalidValueError(f"pooling rule: max_width = {self.max_width!r} must be in (0, 1]")
        if not 0.0 < float(self.confidence) < 1.0:
            raise InvalidValueError(f"pooling rule: confidence = {self.confidence!r} must be in (0, 1)")

    def pooled_because(self, prompt_count: int, drafted: Sequence[int], accepted: Sequence[int]) -> str:
        """Why a bucket with these counts is pooled; '' when it keeps its own rates."""
        if prompt_count < self.min_prompts:
            return f"{prompt_count} prompts < {self.min_prompts}"
        if not drafted or drafted[0] <= 0:
            return "no drafts"
        widths = [wilson(a, d, self.confidence) for a, d in zip(accepted, drafted, strict=True)]
        i, iv = max(enumerate(widths), key=lambda x: x[1].hi - x[1].lo)
        if iv.hi - iv.lo > self.max_width:
            return (f"a_{i + 1} interval {iv.hi - iv.lo:.3f} wide > {self.max_width:g} "
                    f"({drafted[i]} drafts)")
        return ""


@dataclass(frozen=True)
class BucketAcceptance:
    """One context bucket's sample and rates."""

    level: int
    """The context level (tokens) the bucket belongs to."""
    lo: int
    """First context length of the bucket (tokens, inclusive)."""
    hi: int
    """Last context length of the bucket (tokens, inclusive)."""
    prompt_count: int
    """Prompts of the sample whose length lies in the bucket."""
    num_drafts: int
    """Request-steps of those prompts that drafted."""
    drafted_per_pos: tuple[int, ...]
    """How often position i was drafted in the bucket."""
    accepted_per_pos: tuple[int, ...]
    """How often position i was kept in the bucket."""
    rates: tuple[float, ...]
    """The bucket's own a_1..a_K from its counts (``rates_from_counts``), pooled or not."""
    pooled: bool
    """Whether the bucket serves the pooled rates instead of its own."""
    reason: str = ""
    """Why it is pooled, in words ('' when it is not)."""


def bucket_of(lengths: Sequence[int], buckets: Sequence[tuple[int, int]]) -> list[int]:
    """The bucket index of every length (tokens; past the last bucket: the last one)."""
    axes = Axes(batch=((1, 1),), context=tuple((int(lo), int(hi)) for lo, hi in buckets))
    return [axes.context_column(int(n)) for n in lengths]


def bucket_acceptance(levels: Sequence[int], buckets: Sequence[tuple[int, int]],
                      counts: Sequence[tuple[int, int, Sequence[int], Sequence[int]]],
                      rule: PoolingRule | None = None) -> tuple[BucketAcceptance, ...]:
    """Each bucket's record from its ``(prompt_count, num_drafts, drafted_per_pos, accepted_per_pos)``,
    pooled or not by ``rule`` (default ``PoolingRule()``)."""
    rule = rule or PoolingRule()
    if not len(levels) == len(buckets) == len(counts):
        raise InvalidValueError(f"{len(levels)} context levels, {len(buckets)} buckets and {len(counts)} "
                                "bucket counts must be as many")
    out = []
    for level, (lo, hi), (n, drafts, drafted, accepted) in zip(levels, buckets, counts, strict=True):
        d, a = tuple(int(x) for x in drafted), tuple(int(x) for x in accepted)
        why = rule.pooled_because(int(n), d, a)
        rates = tuple(float(r) for r in rates_from_counts(a, d, undrafted="previous"))
        out.append(BucketAcceptance(level=int(level), lo=int(lo), hi=int(hi), prompt_count=int(n),
                                    num_drafts=int(drafts), drafted_per_pos=d, accepted_per_pos=a, rates=rates,
                                    pooled=bool(why), reason=why))
    return tuple(out)


def rates_by_context(buckets: Sequence[BucketAcceptance] | None, pooled: Sequence[float],
                     levels: Sequence[int] = ()) -> dict[int, tuple[float, ...]]:
    """Context level → the rates its bucket serves: its own, or ``pooled`` where it is pooled.
    Without a breakdown (``buckets`` None: one level) every one of ``levels`` gets ``pooled``."""
    pooled = tuple(float(r) for r in pooled)
    if buckets is None:
        return {int(level): pooled for level in levels}
    have = [b.level for b in buckets]
    if levels and [int(x) for x in levels] != have:
        raise InvalidValueError(f"context levels {list(levels)} are not those the acceptance was measured at {have}")
    return {b.level: pooled if b.pooled else b.rates for b in buckets}


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10 ** 15:
        raise InvalidValueError(f"{name} = {value!r:.40} must be a count (an integer 0..1e15)")
    return value


def buckets_from_json(raw: object, *, error: type[Exception] = InvalidValueError) -> tuple[BucketAcceptance, ...]:
    """The records of a prior's ``context`` JSON list (lists made tuples; checked by ``check_breakdown``);
    ``error`` when it is not a list of objects, and a ``TypeError`` for an unknown or missing field."""
    if not isinstance(raw, list) or not all(isinstance(b, dict) for b in raw):
        raise error("acceptance prior: context must be a list of bucket objects")
    fields: list[dict] = [{k: tuple(v) if isinstance(v, list) else v for k, v in b.items()} for b in raw]
    return tuple(BucketAcceptance(**f) for f in fields)


def check_breakdown(buckets: Sequence[BucketAcceptance], max_k: int, prompt_count: int, num_drafts: int, *,
                    error: type[Exception] = InvalidValueError) -> None:
    """``error`` (``acceptance prior: `` and the bad value) unless ``buckets`` are at least two records
    of ``max_k`` positions each, their levels strictly ascending and each inside its bucket, the
    buckets contiguous from 1, and their prompts and drafts summing to the prior's."""
    try:
        _check_breakdown(buckets, max_k, prompt_count, num_drafts)
    except (InvalidValueError, InvalidTableError, InvalidAcceptanceError) as exc:
        if error is InvalidValueError and isinstance(exc, InvalidValueError):
            raise
        raise error(f"acceptance prior: {exc}") from None


def _check_breakdown(buckets: Sequence[BucketAcceptance], max_k: int, prompt_count: int, num_drafts: int) -> None:
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or len(buckets) < 2:
        raise InvalidValueError("context breakdown must be a list of at least two buckets (one level: none)")
    for j, b in enumerate(buckets):
        where = f"context[{j}]"
        if not isinstance(b, BucketAcceptance):
            raise InvalidValueError(f"{where} = {b!r:.60} is not a bucket's acceptance")
        for name in ("level", "lo", "hi", "prompt_count", "num_drafts"):
            _count(getattr(b, name), f"{where}.{name}")
        for name in ("drafted_per_pos", "accepted_per_pos", "rates"):
            seq = getattr(b, name)
            if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence) or len(seq) != max_k:
                raise InvalidValueError(f"{where}.{name} must be a list of {max_k} values (one per position)")
        for i, (d, a) in enumerate(zip(b.drafted_per_pos, b.accepted_per_pos, strict=True)):
            if _count(a, f"{where}.accepted_per_pos[{i}]") > _count(d, f"{where}.drafted_per_pos[{i}]"):
                raise InvalidValueError(f"{where}: accepted_per_pos[{i}] = {a} > drafted_per_pos[{i}] = {d}")
        validate_acceptance(b.rates, name=f"{where}.rates")
        if not isinstance(b.pooled, bool) or not isinstance(b.reason, str) or b.pooled != bool(b.reason):
            raise InvalidValueError(f"{where}: pooled = {b.pooled!r:.10} must be true exactly when a reason "
                                    "(a string) is given")
        if not b.lo <= b.level <= b.hi:
            raise InvalidValueError(f"{where}: level {b.level} is outside its bucket [{b.lo}, {b.hi}]")
    Axes(batch=((1, 1),), context=tuple((b.lo, b.hi) for b in buckets))  # contiguous from 1
    for name, total in (("prompt_count", prompt_count), ("num_drafts", num_drafts)):
        got = sum(getattr(b, name) for b in buckets)
        if got != total:
            raise InvalidValueError(f"the buckets' {name} sum to {got}, not the prior's {total}")

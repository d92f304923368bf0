"""What the controller corrects each context bucket of a (batch size x context) table from.

A published (B, ctx) table (``table.context_entries``) carries, per context bucket of the table in
order, the measurement that stands for the bucket (``table.context_columns``):

* ``ctx``: the bucket, ``[lo, hi]`` tokens, one of the table's context buckets;
* ``level``: the context level (tokens) whose cells priced the bucket: the first level merged into
  it (``tuning.derive_context``: neighbouring levels whose k agree at every B share one bucket);
* ``step_ms``: that level's decode surface T(B, k), ``{k: {B: ms}}`` as the table's ``step_ms``;
* ``acceptance_rates``: the a_i the level was searched under, and ``pooled``: whether those are the
  pooled prior's (the bucket had no acceptance sample of its own).

The controller starts each bucket's correction from its column (``controller.columns``); a file
without ``context_columns`` is served as published. The strict reader is ``formats.published``'s
(``context_columns_field``): each bad value gets one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["COLUMN_KEYS", "ContextColumn"]

COLUMN_KEYS = frozenset({"ctx", "level", "step_ms", "acceptance_rates", "pooled"})
"""The keys of one column, every one required."""


@dataclass(frozen=True)
class ContextColumn:
    """One context bucket's measurement (module docstring)."""

    ctx: tuple[int, int]
    """The bucket, inclusive tokens."""
    level: int
    """The context level whose cells priced the bucket."""
    step_ms: dict[int, dict[int, float]]
    """T(B, k) at that level: k -> batch size -> ms."""
    acceptance_rates: tuple[float, ...]
    """a_1..a_K the level was searched under."""
    pooled: bool
    """Whether ``acceptance_rates`` are the pooled prior's."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (string keys), as the published file carries it."""
        return {"ctx": [int(self.ctx[0]), int(self.ctx[1])], "level": int(self.level),
                "step_ms": {str(k): {str(b): float(ms) for b, ms in sorted(row.items())}
                            for k, row in sorted(self.step_ms.items())},
                "acceptance_rates": [float(a) for a in self.acceptance_rates], "pooled": bool(self.pooled)}

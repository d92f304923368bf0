"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path


def ints(text: str | None) -> list[int] | None:
    """``"1,4,16"`` → ``[1, 4, 16]``; empty → None."""
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def loadavg() -> str:
    """The machine's load average, printed next to every figure (noise on 2 cores)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def mean_se(xs: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error of the non-NaN values (NaN, NaN when none; s.e. NaN for one)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def fixed_prior(rates):
    """An AcceptancePrior with known rates (no measurement behind it)."""
    from tabletune_pipelines.documents import AcceptancePrior

    n = len(rates)
    return AcceptancePrior(rates=tuple(rates), num_drafts=0, drafted_per_pos=(0,) * n, accepted_per_pos=(0,) * n,
                           prompt_fingerprint="synthetic", prompt_count=0, source="synthetic")

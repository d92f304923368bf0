"""What the benchmark scripts (``benchmarks/*.py``) share on their command lines and printouts: a
comma-separated list of integers (``--loads 1,4,16``) and the machine's load average, printed next
to every figure (noise on a shared machine). Stdlib only.

The other shared pieces have their homes elsewhere: mean ± standard error is
``core.stats.mean_se``, a prior with given rates ``evaluation.synthetic.fixed_prior``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ints", "loadavg"]


def ints(text: str | None) -> list[int] | None:
    """``"1,4,16"`` → ``[1, 4, 16]``; empty → None."""
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def loadavg() -> str:
    """The machine's load average, printed next to every figure (noise on 2 cores)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"

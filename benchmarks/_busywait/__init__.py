"""The server environment that installs the busy-wait switch of ``sitecustomize.py`` (this folder):
the one place a benchmark builds it (``served_vs_profiled.py``, ``controller_repair.py``).

On a 2-core machine vLLM's engine core polls its shared-memory queue with ``sched_yield()`` and
starves the load generator; with 8 closed-loop clients the engine then serves
one request at a time for seconds (docs/engine-facts.md, "Spells of one request"). With the flag
file present, the poll sleeps 50 µs instead.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def server_env(flag: Path) -> dict[str, str]:
    """``extra_env`` of a server whose poll sleeps while ``flag`` exists (re-checked every 2000 polls)
    and yields as vLLM does otherwise: this folder first on ``PYTHONPATH``, then the package, then
    the caller's path."""
    from tabletune_pipelines.engine.command import PACKAGE_ROOT

    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"TABLETUNE_BUSYWAIT_FLAG": str(flag), "PYTHONPATH": os.pathsep.join([str(HERE), PACKAGE_ROOT, *rest])}

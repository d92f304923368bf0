"""``StepLog``: reading a launch's step log, the JSONL records the timing scheduler appends per step.

The timing scheduler (``engine/timing_scheduler.py``) appends one JSON object per engine step to the
file named by ``control_protocol.STEP_LOG_ENV`` while the server runs; ``VLLMServer`` names that
file at launch. Readers take the records of a time window, from a byte offset on (the log's size
before a measurement), so a long launch is not re-read from its start. The last line may be
being written: a line that is not JSON is skipped. Stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepLog:
    """The step log of one launch; reading it never raises for a log that is missing."""

    path: Path | None
    """The JSONL file; None (no launch yet) or a file not written yet reads as an empty log."""

    def offset(self) -> int:
        """Current size of the step log: pass as ``offset`` to ``read`` to read only newer records."""
        try:
            return self.path.stat().st_size if self.path else 0
        except OSError:
            return 0

    def read(self, since: float | None = None, until: float | None = None,
             offset: int = 0) -> list[dict[str, Any]]:
        """Step records (see ``engine/timing_scheduler.py``) with ``since <= t <= until``
        (time.monotonic()), read from byte ``offset`` of the step log on."""
        if not self.path or not self.path.exists():
            return []
        out = []
        with open(self.path) as fh:
            fh.seek(offset)
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                t = rec.get("t", 0.0)
                if (since is None or t >= since) and (until is None or t <= until):
                    out.append(rec)
        return out

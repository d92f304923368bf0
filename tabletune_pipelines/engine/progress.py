"""Progress lines of a profile run: cells done, time elapsed, and an ETA from this run's pace."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tabletune_pipelines.formats.documents import StepTimeCell

logger = logging.getLogger("tabletune.profiler")


@dataclass
class ProfilerProgress:
    """Counts cells and estimates the remaining time from the cells measured in this run."""

    total: int
    """Cells the plan has (measured before or not)."""
    done: int = 0
    """Cells available so far (resumed ones included)."""
    measured_here: int = 0
    """Cells measured in this run (the ETA's pace)."""
    started: float = field(default_factory=time.monotonic)
    """time.monotonic() at the start of the run."""
    printer: Callable[[str], None] | None = None
    """Where lines go; None = the ``tabletune.profiler`` logger at INFO."""

    def cell(self, cell: StepTimeCell, note: str = "") -> None:
        """Report one newly measured cell with its spread and timing source."""
        self.done += 1
        self.measured_here += 1
        elapsed = time.monotonic() - self.started
        left = self.total - self.done
        eta = elapsed / self.measured_here * left if self.measured_here else float("nan")
        kk = "nospec" if cell.k is None else f"k={cell.k}"
        msg = (f"[profile] {self.done}/{self.total} {kk:>6} B={cell.batch_size:<3} {cell.acceptance:<6} "
               f"{cell.median_ms:7.2f} ms  spread {cell.spread * 100:4.1f}% ({cell.timing})  "
               f"elapsed {elapsed:5.0f}s  ETA {eta:5.0f}s{note}")
        self.say(msg)

    def say(self, msg: str) -> None:
        """Emit one line."""
        if self.printer is not None:
            self.printer(msg)
        else:
            logger.info(msg)

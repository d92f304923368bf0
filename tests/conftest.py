"""Suite-wide: count the real vLLM launches of the run (``engine.process.LAUNCH_LOG_ENV``; servers
started in subprocesses, e.g. by the ``tabletune`` CLI, count too) and print the count at the end."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tabletune_pipelines.engine.process import LAUNCH_LOG_ENV

_LOG = Path(tempfile.mkdtemp(prefix="tt-launches-")) / "launches.jsonl"


def pytest_configure(config):  # noqa: ANN001
    os.environ.setdefault(LAUNCH_LOG_ENV, str(_LOG))


def pytest_terminal_summary(terminalreporter):  # noqa: ANN001
    path = Path(os.environ.get(LAUNCH_LOG_ENV, _LOG))
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    launches = [json.loads(x) for x in lines if x.strip()]
    startup = sum(x.get("startup_s", 0.0) for x in launches)
    terminalreporter.write_line(f"[tabletune] servers started through engine.process in this run: {len(launches)} "
                                f"({startup:.0f} s of start-up)")

"""Fixtures of the hostile-input tests: an empty TABLETUNE_HOME, a snapshot of every file
under a folder (bytes and mtime, to show nothing on disk changed), and the CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty TABLETUNE_HOME; no fleet or store override from the caller's environment."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("TABLETUNE_HOME", str(h))
    for var in ("TABLETUNE_FLEET", "TABLETUNE_DUCKDB"):
        monkeypatch.delenv(var, raising=False)
    return h


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` → (bytes, mtime_ns): equal snapshots mean nothing was written."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def run_cli(home):
    """``run_cli(*args)``: ``python -m tabletune_pipelines.cli ARGS`` in a fresh interpreter on ``home``."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tabletune_pipelines.cli", *map(str, args)],
                              capture_output=True, text=True, env=dict(os.environ), cwd=home, timeout=120)

    return run


def assert_one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The CLI failed as docs/operations.md promises: exit 2, ``error: ...`` first, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)
    return proc.stderr

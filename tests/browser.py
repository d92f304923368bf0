"""Headless Chromium (Debian's ``chromium`` package; no browser downloads): the one way the tests
take screenshots of web UIs (the Dagster UI test, Prometheus's graph in the controller's metrics test)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def chromium() -> str | None:
    """The browser's path (None when none is installed)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(url: str, shot: Path, profile: Path, *, size: str = "1600,1000", budget_ms: int = 25000) -> Path:
    """Load ``url`` in headless Chromium, let its scripts run for ``budget_ms`` of virtual time and save
    a PNG to ``shot`` (``profile``: a fresh user-data folder). Asserts the browser is installed and
    the picture is not blank."""
    browser = chromium()
    assert browser is not None, "chromium is not installed: apt-get install -y chromium (Debian)"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={size}",
         f"--virtual-time-budget={budget_ms}", f"--screenshot={shot}", url],
        check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    assert shot.exists() and shot.stat().st_size > 20_000, "the screenshot is missing or blank"
    return shot

"""Dagster-side rendering of what the library produced: check results, images and JSON in the UI."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from tabletune_pipelines.fleet import tabletune_home
from tabletune_pipelines.tuning.gates import Gate


def _value(v: Any) -> Any:
    """Lists and mappings as JSON metadata; numbers and strings as they are (Dagster infers them)."""
    if isinstance(v, (list, tuple, Mapping)):
        return dg.MetadataValue.json(list(v) if isinstance(v, tuple) else v)
    return v


def check_result(gate: Gate, *, severity: dg.AssetCheckSeverity | None = None) -> dg.AssetCheckResult:
    """A gate as an asset-check result of the asset being materialized (its name is the check's).

    Severity: ERROR for blocking gates, WARN for the others, unless given.
    """
    md: dict[str, Any] = {k: _value(v) for k, v in gate.figures.items()}
    if gate.comparison:
        md["comparison"] = dg.MetadataValue.md(gate.comparison)
    md["summary"] = dg.MetadataValue.text(gate.description)
    if severity is None:
        severity = dg.AssetCheckSeverity.ERROR if gate.blocking else dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(check_name=gate.name, passed=gate.passed, severity=severity, metadata=md,
                               description=gate.description)


def plots_dir() -> Path:
    """``$TABLETUNE_HOME/plots`` (created): where plot PNGs shown in the UI are also kept as files."""
    p = tabletune_home() / "plots"
    p.mkdir(parents=True, exist_ok=True)
    return p


def image_metadata(png: bytes, name: str) -> dict[str, dg.MetadataValue]:
    """The plot inline (markdown with a base64 PNG) and as a file path."""
    path = plots_dir() / f"{name}.png"
    path.write_bytes(png)
    b64 = base64.b64encode(png).decode()
    return {"goodput_plot": dg.MetadataValue.md(f"![goodput vs batch size](data:image/png;base64,{b64})"),
            "goodput_plot_path": dg.MetadataValue.path(str(path))}


def json_md(obj: Any) -> dg.MetadataValue:
    """A JSON value as a fenced, paste-able markdown block."""
    return dg.MetadataValue.md("```json\n" + json.dumps(obj, indent=2, sort_keys=True) + "\n```")

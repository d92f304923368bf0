"""The live acceptance counters file the controller exports (stdlib only).

Format (schema ``tabletune.live_counters``, version 1): a JSONL file, appended to by the
controller; one JSON object per line, each line the counts of one export window (deltas since the
previous line, never running totals, and never the controller's halved internal counters)::

    {"schema": "tabletune.live_counters", "schema_version": 1,
     "deployment": "local-cpu",                        # fleet deployment name
     "identity_key": "cpu__vllm-0.32.0-cpu__...",       # EngineIdentity.key of the running engine (optional)
     "table_version": 3,                                # published version the controller started from (optional)
     "window_start": "2026-11-23T10:00:00Z",            # UTC, ISO 8601
     "window_end":   "2026-11-23T10:05:00Z",            # UTC; a window belongs to the week of its end
     "steps": 41234,                                    # decode steps in the window (optional)
     "num_drafts": 90211,                               # request-steps that drafted >= 1 token
     "drafted_per_pos":  [90211, 80110, 70021],         # how often position i was drafted
     "accepted_per_pos": [63000, 41000, 21000]}         # how often position i was kept

Rules checked on read (a bad line names the file and line number): lengths equal,
``0 <= accepted_i <= drafted_i``, ``drafted_i`` non-increasing in i (position i+1 is only drafted
when position i is), window_end >= window_start. Blank lines are skipped. A half-written last line
(the controller was killed mid-append) is reported and skipped, not fatal.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import TableTuneError

LIVE_COUNTERS_SCHEMA = "tabletune.live_counters"
LIVE_COUNTERS_SCHEMA_VERSION = 1


class LiveCountersError(TableTuneError, ValueError):
    """A live counters file that does not follow the format."""


@dataclass(frozen=True)
class CounterWindow:
    deployment: str
    window_start: datetime
    window_end: datetime
    num_drafts: int
    drafted_per_pos: tuple[int, ...]
    accepted_per_pos: tuple[int, ...]
    identity_key: str | None = None
    table_version: int | None = None
    steps: int | None = None


def _ts(value: Any, where: str, key: str) -> datetime:
    if not isinstance(value, str):
        raise LiveCountersError(f"{where}: {key!r} = {value!r} must be an ISO 8601 UTC timestamp string")
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise LiveCountersError(f"{where}: {key!r} = {value!r} is not an ISO 8601 timestamp") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


def parse_window(obj: Any, where: str) -> CounterWindow:
    if not isinstance(obj, dict):
        raise LiveCountersError(f"{where}: each line must be a JSON object")
    if obj.get("schema") != LIVE_COUNTERS_SCHEMA:
        raise LiveCountersError(f"{where}: schema {obj.get('schema')!r} is not {LIVE_COUNTERS_SCHEMA!r}")
    if obj.get("schema_version") != LIVE_COUNTERS_SCHEMA_VERSION:
        raise LiveCountersError(f"{where}: schema_version {obj.get('schema_version')!r} is not "
                                f"{LIVE_COUNTERS_SCHEMA_VERSION} (upgrade TableTune)")
    allowed = {"schema", "schema_version", "deployment", "identity_key", "table_version", "window_start",
               "window_end", "steps", "num_drafts", "drafted_per_pos", "accepted_per_pos"}
    for key in obj:
        if key not in allowed:
            raise LiveCountersError(f"{where}: unknown key {key!r}")
    for key in ("deployment", "window_start", "window_end", "num_drafts", "drafted_per_pos", "accepted_per_pos"):
        if key not in obj:
            raise LiveCountersError(f"{where}: missing key {key!r}")
    drafted, accepted = obj["drafted_per_pos"], obj["accepted_per_pos"]
    for key, seq in (("drafted_per_pos", drafted), ("accepted_per_pos", accepted)):
        if not isinstance(seq, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seq):
            raise LiveCountersError(f"{where}: {key!r} must be a list of non-negative integers, got {seq!r}")
    if len(drafted) != len(accepted) or not drafted:
        raise LiveCountersError(f"{where}: drafted_per_pos ({len(drafted)}) and accepted_per_pos ({len(accepted)}) "
                                "must have the same non-zero length")
    for i, (d, a) in enumerate(zip(drafted, accepted), start=1):
        if a > d:
            raise LiveCountersError(f"{where}: position {i} accepted {a} > drafted {d}")
    for i in range(1, len(drafted)):
        if drafted[i] > drafted[i - 1]:
            raise LiveCountersError(f"{where}: drafted_per_pos[{i + 1}] = {drafted[i]} > drafted_per_pos[{i}] = "
                                    f"{drafted[i - 1]}; a later position cannot be drafted more often")
    nd = obj["num_drafts"]
    if not isinstance(nd, int) or isinstance(nd, bool) or nd < 0:
        raise LiveCountersError(f"{where}: 'num_drafts' = {nd!r} must be a non-negative integer")
    start, end = _ts(obj["window_start"], where, "window_start"), _ts(obj["window_end"], where, "window_end")
    if end < start:
        raise LiveCountersError(f"{where}: window_end {obj['window_end']} is before window_start {obj['window_start']}")
    return CounterWindow(
        deployment=str(obj["deployment"]), window_start=start, window_end=end, num_drafts=nd,
        drafted_per_pos=tuple(drafted), accepted_per_pos=tuple(accepted), identity_key=obj.get("identity_key"),
        table_version=obj.get("table_version"), steps=obj.get("steps"),
    )


@dataclass(frozen=True)
class ReadResult:
    windows: tuple[CounterWindow, ...]
    skipped_partial_last_line: bool
    fingerprint: str
    """sha256 of the lines read (identifies the input)."""


def read_live_counters(path: str | os.PathLike[str]) -> ReadResult:
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise LiveCountersError(f"live counters file {p} does not exist (the controller has not exported yet)") from None
    windows: list[CounterWindow] = []
    partial = False
    h = hashlib.sha256()
    nonblank = [i for i, ln in enumerate(lines) if ln.strip()]
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{p}:{i + 1}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == nonblank[-1]:
                partial = True
                continue
            raise LiveCountersError(f"{where}: not valid JSON ({exc})") from None
        h.update(line.encode())
        windows.append(parse_window(obj, where))
    return ReadResult(windows=tuple(windows), skipped_partial_last_line=partial, fingerprint=h.hexdigest())


def window_line(
    *, deployment: str, window_start: datetime, window_end: datetime, num_drafts: int,
    drafted_per_pos: Sequence[int], accepted_per_pos: Sequence[int], identity_key: str | None = None,
    table_version: int | None = None, steps: int | None = None,
) -> str:
    """One JSONL line in the format above (the controller's writer; validated before returning)."""

    def iso(dt: datetime) -> str:
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    obj: dict[str, Any] = {
        "schema": LIVE_COUNTERS_SCHEMA, "schema_version": LIVE_COUNTERS_SCHEMA_VERSION, "deployment": deployment,
        "window_start": iso(window_start), "window_end": iso(window_end), "num_drafts": int(num_drafts),
        "drafted_per_pos": [int(x) for x in drafted_per_pos], "accepted_per_pos": [int(x) for x in accepted_per_pos],
    }
    if identity_key is not None:
        obj["identity_key"] = identity_key
    if table_version is not None:
        obj["table_version"] = int(table_version)
    if steps is not None:
        obj["steps"] = int(steps)
    parse_window(obj, "<new line>")
    return json.dumps(obj, sort_keys=True)

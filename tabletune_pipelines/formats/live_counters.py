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
     "accepted_per_pos": [63000, 41000, 21000],         # how often position i was kept
     "tokens": 131000,                                  # tokens kept in the window (optional):
                                                        #   per step, every request's target token
                                                        #   plus its accepted drafts
     "busy_s": 300.2,                                   # seconds of back-to-back steps (optional);
                                                        #   tokens / busy_s = live goodput
     "estimate": [0.70, 0.45, 0.23],                    # the controller's current â_i (optional)
     "source": "host-a:4242:1764000000",                # which engine process wrote it (optional)
     "seq": 7,                                          # window number within that source (optional)
     "controller": {...}}                               # the controller's state (optional, free
                                                        #   form: table, version, counters of
                                                        #   errors/skips, step-time corrections;
                                                        #   docs/controller.md, "Exported state")

Rules checked on read (a bad line names the file and line number): lengths equal and at most
``MAX_POSITIONS``, ``0 <= accepted_i <= drafted_i``, ``drafted_i`` non-increasing in i (position
i+1 is only drafted when position i is), ``num_drafts >= drafted_1`` (every request-step that
drafted position 1 is a draft), window_end >= window_start, ``estimate`` in [0, 1] and
non-increasing, strict JSON (``strict_io.loads``: no NaN/Infinity, duplicate keys, nesting past 64
levels or integers of more than 32 digits), a line at most ``MAX_LINE_BYTES`` (read line by line
with that limit: a longer line is never held in memory whole), a regular file only (a named pipe
is refused, never waited on). Blank lines are skipped. A half-written line (the controller was
killed mid-append; the restarted controller starts a fresh line, so one can also sit between whole
lines) is skipped and reported with its line number (``ReadResult.skipped_lines``), not fatal. A
half-written line is the start of a JSON object cut off: it opens with ``{`` and the text ends before
the object does. Any other line that is not JSON (garbage, a line ending where JSON cannot) is an
error naming its line, wherever it is in the file.

Rules checked across lines: the windows of one writer (same ``deployment`` and ``source``) are in
time order and do not overlap (each starts at or after the previous one's end); a window exported
twice (same deployment, source, seq, start and end, same counts) is counted once
(``ReadResult.duplicates``); the same window with other counts is an error naming both lines.
``read_live_counters(path, max_k=K)`` also refuses windows with more than K draft positions.

The controller appends each line with a single ``write`` on an ``O_APPEND`` descriptor
(``append_line``), so concurrent readers see whole lines, or a torn last line after a crash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import LiveCountersError
from tabletune_pipelines.formats import strict_io
from tabletune_pipelines.formats.strict_io import LineTooLongError, NotRegularFileError, bounded_lines, open_regular

LIVE_COUNTERS_SCHEMA = "tabletune.live_counters"
LIVE_COUNTERS_SCHEMA_VERSION = 1
#: Draft positions a line may carry (vLLM's K is at most a few dozen).
MAX_POSITIONS = 64
#: A line longer than this is not a counters window (the controller's lines are ~2 kB).
MAX_LINE_BYTES = 256 * 1024
#: A file longer than this is not read whole (a year of 1-minute windows is ~1 GB; rotate it).
MAX_FILE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class CounterWindow:
    """One exported window (one line of the file), typed: ``parse_window`` reads it, ``window_line`` writes it."""

    deployment: str
    """Fleet deployment the counts belong to."""
    window_start: datetime
    """UTC start of the window."""
    window_end: datetime
    """UTC end of the window (a window belongs to the week of its end)."""
    num_drafts: int
    """Request-steps that drafted at least one token."""
    drafted_per_pos: tuple[int, ...]
    """How often draft position i was drafted in the window."""
    accepted_per_pos: tuple[int, ...]
    """How often draft position i was kept in the window."""
    identity_key: str | None = None
    """EngineIdentity key of the engine that counted (from the published table)."""
    table_version: int | None = None
    """Published version in force during the window."""
    steps: int | None = None
    """Engine steps in the window."""
    tokens: int | None = None
    """Tokens kept in the window (each request's target token plus its accepted drafts, per step)."""
    busy_s: float | None = None
    """Seconds of back-to-back steps in the window (tokens / busy_s = live goodput)."""
    estimate: tuple[float, ...] | None = None
    """The controller's â_i in force at the window's end."""
    source: str | None = None
    """The writing engine process (host:pid:start); windows of one source follow each other in time."""
    seq: int | None = None
    """Window number within its source."""
    controller: dict[str, Any] | None = None
    """The controller's state at the window's end (docs/controller.md, "Export")."""


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


_WINDOW_KEYS = {"schema", "schema_version", "deployment", "identity_key", "table_version", "window_start",
                "window_end", "steps", "num_drafts", "drafted_per_pos", "accepted_per_pos", "tokens", "busy_s",
                "estimate", "source", "seq", "controller"}


def parse_window(obj: Any, where: str) -> CounterWindow:
    """One line's object, checked by the rules in the module docstring (errors name ``where``)."""
    _check_line_keys(obj, where)
    drafted, accepted = obj["drafted_per_pos"], obj["accepted_per_pos"]
    _check_counts(drafted, accepted, where)
    nd = obj["num_drafts"]
    if not isinstance(nd, int) or isinstance(nd, bool) or nd < 0:
        raise LiveCountersError(f"{where}: 'num_drafts' = {nd!r} must be a non-negative integer")
    if nd < drafted[0]:
        raise LiveCountersError(f"{where}: num_drafts = {nd} < drafted_per_pos[1] = {drafted[0]}; every request-step "
                                "that drafted position 1 is a draft")
    _check_optional_fields(obj, len(drafted), where)
    start, end = _ts(obj["window_start"], where, "window_start"), _ts(obj["window_end"], where, "window_end")
    if end < start:
        raise LiveCountersError(f"{where}: window_end {obj['window_end']} is before window_start {obj['window_start']}")
    busy, est = obj.get("busy_s"), obj.get("estimate")
    return CounterWindow(
        deployment=str(obj["deployment"]), window_start=start, window_end=end, num_drafts=nd,
        drafted_per_pos=tuple(drafted), accepted_per_pos=tuple(accepted), identity_key=obj.get("identity_key"),
        table_version=obj.get("table_version"), steps=obj.get("steps"), tokens=obj.get("tokens"),
        busy_s=None if busy is None else float(busy), estimate=None if est is None else tuple(float(x) for x in est),
        source=obj.get("source"), seq=obj.get("seq"), controller=obj.get("controller"),
    )


def _check_line_keys(obj: Any, where: str) -> None:
    """A JSON object of this schema and version, no unknown key, every required key present."""
    if not isinstance(obj, dict):
        raise LiveCountersError(f"{where}: each line must be a JSON object")
    if obj.get("schema") != LIVE_COUNTERS_SCHEMA:
        raise LiveCountersError(f"{where}: schema {obj.get('schema')!r} is not {LIVE_COUNTERS_SCHEMA!r}")
    if obj.get("schema_version") != LIVE_COUNTERS_SCHEMA_VERSION:
        raise LiveCountersError(f"{where}: schema_version {obj.get('schema_version')!r} is not "
                                f"{LIVE_COUNTERS_SCHEMA_VERSION} (upgrade TableTune)")
    for key in obj:
        if key not in _WINDOW_KEYS:
            raise LiveCountersError(f"{where}: unknown key {key!r}")
    for key in ("deployment", "window_start", "window_end", "num_drafts", "drafted_per_pos", "accepted_per_pos"):
        if key not in obj:
            raise LiveCountersError(f"{where}: missing key {key!r}")


def _check_counts(drafted: Any, accepted: Any, where: str) -> None:
    """Per-position counts: equal non-zero lengths up to ``MAX_POSITIONS``, kept <= drafted, drafted non-increasing."""
    for key, seq in (("drafted_per_pos", drafted), ("accepted_per_pos", accepted)):
        if not isinstance(seq, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seq):
            raise LiveCountersError(f"{where}: {key!r} must be a list of non-negative integers, got {seq!r}")
    if len(drafted) != len(accepted) or not drafted:
        raise LiveCountersError(f"{where}: drafted_per_pos ({len(drafted)}) and accepted_per_pos ({len(accepted)}) "
                                "must have the same non-zero length")
    if len(drafted) > MAX_POSITIONS:
        raise LiveCountersError(f"{where}: {len(drafted)} draft positions; at most {MAX_POSITIONS} are allowed")
    for i, (d, a) in enumerate(zip(drafted, accepted, strict=True), start=1):
        if a > d:
            raise LiveCountersError(f"{where}: position {i} accepted {a} > drafted {d}")
    for i in range(1, len(drafted)):
        if drafted[i] > drafted[i - 1]:
            raise LiveCountersError(f"{where}: drafted_per_pos[{i + 1}] = {drafted[i]} > drafted_per_pos[{i}] = "
                                    f"{drafted[i - 1]}; a later position cannot be drafted more often")


def _check_optional_fields(obj: dict[str, Any], positions: int, where: str) -> None:
    """The optional counts, busy time, estimate (``positions`` rates), names and controller state."""
    for key in ("steps", "tokens", "seq", "table_version"):
        v = obj.get(key)
        if v is not None and (type(v) is not int or v < 0):
            raise LiveCountersError(f"{where}: {key!r} = {v!r} must be a non-negative integer")
    busy = obj.get("busy_s")
    if busy is not None and (type(busy) not in (int, float) or not math.isfinite(busy) or busy < 0):
        raise LiveCountersError(f"{where}: 'busy_s' = {busy!r} must be a finite number >= 0")
    est = obj.get("estimate")
    if est is not None:
        if not isinstance(est, list) or len(est) != positions or not all(
                type(x) in (int, float) and math.isfinite(x) and 0.0 <= x <= 1.0 for x in est):
            raise LiveCountersError(f"{where}: 'estimate' must be {positions} rates in [0, 1]")
        if any(b > a + 1e-9 for a, b in zip(est, est[1:], strict=False)):
            raise LiveCountersError(f"{where}: 'estimate' {est} must be non-increasing with position")
    for key in ("identity_key", "source", "deployment"):
        v = obj.get(key)
        if v is not None and (not isinstance(v, str) or not v or "\n" in v):
            raise LiveCountersError(f"{where}: {key!r} = {v!r:.80} must be a non-empty one-line string")
    if obj.get("controller") is not None and not isinstance(obj["controller"], dict):
        raise LiveCountersError(f"{where}: 'controller' must be a JSON object")


@dataclass(frozen=True)
class ReadResult:
    windows: tuple[CounterWindow, ...]
    skipped_partial_last_line: bool
    """True when a torn line (a writer killed mid-append) was skipped (``skipped_lines`` says which)."""
    fingerprint: str
    """sha256 of the lines read (identifies the input; a duplicate window does not change it)."""
    duplicates: int = 0
    """Windows skipped because the same window was already read (exported twice)."""
    skipped_lines: tuple[int, ...] = ()
    """Line numbers of the torn lines skipped (a writer killed mid-append)."""


_LITERAL_RE = re.compile(r"(t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|[-+.eE0-9]*)")


def is_torn(text: str) -> bool:
    """Whether ``text`` (a line that is not JSON) is the start of a JSON object cut off: it opens with
    ``{`` and the parser runs out of text (inside a string, a number or a literal, or between
    tokens), rather than into a character JSON cannot have there."""
    t = text.rstrip()
    if not t.startswith("{"):
        return False
    try:
        json.loads(t)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string"):
            return True
        return bool(_LITERAL_RE.fullmatch(t[exc.pos:]))
    except ValueError:  # e.g. Python's limit on integer digits: whole text, not a cut one
        return False
    return False


def _lines(fh: Any, where: str) -> Any:
    """``(line number, bytes, ended by a newline)`` of a binary file, each line read with a bound
    (``strict_io.bounded_lines``: a longer line is measured in pieces, never held whole)."""
    try:
        yield from bounded_lines(fh, MAX_LINE_BYTES)
    except LineTooLongError as exc:
        raise LiveCountersError(f"{where}:{exc.line_no}: line of {exc.size} bytes is longer than "
                                f"{MAX_LINE_BYTES}; not a counters window") from None


def _check_sequence(w: CounterWindow, obj: dict[str, Any], where: str, no: int,
                    seen: dict[tuple[Any, ...], tuple[int, bytes]],
                    last: dict[tuple[Any, ...], tuple[int, CounterWindow]]) -> bool:
    """False for a window already read (a duplicate export); raises for overlaps and conflicts."""
    key = (w.deployment, w.source, w.seq, w.window_start, w.window_end)
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).digest()  # the content, not its spelling
    if key in seen:
        first, body = seen[key]
        if body == digest:
            return False
        raise LiveCountersError(f"{where}: window {obj['window_start']}..{obj['window_end']} of source {w.source!r} "
                                f"is also on line {first} with other counts; one of the two lines is wrong")
    writer = (w.deployment, w.source)
    if writer in last:
        prev_no, prev = last[writer]
        if w.window_start < prev.window_end:
            how = ("starts before" if w.window_start < prev.window_start else "overlaps")
            raise LiveCountersError(
                f"{where}: window {obj['window_start']}..{obj['window_end']} {how} the window "
                f"{iso_utc(prev.window_start)}..{iso_utc(prev.window_end)} on line {prev_no} (deployment "
                f"{w.deployment!r}, source {w.source!r}); one writer's windows must follow each other in time")
    seen[key] = (no, digest)
    last[writer] = (no, w)
    return True


def read_live_counters(path: str | os.PathLike[str], *, max_k: int | None = None) -> ReadResult:
    """Every window of a counters file, checked line by line and as a sequence (errors name the
    file and line). ``max_k``: the deployment's K; a window with more draft positions is refused."""
    p = Path(path)
    try:
        fh = open_regular(p)  # a FIFO or device is refused, never opened for a blocking read
    except FileNotFoundError:
        raise LiveCountersError(
            f"live counters file {p} does not exist (the controller has not exported yet)") from None
    except IsADirectoryError:
        raise LiveCountersError(f"live counters file {p} is a folder, not a file") from None
    except NotRegularFileError as exc:
        raise LiveCountersError(f"live counters file {p} is {exc.kind}, not a regular file; it was not read") from None
    except OSError as exc:
        raise LiveCountersError(f"cannot read live counters file {p}: {exc.strerror or exc}") from None
    windows: list[CounterWindow] = []
    skipped: list[int] = []
    duplicates = 0
    h = hashlib.sha256()
    seen: dict[tuple[Any, ...], tuple[int, bytes]] = {}
    last: dict[tuple[Any, ...], tuple[int, CounterWindow]] = {}
    with fh:
        if os.fstat(fh.fileno()).st_size > MAX_FILE_BYTES:
            raise LiveCountersError(f"live counters file {p} is larger than {MAX_FILE_BYTES} bytes; rotate it")
        for no, bline, _ended in _lines(fh, str(p)):  # a torn line is told by its content (is_torn)
            if not bline.strip():
                continue
            where = f"{p}:{no}"
            try:
                line = bline.decode("utf-8")
            except UnicodeDecodeError as exc:
                # A torn line may have been cut inside a UTF-8 sequence: only at its very end.
                if exc.reason == "unexpected end of data" and is_torn(bline[:exc.start].decode("utf-8", "replace")):
                    skipped.append(no)
                    continue
                raise LiveCountersError(f"{where}: not UTF-8 (byte {exc.start})") from None
            try:
                obj = strict_io.loads(line)
            except strict_io.StrictJSONError as exc:  # complete JSON TableTune refuses: never a torn line
                raise LiveCountersError(f"{where}: not valid JSON ({exc})") from None
            except ValueError as exc:
                # A torn line (a writer killed mid-append; a restarted writer starts on a new line)
                # is the start of a line cut off: skipped and reported by number. Anything else is an error.
                if is_torn(line):
                    skipped.append(no)
                    continue
                raise LiveCountersError(f"{where}: not a counters window: not valid JSON ({exc}), and not the start "
                                        "of one cut off by a writer killed mid-append") from None
            w = parse_window(obj, where)
            if max_k is not None and len(w.drafted_per_pos) > max_k:
                raise LiveCountersError(f"{where}: {len(w.drafted_per_pos)} draft positions, but the deployment's "
                                        f"max_k is {max_k}; these counters are not from this deployment's engine")
            if not _check_sequence(w, obj, where, no, seen, last):
                duplicates += 1
                continue
            h.update(bline)
            windows.append(w)
    return ReadResult(windows=tuple(windows), skipped_partial_last_line=bool(skipped), fingerprint=h.hexdigest(),
                      duplicates=duplicates, skipped_lines=tuple(skipped))


def iso_utc(dt: datetime) -> str:
    """``2026-11-23T10:00:00.123Z`` (milliseconds: windows of a fast export can be under a second)."""
    dt = dt.astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def window_line(window: CounterWindow) -> str:
    """One JSONL line in the format above (the controller's writer; validated before returning)."""
    w = window
    obj: dict[str, Any] = {
        "schema": LIVE_COUNTERS_SCHEMA, "schema_version": LIVE_COUNTERS_SCHEMA_VERSION, "deployment": w.deployment,
        "window_start": iso_utc(w.window_start), "window_end": iso_utc(w.window_end), "num_drafts": int(w.num_drafts),
        "drafted_per_pos": [int(x) for x in w.drafted_per_pos],
        "accepted_per_pos": [int(x) for x in w.accepted_per_pos],
    }
    for key, value, conv in (("identity_key", w.identity_key, str), ("table_version", w.table_version, int),
                             ("steps", w.steps, int), ("tokens", w.tokens, int), ("busy_s", w.busy_s, float),
                             ("source", w.source, str), ("seq", w.seq, int)):
        if value is not None:
            obj[key] = conv(value)
    if w.estimate is not None:
        obj["estimate"] = [round(float(x), 6) for x in w.estimate]
    if w.controller is not None:
        obj["controller"] = w.controller
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    if len(text.encode()) > MAX_LINE_BYTES:
        raise LiveCountersError(f"counters window of {len(text)} bytes exceeds {MAX_LINE_BYTES}; trim the state")
    parse_window(obj, "<new line>")
    return text


# -- what the controller may append to ------------------------------------------------------------
# The export path comes from a file others write (the fleet's live_counters, the published file's
# export_path), so it may name a file TableTune did not write: a system file, the DuckDB store. The
# controller appends only to a file that is absent (it creates it) or already a live counters file:
# a regular file (not a symlink, folder, FIFO or device) whose first line is a window of this format.
# A counters file a crash or log rotation left behind is one too (``counters_damage`` says which):
# emptied to 0 bytes, or a first line that is a window of this format cut off (a writer killed during
# its first append). The controller recovers by appending: an emptied file is written from its start;
# after a torn first line the next window starts on a fresh line (``append_line``), and readers skip
# the torn line by number. Nothing is truncated or moved, so two writers cannot lose each other's
# lines. Read-only commands load the fleet as usual and print one note naming the file. A file
# that was never a counters file is still refused. ``append_line`` checks the descriptor it writes to;
# ``check_live_counters_target`` is the same check by path, for the fleet loader and the publish gate.

#: How a line of this format starts: the controller writes sorted keys (``window_line``), other
#: writers of the format may put the schema first.
_LINE_HEADS = ('{"accepted_per_pos":', '{"schema":')

_WRITE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _refuse_target(path: str | os.PathLike[str], reason: str) -> LiveCountersError:
    return LiveCountersError(f"refusing to append live counters to {os.fspath(path)}: it {reason}, so it is not a "
                             "live counters file TableTune wrote. Nothing was written; point live_counters (or the "
                             "controller's export_path) at a path where nothing exists yet, or move this file away")


def _not_a_file(st: os.stat_result) -> str | None:
    reason = strict_io.not_a_write_target(st)
    return reason + " (TableTune appends to files, not link targets)" if reason == "is a symbolic link" else reason


def _torn_window(first: bytes) -> bool:
    """Whether ``first`` (a file's first line) is a window of this format cut off by a writer killed
    mid-append: the start of a JSON object (``is_torn``) that begins like a line of this format."""
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError as exc:  # a cut may split a UTF-8 sequence: only at the very end
        if exc.reason != "unexpected end of data":
            return False
        text = first[:exc.start].decode("utf-8")
    t = re.sub(r"\s+", "", text)  # the heads in compact form; a torn line ends anywhere
    return is_torn(text) and any(t.startswith(h) or h.startswith(t) for h in _LINE_HEADS)


def _damage(size: int, head: bytes) -> str | None:
    """What a crash or log rotation did to a counters file of ``size`` bytes starting with ``head``
    (at most ``MAX_LINE_BYTES + 1`` bytes), or None when its first line is whole."""
    if size == 0:
        return "is empty (0 bytes: log rotation or a crash emptied it)"
    first, newline, _ = head.partition(b"\n")
    if _torn_window(first):
        alone = not newline or not head[len(first) + 1:].strip()
        return (f"has a half-written first line ({len(first)} bytes, a writer killed mid-append)"
                + ("; it holds no whole window yet" if alone else "; the windows after it are read"))
    return None


def counters_damage(path: str | os.PathLike[str]) -> str | None:
    """One line about a live counters file a crash or log rotation left behind (emptied, or a torn
    first line), for read-only commands to print; None when it is absent, whole, or not a counters
    file at all (``check_live_counters_target`` refuses that). Reads at most one line; never writes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if _not_a_file(st):
            return None
        damage = _damage(st.st_size, os.pread(fd, MAX_LINE_BYTES + 1, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    if damage is None:
        return None
    return (f"live counters file {os.fspath(path)} {damage}; the controller's next export appends after it and "
            "readers skip the torn line (docs/operations.md)")


def _not_ours(fd: int) -> str | None:
    """Why the open regular file ``fd`` is not a live counters file (None: it is one, whole or left
    behind by a crash: ``_damage``)."""
    st = os.fstat(fd)
    reason = _not_a_file(st)
    if reason:
        return reason
    head = os.pread(fd, MAX_LINE_BYTES + 1, 0)
    if _damage(st.st_size, head) is not None:
        return None
    first, newline, _ = head.partition(b"\n")
    if b"\x00" in head:  # JSON text never holds one; a database's header can hold a newline before it
        return "is a binary file (it holds NUL bytes)"
    if not newline and len(head) > MAX_LINE_BYTES:
        return f"has a first line longer than {MAX_LINE_BYTES} bytes"
    try:
        obj = strict_io.loads(first.decode("utf-8"))  # what it is, not whether its counts are valid
    except ValueError:  # not UTF-8 (UnicodeDecodeError), not JSON, not strict JSON (StrictJSONError)
        return "does not start with a JSON line"
    if not isinstance(obj, dict) or obj.get("schema") != LIVE_COUNTERS_SCHEMA:
        return f"does not start with a line of schema {LIVE_COUNTERS_SCHEMA!r}"
    if obj.get("schema_version") != LIVE_COUNTERS_SCHEMA_VERSION:
        return (f"holds schema_version {obj.get('schema_version')!r} counters; this TableTune writes "
                f"{LIVE_COUNTERS_SCHEMA_VERSION}")
    return None


def check_live_counters_target(path: str | os.PathLike[str]) -> None:
    """Raise ``LiveCountersError`` unless the controller may append to ``path``: nothing is there, or
    a live counters file is (see above). Reads at most one line; never writes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LiveCountersError(f"cannot inspect live counters file {os.fspath(path)}: {exc.strerror or exc}") from None
    reason = _not_a_file(st)
    if reason is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise LiveCountersError(f"cannot read live counters file {os.fspath(path)} to check it: "
                                    f"{exc.strerror or exc}") from None
        try:
            reason = _not_ours(fd)
        finally:
            os.close(fd)
    if reason:
        raise _refuse_target(path, reason)


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append ``line`` + newline with one ``write`` on an ``O_APPEND`` descriptor (no folder is
    created: the export goes only where the operator made room for it). Only to a file that is
    absent (created) or a live counters file (checked on the descriptor written to); anything else
    is a ``LiveCountersError`` and is left as it was."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    p = os.fspath(path)
    created = False
    try:
        fd = os.open(p, _WRITE_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:  # also a symlink, dangling or not: O_EXCL does not follow it
        try:
            st = os.lstat(p)
        except FileNotFoundError:  # removed in between: the next export creates it
            raise OSError(f"{p} disappeared while being opened") from None
        reason = _not_a_file(st)  # before opening: opening a device or a FIFO can have effects
        if reason:
            raise _refuse_target(p, reason) from None
        fd = os.open(p, _WRITE_FLAGS)
        try:
            reason = _not_ours(fd)
        except BaseException:
            os.close(fd)
            raise
        if reason:
            os.close(fd)
            raise _refuse_target(p, reason) from None
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # the previous writer was killed mid-line: start a fresh one
        n = os.write(fd, data)
        if n != len(data):
            raise OSError(f"short write to {path}: {n} of {len(data)} bytes")
    except BaseException:
        if created:  # never leave an empty or torn first line behind (readers would note it)
            _remove_if_same(p, fd)
        raise
    finally:
        os.close(fd)


def _remove_if_same(path: str, fd: int) -> None:
    try:
        st, mine = os.lstat(path), os.fstat(fd)
        if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
            os.unlink(path)
    except OSError:
        pass

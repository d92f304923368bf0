"""The control-file protocol: how a process outside vLLM sends commands into a running engine.

Stdlib only, one implementation for both sides. A *channel* is one JSON file plus its
acknowledgement file ``<file>.ack``:

* The **writer** (the side that starts the server, or the controller) replaces the file
  atomically with ``{"seq": n, ...command}``, ``n`` increasing, and waits until ``<file>.ack``
  holds ``{"ack": n, ...}``. An ack carrying ``"error"`` means the engine refused the command.
* The **reader** (inside the engine: the timing scheduler once per step, the CPU plugin when drafts
  are verified) detects a new command with one ``os.stat`` per poll — the file's (inode, mtime,
  size) changed — parses it, acts, and writes the ack atomically. A file it cannot parse (not
  strict JSON: NaN, Infinity, a duplicate key, nesting past 64 levels, an integer of more than 32
  digits, non-UTF-8 bytes, over ``MAX_COMMAND_BYTES``; or not a regular file: a named pipe is
  never waited on; ``strict_io``) is acknowledged with ``{"ack": null, "error": ...}``; it never
  raises into the engine.
* Commands are **validated before they are applied** (``check_k_command``, ``check_rates_command``):
  a command that fails is acknowledged with its error and changes nothing.

The writer makes every write change that (inode, mtime, size) signature, so a reader that
polls only the signature cannot miss a command — but a command the reader has not picked up
yet is *replaced* by the next one (the file holds the latest command only). Wait for the ack
before sending a command that must not be lost.

Channels used by TableTune (the environment variable names the file for the engine process):

* ``TABLETUNE_K_CONTROL``: ``{"k": 2}`` (every batch size drafts k), ``{"table": [[1, 8, 3],
  [9, 16, 1]]}`` (a draft-length table; 5-item entries with an optional ``"ctx_agg"``: a (batch
  size x context) table) or ``{"gate": 8, "gate_timeout": 10.0}`` (admit the next
  8 arriving requests together); read by ``engine/timing_scheduler.py``.
* ``TABLETUNE_SYNTHETIC_CONTROL``: ``{"rates": [a_1, ..., a_K]}`` (synthetic acceptance, CPU build);
  read by ``engine/cpu_plugin.py``.

Writer side::

    w = ControlWriter(path)
    seq = w.send({"k": 1})
    w.wait_ack(seq, timeout=30.0, poke=lambda: ...)   # poke makes the engine take a step

Reader side::

    r = ControlReader(path)
    cmd = r.poll()            # None when nothing new
    if cmd is not None:
        ...act on cmd.body...
        r.ack(cmd.seq, table=...)      # or r.reject(cmd.seq, "why")
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import ControlProtocolError, ControlRejected, ControlTimeout, InvalidCommand
from tabletune_pipelines.formats import strict_io

K_CONTROL_ENV = "TABLETUNE_K_CONTROL"
"""Environment variable naming the k / table / admission-gate channel of an engine."""
SYNTHETIC_CONTROL_ENV = "TABLETUNE_SYNTHETIC_CONTROL"
"""Environment variable naming the synthetic-acceptance-rates channel (CPU build)."""
STEP_LOG_ENV = "TABLETUNE_STEP_LOG"
"""Environment variable naming the timing scheduler's JSONL step log (not a channel: append-only)."""

Signature = tuple[int, int, int]
"""(inode, mtime_ns, size) of a control file: what the reader compares between polls."""
MAX_COMMAND_BYTES = 1024 * 1024
"""A command is a few kB (a table of 4096 batch sizes is ~60 kB); a larger file is not read."""
MAX_GATE_TIMEOUT_S = 3600.0
"""Longest admission-gate wait a command may ask for."""


# -- command checks (the reader side runs them before acting) -------------------------------------

def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _unknown(body: Mapping[str, Any], allowed: set[str], what: str) -> None:
    extra = sorted(str(k) for k in body if k not in allowed)
    if extra:
        raise InvalidCommand(f"{what} command has unknown key(s) {extra}; allowed: {sorted(allowed)}")


def check_rates_command(body: Mapping[str, Any], num_positions: int | None = None) -> tuple[float, ...]:
    """``{"rates": [a_1, ..., a_K]}`` → the rates: finite numbers in [0, 1], non-increasing with
    position, exactly ``num_positions`` of them when the launch's K is known. Raises ``InvalidCommand``."""
    _unknown(body, {"rates"}, "synthetic-rates")
    rates = body.get("rates")
    if not isinstance(rates, list) or not rates:
        raise InvalidCommand(f"'rates' must be a non-empty list of acceptance rates, got {type(rates).__name__}")
    for i, x in enumerate(rates, start=1):
        if not _is_number(x) or not 0.0 <= x <= 1.0:
            raise InvalidCommand(f"rates[{i}] = {x!r:.40} must be a finite number in [0, 1]")
        if i > 1 and x > rates[i - 2] + 1e-9:
            raise InvalidCommand(f"rates[{i}] = {x!r} > rates[{i - 1}] = {rates[i - 2]!r}: a_i is the chance that the "
                                 "first i drafts are all kept, so it cannot grow with i")
    if num_positions is not None and len(rates) != num_positions:
        raise InvalidCommand(f"'rates' has {len(rates)} values; the launch drafts {num_positions} positions")
    return tuple(float(x) for x in rates)


def check_k_command(body: Mapping[str, Any], *, max_k: int, max_num_seqs: int) -> None:
    """``{"k": n}``, ``{"table": [[start, end, k], ...]}`` or ``{"table": [[bs_lo, bs_hi, ctx_lo,
    ctx_hi, k], ...], "ctx_agg": "mean"}``, ``{"gate": n, "gate_timeout": s}``: k an integer in
    0..max_k, a table vLLM accepts (5-item entries: a (batch size x context) grid, ``DraftTable``'s
    rules) with every k <= max_k, ``ctx_agg`` one of ``vocab.CONTEXT_AGGREGATES`` and only with
    5-item entries, a gate of 1..max_num_seqs requests and a finite timeout in (0,
    ``MAX_GATE_TIMEOUT_S``]. Raises ``InvalidCommand``."""
    _unknown(body, {"k", "table", "ctx_agg", "gate", "gate_timeout"}, "k-control")
    k = body.get("k")
    if k is not None and (not _is_int(k) or not 0 <= k <= max_k):
        raise InvalidCommand(f"'k' = {k!r:.40} must be an integer in 0..{max_k} (the launch's num_speculative_tokens)")
    _check_table(body, max_k)
    gate = body.get("gate")
    if gate is not None and (not _is_int(gate) or not 1 <= gate <= max_num_seqs):
        raise InvalidCommand(f"'gate' = {gate!r:.40} must be an integer in 1..{max_num_seqs} (max_num_seqs)")
    timeout = body.get("gate_timeout")
    if timeout is not None and (not _is_number(timeout) or not 0 < timeout <= MAX_GATE_TIMEOUT_S):
        raise InvalidCommand(
            f"'gate_timeout' = {timeout!r:.40} must be a number of seconds in (0, {MAX_GATE_TIMEOUT_S:g}]")


def _check_table(body: Mapping[str, Any], max_k: int) -> None:
    """The ``table`` and ``ctx_agg`` of a k-control command (``check_k_command``)."""
    from tabletune_pipelines.vocab import CONTEXT_AGGREGATES

    agg = body.get("ctx_agg")
    if body.get("table") is None:
        if agg is not None:
            raise InvalidCommand(f"'ctx_agg' = {agg!r:.40} is given without a 'table'; it belongs to a 5-item table")
        return
    from tabletune_pipelines.core.table import DraftTable  # lazy: core needs numpy
    from tabletune_pipelines.errors import InvalidTableError

    try:
        table = DraftTable.from_entries(body["table"], allow_context=True)
    except InvalidTableError as exc:
        raise InvalidCommand(f"'table': {exc}") from None
    over = [list(r) for r in table.entries() if r[-1] > max_k]
    if over:
        raise InvalidCommand(f"'table' range(s) {over} ask for k > {max_k} (the launch's num_speculative_tokens)")
    if agg is not None and table.axes.context is None:
        raise InvalidCommand(f"'ctx_agg' = {agg!r:.40} is given with a 3-item table; it belongs to a 5-item table")
    if agg is not None and agg not in CONTEXT_AGGREGATES:
        raise InvalidCommand(f"'ctx_agg' = {agg!r:.40} must be one of {list(CONTEXT_AGGREGATES)}")


def ack_path(path: str | os.PathLike[str]) -> Path:
    """The acknowledgement file of a channel: ``<path>.ack``."""
    return Path(str(path) + ".ack")


def signature(path: str | os.PathLike[str]) -> Signature | None:
    """The (inode, mtime_ns, size) of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _replace_atomically(path: Path, text: str) -> None:
    # The one atomic writer (a symbolic link at the path is refused); no fsync: a command or an
    # acknowledgement lost in a crash is sent again, and the engine polls these files every step.
    strict_io.atomic_write_text(path, text, durable=False, make_folders=False)


def write_distinct(path: str | os.PathLike[str], text: str, last: Signature | None) -> Signature:
    """Atomically replace ``path`` with ``text`` so that its signature differs from ``last``.

    Replacing can reuse an inode, and two writes within one mtime tick with the same size would
    look unchanged to a reader that compares signatures only; such a write is repeated until the
    signature moves (a few milliseconds at most).
    """
    p = Path(path)
    sig: Signature | None = None
    for _ in range(200):
        _replace_atomically(p, text)
        sig = signature(p)
        if sig is not None and sig != last:
            return sig
        time.sleep(0.005)
    raise ControlProtocolError(f"control file {str(p)!r}: every write kept signature {last}; is the file "
                               "system's mtime frozen? Use a local folder for the server's work_dir")


@dataclass(frozen=True)
class Command:
    """One command as the reader sees it."""

    seq: int
    """The writer's sequence number; acknowledge it with ``ControlReader.ack(seq)``."""
    body: dict[str, Any]
    """The command's fields without ``seq`` (e.g. ``{"k": 1}``)."""


class ControlWriter:
    """Writer side of one channel: ``send`` a command, ``wait_ack`` for the engine's answer.

    One writer per channel at a time. A new writer on an existing file continues its sequence
    numbers, so a restarted writer never reuses a number the engine has already acknowledged.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        """The control file."""
        self.ack_path = ack_path(self.path)
        """The acknowledgement file (``<path>.ack``)."""
        self._sig = signature(self.path)
        self._seq = max(_read_seq(self.path), _read_ack_seq(self.ack_path))

    @property
    def last_seq(self) -> int:
        """Sequence number of the last command sent (0 before the first)."""
        return self._seq

    def send(self, command: Mapping[str, Any]) -> int:
        """Replace the control file with ``command`` plus a new ``seq``; return that seq.

        Does not wait: the engine picks the command up at its next poll. The previous
        acknowledgement is removed first, so a stale error cannot answer this command.
        ``command`` must be JSON-serialisable and must not contain ``seq``.
        """
        if "seq" in command:
            raise ControlProtocolError(f"command {dict(command)!r} sets 'seq'; the writer numbers commands itself")
        seq = self._seq + 1
        try:
            text = json.dumps({"seq": seq, **command}, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ControlProtocolError(
                f"command {dict(command)!r:.200} is not strict JSON ({exc}); nothing sent") from None
        self.ack_path.unlink(missing_ok=True)
        self._sig = write_distinct(self.path, text, self._sig)
        self._seq = seq
        return seq

    def read_ack(self) -> dict[str, Any] | None:
        """The current acknowledgement (a JSON object), or None if there is none or it is being written."""
        ack = _read_json_object(self.ack_path)
        return ack

    def wait_ack(self, seq: int, *, timeout: float, poke: Callable[[], None] | None = None,
                 pause: float = 0.05, what: str | None = None) -> dict[str, Any]:
        """Wait until the engine acknowledges command ``seq``; return the ack.

        ``poke`` is called between polls to make the engine act (the timing scheduler reads its
        channel once per step, so an idle engine needs a tiny request). Raises
        ``ControlRejected`` when the ack for ``seq`` (or the ack of an unreadable file, written
        after ``send``) carries an error, ``ControlTimeout`` after ``timeout`` seconds.
        """
        label = what or f"command {seq} on {self.path.name}"
        deadline = time.monotonic() + timeout
        while True:
            ack = self.read_ack()
            if ack is not None:
                got = ack.get("ack")
                if ack.get("error") and got in (seq, None):
                    raise ControlRejected(f"engine rejected {label}: {ack['error']}")
                if got == seq:
                    return ack
            if time.monotonic() >= deadline:
                raise ControlTimeout(f"engine did not acknowledge {label} within {timeout} s (control file "
                                     f"{self.path}); the engine may be stuck or not running TableTune's hooks")
            if poke is not None:
                poke()
            time.sleep(pause)

    def request(self, command: Mapping[str, Any], *, timeout: float, poke: Callable[[], None] | None = None,
                pause: float = 0.05, what: str | None = None) -> dict[str, Any]:
        """``send`` then ``wait_ack``: the command is in force when this returns."""
        seq = self.send(command)
        return self.wait_ack(seq, timeout=timeout, poke=poke, pause=pause, what=what)


@dataclass
class ControlReader:
    """Reader side of one channel (inside the engine). ``poll`` costs one ``os.stat`` when idle."""

    path: str | None
    """The control file; None (channel not configured) makes ``poll`` always return None."""
    _sig: Signature | None = field(default=None, init=False, repr=False)
    last_seq: int = field(default=0, init=False)
    """Sequence number of the last command returned by ``poll``."""

    @classmethod
    def from_env(cls, variable: str) -> ControlReader:
        """A reader of the file named by environment variable ``variable`` (unset: inert)."""
        return cls(os.environ.get(variable) or None)

    def poll(self) -> Command | None:
        """The command written since the last poll, or None.

        A file that is not a JSON object with an integer ``seq`` is acknowledged with
        ``{"ack": null, "error": ...}`` and None is returned. Never raises (I/O errors read as
        "nothing new"; the next change is read again).
        """
        if not self.path:
            return None
        sig = signature(self.path)
        if sig is None or sig == self._sig:
            return None
        self._sig = sig
        try:
            # A regular file only (a named pipe is refused, never waited on), bounded, strict JSON:
            # NaN, Infinity, duplicate keys, deep nesting and huge integers are errors (strict_io).
            raw, _ = strict_io.read_bounded(self.path, MAX_COMMAND_BYTES)
            data = strict_io.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("seq"), int) or isinstance(data["seq"], bool):
                raise InvalidCommand(f"expected a JSON object with an integer 'seq', got {str(data)[:200]}")
        except strict_io.FileTooLargeError:
            self._write_ack({"ack": None, "error": f"unreadable command: the command file is larger than "
                                                   f"{MAX_COMMAND_BYTES} bytes"})
            return None
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self._write_ack({"ack": None, "error": f"unreadable command: {why}"})
            return None
        except Exception as exc:  # noqa: BLE001 - never raise into the engine; the ack says what failed
            self._write_ack({"ack": None, "error": f"unreadable command: {type(exc).__name__}: {str(exc)[:200]}"})
            return None
        seq = int(data.pop("seq"))
        if seq == self.last_seq:
            return None  # the file was replaced between stat and open: this command was read already
        self.last_seq = seq
        return Command(seq=seq, body=data)

    def ack(self, seq: int, **fields: Any) -> None:
        """Acknowledge command ``seq`` (extra JSON-serialisable ``fields`` go into the ack)."""
        self._write_ack({"ack": seq, **fields})

    def reject(self, seq: int | None, error: str, **fields: Any) -> None:
        """Acknowledge command ``seq`` with an error: the writer's ``wait_ack`` raises it."""
        self._write_ack({"ack": seq, "error": str(error), **fields})

    def _write_ack(self, ack: Mapping[str, Any]) -> None:
        if not self.path:
            return
        try:
            _replace_atomically(ack_path(self.path), json.dumps(dict(ack)))
        except (OSError, TypeError, ValueError):
            pass  # the engine must not fail over an acknowledgement; the writer times out instead


def _read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a regular file, bounded, strict JSON), or None for anything else."""
    try:
        raw, _ = strict_io.read_bounded(path, MAX_COMMAND_BYTES)
        data = strict_io.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _seq_field(path: Path, key: str) -> int:
    value = (_read_json_object(path) or {}).get(key)
    return value if type(value) is int and value > 0 else 0


def _read_seq(path: Path) -> int:
    return _seq_field(path, "seq")


def _read_ack_seq(path: Path) -> int:
    return _seq_field(path, "ack")

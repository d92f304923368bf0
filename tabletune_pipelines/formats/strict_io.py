"""Reading files TableTune did not write, and writing its own: the one home of the rules every
reader and every writer follows.

Stdlib only: the controller inside vLLM reads its published file through this module (via
``published``), and ``live_counters`` and ``control_protocol`` import it too. Every reader of an
outside file (the published table, the fleet file, prompt logs, live counters, control files, the
store's header, the fingerprint key) uses it, and turns its exceptions into the reader's own
``TableTuneError`` naming the file and line.

* **Regular files only.** ``open_regular`` looks at the path (``stat``) before opening it and
  refuses anything that is not a regular file: a folder (``IsADirectoryError``), a named pipe, a
  character or block device, a socket (``NotRegularFileError``). Opening a named pipe for reading
  blocks until a writer appears, and ``/dev/zero`` never ends. The file is then opened with
  ``O_NONBLOCK`` and checked again with ``fstat`` (the path may have been replaced in between), so
  no reader ever blocks on what it opened.
* **Bounded sizes.** ``read_bounded`` returns at most ``limit`` bytes and refuses a larger file
  (``FileTooLargeError``) without reading it; ``bounded_lines`` yields a file's lines, each read
  with a bound (``LineTooLongError``: a longer line is measured in small pieces, never held whole).
* **Strict JSON.** ``loads`` parses JSON as JSON means it: ``NaN``, ``Infinity``, a number that
  overflows to infinity (``1e999``), a key twice in one object, an integer of more than
  ``MAX_INT_DIGITS`` digits and nesting deeper than ``MAX_DEPTH`` are ``StrictJSONError``; a
  syntax error stays a ``json.JSONDecodeError``. Both are ``ValueError``: no text makes ``loads``
  raise anything else (Python's ``RecursionError`` on deep nesting and its integer-size
  ``ValueError`` never get out).
* **Atomic writes that refuse links.** ``atomic_write_bytes`` / ``atomic_write_text`` is the one
  writer of every whole file TableTune writes (published tables and their companions, exported
  profiles, sample weeks of prompts, plots, control files): a temp file in the same folder, fsync,
  rename, fsync of the folder, so a reader sees the old file or the new one, never a torn one. What
  is at the path must be nothing or a regular file: a symbolic link (dangling or not), a folder, a
  named pipe or a device is refused (``NotAWriteTargetError``) before anything is written, so no
  write ever lands on a link's target or replaces a link someone placed there.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

#: Deepest nesting of arrays and objects a document may have (TableTune's own documents use 4).
MAX_DEPTH = 64
#: Most digits an integer may have (a count of 10^32 is not a count; a float keeps ~17 digits).
MAX_INT_DIGITS = 32
#: Lines longer than the reader's bound are measured in pieces of this size (memory stays small).
_PIECE = 64 * 1024


# -- exceptions (each reader turns them into its own TableTuneError) ----------------------------

class NotRegularFileError(OSError):
    """The path is a named pipe, a device or a socket: nothing a reader of files opens."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"it is {kind}, not a regular file (TableTune reads only regular files)", path)
        self.kind = kind
        """What the path is, e.g. ``"a named pipe (FIFO)"``."""


class FileTooLargeError(OSError):
    """The file is larger than the reader's bound; it was not read."""

    def __init__(self, path: str, size: int | None, limit: int) -> None:
        what = f"{size} bytes, more than" if size is not None else "larger than"
        super().__init__(errno.EFBIG, f"it is {what} the {limit} bytes this reader accepts", path)
        self.size, self.limit = size, limit


class NotAWriteTargetError(OSError):
    """What is at a path TableTune would write is not a regular file (a symbolic link, a folder, a
    named pipe, a device); nothing was written."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EEXIST, f"it {reason}; TableTune writes only where nothing is or over a regular "
                                       "file (move what is there away)", path)
        self.reason = reason
        """Why, e.g. ``"is a symbolic link (TableTune replaces files, not link targets)"``."""


class LineTooLongError(ValueError):
    """Line ``line_no`` holds ``size`` bytes (without its newline), more than ``limit``."""

    def __init__(self, line_no: int, size: int, limit: int) -> None:
        super().__init__(f"line {line_no} has {size} bytes, more than {limit}")
        self.line_no, self.size, self.limit = line_no, size, limit


class StrictJSONError(ValueError):
    """Text that is JSON-like but that TableTune refuses (the message never quotes a string of it)."""


class DuplicateKeyError(StrictJSONError):
    """A key written twice in one JSON object (JSON would silently keep the last)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


# -- regular files, bounded ----------------------------------------------------------------------

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_write_target(st: os.stat_result) -> str | None:
    """Why a path with ``os.lstat`` result ``st`` is no file TableTune may write over or append to
    (None: a regular file). One rule for the live-counters export and ``--plot``."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a named pipe, a device or a socket)"
    return None


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True,
                       make_folders: bool = True) -> Path:
    """Replace the file at ``path`` with ``data`` so that readers never see a partial file.

    Nothing, or a regular file, may be at ``path``; anything else (a symbolic link, a folder, a
    FIFO, a device) raises ``NotAWriteTargetError`` and nothing is written. The data goes to a temp
    file ``.<name>.*.tmp`` in the same folder, then is renamed over ``path``; a failure removes the
    temp file and leaves ``path`` as it was. ``durable``: fsync the file and its folder (off only
    for files whose loss at a crash costs nothing, such as a control channel's acknowledgement).
    ``make_folders``: create missing folders. Returns ``path`` as a ``pathlib.Path``.
    """
    target = Path(path)
    _refuse_non_file(target)
    if make_folders:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        _refuse_non_file(target)  # placed there while the temp file was written: still refused
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, **kwargs: bool) -> Path:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), **kwargs)


def _refuse_non_file(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    reason = not_a_write_target(st)
    if reason == "is a symbolic link":
        reason += " (TableTune replaces files, not link targets)"
    if reason:
        raise NotAWriteTargetError(os.fspath(path), reason)


def _check_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotRegularFileError(path, kind)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, "rb")`` for regular files only (a symbolic link to one is fine).

    Raises ``FileNotFoundError`` and the other ``OSError`` of ``open``; ``IsADirectoryError`` for a
    folder; ``NotRegularFileError`` for a named pipe, device or socket, which is never opened for a
    blocking read.
    """
    p = os.fspath(path)
    _check_regular(p, os.stat(p).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(p, flags)
    try:
        _check_regular(p, os.fstat(fd).st_mode)  # replaced between stat and open: still refused
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike[str], limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` and its ``fstat``; ``FileTooLargeError`` (and
    nothing read) when it holds more than ``limit`` bytes. Other errors as ``open_regular``."""
    with open_regular(path) as fh:
        st = os.fstat(fh.fileno())
        if st.st_size > limit:
            raise FileTooLargeError(os.fspath(path), st.st_size, limit)
        raw = fh.read(limit + 1)
    if len(raw) > limit:  # it grew while being read
        raise FileTooLargeError(os.fspath(path), None, limit)
    return raw, st


def bounded_lines(fh: BinaryIO, limit: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, line without its newline, whether a newline ended it)`` of a binary file.

    Each line is read with ``limit``: a longer line raises ``LineTooLongError`` with its full size,
    counted in small pieces that are dropped as they are read.
    """
    no = 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        no += 1
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            del line
            while True:
                piece = fh.readline(_PIECE)
                if not piece:
                    break
                size += len(piece)
                if piece.endswith(b"\n"):
                    size -= 1
                    break
            raise LineTooLongError(no, size, limit)
        ended = line.endswith(b"\n")
        yield no, (line[:-1] if ended else line), ended


# -- strict JSON -----------------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a number JSON allows (NaN and Infinity are rejected)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise StrictJSONError(f"an integer of {digits} digits; at most {MAX_INT_DIGITS} digits are allowed")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError("a number too large to be a finite number (JSON allows only finite numbers)")
    return value


def _too_deep(obj: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (iterative: no recursion limit)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads(text: str, *, allow_nan: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` under the rules above; raises ``StrictJSONError`` or ``json.JSONDecodeError``.

    ``allow_nan``: accept ``NaN``, ``Infinity`` and overflowing numbers (for TableTune's own stored
    documents, written by ``json.dumps``, which writes them); the other rules still hold.
    """
    kw: dict[str, Any] = {"object_pairs_hook": _no_duplicates, "parse_int": _bounded_int}
    if not allow_nan:
        kw["parse_constant"] = _reject_constant
        kw["parse_float"] = _finite_float
    try:
        obj = json.loads(text, **kw)
    except RecursionError:
        raise StrictJSONError(f"arrays or objects nested more than {max_depth} levels deep") from None
    except StrictJSONError:
        raise
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. Python's own limit on integer digits, should a hook be bypassed
        raise StrictJSONError(str(exc)) from None
    if text.count("[") + text.count("{") > max_depth and isinstance(obj, (dict, list)) and _too_deep(obj, max_depth):
        raise StrictJSONError(f"arrays or objects nested more than {max_depth} levels deep")
    return obj

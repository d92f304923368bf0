"""Writing a published table: what publishing may replace, the ``--speculative-config`` companion
beside the file, the served verification's plot path, the publication lock, and the atomic write.

Writes are atomic (``strict_io.atomic_write_text``: temp file in the same folder, fsync, rename, fsync
of the folder; a symbolic link at the path is refused): a reader in another process sees either the
previous complete file or the new complete file, never a torn one. Stdlib only, plus the published
file's schema, strict reader and builder.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import PublishedTableError
from tabletune_pipelines.formats import strict_io
from tabletune_pipelines.formats.published import strict_json_loads
from tabletune_pipelines.formats.published_build import roundtrip_check
from tabletune_pipelines.formats.published_schema import CONTEXT_SCHEDULE_KEY, MAX_PUBLISHED_BYTES, PUBLISHED_SCHEMA
from tabletune_pipelines.formats.strict_io import atomic_write_text  # the one writer

# -- what publishing may replace ---------------------------------------------------------------
# Publishing replaces a file atomically, whatever is there. So before it does, the file there must
# be one TableTune wrote: a published table of the same deployment, or its speculative-config
# companion. Anything else (the DuckDB store, the fleet file, a symlink, an unrelated file) is
# refused before anything is written.

SPECULATIVE_CONFIG_SUFFIX = ".speculative-config.json"
"""``<stem>.speculative-config.json``: the paste-able ``--speculative-config`` beside a published table."""
MAX_COMPANION_BYTES = 1024 * 1024
"""A speculative-config companion is a few kB; a larger file there is not one."""
_ABSENT = object()


SERVED_PLOT_SUFFIX = ".served-verification.png"
"""``<stem>.served-verification.png``: the served verification's goodput-vs-load plot beside a published table."""


def served_plot_path(published_path: str | os.PathLike[str]) -> Path:
    """The served verification's plot beside a published table: ``<stem>.served-verification.png``."""
    p = Path(published_path)
    return p.with_name(p.stem + SERVED_PLOT_SUFFIX)


def speculative_config_path(published_path: str | os.PathLike[str]) -> Path:
    """The speculative-config companion of a published table: ``<stem>.speculative-config.json`` beside it."""
    p = Path(published_path)
    return p.with_name(p.stem + SPECULATIVE_CONFIG_SUFFIX)


def _refusal(path: Path, reason: str, what: str) -> PublishedTableError:
    return PublishedTableError(
        f"refusing to replace {path}: it {reason}, so it is not {what} TableTune wrote. Nothing was written; "
        "point the fleet's published_table at a path where nothing exists yet or at an earlier export, or move "
        "this file away")


def _existing_json(path: Path, what: str, limit: int) -> Any:
    """The decoded JSON of the regular file at ``path``, ``_ABSENT`` when nothing is there; refuses anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return _ABSENT
    except OSError as exc:
        raise PublishedTableError(f"cannot inspect {path} before replacing it ({exc.strerror or exc}); "
                                  "nothing was written") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, "is a symbolic link (TableTune replaces files, not link targets)", what)
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(path, "is not a regular file", what)
    if st.st_size > limit:
        raise _refusal(path, f"is {st.st_size} bytes, more than any {what} ({limit} bytes at most)", what)
    try:
        raw, _ = strict_io.read_bounded(path, limit)  # replaced by a FIFO since lstat: still never blocks
        return strict_json_loads(raw.decode("utf-8"))
    except (IsADirectoryError, strict_io.NotRegularFileError):
        raise _refusal(path, "is not a regular file", what) from None
    except strict_io.FileTooLargeError:
        raise _refusal(path, f"is more than any {what} ({limit} bytes at most)", what) from None
    except OSError as exc:
        raise PublishedTableError(f"cannot read {path} before replacing it ({exc.strerror or exc}); "
                                  "nothing was written") from None
    except ValueError:  # UnicodeDecodeError, JSONDecodeError and StrictJSONError are ValueErrors
        raise _refusal(path, "is not a JSON document", what) from None


def check_published_target(path: str | os.PathLike[str], deployment: str | None = None) -> int:
    """Raise ``PublishedTableError`` unless ``path`` is free or holds a published table (of ``deployment``);
    the version of the table there (0: none, or none that is an integer)."""
    p = Path(path)
    what = "a published table"
    doc = _existing_json(p, what, MAX_PUBLISHED_BYTES)
    if doc is _ABSENT:
        return 0
    if not isinstance(doc, dict) or doc.get("schema") != PUBLISHED_SCHEMA:
        raise _refusal(p, f"has no \"schema\": {PUBLISHED_SCHEMA!r}", what)
    owner = doc.get("deployment")
    if deployment is not None and owner != deployment:
        raise PublishedTableError(
            f"refusing to replace {p}: it is the published table of deployment {owner!r}, not {deployment!r}. "
            "Nothing was written; give each deployment its own published_table")
    version = doc.get("version")
    return version if type(version) is int and version > 0 else 0


def check_speculative_config_target(path: str | os.PathLike[str]) -> None:
    """Raise ``PublishedTableError`` unless ``path`` is free or holds a speculative config with a table
    (``num_speculative_tokens_per_batch_size``, or the 5-item ``speculative_token_schedule``: what
    TableTune writes there)."""
    p = Path(path)
    what = "a speculative-config companion"
    doc = _existing_json(p, what, MAX_COMPANION_BYTES)
    if doc is _ABSENT:
        return
    if not isinstance(doc, dict) or not ({"num_speculative_tokens_per_batch_size", CONTEXT_SCHEDULE_KEY} & set(doc)):
        raise _refusal(p, "is not a --speculative-config with num_speculative_tokens_per_batch_size", what)


def check_publish_targets(path: str | os.PathLike[str], deployment: str | None = None) -> int:
    """Everything a publication replaces: the published table and its speculative-config companion
    (raises ``PublishedTableError``); the version of the published table there now (0: none)."""
    version = check_published_target(path, deployment)
    check_speculative_config_target(speculative_config_path(path))
    return version


def write_speculative_config_companion(path: str | os.PathLike[str], document: Mapping[str, Any]) -> Path:
    """Write the paste-able ``--speculative-config`` of a published ``document`` beside the published
    table at ``path`` (``<stem>.speculative-config.json``, atomically), after the slot check."""
    target = speculative_config_path(path)
    check_speculative_config_target(target)
    return atomic_write_text(target, json.dumps(document["speculative_config"], indent=2, sort_keys=True) + "\n")


# -- one publication at a time per published file ----------------------------------------------
# Publishing allocates a version in the store and writes the file; two publishers of one deployment
# interleaving those steps would leave the store's version and the file's holding different tables.
# An exclusive ``flock`` on a lock file beside the published table, held from the version allocation
# to the last write, serialises them on one host (flock is not reliable on every network file system;
# the store's primary key then turns a race into a retry, see TableTuneStore.publish).

PUBLICATION_LOCK_TIMEOUT_S = 120.0
"""How long a publisher waits for another publication of the same file before giving up."""


def publication_lock_path(path: str | os.PathLike[str]) -> Path:
    """``.<name>.lock`` beside the published table: created once, never removed (removing a lock file
    another process has open would let a third lock a new one at the same time)."""
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


@contextmanager
def publication_lock(path: str | os.PathLike[str], timeout_s: float = PUBLICATION_LOCK_TIMEOUT_S) -> Iterator[Path]:
    """Hold the exclusive publication lock of the published table at ``path`` (the folder is created
    if missing). ``PublishedTableError`` when the lock file cannot be opened (a symlink, a folder, no
    permission) or another publication holds it for longer than ``timeout_s``."""
    lock = publication_lock_path(path)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise PublishedTableError(f"cannot open the publication lock {lock} ({exc.strerror or exc}); nothing was "
                                  "written. TableTune keeps this lock file beside the published table: make the "
                                  "folder writable, or move what is at that path away") from None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PublishedTableError(
                        f"another publication of {Path(path)} has held {lock} for more than {timeout_s:g} s; nothing "
                        "was written. Wait for it to finish (or stop it) and publish again") from None
                time.sleep(0.05)
        yield lock
    finally:
        os.close(fd)  # releases the lock


def write_published_table(path: str | os.PathLike[str], document: dict[str, Any]) -> Path:
    """Write a published ``document`` to ``path`` atomically, after the strict reader's check and the slot check."""
    if not isinstance(document, dict) or document.get("schema") != PUBLISHED_SCHEMA:
        got = document.get("schema") if isinstance(document, dict) else None
        raise PublishedTableError(f"refusing to write a document with schema {got!r} to {path}")
    roundtrip_check(document, str(path))
    check_published_target(path, document.get("deployment"))
    return atomic_write_text(path, json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n")

"""The published-table file: what the pipeline exports and the controller loads as its prior.

Stdlib only, so the controller inside vLLM can read it. Writes are atomic (temp file in the same
folder, fsync, rename, fsync of the folder): a reader in another process sees either the previous
complete file or the new complete file, never a torn one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tabletune_pipelines.errors import TableTuneError

PUBLISHED_SCHEMA = "tabletune.published_table"
PUBLISHED_SCHEMA_VERSION = 1


class PublishedTableError(TableTuneError, ValueError):
    """The published-table file is missing, unreadable, or not a TableTune published table."""


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that readers never see a partial file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def published_document(
    *, deployment: str, version: int, table: dict[str, Any], speculative_config: dict[str, Any], published_at: str
) -> dict[str, Any]:
    """The JSON body of a published table (``table`` is a DraftLengthTable's ``to_dict()``)."""
    return {
        "schema": PUBLISHED_SCHEMA,
        "schema_version": PUBLISHED_SCHEMA_VERSION,
        "deployment": deployment,
        "version": int(version),
        "published_at": published_at,
        "table": table,
        "speculative_config": speculative_config,
    }


def write_published_table(path: str | os.PathLike[str], document: dict[str, Any]) -> Path:
    if document.get("schema") != PUBLISHED_SCHEMA:
        raise PublishedTableError(f"refusing to write a document with schema {document.get('schema')!r}")
    return atomic_write_text(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def read_published_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and sanity-check a published table file; errors say which file and what is wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PublishedTableError(f"published table {p} does not exist; publish one with the pipeline first") from None
    except OSError as exc:
        raise PublishedTableError(f"cannot read published table {p}: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PublishedTableError(f"published table {p} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != PUBLISHED_SCHEMA:
        raise PublishedTableError(f"{p} is not a TableTune published table (schema {doc.get('schema') if isinstance(doc, dict) else None!r})")
    if doc.get("schema_version") != PUBLISHED_SCHEMA_VERSION:
        raise PublishedTableError(
            f"{p} has schema_version {doc.get('schema_version')!r}; this reader understands {PUBLISHED_SCHEMA_VERSION}"
        )
    for key in ("deployment", "version", "table", "speculative_config"):
        if key not in doc:
            raise PublishedTableError(f"published table {p} lacks the field {key!r}")
    return doc

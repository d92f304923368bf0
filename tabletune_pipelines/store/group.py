"""The base of the store's table groups (``identities``, ``profiles``, ``priors``,
``publications``): what each group reads of the store that owns the connection
(``store/duckdb_store.py``'s ``TableTuneStore``), and the helpers every group uses: the timestamp a
row is written with and the listing a ``NotFoundError`` ends with."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

#: How many existing ids a NotFoundError lists.
_LISTED = 10


def now() -> datetime:
    """The time a row is written with: UTC, without a time zone (DuckDB's ``TIMESTAMP``)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def listing(what: str, ids: list[str], how: str) -> str:
    """``"; the store has: a, b, ... (N in all)"`` or what to do when it has none."""
    if not ids:
        return f"; the store has no {what} yet ({how})"
    more = f", ... ({len(ids)} in all)" if len(ids) > _LISTED else ""
    return f"; the store has: {', '.join(ids[:_LISTED])}{more}"


class TableGroup:
    """The tables of one group of the store. The methods of a group run their SQL through the store's
    one connection owner, ``TableTuneStore``: ``query`` for a read, ``_transaction`` for a write."""

    # Set by ``TableTuneStore``, which documents them.
    path: Path
    read_only: bool

    if TYPE_CHECKING:
        def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]: ...

        def _transaction(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]: ...

    def _has_column(self, table: str, column: str) -> bool:
        return bool(self.query("SELECT 1 FROM duckdb_columns() WHERE database_name = current_database() AND "
                               "schema_name = 'main' AND table_name = ? AND column_name = ?", [table, column]))

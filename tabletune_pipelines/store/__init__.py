"""DuckDB store of measurements, tables and publications: the project's only SQL (imports duckdb)."""

from tabletune_pipelines.store.duckdb_store import TableTuneStore

__all__ = ["TableTuneStore"]

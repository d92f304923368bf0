"""DuckDB store of measurements, tables and publications (imports duckdb: pipeline side only)."""

from tabletune_pipelines.store.duckdb_store import TableTuneStore

__all__ = ["TableTuneStore"]

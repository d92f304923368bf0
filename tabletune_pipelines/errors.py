"""Errors raised on bad input. Every message names the offending value and says what to do."""


class TableTuneError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidAcceptanceError(TableTuneError, ValueError):
    """Acceptance rates outside [0, 1], not finite, or increasing with draft position."""


class InvalidStepTimeError(TableTuneError, ValueError):
    """A step time that is missing, not finite or not positive."""


class EmptyProfileError(TableTuneError, ValueError):
    """A step-time profile with no usable cells."""


class InvalidTableError(TableTuneError, ValueError):
    """A draft-length table that vLLM would reject (gaps, overlaps, bad k, bad bounds)."""


class SchemaVersionError(TableTuneError, ValueError):
    """A JSON document written by an incompatible schema version."""


class StoreError(TableTuneError):
    """The DuckDB store could not be used."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file open for writing."""


class StoreCorruptError(StoreError):
    """The file exists but is not a readable DuckDB database."""

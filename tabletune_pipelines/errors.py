"""The one error hierarchy. Every error a user can cause is a ``TableTuneError`` whose message
names the file, key or value at fault and says what to do; the CLI prints it as one
``error: ...`` line and exits 2.

Stdlib only. Errors tied to one module's format live here too, so the whole vocabulary of failures
is on one page; a few engine- and deployment-side subclasses live next to their code and subclass
these (``engine/errors.py``: ``EngineError``, ``EngineConfigError`` ...; ``published.py``:
``PublishedTableError``; ``live_counters.py``: ``LiveCountersError``).

Classes that also subclass ``ValueError`` or ``KeyError`` do so for callers written before the
hierarchy (``except ValueError`` keeps working).
"""

from __future__ import annotations


class TableTuneError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidValueError(TableTuneError, ValueError):
    """An argument or setting outside its allowed range (names the value and the range)."""


class UsageError(TableTuneError, ValueError):
    """A command-line argument that cannot be used (names the option and the value)."""


class NotFoundError(TableTuneError, KeyError):
    """Something asked for by name or id (an identity, a prior, a table, a profile) is not there."""

    def __str__(self) -> str:  # KeyError's own __str__ would quote the message
        return str(self.args[0]) if self.args else ""


class PipelineFailure(TableTuneError):
    """A pipeline step that cannot produce what it was asked for (no prompts, no profile, no prior, a
    table refused before publishing): the message says why and what was left unchanged. ``details``
    are the figures behind it (plain JSON values); the Dagster layer raises it as a ``dg.Failure``
    with them as metadata."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details: dict = dict(details or {})


# -- the method's inputs (core/) ---------------------------------------------------------------

class InvalidAcceptanceError(TableTuneError, ValueError):
    """Acceptance rates outside [0, 1], not finite, increasing with draft position, or too few."""


class InvalidStepTimeError(TableTuneError, ValueError):
    """A step time that is missing, not finite, not positive, or too long to be a step (``vocab.MAX_STEP_MS``)."""


class EmptyProfileError(TableTuneError, ValueError):
    """A step-time profile with no usable cells, or without a cell the question needs."""


class InvalidTableError(TableTuneError, ValueError):
    """A draft-length table that vLLM would reject (gaps, overlaps, bad k, bad bounds)."""


# -- documents and files -----------------------------------------------------------------------

class SchemaVersionError(TableTuneError, ValueError):
    """A JSON document of another kind or an incompatible schema version."""


class DocumentError(SchemaVersionError):
    """A JSON document of the right kind and version whose fields are missing or wrong."""


class FleetError(TableTuneError, ValueError):
    """The fleet file is missing, malformed, or does not follow the schema."""


class PromptFileError(TableTuneError, ValueError):
    """A prompt file that is missing, empty, unreadable or malformed (names the line, never quotes it)."""


class PlotTargetError(TableTuneError, ValueError):
    """A plot path where TableTune may not write: something it did not write is there (names the path
    and what is there), or its folder is missing."""


class UnwritablePathError(TableTuneError):
    """A folder TableTune must write in (``$TABLETUNE_HOME`` for the fingerprint key, the store's
    folder, an export's output folder) cannot be created or written; names it and what to do."""


# -- the store ---------------------------------------------------------------------------------

class StoreError(TableTuneError):
    """The DuckDB store could not be used."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file open for writing."""


class StoreCorruptError(StoreError):
    """The file exists but is not a readable DuckDB database (another kind of file, truncated, or
    failing DuckDB's checksums)."""


class StoredDataError(StoreCorruptError):
    """A row of the store whose values cannot be a measurement (a step-time cell with a NaN, infinite,
    negative or absurd repetition); names the row (identity, k, batch size) and the value."""

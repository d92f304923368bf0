"""Errors of the vLLM-facing engine package. All subclass ``TableTuneError``."""

from __future__ import annotations

from tabletune_pipelines.errors import PromptFileError, TableTuneError

__all__ = ["EngineConfigError", "EngineCrashedError", "EngineError", "EngineStartupError", "EngineStartupTimeout",
           "ModelNotFoundError", "PortInUseError", "PromptFileError", "VocabMismatchError"]


class EngineError(TableTuneError):
    """The vLLM server could not be used (failed start, crash, hang, bad answer)."""

    def __init__(self, message: str, log_tail: str | None = None) -> None:
        if log_tail:
            message = f"{message}\n--- last lines of the server log ---\n{log_tail}"
        super().__init__(message)
        self.log_tail = log_tail


class EngineConfigError(TableTuneError, ValueError):
    """A server configuration that cannot work (names the bad value)."""


class ModelNotFoundError(EngineConfigError):
    """The target model or drafter path does not exist."""


class VocabMismatchError(EngineConfigError):
    """The drafter's vocabulary differs from the target's."""


class PortInUseError(EngineConfigError):
    """The requested port is already taken."""


class EngineStartupError(EngineError):
    """The server exited or never became healthy during start-up."""


class EngineStartupTimeout(EngineStartupError):
    """The server did not answer /health within ``startup_timeout``."""


class EngineCrashedError(EngineError):
    """The server process died while in use."""

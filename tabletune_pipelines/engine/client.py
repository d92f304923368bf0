"""HTTP client of one vLLM OpenAI-compatible server: health, completions, metrics, version
(``version_from_answer`` is the one reading of ``GET /version``, for remote deployments too).

Stdlib only (``urllib``). Errors are ``EngineError``s; ``EngineUnreachable`` when nothing
answered. ``ServerClient`` makes the same requests to a server this process launched
(``VLLMServer``'s requests): on ``EngineUnreachable`` it checks whether the server died, and every
failure quotes the server log's tail.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Protocol

from tabletune_pipelines.engine.config import SERVED_MODEL_NAME
from tabletune_pipelines.engine.installed import with_cpu_suffix
from tabletune_pipelines.errors import EngineError, EngineUnreachable

Prompt = str | list[int] | list[str] | list[list[int]]
"""One prompt (text or token ids) or a batch of them (a list of texts or of token-id lists)."""


def http_request(url: str, *, data: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET (or POST JSON ``data``) ``url``; returns (status, body). Raises OSError/URLError when
    nothing answers; an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1 / configured URL
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class EngineClient:
    """Requests to one server at ``base_url`` (e.g. ``http://127.0.0.1:8000``)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        """Scheme, host and port of the server."""

    def _call(self, path: str, *, data: bytes | None = None, timeout: float) -> tuple[int, bytes]:
        try:
            return http_request(self.base_url + path, data=data, timeout=timeout)
        except (OSError, urllib.error.URLError, ValueError) as exc:  # ValueError: a malformed URL
            raise EngineUnreachable(f"{self.base_url}{path} did not answer: {exc!r}") from None

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when ``/health`` answers 200; False when it answers otherwise or not at all."""
        try:
            status, _ = self._call("/health", timeout=timeout)
        except EngineUnreachable:
            return False
        return status == 200

    def health_status(self, timeout: float = 10.0) -> int:
        """``/health``'s status code; raises ``EngineUnreachable`` when nothing answers."""
        return self._call("/health", timeout=timeout)[0]

    def complete(self, prompt: Prompt, *, max_tokens: int, ignore_eos: bool = False, temperature: float = 0.0,
                 seed: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """One ``/v1/completions`` request (a list of prompts = one batch); the decoded JSON answer.

        Token-id prompts (``list[int]`` / ``list[list[int]]``) skip the tokenizer, so they work
        with any model whatever its vocabulary's words.
        """
        body: dict[str, Any] = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": temperature, "ignore_eos": ignore_eos}
        if seed is not None:
            body["seed"] = seed
        status, raw = self._call("/v1/completions", data=json.dumps(body).encode(), timeout=timeout)
        if status != 200:
            # The answer can echo the request (logged user prompts during acceptance runs): report
            # only its shape and vLLM's error type, never the body.
            raise EngineError(f"completion request answered {status} ({_error_type(raw)}, {len(raw)} bytes)")
        return json.loads(raw)

    def count_tokens(self, prompt: str, timeout: float = 30.0) -> int:
        """The prompt's length in tokens as the server's tokenizer counts it for a completion
        (``POST /tokenize``, special tokens added: a completion's ``usage.prompt_tokens``)."""
        body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "add_special_tokens": True}
        status, raw = self._call("/tokenize", data=json.dumps(body).encode(), timeout=timeout)
        if status != 200:  # the answer can echo the prompt: only its shape and vLLM's error type
            raise EngineError(f"/tokenize answered {status} ({_error_type(raw)}, {len(raw)} bytes)")
        try:
            count = json.loads(raw)["count"]
        except (ValueError, KeyError, TypeError):
            count = None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise EngineError(f"/tokenize answered without an integer count ({len(raw)} bytes)")
        return count

    def metrics_text(self, timeout: float = 10.0) -> str:
        """``/metrics`` (Prometheus text exposition)."""
        status, raw = self._call("/metrics", timeout=timeout)
        if status != 200:
            raise EngineError(f"/metrics answered {status}")
        return raw.decode()

    def version(self, timeout: float = 10.0) -> str:
        """The vLLM version the server reports: ``GET /version`` read by ``version_from_answer``."""
        url = self.base_url + "/version"
        status, raw = self._call("/version", timeout=timeout)
        if status != 200:
            raise EngineError(f"{url} answered {status}")
        return version_from_answer(raw, url)


class LaunchedServer(Protocol):
    """What ``ServerClient`` needs of the server process it talks to (``engine.process.ServerProcess``)."""

    device: str
    """``cpu`` or ``gpu``: the CPU build's version carries ``+cpu``."""

    @property
    def client(self) -> EngineClient: ...
    def check_alive(self) -> None: ...
    def log_tail(self, lines: int = 40) -> str: ...


class ServerClient:
    """Requests to a server this process launched: ``EngineClient``'s, with the server's log on failures."""

    def __init__(self, server: LaunchedServer) -> None:
        self.server = server
        """The server process (its address is known once it has started)."""

    def complete(self, prompt: Prompt, *, max_tokens: int, ignore_eos: bool = False,
                 temperature: float = 0.0, seed: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """One ``/v1/completions`` request (a list of prompts = one batch); returns the decoded JSON answer."""
        try:
            return self.server.client.complete(prompt, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                               temperature=temperature, seed=seed, timeout=timeout)
        except EngineUnreachable as exc:
            self.server.check_alive()
            raise EngineError(f"completion request failed: {exc}", self.server.log_tail()) from None
        except EngineError as exc:
            raise EngineError(str(exc), self.server.log_tail(10)) from None

    def count_tokens(self, prompt: str) -> int:
        """The prompt's length in tokens (``EngineClient.count_tokens``)."""
        try:
            return self.server.client.count_tokens(prompt)
        except EngineError as exc:
            raise EngineError(str(exc), self.server.log_tail(10)) from None

    def metrics_text(self) -> str:
        """``/metrics`` (Prometheus text exposition)."""
        try:
            return self.server.client.metrics_text()
        except EngineError as exc:
            raise EngineError(str(exc), self.server.log_tail(10)) from None

    def version(self) -> str:
        """``/version``; the CPU build's answer carries ``+cpu`` like ``installed_vllm_version``."""
        v = self.server.client.version()
        return with_cpu_suffix(v) if self.server.device == "cpu" else v


def version_from_answer(raw: bytes, url: str = "/version") -> str:
    """The version in vLLM's ``/version`` answer ``{"version": "0.32.0"}``: the one reading of it.

    Anything else is an ``EngineError`` naming ``url`` and the answer: not JSON, not an object, no
    ``version``, or a version that is not a non-empty string (an empty answer would make an engine
    identity with no version, so it is refused like a missing one).
    """
    try:
        version = json.loads(raw).get("version")
    except (ValueError, AttributeError):
        version = None
    if not isinstance(version, str) or not version.strip():
        raise EngineError(f"{url} answered {raw[:200]!r}, not vLLM's {{\"version\": \"<non-empty>\"}}")
    return version.strip()  # validated stripped, so returned stripped (it becomes part of an identity key)


def _error_type(raw: bytes) -> str:
    """vLLM's error ``type`` from an error answer (a short fixed vocabulary), or "no error type"."""
    try:
        err = json.loads(raw).get("error", {})
        kind = err.get("type") if isinstance(err, dict) else None
    except (ValueError, AttributeError):
        kind = None
    return str(kind)[:64] if isinstance(kind, str) and kind.replace("_", "").isalnum() else "no error type"

"""The graph envelope a launched vLLM reports in its log, checked against the engine identity's.

A profile, an acceptance prior and a served verification are labelled with their engine identity,
whose graph envelope (``capture_ceiling``, ``max_num_batched_tokens``) prices every served step. A
measurement taken in another envelope would be labelled and priced wrongly, so every measuring
launch (``tuning.deployments``) reads what the server says it runs, once it is healthy, and refuses
the measurement when that differs from the identity (``EngineMismatchError`` naming both).

What vLLM prints at start-up (checked against vLLM 0.26 logs and the 0.32 source):

* ``Initializing a V1 LLM engine (v<version>) with config: ... compilation_config={...
  'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, ... 'max_cudagraph_capture_size': 512,
  ...}, ...`` (``vllm/v1/engine/core.py``, ``EngineCore.__init__``; the dict is
  ``CompilationConfig.__repr__``). On an eager engine (the CPU build, ``--enforce-eager``) the mode is
  ``NONE`` and the ceiling ``None`` or 0: no graphs.
* ``Chunked prefill is enabled with max_num_batched_tokens=<N>.`` (``vllm/config/scheduler.py``,
  ``SchedulerConfig.__post_init__``): the token budget the scheduler runs. The CPU build disables
  chunked prefill and prints no such line; the budget is then not checked (a note says so).
* ``Truncating max_cudagraph_capture_size to <N>`` (``vllm/config/vllm.py``, ``_set_cudagraph_sizes``):
  vLLM rounded a requested ceiling down to its capture grid; the comparison
  (``formats.identity_match.vllm_capture_ceiling``) counts both as one envelope.
* ``Graph capturing finished in <S> secs, took <G> GiB`` (``vllm/v1/worker/gpu_model_runner.py`` and
  ``vllm/v1/worker/gpu/model_runner.py``), ``Available KV cache memory: <G> GiB``
  (``vllm/v1/worker/gpu_worker.py``) and ``GPU KV cache size: <N> tokens``
  (``vllm/v1/core/kv_cache_utils.py``): what an envelope costs (``capture_cost``).

Where the log carries no such figure the check is skipped for that field with a note, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletune_pipelines.core.stepcost import default_capture_ceiling
from tabletune_pipelines.errors import EngineMismatchError
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.identity_match import ENVELOPE_FIELDS, identity_mismatches, vllm_capture_ceiling

ENGINE_CONFIG_LINE = "Initializing a V1 LLM engine"
"""The start of vLLM's engine-config line (``vllm/v1/engine/core.py``)."""
MAX_LOG_BYTES = 16 * 1024 * 1024
"""How much of a server log is read: start-up lines come first."""

_CEILING = re.compile(r"'max_cudagraph_capture_size':\s*(None|\d+)")
_MODE = re.compile(r"'cudagraph_mode':\s*<CUDAGraphMode\.([A-Z_]+)")
_BUDGET = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_TRUNCATED = re.compile(r"Truncating max_cudagraph_capture_size to (\d+)")
_CAPTURE = re.compile(r"Graph capturing finished in (\d+(?:\.\d+)?) secs, took (-?\d+(?:\.\d+)?) GiB")
_KV_GIB = re.compile(r"Available KV cache memory: (-?\d+(?:\.\d+)?) GiB")
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


@dataclass(frozen=True)
class ReportedEnvelope:
    """The envelope a server's log reports; a field is None where the log does not say."""

    config_line: bool
    """Whether the log has vLLM's engine-config line at all."""
    cudagraph_mode: str | None = None
    """vLLM's ``CUDAGraphMode`` name (``FULL_AND_PIECEWISE``, ``NONE``, ...)."""
    capture_ceiling: int | None = None
    """The ceiling in tokens; None: no graphs or not reported (``graphs``)."""
    graphs: bool | None = None
    """True: graphs up to ``capture_ceiling``; False: the engine captures none; None: not reported."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget (None: not printed, e.g. without chunked prefill)."""
    truncated_to: int | None = None
    """The ceiling vLLM said it truncated a requested one to (None: no such line)."""


@dataclass(frozen=True)
class CaptureCost:
    """What the graphs of one launch cost, from its log; None where the log does not say."""

    capture_s: float | None
    """Seconds of graph capture (the longest worker's)."""
    graph_gib: float | None
    """GPU memory the graphs took, GiB (the largest worker's)."""
    kv_cache_gib: float | None = None
    """GPU memory left for the KV cache, GiB (it shrinks as graph memory grows)."""
    kv_cache_tokens: int | None = None
    """Tokens the KV cache holds."""

    def describe(self) -> str:
        parts = []
        if self.capture_s is not None:
            parts.append(f"capture {self.capture_s:.0f} s")
        if self.graph_gib is not None:
            parts.append(f"graphs {self.graph_gib:.2f} GiB")
        if self.kv_cache_gib is not None:
            parts.append(f"KV cache {self.kv_cache_gib:.2f} GiB")
        if self.kv_cache_tokens is not None:
            parts.append(f"{self.kv_cache_tokens:,} KV tokens")
        return ", ".join(parts) if parts else "not in the launch log (no graphs captured, or not logged)"


def read_envelope(text: str) -> ReportedEnvelope:
    """The envelope in a server log's text (the last engine-config line: a log may hold restarts)."""
    lines = [ln for ln in text.splitlines() if ENGINE_CONFIG_LINE in ln]
    budget = _BUDGET.findall(text)
    truncated = _TRUNCATED.findall(text)
    common: dict[str, Any] = {"max_num_batched_tokens": int(budget[-1]) if budget else None,
                              "truncated_to": int(truncated[-1]) if truncated else None}
    if not lines:
        return ReportedEnvelope(config_line=False, **common)
    line = lines[-1]
    comp = line[line.find("compilation_config="):] if "compilation_config=" in line else line
    mode_m, ceiling_m = _MODE.search(comp), _CEILING.search(comp)
    mode = mode_m.group(1) if mode_m else None
    raw = ceiling_m.group(1) if ceiling_m else None
    ceiling = int(raw) if raw not in (None, "None") else None
    if mode == "NONE" or (raw is not None and not ceiling):
        graphs: bool | None = False
        ceiling = None
    else:
        graphs = True if ceiling else None
    return ReportedEnvelope(config_line=True, cudagraph_mode=mode, capture_ceiling=ceiling, graphs=graphs, **common)


def capture_cost(text: str) -> CaptureCost:
    """The capture time, graph memory and KV cache of a launch, from its log's text."""
    caps = [(float(s), float(g)) for s, g in _CAPTURE.findall(text)]
    kv = [float(g) for g in _KV_GIB.findall(text)]
    tokens = [int(t.replace(",", "")) for t in _KV_TOKENS.findall(text)]
    return CaptureCost(capture_s=max(s for s, _ in caps) if caps else None,
                       graph_gib=max(g for _, g in caps) if caps else None,
                       kv_cache_gib=min(kv) if kv else None, kv_cache_tokens=min(tokens) if tokens else None)


def read_log(path: str | Path | None) -> str:
    """The first ``MAX_LOG_BYTES`` of a server log ("" when there is none)."""
    if path is None or not Path(path).is_file():
        return ""
    with open(path, "rb") as fh:
        return fh.read(MAX_LOG_BYTES).decode("utf-8", "replace")


def expected_envelope(identity: EngineIdentity, *, launch_k: int, max_num_seqs: int) -> dict[str, int | None]:
    """The envelope a launch of ``identity`` must run in (``ENVELOPE_FIELDS``; None: not checked).

    At the identity's own shape that is the identity's. A launch of another shape (the no-speculation
    baseline, K = 0; a fixed-k baseline, K = k) gets the identity's ceiling when the identity pins
    one, else vLLM's rule at that launch's shape (``core.stepcost.default_capture_ceiling``)."""
    ceiling = identity.capture_ceiling
    if ceiling is not None and (launch_k, max_num_seqs) != (identity.max_k, identity.max_num_seqs):
        if ceiling == default_capture_ceiling(identity.max_num_seqs, identity.max_k):
            ceiling = default_capture_ceiling(max_num_seqs, launch_k)
    if identity.cudagraph_mode == "none":
        ceiling = None
    return {"capture_ceiling": ceiling, "max_num_batched_tokens": identity.max_num_batched_tokens}


def envelope_findings(identity: EngineIdentity, reported: ReportedEnvelope, *, launch_k: int,
                      max_num_seqs: int) -> tuple[list[str], list[str]]:
    """(mismatches, notes): what differs between the identity's envelope and the reported one, by
    the one comparison (``identity_match.identity_mismatches``), and what could not be checked."""
    want = expected_envelope(identity, launch_k=launch_k, max_num_seqs=max_num_seqs)
    notes: list[str] = []
    got: dict[str, Any] = {"capture_ceiling": reported.capture_ceiling,
                           "max_num_batched_tokens": reported.max_num_batched_tokens}
    mismatches: list[str] = []
    if want["capture_ceiling"] is None:
        notes.append("the identity records no CUDA graphs: the capture ceiling is not checked")
    elif reported.graphs is False:
        mismatches.append(f"capture ceiling (max_cudagraph_capture_size) {want['capture_ceiling']} != the server's: "
                          f"it captures no CUDA graphs (cudagraph_mode {reported.cudagraph_mode or 'NONE'})")
    elif reported.capture_ceiling is None:
        notes.append("the log reports no max_cudagraph_capture_size: the capture ceiling is not checked")
    if want["max_num_batched_tokens"] is not None and reported.max_num_batched_tokens is None:
        notes.append("the log reports no max_num_batched_tokens (no chunked-prefill line): the token budget is "
                     "not checked")
    mismatches += identity_mismatches(want, got, fields=ENVELOPE_FIELDS, running_name="the server's")
    c, r = want["capture_ceiling"], reported.capture_ceiling
    if c is not None and r is not None and c != r and vllm_capture_ceiling(c) == r:
        notes.append(f"vLLM rounds the capture ceiling {c} down to its capture grid: it runs {r}")
    return mismatches, notes


def check_envelope(identity: EngineIdentity, log_text: str, *, launch_k: int, max_num_seqs: int, where: str = "",
                   note: Callable[[str], None] | None = None) -> ReportedEnvelope:
    """Raise ``EngineMismatchError`` naming both envelopes when the server's log reports another
    envelope than ``identity``'s; hand what could not be checked to ``note``."""
    reported = read_envelope(log_text)
    mismatches, notes = envelope_findings(identity, reported, launch_k=launch_k, max_num_seqs=max_num_seqs)
    if not reported.config_line:
        notes = [f"the server log has no '{ENGINE_CONFIG_LINE}' line: the graph envelope is not checked"]
    if mismatches:
        want = expected_envelope(identity, launch_k=launch_k, max_num_seqs=max_num_seqs)
        got = {"capture_ceiling": reported.capture_ceiling, "max_num_batched_tokens": reported.max_num_batched_tokens}
        trunc = (f"; vLLM logged 'Truncating max_cudagraph_capture_size to {reported.truncated_to}'"
                 if reported.truncated_to is not None else "")
        raise EngineMismatchError(
            f"the server{(' ' + where) if where else ''} runs another graph envelope than engine {identity.key}: "
            + "; ".join(mismatches) + f" (the identity's: {_show(want)}; the server's log: {_show(got)}{trunc}). "
            "A measurement there would be labelled and priced as the identity's envelope, so it is refused: "
            "set the fleet's max_cudagraph_capture_size / max_num_batched_tokens to what vLLM runs "
            "(the capture ceiling at most the token budget, on vLLM's capture grid), or launch with the identity's")
    if note is not None:
        for n in notes:
            note(f"graph envelope check: {n}")
    return reported


def _show(envelope: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {'not set' if v is None else v}" for k, v in envelope.items())


def envelope_checked(identity: EngineIdentity, note: Callable[[str], None] | None = None) -> Callable[[Any], Any]:
    """A ``VLLMServer`` factory (``engine.profile_run.ProfileServers.factory``, or ``factory(cfg)`` as a
    context manager) whose servers check their envelope against ``identity`` once healthy; a server
    that runs another envelope is stopped and ``EngineMismatchError`` raised."""
    from tabletune_pipelines.engine.process import VLLMServer

    class EnvelopeCheckedServer(VLLMServer):
        envelope: ReportedEnvelope | None = None

        def start(self) -> EnvelopeCheckedServer:
            super().start()
            cfg = self.config
            text = read_log(self.log_path)
            try:
                self.envelope = check_envelope(
                    identity, text, launch_k=int(cfg.num_speculative_tokens or 0) if cfg.method else 0,
                    max_num_seqs=int(cfg.max_num_seqs), where=f"(log {self.log_path})", note=note)
            except BaseException:
                self.stop()
                raise
            if note is not None and self.envelope.graphs:
                note(f"graph envelope: capture ceiling {self.envelope.capture_ceiling}; "
                     f"{capture_cost(text).describe()}")
            return self

    return EnvelopeCheckedServer

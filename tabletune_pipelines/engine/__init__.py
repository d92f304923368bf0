"""vLLM driver: launch/stop servers, the timing protocol, metrics, tiny local models.

Importing this package is cheap: the names below load their module on first use, and vLLM,
torch and transformers are imported only by the code that runs inside vLLM (``cpu_plugin``,
``timing_scheduler``, ``launcher``) or builds models (``tiny_models``). Nothing here imports Dagster.

Modules, one job each:
    config          ServerConfig: everything one launch needs, validated on construction
    command         build_command / build_env: the argv and environment of a launch
    process         VLLMServer (composes the next three) and ServerProcess: lifecycle (start,
                    health, stop, kill, log tail)
    client          EngineClient: HTTP (completions, /metrics, /version, /health); ServerClient:
                    the same for a launched server, its log tail on failures
    runtime_control RuntimeControl: runtime k, table, admission gate, synthetic rates (control files)
    step_log        StepLog: reading a launch's per-step records
    installed       which vLLM is installed, is it the CPU build, resolve_device
    dtype           the default model dtype: bfloat16 on a GPU and a CPU with native bf16, else float32
    identity        EngineIdentity of a launch config or a fleet deployment (one graph rule)
    plan            ProfileOptions, ProfilePlan, default_plan, the launches a plan needs
    cell            one measurement of one cell T(B, k)
    progress        ProfilerProgress: progress lines and ETA
    profiler        profile_step_times (orchestration), ProfileHooks (store_hooks), ProfileServers
    acceptance      measure_acceptance(...) -> AcceptancePrior, prompt sampling, spec counters
    timing_scheduler  --scheduler-cls: per-step records, runtime k switching, admission gate
    cpu_plugin      vLLM general plugin: synthetic rejection on the CPU build
    launcher        python -m tabletune_pipelines.engine.launcher serve MODEL ... (CPU build)
    tiny_models     ensure_tiny_models(cache_dir, size, dtype) -> TinyModels
Its errors (``EngineError`` and friends) are in ``tabletune_pipelines.errors``, the one hierarchy.
The control-file protocol the server side, the timing scheduler and the CPU plugin share is
``tabletune_pipelines.formats.control_protocol``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tabletune_pipelines.engine.acceptance import measure_acceptance
    from tabletune_pipelines.engine.config import ServerConfig
    from tabletune_pipelines.engine.plan import ProfileOptions
    from tabletune_pipelines.engine.process import VLLMServer
    from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileServers
    from tabletune_pipelines.engine.profiler import profile_step_times

_EXPORTS = {
    "ServerConfig": "tabletune_pipelines.engine.config",
    "VLLMServer": "tabletune_pipelines.engine.process",
    "ProfileOptions": "tabletune_pipelines.engine.plan",
    "profile_step_times": "tabletune_pipelines.engine.profiler",
    "ProfileHooks": "tabletune_pipelines.engine.profile_run",
    "ProfileServers": "tabletune_pipelines.engine.profile_run",
    "measure_acceptance": "tabletune_pipelines.engine.acceptance",
}

# Written out (not ``sorted(_EXPORTS)``) so that linters and type checkers see the re-exports; a test
# checks it lists exactly the keys of ``_EXPORTS``.
__all__ = [
    "ProfileHooks",
    "ProfileOptions",
    "ProfileServers",
    "ServerConfig",
    "VLLMServer",
    "measure_acceptance",
    "profile_step_times",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

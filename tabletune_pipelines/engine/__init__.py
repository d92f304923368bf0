"""vLLM driver: launch/stop servers, the timing protocol, metrics, tiny local models.

Importing this package is cheap (stdlib + numpy through ``core``); vLLM, torch and transformers
are imported only by the code that runs inside vLLM (``cpu_plugin``, ``step_scheduler``,
``launcher``) or builds models (``tiny_models``).

Modules:
    tiny_models     ensure_tiny_models(cache_dir, size) -> TinyModels
    server          ServerConfig, VLLMServer (context manager), resolve_device, build_command
    launcher        python -m tabletune_pipelines.engine.launcher serve MODEL ... (CPU build shim)
    cpu_plugin      vLLM general plugin: synthetic rejection on the CPU build
    step_scheduler  --scheduler-cls: per-step timing records, runtime k switching, admission gate
    profiler        profile_step_times(...) -> StepTimeProfile
    acceptance      load_prompts, measure_acceptance(...) -> AcceptancePrior
    errors          EngineError and friends (all TableTuneError)
"""

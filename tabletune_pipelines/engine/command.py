"""The command line and environment that start a vLLM server for a ``ServerConfig``.

Pure functions of the config and the resolved device (``cpu`` / ``gpu``), so the unit tests can
check every flag without vLLM or a GPU.

CPU build (docs/engine-facts.md, "CPU build"): TableTune's launcher module (it makes
``importlib.metadata.version("vllm")`` answer), ``--enforce-eager --no-enable-prefix-caching``,
and the environment ``VLLM_CPU_KVCACHE_SPACE``, ``TMPDIR``, ``VLLM_CACHE_ROOT``,
``HF_HUB_OFFLINE``, ``VLLM_NO_USAGE_STATS``. GPU (docs/engine-facts.md, "GPU (H200, vLLM
0.26)"): plain ``vllm serve`` with CUDA graphs kept, the model runner chosen by
``VLLM_USE_V2_MODEL_RUNNER``, and ``AutoTimingScheduler``, which picks the async scheduler
variant when vLLM runs async scheduling.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import tabletune_pipelines
from tabletune_pipelines.engine.config import SERVED_MODEL_NAME, ServerConfig
from tabletune_pipelines.engine.dtype import default_dtype
from tabletune_pipelines.engine.plan import launch_table
from tabletune_pipelines.errors import EngineConfigError
from tabletune_pipelines.formats.control_protocol import K_CONTROL_ENV, STEP_LOG_ENV, SYNTHETIC_CONTROL_ENV
from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV
from tabletune_pipelines.formats.published_schema import CONTEXT_SCHEDULE_KEY, PublishedTable
from tabletune_pipelines.vocab import vllm_compilation_config

LAUNCHER_MODULE = "tabletune_pipelines.engine.launcher"
"""Module that runs vLLM's CLI on the CPU build (``python -m``)."""
SCHEDULER_MODULE = "tabletune_pipelines.engine.timing_scheduler"
"""Module of the ``--scheduler-cls`` classes."""
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""vLLM's switch between Model Runner V1 (``0``) and V2 (``1``)."""
#: The project's root (the folder holding the ``tabletune_pipelines`` package): put on the server's
#: PYTHONPATH so vLLM can import the scheduler class where TableTune is not pip-installed.
PACKAGE_ROOT = str(Path(tabletune_pipelines.__file__).resolve().parent.parent)


def vllm_cli(config: ServerConfig, device: str) -> list[str]:
    """The program part of the command (everything before ``serve``)."""
    if config.vllm_cli is not None:
        cli = list(config.vllm_cli)
        return cli[:-1] if cli[-1] == "serve" else cli
    if device == "cpu":
        return [config.python, "-m", LAUNCHER_MODULE]
    script = Path(config.python).parent / "vllm"
    if script.exists():
        return [str(script)]
    return [config.python, "-m", "vllm.entrypoints.cli.main"]


def scheduler_class(device: str) -> str:
    """``--scheduler-cls``: the CPU build forces sync scheduling; on a GPU vLLM decides, so the
    auto entry builds the async or the sync variant to match."""
    cls = "TimingScheduler" if device == "cpu" else "AutoTimingScheduler"
    return f"{SCHEDULER_MODULE}.{cls}"


CONTROLLER_SCHEDULER = "tabletune_pipelines.controller.scheduler.ControllerScheduler"
"""``--scheduler-cls`` of the online controller (``controller/scheduler.py``)."""


def published_schedule(pub: PublishedTable, path: str | os.PathLike[str], *, context_form: bool,
                       controller: bool) -> dict[str, Any]:
    """The ``--speculative-config`` table keys of a launch serving the published file ``pub`` at ``path``.

    A batch-only file: its ``ranges``. A (batch size x context) file (``context_entries``): on a vLLM
    with the 5-item form (``context_form``, detected from the installed vLLM), the grid itself under
    ``speculative_token_schedule`` with its ``ctx_agg``; on one without it, with the controller
    (``controller``), a launch table listing every k the file allows (the controller hands vLLM each
    step's column); without the controller, an ``EngineConfigError`` naming the file and what to do."""
    if pub.context_entries is None:
        return {"num_speculative_tokens_per_batch_size": [list(r) for r in pub.ranges]}
    if context_form:
        return {CONTEXT_SCHEDULE_KEY: [list(e) for e in pub.context_entries], "ctx_agg": pub.ctx_agg}
    if controller:
        return {"num_speculative_tokens_per_batch_size": [list(r) for r in launch_table(pub.allowed_k,
                                                                                         pub.max_num_seqs)]}
    raise EngineConfigError(
        f"published table {path} holds a (batch size x context) table (table.context_entries), and this vLLM takes "
        f"only 3-item num_speculative_tokens_per_batch_size entries, so without the controller it cannot serve it: "
        f"launch with --scheduler-cls {CONTROLLER_SCHEDULER} and {PUBLISHED_ENV}={path} (the controller serves the "
        "grid), or launch the batch-only table.ranges (its speculative-config companion) knowingly")


def build_command(config: ServerConfig, port: int, device: str) -> list[str]:
    """The argv that starts the server (``device`` already resolved to ``cpu``/``gpu``)."""
    cmd = [*vllm_cli(config, device), "serve", config.model]
    cmd += [
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", SERVED_MODEL_NAME,
        "--dtype", config.dtype or default_dtype(device),  # ServerConfig fills it in; None only to the type
        "--max-model-len", str(config.max_model_len),
        "--max-num-seqs", str(config.max_num_seqs),
        "--seed", str(config.seed),
        "--disable-uvicorn-access-log",
    ]
    if config.enforce_eager or device == "cpu":
        cmd.append("--enforce-eager")
    if not config.enable_prefix_caching or device == "cpu":
        cmd.append("--no-enable-prefix-caching")
    if config.load_format is not None:
        cmd += ["--load-format", config.load_format]
    compilation = vllm_compilation_config(config.cudagraph_mode, config.max_cudagraph_capture_size)
    if compilation and not (config.enforce_eager or device == "cpu"):
        cmd += ["--compilation-config", json.dumps(compilation, separators=(",", ":"))]
    if config.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(int(config.max_num_batched_tokens))]
    if config.step_timing:
        cmd += ["--scheduler-cls", scheduler_class(device)]
    spec = config.speculative_config
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    cmd += list(config.extra_args)
    return cmd


SOCKET_PATH_MAX = 107
"""The longest path of a Unix socket (``sizeof(sockaddr_un.sun_path)`` less its NUL, Linux)."""
IPC_NAME_CHARS = 37
"""What vLLM appends to TMPDIR for each of its IPC sockets: a slash and a uuid4 (36 characters)."""


def socket_safe_dir(folder: Path) -> Path:
    """``folder``, or, where vLLM's IPC sockets under it would exceed ``SOCKET_PATH_MAX`` (a long
    ``$TABLETUNE_HOME``: ZMQ then refuses to start the engine), a short symbolic link to it in the
    system's temp folder (``/tmp/tt-`` and a hash of the folder, the same link for the same folder)."""
    if len(str(folder)) + IPC_NAME_CHARS <= SOCKET_PATH_MAX:
        return folder
    import hashlib
    import tempfile

    base = Path(tempfile.gettempdir())
    if len(str(base)) > 40:
        base = Path("/tmp")
    target = folder.resolve()
    link = base / f"tt-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}"
    try:
        link.symlink_to(target, target_is_directory=True)
    except FileExistsError:  # made by an earlier launch of this folder (or something else: replaced)
        if not (link.is_symlink() and Path(os.readlink(link)) == target):
            link.unlink()
            link.symlink_to(target, target_is_directory=True)
    return link


def build_env(config: ServerConfig, device: str, work_dir: Path, step_log: Path, control: Path,
              synthetic_control: Path | None = None, *, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: this process's) plus the device's settings
    and TableTune's channels; ``config.extra_env`` is applied last and wins."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PACKAGE_ROOT not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, PACKAGE_ROOT])
    if device == "cpu":
        tmp = work_dir / "tmp"
        cache = work_dir / "vllm-cache"
        tmp.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
            "TMPDIR": str(socket_safe_dir(tmp)),
            "VLLM_CACHE_ROOT": str(cache),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        })
    if synthetic_control is not None and config.synthetic_acceptance_rates is not None and (
            device == "cpu" or config.step_timing):  # the CPU plugin, or on a GPU the timing scheduler, reads it
        env[SYNTHETIC_CONTROL_ENV] = str(synthetic_control)
    if config.model_runner != "auto":
        env[V2_RUNNER_ENV] = "1" if config.model_runner == "v2" else "0"
    if config.step_timing:
        env[STEP_LOG_ENV] = str(step_log)
        env[K_CONTROL_ENV] = str(control)
    env.update({str(k): str(v) for k, v in config.extra_env.items()})
    return env

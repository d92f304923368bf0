"""The command line and environment of a launch, per device (no vLLM, no GPU needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tabletune_pipelines.formats.control_protocol import K_CONTROL_ENV, STEP_LOG_ENV, SYNTHETIC_CONTROL_ENV
from tabletune_pipelines.engine.command import PACKAGE_ROOT, V2_RUNNER_ENV, build_command, build_env, vllm_cli
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.errors import EngineConfigError

SCHED = "tabletune_pipelines.engine.timing_scheduler"


def _cfg(**kw):
    base = {"model": "/m", "drafter": "/d", "method": "draft_model", "num_speculative_tokens": 3,
            "table": ((1, 16, 3),)}
    return ServerConfig(**{**base, **kw})


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_cpu_command_runs_the_launcher_eagerly_without_prefix_cache():
    cpu = build_command(_cfg(enable_prefix_caching=True), 8000, "cpu")
    assert cpu[1:5] == ["-m", "tabletune_pipelines.engine.launcher", "serve", "/m"]
    assert "--enforce-eager" in cpu and "--no-enable-prefix-caching" in cpu
    assert _flag(cpu, "--scheduler-cls") == f"{SCHED}.TimingScheduler"
    assert _flag(cpu, "--port") == "8000" and _flag(cpu, "--host") == "127.0.0.1"
    spec = json.loads(_flag(cpu, "--speculative-config"))
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 16, 3]]


def test_gpu_command_keeps_cuda_graphs_and_picks_the_async_aware_scheduler():
    gpu = build_command(_cfg(), 8000, "gpu")
    assert "tabletune_pipelines.engine.launcher" not in gpu
    assert "--enforce-eager" not in gpu
    assert _flag(gpu, "--scheduler-cls") == f"{SCHED}.AutoTimingScheduler"
    assert "--no-enable-prefix-caching" in gpu  # timing prompts must not be served from cache
    assert "--no-enable-prefix-caching" not in build_command(_cfg(enable_prefix_caching=True), 8000, "gpu")
    assert "--enforce-eager" in build_command(_cfg(enforce_eager=True), 8000, "gpu")
    assert "--scheduler-cls" not in build_command(_cfg(step_timing=False), 8000, "gpu")


def test_default_vllm_cli_without_a_console_script(tmp_path):
    python = str(tmp_path / "bin" / "python3")  # no "vllm" script beside it
    assert vllm_cli(_cfg(python=python), "gpu") == [python, "-m", "vllm.entrypoints.cli.main"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\n")
    assert vllm_cli(_cfg(python=python), "gpu") == [str(tmp_path / "bin" / "vllm")]


@pytest.mark.parametrize("cli", [("python3", "-m", "vllm.entrypoints.cli.main"),
                                 ("python3", "-m", "vllm.entrypoints.cli.main", "serve")])
def test_vllm_cli_override_with_or_without_serve(cli):
    cmd = build_command(_cfg(vllm_cli=cli), 8000, "gpu")
    assert cmd[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]


def test_load_format_flag_and_drafter_load_config():
    cmd = build_command(_cfg(method="eagle3", drafter="/h", load_format="dummy"), 8000, "gpu")
    assert _flag(cmd, "--load-format") == "dummy"
    assert json.loads(_flag(cmd, "--speculative-config"))["draft_load_config"] == {"load_format": "dummy"}
    assert "--load-format" not in build_command(_cfg(), 8000, "gpu")


def test_extra_args_come_last():
    cmd = build_command(_cfg(extra_args=("--max-num-batched-tokens", 4096)), 8000, "gpu")
    assert cmd[-2:] == ["--max-num-batched-tokens", "4096"]


def _env(cfg, device, tmp_path, base=None):
    return build_env(cfg, device, tmp_path, tmp_path / "s.jsonl", tmp_path / "c.json", tmp_path / "r.json",
                     base={} if base is None else base)


def test_cpu_env_sets_the_cpu_build_settings_and_channels(tmp_path):
    env = _env(_cfg(synthetic_acceptance_rates=(0.7, 0.5, 0.3), kv_cache_space_gib=2), "cpu", tmp_path)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and Path(env["VLLM_CACHE_ROOT"]).is_dir()
    assert Path(env["TMPDIR"]).is_dir()
    assert env[STEP_LOG_ENV].endswith("s.jsonl") and env[K_CONTROL_ENV].endswith("c.json")
    assert env[SYNTHETIC_CONTROL_ENV].endswith("r.json")
    assert SYNTHETIC_CONTROL_ENV not in _env(_cfg(), "cpu", tmp_path)  # no synthetic launch: no channel


def test_gpu_env_has_no_cpu_settings(tmp_path):
    env = _env(_cfg(synthetic_acceptance_rates=(0.0, 0.0, 0.0)), "gpu", tmp_path)
    for var in ("VLLM_CPU_KVCACHE_SPACE", "TMPDIR", "VLLM_CACHE_ROOT"):
        assert var not in env
    assert env[K_CONTROL_ENV].endswith("c.json")
    # The timing scheduler serves the synthetic-rates channel on a GPU (engine.gpu_synthetic).
    assert env[SYNTHETIC_CONTROL_ENV].endswith("r.json")
    assert SYNTHETIC_CONTROL_ENV not in _env(_cfg(synthetic_acceptance_rates=(0.0, 0.0, 0.0), step_timing=False),
                                             "gpu", tmp_path)


@pytest.mark.parametrize(("runner", "value"), [("v2", "1"), ("v1", "0"), ("auto", None)])
def test_model_runner_env(tmp_path, runner, value):
    env = _env(_cfg(model_runner=runner), "gpu", tmp_path)
    assert env.get(V2_RUNNER_ENV) == value


def test_auto_runner_leaves_an_inherited_setting_alone(tmp_path):
    env = _env(_cfg(), "gpu", tmp_path, base={V2_RUNNER_ENV: "1"})
    assert env[V2_RUNNER_ENV] == "1"


def test_package_root_is_on_the_server_pythonpath(tmp_path):
    # vLLM imports the scheduler class by name: TableTune must be importable where it is not installed.
    env = _env(_cfg(), "gpu", tmp_path, base={"PYTHONPATH": "/tmp/gv/site"})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/tmp/gv/site", PACKAGE_ROOT]
    assert (Path(PACKAGE_ROOT) / "tabletune_pipelines" / "__init__.py").exists()
    env = _env(_cfg(), "gpu", tmp_path, base={"PYTHONPATH": PACKAGE_ROOT})
    assert env["PYTHONPATH"] == PACKAGE_ROOT


def test_extra_env_wins(tmp_path):
    env = _env(_cfg(model_runner="v2", extra_env={V2_RUNNER_ENV: "0", "X": 1}), "gpu", tmp_path)
    assert env[V2_RUNNER_ENV] == "0" and env["X"] == "1"


# -- a published file's table in a launch: the (batch size x context) grid needs the 5-item form or the controller

def _published(tmp_path, grid):
    from tabletune_pipelines.evaluation.synthetic import publish
    from tabletune_pipelines.formats.published import load_published

    path = publish(tmp_path / "pub.json", ranges=[(1, 16, 2)], rates=(0.7, 0.5, 0.3), allowed_k=[0, 1, 2, 3],
                   context_entries=[(1, 8, 1, 512, 3), (1, 8, 513, 4096, 1), (9, 16, 1, 512, 1),
                                    (9, 16, 513, 4096, 0)] if grid else None)
    return path, load_published(path)


def test_a_grid_file_launches_by_the_engines_form_and_the_controller(tmp_path):
    from tabletune_pipelines.engine.command import published_schedule

    path, pub = _published(tmp_path, grid=True)
    assert published_schedule(pub, path, context_form=True, controller=False) == {
        "speculative_token_schedule": [[1, 8, 1, 512, 3], [1, 8, 513, 4096, 1], [9, 16, 1, 512, 1],
                                       [9, 16, 513, 4096, 0]], "ctx_agg": "mean"}
    # 3-item form with the controller: a launch table listing every allowed k (the controller serves the grid)
    assert published_schedule(pub, path, context_form=False, controller=True) == {
        "num_speculative_tokens_per_batch_size": [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 16, 3]]}
    with pytest.raises(EngineConfigError) as err:
        published_schedule(pub, path, context_form=False, controller=False)
    msg = str(err.value)
    assert str(path) in msg and "table.context_entries" in msg and "\n" not in msg
    assert f"TABLETUNE_PUBLISHED_TABLE={path}" in msg and "ControllerScheduler" in msg


def test_a_batch_only_file_launches_its_ranges_everywhere(tmp_path):
    from tabletune_pipelines.engine.command import published_schedule

    path, pub = _published(tmp_path, grid=False)
    for form in (True, False):
        for ctl in (True, False):
            assert published_schedule(pub, path, context_form=form, controller=ctl) == {
                "num_speculative_tokens_per_batch_size": [[1, 16, 2]]}


def test_a_work_folder_too_long_for_vllms_sockets_gets_a_short_link(tmp_path):
    """vLLM names its IPC sockets TMPDIR/<uuid4>; a Unix socket path holds 107 characters, so a long
    work folder (a deep $TABLETUNE_HOME) gets a short link to its tmp folder instead."""
    from tabletune_pipelines.engine.command import IPC_NAME_CHARS, SOCKET_PATH_MAX, socket_safe_dir

    short = Path("/tmp/tt-home/work/tmp")
    assert socket_safe_dir(short) == short  # short enough: kept (and not made)
    deep = tmp_path / ("d" * 60) / "work" / "profile" / "tmp"
    deep.mkdir(parents=True)
    link = socket_safe_dir(deep)
    assert link != deep and len(str(link)) + IPC_NAME_CHARS <= SOCKET_PATH_MAX
    assert link.resolve() == deep.resolve() and (link / "x").parent.resolve() == deep.resolve()
    assert socket_safe_dir(deep) == link  # the same folder, the same link
    link.unlink()
    link.symlink_to(tmp_path, target_is_directory=True)  # a stale link of the same name is replaced
    assert socket_safe_dir(deep) == link and link.resolve() == deep.resolve()
    (deep / "probe").write_text("1")
    assert (link / "probe").read_text() == "1"
    env = build_env(ServerConfig(model="m", work_dir=str(deep.parent)), "cpu", deep.parent, deep.parent / "s.jsonl",
                    deep.parent / "c.json")
    assert env["TMPDIR"] == str(link)
    link.unlink()

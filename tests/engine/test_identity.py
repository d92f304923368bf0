"""EngineIdentity from a launch config or a fleet deployment: one place, one graph-mode rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.identity import accelerator_name, cudagraph_mode, deployment_identity, engine_identity
from tabletune_pipelines.errors import EngineConfigError


def test_graph_rule():
    assert cudagraph_mode(eager=True) == "none"
    assert cudagraph_mode(eager=True, declared="FULL_AND_PIECEWISE") == "none"  # an eager engine has no graphs
    assert cudagraph_mode(eager=False) == "default"
    assert cudagraph_mode(eager=False, declared="FULL_AND_PIECEWISE") == "FULL_AND_PIECEWISE"


def _cfg(**kw):
    return ServerConfig(**{"model": "/m", "drafter": "/d", "method": "draft_model", "num_speculative_tokens": 3,
                           "max_num_seqs": 16, **kw})


def test_config_identity():
    cpu = engine_identity(_cfg(device="cpu", dtype="bfloat16"), vllm_version="0.32.0+cpu")
    assert (cpu.gpu, cpu.cudagraph_mode, cpu.max_k, cpu.max_num_seqs, cpu.dtype) == ("cpu", "none", 3, 16, "bfloat16")
    gpu = engine_identity(_cfg(device="gpu"), vllm_version="0.26.0", gpu="NVIDIA H200")
    assert gpu.cudagraph_mode == "default"
    eager = engine_identity(_cfg(device="gpu", enforce_eager=True), vllm_version="0.26.0", gpu="NVIDIA H200")
    assert eager.cudagraph_mode == "none" and eager.key != gpu.key
    declared = engine_identity(_cfg(device="gpu"), vllm_version="0.26.0", gpu="NVIDIA H200",
                               declared_cudagraph_mode="FULL_AND_PIECEWISE")
    assert declared.cudagraph_mode == "FULL_AND_PIECEWISE"
    with pytest.raises(EngineConfigError, match="needs a speculative config"):
        engine_identity(ServerConfig(model="/m"), vllm_version="0.32.0+cpu")


def _dep(**kw):
    base = {"gpu": "cpu", "model": "/m", "drafter": "/d", "method": "draft_model", "max_k": 3, "max_num_seqs": 16,
            "dtype": None, "cudagraph_mode": "none", "model_runner": "auto"}
    return SimpleNamespace(**{**base, **kw})


def test_deployment_and_config_agree_on_the_same_engine():
    # The embedded default: a CPU deployment and the launch config that profiles it have one key.
    dep = deployment_identity(_dep(), "0.32.0+cpu")
    cfg = engine_identity(_cfg(device="cpu"), vllm_version="0.32.0+cpu")
    assert dep == cfg and dep.key == cfg.key
    gpu_dep = deployment_identity(_dep(gpu="NVIDIA H200", cudagraph_mode="FULL_AND_PIECEWISE"), "0.26.0")
    gpu_cfg = engine_identity(_cfg(device="gpu"), vllm_version="0.26.0", gpu="NVIDIA H200",
                              declared_cudagraph_mode="FULL_AND_PIECEWISE")
    assert gpu_dep.key == gpu_cfg.key
    # The CPU build is eager whatever the fleet file says.
    assert deployment_identity(_dep(cudagraph_mode="FULL"), "0.32.0+cpu").cudagraph_mode == "none"


def test_accelerator_on_the_cpu_build():
    assert accelerator_name("cpu") == "cpu"


def test_model_runner_is_part_of_the_identity_only_when_forced():
    # V1 and V2 differ 3-4x in small-batch step time on a GPU: a forced runner is another engine,
    # while "auto" keeps the keys of stores written before the field existed.
    auto = deployment_identity(_dep(gpu="H200", cudagraph_mode=None), "0.26.0")
    v2 = deployment_identity(_dep(gpu="H200", cudagraph_mode=None, model_runner="v2"), "0.26.0")
    assert auto.key != v2.key and v2.model_runner == "v2"
    assert auto.cudagraph_mode == "default"
    assert engine_identity(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                        device="gpu", model_runner="v2"),
                           vllm_version="0.26.0", gpu="H200").model_runner == "v2"

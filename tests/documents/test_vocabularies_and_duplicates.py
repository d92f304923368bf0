"""Hostile input, fourth round, class 6: vocabularies and duplicates.

A fleet's ``cudagraph_mode`` and ``dtype`` come from vLLM's vocabularies, its token budget holds one
decode step of every request with its drafts, and its capture ceiling is at most that budget; a
``bool`` option is true or false (``enabled: "no"`` is not on); a mix names each source once. Each
refusal is one line naming the key. ``cudagraph_mode`` is passed to every measurement launch on a
GPU and to the published serving flags (docs/usage.md)."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.engine.command import build_command
from tabletune_pipelines.engine.plan import ProfileOptions
from tabletune_pipelines.errors import FleetError, InvalidValueError, PipelineFailure, TableTuneError
from tabletune_pipelines.formats.prompt_mixes import parse_weights
from tabletune_pipelines.formats.published_build import serving_envelope
from tabletune_pipelines.orchestration.resources import EngineResource, check_config
from tabletune_pipelines.tuning import deployments
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
from tests.tuning.runs import fleet

GPU = {"gpu": "H200", "model": "/m", "drafter": "/d", "method": "eagle3", "max_num_seqs": 128}

REFUSED = [
    ({"cudagraph_mode": "bogus_mode"}, "'cudagraph_mode' = 'bogus_mode' is not one of vLLM's ['NONE', 'PIECEWISE'"),
    ({"dtype": "float8"}, "'dtype' = 'float8' is not one of vLLM's ['auto', 'half'"),
    ({"max_num_batched_tokens": 1}, "'max_num_batched_tokens' = 1 is below max_num_seqs x (1 + max_k) = 512"),
    ({"max_num_batched_tokens": 511}, "'max_num_batched_tokens' = 511 is below"),
    ({"max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 4096},
     "'max_cudagraph_capture_size' = 4096 is above 'max_num_batched_tokens' = 2048"),
]


@pytest.mark.parametrize("over,said", REFUSED, ids=[str(o) for o, _ in REFUSED])
def test_a_fleet_value_outside_vllms_vocabulary_or_envelope_is_refused_by_key(tmp_path, over, said):
    with pytest.raises(FleetError) as err:
        fleet(tmp_path, **GPU, **over)
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("over", [{"cudagraph_mode": "full_and_piecewise"}, {"cudagraph_mode": "PIECEWISE"},
                                  {"dtype": "bfloat16"}, {"dtype": "float32"}, {"max_num_batched_tokens": 512},
                                  {"max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 2048}])
def test_vllms_own_values_are_accepted(tmp_path, over):
    dep = fleet(tmp_path, **GPU, **over).deployments[0]
    assert all(getattr(dep, k) == v for k, v in over.items())


@pytest.mark.parametrize("value", ["no", "false", 0, 1, "off"])
def test_enabled_no_is_refused_not_read_as_on(value):
    with pytest.raises(InvalidValueError) as err:
        ServedVerificationOptions.from_mapping({"enabled": value}, where="EngineResource served_verification")
    assert f"EngineResource served_verification: enabled = {value!r} must be true or false" == str(err.value)
    with pytest.raises(PipelineFailure, match="enabled = .* must be true or false"):
        check_config(EngineResource(served_verification={"enabled": value}))
    with pytest.raises(TableTuneError, match="include_no_spec = .* must be true or false"):
        ProfileOptions.from_mapping({"include_no_spec": value})
    assert ServedVerificationOptions.from_mapping({"enabled": False}).enabled is False


@pytest.mark.parametrize("spec", ["code:0.5,code:0.7", "code,prose,code", "prose:1, prose :2"])
def test_a_mix_naming_a_source_twice_is_refused(spec):
    with pytest.raises(InvalidValueError) as err:
        parse_weights(spec)
    assert "is named twice; give each mix once with its weight" in str(err.value)
    assert parse_weights("code:0.5,prose:0.5") == {"code": 0.5, "prose": 0.5}


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def _launch(tmp_path, identity, dep):
    return build_command(deployments._server_config(identity, dep, tmp_path, tmp_path / "w", {}), 8000, "gpu")


def test_cudagraph_mode_is_passed_to_every_gpu_launch_and_the_serving_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    dep = fleet(tmp_path, **GPU, cudagraph_mode="full_and_piecewise", max_num_batched_tokens=8192,
                max_cudagraph_capture_size=1024).deployments[0]
    ident = deployments.identity_for(dep, "0.26.0")
    assert json.loads(_flag(_launch(tmp_path, ident, dep), "--compilation-config")) == \
        {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 1024}
    flags = serving_envelope(ident.to_dict())["flags"]
    assert json.loads(_flag(flags, "--compilation-config")) == \
        {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 1024}
    # vLLM's choice ("default") is left to vLLM; the CPU build compiles nothing.
    plain = fleet(tmp_path, **GPU).deployments[0]
    assert _flag(_launch(tmp_path, deployments.identity_for(plain, "0.26.0"), plain), "--compilation-config") is None
    piecewise = fleet(tmp_path, **GPU, cudagraph_mode="PIECEWISE").deployments[0]
    assert json.loads(_flag(_launch(tmp_path, deployments.identity_for(piecewise, "0.26.0"), piecewise),
                            "--compilation-config")) == {"cudagraph_mode": "PIECEWISE"}
    cpu = fleet(tmp_path, cudagraph_mode="FULL").deployments[0]
    cpu_ident = deployments.identity_for(cpu, "0.32.0+cpu")
    cmd = build_command(deployments._server_config(cpu_ident, cpu, tmp_path, tmp_path / "c", {}), 8000, "cpu")
    assert "--compilation-config" not in cmd and cpu_ident.cudagraph_mode == "none"
    assert "--compilation-config" not in serving_envelope(cpu_ident.to_dict())["flags"]

"""The Dagster resources' configuration comes from the library's records, not from copies of them."""

from __future__ import annotations

import dataclasses

from tabletune_pipelines.options import field_docs
from tabletune_pipelines.orchestration.resources import TuningSettings
from tabletune_pipelines.tuning.gates import GateThresholds


def test_every_gate_threshold_is_configurable_on_the_policy_with_gatepolicys_default_and_meaning():
    """``GateThresholds`` is the one home of the thresholds: each of its fields is a field of the
    ``TuningSettings`` resource of the same type, default and description, so the two cannot drift."""
    config = TuningSettings.model_fields
    docs = field_docs(GateThresholds)
    for f in dataclasses.fields(GateThresholds):
        assert f.name in config, f"TuningSettings cannot configure GateThresholds.{f.name}"
        assert config[f.name].default == f.default, f.name
        assert config[f.name].annotation is {"float": float, "int": int}[str(f.type)], f.name
        assert config[f.name].description == docs[f.name], f.name
    assert TuningSettings().gates() == GateThresholds()


def test_the_resource_builds_the_gatepolicy_it_is_configured_with():
    changed = {f.name: f.default * 2 for f in dataclasses.fields(GateThresholds)}
    assert TuningSettings(**changed).gates() == GateThresholds(**changed)


def test_the_engine_resource_is_the_library_engine_with_dagster_config():
    """``EngineResource`` holds ``deployments.LocalEngine``'s configuration as Dagster config and hands
    every call to it: the same fields with the same defaults, each passed through, and the same methods."""
    from tabletune_pipelines.orchestration.resources import EngineResource
    from tabletune_pipelines.tuning.build import DefaultBuildSettings
    from tabletune_pipelines.tuning.deployments import Engine, LocalEngine

    # ``where`` names the caller and ``server`` is a running launch (``tuning.flow``): neither is configuration
    library = {f.name: f for f in dataclasses.fields(LocalEngine) if f.name not in ("where", "server")}
    assert set(library) == set(EngineResource.model_fields)
    for name, f in library.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert EngineResource.model_fields[name].get_default(call_default_factory=True) == default, name
    configured = EngineResource(cache_dir="/c", work_dir="/w", probe_timeout_s=2.5,
                                profile_options={"repetitions": 4}, acceptance_options={"seed": 3},
                                served_verification={"budget_s": 30.0}).local()
    assert (configured.cache_dir, configured.work_dir, configured.probe_timeout_s) == ("/c", "/w", 2.5)
    assert (configured.profile_options, configured.acceptance_options) == ({"repetitions": 4}, {"seed": 3})
    assert configured.served_verification_options().budget_s == 30.0
    assert configured.where == "EngineResource"
    protocol = {n for n in vars(Engine) if not n.startswith("_")} - {"acceptance_options"}
    assert protocol <= {n for n in vars(LocalEngine) if callable(getattr(LocalEngine, n))}
    assert DefaultBuildSettings().gates() == TuningSettings().gates()
    assert (DefaultBuildSettings().stickiness, DefaultBuildSettings().search_policy,
            DefaultBuildSettings().confidence) == (TuningSettings().stickiness, TuningSettings().search_policy,
                                                   TuningSettings().confidence)


def test_a_bad_library_engine_option_is_named_with_where_it_came_from():
    import pytest

    from tabletune_pipelines.errors import TableTuneError
    from tabletune_pipelines.tuning.deployments import LocalEngine

    with pytest.raises(TableTuneError, match="gpu_flow served_verification"):
        LocalEngine(served_verification={"budgett_s": 1}, where="gpu_flow").served_verification_options()

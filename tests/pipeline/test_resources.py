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

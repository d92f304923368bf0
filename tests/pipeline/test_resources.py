"""The Dagster resources' configuration comes from the library's records, not from copies of them."""

from __future__ import annotations

import dataclasses

from tabletune_pipelines.options import field_docs
from tabletune_pipelines.orchestration.resources import TuningPolicy
from tabletune_pipelines.tuning.gates import GatePolicy


def test_every_gate_threshold_is_configurable_on_the_policy_with_gatepolicys_default_and_meaning():
    """``GatePolicy`` is the one home of the thresholds: each of its fields is a field of the
    ``TuningPolicy`` resource of the same type, default and description, so the two cannot drift."""
    config = TuningPolicy.model_fields
    docs = field_docs(GatePolicy)
    for f in dataclasses.fields(GatePolicy):
        assert f.name in config, f"TuningPolicy cannot configure GatePolicy.{f.name}"
        assert config[f.name].default == f.default, f.name
        assert config[f.name].annotation is {"float": float, "int": int}[str(f.type)], f.name
        assert config[f.name].description == docs[f.name], f.name
    assert TuningPolicy().gates() == GatePolicy()


def test_the_resource_builds_the_gatepolicy_it_is_configured_with():
    changed = {f.name: f.default * 2 for f in dataclasses.fields(GatePolicy)}
    assert TuningPolicy(**changed).gates() == GatePolicy(**changed)

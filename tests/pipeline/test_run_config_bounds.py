"""Hostile input, fourth round, class 2: settings given through Dagster run config get the documents' bounds.

Every numeric field of every resource and config class the UI or run config can set goes through
``options.check_bounds`` (``orchestration.resources.check_config``, called first by every asset): NaN,
infinity and a negative are refused with one line naming the class and the field, before the step
reads or writes anything. The fields are found from the classes themselves, so a numeric field added
without a bound fails here."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
import re

import dagster as dg
import pytest

from tabletune_pipelines import defs as defs_folder
from tabletune_pipelines.engine.plan import ProfileOptions
from tabletune_pipelines.errors import PipelineFailure
from tabletune_pipelines.orchestration import resources as resources_module
from tabletune_pipelines.orchestration.resources import EngineResource, check_config
from tabletune_pipelines.tuning.deployments import AcceptanceOptions
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
from tests.pipeline.helpers import make_resources
from tests.pipeline.test_pipeline_assets import identity_key, run_identity, run_week, sql

NUMERIC = re.compile(r"\b(int|float)\b")

#: The option mappings of EngineResource and the class that reads each (every dict field must be here).
OPTION_MAPPINGS = {"profile_options": ProfileOptions, "acceptance_options": AcceptanceOptions,
                   "served_verification": ServedVerificationOptions}


def config_classes() -> list[type]:
    """Every Dagster resource and run-config class of the code location (found, not listed)."""
    modules = [resources_module] + [importlib.import_module(f"tabletune_pipelines.defs.{m.name}")
                                    for m in pkgutil.iter_modules(defs_folder.__path__)]
    found = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, (dg.Config, dg.ConfigurableResource)):
                found[cls.__qualname__] = cls
    return sorted(found.values(), key=lambda c: c.__name__)


def numeric_fields() -> list[tuple[type, str, str]]:
    """(class, field, annotation) of every int/float field (lists of them included)."""
    out = []
    for cls in config_classes():
        for name, f in cls.model_fields.items():
            text = str(f.annotation)
            if NUMERIC.search(text) and "dict" not in text:
                out.append((cls, name, text))
    return out


def bad_values(annotation: str) -> list:
    """NaN, infinity, a negative; an integer field gets a negative and one beyond any bound (run config's
    Int type refuses a NaN before the resource is built)."""
    values = [-1, 10 ** 30] if "float" not in annotation else [float("nan"), float("inf"), float("-inf"), -1.0]
    return [[v] for v in values] if "list" in annotation else values


CASES = [(cls, name, value) for cls, name, text in numeric_fields() for value in bad_values(text)]


def test_the_walk_finds_the_classes_and_fields_it_must():
    names = {c.__name__ for c in config_classes()}
    assert {"TuningSettings", "EngineResource", "FleetResource", "TableConfig", "PublishConfig"} <= names
    fields = {(c.__name__, n) for c, n, _ in numeric_fields()}
    assert {("TuningSettings", "stickiness"), ("TuningSettings", "confidence"), ("TuningSettings", "prior_weight"),
            ("TuningSettings", "min_prior_drafts"), ("EngineResource", "probe_timeout_s"),
            ("TableConfig", "allowed_ks")} <= fields
    dicts = {n for n, f in EngineResource.model_fields.items() if "dict" in str(f.annotation)}
    assert dicts == set(OPTION_MAPPINGS)


@pytest.mark.parametrize("cls,name,value", CASES, ids=[f"{c.__name__}.{n}={v!r}" for c, n, v in CASES])
def test_every_numeric_field_refuses_nan_infinity_and_negatives_by_name(cls, name, value):
    config = cls(**{name: value})
    with pytest.raises(PipelineFailure) as err:
        check_config(config)
    text = str(err.value)
    assert re.search(rf"\b{name}(\[0\])? = ", text) and cls.__name__ in text and "\n" not in text, text
    assert "must be" in text, text


def test_the_defaults_pass():
    for cls in config_classes():
        required = [n for n, f in cls.model_fields.items() if f.is_required()]
        check_config(cls(**{n: "x" for n in required}))


OPTION_CASES = [(mapping, cls, f.name, v) for mapping, cls in OPTION_MAPPINGS.items()
                for f in dataclasses.fields(cls) if NUMERIC.search(str(f.type)) and str(f.type) != "bool"
                for v in (float("nan"), float("inf"))]


@pytest.mark.parametrize("mapping,cls,name,value", OPTION_CASES,
                         ids=[f"{m}.{n}={v!r}" for m, _, n, v in OPTION_CASES])
def test_every_number_of_an_engine_option_mapping_is_refused_by_name(mapping, cls, name, value):
    """The mappings are read by their own classes (whose walk is tests/documents/test_numeric_bounds.py)
    before the step starts: a NaN or an infinity in any of their numbers is one line naming it."""
    is_seq = "tuple" in str(next(f for f in dataclasses.fields(cls) if f.name == name).type)
    body = {name: [value, value] if name == "output_tokens" else [value] if is_seq else value}
    with pytest.raises(PipelineFailure) as err:
        check_config(EngineResource(**{mapping: body}))
    text = str(err.value)
    assert f"EngineResource {mapping}" in text and name in text and "\n" not in text, text


# -- through a real Dagster run: the step fails by name and writes nothing -------------------------

@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def test_a_nan_stickiness_from_run_config_fails_the_table_step_and_stores_no_table(home, one_fleet, instance):
    resources = make_resources(home, one_fleet)
    key = identity_key(one_fleet)
    assert run_week(home, one_fleet, resources, instance).success
    tables_before = sql(home, "SELECT count(*) FROM draft_length_tables")[0][0]
    bad = make_resources(home, one_fleet, stickiness=math.nan)
    res = run_identity(bad, instance, key, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert failure.step_key == "draft_length_table"
    text = failure.step_failure_data.user_failure_data.description
    assert text.startswith("resources: policy: config (TuningSettings): stickiness = nan must be a finite number")
    assert "\n" not in text
    assert sql(home, "SELECT count(*) FROM draft_length_tables")[0][0] == tables_before


def test_an_infinite_probe_timeout_fails_by_name_not_with_a_raw_exception(home, one_fleet, instance):
    from tests.pipeline.helpers import ScriptedEngine

    resources = make_resources(home, one_fleet, engine=ScriptedEngine(probe_timeout_s=math.inf))
    res = run_week(home, one_fleet, resources, instance, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    text = failure.step_failure_data.user_failure_data.description
    assert "probe_timeout_s = inf must be a finite number > 0" in text and "\n" not in text

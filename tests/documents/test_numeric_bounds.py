"""Every number has both bounds: a generated walk over every numeric field of every options class,
document and record TableTune reads from outside. NaN, ±infinity, 0, a negative and 1e308 each get a
clear one-line ``TableTuneError`` naming the field (and, for options, where they came from), or are
accepted by the field's stated rule (its ``Bound``); never a raw exception.

The fields are found from the classes themselves (every ``int``/``float`` field, tuples of them
included), so a numeric field added later is walked too.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.formats.controller_settings import BOUNDS as CONTROLLER_BOUNDS
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.core.served_calibration import ServedCalibration, ServedPoint
from tabletune_pipelines.engine.plan import PROFILE_LIMITS, ProfileOptions, limit_problem
from tabletune_pipelines.errors import TableTuneError
try:  # its home moves from evaluation.served to tuning.served_verification
    from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
except ImportError:
    from tabletune_pipelines.evaluation.served import ServedVerificationOptions
from tabletune_pipelines.formats.documents import (
    SAMPLE_BOUNDS,
    WORKLOAD_BOUNDS,
    AcceptancePrior,
    DraftLengthTable,
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
)
from tabletune_pipelines.formats.prompt_mixes import WEIGHT, parse_weights
from tabletune_pipelines.formats.published import parse_published
from tabletune_pipelines.formats.published_build import published_document
from tabletune_pipelines.formats.published_schema import VERSION, PublishedVersion
from tabletune_pipelines.options import STEP_MS, Bound
from tabletune_pipelines.tuning.deployments import AcceptanceOptions

HOSTILE = (float("nan"), float("inf"), float("-inf"), 0, 0.0, -1, -1.0, 1e308)
SOURCE = "the walk's source"
NUMERIC = re.compile(r"\b(int|float)\b")


def numeric_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if NUMERIC.search(str(f.type)) and "bool" != str(f.type)]


def is_sequence_field(cls: type, name: str) -> bool:
    return "tuple" in str(next(f for f in dataclasses.fields(cls) if f.name == name).type)


# -- how each class is read, and the rule that says what it accepts -------------------------------

def _options(cls, error_rule):
    def read(name, value):
        seq = is_sequence_field(cls, name)
        if cls is ServedVerificationOptions and name == "output_tokens":
            body = {name: [value, value]}
        else:
            body = {name: [value] if seq else value}
        return cls.from_mapping(body, where=SOURCE)
    return read, error_rule


def _plan_rule(name, value):
    if name in PROFILE_LIMITS:
        return limit_problem(name, value) is None
    return None  # no stated range: must refuse NaN and infinity at least


OPTIONS = {
    ProfileOptions: _options(ProfileOptions, _plan_rule),
    AcceptanceOptions: _options(AcceptanceOptions, _plan_rule),
    ServedVerificationOptions: _options(
        ServedVerificationOptions, lambda n, v: ServedVerificationOptions.BOUNDS[n].problem(v) is None
        if n in ServedVerificationOptions.BOUNDS else None),
    ControllerSettings: _options(  # read with exact_numbers: JSON's 3.0 is the integer 3 (options_from_mapping)
        ControllerSettings, lambda n, v: CONTROLLER_BOUNDS[n].problem(
            int(v) if CONTROLLER_BOUNDS[n].integer and type(v) is float and v.is_integer() and abs(v) <= 2.0 ** 53
            else v) is None if n in CONTROLLER_BOUNDS else None),
}

IDENT = EngineIdentity.from_dict({"schema": EngineIdentity.SCHEMA, "schema_version": 1, "gpu": "cpu",
                                  "vllm_version": "0.32.0+cpu", "model": "m", "drafter": None, "method": "ngram",
                                  "max_k": 3, "max_num_seqs": 16})
CELL = {"k": 1, "batch_size": 1, "median_ms": 3.0, "repetitions_ms": [3.0, 3.1], "launch_k": 3}
SAMPLE = {"batch": 2, "k": 1, "decode_tokens": 4, "prefill_tokens": 16, "ms": 5.0}
PRIOR = AcceptancePrior(rates=(0.5, 0.3, 0.1), num_drafts=10, drafted_per_pos=(10, 10, 10),
                        accepted_per_pos=(5, 3, 1), prompt_fingerprint="f", prompt_count=2,
                        workload={"prompt_tokens": 32.0, "output_tokens": 96.0, "source": "t"})
TABLE = DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key=IDENT.key,
                         prior_id=PRIOR.prior_id, acceptance_rates=PRIOR.rates, step_ms={"1": {"1": 3.0, "16": 9.0}})
POINT = {"k": 1, "batch": 4.0, "ms": 6.0, "se_ms": 0.1, "rounds": 3, "load": 4, "per_round": [["r0", 6.0]]}


def _doc_reader(make):
    """``make(value)`` builds the document with the field set to ``value`` from JSON-like data."""
    return make


def _bound_rule(bounds):
    return lambda n, v: bounds[n].problem(v) is None


def _profile_with(part, name, value):
    body = StepTimeProfile(identity=IDENT, cells=()).to_dict()
    body["cells"] = [dict(CELL)]
    body["samples"] = [dict(SAMPLE)]
    if part == "cells":
        body["cells"][0][name] = [value] if name == "repetitions_ms" else value
    else:
        body["samples"][0][name] = value
    return StepTimeProfile.from_dict(body)


def _cell_rule(name, value):
    if name in ("median_ms", "repetitions_ms"):
        return STEP_MS.problem(value) is None
    return StepTimeCell.BOUNDS[name].problem(value) is None


def _published_with(name, value):
    doc = published_document(PublishedVersion(deployment="d", version=1, table=TABLE.published_parts()[0],
                                              speculative_config=TABLE.speculative_config(),
                                              published_at="2026-11-23T10:00:00Z"))
    doc = copy.deepcopy(doc)
    if name == "version":
        doc["version"] = value
    else:
        doc["table"]["step_ms"]["1"]["1"] = value
    return parse_published(json.loads(json.dumps(doc, allow_nan=True)), SOURCE)


DOCUMENTS: dict[str, tuple[list[str], Any, Any]] = {
    # what: (numeric fields, reader(name, value), rule(name, value) -> accepted?)
    "engine identity": (numeric_fields(EngineIdentity), lambda n, v: EngineIdentity.from_dict(
        {**IDENT.to_dict(), n: v}), _bound_rule(EngineIdentity.BOUNDS)),
    "step-time cell": (numeric_fields(StepTimeCell), lambda n, v: _profile_with("cells", n, v), _cell_rule),
    "mixed-step sample": (list(SAMPLE_BOUNDS), lambda n, v: _profile_with("samples", n, v),
                          _bound_rule(SAMPLE_BOUNDS)),
    "acceptance prior": (list(AcceptancePrior.BOUNDS), lambda n, v: (
        AcceptancePrior.from_dict({**PRIOR.to_dict(), n: [v] * 3 if n.endswith("_per_pos") else v})),
        _bound_rule(AcceptancePrior.BOUNDS)),
    "prior workload": (list(WORKLOAD_BOUNDS), lambda n, v: AcceptancePrior.from_dict(
        {**PRIOR.to_dict(), "workload": {**PRIOR.workload, n: v}}), _bound_rule(WORKLOAD_BOUNDS)),
    "draft-length table": (list(DraftLengthTable.BOUNDS),
                           lambda n, v: DraftLengthTable.from_dict(
                               {**TABLE.to_dict(), n: [v] if n == "acceptance_rates" else v}),
                           _bound_rule(DraftLengthTable.BOUNDS)),
    "served point": ([n for n in numeric_fields(ServedPoint) if n != "per_round"], lambda n, v: ServedCalibration.from_dict(
        {"points": [{**POINT, n: v}]}), lambda n, v: ServedPoint.BOUNDS[n].problem(v) is None),
    "published file": (["version", "step_ms"], _published_with,
                       lambda n, v: (VERSION if n == "version" else STEP_MS).problem(v) is None),
    "prompt-mix weight": (["weight"], lambda n, v: parse_weights({"code": v, "prose": 1.0}),
                          lambda n, v: WEIGHT.problem(v) is None),
}

CASES = [("options", cls.__name__, name) for cls in OPTIONS for name in numeric_fields(cls)]
CASES += [("document", what, name) for what, (names, _, _) in DOCUMENTS.items() for name in names]
_OPTION_CLASSES = {cls.__name__: cls for cls in OPTIONS}


def read_case(kind: str, what: str, name: str, value: Any):
    """(accepted by the stated rule or None when there is none, the reading's outcome)."""
    if kind == "options":
        read, rule = OPTIONS[_OPTION_CLASSES[what]]
    else:
        _, read, rule = DOCUMENTS[what]
    return rule(name, value), read


STRUCTURED = {  # numeric fields of documents checked as a whole by their own rule, not as one number
    "AcceptancePrior.rates": "core.goodput.validate_acceptance",
    "DraftLengthTable.ranges": "core.table.DraftTable.from_entries", "DraftLengthTable.acceptance_rates": "the prior's rates",
    "DraftLengthTable.context_entries": "core.table.DraftTable.from_entries(..., allow_context=True)",
    "DraftLengthTable.step_ms": "published.parse_published (walked as 'published file')",
    "DraftLengthTable.within_noise": "evidence, reported", "DraftLengthTable.boundaries": "evidence, reported",
    "DraftLengthTable.accepted_work_fit": "evidence, reported", "DraftLengthTable.served_cost": "evidence, reported",
}


def test_every_numeric_document_field_has_a_bound_or_a_rule():
    for cls in (EngineIdentity, StepTimeCell, AcceptancePrior, DraftLengthTable, ServedPoint):
        for name in numeric_fields(cls):
            assert (name in cls.BOUNDS or f"{cls.__name__}.{name}" in STRUCTURED
                    or (cls, name) in {(StepTimeCell, "median_ms"), (StepTimeCell, "repetitions_ms"),
                                       (ServedPoint, "per_round")}), f"{cls.__name__}.{name} has no stated bound"


def test_the_walk_covers_every_kind_of_number():
    whats = {what for _, what, _ in CASES}
    assert {"ProfileOptions", "AcceptanceOptions", "ServedVerificationOptions", "ControllerSettings",
            "engine identity", "step-time cell", "mixed-step sample", "acceptance prior", "prior workload",
            "draft-length table", "served point", "published file", "prompt-mix weight"} <= whats
    fields = {(what, name) for _, what, name in CASES}
    for expected in [("ServedVerificationOptions", n) for n in ("budget_s", "window_s", "settle_s", "rounds",
                                                                 "startup_timeout")] + [
            ("prior workload", "prompt_tokens"), ("prior workload", "output_tokens"), ("published file", "version"),
            ("published file", "step_ms"), ("served point", "ms"), ("served point", "batch")]:
        assert expected in fields


@settings(max_examples=400, deadline=None)
@given(case=st.sampled_from(CASES), value=st.sampled_from(HOSTILE) | st.floats(allow_nan=True, allow_infinity=True)
       | st.integers(-2 ** 70, 2 ** 70))
def test_every_number_is_refused_by_name_or_accepted_by_its_rule(case, value):
    kind, what, name = case
    allowed, read = read_case(kind, what, name, value)
    try:
        read(name, value)
    except TableTuneError as exc:
        text = str(exc)
        assert "\n" not in text and "Traceback" not in text, text
        assert name.split("[")[0] in text or (what == "prompt-mix weight" and "weight" in text), (case, value, text)
        if kind == "options":
            assert SOURCE in text, (case, value, text)
        return  # within its bounds a value may still break a rule across fields (min <= max), named too
    # Accepted: only by the field's stated rule, and never NaN or infinity.
    assert not (isinstance(value, float) and not math.isfinite(value)), (case, value)
    assert allowed is not False, f"{what}.{name} = {value!r} is outside its stated bounds but was accepted"


@pytest.mark.parametrize("case", CASES, ids=[f"{w}.{n}" for _, w, n in CASES])
def test_each_hostile_value_of_each_field(case):
    for value in HOSTILE:
        test_every_number_is_refused_by_name_or_accepted_by_its_rule.hypothesis.inner_test(case=case, value=value)


def test_a_bound_reads_as_one_line():
    b = Bound(0.0, 10.0, low_open=True, why="seconds")
    assert b.problem(float("nan")) == "must be a finite number > 0 and <= 10 (seconds)"
    assert b.problem(True) and b.problem(None) and Bound(0, 1, optional=True).problem(None) is None
    assert b.doc() == "(0, 10]" and Bound(1, 5, integer=True).doc() == "1..5"

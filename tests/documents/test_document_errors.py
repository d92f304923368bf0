"""Documents with missing or wrong fields fail with a DocumentError that names the field."""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeCell
from tabletune_pipelines.errors import DocumentError, InvalidTableError, SchemaVersionError, TableTuneError

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="m", drafter=None, method="ngram", max_k=3,
                       max_num_seqs=16)


def test_missing_and_unknown_fields_are_named():
    body = IDENT.to_dict()
    del body["gpu"]
    with pytest.raises(DocumentError, match="gpu"):
        EngineIdentity.from_dict(body)
    with pytest.raises(DocumentError, match="colour"):
        EngineIdentity.from_dict({**IDENT.to_dict(), "colour": "blue"})
    prior = AcceptancePrior(rates=(0.5,), num_drafts=10, drafted_per_pos=(10,), accepted_per_pos=(5,),
                            prompt_fingerprint="0" * 64, prompt_count=1).to_dict()
    del prior["rates"]
    with pytest.raises(DocumentError, match="lacks the field 'rates'"):
        AcceptancePrior.from_dict(prior)


@pytest.mark.parametrize("over, match", [
    ({"max_k": 0}, "max_k = 0 must be an integer >= 1"),
    ({"max_num_seqs": True}, "max_num_seqs = True must be an integer >= 1"),
    ({"model": ""}, "'model' must be a non-empty string"),
])
def test_identity_values(over, match):
    with pytest.raises(DocumentError, match=match):
        EngineIdentity.from_dict({**IDENT.to_dict(), **over})


@pytest.mark.parametrize("over, match", [
    ({"acceptance": "maybe"}, "acceptance = 'maybe' must be one of"),
    ({"timing": "sundial"}, "timing = 'sundial' must be one of"),
    ({"batch_size": 0}, "batch_size = 0 must be an integer >= 1"),
    ({"k": -1}, "k = -1 must be an integer >= 0"),
])
def test_cell_values(over, match):
    with pytest.raises(DocumentError, match=match):
        StepTimeCell(**{"k": 1, "batch_size": 1, "median_ms": 3.0, "repetitions_ms": (3.0,), **over})


def test_prior_source_and_lengths():
    kw = dict(rates=(0.5, 0.4), num_drafts=10, drafted_per_pos=(10, 10), accepted_per_pos=(5, 4),
              prompt_fingerprint="0" * 64, prompt_count=1)
    with pytest.raises(DocumentError, match="source = 'guess' must be one of"):
        AcceptancePrior(**kw, source="guess")
    with pytest.raises(DocumentError, match=r"drafted_per_pos \(1\), accepted_per_pos \(2\) and rates \(2\)"):
        AcceptancePrior(**{**kw, "drafted_per_pos": (10,)})


def test_domain_errors_keep_their_class_through_from_json():
    table = DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key="i", prior_id="p")
    body = table.to_dict()
    body["ranges"] = [[1, 8, 1]]  # a gap up to 16
    with pytest.raises(InvalidTableError):
        DraftLengthTable.from_json(json.dumps(body))
    with pytest.raises(SchemaVersionError, match="schema_version 2"):
        DraftLengthTable.from_dict({**table.to_dict(), "schema_version": 2})
    with pytest.raises(TableTuneError):
        DraftLengthTable.from_json("{not json")

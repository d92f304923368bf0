"""The data model round-trips through JSON with a schema version; bad documents are named."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.errors import InvalidAcceptanceError, InvalidTableError, SchemaVersionError
from tabletune_pipelines.formats.documents import (
    AcceptancePrior,
    DraftLengthTable,
    EngineIdentity,
    StepTimeCell,
    StepTimeProfile,
)

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="/m/target", drafter="/m/draft",
                       method="draft_model", max_k=3, max_num_seqs=16)


def prior(**kw):
    base = dict(rates=(0.7, 0.5, 0.3), num_drafts=1000, drafted_per_pos=(1000, 1000, 1000),
                accepted_per_pos=(700, 500, 300), prompt_fingerprint="ab" * 32, prompt_count=160)
    base.update(kw)
    return AcceptancePrior(**base)


def test_identity_round_trip_and_stable_key():
    again = EngineIdentity.from_json(IDENT.to_json())
    assert again == IDENT and again.key == IDENT.key
    assert IDENT.key.startswith("cpu__vllm-0.32.0-cpu__target__draft__draft_model__k3__n16__")


def test_identity_key_changes_with_any_field():
    import dataclasses
    assert dataclasses.replace(IDENT, vllm_version="0.33.0+cpu").key != IDENT.key
    assert dataclasses.replace(IDENT, dtype="float16").key != IDENT.key


def test_profile_round_trip():
    prof = StepTimeProfile(identity=IDENT, cells=(
        StepTimeCell(k=None, batch_size=1, median_ms=3.0, repetitions_ms=(3.0, 3.1, 2.9)),
        StepTimeCell(k=1, batch_size=1, median_ms=4.4, repetitions_ms=(4.4,), launch_k=3),
        StepTimeCell(k=1, batch_size=1, median_ms=6.0, repetitions_ms=(6.0,), acceptance="accept", launch_k=3),
    ))
    again = StepTimeProfile.from_json(prof.to_json())
    assert again == prof
    assert again.no_spec_ms() == {1: 3.0}
    assert again.accept_cells() == {1: {1: 6.0}}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=6), st.integers(0, 10**6))
def test_prior_round_trip(raw, n):
    rates = tuple(sorted(raw, reverse=True))
    p = prior(rates=rates, num_drafts=n, drafted_per_pos=(n,) * len(rates), accepted_per_pos=(0,) * len(rates))
    assert AcceptancePrior.from_json(p.to_json()) == p
    assert AcceptancePrior.from_json(p.to_json()).prior_id == p.prior_id


def test_table_round_trip_and_speculative_config():
    t = DraftLengthTable(ranges=((1, 8, 3), (9, 16, 1)), max_num_seqs=16, max_k=3, identity_key=IDENT.key,
                         prior_id="prior-x", acceptance_rates=(0.7, 0.5, 0.3), predicted_worst_loss=0.001)
    assert DraftLengthTable.from_json(t.to_json()) == t
    cfg = t.speculative_config({"method": "draft_model", "model": "/m/draft"})
    assert cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 16, 1]]


def test_bad_documents_are_rejected_with_reasons():
    with pytest.raises(InvalidAcceptanceError, match="a_2"):
        prior(rates=(0.3, 0.6, 0.1))
    with pytest.raises(InvalidTableError, match="gap"):
        DraftLengthTable(ranges=((1, 4, 3), (6, 16, 1)), max_num_seqs=16, max_k=3, identity_key="x", prior_id="p")
    doc = json.loads(IDENT.to_json())
    doc["schema_version"] = 99
    with pytest.raises(SchemaVersionError, match="schema_version 99"):
        EngineIdentity.from_dict(doc)
    with pytest.raises(SchemaVersionError, match="expected 'tabletune.acceptance_prior'"):
        AcceptancePrior.from_json(IDENT.to_json())
    with pytest.raises(SchemaVersionError, match="not valid JSON"):
        AcceptancePrior.from_json("{nope")
    with pytest.raises(ValueError, match="max_k = 0"):
        EngineIdentity(gpu="cpu", vllm_version="x", model="m", drafter=None, method="ngram", max_k=0, max_num_seqs=4)


def test_prior_never_holds_prompts():
    fields = set(json.loads(prior().to_json()))
    assert not {"prompts", "prompt", "texts"} & fields

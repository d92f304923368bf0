"""A profile travels whole: export and import carry its identity, cells and mixed-step samples, so the
imported profile derives the table the source store derives (under a prior with a workload, where
the samples price the served steps); every number of an imported file is checked by the documents'
rules, and a bad file imports nothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.errors import DocumentError, InvalidStepTimeError, TableTuneError
from tabletune_pipelines.formats.documents import StepTimeProfile
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.export import export_profiles, import_profiles
from tabletune_pipelines.tuning.derive import derive_table
from tests.tuning import samples

WORKLOAD = {"prompt_tokens": 48.0, "output_tokens": 96.0, "source": "test"}


def prior_with_workload():
    import dataclasses

    return dataclasses.replace(samples.prior(), workload=dict(WORKLOAD))


def mixed_samples(draw_extra, rng_seed: int) -> tuple[StepSample, ...]:
    """Mixed steps around the profile's decode steps: + a fixed cost + a cost per prefill token."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for b in (1, 8, 16):
        for k in (1, 2, 3):
            for p in (16, 64, 256):
                for _ in range(2):
                    ms = samples.scripted_ms(k, b) + draw_extra[0] + draw_extra[1] * p + float(rng.normal(0, 0.05))
                    out.append(StepSample(b, k, b * (1 + k), p, float(ms)))
    return tuple(out)


def roundtrip(tmp_path, profile: StepTimeProfile) -> tuple[StepTimeProfile, StepTimeProfile]:
    src, dst = TableTuneStore(tmp_path / "src.duckdb"), TableTuneStore(tmp_path / "dst.duckdb")
    src.write_profiles([profile])
    paths = export_profiles(src, tmp_path / "out")
    assert import_profiles(dst, paths) == len(profile.cells)
    key = profile.identity.key
    return src.load_profile(key), dst.load_profile(key)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fixed=st.floats(0.1, 8.0), per_token=st.floats(0.0, 0.05), seed=st.integers(0, 1000),
       noise=st.floats(0.0, 0.08))
def test_the_table_derived_after_a_roundtrip_is_the_sources(tmp_path_factory, fixed, per_token, seed, noise):
    import dataclasses

    tmp_path = tmp_path_factory.mktemp("rt")
    profile = dataclasses.replace(samples.noisy_profile(noise=noise, seed=seed),
                                  samples=mixed_samples((fixed, per_token), seed))
    before, after = roundtrip(tmp_path, profile)
    assert after.samples == before.samples == profile.samples  # every sample, in order
    assert after.cells == before.cells
    prior = prior_with_workload()
    assert derive_table(after, prior).table == derive_table(before, prior).table


def test_the_samples_are_what_makes_the_served_table(tmp_path):
    """Without its samples (what the import used to keep) the profile prices served steps otherwise."""
    import dataclasses

    profile = dataclasses.replace(samples.noisy_profile(seed=1), samples=mixed_samples((6.0, 0.04), 1))
    _, after = roundtrip(tmp_path, profile)
    prior = prior_with_workload()
    with_samples = derive_table(after, prior).table
    without = derive_table(dataclasses.replace(after, samples=()), prior).table
    assert with_samples.served_cost != without.served_cost


BAD_SAMPLE_VALUES = [
    ("ms", -1.0, InvalidStepTimeError, "ms = -1.0 must be a finite number >= 0.001"),
    ("ms", 1e308, InvalidStepTimeError, "ms = 1e+308 must be a finite number"),
    ("ms", float("nan"), InvalidStepTimeError, "ms = nan must be a finite number"),
    ("ms", "fast", InvalidStepTimeError, "ms = 'fast' must be a finite number"),
    ("ms", 1e-300, InvalidStepTimeError, "ms = 1e-300 must be a finite number >= 0.001"),
    ("batch", 0, DocumentError, "batch = 0 must be an integer >= 1"),
    ("batch", 10 ** 12, DocumentError, "batch = 1000000000000 must be an integer"),
    ("k", 2.5, DocumentError, "k = 2.5 must be an integer"),
    ("prefill_tokens", -3, DocumentError, "prefill_tokens = -3 must be an integer >= 0"),
    ("decode_tokens", None, DocumentError, "decode_tokens = None must be an integer"),
]


@pytest.mark.parametrize("field,value,error,message", BAD_SAMPLE_VALUES,
                         ids=[f"{f}={v!r}" for f, v, *_ in BAD_SAMPLE_VALUES])
def test_an_imported_sample_is_checked_by_the_writers_rules_and_nothing_is_imported(tmp_path, field, value, error,
                                                                                     message):
    import dataclasses

    profile = dataclasses.replace(samples.profile(), samples=mixed_samples((1.0, 0.01), 0))
    src = TableTuneStore(tmp_path / "src.duckdb")
    src.write_profiles([profile])
    good, = export_profiles(src, tmp_path / "out")
    doc = json.loads(good.read_text())
    doc["samples"][3][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc, allow_nan=True))
    dst = TableTuneStore(tmp_path / "dst.duckdb")
    with pytest.raises(error) as err:
        import_profiles(dst, [good, bad])
    text = str(err.value)
    assert message in text and str(bad) in text and "samples[3]" in text and "\n" not in text, text
    assert dst.identity_keys() == []  # the good file before it was not imported either
    # The same sample is refused by the store's writer: one rule.
    with pytest.raises(TableTuneError):
        src.write_step_samples(profile.identity, [StepSample(**{**doc["samples"][3]})])
    import_profiles(dst, [good])  # the rerun with the good file alone imports it whole
    assert dst.load_profile(profile.identity.key).samples == profile.samples


def test_a_sample_with_other_fields_is_named(tmp_path):
    import dataclasses

    profile = dataclasses.replace(samples.profile(), samples=mixed_samples((1.0, 0.01), 0))
    src = TableTuneStore(tmp_path / "src.duckdb")
    src.write_profiles([profile])
    good, = export_profiles(src, tmp_path / "out")
    for change in ({"colour": "blue"}, None):
        doc = json.loads(good.read_text())
        if change is None:
            doc["samples"][0] = [1, 2, 3]
        else:
            doc["samples"][0].update(change)
        good.write_text(json.dumps(doc))
        with pytest.raises(DocumentError, match=r"samples\[0\]: a mixed-step sample has exactly the fields"):
            import_profiles(TableTuneStore(tmp_path / "dst.duckdb"), [good])
    assert math.isfinite(profile.samples[0].ms)

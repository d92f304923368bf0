"""Hostile input, fourth round, class 1: an import replaces the identity's profile whole.

An imported profile replaces the store's profile of its identity and mode, cells, samples and all,
in one transaction; it never merges cell by cell into what the store holds, so the table derived
afterwards is the imported profile's. Samples outside the identity that measured them (k above its
K, a batch above its max_num_seqs) are refused by name and nothing is imported."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tabletune_pipelines.core.stepcost import StepSample
from tabletune_pipelines.errors import DocumentError
from tabletune_pipelines.formats.documents import StepTimeCell, StepTimeProfile
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.export import export_profiles, import_profiles
from tabletune_pipelines.tuning.derive import derive_table
from tests.store.test_profile_roundtrip import WORKLOAD, mixed_samples
from tests.tuning import samples


def prior():
    return dataclasses.replace(samples.prior(), workload=dict(WORKLOAD))


def stored_profile() -> StepTimeProfile:
    """What the store holds first: 16 batch sizes, mixed-step samples."""
    return dataclasses.replace(samples.noisy_profile(seed=3), samples=mixed_samples((4.0, 0.03), 3))


def other_profile() -> StepTimeProfile:
    """Another measurement of the same identity: fewer batch sizes, k = 1 half again as slow, no samples."""
    base = samples.profile(batch_sizes=(1, 4, 16))

    def slower(c: StepTimeCell) -> StepTimeCell:
        if c.k != 1:
            return c
        return dataclasses.replace(c, median_ms=c.median_ms * 1.5, repetitions_ms=(c.median_ms * 1.5,))

    return dataclasses.replace(base, cells=tuple(slower(c) for c in base.cells))


def exported(tmp_path, profile: StepTimeProfile, name: str):
    src = TableTuneStore(tmp_path / f"{name}.duckdb")
    src.write_profiles([profile])
    path, = export_profiles(src, tmp_path / name)
    return path


def test_an_import_replaces_the_profile_whole_and_the_table_is_the_imported_ones(tmp_path):
    a, b = stored_profile(), other_profile()
    key = a.identity.key
    assert key == b.identity.key
    store = TableTuneStore(tmp_path / "store.duckdb")
    store.write_profiles([a])
    before = derive_table(store.load_profile(key), prior()).table
    assert before.ranges == derive_table(a, prior()).table.ranges

    import_profiles(store, [exported(tmp_path, b, "b")])

    after_profile = store.load_profile(key)
    assert set(after_profile.cells) == set(b.cells)  # not one cell of the earlier profile left (A had 16 batch sizes)
    assert after_profile.samples == ()  # the imported profile had none, so the store has none
    after = derive_table(after_profile, prior()).table
    assert after.ranges == derive_table(b, prior()).table.ranges
    assert after.ranges != before.ranges  # the two measurements derive different tables: the test can fail
    # What a cell-by-cell merge derives (B's cells over A's, A's samples) is neither: no single measurement.
    merged_cells = {(c.acceptance, c.k, c.batch_size): c for c in (*a.cells, *b.cells)}
    merged = dataclasses.replace(a, cells=tuple(merged_cells.values()))
    assert derive_table(merged, prior()).table.ranges not in (after.ranges,)


@pytest.mark.parametrize("field,value,what", [("k", 4, "K (max_k) = 3"), ("batch", 17, "max_num_seqs = 16")])
def test_a_sample_outside_the_identity_is_refused_and_nothing_is_imported(tmp_path, field, value, what):
    a = stored_profile()
    store = TableTuneStore(tmp_path / "store.duckdb")
    store.write_profiles([a])
    before = derive_table(store.load_profile(a.identity.key), prior()).table
    path = exported(tmp_path, other_profile(), "b")
    doc = json.loads(path.read_text())
    doc["samples"] = [{"batch": 4, "k": 2, "decode_tokens": 64, "prefill_tokens": 16, "ms": 30.0}]
    doc["samples"][0][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(DocumentError) as err:
        import_profiles(store, [path])
    text = str(err.value)
    assert str(path) in text and f"samples[0]: {field} = {value} is above the identity's {what}" in text
    assert "\n" not in text
    after = store.load_profile(a.identity.key)
    assert set(after.cells) == set(a.cells) and after.samples == a.samples
    assert derive_table(after, prior()).table.ranges == before.ranges
    # The same rule holds for a profile built in memory (the store's writer, the profiler).
    with pytest.raises(DocumentError, match=f"{field} = {value} is above"):
        StepTimeProfile(identity=a.identity, cells=a.cells,
                        samples=(StepSample(**doc["samples"][0]),))


def test_two_files_of_one_profile_in_one_import_are_refused_by_name(tmp_path):
    a, b = stored_profile(), other_profile()
    store = TableTuneStore(tmp_path / "store.duckdb")
    pa, pb = exported(tmp_path, a, "a"), exported(tmp_path, b, "b")
    with pytest.raises(DocumentError) as err:
        import_profiles(store, [pa, pb])
    assert f"profile file {pa} and profile file {pb} are both the profile of" in str(err.value)
    assert store.identity_keys() == []

"""The strict published-file reader (the one the controller uses inside vLLM): every class of bad
file is refused with one PublishedTableError naming the file and the key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import PublishedTableError, TableTuneError
from tabletune_pipelines.formats.published import load_published, read_published_table, validate_ranges
from tabletune_pipelines.formats.published_build import published_document
from tabletune_pipelines.formats.published_files import write_published_table
from tabletune_pipelines.formats.published_schema import PublishedVersion
from tabletune_pipelines.evaluation.synthetic import IDENTITY, REBUILD_BUDGET_MS, publish


@pytest.fixture
def good(tmp_path):
    return publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 1)], rates=(0.7, 0.5, 0.3), prior_count=4800,
                   allowed_k=[0, 1, 3], controller={"hysteresis": 1})


def rewrite(path, mutate):
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))
    return path


def test_round_trip_carries_what_the_controller_needs(good):
    pub = load_published(good)
    assert pub.version == 1 and pub.deployment == "test"
    assert pub.ranges == ((1, 4, 3), (5, 16, 1)) and pub.max_k == 3 and pub.max_num_seqs == 16
    assert pub.prior.rates == (0.7, 0.5, 0.3) and pub.prior.num_drafts == 4800
    assert pub.allowed_k == (0, 1, 3)
    assert pub.identity["model"] == IDENTITY["model"] and pub.identity["method"] == "draft_model"
    assert pub.controller == {"hysteresis": 1, "rebuild_budget_ms": REBUILD_BUDGET_MS}
    assert sorted(pub.step_ms) == [0, 1, 2, 3] and pub.step_ms[1][16] == pytest.approx(4.0 + 0.6 + 16 * 0.2)
    assert read_published_table(good)["table"]["ranges"] == [[1, 4, 3], [5, 16, 1]]


def test_a_file_of_the_old_format_still_loads(tmp_path):
    old = {"schema": "tabletune.published_table", "schema_version": 1, "deployment": "d", "version": 2,
           "published_at": "2026-11-23T10:00:00Z", "speculative_config": {"method": "ngram"},
           "table": {"schema": "tabletune.draft_length_table", "schema_version": 1, "ranges": [[1, 16, 1]],
                     "max_num_seqs": 16, "max_k": 3, "identity_key": "k", "prior_id": "p"}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    pub = load_published(tmp_path / "old.json")
    assert pub.allowed_k == (1,) and pub.prior.rates == () and pub.step_ms == {} and pub.identity is None


BAD = [
    ("gap", lambda d: d["table"].update(ranges=[[1, 4, 3], [6, 16, 1]]), "gap between ranges"),
    ("overlap", lambda d: d["table"].update(ranges=[[1, 5, 3], [5, 16, 1]]), "overlap"),
    ("k above K", lambda d: d["table"].update(ranges=[[1, 16, 4]]), "allows at most num_speculative_tokens = 3"),
    ("short cover", lambda d: d["table"].update(ranges=[[1, 8, 3]]), "must end at max_num_seqs = 16"),
    ("not from 1", lambda d: d["table"].update(ranges=[[2, 16, 3]]), "must start at 1"),
    ("string k", lambda d: d["table"].update(ranges=[[1, 16, "3"]]), "must be an integer"),
    ("float version", lambda d: d.update(version=2.0), "version = 2.0 must be an integer"),
    ("bool version", lambda d: d.update(version=True), "version = True must be an integer"),
    ("zero version", lambda d: d.update(version=0), "version = 0 must be >= 1"),
    ("string schema_version", lambda d: d.update(schema_version="1"), "schema_version '1'"),
    ("other schema_version", lambda d: d.update(schema_version=2), "schema_version 2"),
    ("other schema", lambda d: d.update(schema="tabletune.fleet"), "not a TableTune published table"),
    ("unknown key", lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
    ("rate above 1", lambda d: d["prior"].update(rates=[1.5, 0.5, 0.3]), "outside [0, 1]"),
    ("increasing rates", lambda d: d["prior"].update(rates=[0.5, 0.7, 0.3]), "non-increasing"),
    ("prior vs table", lambda d: d["prior"].update(rates=[0.6, 0.5, 0.3]), "differ from table.acceptance_rates"),
    ("negative step", lambda d: d["table"]["step_ms"]["1"].update({"4": -1.0}), "must be positive"),
    ("step k above K", lambda d: d["table"]["step_ms"].update({"9": {"1": 1.0}}), "must be a k in 0..3"),
    ("identity K", lambda d: d["identity"].update(max_k=4), "identity.max_k = 4 differs"),
    ("spec K", lambda d: d["speculative_config"].update(num_speculative_tokens=5), "num_speculative_tokens = 5"),
    ("spec table", lambda d: d["speculative_config"].update(num_speculative_tokens_per_batch_size=[[1, 16, 3]]),
     "differs from table.ranges"),
    ("allowed misses a table k", lambda d: d.update(allowed_k=[0, 1]), "does not list"),
    ("allowed above K", lambda d: d.update(allowed_k=[0, 1, 3, 7]), "k = 7 > max_k"),
    ("bad controller key", lambda d: d.update(controller={"hystersis": 2}), "unknown setting(s) ['hystersis']"),
    ("bad controller value", lambda d: d.update(controller={"rebuild_every_steps": 0}), "rebuild_every_steps = 0"),
    ("multi-line name", lambda d: d.update(deployment="a\nb"), "one-line string"),
    ("identity value", lambda d: d["identity"].update(model_runner=["v2"]), "identity.model_runner"),
    ("identity model", lambda d: d["identity"].update(model=""), "identity.model = ''"),
]


def test_identity_may_grow_new_fields(good):
    rewrite(good, lambda d: d["identity"].update(model_runner="v2"))
    assert load_published(good).identity["model_runner"] == "v2"


@pytest.mark.parametrize("name,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_bad_files_are_refused_naming_file_and_key(good, name, mutate, message):
    rewrite(good, mutate)
    with pytest.raises(PublishedTableError) as err:
        load_published(good)
    assert message in str(err.value) and str(good) in str(err.value)
    assert isinstance(err.value, TableTuneError)


@pytest.mark.parametrize("text,message", [
    ('{"schema": "tabletune.published_table", "version": NaN}', "NaN"),
    ('{"schema": "tabletune.published_table", "version": Infinity}', "Infinity"),
    ('{"schema": "a", "schema": "tabletune.published_table"}', "duplicate key 'schema'"),
    ('{"schema": "tabletune.published_table", "sche', "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "not a TableTune published table"),
])
def test_json_level_problems(tmp_path, text, message):
    p = tmp_path / "p.json"
    p.write_text(text)
    with pytest.raises(PublishedTableError, match=message):
        load_published(p)


def test_non_utf8_missing_folder_and_huge_files(tmp_path):
    (tmp_path / "b.json").write_bytes(b'{"schema": "\xff"}')
    with pytest.raises(PublishedTableError, match="not UTF-8"):
        load_published(tmp_path / "b.json")
    with pytest.raises(PublishedTableError, match="does not exist"):
        load_published(tmp_path / "missing.json")
    with pytest.raises(PublishedTableError, match="is a folder"):
        load_published(tmp_path)
    (tmp_path / "big.json").write_bytes(b" " * (8 * 1024 * 1024 + 1))
    with pytest.raises(PublishedTableError, match="larger than"):
        load_published(tmp_path / "big.json")


def test_the_writer_refuses_what_the_reader_would(good, tmp_path):
    doc = json.loads(good.read_text())
    doc["table"]["step_ms"]["1"]["3"] = float("nan")
    with pytest.raises(PublishedTableError, match="NaN"):
        write_published_table(tmp_path / "out.json", doc)
    assert not (tmp_path / "out.json").exists()
    with pytest.raises(PublishedTableError, match="gap"):
        published_document(PublishedVersion(deployment="d", version=1, speculative_config={}, published_at="t",
                                            table={"ranges": [[1, 4, 3], [9, 16, 1]], "max_num_seqs": 16, "max_k": 3,
                                                   "identity_key": "k", "prior_id": "p"}))


ranges_st = st.lists(st.tuples(st.integers(-1, 20), st.integers(-1, 20), st.integers(-1, 5)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(ranges_st, st.integers(1, 20), st.integers(1, 4))
def test_table_rules_match_the_publish_gate(ranges, n, k_max):
    """The file's reader accepts exactly the integer tables core.table.DraftTable.from_entries accepts."""
    table = [list(r) for r in ranges]
    try:
        DraftTable.from_entries(table, max_num_seqs=n, max_k=k_max)
        gate_ok = True
    except TableTuneError:
        gate_ok = False
    try:
        validate_ranges("x", table, n, k_max)
        reader_ok = True
    except PublishedTableError:
        reader_ok = False
    assert gate_ok == reader_ok, table

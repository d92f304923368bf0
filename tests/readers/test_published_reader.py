"""The published table under hostile input: the publishing target, the reader, the bytes.

The target: publishing replaces a file atomically, so it refuses a target that is not TableTune's own
published table (the DuckDB store, the fleet file, an unrelated file, a symlink, another
deployment's table) and never writes a speculative-config companion over a file TableTune did not
write; every refused file, and the store, is byte-identical afterwards.
The reader: ``read_published_table`` (the controller's reader) applies the publish gate's table rules
to the whole file and parses JSON strictly. The bytes: bytes that are not UTF-8 name the byte.
"""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.formats.documents import DraftLengthTable, EngineIdentity
from tabletune_pipelines.errors import PublishedTableError, TableTuneError
from tabletune_pipelines.formats.fleet import parse_fleet
from tabletune_pipelines.orchestration.partitions import register_identity
from tabletune_pipelines.formats.published import load_published, read_published_table
from tabletune_pipelines.formats.published_build import published_document
from tabletune_pipelines.formats.published_files import speculative_config_path, write_published_table
from tabletune_pipelines.formats.published_schema import PublishedVersion
from tabletune_pipelines.tuning.publishing import write_speculative_config
from tabletune_pipelines.store import TableTuneStore
from tests.readers.conftest import assert_one_error, snapshot

IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="tiny:small", drafter=None, method="ngram",
                       max_k=3, max_num_seqs=16)
TABLE = DraftLengthTable(ranges=((1, 8, 3), (9, 16, 1)), max_num_seqs=16, max_k=3, identity_key=IDENT.key,
                         prior_id="prior-x")
FLEET_TEXT = """\
schema_version: 1
deployments:
  - {name: a, endpoint: embedded, gpu: cpu, model: "tiny:small", drafter: null, method: ngram, max_k: 3,
     max_num_seqs: 16, logged_prompts: prompts/a, published_table: published/a.json}
"""


@pytest.fixture
def site(tmp_path):
    """A folder with a store (one identity, one table, one publication), a fleet file and an
    unrelated file, as an operator's machine has them."""
    store = TableTuneStore(tmp_path / "tabletune_store.duckdb")
    store.upsert_identity(IDENT)
    store.publish("a", DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key=IDENT.key,
                                        prior_id="prior-x"), tmp_path / "published" / "a.json")
    store.publish("a", TABLE, tmp_path / "published" / "a.json")
    (tmp_path / "fleet.yaml").write_text(FLEET_TEXT)
    (tmp_path / "notes.json").write_text('{"mine": "not TableTune\'s"}\n')
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    return tmp_path, store


def deployment(tmp_path, published_table, name="a"):
    fleet = parse_fleet({"schema_version": 1, "deployments": [
        {"name": name, "endpoint": "embedded", "gpu": "cpu", "model": "tiny:small", "drafter": None,
         "method": "ngram", "max_k": 3, "max_num_seqs": 16, "logged_prompts": "prompts",
         "published_table": str(published_table)}]}, base_dir=tmp_path)
    return fleet.deployments[0]


def publish_like_the_pipeline(store, dep):
    """What the published_table asset does: store.publish, then the companion beside it."""
    doc = store.publish(dep.name, TABLE, dep.published_table)
    write_speculative_config(dep, doc)
    return doc


# -- the target: publishing never replaces what it does not own ------------------------------------

TARGETS = [
    ("the DuckDB store", "tabletune_store.duckdb", "is not a JSON document"),
    ("the fleet file", "fleet.yaml", "is not a JSON document"),
    ("an unrelated text file", "hosts", "is not a JSON document"),
    ("an unrelated JSON file", "notes.json", "has no \"schema\": 'tabletune.published_table'"),
    ("a folder", "published", "is not a regular file"),
]


@pytest.mark.parametrize("name,target,reason", TARGETS, ids=[t[0] for t in TARGETS])
def test_publishing_refuses_a_file_that_is_not_a_published_table(site, name, target, reason):
    tmp_path, store = site
    before = snapshot(tmp_path)
    dep = deployment(tmp_path, tmp_path / target)
    with pytest.raises(PublishedTableError) as err:
        publish_like_the_pipeline(store, dep)
    msg = str(err.value)
    assert msg.startswith(f"refusing to replace {tmp_path / target}: it {reason}") and "Nothing was written" in msg
    with pytest.raises(PublishedTableError):
        store.rollback("a", tmp_path / target)  # rollback publishes too: same rule
    assert snapshot(tmp_path) == before  # the store, the fleet file, the unrelated files: byte-identical
    assert not speculative_config_path(tmp_path / target).exists()
    assert [p["version"] for p in store.publications("a")] == [1, 2]


def test_store_fleet_file_and_an_unrelated_file_are_byte_identical_after_refused_publishes(site):
    """The issue's acceptance test: published_table at the store, at the fleet file, at an unrelated file."""
    tmp_path, store = site
    files = [tmp_path / "tabletune_store.duckdb", tmp_path / "fleet.yaml", tmp_path / "hosts"]
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    for target in files:
        with pytest.raises(PublishedTableError, match=f"refusing to replace {target}"):
            publish_like_the_pipeline(store, deployment(tmp_path, target))
    assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files} == before


def test_a_symlink_and_another_deployments_table_are_refused(site):
    tmp_path, store = site
    link = tmp_path / "link.json"
    os.symlink(tmp_path / "published" / "a.json", link)
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError, match="is a symbolic link"):
        publish_like_the_pipeline(store, deployment(tmp_path, link))
    with pytest.raises(PublishedTableError, match="it is the published table of deployment 'a', not 'b'"):
        publish_like_the_pipeline(store, deployment(tmp_path, tmp_path / "published" / "a.json", name="b"))
    assert snapshot(tmp_path) == before and os.path.islink(link)


def test_a_foreign_file_where_the_companion_goes_is_never_replaced(site):
    tmp_path, store = site
    companion = tmp_path / "published" / "a.speculative-config.json"
    companion.write_text('{"method": "ngram"}\n')  # someone's hand-written config, no table
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError, match="is not a --speculative-config with "
                                                  "num_speculative_tokens_per_batch_size"):
        publish_like_the_pipeline(store, deployment(tmp_path, tmp_path / "published" / "a.json"))
    assert snapshot(tmp_path) == before  # checked before the published table or the store changed


def test_tabletune_replaces_its_own_files(site):
    tmp_path, store = site
    dep = deployment(tmp_path, tmp_path / "published" / "a.json")
    publish_like_the_pipeline(store, dep)
    doc = publish_like_the_pipeline(store, dep)  # over its own table and its own companion
    assert doc["version"] == 4 and read_published_table(dep.published_table)["version"] == 4
    assert json.loads(dep.speculative_config_path.read_text())["num_speculative_tokens_per_batch_size"]


def test_the_writer_alone_refuses_too(site):
    tmp_path, _ = site
    doc = read_published_table(tmp_path / "published" / "a.json")
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError, match="refusing to replace"):
        write_published_table(tmp_path / "fleet.yaml", doc)
    assert snapshot(tmp_path) == before


def test_the_published_table_asset_refuses_and_leaves_the_file(home):
    from tabletune_pipelines.definitions import ASSETS
    from tests.pipeline.helpers import deployment_dict, make_resources, write_fleet

    victim = home / "victim.json"
    victim.write_text('{"important": true}\n')
    fleet_path = write_fleet(home, [deployment_dict("local-cpu", published_table=str(victim))])
    resources = make_resources(home, fleet_path)
    dep = parse_fleet(yaml.safe_load(fleet_path.read_text()), base_dir=home).deployments[0]
    from tabletune_pipelines.tuning.deployments import identity_for

    ident = identity_for(dep, "0.32.0+cpu")
    store = TableTuneStore(home / "tabletune_store.duckdb")
    store.upsert_identity(ident)
    store.write_table(DraftLengthTable(ranges=((1, 16, 1),), max_num_seqs=16, max_k=3, identity_key=ident.key,
                                       prior_id="prior-x"))
    before = snapshot(home)
    with dg.DagsterInstance.ephemeral() as instance:
        register_identity(instance, ident.key)
        res = dg.materialize(ASSETS, selection=["published_table"], resources=resources, instance=instance,
                             partition_key=ident.key, raise_on_error=False)
    assert not res.success
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert f"refusing to replace {victim}" in str(failure.step_failure_data.error)
    assert snapshot(home) == before


# -- the reader: it applies the publish gate's rules to the whole file --------------------------------

def _file(tmp_path, **over):
    doc = published_document(PublishedVersion(deployment="a", version=1, table=TABLE.to_dict(),
                                              speculative_config=TABLE.speculative_config({"method": "ngram"}),
                                              published_at="2026-11-23T10:00:00Z"))
    for key, value in over.items():
        target = doc["table"] if key in ("ranges", "max_k", "max_num_seqs") else doc
        target[key] = value
    if "ranges" in over and "allowed_k" not in over:
        # allowed_k was written for TABLE's ks ([1, 3]); with other ranges it would refuse a valid
        # table for a reason of its own (absent, it defaults to the table's ks).
        doc.pop("allowed_k", None)
    doc["speculative_config"].pop("num_speculative_tokens_per_batch_size")
    doc["speculative_config"].pop("num_speculative_tokens")
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    return path


READER_CASES = [
    ({"ranges": [[1, 4, 3], [6, 16, 1]]}, "gap between ranges [1, 4, 3] and [6, 16, 1]"),
    ({"ranges": [[1, 8, 3], [8, 16, 1]]}, "ranges [1, 8, 3] and [8, 16, 1] overlap"),
    ({"ranges": [[1, 16, 4]]}, "k = 4 but the launch allows at most num_speculative_tokens = 3"),
    ({"ranges": [[1, 16, -1]]}, "k = -1 must be >= 0"),
    ({"ranges": [[1, 15, 1]]}, "must end at max_num_seqs = 16"),
    ({"ranges": [[0, 16, 1]]}, "batch sizes must be positive"),
    ({"ranges": []}, "non-empty list"),
    ({"ranges": [[1, 16, 1.0]]}, "must be an integer"),
    ({"ranges": [[1, 16, True]]}, "must be an integer"),
    ({"version": 1.5}, "version = 1.5 must be an integer"),
    ({"version": "2"}, "version = '2' must be an integer"),
    ({"version": False}, "version = False must be an integer"),
    ({"version": -1}, "version = -1 must be >= 1"),
    ({"max_k": 0}, "table.max_k = 0 must be >= 1"),
]


@pytest.mark.parametrize("over,message", READER_CASES, ids=[str(c[0])[:40] for c in READER_CASES])
def test_the_reader_refuses_what_the_publish_gate_refuses(tmp_path, over, message):
    path = _file(tmp_path, **over)
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError) as err:
        read_published_table(path)
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused_at_parse_time(tmp_path, literal):
    path = _file(tmp_path)
    text = path.read_text().replace('"predicted_worst_loss": 0.0', f'"predicted_worst_loss": {literal}')
    assert literal in text
    path.write_text(text)
    with pytest.raises(PublishedTableError) as err:
        read_published_table(path)
    assert str(path) in str(err.value)
    assert (literal.lstrip("-") in str(err.value) or "finite number" in str(err.value))  # 1e999 parses as inf


ranges_st = st.lists(st.tuples(st.integers(0, 18), st.integers(0, 18), st.integers(-1, 4)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(ranges_st)
@example([(1, 16, 0)])  # a valid table with a k outside TABLE's allowed_k: once failed one CI run in many
@example([(1, 8, 2), (9, 16, 3)])
@example([(1, 8, 2), (10, 16, 3)])
def test_the_whole_file_is_accepted_exactly_when_the_gate_accepts_its_table(tmp_path_factory, ranges):
    tmp_path = tmp_path_factory.mktemp("p")
    table = [list(r) for r in ranges]
    try:
        DraftTable.from_entries(table, max_num_seqs=16, max_k=3)
        gate_ok = True
    except TableTuneError:
        gate_ok = False
    path = _file(tmp_path, ranges=table)
    try:
        read_published_table(path)
        reader_ok = True
    except PublishedTableError:
        reader_ok = False
    assert gate_ok == reader_ok, table


# -- the bytes: encoding ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,byte", [(b'{"schema": "tabletune.\xff"}', 22), (b"\xef\xbb\xbf{}", None),
                                      (b'{"a": "\xc3"}', 7)])
def test_bytes_that_are_not_utf8_name_the_byte(tmp_path, raw, byte):
    path = tmp_path / "a.json"
    path.write_bytes(raw)
    with pytest.raises(PublishedTableError) as err:
        read_published_table(path)
    msg = str(err.value)
    assert str(path) in msg
    assert (f"not UTF-8 (byte {byte})" in msg) if byte is not None else "not valid JSON" in msg  # a BOM


def test_show_names_a_bad_published_file_without_a_traceback(run_cli, home):
    fleet = home / "fleet.yaml"
    fleet.write_text(FLEET_TEXT)
    pub = home / "published" / "a.json"
    pub.parent.mkdir()
    pub.write_bytes(b'{"schema": "tabletune.published_table", "version": NaN}')
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", fleet, "show"), str(pub), "NaN")
    pub.write_bytes(b"\xff\xfe")
    assert_one_error(run_cli("--fleet", fleet, "show"), str(pub), "not UTF-8 (byte 0)")
    assert not (home / "tabletune_store.duckdb").exists()
    assert set(snapshot(home)) == set(before)


# -- the (batch size x context) table: table.context_entries, table.ctx_agg ---------------------------

GRID = [[1, 8, 1, 512, 3], [1, 8, 513, 4096, 1], [9, 16, 1, 512, 1], [9, 16, 513, 4096, 0]]


def _grid_file(tmp_path, spec=None, **table):
    """A valid published file of TABLE with the grid ``GRID`` (``table`` overrides its table keys,
    None removes one; ``spec`` adds speculative_config keys)."""
    path = _file(tmp_path)
    doc = json.loads(path.read_text())
    doc.pop("allowed_k", None)  # the table's ks: with the grid, k = 0 too
    doc["table"]["context_entries"] = GRID
    for key, value in table.items():
        if value is None:
            doc["table"].pop(key, None)
        else:
            doc["table"][key] = value
    doc["speculative_config"].update(spec or {})
    path.write_text(json.dumps(doc))
    return path


def test_a_grid_file_loads_with_its_cells_its_aggregate_and_every_k_allowed(tmp_path):
    pub = load_published(_grid_file(tmp_path))
    assert pub.context_entries == ((1, 8, 1, 512, 3), (1, 8, 513, 4096, 1), (9, 16, 1, 512, 1), (9, 16, 513, 4096, 0))
    assert pub.ctx_agg == "mean" and pub.allowed_k == (0, 1, 3) and pub.ranges == ((1, 8, 3), (9, 16, 1))
    shuffled = [GRID[3], GRID[0], GRID[2], GRID[1]]
    pub = load_published(_grid_file(tmp_path, ctx_agg="max", context_entries=shuffled,
                                    spec={"speculative_token_schedule": shuffled, "ctx_agg": "max"}))
    assert pub.ctx_agg == "max" and pub.context_entries[0] == (1, 8, 1, 512, 3)


def test_an_old_three_item_file_has_no_context_axis(tmp_path):
    pub = load_published(_file(tmp_path))
    assert pub.context_entries is None and pub.ctx_agg == "mean" and pub.ranges == ((1, 8, 3), (9, 16, 1))


GRID_CASES = [
    ({"context_entries": [[1, 8, 1, 512, 3], [1, 8, 513, 4096, 1], [9, 16, 1, 512, 1]]},
     "batch-size range [9, 16] has context buckets [[1, 512]], range [1, 8] has [[1, 512], [513, 4096]]: the grid "
     "must be rectangular"),
    ({"context_entries": [[1, 16, 2, 512, 3], [1, 16, 513, 4096, 1]]}, "context bucket [2, 512] starts at 2"),
    ({"context_entries": [[1, 16, 1, 500, 3], [1, 16, 513, 4096, 1]]}, "context bucket [513, 4096] starts at 513"),
    ({"context_entries": [[1, 16, 1, 512, 4], [1, 16, 513, 4096, 1]]},
     "asks for k = 4 but the launch allows at most num_speculative_tokens = 3"),
    ({"context_entries": [[1, 8, 1, 512, 3], [1, 8, 513, 4096, 1]]}, "the last range [1, 8] ends at 8"),
    ({"context_entries": [[1, 16, 3]]}, "table.context_entries[0] = [1, 16, 3] must be a [bs_lo, bs_hi, ctx_lo"),
    ({"context_entries": [[1, 16, 1, 4096, True]]}, "table.context_entries[0][4] = True must be an integer"),
    ({"context_entries": []}, "table.context_entries must be a non-empty list"),
    ({"context_entries": {"1": 3}}, "table.context_entries must be a non-empty list"),
    ({"ctx_agg": "p99"}, "table.ctx_agg = 'p99' must be one of ['mean', 'median', 'max']"),
    ({"ctx_agg": 1}, "table.ctx_agg = 1 must be one of"),
    ({"ctx_agg": "max", "context_entries": None}, "table.ctx_agg = 'max' is set without table.context_entries"),
    ({"spec": {"speculative_token_schedule": GRID[:2]}}, "speculative_config.speculative_token_schedule = "),
    ({"spec": {"speculative_token_schedule": GRID, "ctx_agg": "max"}},
     "speculative_config.ctx_agg = 'max' differs from table.ctx_agg = 'mean'"),
    ({"spec": {"speculative_token_schedule": GRID, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 16, 1]]}},
     "speculative_token_schedule and its alias num_speculative_tokens_per_batch_size are both set"),
    ({"spec": {"speculative_token_schedule": GRID}, "context_entries": None},
     "speculative_token_schedule is set but the table has no context_entries"),
]


def _column(lo, hi, level, rates=(0.7, 0.5, 0.3), ms=10.0, pooled=False):
    return {"ctx": [lo, hi], "level": level, "step_ms": {str(k): {"1": ms + k, "16": 2 * ms + k} for k in range(4)},
            "acceptance_rates": list(rates), "pooled": pooled}


COLUMNS = [_column(1, 512, 128), _column(513, 4096, 1024, rates=(0.5, 0.3, 0.2), ms=20.0, pooled=True)]


def test_a_grid_file_carries_its_columns_typed(tmp_path):
    pub = load_published(_grid_file(tmp_path, context_columns=COLUMNS))
    assert pub.context_columns is not None and [c.ctx for c in pub.context_columns] == [(1, 512), (513, 4096)]
    long = pub.context_columns[1]
    assert long.level == 1024 and long.pooled and long.acceptance_rates == (0.5, 0.3, 0.2)
    assert long.step_ms[3] == {1: 23.0, 16: 43.0} and long.to_dict() == COLUMNS[1]
    assert load_published(_grid_file(tmp_path)).context_columns is None


GRID_CASES += [
    ({"context_columns": COLUMNS, "context_entries": None},
     "table.context_columns is set without table.context_entries"),
    ({"context_columns": COLUMNS[:1]}, "table.context_columns must be a list of 2 entries, one per context bucket"),
    ({"context_columns": {"0": COLUMNS[0]}}, "table.context_columns must be a list of 2 entries"),
    ({"context_columns": [COLUMNS[1], COLUMNS[0]]}, "table.context_columns[0].ctx = [513, 4096] must be its context "
                                                    "bucket [1, 512]"),
    ({"context_columns": [{**COLUMNS[0], "level": 600}, COLUMNS[1]]},
     "table.context_columns[0].level = 600 must lie in its context bucket [1, 512]"),
    ({"context_columns": [{**COLUMNS[0], "level": True}, COLUMNS[1]]}, "table.context_columns[0].level"),
    ({"context_columns": [{**COLUMNS[0], "extra": 1}, COLUMNS[1]]},
     "table.context_columns[0] has unknown key(s) ['extra']"),
    ({"context_columns": [{k: v for k, v in COLUMNS[0].items() if k != "pooled"}, COLUMNS[1]]},
     "table.context_columns[0] lacks pooled"),
    ({"context_columns": [COLUMNS[0], {**COLUMNS[1], "acceptance_rates": [0.5, 0.6]}]},
     "table.context_columns[1].acceptance_rates[1] = 0.6 > table.context_columns[1].acceptance_rates[0] = 0.5"),
    ({"context_columns": [COLUMNS[0], {**COLUMNS[1], "acceptance_rates": [0.5, 0.4, 0.3, 0.2]}]},
     "table.context_columns[1].acceptance_rates holds 4 rates; 1..3 (table.max_k) are allowed"),
    ({"context_columns": [COLUMNS[0], {**COLUMNS[1], "step_ms": {"4": {"1": 3.0}}}]},
     "table.context_columns[1].step_ms key '4' must be a k in 0..3"),
    ({"context_columns": [COLUMNS[0], {**COLUMNS[1], "step_ms": {"1": {"1": -3.0}}}]},
     "table.context_columns[1].step_ms[1][1] = -3.0 ms must be positive"),
    ({"context_columns": [COLUMNS[0], {**COLUMNS[1], "pooled": "yes"}]},
     "table.context_columns[1].pooled = 'yes' must be true or false"),
]


@pytest.mark.parametrize("over,message", GRID_CASES, ids=[str(c[0])[:50] for c in GRID_CASES])
def test_a_bad_grid_is_one_line_naming_the_value_and_nothing_is_written(tmp_path, over, message):
    over = dict(over)
    path = _grid_file(tmp_path, spec=over.pop("spec", None), **over)
    before = snapshot(tmp_path)
    with pytest.raises(PublishedTableError) as err:
        read_published_table(path)
    msg = str(err.value)
    assert str(path) in msg and message in msg and "\n" not in msg, msg
    assert snapshot(tmp_path) == before


def test_allowed_k_must_list_every_k_of_the_grid(tmp_path):
    path = _grid_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["allowed_k"] = [1, 3]
    path.write_text(json.dumps(doc))
    with pytest.raises(PublishedTableError, match=r"the table uses k = \[0\], which allowed_k \[1, 3\] does not list"):
        read_published_table(path)

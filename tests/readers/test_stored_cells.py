"""Stored step-time cells whose values cannot be measurements.

Before: a cell whose repetitions held NaN, a negative or an infinite value was used as long as its
median was valid (the noise model, the spread and the re-measurement read the repetitions), so the
table changed silently; a cell at 1e308 ms gave an ``OverflowError`` traceback. Now every repetition
(and the median and standard error) must be a finite, positive step time of at most
``MAX_STEP_MS`` (10^7 ms): ``StepTimeCell`` refuses anything else, and the store names the row
(identity, mode, acceptance, k, B) as a ``StoredDataError``. Nothing is derived from such a store;
the file is byte-identical afterwards."""

from __future__ import annotations

import json
import math

import duckdb
import pytest

from tabletune_pipelines.formats.documents import StepTimeCell, StepTimeProfile
from tabletune_pipelines.errors import InvalidStepTimeError, StoreCorruptError, StoredDataError, TableTuneError
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.export import import_profiles
from tabletune_pipelines.vocab import MAX_STEP_MS
from tests.cli.conftest import seed_store
from tests.readers.conftest import assert_one_error, snapshot

# (repetitions_ms, median_ms, stderr_ms) written over the stored cell k = 0, B = 1 (15.0 ms), and
# what the error says. Each is a row no measurement writes.
BAD_ROWS = [
    ("NaN repetition", "[15.0, 'nan'::DOUBLE, 15.2]", 15.0, None, "step time nan ms (repetitions_ms[1]) at B=1, k=0"),
    ("negative repetition", "[15.0, -3.0, 15.1]", 15.0, None, "step time -3.0 ms (repetitions_ms[1]) at B=1, k=0"),
    ("infinite repetition", "[15.0, 'inf'::DOUBLE]", 15.0, None, "step time inf ms (repetitions_ms[1])"),
    ("zero repetition", "[0.0, 15.0, 15.1]", 15.0, None, "step time 0.0 ms (repetitions_ms[0])"),
    ("absurd repetition", "[15.0, 2e7, 15.1]", 15.0, None, "step time 20000000.0 ms (repetitions_ms[1]) at B=1, k=0 "
                                                          "is longer than 1e+07 ms"),
    ("1e308 ms cell", "[1e308]", 1e308, None, "step time 1e+308 ms (median_ms) at B=1, k=0 is longer than 1e+07 ms"),
    ("1e308 ms median", "[15.0]", 1e308, None, "step time 1e+308 ms (median_ms) at B=1, k=0 is longer than 1e+07 ms"),
    ("NaN standard error", "[15.0, 15.1]", 15.0, "'nan'::DOUBLE", "stderr_ms = nan must be a finite number"),
    ("absurd standard error", "[15.0, 15.1]", 15.0, "1e308", "stderr_ms = 1e+308 must be a finite number"),
]


@pytest.fixture
def store(tmp_path, home):
    db = tmp_path / "tt.duckdb"
    key = seed_store(db)
    return db, key


def overwrite(db, key, reps: str, median: float, stderr: str | None) -> None:
    with duckdb.connect(str(db)) as c:
        c.execute(f"UPDATE step_time_cells SET repetitions_ms = {reps}, median_ms = ?, stderr_ms = {stderr or 'NULL'} "
                  "WHERE identity_key = ? AND k = 0 AND batch_size = 1", [median, key])


@pytest.mark.parametrize("name,reps,median,stderr,message", BAD_ROWS, ids=[r[0] for r in BAD_ROWS])
def test_a_stored_cell_that_cannot_be_a_measurement_is_refused_naming_the_row(store, name, reps, median, stderr,
                                                                              message):
    db, key = store
    overwrite(db, key, reps, median, stderr)
    before = snapshot(db.parent)
    ro = TableTuneStore(db, read_only=True)
    with pytest.raises(StoredDataError) as err:
        ro.load_profile(key)
    msg = str(err.value)
    assert isinstance(err.value, StoreCorruptError) and isinstance(err.value, TableTuneError)
    assert msg.startswith(f"{db}: the stored step-time cell k=0, B=1 (reject, mode 'one_launch') of identity {key!r} "
                          "cannot be a measurement: "), msg
    assert message in msg, msg
    assert "`tabletune profile --ks 0 --batch-sizes 1` replaces the row" in msg
    assert snapshot(db.parent) == before


def test_the_cli_refuses_the_table_with_one_line_and_no_overflow_traceback(store, run_cli):
    db, key = store
    good = run_cli("--db", db, "table", "--identity", key, "--format", "vllm")
    assert good.returncode == 0, good.stderr
    for _, reps, median, stderr, message in (BAD_ROWS[0], BAD_ROWS[5]):  # NaN, and the 1e308 ms cell
        overwrite(db, key, reps, median, stderr)
        before = snapshot(db.parent)
        err = assert_one_error(run_cli("--db", db, "table", "--identity", key, "--format", "vllm"),
                               str(db), "k=0, B=1", key, message)
        assert "OverflowError" not in err and len(err.splitlines()) == 1
        assert snapshot(db.parent) == before


def test_step_times_up_to_the_bound_are_measurements_and_derive_without_overflow(store):
    """The worked example at the bound: a 10^7 ms cell (and its standard error) is still a step time,
    and the table search over it raises nothing; a hair more is refused."""
    from tabletune_pipelines.tuning.derive import derive_table

    db, key = store
    overwrite(db, key, f"[{MAX_STEP_MS}, {0.99 * MAX_STEP_MS}, {MAX_STEP_MS}]", MAX_STEP_MS, None)
    ro = TableTuneStore(db, read_only=True)
    profile = ro.load_profile(key)
    cell = next(c for c in profile.cells if c.k == 0 and c.batch_size == 1)
    assert cell.median_ms == MAX_STEP_MS and math.isfinite(cell.stderr_ms) and cell.stderr_ms > 0
    tuned = derive_table(profile, ro.latest_acceptance_prior())
    assert tuned.table.ranges  # a table, however slow B = 1 at k = 0 is
    with pytest.raises(InvalidStepTimeError, match="is longer than 1e"):
        StepTimeCell(k=0, batch_size=1, median_ms=MAX_STEP_MS, repetitions_ms=(MAX_STEP_MS * 1.0000001,))


# -- the document itself, and profiles imported from an export ------------------------------------

@pytest.mark.parametrize("reps,index", [((5.0, math.nan, 5.1), 1), ((-1.0,), 0), ((5.0, math.inf), 1),
                                        ((5.0, 1e308), 1), ((5.0, True), 1), ((5.0, "5.1"), 1)])
def test_the_cell_document_checks_every_repetition(reps, index):
    with pytest.raises(InvalidStepTimeError, match=rf"\(repetitions_ms\[{index}\]\) at B=4, k=2"):
        StepTimeCell(k=2, batch_size=4, median_ms=5.0, repetitions_ms=reps)


def test_an_exported_profile_with_a_nan_repetition_is_not_imported(store, tmp_path):
    db, key = store
    profile = TableTuneStore(db, read_only=True).load_profile(key)
    body = json.loads(profile.to_json())
    body["cells"][3]["repetitions_ms"] = [body["cells"][3]["median_ms"], math.nan]
    path = tmp_path / "exported.json"
    path.write_text(json.dumps(body))  # json.dumps writes NaN, as a careless exporter would
    with pytest.raises(InvalidStepTimeError) as err:
        StepTimeProfile.from_json(path.read_text())
    assert str(err.value).startswith(f"step-time profile of {key}, cells[3]: step time nan ms (repetitions_ms[1])")
    target = tmp_path / "other.duckdb"
    other = TableTuneStore(target)
    before = snapshot(tmp_path)
    with pytest.raises(InvalidStepTimeError, match=f"profile file {path}: step-time profile of {key}, cells\\[3\\]"):
        import_profiles(other, [path])
    assert snapshot(tmp_path) == before and other.identity_keys() == []

"""A failed command leaves nothing behind, and a rerun ends where a clean run would.

* Publishing: the table row, the version row and the files go in one transaction under the
  publication lock. A failure at each step (the published file, its companion, after both files, the
  version row) leaves the files' bytes and the store's rows as they were; a rerun publishes the next
  version with file and store agreeing. A version beyond the store's column is refused before
  anything is written (file and store keep agreeing), and once the file is moved away a rerun works.
* A sample week: a bad mix writes nothing (no empty week that every later run then fails on); a good
  one holds exactly the prompts it says.
* The one atomic writer refuses a symbolic link (its target is never written) and a non-file.
"""

from __future__ import annotations

import json
import os

import pytest

from tabletune_pipelines.errors import InvalidValueError, NotFoundError, StoreError, TableTuneError
from tabletune_pipelines.formats import prompt_mixes, strict_io
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.formats.published_files import speculative_config_path
from tabletune_pipelines.store import TableTuneStore, publications
from tests.store.test_publications import IDENT, prior, table


def files_of(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.endswith(".lock")}


def state(store, folder):
    return files_of(folder), [(r["version"], r["table_id"]) for r in store.publications("h200")], store.table_ids()


def publish(store, out, tbl, p):
    return store.publish("h200", tbl, out, document_fields=controller_fields(
        identity=IDENT, prior=p, controller={"hysteresis": 3}))


@pytest.fixture
def published_once(tmp_path):
    store = TableTuneStore(tmp_path / "s.duckdb")
    store.upsert_identity(IDENT)
    p = prior()
    store.write_acceptance_prior(p)
    out = tmp_path / "pub" / "h200.json"
    publish(store, out, table(((1, 16, 1),), p.prior_id), p)
    return store, out, p


class Killed(Exception):
    """Stands for a crash in the middle of a publication."""


def _fail_published(monkeypatch):
    monkeypatch.setattr(publications, "write_published_table", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")))


def _fail_companion(monkeypatch):
    monkeypatch.setattr(publications, "write_speculative_config_companion",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")))


def _fail_after_files(monkeypatch):
    real = publications.write_speculative_config_companion

    def then_killed(*a, **k):
        real(*a, **k)
        raise Killed("after both files were written, before the commit")
    monkeypatch.setattr(publications, "write_speculative_config_companion", then_killed)


def _fail_version_row(monkeypatch):
    monkeypatch.setattr(TableTuneStore, "_insert_publication",
                        lambda self, conn, row, doc: (_ for _ in ()).throw(StoreError("the store could not record it")))


@pytest.mark.parametrize("inject", [_fail_published, _fail_companion, _fail_after_files, _fail_version_row],
                         ids=["published file", "companion", "after both files", "version row"])
def test_a_publication_that_fails_at_any_step_leaves_file_and_store_as_they_were(published_once, monkeypatch,
                                                                                   inject):
    store, out, p = published_once
    before = state(store, out.parent)
    new = table(((1, 8, 2), (9, 16, 1)), p.prior_id)
    with monkeypatch.context() as m:
        inject(m)
        with pytest.raises((OSError, Killed, TableTuneError)):
            publish(store, out, new, p)
    assert state(store, out.parent) == before  # no new row, no new table row, same bytes, no temp files
    doc = publish(store, out, new, p)  # the rerun
    assert doc["version"] == 2 == read_published_table(out)["version"] == store.latest_publication_version("h200")
    assert store.publications("h200")[-1]["table_id"] == new.table_id
    assert json.loads(speculative_config_path(out).read_text())["num_speculative_tokens_per_batch_size"] == \
        [[1, 8, 2], [9, 16, 1]]


def test_a_version_beyond_the_stores_column_is_refused_before_anything_is_written(published_once):
    store, out, p = published_once
    doc = read_published_table(out)
    doc["version"] = 2 ** 31 - 1  # the largest the store keeps: the next one does not fit
    out.write_text(json.dumps(doc))
    before = state(store, out.parent)
    new = table(((1, 16, 2),), p.prior_id)
    for _ in range(2):  # every retry: refused the same way, file and store as they were
        with pytest.raises(StoreError) as err:
            publish(store, out, new, p)
        assert "the next version would be 2147483648" in str(err.value) and "nothing was written" in str(err.value)
        assert "\n" not in str(err.value)
        assert state(store, out.parent) == before
    os.replace(out, out.with_name("moved-away.json"))
    assert publish(store, out, new, p)["version"] == 2 == store.latest_publication_version("h200")


def test_a_published_file_with_a_version_beyond_the_column_is_not_a_published_table(tmp_path, published_once):
    store, out, p = published_once
    doc = read_published_table(out)
    doc["version"] = 2 ** 31
    out.write_text(json.dumps(doc))
    with pytest.raises(TableTuneError, match=r"version = 2147483648 must be an integer >= 1 and <= 2147483647"):
        read_published_table(out)


def test_a_published_step_time_near_zero_is_refused(published_once):
    store, out, p = published_once
    doc = read_published_table(out)
    doc["table"]["step_ms"] = {"1": {"1": 1e-300}}
    out.write_text(json.dumps(doc))
    with pytest.raises(TableTuneError, match=r"table.step_ms\[1\]\[1\] = 1e-300 must be a finite number >= 0.001"):
        read_published_table(out)


# -- a sample week ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mix", ["code:nan", "code:inf", "code:1e308,prose:1e308", "code:-1", "code:0",
                                 "code:0.5,prose:inf", "code:x"])
def test_a_bad_mix_writes_no_week(tmp_path, mix):
    week = tmp_path / "prompts" / "2026-11-16.jsonl"
    with pytest.raises(InvalidValueError) as err:
        prompt_mixes.write_week(week, mix, n=400)
    assert "prompt mix" in str(err.value) and "\n" not in str(err.value)
    assert not week.exists() and not any(week.parent.glob(".*")) if week.parent.exists() else True


def test_an_unknown_mix_is_named_and_writes_nothing(tmp_path):
    with pytest.raises(NotFoundError, match="not known"):
        prompt_mixes.write_week(tmp_path / "w.jsonl", "poetry")
    assert not (tmp_path / "w.jsonl").exists()


def test_a_week_holds_exactly_the_prompts_it_says(tmp_path, monkeypatch):
    pools = {m: tuple(f"{m} prompt {i}" for i in range(50)) for m in prompt_mixes.MIX_NAMES}
    monkeypatch.setattr(prompt_mixes, "load_mix", lambda m: pools[m])
    for mix, n in (("code:1,prose:1,chat:1", 400), ("code:0.001,prose:1", 400), ("chat", 7), ("code:2,chat:1", 1)):
        week = prompt_mixes.write_week(tmp_path / "w.jsonl", mix, n=n)
        lines = week.read_text().splitlines()
        assert len(lines) == n, (mix, n)
        assert all(json.loads(x)["prompt"] for x in lines)
    with pytest.raises(InvalidValueError, match="n = 0 must be an integer >= 1"):
        prompt_mixes.write_week(tmp_path / "w.jsonl", "code", n=0)
    assert len((tmp_path / "w.jsonl").read_text().splitlines()) == 1  # the last good week, untouched


# -- the one atomic writer -------------------------------------------------------------------------

def test_the_atomic_writer_refuses_a_link_and_a_non_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    link = tmp_path / "plot.png"
    link.symlink_to(victim)
    with pytest.raises(strict_io.NotAWriteTargetError, match="is a symbolic link"):
        strict_io.atomic_write_bytes(link, b"png")
    assert victim.read_text() == "mine\n" and link.is_symlink()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(strict_io.NotAWriteTargetError):
        strict_io.atomic_write_text(dangling, "{}")
    assert not (tmp_path / "nowhere").exists()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(strict_io.NotAWriteTargetError, match="not a regular file"):
        strict_io.atomic_write_text(tmp_path / "fifo", "{}")
    (tmp_path / "folder").mkdir()
    with pytest.raises(strict_io.NotAWriteTargetError, match="is a folder"):
        strict_io.atomic_write_text(tmp_path / "folder", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "fifo", "folder", "plot.png", "victim.txt"]
    strict_io.atomic_write_text(tmp_path / "new.json", "{}")  # nothing there, or a regular file: written
    strict_io.atomic_write_text(tmp_path / "new.json", "[]")
    assert (tmp_path / "new.json").read_text() == "[]"


def test_the_pipelines_plot_copy_never_follows_a_link(tmp_path, monkeypatch):
    pytest.importorskip("dagster")
    from tabletune_pipelines.orchestration import metadata

    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    plots = metadata.plots_dir()
    (plots / "k-t.png").symlink_to(victim)
    shown = metadata.image_metadata(b"\x89PNG fake", "k-t")
    assert victim.read_text() == "mine\n" and (plots / "k-t.png").is_symlink()
    assert "not written" in str(shown["goodput_plot_path"].value) and "symbolic link" in str(shown["goodput_plot_path"].value)
    shown = metadata.image_metadata(b"\x89PNG fake", "other")
    assert (plots / "other.png").read_bytes() == b"\x89PNG fake"

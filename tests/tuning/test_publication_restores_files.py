"""Hostile input, fourth round, class 3: a failed publication leaves every file as it was, plots included.

The served verification's plot is written by the store with the published file and its
``--speculative-config`` companion, inside the publication's transaction, and put back with them when
the publication fails: the old published file never points at a new plot."""

from __future__ import annotations

import errno
import json

import pytest

from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.formats.published_files import served_plot_path
from tabletune_pipelines.formats.published_schema import VERSION
from tabletune_pipelines.store import publications
from tabletune_pipelines.tuning.build import build_table
from tests.tuning.runs import SETTINGS, Log
from tests.tuning.test_publishing import publish, setup


def published_files(dep):
    paths = [dep.published_table, dep.speculative_config_path, served_plot_path(dep.published_table)]
    return {p: p.read_bytes() if p.exists() else None for p in paths}


def first_publication(tmp_path):
    """v1 published with its plot; the plot is then a different TableTune plot (the table's goodput
    plot), so a rewrite of the served plot would show."""
    f, s, engine, key = setup(tmp_path)
    dep = f.deployments[0]
    assert publish(s, f, key, engine).published
    plot = served_plot_path(dep.published_table)
    other = build_table(s, key, SETTINGS, allowed_ks=[1, 2], log=Log())
    plot.write_bytes(other.plot)  # a TableTune PNG, not the served plot the next publication draws
    build_table(s, key, SETTINGS, log=Log())  # the table to publish is the unrestricted one again
    return f, s, engine, key, dep


def test_a_publication_refused_by_the_store_leaves_the_plot_and_every_file_as_they_were(tmp_path):
    f, s, engine, key, dep = first_publication(tmp_path)
    doc = json.loads(dep.published_table.read_text())
    doc["version"] = int(VERSION.high)  # the next version would be beyond what the store keeps
    dep.published_table.write_text(json.dumps(doc))
    before = published_files(dep)
    rows = s.publications(dep.name)
    with pytest.raises(TableTuneError) as err:
        publish(s, f, key, engine, force=True)
    assert "nothing was written" in str(err.value) and "\n" not in str(err.value)
    assert published_files(dep) == before  # the plot too
    assert s.publications(dep.name) == rows


def test_a_publication_that_fails_mid_write_puts_the_plot_back(tmp_path, monkeypatch):
    """The disk fills while the companion is written (after the plot and the published file): the
    transaction rolls back and every file, the plot included, is put back."""
    f, s, engine, key, dep = first_publication(tmp_path)
    before = published_files(dep)
    rows = s.publications(dep.name)

    def disk_full(path, doc):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(publications, "write_speculative_config_companion", disk_full)
    with pytest.raises(OSError):
        publish(s, f, key, engine, force=True)
    assert published_files(dep) == before
    assert s.publications(dep.name) == rows
    monkeypatch.undo()
    # The rerun publishes as a first run would, and the file names the plot it wrote.
    pub = publish(s, f, key, engine, force=True)
    assert [t.version for t in pub.published] == [2]
    now = read_published_table(dep.published_table)
    plot = dep.published_table.parent / now["served_verification"]["plot"]
    assert plot.read_bytes() == pub.served_plot != before[plot]

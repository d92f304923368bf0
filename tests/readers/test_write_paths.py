"""Folders TableTune must write in that it cannot.

Before: an unwritable ``TABLETUNE_HOME`` gave a raw ``OSError`` from the fingerprint key and the
store, and ``python -m tabletune_pipelines.store.export STORE OUTDIR`` with OUTDIR an existing file
gave a traceback. Now each is an ``UnwritablePathError`` naming the folder and what to do (the
export's command line prints it as one ``error:`` line and exits 2), and nothing is written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tabletune_pipelines.engine.acceptance import fingerprint_key
from tabletune_pipelines.errors import TableTuneError, UnwritablePathError
from tabletune_pipelines.formats.fleet import default_store_path
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.export import export_profiles
from tests.cli.conftest import seed_store
from tests.readers.conftest import assert_one_error, snapshot

pytestmark = pytest.mark.timeout(120)


def unwritable_homes(tmp_path):
    """TABLETUNE_HOME values no process can create a folder in, root included: a regular file, and a
    folder below a regular file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where TABLETUNE_HOME should be\n")
    return {"a file": blocker, "below a file": blocker / "home"}


@pytest.mark.parametrize("case", ["a file", "below a file"])
def test_the_fingerprint_key_names_the_folder_and_what_to_do(tmp_path, monkeypatch, case):
    home = unwritable_homes(tmp_path)[case]
    monkeypatch.setenv("TABLETUNE_HOME", str(home))
    before = snapshot(tmp_path)
    with pytest.raises(UnwritablePathError) as err:
        fingerprint_key()
    msg = str(err.value)
    assert msg.startswith(f"cannot create the fingerprint key in {home} ("), msg
    assert "set TABLETUNE_HOME to a writable folder" in msg and isinstance(err.value, TableTuneError)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["a file", "below a file"])
def test_the_store_names_the_folder_and_what_to_do(tmp_path, monkeypatch, case):
    home = unwritable_homes(tmp_path)[case]
    monkeypatch.setenv("TABLETUNE_HOME", str(home))
    monkeypatch.delenv("TABLETUNE_DUCKDB", raising=False)
    before = snapshot(tmp_path)
    with pytest.raises(UnwritablePathError) as err:
        TableTuneStore(default_store_path())
    msg = str(err.value)
    assert msg.startswith(f"cannot create the store's folder {home} ("), msg
    assert "point TABLETUNE_DUCKDB / --db (or TABLETUNE_HOME" in msg
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder of mode 0500")
def test_a_read_only_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o500)
    try:
        monkeypatch.setenv("TABLETUNE_HOME", str(home))
        with pytest.raises(UnwritablePathError, match=f"in {home} "):
            fingerprint_key()
        with pytest.raises(UnwritablePathError, match=f"the store's folder {home} is not writable"):
            TableTuneStore(home / "tt.duckdb")
    finally:
        home.chmod(0o700)
    assert list(home.iterdir()) == []


def test_the_cli_prints_one_error_line(run_cli, home, tmp_path):
    """``acceptance`` opens the store before it starts an engine: it stops there. (With TABLETUNE_HOME
    itself a file, the fleet's ``live_counters`` under it is refused even earlier, also as one line.)"""
    prompts = home / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    db = unwritable_homes(tmp_path)["below a file"] / "tt.duckdb"
    before = snapshot(tmp_path)
    assert_one_error(run_cli("--db", db, "acceptance", "--prompts", prompts),
                     f"cannot create the store's folder {db.parent} (", "TABLETUNE_HOME")
    assert snapshot(tmp_path) == before


# -- python -m tabletune_pipelines.store.export STORE OUTDIR ------------------------------------------

def run_export(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tabletune_pipelines.store.export", *map(str, args)],
                          capture_output=True, text=True, env=dict(os.environ), cwd=cwd, timeout=120)


@pytest.fixture
def store(home):
    db = home / "tt.duckdb"
    seed_store(db)
    return db


def test_export_to_an_existing_file_is_one_error_line(store, home):
    target = home / "notes.txt"
    target.write_text("mine\n")
    before = snapshot(home)
    proc = run_export(store, target, cwd=home)
    assert_one_error(proc, f"output folder {target} exists and is not a folder; nothing was written")
    below = run_export(store, target / "sub", cwd=home)
    assert_one_error(below, f"cannot create the output folder {target / 'sub'} (")
    assert snapshot(home) == before  # the store was opened read-only: same bytes, same mtime


def test_export_never_writes_into_or_over_a_pipe_or_a_link_at_a_files_name(store, home):
    out = home / "out"
    key = TableTuneStore(store, read_only=True).identity_keys()[0]
    out.mkdir()
    name = out / f"{key}.one_launch.json"
    os.mkfifo(name)  # writing into it would wait for a reader forever
    before = snapshot(home)
    proc = run_export(store, out, cwd=home)
    assert_one_error(proc, f"cannot write {name} (it is not a regular file")
    assert snapshot(home) == before and stat.S_ISFIFO(os.lstat(name).st_mode)  # refused, left as it was
    name.unlink()
    victim = home / "victim.txt"
    victim.write_text("mine\n")
    name.symlink_to(victim)
    proc = run_export(store, out, cwd=home)
    assert_one_error(proc, f"cannot write {name} (it is a symbolic link")
    assert victim.read_text() == "mine\n" and name.is_symlink()
    name.unlink()
    proc = run_export(store, out, cwd=home)  # the rerun once the path is free
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(name)] and name.is_file()


def test_export_profiles_refuses_a_file_as_its_folder(store, home):
    target = home / "x"
    target.write_text("")
    with pytest.raises(UnwritablePathError, match=f"output folder {target} exists and is not a folder"):
        export_profiles(TableTuneStore(store, read_only=True), target)

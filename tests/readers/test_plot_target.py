"""``tabletune table --plot PATH`` under hostile input.

``table`` is documented as read-only, yet ``--plot PATH`` replaced whatever PATH was with a PNG: the
store, the fleet file, a published table. Now a plot goes only where nothing is, or over a plot
TableTune wrote (a PNG carrying ``Software: TableTune goodput_plot``); the store, the fleet file and
every deployment's published table, companion and live counters file are refused whether or not
they exist, and so are symlinks, folders and anything else. Each refusal is one ``error:`` line
naming the path, exit 2, and every file is byte-identical afterwards (a refusal comes before any
work). The plot is written atomically (temp file + rename): a failed write leaves the old plot and
no temp file."""

from __future__ import annotations

import io
import os
import shutil

import pytest

from tabletune_pipelines.cli import main
from tabletune_pipelines.errors import PlotTargetError
from tabletune_pipelines.formats.fleet import DEFAULT_FLEET_PATH, default_store_path
from tabletune_pipelines.tuning.report import PLOT_SOFTWARE, PNG_SIGNATURE, check_plot_target, write_plot
from tests.cli.conftest import seed_store
from tests.readers.conftest import assert_one_error, snapshot


@pytest.fixture
def site(home):
    """A seeded store, a copy of the embedded fleet file, the deployment's published table, an earlier
    plot of TableTune's and a few files that are not plots, all in ``home``."""
    seed_store(default_store_path())
    fleet = home / "fleet.yaml"
    shutil.copy(DEFAULT_FLEET_PATH, fleet)
    (home / "published").mkdir()
    (home / "published" / "local-cpu.json").write_text('{"schema": "tabletune.published_table"}\n')
    (home / "notes.txt").write_text("my notes\n")
    (home / "plots").mkdir()
    assert run(fleet, home / "plots" / "earlier.png")[0] == 0
    (home / "photo.png").write_bytes(_foreign_png())
    (home / "link.png").symlink_to(home / "plots" / "earlier.png")
    return home, fleet


def _foreign_png() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")  # matplotlib's own Software text, not TableTune's
    plt.close(fig)
    return buf.getvalue()


def run(fleet, target) -> tuple[int, str]:
    """``tabletune --fleet FLEET table --rates 0.7,0.5,0.3 --plot TARGET`` in this process: (status, stderr)."""
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["--fleet", str(fleet), "table", "--rates", "0.7,0.5,0.3", "--plot", str(target)])
    return status, err.getvalue()


REFUSED = [
    ("the store", lambda h: h / "tabletune_store.duckdb", "it is the DuckDB store"),
    ("the fleet file", lambda h: h / "fleet.yaml", "it is the fleet file"),
    ("a published table", lambda h: h / "published" / "local-cpu.json", "it is deployment 'local-cpu''s "
                                                                        "published_table,"),
    ("its companion, not yet written", lambda h: h / "published" / "local-cpu.speculative-config.json",
     "it is deployment 'local-cpu''s published_table's speculative-config companion"),
    ("the live counters path", lambda h: h / "live" / "local-cpu.jsonl", "it is deployment 'local-cpu''s "
                                                                        "live_counters"),
    ("a folder", lambda h: h / "plots", "it is a folder"),
    ("a symlink to a plot", lambda h: h / "link.png", "it is a symbolic link"),
    ("a PNG TableTune did not write", lambda h: h / "photo.png", "it is a PNG image without TableTune's mark"),
    ("a text file", lambda h: h / "notes.txt", "it is not a PNG image"),
    ("a missing folder", lambda h: h / "no" / "such" / "g.png", "its folder"),
]


@pytest.mark.parametrize("name,target,reason", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_target_tabletune_did_not_write_is_refused_and_left_as_it_was(site, name, target, reason):
    home, fleet = site
    before = snapshot(home)
    status, err = run(fleet, target(home))
    assert status == 2, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert line.startswith("error: --plot: ") and str(target(home)) in line and reason in line, line
    assert snapshot(home) == before  # bytes and mtime of every file; and no temp file was left
    assert not (home / "live").exists() and not (home / "no").exists()


def test_the_cli_refuses_the_store_without_a_traceback(site, run_cli):
    home, fleet = site
    before = snapshot(home)
    assert_one_error(run_cli("--fleet", fleet, "table", "--rates", "0.7,0.5,0.3", "--plot",
                             home / "tabletune_store.duckdb"), "--plot: refusing to write a plot to",
                     str(home / "tabletune_store.duckdb"), "it is the DuckDB store")
    assert snapshot(home) == before


def test_a_new_path_and_an_earlier_plot_are_written(site):
    home, fleet = site
    new = home / "g.png"
    assert run(fleet, new)[0] == 0
    data = new.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and b"Software\x00" + PLOT_SOFTWARE.encode() in data
    earlier = home / "plots" / "earlier.png"
    inode = earlier.stat().st_ino
    assert run(fleet, earlier)[0] == 0
    assert earlier.stat().st_ino != inode  # replaced by a rename, not rewritten in place
    assert sorted(p.name for p in home.rglob(".*.tmp")) == []


def test_a_failed_write_leaves_the_earlier_plot_and_no_temp_file(site, monkeypatch):
    home, fleet = site
    earlier = home / "plots" / "earlier.png"
    before = snapshot(home)

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    status, err = run(fleet, earlier)
    assert status == 2 and "error: --plot: cannot write a plot to" in err and "No space left on device" in err
    assert snapshot(home) == before and list(home.rglob("*.tmp")) == []


def test_the_check_by_itself(tmp_path):
    png = tmp_path / "a.png"
    check_plot_target(png, {tmp_path / "store.duckdb": "the DuckDB store"})  # nothing there: fine
    with pytest.raises(PlotTargetError, match="it is the DuckDB store"):
        check_plot_target(tmp_path / "store.duckdb", {tmp_path / "store.duckdb": "the DuckDB store"})
    # A PNG's signature alone is not TableTune's mark; a tEXt chunk of another keyword is not either.
    png.write_bytes(PNG_SIGNATURE + b"\x00\x00\x00\x0dIHDR" + b"\x00" * 17)
    with pytest.raises(PlotTargetError, match="without TableTune's mark"):
        check_plot_target(png)
    with pytest.raises(ValueError, match="goodput_plot's PNGs only"):
        write_plot(tmp_path / "b.png", b"GIF89a")

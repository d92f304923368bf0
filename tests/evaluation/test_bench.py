"""evaluation.bench: the benchmark scripts' integer lists and load average."""

from __future__ import annotations

from pathlib import Path

from tabletune_pipelines.evaluation import bench


def test_ints():
    assert bench.ints("1,4,16") == [1, 4, 16]
    assert bench.ints(" 2, 8 ,") == [2, 8]
    assert bench.ints("") is None and bench.ints(None) is None


def test_loadavg_reads_proc_or_says_not_available(monkeypatch):
    # /proc/loadavg changes between two reads (its running-process count did in CI), so the
    # test serves a fixed text through Path.read_text and checks it comes back stripped.
    seen = []

    def fixed(self, *args, **kwargs):
        seen.append(str(self))
        return "3.75 2.94 2.51 4/153 3142\n"

    monkeypatch.setattr(Path, "read_text", fixed)
    assert bench.loadavg() == "3.75 2.94 2.51 4/153 3142"
    assert seen == ["/proc/loadavg"]

    def missing(self, *args, **kwargs):
        raise FileNotFoundError(self)

    monkeypatch.setattr(Path, "read_text", missing)
    assert bench.loadavg() == "n/a"

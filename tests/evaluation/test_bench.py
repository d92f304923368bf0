"""evaluation.bench: the benchmark scripts' integer lists and load average."""

from __future__ import annotations

from pathlib import Path

from tabletune_pipelines.evaluation import bench


def test_ints():
    assert bench.ints("1,4,16") == [1, 4, 16]
    assert bench.ints(" 2, 8 ,") == [2, 8]
    assert bench.ints("") is None and bench.ints(None) is None


def test_loadavg_reads_proc_or_says_not_available(monkeypatch):
    assert bench.loadavg() == Path("/proc/loadavg").read_text().strip()

    def missing(self):
        raise FileNotFoundError(self)

    monkeypatch.setattr(Path, "read_text", missing)
    assert bench.loadavg() == "n/a"

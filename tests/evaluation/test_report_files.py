"""Hostile input, fourth round, class 5: the results renderer reads its data files like everything else.

A data file under benchmarks/data that is missing, truncated, of the wrong shape or not UTF-8 gets one
line naming the file (``error: <file>: ...``, exit status 2), not a traceback; a negative or impossible
count, duration or rate is refused, not drawn; nothing is written. Each case damages one file of a
copy of the committed data."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JUDGE = "benchmarks/data/h200/dense-served-judge.json"
CPU = "benchmarks/data/cpu/real_engine_eval.json"
LOG = "benchmarks/data/h100/2026-12-05-dense-one-launch-flow/cold-profile-verify/stdout.log"
START = "benchmarks/data/h100/2026-12-05-dense-one-launch-flow/warm-publish/start.json"


@pytest.fixture(scope="module")
def data_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(ROOT / "benchmarks" / "data", root / "benchmarks" / "data")
    (root / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "results.md", root / "docs" / "results.md")
    return root


@pytest.fixture
def report(data_copy, tmp_path, monkeypatch):
    """benchmarks/report.py on a fresh copy of the data (each test damages its own copy)."""
    root = tmp_path / "root"
    shutil.copytree(data_copy, root)
    spec = importlib.util.spec_from_file_location("tt_report_files", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    data = root / "benchmarks" / "data"
    for name, value in (("ROOT", root), ("DATA", data), ("H200", data / "h200"), ("PAGE", root / "docs" / "results.md"),
                        ("PICTURE", root / "docs" / "img" / "goodput-vs-batch.png"),
                        ("CPU_EVAL", data / "cpu" / "real_engine_eval.json")):
        monkeypatch.setattr(mod, name, value)
    mod.root = root
    return mod


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, allow_nan=True))


def set_window(i, key, value):
    def change(doc):
        doc["windows"][i][key] = value
    return change


CASES = {
    "missing": (JUDGE, lambda p: p.unlink(), "data file missing; restore it"),
    "truncated": (CPU, lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "not valid JSON"),
    "empty": (JUDGE, lambda p: p.write_bytes(b""), "not valid JSON"),
    "not UTF-8 (JSON)": (CPU, lambda p: p.write_bytes(b'{"meta": "\xff\xfe"}'), "not UTF-8 (byte 10)"),
    "not UTF-8 (printed log)": (LOG, lambda p: p.write_bytes(p.read_bytes() + b"\n\xc3("), "not UTF-8"),
    "a folder": (JUDGE, lambda p: (p.unlink(), p.mkdir()), "not a data file"),
    "an array": (JUDGE, lambda p: p.write_text("[1, 2]"), "a JSON object expected, got a list"),
    "a key missing": (JUDGE, lambda p: edit_json(p, lambda d: d.pop("windows")),
                      "no 'windows' in the top-level object; not the shape this page reads"),
    "a nested key missing": (CPU, lambda p: edit_json(p, lambda d: d["meta"].pop("engine")),
                             "no 'engine' in meta; not the shape this page reads"),
    "not a window": (JUDGE, lambda p: edit_json(p, lambda d: d["windows"][0].pop("seconds")),
                     "windows[0] is not a window (needs"),
    "a wrong type": (JUDGE, lambda p: edit_json(p, lambda d: d.update(policies="dense")),
                     "not the shape this page reads (TypeError"),
    "negative seconds": (JUDGE, lambda p: edit_json(p, set_window(2, "seconds", -1.5)),
                         "windows[2].seconds = -1.5 must be a finite number >= 0"),
    "negative tokens": (JUDGE, lambda p: edit_json(p, set_window(0, "kept_tokens", -20)),
                        "windows[0].kept_tokens = -20 must be a finite number >= 0"),
    "NaN seconds": (JUDGE, lambda p: edit_json(p, set_window(1, "seconds", float("nan"))),
                    "windows[1].seconds = nan must be a finite number"),
    "an absurd duration": (START, lambda p: edit_json(p, lambda d: d.update(startup_s=1e300)),
                           "startup_s = 1e+300 must be a finite number >= 0 and <= 1e+15"),
    "more mismatches than steps": (JUDGE, lambda p: edit_json(p, set_window(0, "mismatched_steps", 10 ** 9)),
                                   "windows[0]: more mismatched steps than steps"),
}


def test_the_copy_renders_the_committed_page(report):
    assert report.main(["--check"]) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_data_file_is_one_line_naming_it_and_nothing_is_written(report, capsys, case):
    rel, damage, said = CASES[case]
    damage(report.root / rel)
    page = report.PAGE.read_bytes()
    for args in (["--check"], []):
        assert report.main(args) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"error: {rel}: ") and said in err and "Traceback" not in err, err
    assert report.PAGE.read_bytes() == page and not report.PICTURE.exists()

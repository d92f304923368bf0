"""docs/results.md and README.md's headline block are what benchmarks/report.py renders from
benchmarks/data/: a hand edit, or data added without a re-render, fails here. No engine, no picture
(the comparison is the markdown only)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("tt_results_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rendered(report) -> str:
    return report.render()


def test_the_committed_page_is_what_the_data_renders(report, rendered):
    committed = report.PAGE.read_text()
    assert committed == rendered, "docs/results.md differs from the data: run `python benchmarks/report.py`"


def test_the_committed_readme_block_is_what_the_data_renders(report):
    assert report.check(report.PAGE, report.README) == []


@pytest.fixture
def copies(report, tmp_path):
    """The committed results page and README, copied into tmp_path (they match the data, above)."""
    page, readme = tmp_path / "results.md", tmp_path / "README.md"
    page.write_text(report.PAGE.read_text())
    readme.write_text(report.README.read_text())
    return page, readme


def test_check_fails_on_a_hand_edit(report, copies):
    page, readme = copies
    assert report.check(page, readme) == []
    page.write_text(page.read_text().replace("| dense | 512 | 1 |", "| dense | 512 | 2 |", 1))
    diff = "".join(report.check(page, readme))
    assert "-| dense | 512 | 2 |" in diff and "+| dense | 512 | 1 |" in diff
    assert "README" not in diff


def test_check_fails_on_a_hand_edited_readme_figure(report, copies):
    """The README's headline says the dense table is 0.985 ± 0.021 of the best fixed k at load 128
    (2026-12-02-dense-judge-L96-L128, 6 rounds); typed as 0.995 the check fails and shows both."""
    page, readme = copies
    text = readme.read_text()
    block = text[text.index(report.README_BEGIN):text.index(report.README_END)]
    assert "0.985 ± 0.021 of the best" in block and "6 paired rounds (2026-12-02)" in block
    assert "1.31 ± 0.03 of the docs' table at" in block and "lost 10 % at load 128 (0.899 ± 0.026)" in block
    readme.write_text(text.replace("0.985 ± 0.021", "0.995 ± 0.021", 1))
    diff = "".join(report.check(page, readme))
    assert "-Measured on that H200 in 6 paired rounds (2026-12-02), the dense table is 0.995 ± 0.021" in diff
    assert "+Measured on that H200 in 6 paired rounds (2026-12-02), the dense table is 0.985 ± 0.021" in diff
    assert "results.md" not in diff.replace("[docs/results.md](docs/results.md)", "")
    # text outside the markers is the README's own: an edit there is kept, not a drift
    readme.write_text(text.replace("# TableTune", "# TableTune, edited", 1))
    assert report.check(page, readme) == []


def test_a_readme_without_its_markers_is_named(report, copies):
    page, readme = copies
    readme.write_text(readme.read_text().replace(report.README_END, "", 1))
    with pytest.raises(report.DataFileError, match=r"README\.md: needs one <!-- report:headline --> line "
                                                   r"followed by one <!-- /report:headline --> line, found 1 and 0"):
        report.check(page, readme)


def test_the_page_fits_and_leads_with_the_headline(rendered):
    lines = rendered.splitlines()
    assert len(lines) <= 400
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[0].startswith("## Headline")
    assert sections.index("## The controller") < sections.index("## Tuning wall time on the H200") \
        < sections.index("## The CPU build")
    assert "](img/goodput-vs-batch.png)" in rendered


def test_every_judge_launch_is_on_the_page(report):
    """A judge launch (``gpu_served.py judge``: windows, policies and a verdict) added under
    benchmarks/data/h200 without a meta.json beside it would be left off the page silently."""
    listed = {x.file for x in report.launches()} | {report.ended_launch().file}
    judges = {p.relative_to(report.H200).as_posix() for p in report.H200.rglob("*.json")
              if {"windows", "policies", "verdict"} <= set(json.loads(p.read_text()))}
    assert judges == listed


def test_the_launches_are_read_from_their_meta_files(report):
    tuned = report.launches()
    assert len(tuned) == 16 and [x.sequence for x in tuned] == list(range(1, 17))
    first = tuned[0]
    assert (first.file, first.date, first.ceiling, first.commit) == ("dense-served-judge.json", "2026-12-01", 512,
                                                                       "5f7d024")
    assert first.command == ('python benchmarks/gpu_served.py judge --engine dense --tables '
                             'benchmarks/data/h200/dense-served.json --loads "1,32:1.5;64,96,128:3.5" --rounds 3 '
                             "--out $OUT")
    assert [x.file.split("/")[0] for x in tuned if x.ceiling == 1024] == [
        "2026-12-02-dense-judge-capture1024-L128", "2026-12-03-moe-judge-capture1024-L128"]
    ended = report.ended_launch()
    assert (ended.file, ended.date, ended.sequence) == (
        "2026-12-04-moe-judge-controller-ended-L128/moe-judge.json", "2026-12-04", 17)
    assert ended.tables == "benchmarks/data/h200/2026-12-04-moe-controller-steady-island-merge/moe-controller-ended.json"


GOOD_META = {
    "data": "moe-judge.json",
    "command": 'python benchmarks/gpu_served.py judge --engine moe --tables '
               'benchmarks/data/h200/moe-served-calibrated-all.json --loads "96:5" --rounds 10 '
               "--first-warmup-s 45 --out $OUT",
    "date": "2026-12-03", "ceiling": 512, "tables": "benchmarks/data/h200/moe-served-calibrated-all.json",
    "judged": "tuned", "sequence": 8, "commit": "f18da8d"}


def _meta_folder(root: Path, name: str, meta: dict) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "moe-judge.json").write_text("{}")
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder / "meta.json"


def test_a_good_meta_reads(report, tmp_path):
    launch = report.read_launch(_meta_folder(tmp_path, "2026-12-03-moe-judge-L96", GOOD_META))
    assert (launch.file, launch.ceiling, launch.sequence, launch.commit) == ("moe-judge.json", 512, 8, "f18da8d")


@pytest.mark.parametrize("edit, message", [
    ({"date": None}, r"field 'date': missing \(a launch's meta.json has data, command, date"),
    ({"date": "2026-12-31"}, r"field 'date': '2026-12-31' differs from the folder's date '2026-12-03'"),
    ({"date": "2026-13-03"}, r"field 'date': '2026-13-03' is not a date \(YYYY-MM-DD\)"),
    ({"ceiling": 1024}, r"field 'ceiling': 1024 differs from the command's capture ceiling 512 \(default\)"),
    ({"ceiling": "512"}, r"field 'ceiling': '512' is not an integer"),
    ({"tables": "benchmarks/data/h200/moe-served.json"},
     r"field 'tables': 'benchmarks/data/h200/moe-served.json' differs from the command's --tables "
     r"'benchmarks/data/h200/moe-served-calibrated-all.json'"),
    ({"command": "python benchmarks/gpu_served.py judge --engine moe"},
     r"field 'command': 'python benchmarks/gpu_served.py judge --engine moe'... is not"),
    ({"data": "dense-judge.json"}, r"field 'data': 'dense-judge.json' is not a file beside meta.json"),
    ({"judged": "ended"}, r"field 'judged': 'ended' is not one of tuned, controller-ended"),
    ({"sequence": 0}, r"field 'sequence': 0 is below 1"),
    ({"commit": "HEAD~2"}, r"field 'commit': 'HEAD~2' is not a commit hash"),
    ({"note": "x"}, r"field 'note': not a field of a launch's meta.json"),
])
def test_a_bad_meta_is_named_with_its_field(report, tmp_path, edit, message):
    meta = {k: v for k, v in {**GOOD_META, **edit}.items() if v is not None or k == "commit"}
    path = _meta_folder(tmp_path, "2026-12-03-moe-judge-L96", meta)
    with pytest.raises(report.DataFileError, match=re.escape(str(path)) + ": " + message):
        report.read_launch(path)


def test_a_meta_that_is_not_json_is_named(report, tmp_path):
    path = _meta_folder(tmp_path, "2026-12-03-moe-judge-L96", GOOD_META)
    path.write_text('{"data": "moe-judge.json",')
    with pytest.raises(report.DataFileError, match=re.escape(str(path)) + r": not valid JSON"):
        report.read_launch(path)


def test_two_launches_with_one_sequence_number_are_named(report, tmp_path):
    _meta_folder(tmp_path, "2026-12-03-a", GOOD_META)
    _meta_folder(tmp_path, "2026-12-03-b", GOOD_META)
    with pytest.raises(report.DataFileError, match=r"2026-12-03-b/meta.json: field 'sequence': 8 is also .*2026-12-03-a/meta.json's"):
        report.launches(root=tmp_path)


def test_every_file_the_page_names_exists(rendered):
    names = [part.split("`")[0] for part in rendered.split("`benchmarks/data/")[1:]]
    assert names
    for name in names:
        assert (ROOT / "benchmarks" / "data" / name).exists(), name

"""The real-engine benchmark's analysis (benchmarks/real_engine_eval.py) and its rendering into
benchmarks/simulator.md (benchmarks/evaluate.py) on a small hand-made set of windows: no engine."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mods():
    return _load("tt_real_engine_eval", "real_engine_eval.py"), _load("tt_evaluate_real", "evaluate.py")


# goodput (tokens per second) per policy and load; two rounds, round 1 is 2% faster for every policy
# (same tokens in 2% less time), so every ratio between policies is exact
GOOD = {1: {"k=0": 100, "k=1": 150, "k=2": 180, "k=3": 200, "docs' table": 200, "tuned (0.5% rule)": 196,
            "tuned (evidence)": 198, "tuned (evidence, A/A copy)": 200},
        16: {"k=0": 400, "k=1": 500, "k=2": 450, "k=3": 380, "docs' table": 380, "tuned (0.5% rule)": 500,
             "tuned (evidence)": 495, "tuned (evidence, A/A copy)": 490}}


def fixture_doc(ev):
    W = ev.Window
    tables = {p: [[1, 16, 1]] for p in GOOD[1]}
    windows = [W(p, ld, r, 2 * g, 2.0 / (1 + 0.02 * r), 100, float(ld), 1 if (p, ld, r) == ("k=0", 1, 0) else 0)
               for ld, row in GOOD.items() for p, g in row.items() for r in (0, 1)]
    windows.append(W("k=2", 16, 1, 999999, 2.0, 100, 16.0, 5))  # fails the step-log check: excluded
    adaptive = {}
    for name, rel in (("TurboSpec-style", 0.95), ("Nightjar-style", 0.90)):
        ws = []
        for ld in GOOD:
            for r in (0, 1):
                ws.append(W("anchor", ld, r, int(300 * 2), 2.0, 100, float(ld), 0))
                ws.append(W(name, ld, r, round(300 * rel * 2), 2.0, 100, float(ld), 0))
        adaptive[name] = {"windows": ws, "state": {"policy": name, "errors": 0}}
    nospec = [W("no-spec", ld, 0, round(0.5 * GOOD[ld]["k=0"] * 2), 2.0, 100, float(ld), 0) for ld in GOOD]
    scn = {"table": {"windows": windows, "tables": tables}, "adaptive": adaptive, "nospec": nospec}
    res = ev.analyse(scn, [1, 16])
    doc = {"meta": {"engine": "vLLM 0.32.0 (CPU build)", "target": "medium tiny", "max_num_seqs": 16, "K": 3,
                    "launch_table": [[1, 16, 3]], "loads": [1, 16], "rounds": 2, "adaptive_rounds": 2,
                    "window_s": 2.0, "settle_s": 0.5, "quick": False, "wall_s": 60.0, "loadavg_start": "1.0",
                    "loadavg_end": "2.0", "finished": "2026-12-01T12:00:00Z", "command": "python x"},
           "scenarios": {"synthetic": {"tables": tables, "profile": {"source": "test", "seconds": 1},
                                       "rates": [0.7, 0.5, 0.3], "results": res,
                                       "adaptive_state": {n: a["state"] for n, a in adaptive.items()}}}}
    return json.loads(json.dumps(ev.to_json(doc)))  # what the file holds (NaN -> null)


def test_analysis_numbers(mods):
    ev, _ = mods
    res = fixture_doc(ev)["scenarios"]["synthetic"]["results"]
    # best fixed k: k=3 at L=1 (200 x 1.01 pooled), k=1 at L=16; the window with one mismatch is kept,
    # the one with five is excluded
    assert res["best_fixed"] == {"1": "k=3", "16": "k=1"} and res["excluded_windows"] == 1
    assert res["loss"]["tuned (evidence)"]["1"] == pytest.approx(0.01, abs=1e-6)
    assert res["loss"]["docs' table"]["16"] == pytest.approx(0.24, abs=1e-6)
    assert res["worst"]["tuned (evidence)"] == pytest.approx(0.01, abs=1e-6)
    # A/A: copy / tuned = 200/198 and 490/495 in both rounds (zero s.e.)
    assert res["aa"]["1"]["diff"] == pytest.approx(200 / 198 - 1, abs=1e-4) and res["aa"]["1"]["se"] == pytest.approx(0, abs=1e-4)
    assert res["aa_floor"] == pytest.approx(200 / 198 - 1, abs=1e-4)
    # adaptive: 0.95 of the anchor, bridged with tuned / best = 0.99 at L=1
    ts = res["adaptive"]["TurboSpec-style"]["1"]
    assert ts["vs_anchor"] == pytest.approx(-0.05, abs=1e-6) and ts["loss"] == pytest.approx(1 - 0.95 * 0.99, abs=1e-6)
    assert res["nospec"]["1"]["raw_loss"] == pytest.approx(1 - 50 / 202, abs=1e-3)
    v = res["verdict"]
    assert v["within_target"] and v["better_than"] == {"docs' table": True, "TurboSpec-style": True,
                                                       "Nightjar-style": True}


def test_rendering_and_splice(mods, tmp_path):
    ev, evaluate = mods
    doc = fixture_doc(ev)
    text = evaluate.real_engine_section(doc)
    assert text.startswith(evaluate.REAL_BEGIN) and text.endswith(evaluate.REAL_END)
    assert "# Real engine (vLLM CPU build)" in text and "## Real engine: synthetic" in text
    assert "| tuned (evidence) | 1.0 | 1.0 | **1.0** |" in text
    assert "| docs' table | -0.0 | 24.0 | **24.0** |" in text or "| docs' table | 0.0 | 24.0 | **24.0** |" in text
    assert "floor (worst |A/A| over loads) **1.0%**" in text
    assert "| TurboSpec-style (policy / tuned) | -5.0 ± 0.0 | -5.0 ± 0.0 |" in text
    assert "**met**" in text and "Nightjar-style: **yes**" in text
    # splice: only the real-engine block changes, the simulator block and hand-written text stay
    res_md = tmp_path / "simulator.md"
    old = f"{evaluate.BEGIN}\nsim\n{evaluate.END}\n\n## GPU (H200): hand-written\nkeep me\n"
    res_md.write_text(old)
    data = tmp_path / "real.json"
    data.write_text(json.dumps(doc))
    assert evaluate.render_real_engine(res_md, data)
    first = res_md.read_text()
    assert first.endswith(old) and first.startswith(evaluate.REAL_BEGIN)
    assert (tmp_path / "results" / "real-engine-synthetic.png").exists()
    assert evaluate.render_real_engine(res_md, data) and res_md.read_text() == first  # idempotent
    assert not evaluate.render_real_engine(res_md, tmp_path / "missing.json")


def test_a_rerun_scenario_carries_its_own_run(mods):
    ev, evaluate = mods
    doc = fixture_doc(ev)
    assert "This scenario's run" not in evaluate.real_engine_section(doc)
    rerun = dict(doc["meta"], command="python benchmarks/real_engine_eval.py --scenarios synthetic --rounds 5",
                 rounds=5, finished="2026-12-01T13:30:00Z")
    doc["scenarios"]["synthetic"]["meta"] = rerun
    text = evaluate.real_engine_section(doc)
    assert ("This scenario's run: `python benchmarks/real_engine_eval.py --scenarios synthetic --rounds 5`, "
            "finished 2026-12-01T13:30:00Z in 1.0 min, 5 rounds") in text

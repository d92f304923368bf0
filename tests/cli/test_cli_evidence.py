"""The evidence behind a table on the command line: ``tabletune table`` prints the predicted loss with its
uncertainty, the k within noise of the chosen one per B, the number of ranges and the cells
re-measured; ``tabletune show`` prints the published file with the same evidence; ``tabletune
profile`` takes the re-measurement budget (``--remeasure-budget``) and says how many cells were
re-measured."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from tabletune_pipelines.cli import build_parser, main
from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity
from tabletune_pipelines.store import TableTuneStore
from tests.cli.conftest import embedded_identity
from tests.tuning.samples import noisy_profile

IDENT: EngineIdentity = embedded_identity()
"""The embedded default deployment's identity (as ``conftest.seed_store``): what `tabletune table` picks."""
RATES = (0.7, 0.5, 0.3)
REMEASURED = {(1, 7), (3, 7), (1, 8), (3, 8), (1, 9), (3, 9)}


def noisy_store(db, batch_sizes=None) -> TableTuneStore:
    """A store with a noisy profile (5 % noise, 3 repetitions; six cells with three more, as the
    adaptive re-measurement leaves them) and a measured prior. ``batch_sizes``: the all-rejected
    cells kept (None: every batch size, 1-16)."""
    rng = np.random.default_rng(9)
    cells = []
    for c in noisy_profile(0.05, seed=1, identity=IDENT).cells:
        if batch_sizes is not None and c.acceptance == "reject" and c.batch_size not in batch_sizes:
            continue
        if c.acceptance == "reject" and (c.k, c.batch_size) in REMEASURED:
            reps = c.repetitions_ms + tuple(float(x) for x in c.median_ms * (1 + 0.05 * rng.standard_normal(3)))
            c = dataclasses.replace(c, repetitions_ms=reps, median_ms=float(np.median(reps)), stderr_ms=None)
        cells.append(c)
    store = TableTuneStore(db)
    store.write_profile_cells(IDENT, cells)
    drafts = 5000
    store.write_acceptance_prior(AcceptancePrior(rates=RATES, num_drafts=drafts, drafted_per_pos=(drafts,) * 3,
                                                 accepted_per_pos=tuple(int(r * drafts) for r in RATES),
                                                 prompt_fingerprint="f" * 64, prompt_count=160,
                                                 deployment="local-cpu"), IDENT.key)
    return store


def test_table_prints_the_loss_with_its_bounds_the_k_within_noise_the_ranges_and_the_re_measured_cells(
        home, tmp_path, capsys):
    db = tmp_path / "noisy.duckdb"
    noisy_store(db)
    assert main(["--db", str(db), "table"]) == 0
    out = capsys.readouterr().out
    loss_line = next(line for line in out.splitlines() if line.startswith("predicted worst loss vs best fixed k: "))
    assert "(95% bounds " in loss_line and "%–" in loss_line
    ranges_line = next(line for line in out.splitlines() if line.startswith("ranges: "))
    assert f"cells re-measured: {len(REMEASURED)}" in ranges_line
    assert "k within noise" in out and "| batch sizes | chosen k | k within noise |" in out
    assert "| B | k from → to | gain | lower bound | P(gain > threshold) | supported |" in out
    # The number of ranges printed is the table's.
    vllm = [line for line in out.splitlines() if line.startswith("vLLM --speculative-config: ")][0]
    ranges = json.loads(vllm.split(": ", 1)[1])["num_speculative_tokens_per_batch_size"]
    assert ranges_line.startswith(f"ranges: {len(ranges)} (")


def test_show_prints_the_published_evidence(home, capsys):
    from tabletune_pipelines.formats.fleet import default_store_path, load_fleet
    from tabletune_pipelines.tuning.derive import derive_table

    store = noisy_store(default_store_path())
    dep = load_fleet().deployments[0]
    table = derive_table(store.load_profile(IDENT.key), store.latest_acceptance_prior()).table
    store.publish(dep.name, table, dep.published_table)
    assert main(["show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    ev = shown["evidence"]
    assert shown["table"]["predicted_worst_loss"] == table.predicted_worst_loss
    assert ev["predicted_worst_loss_lcb"] <= table.predicted_worst_loss <= ev["predicted_worst_loss_ucb"]
    assert ev["confidence"] == 0.95 and ev["ranges"] == len(table.ranges) == len(shown["table"]["ranges"])
    assert ev["cells_remeasured"] == len(REMEASURED)
    assert set(ev["within_noise"]) == {str(b) for b in range(1, 17)}


def test_profile_takes_the_remeasurement_budget_and_reports_re_measured_cells(home, monkeypatch, capsys):
    from tabletune_pipelines.tuning import deployments

    seen = {}

    def fake_profile(identity, dep, store, *, log, options):
        seen["options"] = options
        return noisy_store(store.path).load_profile(IDENT.key)

    monkeypatch.setattr(deployments, "current_identity", lambda dep: IDENT)
    monkeypatch.setattr(deployments, "profile", fake_profile)
    assert main(["profile", "--remeasure-budget", "45", "--max-repetitions", "6"]) == 0
    assert (seen["options"].remeasure_budget_s, seen["options"].max_repetitions) == (45.0, 6)
    out = json.loads(capsys.readouterr().out)
    assert out["cells_remeasured"] == len(REMEASURED) and out["wall_timed_cells"] == 0
    assert main(["profile", "--remeasure-budget", "0"]) == 0
    assert seen["options"].remeasure_budget_s == 0.0
    capsys.readouterr()
    # Without the flags the library's defaults apply (120 s, 9 repetitions), and --help names them.
    assert main(["profile"]) == 0
    from tabletune_pipelines.core.remeasure import DEFAULT_MAX_REPETITIONS
    from tabletune_pipelines.engine.plan import DEFAULT_REMEASURE_BUDGET_S

    assert seen["options"].remeasure_budget_s == DEFAULT_REMEASURE_BUDGET_S
    assert seen["options"].max_repetitions == DEFAULT_MAX_REPETITIONS
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["profile"]
    helps = {a.dest: a.help for a in sub._actions}
    assert f"default {DEFAULT_REMEASURE_BUDGET_S:.0f}," in helps["remeasure_budget"]
    assert f"(default {DEFAULT_MAX_REPETITIONS})" in helps["max_repetitions"]
    from tabletune_pipelines.core.remeasure import COARSE_POINTS
    from tabletune_pipelines.embedded import FULL_PROFILE
    from tabletune_pipelines.core.steptime import DEFAULT_DECODE_STEPS

    assert (seen["options"].decode_steps, seen["options"].coarse_points) == (DEFAULT_DECODE_STEPS, COARSE_POINTS)
    assert f"(default {DEFAULT_DECODE_STEPS}; the main job uses {FULL_PROFILE['decode_steps']})" in helps["decode_steps"]
    assert f"(default {COARSE_POINTS}; the main job uses {FULL_PROFILE['coarse_points']})" in helps["coarse_points"]
    assert main(["profile", "--decode-steps", "16", "--coarse-points", "4"]) == 0
    assert (seen["options"].decode_steps, seen["options"].coarse_points) == (16, 4)


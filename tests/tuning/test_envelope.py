"""Which graph envelope to serve (``tuning.envelope``): the raised ceiling to compare, the table and
the predicted served goodput per load of each envelope, the recommendation with its margin and its
uncertainty; and the round trip identity → published file → controller, which refuses a table of
another envelope. Synthetic profiles with worked numbers; no vLLM is launched.

The worked example (max_num_seqs 16, K = 3, a = (0.7, 0.5, 0.3): τ = 1, 1.7, 2.2, 2.5). Both
envelopes time k = 0, 1, 2 at 8, 10, 13 ms at every B. At the default ceiling k = 3 costs 16 ms,
so τ/T = 0.170 (k = 1) beats 0.169 (k = 2) and 0.156 (k = 3): the table is k = 1 everywhere, and at
load 16 serves 16 · 1.7 / 10 ms = 2720 tok/s. At the raised ceiling k = 3 stays under the graphs
at 12 ms: 2.5 / 12 = 0.208, the table is k = 3, and load 16 serves 16 · 2.5 / 12 ms = 3333 tok/s,
1.225× the default (worst loss of the default 1 − 1/1.225 = 18.4 %).
"""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from tabletune_pipelines.controller.loader import EngineFacts, load_start
from tabletune_pipelines.core.stepcost import Workload
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.evaluation.synthetic import publish
from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell, StepTimeProfile
from tabletune_pipelines.formats.identity_match import capture_grid_ceil, identity_mismatches
from tabletune_pipelines.tuning.envelope import (
    compare_envelopes,
    envelope_identities,
    raised_ceiling,
)
from tests.tuning.samples import RATES, prior

BASE = EngineIdentity(gpu="H200", vllm_version="0.26.0", model="/m/target", drafter="/m/eagle3", method="eagle3",
                      max_k=3, max_num_seqs=16, cudagraph_mode="default", capture_ceiling=128)
RAISED = dataclasses.replace(BASE, capture_ceiling=256)
DEFAULT_MS = {0: 8.0, 1: 10.0, 2: 13.0, 3: 16.0}
LOADS = (1, 8, 16)


def profile(identity: EngineIdentity, ms, spread: float = 0.1) -> StepTimeProfile:
    """T(B, k) = ms[k] at B = 1, 8, 16; three repetitions ±``spread`` around it (0: one, no errors)."""
    def reps(t):
        return (t * (1 - spread), t, t * (1 + spread)) if spread else (t,)

    cells = [StepTimeCell(k=k, batch_size=b, median_ms=ms[k](b) if callable(ms[k]) else ms[k],
                          repetitions_ms=reps(ms[k](b) if callable(ms[k]) else ms[k]), launch_k=3)
             for k in ms for b in (1, 8, 16)]
    return StepTimeProfile(identity=identity, cells=tuple(cells))


def test_the_raised_ceiling_wins_the_worked_example():
    rec = compare_envelopes(profile(BASE, DEFAULT_MS), profile(RAISED, {**DEFAULT_MS, 3: 12.0}), prior(), loads=LOADS)
    assert rec.default.ranges == [[1, 16, 1]] and rec.raised.ranges == [[1, 16, 3]]
    assert rec.default.at(16).goodput == pytest.approx(16 * 1.7 / 0.010)  # 2720 tok/s
    assert rec.raised.at(16).goodput == pytest.approx(16 * 2.5 / 0.012)  # 3333 tok/s
    assert [c.ratio for c in rec.comparisons] == pytest.approx([(2.5 / 12) / (1.7 / 10)] * 3)  # 1.225
    assert rec.worst_loss["default"] == pytest.approx(1 - (1.7 / 10) / (2.5 / 12))  # 18.4 %
    assert rec.worst_loss["raised"] == 0.0 and rec.winner == "raised"
    assert rec.margin == pytest.approx(0.184, abs=1e-3)
    # The uncertainty: the two launches' step-time errors and the prior's count error (k differs).
    assert rec.has_errors and 0.05 < rec.deciding.se < 0.2 and rec.decided and rec.recommended == "raised"
    text = "\n".join(rec.lines())
    assert "recommended: raised" in text and "beyond the noise" in text and "raised / default = 1.225 ±" in text


def test_the_default_wins_when_the_raised_launch_is_slower():
    """Graph memory taken from the KV cache, a slower launch: every k 5 % slower at the raised ceiling
    gives the same table and 1/1.05 = 0.952 of the goodput: keep the default."""
    slower = {k: 1.05 * v for k, v in DEFAULT_MS.items()}
    rec = compare_envelopes(profile(BASE, DEFAULT_MS), profile(RAISED, slower), prior(), loads=LOADS)
    assert rec.raised.ranges == rec.default.ranges == [[1, 16, 1]]
    assert [c.ratio for c in rec.comparisons] == pytest.approx([1 / 1.05] * 3)
    assert rec.winner == rec.recommended == "default"
    assert rec.worst_loss["raised"] == pytest.approx(1 - 1 / 1.05)  # 4.8 %
    assert rec.deciding.ratio == pytest.approx(1.05)  # the default over the raised, at the load that decides


def test_a_gain_within_the_noise_keeps_the_default():
    """3 % faster everywhere at the raised ceiling, measured with ±20 % repetitions: the raised ceiling
    wins on point estimates, but its lower bound is below 1, so the default is kept and the lines say why."""
    faster = {k: 0.97 * v for k, v in DEFAULT_MS.items()}
    rec = compare_envelopes(profile(BASE, DEFAULT_MS, spread=0.2), profile(RAISED, faster, spread=0.2), prior(),
                            loads=LOADS)
    assert rec.winner == "raised" and rec.deciding.ratio == pytest.approx(1 / 0.97)
    assert not rec.decided and rec.recommended == "default"
    text = "\n".join(rec.lines())
    assert "kept: raised wins on point estimates only" in text and "within the noise" in text


def test_without_error_estimates_the_point_estimates_decide_and_the_answer_says_so():
    rec = compare_envelopes(profile(BASE, DEFAULT_MS, spread=0), profile(RAISED, {**DEFAULT_MS, 3: 12.0}, spread=0),
                            prior(), loads=LOADS)
    assert rec.deciding.se is None and rec.decided and rec.recommended == "raised"
    assert all(c.se is None for c in rec.comparisons)
    assert "the answer has no uncertainty" in "\n".join(rec.lines())


def test_the_worst_load_decides():
    """k = 3 costs 12 ms at B = 1 and 8 in both envelopes, but at B = 16 the default's full steps fall
    off the graphs (20 ms) while the raised ceiling's do not (13 ms); the raised launch is 2 % slower
    for every k elsewhere. Loads 1 and 8 run k = 3 in both: the raised ceiling loses 1 − 1/1.02 = 2.0 %
    there. At load 16 the default runs k = 1 (1.7/10 = 0.170 > 2.5/20) and the raised k = 3:
    (2.5/13.26)/(1.7/10) = 1.109, the default's worst loss 1 − 1/1.109 = 9.8 %. The minimax picks the
    raised ceiling, decided at load 16."""
    default_ms = {0: 8.0, 1: 10.0, 2: 13.0, 3: lambda b: 20.0 if b >= 16 else 12.0}
    raised_ms = {0: 8.16, 1: 10.2, 2: 13.26, 3: lambda b: 13.26 if b >= 16 else 12.24}
    rec = compare_envelopes(profile(BASE, default_ms, spread=0), profile(RAISED, raised_ms, spread=0), prior(),
                            loads=LOADS)
    assert [rec.default.at(x).k for x in LOADS] == [3, 3, 1] and [rec.raised.at(x).k for x in LOADS] == [3, 3, 3]
    assert rec.comparisons[0].ratio == pytest.approx(1 / 1.02)
    assert rec.worst_loss["raised"] == pytest.approx(1 - 1 / 1.02)
    assert rec.comparisons[2].ratio == pytest.approx((2.5 / 13.26) / (1.7 / 10))  # 1.109
    assert rec.worst_loss["default"] == pytest.approx(1 - (1.7 / 10) / (2.5 / 13.26))
    assert rec.winner == rec.recommended == "raised" and rec.deciding.load == 16


def test_the_raised_ceiling_worked_numbers():
    # Without a workload: twice the decode step, vLLM's own rule without its 512 cap: 128 · 4 · 2 = 1024.
    assert raised_ceiling(128, 3) == 1024
    # With one: λ = 128 · 2.5 / 80 = 4 arrivals per step; 99 % of steps see at most 9 (Poisson);
    # 512 decode tokens + 9 · 32 prompt tokens = 800, on vLLM's grid (multiples of 16 above 256).
    work = Workload(prompt_tokens=32, output_tokens=80)
    assert raised_ceiling(128, 3, rates=RATES, workload=work) == 800
    assert raised_ceiling(128, 3, rates=RATES, workload=Workload(prompt_tokens=30, output_tokens=80)) == 784  # 782 up
    # A token budget of 640 admits at most 128 prompt tokens beside a full decode step.
    assert raised_ceiling(128, 3, rates=RATES, workload=work, max_num_batched_tokens=640) == 640
    # At max_num_seqs 16 vLLM's default, min(16 · 4 · 2, 512) = 128, already holds 2 · 64: nothing to raise.
    assert raised_ceiling(16, 3) is None
    assert [capture_grid_ceil(t) for t in (3, 60, 256, 257, 800, 801)] == [4, 64, 256, 272, 800, 816]


def test_a_deployment_that_pins_its_envelope_gets_only_the_table_tuned():
    big = dataclasses.replace(BASE, max_num_seqs=128, capture_ceiling=512)
    both = envelope_identities(big, pinned=False)
    assert [i.capture_ceiling for i in both] == [512, 1024] and both[0].key != both[1].key
    assert envelope_identities(big, pinned=True) == (big,)
    assert envelope_identities(BASE, pinned=False) == (BASE,)  # the default holds it already
    eager = dataclasses.replace(big, cudagraph_mode="none", capture_ceiling=None)
    assert envelope_identities(eager, pinned=False) == (eager,)


def test_profiles_of_two_engines_are_refused():
    other = dataclasses.replace(RAISED, max_k=2)
    with pytest.raises(InvalidValueError, match="different engines"):
        compare_envelopes(profile(BASE, DEFAULT_MS), profile(other, {0: 8.0, 1: 10.0, 2: 13.0}), prior())


# -- shipped together: identity → published file → the controller ----------------------------------------

def _facts(identity: EngineIdentity, ceiling: int | None) -> EngineFacts:
    return EngineFacts(max_k=identity.max_k, max_num_seqs=identity.max_num_seqs, launch_ranges=None,
                       model=identity.model, method=identity.method, drafter=identity.drafter,
                       vllm_version=identity.vllm_version, gpu="NVIDIA H200", capture_ceiling=ceiling)


def test_the_published_file_ships_the_envelope_and_the_controller_refuses_another(tmp_path):
    ident = dataclasses.replace(BASE, max_num_seqs=128, capture_ceiling=1024)
    path = publish(tmp_path / "pub.json", ranges=[(1, 128, 3)], rates=RATES, n=128, k_max=3,
                   identity={f: v for f, v in ident.to_dict().items() if f not in ("schema", "schema_version")})
    doc = json.loads(path.read_text())
    flags = doc["serving"]["flags"]
    assert flags[flags.index("--compilation-config") + 1] == '{"max_cudagraph_capture_size":1024}'
    assert doc["identity"]["capture_ceiling"] == 1024
    assert not isinstance(load_start(path, _facts(ident, 1024)), str)  # served in its envelope: loaded
    refused = load_start(path, _facts(ident, 512))  # vLLM's default ceiling: refused, naming both
    assert isinstance(refused, str) and "capture ceiling (max_cudagraph_capture_size) 1024 != this engine's 512" in \
        refused
    assert not isinstance(load_start(path, _facts(ident, None)), str)  # an engine that does not say: not compared
    # The same comparison for the rollback and the measurement's identity (identity_match's default fields).
    assert identity_mismatches(ident.to_dict(), dataclasses.replace(ident, capture_ceiling=512).to_dict())


def test_the_controller_reads_the_ceiling_from_vllm_s_config():
    pytest.importorskip("vllm")
    from tabletune_pipelines.controller.scheduler import engine_capture_ceiling

    def cfg(mode, ceiling):
        return types.SimpleNamespace(compilation_config=types.SimpleNamespace(
            cudagraph_mode=types.SimpleNamespace(name=mode), max_cudagraph_capture_size=ceiling))

    assert engine_capture_ceiling(cfg("FULL_AND_PIECEWISE", 1024)) == 1024
    assert engine_capture_ceiling(cfg("NONE", None)) is None  # the CPU build
    assert engine_capture_ceiling(cfg("FULL_AND_PIECEWISE", 0)) is None  # --enforce-eager
    assert engine_capture_ceiling(types.SimpleNamespace()) is None


def test_the_recommendation_over_the_store_with_the_capture_cost(tmp_path):
    """What a run calls after profiling both identities: the store's profiles, the prior a table would be
    derived from, and the capture cost read from each launch's log."""
    from tabletune_pipelines.store import TableTuneStore
    from tabletune_pipelines.tuning.envelope import recommend_from_store

    store = TableTuneStore(tmp_path / "store.duckdb")
    store.write_profiles([profile(BASE, DEFAULT_MS), profile(RAISED, {**DEFAULT_MS, 3: 12.0})])
    store.write_acceptance_prior(prior(), BASE.key)
    logs = {}
    for ident, secs, gib in ((BASE, 20, 0.61), (RAISED, 44, 1.52)):
        logs[ident.key] = tmp_path / f"{ident.capture_ceiling}.log"
        logs[ident.key].write_text(f"(EngineCore pid=1) INFO [model_runner.py:747] Graph capturing finished in {secs} "
                                   f"secs, took {gib} GiB\n")
    rec = recommend_from_store(store, BASE.key, RAISED.key, loads=LOADS, launch_logs=logs)
    assert rec.recommended == "raised" and rec.raised.ranges == [[1, 16, 3]]
    assert (rec.raised.cost.capture_s, rec.raised.cost.graph_gib) == (44.0, 1.52)
    assert "capture 44 s, graphs 1.52 GiB" in "\n".join(rec.lines())

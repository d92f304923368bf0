"""The cuda_graph_headroom gate, with worked numbers (vLLM 0.26's default capture ceiling: 512 tokens
at max_num_seqs 128, K = 3) and on tables derived from the H200 profiles of benchmarks/data/h200: it
blocks a table that puts k on a cliff the profile did not measure."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tabletune_pipelines.core.stepcost import StepSample, Workload, default_capture_ceiling
from tabletune_pipelines.formats.documents import DraftLengthTable
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table
from tabletune_pipelines.tuning.gates import BLOCKING_GATES, cuda_graph_headroom_gate
from tests.tuning.test_h200_profiles import _prior, _profile


def _h200_table(engine: str) -> DraftLengthTable:
    return derive_table(_profile(engine), _prior((0.7, 0.5, 0.3))).table


def _with_ranges(table: DraftLengthTable, ranges) -> DraftLengthTable:
    return dataclasses.replace(table, ranges=tuple(tuple(r) for r in ranges))


def test_default_capture_ceiling_is_vllms_rule():
    assert default_capture_ceiling(128, 3) == 512      # min(128·4·2, 512)
    assert default_capture_ceiling(16, 3) == 128       # min(16·4·2, 512)
    assert default_capture_ceiling(256, 1) == 512


@pytest.mark.parametrize("engine", ["dense", "moe"])
def test_tuned_h200_table_on_the_cliff_does_not_publish(engine):
    table = _h200_table(engine)
    assert table.as_vllm() == [[1, 128, 3]]
    gate = cuda_graph_headroom_gate(table, "FULL_AND_PIECEWISE")
    assert not gate.passed and gate.name in BLOCKING_GATES and gate.blocking
    # B·4 + 32 > 512 from B = 121 (121·4 = 484, + 32 = 516); B = 120 fits exactly (480 + 32 = 512).
    assert gate.figures["batch_sizes_over_the_cap"] == list(range(121, 129))
    assert gate.figures["capture_size"] == 512 and gate.figures["suggested_capture_size"] == 1024
    assert "from B = 121 (k = 3)" in gate.description and "never measured" in gate.description


def test_docs_table_and_a_larger_cap_pass():
    table = _h200_table("dense")
    docs = _with_ranges(table, [[1, 64, 3], [65, 128, 1]])   # 64·4 + 32 = 288, 128·2 + 32 = 288 <= 512
    assert cuda_graph_headroom_gate(docs, "FULL_AND_PIECEWISE").passed
    assert cuda_graph_headroom_gate(table, "FULL_AND_PIECEWISE", capture_size=1024).passed
    # k = 2 at B = 128: 384 + 32 = 416 fits; k = 0 never counts (a k = 0 step is graphed like no-spec).
    assert cuda_graph_headroom_gate(_with_ranges(table, [[1, 128, 2]]), "FULL").passed


def test_no_cuda_graphs_nothing_to_check():
    gate = cuda_graph_headroom_gate(_h200_table("dense"), "none")
    assert gate.passed and "no CUDA graphs" in gate.description


def _with_ceiling(profile, ceiling=512):
    ident = dataclasses.replace(profile.identity, capture_ceiling=ceiling, cudagraph_mode="full_and_piecewise")
    return dataclasses.replace(profile, identity=ident)


def _synthetic_mixed(profile, cliff_ms: float, rng):
    """Mixed steps of a synthetic engine: the profile's decode step + 0.5 ms + 0.01 ms/prefill token
    under the ceiling (piecewise), + ``cliff_ms`` above it (no graphs)."""
    rej = profile.reject_cells()
    out = []
    for b in (1, 64, 127):
        for k in (1, 2, 3):
            base = np.interp(b, sorted(rej[k]), [rej[k][x] for x in sorted(rej[k])])
            for p in (16, 64, 256, 512):
                d = b * (1 + k)
                extra = 0.5 + 0.01 * p + (cliff_ms if d + p > 512 else 0.0)
                for _ in range(3):
                    out.append(StepSample(b, k, d, p, float(base + extra + rng.normal(0, 0.05))))
    return tuple(out)


def test_with_a_workload_and_no_mixed_steps_the_cliff_blocks():
    prof = _with_ceiling(_profile("dense"))
    table = derive_table(prof, _prior((0.7, 0.5, 0.3)), DeriveOptions(workload=Workload(32, 96))).table
    assert table.served_cost["unmeasured_cliff"], table.served_cost
    gate = cuda_graph_headroom_gate(table, "full_and_piecewise")
    assert not gate.passed and gate.blocking
    assert min(gate.figures["batch_sizes_over_the_cap"]) > 64  # k = 3 crosses only at large B
    assert "under the workload of 32-token prompts and 96-token outputs" in gate.description, gate.description
    # A stored table whose provenance lost its workload still gets a verdict, not a KeyError.
    unreadable = dataclasses.replace(table, served_cost={k: v for k, v in table.served_cost.items() if k != "workload"})
    gate = cuda_graph_headroom_gate(unreadable, "full_and_piecewise")
    assert not gate.passed and "under the table's workload" in gate.description, gate.description


def test_a_measured_cliff_is_priced_in_and_passes():
    rng = np.random.default_rng(3)
    prof = _with_ceiling(_profile("dense"))
    prof = dataclasses.replace(prof, samples=_synthetic_mixed(prof, cliff_ms=20.0, rng=rng))
    tuned = derive_table(prof, _prior((0.7, 0.5, 0.3)), DeriveOptions(workload=Workload(32, 96)))
    table = tuned.table
    fits = table.served_cost["fits"]
    assert "full>none" in fits and fits["full>none"]["a_ms"] == pytest.approx(20.5, abs=0.5)
    assert "full>piecewise" in fits and fits["full>piecewise"]["c_ms_per_prefill_token"] == pytest.approx(0.01, abs=0.003)
    gate = cuda_graph_headroom_gate(table, "full_and_piecewise")
    assert gate.passed, gate.description
    # A 20 ms cliff at B = 128 makes k = 3 lose to a smaller k there: the table leaves k = 3 at the top.
    assert table.as_vllm()[-1][2] < 3, table.as_vllm()
    assert table.as_vllm()[0][2] == 3  # small B stays at k = 3

"""The cuda_graph_headroom warning, with worked numbers (vLLM 0.26's default capture cap: 512 tokens
at max_num_seqs 128, K = 3) and on the tables derived from the H200 profiles of benchmarks/data/h200."""

from __future__ import annotations

import pytest

from tabletune_pipelines.documents import DraftLengthTable
from tabletune_pipelines.tuning.derive import derive_table
from tabletune_pipelines.tuning.gates import BLOCKING_GATES, cuda_graph_headroom_gate, default_capture_size
from tests.tuning.test_h200_profiles import _prior, _profile


def _h200_table(engine: str) -> DraftLengthTable:
    return derive_table(_profile(engine), _prior((0.7, 0.5, 0.3))).table


def _with_ranges(table: DraftLengthTable, ranges) -> DraftLengthTable:
    import dataclasses

    return dataclasses.replace(table, ranges=tuple(tuple(r) for r in ranges))


def test_default_capture_size_is_vllms_rule():
    assert default_capture_size(128, 3) == 512      # min(128·4·2, 512)
    assert default_capture_size(16, 3) == 128       # min(16·4·2, 512)
    assert default_capture_size(256, 1) == 512


@pytest.mark.parametrize("engine", ["dense", "moe"])
def test_tuned_h200_table_runs_k3_into_the_cap_at_large_b(engine):
    table = _h200_table(engine)
    assert table.as_vllm() == [[1, 128, 3]]
    gate = cuda_graph_headroom_gate(table, "FULL_AND_PIECEWISE")
    assert not gate.passed and gate.name not in BLOCKING_GATES
    # B·4 + 32 > 512 from B = 121 (121·4 = 484, + 32 = 516); B = 120 fits exactly (480 + 32 = 512).
    assert gate.figures["batch_sizes_over_the_cap"] == list(range(121, 129))
    assert gate.figures["capture_size"] == 512 and gate.figures["suggested_capture_size"] == 1024
    assert "from B = 121 (k = 3)" in gate.description and "max_cudagraph_capture_size" in gate.description


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

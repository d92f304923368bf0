"""Acceptance measurement's pure parts: spec-decode counters, rates, prompt sampling and fingerprint."""

from __future__ import annotations

import pytest

from tabletune_pipelines.formats import prompts
from tabletune_pipelines.core.acceptance_estimate import rates_from_counts
from tabletune_pipelines.engine import acceptance
from tabletune_pipelines.engine.acceptance import (
    parse_spec_counters,
    prompt_fingerprint,
    sample_prompts,
    write_default_prompt_file,
)
from tabletune_pipelines.errors import EngineConfigError, TableTuneError
from tabletune_pipelines.vocab import DEFAULT_SAMPLE_SIZE

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="1"} 1.7e9
"""


def test_parse_spec_counters_and_rates():
    c = parse_spec_counters(METRICS)
    assert c.num_drafts == 100 and c.accepted_per_pos == (70.0, 50.0, 30.0)
    assert tuple(rates_from_counts(c.accepted_per_pos, [c.num_drafts] * 3, undrafted="previous")) == (0.7, 0.5, 0.3)
    with pytest.raises(TableTuneError, match="no vllm:spec_decode"):
        parse_spec_counters("vllm:num_requests_running 0\n")


def test_counter_differences_and_rate_rounding():
    before = parse_spec_counters(METRICS)
    after = parse_spec_counters(METRICS.replace("100.0", "200.0").replace("} 70.0", "} 150.0"))
    delta = after.minus(before)
    assert delta.num_drafts == 100 and delta.accepted_per_pos == (80.0, 0.0, 0.0)
    # Per-position drafted counts (a variable k drafts later positions less often); non-increasing.
    assert tuple(rates_from_counts([80, 40, 30], [100, 50, 20], undrafted="previous")) == (0.8, 0.8, 0.8)
    assert tuple(rates_from_counts([5, 0], [0, 0], undrafted="previous")) == (0.0, 0.0)


def test_acceptance_reads_prompt_files_with_the_one_reader():
    assert acceptance.load_prompts is prompts.load_prompts


def test_sampling_is_seeded_and_fingerprint_hides_prompts():
    ps = [f"prompt {i}" for i in range(500)]
    a = sample_prompts(ps, seed=0)
    assert len(a) == DEFAULT_SAMPLE_SIZE
    assert a == sample_prompts(ps, DEFAULT_SAMPLE_SIZE, seed=0) != sample_prompts(ps, DEFAULT_SAMPLE_SIZE, seed=1)
    assert sample_prompts(ps[:10], 160) == ps[:10]
    fp = prompt_fingerprint(a)
    assert len(fp) == 64 and "prompt" not in fp
    assert prompt_fingerprint(["ab", "c"]) != prompt_fingerprint(["a", "bc"])
    with pytest.raises(EngineConfigError, match="n = 0"):
        sample_prompts(ps, 0)


def test_default_prompt_file_is_valid_and_repetitive(tmp_path):
    path = write_default_prompt_file(tmp_path / "p" / "prompts.jsonl", n=50)
    got = prompts.load_prompts(path)
    assert len(got) == 50 and len(set(got)) > 40
    assert write_default_prompt_file(tmp_path / "q.jsonl", n=50).read_text() == path.read_text()  # seeded

"""Acceptance per context bucket through ``engine.acceptance.measure_acceptance`` on a counter
stand-in (no engine): the groups, their counts, the pooled prior, and one level = today's prior."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tabletune_pipelines.engine.acceptance import ContextSplit, measure_acceptance, measure_acceptance_from_file
from tabletune_pipelines.formats.documents import AcceptancePrior

SHORT = "one two three four five"                        # 5 tokens (one per word)
LONG = " ".join(["word"] * 40)                            # 40 tokens
KEPT = {5: (32, 24, 16), 40: (16, 8, 4)}                  # per prompt: 40 drafts, kept per position


class CounterServer:
    """vLLM's spec-decode counters for prompts of 5 and 40 words: 40 drafts each, kept as ``KEPT``."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(num_speculative_tokens=3, method="ngram", max_num_seqs=4, max_model_len=100,
                                      synthetic_acceptance_rates=None)
        self.drafts, self.kept = 0, [0, 0, 0]
        self.tokenized: list[int] = []

    def complete(self, prompt: str, *, max_tokens: int, **_: Any) -> dict[str, Any]:
        n = len(prompt.split())
        self.drafts += 40
        self.kept = [a + b for a, b in zip(self.kept, KEPT[n], strict=True)]
        return {"usage": {"prompt_tokens": n, "completion_tokens": 16}}

    def count_tokens(self, prompt: str) -> int:
        self.tokenized.append(len(prompt.split()))
        return len(prompt.split())

    def metrics_text(self) -> str:
        lines = [f"vllm:spec_decode_num_drafts_total {self.drafts}",
                 f"vllm:spec_decode_num_draft_tokens_total {3 * self.drafts}",
                 f"vllm:spec_decode_num_accepted_tokens_total {sum(self.kept)}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                  for i, v in enumerate(self.kept)]
        return "\n".join(lines) + "\n"

    def step_log_offset(self) -> int:
        return 0

    def read_steps(self, **_: Any) -> list:
        return []

    def log_tail(self, lines: int = 40) -> str:
        return ""


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_HOME", str(tmp_path / "home"))  # the fingerprint key


PROMPTS = [SHORT] * 30 + [LONG] * 10


def test_two_levels_measure_each_bucket_and_pool_the_small_one():
    srv = CounterServer()
    prior = measure_acceptance(srv, PROMPTS, max_tokens=16, context=ContextSplit(levels=(8, 64)))
    # Buckets (1, 22) and (23, 100): isqrt(8 * 64) = 22, the last ending at the server's max_model_len.
    short, long = prior.context
    assert (short.lo, short.hi, short.prompt_count, short.num_drafts) == (1, 22, 30, 1200)
    assert short.accepted_per_pos == (960, 720, 480) and short.rates == (0.8, 0.6, 0.4) and not short.pooled
    assert (long.lo, long.hi, long.prompt_count, long.num_drafts) == (23, 100, 10, 400)
    assert long.rates == (0.4, 0.2, 0.1) and long.pooled and long.reason == "10 prompts < 20"
    # The prior itself is the pool: 1120 / 1600, 800 / 1600, 520 / 1600.
    assert prior.rates == (0.7, 0.5, 0.325) and prior.num_drafts == 1600 and prior.prompt_count == 40
    assert prior.rates_by_context() == {8: (0.8, 0.6, 0.4), 64: (0.7, 0.5, 0.325)}
    assert srv.tokenized == [5] * 30 + [40] * 10  # no length was logged: each was tokenized once
    assert AcceptancePrior.from_json(prior.to_json()) == prior


def test_logged_lengths_place_prompts_without_tokenizing():
    srv = CounterServer()
    split = ContextSplit(levels=(8, 64), lengths=(5,) * 30 + (None,) * 10)
    prior = measure_acceptance(srv, PROMPTS, max_tokens=16, context=split)
    assert srv.tokenized == [40] * 10
    assert [b.prompt_count for b in prior.context] == [30, 10]


def test_one_level_is_byte_identical_to_no_split(tmp_path):
    plain = measure_acceptance(CounterServer(), PROMPTS, max_tokens=16)
    one = measure_acceptance(CounterServer(), PROMPTS, max_tokens=16, context=ContextSplit(levels=(32,)))
    assert one.to_json() == plain.to_json() and one.prior_id == plain.prior_id and one.context is None
    body = json.loads(plain.to_json())
    assert "context" not in body and body["rates"] == [0.7, 0.5, 0.325] and body["num_drafts"] == 1600
    # The file path with one level (or none): the same draw, the same document.
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "prompt_tokens": len(p.split())}) + "\n" for p in PROMPTS))
    cfg = CounterServer().config
    a = measure_acceptance_from_file(cfg, f, n=25, seed=3, max_tokens=16, server=CounterServer())
    b = measure_acceptance_from_file(cfg, f, n=25, seed=3, max_tokens=16, server=CounterServer(), context_levels=(32,))
    assert a.to_json() == b.to_json()
    two = measure_acceptance_from_file(cfg, f, n=25, seed=3, max_tokens=16, server=(s := CounterServer()),
                                       context_levels=(8, 64))
    assert s.tokenized == [] and two.prompt_fingerprint == a.prompt_fingerprint  # same 25 prompts drawn
    assert sum(b.prompt_count for b in two.context) == 25


def test_a_stored_prior_keeps_its_id():
    # A prior of one bucket as stored before the breakdown existed: same JSON, same id.
    p = AcceptancePrior(rates=(0.5, 0.25), num_drafts=10, drafted_per_pos=(10, 10), accepted_per_pos=(5, 2),
                        prompt_fingerprint="x", prompt_count=3)
    assert p.prior_id == "prior-adhoc-c7f2e3238d"


def test_context_levels_are_an_acceptance_option_checked_by_the_one_rule():
    from tabletune_pipelines.errors import InvalidValueError
    from tabletune_pipelines.tuning.deployments import AcceptanceOptions

    assert AcceptanceOptions.from_mapping({"context_levels": [256, 1024]}).context_levels == (256, 1024)
    assert AcceptanceOptions().context_levels == ()
    for bad, says in (([1024, 256], "strictly ascending"), ([0, 8], "positive"), ("256", "list of integers"),
                      ([8, True], "list of integers")):
        with pytest.raises(InvalidValueError, match=says):
            AcceptanceOptions.from_mapping({"context_levels": bad}, where="engine acceptance_options")

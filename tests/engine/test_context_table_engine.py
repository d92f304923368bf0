"""The timing scheduler serves a 5-item (batch size x context) table on real vLLM (CPU build, the
session's shared server: tiny draft-model target, K = 3, max_num_seqs 8, max_model_len 512, synthetic
acceptance 0.7, 0.5, 0.3): ``set_k`` sends the grid, and every step runs the k of the cell of its batch
size and its running requests' mean context, the column picked at the context the step log records.

Four requests at a time (admitted in one step) at a 16-token prompt and at a 300-token one, 24 output
tokens each (``ignore_eos``): the short batch's context stays within 16..40 (the first column, 1..128),
the long one's within 300..324 (the second, 129..512), apart from the first step of each batch, which
runs with no request yet in the cache (context 1: the first column). A request keeps at most k + 1
tokens a step, so the short batch runs at least 24 / 4 = 6 steps and the long one, at k <= 1, at least
24 / 2 = 12. The shared launch table ((1, 8, 3)) is put back at the end.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.engine.tiny_models import read_vocab_size
from tabletune_pipelines.tuning.served_windows import table_mismatches

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

GRID = [[1, 2, 1, 128, 3], [1, 2, 129, 512, 1], [3, 8, 1, 128, 2], [3, 8, 129, 512, 0]]
"""k per (batch-size range, context bucket): every cell differs from its row's and column's neighbours."""


def batch_of_four(server, prompt_tokens: int, vocab: int) -> list[dict]:
    """Four requests of ``prompt_tokens`` random ids, 24 output tokens each, admitted in one step; their steps."""
    rng = random.Random(prompt_tokens)
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_tokens)] for _ in range(4)]
    offset = server.step_log_offset()
    server.arm_gate(4)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for f in [pool.submit(server.complete, p, max_tokens=24, ignore_eos=True) for p in prompts]:
            f.result()
    return [s for s in server.read_steps(offset=offset) if s.get("b", 0) > 0]


def test_each_step_runs_the_k_of_its_batch_size_and_context_column(shared_server, shared_config):
    vocab = read_vocab_size(shared_config.model) or 1000
    table = DraftTable.from_entries(GRID, allow_context=True)
    try:
        shared_server.set_k(table=GRID)
        short = batch_of_four(shared_server, 16, vocab)
        long = batch_of_four(shared_server, 300, vocab)
    finally:
        shared_server.set_k(table=[[1, 8, 3]])
    for steps in (short, long):
        assert all("x" in s for s in steps), steps[:3]
        assert table_mismatches(steps, GRID, 8, 3) == [], steps
    short_ctx = [s for s in short if 16 <= s["x"] <= 40]
    long_ctx = [s for s in long if 300 <= s["x"] <= 324]
    assert len(short_ctx) >= 6 and len(long_ctx) >= 12, (short, long)
    assert {s["k"] for s in short_ctx} <= {3, 2} and {s["k"] for s in long_ctx} <= {1, 0}
    assert all(s["k"] == table.k_at(s["b"], s["x"]) for s in short_ctx + long_ctx)
    assert all(s["x"] == 1 for s in short + long if not 16 <= s["x"] <= 324), (short, long)
    print(f"\n[context table] short: {[(s['b'], s['x'], s['k']) for s in short]}\n"
          f"[context table] long: {[(s['b'], s['x'], s['k']) for s in long]}")

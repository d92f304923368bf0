"""``engine.mixed.batch_samples``: the step log of one decoding batch at (k, B) as mixed-step
samples, on step-log records written as ``engine.timing_scheduler`` writes them (no server)."""

from __future__ import annotations

from tabletune_pipelines.core.stepcost import samples_from_step_log
from tabletune_pipelines.engine.mixed import batch_samples


def _log(drafts, *, b=15, k=3, mixed_every=4, p=64):
    """A batch of ``b`` requests at ``k``: one record per step, ``drafts[i]`` drafts verified in step i,
    a prompt of ``p`` tokens joining every ``mixed_every``-th step (it counts in ``b`` and ``new``)."""
    out = [{"t": 0.0, "dt": None, "b": b, "k": k, "d": 0, "new": b, "tok": b * 32}]
    for i, d in enumerate(drafts, start=1):
        joins = i % mixed_every == 0
        out.append({"t": i * 0.05, "dt": 40.0 + 0.5 * d + (5.0 if joins else 0.0), "b": b + joins, "k": k, "d": d,
                    "new": int(joins), "tok": b + d + (p if joins else 0)})
    return out


def test_full_draft_steps_where_the_mixed_steps_have_them():
    log = _log([45] * 40)  # every request drafts k = 3 in every step (a forced drafter)
    got = batch_samples(log, 15, 3)
    mixed = [s for s in got if s.prefill_tokens]
    assert mixed and all(s.decode_tokens == 60 for s in got)
    assert all(s.ms == 45.0 + 22.5 for s in mixed)  # on a synchronous engine a mixed step costs its own dt


def test_every_draft_count_where_no_mixed_step_has_full_drafts():
    """n-gram lookup at B = 15: most steps draft fewer than 45, and no mixed step drafts 45. The
    full-draft steps alone hold no mixed step, so every step counts, each with its own decode tokens."""
    drafts = [45 if i % 4 == 2 else 20 + (i * 7) % 20 for i in range(1, 61)]
    log = _log(drafts)
    assert not [s for s in samples_from_step_log(log) if s.prefill_tokens]  # what the full-draft filter leaves
    got = batch_samples(log, 15, 3)
    mixed = [s for s in got if s.prefill_tokens]
    assert len(mixed) >= 10 and {s.prefill_tokens for s in mixed} == {64}
    assert {s.decode_tokens for s in mixed} == {15 + drafts[i - 1] for i in range(4, 61, 4)}
    assert any(s.decode_tokens == 60 for s in got if not s.prefill_tokens)

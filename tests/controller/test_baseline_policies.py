"""The ``policy`` setting: the TurboSpec-style and Nightjar-style baselines as controller variants
(``evaluation.baselines.PolicyController``, what the evaluation's vLLM adapter builds), on worked numbers. No vLLM."""

from __future__ import annotations

import pytest

from tabletune_pipelines.errors import SettingsError
from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.controller.step import StepOutcome
from tabletune_pipelines.evaluation import baselines
from tabletune_pipelines.evaluation.baselines import PolicyController, TurboSpecPolicy
from tabletune_pipelines.evaluation.simulator import FakeEngine
from tabletune_pipelines.evaluation.synthetic import ENGINE, N, publish
from tabletune_pipelines.formats.live_counters import read_live_counters

# T(B, k) = 10 + 0.2·B + (0.2 + 1.0·B)·k ms: exactly linear in TurboSpec's basis, so its fit is the profile.
PROFILE = {k: {b: 10 + 0.2 * b + (0.2 + 1.0 * b) * k for b in range(1, N + 1)} for k in range(4)}
PUBLISHED = [(1, N, 1)]


@pytest.fixture
def clock():
    return [100.0]


def make(tmp_path, clock, policy, *, rates=(0.6, 0.4, 0.2), engine=ENGINE, **ctl):
    path = tmp_path / "local.json"
    publish(path, ranges=PUBLISHED, rates=rates, profile=PROFILE, allowed_k=[0, 1, 2, 3],
            controller={"policy": policy, "export_every_steps": 50, **ctl})
    return PolicyController(engine, path, clock=lambda: clock[0], wall=lambda: 1_764_000_000.0 + clock[0])


def step(c, b, k, kept_each, clock, dt_ms):
    ids = [f"r{i}" for i in range(b)]
    clock[0] += dt_ms / 1000.0
    c.on_step(StepOutcome({r: 1 for r in ids}, {r: [0] * k for r in ids} if k else {},
                          {r: i for i, r in enumerate(ids)}, [[1] * (kept_each + 1) for _ in ids], k, 0, b + b * k,
                          clock[0]))


def test_settings_policy_is_typed_and_validated():
    assert ControllerSettings().policy == "tabletune"
    assert ControllerSettings.from_mapping({"policy": "nightjar"}).policy == "nightjar"
    with pytest.raises(SettingsError, match=r"policy = 'smartspec' must be one of \('tabletune', 'turbospec', "
                                            r"'nightjar'\)"):
        ControllerSettings.from_mapping({"policy": "smartspec"})
    with pytest.raises(SettingsError, match=r"turbospec_forget = 0\.0 must be a finite number >= 0\.5 and <= 1"):
        ControllerSettings(turbospec_forget=0.0)
    with pytest.raises(SettingsError, match="nightjar_exploration = -1.0"):
        ControllerSettings(nightjar_exploration=-1.0)
    assert ControllerSettings.from_mapping({"turbospec_forget": 1}).turbospec_forget == 1.0


def test_turbospec_policy_chooses_the_worked_k_and_follows_acceptance(tmp_path, clock):
    # Prior a_1 = 0.6 is the initial per-token rate: tau(k) = (1 - 0.6^(k+1)) / 0.4 = 1, 1.6, 1.96, 2.176.
    # B = 1: T = 10.2 + 1.2k -> tau/T = .0980 .1404 .1556 .1577: k = 3.
    # B = 2: T = 10.4 + 2.2k -> .0962 .1270 .1324 .1280: k = 2.
    # k = 1 beats k = 0 while 1.6 (10 + 0.2B) > 10.2 + 1.2B, i.e. B < 6.59 (and beats k = 2 from B = 3).
    c = make(tmp_path, clock, "turbospec")
    assert c.policy_name == "turbospec" and isinstance(c.policy, TurboSpecPolicy) and not c.controlling
    assert c.policy.coef == pytest.approx([10.0, 0.2, 0.2, 1.0], abs=1e-9)
    lookup = c.next_lookup()
    assert lookup == [0, 3, 2, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert c.state()["policy_table"] == [[1, 1, 3], [2, 2, 2], [3, 6, 1], [7, 16, 0]]
    # Every draft rejected: alpha falls towards 0, tau(k) -> 1 and the cheapest k (0) wins everywhere.
    for _ in range(200):
        step(c, 4, 1, 0, clock, 15.0)
    assert c.policy.alpha < 0.05 and set(c.next_lookup()[1:]) == {0}
    st = c.state()
    assert st["policy_k_steps"] == [0, 200, 0, 0] and st["policy_active"] and st["mode"] == "observe"
    assert st["table"] == [list(r) for r in PUBLISHED]  # the published table is the fallback, not in force


def test_turbospec_in_the_controller_is_the_simulators_class(tmp_path, clock):
    """Same inputs, same decisions: the engine path drives the class the simulator drives."""
    c = make(tmp_path, clock, "turbospec", rates=(0.8, 0.6, 0.4))
    ref = TurboSpecPolicy(PROFILE, N, (0, 1, 2, 3), initial_alpha=0.8, forget=0.995)
    eng = FakeEngine(c, (0.7, 0.4, 0.2), lambda b, k: PROFILE[k][b], clock=clock, seed=3)
    seen = []
    orig = c.on_step

    def both(*args):
        orig(*args)
        ref.on_step(*args)
        seen.append((list(c.next_lookup()), list(ref.next_lookup())))

    c.on_step = both
    eng.run(300, 5)
    assert all(a == b for a, b in seen) and len({tuple(a) for a, _ in seen}) > 1


def test_nightjar_policy_tries_every_arm_then_exploits_the_best(tmp_path, clock):
    # Untried arms first, the largest k first. The first step only starts the clock, so k = 3 runs
    # twice, then 2, 1, 0. Every draft is kept; T = 10 + 5k + 3k^2 ms at B = 4, so the reward
    # (B + kept) / (B·dt) = (1 + k) / T: k0 100, k1 111.1, k2 93.75, k3 76.9 tokens/s per request.
    c = make(tmp_path, clock, "nightjar", nightjar_exploration=0.3)
    ks = []
    for _ in range(600):
        k = c.next_lookup()[4]
        ks.append(k)
        step(c, 4, k, k, clock, 10 + 5 * k + 3 * k * k)
    assert ks[:5] == [3, 3, 2, 1, 0]
    assert ks[100:].count(1) / len(ks[100:]) > 0.7
    st = c.state()
    arms = st["policy_arms"]["4"]
    assert sum(arms["count"]) == 599 and arms["mean"][1] == pytest.approx(2 / 0.018, rel=1e-6)
    assert arms["mean"][3] == pytest.approx(4 / 0.052, rel=1e-6)
    assert st["policy_k_steps"][1] == ks.count(1) and sum(st["policy_k_steps"]) == 600
    assert c.next_lookup()[9] == 3  # batch size 9 never ran: its bandit is untouched


def test_exported_windows_carry_the_policy(tmp_path, clock):
    c = make(tmp_path, clock, "nightjar")
    for _ in range(120):
        step(c, 2, c.next_lookup()[2], 1, clock, 12.0)
    c.close()
    ws = list(read_live_counters(tmp_path / "local.live.jsonl").windows)
    assert ws and all(w.controller["policy"] == "nightjar" for w in ws)
    assert sum(sum(w.controller["policy_k_steps"]) for w in ws[-1:]) == 120


def test_a_failing_policy_falls_back_to_the_published_table(tmp_path, clock, caplog):
    c = make(tmp_path, clock, "turbospec")
    published = [0] + [1] * N

    def boom():
        raise RuntimeError("bug in the baseline")

    c.policy.next_lookup = boom
    assert c.next_lookup() == published  # no raise: the published table is served
    assert c.errors == 1 and c.policy is None and "lookup: RuntimeError" in c.state()["policy_failed"]
    step(c, 3, 1, 1, clock, 12.0)  # later steps still count
    assert c.next_lookup() == published and c.steps == 1
    assert sum("policy's lookup failed" in r.getMessage() for r in caplog.records) == 1


def test_a_policy_raising_in_its_update_or_handing_a_bad_lookup_falls_back(tmp_path, clock):
    c = make(tmp_path, clock, "nightjar")
    c.policy.on_step = lambda *a: (_ for _ in ()).throw(ValueError("x"))
    step(c, 3, 3, 1, clock, 12.0)
    assert c.policy is None and c.errors == 1 and c.next_lookup() == [0] + [1] * N
    c2 = make(_sub(tmp_path, "b"), clock, "nightjar")
    c2.policy._lookup = [0, 1, 2]  # wrong length for max_num_seqs 16
    assert c2.next_lookup() == [0] + [1] * N and c2.policy is None


def test_a_policy_that_cannot_be_built_or_switch_leaves_the_published_table(tmp_path, clock, monkeypatch):
    def refuse(*a, **kw):
        raise ValueError("a linear step-time model needs at least 4 profile cells, got 2")

    monkeypatch.setattr(baselines, "TurboSpecPolicy", refuse)
    c = make(tmp_path, clock, "turbospec")
    assert c.policy is None and c.errors == 1 and c.next_lookup() == [0] + [1] * N
    assert c.state()["policy_failed"].startswith("building the turbospec policy")
    monkeypatch.undo()
    no_table = EngineFacts(max_k=3, max_num_seqs=N, launch_ranges=None, model="/m/target", method="draft_model",
                           vllm_version="0.32.0")
    c = make(_sub(tmp_path, "c"), clock, "nightjar", engine=no_table)
    assert c.policy is None and c.next_lookup() is None and "no table" in c.state()["policy_failed"]


def test_tabletune_policy_is_the_plain_controller(tmp_path, clock):
    c = make(tmp_path, clock, "tabletune")
    assert c.policy is None and c.controlling and c.state()["policy"] == "tabletune"


def _sub(tmp_path, name):
    p = tmp_path / name
    p.mkdir(exist_ok=True)
    return p

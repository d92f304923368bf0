"""The vLLM adapter's hooks on a stand-in base class: errors never escape, the lookup is handed
over, the variant follows the engine's scheduling mode. (Real vLLM: test_engine_*.py.)"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("vllm")

from tabletune_pipelines.controller import scheduler as adapter  # noqa: E402
from tabletune_pipelines.formats.controller_settings import PUBLISHED_ENV  # noqa: E402
from tabletune_pipelines.evaluation.synthetic import publish# noqa: E402


class FakeBase:
    """The parts of vLLM's Scheduler the mixin touches."""

    def __init__(self, *args, vllm_config=None, **kwargs):
        self.vllm_config = vllm_config
        self.num_spec_tokens = 3
        self.scheduler_config = vllm_config.scheduler_config
        self.dynamic_sd_lookup = [0] + [3] * 16
        self.calls = []

    def schedule(self, *args, **kwargs):
        self.calls.append(("schedule", list(self.dynamic_sd_lookup)))
        return "scheduled"

    def update_from_output(self, so, mro):
        self.calls.append(("update",))
        return {"outputs": 1}

    def shutdown(self):
        self.calls.append(("shutdown",))


class Wrapped(adapter.ControllerHooks, FakeBase):
    pass


def config(async_scheduling=False):
    spec = types.SimpleNamespace(method="draft_model", model="/m/draft",
                                 num_speculative_tokens_per_batch_size=[(1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 16, 3)])
    return types.SimpleNamespace(speculative_config=spec,
                                 model_config=types.SimpleNamespace(model="/m/target"),
                                 scheduler_config=types.SimpleNamespace(max_num_seqs=16,
                                                                        async_scheduling=async_scheduling))


def output(b=4, k=3):
    ids = [f"r{i}" for i in range(b)]
    so = types.SimpleNamespace(num_scheduled_tokens={r: 1 + k for r in ids},
                               scheduled_spec_decode_tokens={r: [0] * k for r in ids},
                               scheduled_new_reqs=[], total_num_scheduled_tokens=b * (1 + k),
                               num_spec_tokens_to_schedule=k)
    mro = types.SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[1]] * b)
    return so, mro


def test_variant_follows_the_scheduling_mode():
    assert adapter.scheduler_class_for(config(True)) is adapter.AsyncControllerScheduler
    assert adapter.scheduler_class_for(config(False)) is adapter.SyncControllerScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert issubclass(adapter.AsyncControllerScheduler, AsyncScheduler)
    assert issubclass(adapter.SyncControllerScheduler, Scheduler)
    assert not issubclass(adapter.SyncControllerScheduler, AsyncScheduler)
    # AsyncScheduler overrides none of the hooks, so the mixin sits in front of the same methods.
    for name in ("schedule", "update_from_output", "shutdown"):
        assert name not in vars(AsyncScheduler)


def test_engine_facts_from_the_config():
    s = Wrapped(vllm_config=config())
    f = adapter.engine_facts(s)
    assert (f.max_k, f.max_num_seqs, f.model, f.method, f.drafter) == (3, 16, "/m/target", "draft_model", "/m/draft")
    assert f.launch_ks == (0, 1, 2, 3) and f.vllm_version


def test_hooks_hand_over_the_lookup_and_swallow_errors(tmp_path, monkeypatch):
    pub = publish(tmp_path / "pub.json", ranges=[(1, 8, 1), (9, 16, 3)], rates=(0.7, 0.5, 0.3), allowed_k=[1, 3],
                  controller={"exploration_every_steps": 0})
    monkeypatch.setenv(PUBLISHED_ENV, str(pub))
    s = Wrapped(vllm_config=config())
    assert s._tt is not None and s._tt.controlling
    assert s.schedule() == "scheduled"
    assert s.calls[-1][1][4] == 1 and s.calls[-1][1][12] == 3  # the published table is in force
    assert s.update_from_output(*output()) == {"outputs": 1}
    assert s._tt.steps == 1

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(s._tt, "on_step", boom)
    monkeypatch.setattr(s._tt, "next_lookup", boom)
    for _ in range(3):
        assert s.schedule() == "scheduled" and s.update_from_output(*output()) == {"outputs": 1}
    assert s._tt.errors == 6
    assert s.calls[-2][1][4] == 1  # the last good lookup stays
    s.shutdown()
    assert s.calls[-1] == ("shutdown",)


def test_a_controller_that_cannot_start_leaves_vllm_alone(monkeypatch):
    monkeypatch.setattr(adapter.ControllerHooks, "controller_cls",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    s = Wrapped(vllm_config=config())
    assert s._tt is None
    before = list(s.dynamic_sd_lookup)
    assert s.schedule() == "scheduled" and s.update_from_output(*output()) == {"outputs": 1}
    assert s.dynamic_sd_lookup == before
